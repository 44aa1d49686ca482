"""``McpServer`` (where a server is, whether it is trusted) and ``McpToolset`` (its tools as
``ToolSpec``s); the rules are in the package docstring (``polyloop.mcp``) and design 0211."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Final, TypeVar

from mcp.types import Tool

from polyloop._common import frozen_str_mapping, require_nonempty_str
from polyloop.errors import (
    McpConnectionError,
    McpToolError,
    PolyloopError,
    PolyloopTypeError,
    PolyloopValueError,
)
from polyloop.mcp._connection import Connection, Progress, ServerAddress
from polyloop.mcp._policy import IDEMPOTENCY_META_KEY, classify
from polyloop.mcp._results import observation_of
from polyloop.tools import ToolContext, ToolRegistry, ToolSpec, safe_tool_name
from polyloop.types import ReplayPolicy

__all__ = ["McpProgress", "McpServer", "McpToolset", "ToolClassification"]

_UNSAFE_IN_NAMES: Final = re.compile(r"[^A-Za-z0-9_-]+")
DEFAULT_CALL_TIMEOUT_SECONDS: Final = 300.0
"""``McpServer.call_timeout_seconds``'s default: the read timeout the HTTP transport has
anyway (a longer bound would never be reached there), long enough for a git or file tool on
a loaded machine, and finite, so a live server that never answers cannot hold a run whose
``RunRequest.action_timeout_seconds`` is ``None`` (design 0211, amendment 2)."""
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class McpProgress:
    """One progress notification of a running ``tools/call`` (``McpToolset(on_progress=)``)."""

    server: str
    tool: str
    progress: float
    total: float | None
    message: str | None


@dataclass(frozen=True, slots=True)
class ToolClassification:
    """One row of ``McpToolset.classification()``: a tool, its server and its policy, why."""

    tool: str
    server: str
    replay_policy: ReplayPolicy
    reason: str
    annotations: str
    server_name: str = ""
    """The name the server gives the tool when it is not ``tool``: a name outside
    ``polyloop.tools.TOOL_NAME_PATTERN`` (or too long with its prefix) is offered to the model
    as ``safe_tool_name`` of it (design 0233); ``""`` when the two are the same."""


def _check_timeout(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(f"McpServer.{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise PolyloopValueError(f"McpServer.{name} must be finite and > 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class McpServer:
    """Where an MCP server is and whether its tool annotations are trusted.

    Build one with ``McpServer.stdio(command, args)`` or ``McpServer.http(url)``. ``name`` is
    the label used in errors and as the prefix (``McpToolset(prefix=True)``); by default the
    name the server gives itself. ``trusted=False`` (the default) makes every tool ``NEVER``.

    Bounds: ``connect_timeout_seconds`` for the handshake and for each page of the tool
    listing (``McpConnectionError``); ``call_timeout_seconds`` (default 300 s, ``None``: only
    the run's action bound) for each ``tools/call`` on a live server, after which the request
    is cancelled and the outcome is unknown (``ToolOutcomeUnknown``: in doubt, design 0227);
    ``connect_timeout_seconds`` also bounds connecting again after the server died;
    ``close_timeout_seconds`` for leaving the connection, after which it is cancelled.
    """

    address: ServerAddress = field(repr=False)
    trusted: bool = False
    name: str | None = None
    connect_timeout_seconds: float = 30.0
    close_timeout_seconds: float = 5.0
    call_timeout_seconds: float | None = DEFAULT_CALL_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.trusted, bool):
            raise PolyloopTypeError(
                f"McpServer.trusted must be a bool, got {type(self.trusted).__name__}"
            )
        if self.name is not None:
            require_nonempty_str("McpServer", "name", self.name)
        _check_timeout("connect_timeout_seconds", self.connect_timeout_seconds)
        _check_timeout("close_timeout_seconds", self.close_timeout_seconds)
        if self.call_timeout_seconds is not None:
            _check_timeout("call_timeout_seconds", self.call_timeout_seconds)

    @classmethod
    def stdio(
        cls,
        command: str,
        args: tuple[str, ...] | list[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        trusted: bool = False,
        name: str | None = None,
        connect_timeout_seconds: float = 30.0,
        call_timeout_seconds: float | None = DEFAULT_CALL_TIMEOUT_SECONDS,
    ) -> McpServer:
        """A server started as ``command *args`` and spoken to over its stdin and stdout.

        ``env`` is added to the SDK's small default environment (not the whole of ours); its
        values are never echoed in an error or put in the snapshot."""
        require_nonempty_str("McpServer.stdio", "command", command)
        if isinstance(args, str) or not isinstance(args, tuple | list):
            raise PolyloopTypeError(
                "McpServer.stdio args must be a list of str (one per argument), got "
                f"{type(args).__name__}"
            )
        for index, arg in enumerate(args):
            if not isinstance(arg, str):
                raise PolyloopTypeError(
                    f"McpServer.stdio args[{index}] must be a str, got {type(arg).__name__} "
                    "(convert it with str())"
                )
        checked_env = None if env is None else frozen_str_mapping("McpServer.stdio", "env", env)
        address = ServerAddress(command=command, args=tuple(args), env=checked_env, cwd=cwd)
        return cls(
            address=address,
            trusted=trusted,
            name=name,
            connect_timeout_seconds=connect_timeout_seconds,
            call_timeout_seconds=call_timeout_seconds,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        trusted: bool = False,
        name: str | None = None,
        connect_timeout_seconds: float = 30.0,
        call_timeout_seconds: float | None = DEFAULT_CALL_TIMEOUT_SECONDS,
    ) -> McpServer:
        """A server at a streamable HTTP ``url``; ``headers`` go with every request (they are
        never echoed in an error or put in the snapshot)."""
        require_nonempty_str("McpServer.http", "url", url)
        if not url.startswith(("http://", "https://")):
            raise PolyloopValueError(
                "McpServer.http url must start with http:// or https:// (a streamable HTTP "
                "endpoint such as http://127.0.0.1:8000/mcp)"
            )
        checked = (
            None if headers is None else frozen_str_mapping("McpServer.http", "headers", headers)
        )
        return cls(
            address=ServerAddress(url=url, headers=checked),
            trusted=trusted,
            name=name,
            connect_timeout_seconds=connect_timeout_seconds,
            call_timeout_seconds=call_timeout_seconds,
        )

    def describe(self) -> str:
        """The server without secrets (``ServerAddress.describe``): its command and arguments,
        or its URL without ``user:password@``, query and fragment; never ``env`` or headers."""
        return self.address.describe()


class _McpHandler:
    """The ``ToolHandler`` of one MCP tool: ``tools/call`` with the idempotency key in
    ``_meta``; an ``isError`` result raises ``McpToolError`` (an executed action that failed).

    Progress: the call asks the server for progress only when someone wants it (``on_progress``
    or a context with a ``progress_reporter``). ``on_progress`` is called as the SDK delivers
    each notification; the context's reporter gets them through a queue drained in *this*
    task while the call runs (``_relayed``), so they reach the run's sink in order, before the
    call returns, and are cancelled with it."""

    takes_context = True

    def __init__(
        self,
        connection: Connection,
        tool: str,
        on_progress: Callable[[McpProgress], Awaitable[None]] | None,
    ) -> None:
        self._connection = connection
        self._tool = tool
        self._on_progress = on_progress

    async def __call__(
        self, arguments: Mapping[str, object], context: ToolContext | None = None, /
    ) -> str:
        meta = None if context is None else {IDEMPOTENCY_META_KEY: context.idempotency_key}
        relayed = context is not None and context.progress_reporter is not None
        queue: asyncio.Queue[McpProgress] = asyncio.Queue()  # filled only when relayed
        relay: Progress | None = None
        if self._on_progress is not None or relayed:
            report = self._on_progress
            server, tool = self._connection.label, self._tool

            async def relay(progress: float, total: float | None, message: str | None) -> None:
                notified = McpProgress(server, tool, progress, total, message)
                if relayed:
                    queue.put_nowait(notified)
                if report is not None:
                    await report(notified)

        call = self._connection.call(self._tool, arguments, meta=meta, progress=relay)
        if relayed:
            assert context is not None
            result = await _relayed(call, queue, context)
        else:
            result = await call
        text = observation_of(result)
        if result.is_error:
            raise McpToolError(text)
        return text

    def __repr__(self) -> str:
        return f"<MCP tool {self._tool!r} of server {self._connection.label!r}>"


async def _relayed(
    call: Awaitable[_T], queue: asyncio.Queue[McpProgress], context: ToolContext
) -> _T:
    """``call``'s answer; meanwhile each queued notification goes to ``context``'s reporter
    in arrival order, and those queued when the answer came go before it is returned. A
    cancelled caller cancels the call and waits for it to end."""
    pending = asyncio.ensure_future(call)
    try:
        while not pending.done():
            arrived = asyncio.ensure_future(queue.get())
            try:
                await asyncio.wait({pending, arrived}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrived.cancel()
            if arrived.done() and not arrived.cancelled():
                await _forward(arrived.result(), context)
        while not queue.empty():
            await _forward(queue.get_nowait(), context)
    finally:
        if not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
    return pending.result()


async def _forward(notified: McpProgress, context: ToolContext) -> None:
    await context.report_progress(
        notified.progress, notified.total, notified.message, origin=f"mcp:{notified.server}"
    )


def _canonical(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


class McpToolset:
    """The tools of one or more MCP servers, as ``ToolSpec``s, while the toolset is open.

    ``async with McpToolset(*servers) as toolset:`` connects to every server, lists its tools
    and builds one spec per tool (``specs()``); leaving closes every connection. ``overrides``
    maps a tool's name (as the model sees it) to the ``ReplayPolicy`` it must have, whatever
    the annotations say. Two servers offering one tool name is an error naming both, unless
    ``prefix=True`` (names become ``<server>_<tool>``). The progress notifications of running
    calls reach the run's event sink as ``ToolProgress`` when it has ``emit_progress``
    (``ports.ProgressSink``); ``on_progress``, if given, also receives them (``McpProgress``),
    in the SDK's task (a raise there is the SDK's to log).
    """

    def __init__(
        self,
        *servers: McpServer,
        overrides: Mapping[str, ReplayPolicy] | None = None,
        prefix: bool = False,
        on_progress: Callable[[McpProgress], Awaitable[None]] | None = None,
    ) -> None:
        if not servers:
            raise PolyloopValueError("McpToolset needs at least one McpServer")
        for index, server in enumerate(servers):
            if not isinstance(server, McpServer):
                raise PolyloopTypeError(
                    f"McpToolset servers[{index}] must be an McpServer (McpServer.stdio(...) "
                    f"or McpServer.http(...)), got {type(server).__name__}"
                )
        checked: dict[str, ReplayPolicy] = {}
        for key, policy in (overrides or {}).items():
            if not isinstance(key, str) or not isinstance(policy, ReplayPolicy):
                raise PolyloopTypeError(
                    "McpToolset overrides must map a tool name (str) to a ReplayPolicy; entry "
                    f"{key!r}: {type(policy).__name__}"
                )
            checked[key] = policy
        if not isinstance(prefix, bool):
            raise PolyloopTypeError(f"McpToolset prefix must be a bool, got {prefix!r}")
        self._servers = servers
        self._overrides = MappingProxyType(checked)
        self._prefix = prefix
        self._on_progress = on_progress
        self._connections: list[Connection] = []
        self._specs: tuple[ToolSpec, ...] | None = None
        self._rows: tuple[ToolClassification, ...] = ()
        self._closed = False

    async def __aenter__(self) -> McpToolset:
        if self._closed:
            raise PolyloopValueError(
                "this McpToolset was opened and closed already; a toolset opens once: build a "
                "new McpToolset(...) to connect again"
            )
        if self._specs is not None or self._connections:
            raise PolyloopValueError("this McpToolset is already open; open it once")
        try:
            listed = []
            for index, server in enumerate(self._servers):
                label = server.name or f"server{index}"
                connection = Connection(
                    server.address,
                    label,
                    connect_timeout_seconds=server.connect_timeout_seconds,
                    close_timeout_seconds=server.close_timeout_seconds,
                    call_timeout_seconds=server.call_timeout_seconds,
                )
                self._connections.append(connection)
                await connection.open()
                info = connection.server_info
                if server.name is None and info is not None and info.name.strip():
                    connection.label = info.name
                listed.append((server, connection, await connection.list_tools()))
            self._build(listed)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closed = True
        connections, self._connections = self._connections, []
        for connection in reversed(connections):
            await connection.close()

    def _build(self, listed: list[tuple[McpServer, Connection, list[Tool]]]) -> None:
        specs: list[ToolSpec] = []
        rows: list[ToolClassification] = []
        offered: dict[str, str] = {}
        for server, connection, tools in listed:
            for tool in tools:
                name = self._name_of(connection.label, tool.name)
                if name in offered:
                    raise McpConnectionError(
                        f"the tool name {name!r} is offered by MCP servers {offered[name]!r} and "
                        f"{connection.label!r}; pass McpToolset(..., prefix=True) to call them "
                        "<server>_<tool>, or give the servers different names"
                    )
                offered[name] = connection.label
                spec, row = self._spec_for(server, connection, tool, name)
                specs.append(spec)
                rows.append(row)
        unknown = sorted(set(self._overrides) - set(offered))
        if unknown:
            raise PolyloopValueError(
                f"McpToolset overrides name {', '.join(map(repr, unknown))}, which no server "
                f"offers; the tools are {', '.join(map(repr, offered)) or 'none'}"
            )
        self._specs = tuple(specs)
        self._rows = tuple(rows)

    def _name_of(self, label: str, tool: str) -> str:
        """The name the model sees (design 0233): the server's, prefixed when asked, mapped by
        ``safe_tool_name`` when it is not provider-safe (the same way in every process, so a
        resume finds the same names; the server's name stays in the snapshot as
        ``tool.<name>.mcp.tool``)."""
        name = f"{_UNSAFE_IN_NAMES.sub('_', label)}_{tool}" if self._prefix else tool
        return safe_tool_name(name)

    def _spec_for(
        self, server: McpServer, connection: Connection, tool: Tool, name: str
    ) -> tuple[ToolSpec, ToolClassification]:
        hints = (
            {}
            if tool.annotations is None
            else tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
        )
        hints.pop("title", None)  # a display name, not a hint
        policy, reason = classify(hints, trusted=server.trusted, override=self._overrides.get(name))
        info = connection.server_info
        annotations = _canonical(hints)
        origin = {
            "mcp.server": connection.label if info is None else info.name,
            "mcp.server_version": "" if info is None else info.version,
            "mcp.tool": tool.name,
            "mcp.annotations": annotations,
            "replay_policy_reason": reason,
        }
        try:
            spec = ToolSpec(
                name=name,
                description=tool.description or tool.title or f"the MCP tool {tool.name}",
                parameters=dict(tool.input_schema),
                handler=_McpHandler(connection, tool.name, self._on_progress),
                replay_policy=policy,
                origin=origin,
            )
        except PolyloopError as exc:
            raise McpConnectionError(
                f"MCP server {connection.label!r} lists the tool {tool.name!r} in a form polyloop "
                f"cannot use: {exc}"
            ) from exc
        mapped = "" if name == tool.name else tool.name
        row = ToolClassification(name, connection.label, policy, reason, annotations, mapped)
        return spec, row

    # ------------------------------------------------------------------ results

    def specs(self) -> tuple[ToolSpec, ...]:
        """One ``ToolSpec`` per tool, servers in the order given, tools in the servers' order."""
        if self._specs is None:
            raise PolyloopValueError(
                "McpToolset.specs() is known only inside `async with McpToolset(...) as toolset`"
            )
        return self._specs

    def registry(self) -> ToolRegistry:
        """``ToolRegistry(self.specs())``; combine with function tools as
        ``ToolRegistry([*toolset.specs(), *others])``."""
        return ToolRegistry(self.specs())

    def classification(self) -> tuple[ToolClassification, ...]:
        """Per tool: its server, its replay policy and why (what the snapshot records)."""
        self.specs()
        return self._rows

    def table(self) -> str:
        """``classification()`` as an aligned text table, for a person."""
        rows = [("tool", "server", "policy", "annotations", "reason")]
        rows += [
            (
                f"{r.tool} (the server's {r.server_name!a})" if r.server_name else r.tool,
                r.server,
                r.replay_policy.value,
                r.annotations,
                r.reason,
            )
            for r in self.classification()
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        return "\n".join(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
            for row in rows
        )
