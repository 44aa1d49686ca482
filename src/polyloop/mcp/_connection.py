"""One open connection to one MCP server, kept by a task of its own (design 0211).

=================================  ========================================================
event                              what happens
=================================  ========================================================
``open()``                         a keeper task enters the SDK's ``Client`` (stdio: starts
                                   the command; http: connects) and waits; ``open`` waits
                                   for the handshake at most ``connect_timeout_seconds`` and
                                   raises ``McpConnectionError`` naming the server otherwise
``list_tools()``                   each ``tools/list`` page is bounded by
                                   ``connect_timeout_seconds``: no answer, a dead server or
                                   any JSON-RPC error is ``McpConnectionError`` naming the
                                   server (it runs before any run, outside its action bound)
``call()``                         ``tools/call`` from the caller's task; waits for the
                                   answer, the keeper's end or ``call_timeout_seconds``,
                                   whichever comes first
the server dies mid-call           ``ToolOutcomeUnknown`` naming the server (the SDK fails
                                   the pending request, or the keeper ends): the call is in
                                   doubt, settled by its policy (design 0227), never a hang
a call after the server died       connect again (``_revive``: stdio starts the command
                                   anew, http reconnects), trying for at most
                                   ``connect_timeout_seconds``; the server must name itself
                                   and list its tools as before. It cannot:
                                   ``ToolEnvironmentError`` (nothing was sent: ``ENV_ERROR``)
no answer in call_timeout_seconds  the request is cancelled; ``ToolOutcomeUnknown`` (in
                                   doubt); the connection stays
the server answers a JSON-RPC      ``answered_by_server`` (below): ``-32601`` / ``-32602``
error                              (the server refused the request before running it) ->
                                   ``McpToolError``, an executed action that failed, which
                                   the model reads; any other code -> ``ToolOutcomeUnknown``
                                   (in doubt)
the caller is cancelled            the request is cancelled and ``CancelledError`` goes on
``close()``                        the keeper leaves the ``Client`` (stdio: the SDK ends the
                                   process); after ``close_timeout_seconds`` it is cancelled
=================================  ========================================================

Why a JSON-RPC error is mostly "unknown": the SDK's transports *synthesise* JSON-RPC errors
for an answer they lost, and hand them over exactly like a server's (streamable HTTP:
``-32000`` "SSE stream ended without a response", "SSE stream failed: ...", "... reconnection
attempts were exhausted", "Connection closed"; ``-32603`` "Server returned an error response"
on an HTTP 5xx; ``-32600`` "Session terminated"; ``-32700`` "Failed to parse ..."). Nothing in
the error tells them apart, and a server's own ``-32603`` says nothing about whether the tool
ran either. Taking one for an executed failure would let the model call a ``NEVER`` tool
again after it may have run, so only the two codes that say the request was refused before it
ran are the server's answer; everything else is in doubt (design 0211, amendment 2).

Why a keeper task: the SDK's transports hold ``anyio`` task groups that must be entered and
left by one task, and a failure inside them cancels that task. Kept apart, a dying server ends
its keeper, not the run. A stdio server's stderr goes to a temporary file whose last lines are
quoted in these errors (never the request's arguments or an HTTP header).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import tempfile
import urllib.parse
from collections.abc import Awaitable, Mapping
from typing import IO, Any, Final

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, Implementation, Tool
from mcp_types.jsonrpc import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND

from polyloop.errors import (
    McpConnectionError,
    McpToolError,
    ToolEnvironmentError,
    ToolOutcomeUnknown,
)

__all__ = [
    "REFUSED_BEFORE_RUNNING",
    "Connection",
    "Progress",
    "ServerAddress",
    "answered_by_server",
]

logger = logging.getLogger("polyloop.mcp")

_STDERR_TAIL_CHARS: Final = 400
_LIST_PAGES_CAP: Final = 100
_HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)
_REVIVE_PAUSE_SECONDS: Final = 0.2
"""Between two attempts to reach a server that died again (``Connection._revive``)."""

Progress = ProgressFnT


class ServerAddress:
    """How to reach one server: a stdio command or a streamable HTTP URL (``McpServer``'s)."""

    __slots__ = ("args", "command", "cwd", "env", "headers", "url")

    def __init__(
        self,
        *,
        command: str | None = None,
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.command = command
        self.args = args
        self.env = env
        self.cwd = cwd
        self.url = url
        self.headers = headers

    def describe(self) -> str:
        """Where the server is, without secrets: ``stdio: <command> <args>`` (arguments are
        visible in any process listing; ``env`` is where secrets go, and it is never shown), or
        ``http: <url>`` without its ``user:password@``, query and fragment."""
        if self.command is not None:
            return "stdio: " + " ".join((self.command, *self.args))
        parts = urllib.parse.urlsplit(self.url or "")
        host = parts.netloc.rpartition("@")[2]
        return "http: " + urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


class Connection:
    """One server's connection; see the module docstring for what each event does."""

    def __init__(
        self,
        address: ServerAddress,
        label: str,
        *,
        connect_timeout_seconds: float,
        close_timeout_seconds: float,
        call_timeout_seconds: float | None = None,
    ) -> None:
        self._address = address
        self.label = label
        self._connect_timeout = connect_timeout_seconds
        self._close_timeout = close_timeout_seconds
        self._call_timeout = call_timeout_seconds
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._stderr: IO[str] | None = None
        self._dead: str | None = None
        self._listing: str | None = None
        """The first tool listing, canonical: a revived server must list the same tools."""
        self._cause: str | None = None
        """Why the connection died mid-call, kept across failed attempts to connect again."""
        self._identity: tuple[str, str] | None = None
        """The name and version the server gave at the first handshake (``_check_same``)."""
        self._reviving = asyncio.Lock()
        self._closed = False

    # ------------------------------------------------------------------ life

    async def open(self) -> None:
        """Connect (see the module docstring); ``McpConnectionError`` when that fails."""
        if self._address.command is not None:
            # Closed by close(): it outlives this call, as long as the connection.
            self._stderr = tempfile.TemporaryFile(  # noqa: SIM115
                "w+", encoding="utf-8", errors="replace"
            )
        self._keeper = asyncio.create_task(self._keep(), name=f"polyloop.mcp:{self.label}")
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait(
                {ready, self._keeper},
                timeout=self._connect_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if self._ready.is_set() and not self._keeper.done():
            if self._identity is None:
                self._identity = _identity_of(self.server_info)
            return
        why = (
            self._ended_because()
            if self._keeper.done()
            else f"no handshake within {self._connect_timeout} s (connect_timeout_seconds)"
        )
        await self._shut()
        raise McpConnectionError(
            f"cannot connect to MCP server {self.label!r} ({self._address.describe()}): {why}"
        )

    async def _keep(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            client = Client(await self._transport(stack), cache=None, client_info=_CLIENT)
            self._client = await stack.enter_async_context(client)
            self._ready.set()
            await self._stop.wait()

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        address = self._address
        if address.command is not None:
            params = StdioServerParameters(
                command=address.command,
                args=list(address.args),
                env=None if address.env is None else dict(address.env),
                cwd=address.cwd,
            )
            return stdio_client(params, errlog=self._stderr)  # type: ignore[arg-type]
        assert address.url is not None
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=dict(address.headers or {}), timeout=_HTTP_TIMEOUT)
        )
        return streamable_http_client(address.url, http_client=http)

    async def close(self) -> None:
        """Leave the connection for good (the toolset closes): bounded by
        ``close_timeout_seconds``, then cancelled; a later call is refused, never revived."""
        self._closed = True
        await self._shut()

    async def _shut(self) -> None:
        """Leave the current connection; bounded by ``close_timeout_seconds``, then cancelled."""
        self._stop.set()
        keeper = self._keeper
        if keeper is not None:
            await asyncio.wait({keeper}, timeout=self._close_timeout)
            if not keeper.done():
                keeper.cancel()
                await asyncio.wait({keeper}, timeout=self._close_timeout)
            if keeper.done() and not keeper.cancelled() and keeper.exception() is not None:
                logger.info(
                    "MCP server %r: the connection ended with an error",
                    self.label,
                    exc_info=keeper.exception(),
                )
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    # ------------------------------------------------------------------ facts

    @property
    def server_info(self) -> Implementation | None:
        """The server's name and version as it sent them (``None``: it did not say)."""
        return None if self._client is None else self._client.server_info

    async def list_tools(self) -> list[Tool]:
        """Every tool the server lists, all pages; each page bounded by
        ``connect_timeout_seconds``; any failure is ``McpConnectionError`` naming the server."""
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES_CAP):
            try:
                client = self._live_client()
                page = await self._bounded(
                    client.list_tools(cursor=cursor),
                    "tools/list",
                    bound=self._connect_timeout,
                    bound_name="connect_timeout_seconds",
                )
            except (ToolEnvironmentError, ToolOutcomeUnknown, McpToolError) as exc:
                raise McpConnectionError(
                    f"cannot list the tools of MCP server {self.label!r} "
                    f"({self._address.describe()}): {exc}"
                ) from exc
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                listing = _canonical_listing(tools)
                if self._listing is None:
                    self._listing = listing
                return tools
        raise McpConnectionError(
            f"MCP server {self.label!r} listed more than {_LIST_PAGES_CAP} pages of tools"
        )

    # ------------------------------------------------------------------ calls

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, object],
        *,
        meta: Mapping[str, str] | None,
        progress: Progress | None,
    ) -> CallToolResult:
        """``tools/call``; the errors are in the module docstring."""
        if self._closed:
            raise ToolEnvironmentError(
                f"MCP server {self.label!r}: its McpToolset was closed; nothing was sent"
            )
        if self._dead is not None or self._keeper is None or self._keeper.done():
            await self._revive()
        client = self._live_client()
        request = client.call_tool(
            tool,
            dict(arguments),
            progress_callback=progress,
            meta=None if meta is None else dict(meta),  # type: ignore[arg-type]
        )
        result: CallToolResult = await self._bounded(
            request,
            f"tools/call {tool!r}",
            bound=self._call_timeout,
            bound_name="call_timeout_seconds",
        )
        return result

    async def _bounded(
        self, request: Awaitable[Any], what: str, *, bound: float | None, bound_name: str
    ) -> Any:
        """``request``'s answer, the connection's end, or ``bound`` seconds, whichever is first."""
        keeper = self._keeper
        assert keeper is not None
        pending = asyncio.ensure_future(request)
        try:
            await asyncio.wait(
                {pending, keeper}, timeout=bound, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not pending.done():  # cancelled caller, ended keeper, or the timeout
                pending.cancel()
                await asyncio.wait({pending}, timeout=self._close_timeout)
        if not keeper.done() and (not pending.done() or pending.cancelled()):
            raise ToolOutcomeUnknown(  # the connection lives on; this answer is lost
                f"MCP server {self.label!r} did not answer {what} within {bound} s "
                f"({bound_name}); the request was cancelled and its outcome is unknown"
            )
        if not pending.done() or pending.cancelled():
            raise self._died(f"the connection ended during {what}: {self._ended_because()}")
        error = pending.exception()
        if isinstance(error, MCPError):
            if not answered_by_server(error.error.code):
                raise self._in_doubt(what, error) from error
            raise McpToolError(
                f"MCP server {self.label!r} answered {what} with error "
                f"{error.error.code}: {error.error.message}"
            ) from error
        if isinstance(error, OSError | httpx2.TransportError):
            raise self._died(f"{what} failed on the transport: {error}") from error
        return pending.result()

    def _live_client(self) -> Client:
        if self._dead is not None:
            raise ToolEnvironmentError(self._dead)
        if self._client is None or self._keeper is None or self._keeper.done():
            raise ToolEnvironmentError(
                f"MCP server {self.label!r}: the connection is not open: {self._ended_because()}"
            )
        return self._client

    def _in_doubt(self, what: str, error: MCPError) -> ToolOutcomeUnknown:
        """A JSON-RPC error that does not say the request was refused: the server died (the
        connection ended or it closed), or the outcome is unknown while it lives on."""
        detail = f"error {error.error.code}: {error.error.message}"
        if error.error.code == CONNECTION_CLOSED or self._keeper is None or self._keeper.done():
            return self._died(f"the connection closed during {what} ({detail})")
        return ToolOutcomeUnknown(
            f"MCP server {self.label!r}: {what} ended with {detail}, which does not say whether "
            "it ran (the SDK's transport may have produced it for a lost answer): the outcome "
            "is unknown"
        )

    def _died(self, why: str) -> ToolOutcomeUnknown:
        """The connection died while a request was out: marked dead (the next call connects
        again), and that request's outcome is unknown."""
        tail = self._stderr_tail()
        self._dead = self._cause = f"MCP server {self.label!r}: {why}" + (
            f"; its stderr ends: {tail}" if tail else ""
        )
        return ToolOutcomeUnknown(self._dead)

    async def _revive(self) -> None:
        """Connect again to a server whose connection died (design 0227): close what is left,
        then open anew (stdio: the command starts again; http: a new session at the URL),
        trying every ``_REVIVE_PAUSE_SECONDS`` for at most ``connect_timeout_seconds``. The
        server must name itself and list its tools exactly as before (else a retry would run
        against another tool than the run recorded). ``ToolEnvironmentError`` when it cannot:
        nothing of the call was sent."""
        async with self._reviving:
            if self._dead is None and self._keeper is not None and not self._keeper.done():
                return  # another call revived it while this one waited
            why = (
                self._cause or self._dead or f"the connection is not open: {self._ended_because()}"
            )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._connect_timeout
            while True:
                await self._shut()
                if self._closed:  # the toolset closed while this call waited to connect
                    raise ToolEnvironmentError(f"{why}; its McpToolset was closed")
                self._ready, self._stop = asyncio.Event(), asyncio.Event()
                self._client, self._keeper = None, None
                try:
                    await self.open()
                    if self._closed:
                        continue  # shut at the top of the loop, then refused
                    break
                except McpConnectionError as exc:
                    if loop.time() + _REVIVE_PAUSE_SECONDS >= deadline:
                        self._dead = (
                            f"{why}; it could not be reached again within "
                            f"{self._connect_timeout} s (connect_timeout_seconds): {exc}"
                        )
                        raise ToolEnvironmentError(self._dead) from exc
                await asyncio.sleep(_REVIVE_PAUSE_SECONDS)
            self._dead = self._cause = None
            await self._check_same()
            logger.warning("MCP server %r: connected again after: %s", self.label, why)

    async def _check_same(self) -> None:
        """A revived server names itself and lists its tools as it did first."""
        said, was = _identity_of(self.server_info), self._identity
        changed = f"it now names itself {said}, not {was}" if said != was else None
        if changed is None and self._listing is not None:
            try:
                tools = await self.list_tools()
            except McpConnectionError as exc:
                self._dead = str(exc)
                raise ToolEnvironmentError(self._dead) from exc
            if _canonical_listing(tools) != self._listing:
                changed = "its tool listing changed"
        if changed is not None:
            self._dead = (
                f"MCP server {self.label!r} came back changed ({changed}); nothing was sent: "
                "open a new McpToolset (a resume's drift guard decides whether the run may go on)"
            )
            raise ToolEnvironmentError(self._dead)

    def _ended_because(self) -> str:
        keeper = self._keeper
        if keeper is None or not keeper.done():
            return "it is still open"
        if keeper.cancelled():
            return "it was closed"
        error = keeper.exception()
        if error is None:
            return "it was closed"
        tail = self._stderr_tail()
        return f"{_describe(error)}" + (f"; its stderr ends: {tail}" if tail else "")

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.flush()
            self._stderr.seek(0)
            lines = [" ".join(line.split()) for line in self._stderr.read().splitlines()]
            return " | ".join([line for line in lines if line][-3:])[-_STDERR_TAIL_CHARS:]
        return ""


REFUSED_BEFORE_RUNNING: Final = frozenset({METHOD_NOT_FOUND, INVALID_PARAMS})
"""The JSON-RPC error codes that say the server refused a request without running it (no such
method; unknown tool or bad arguments): the only errors taken as the server's answer."""


def answered_by_server(code: int) -> bool:
    """Whether a JSON-RPC error with ``code`` is a server's definite answer (the request was
    refused before it ran), rather than an outcome in doubt (module docstring)."""
    return code in REFUSED_BEFORE_RUNNING


def _identity_of(info: Implementation | None) -> tuple[str, str]:
    """A server's name and version as it gave them (empty when it gave none)."""
    return ("", "") if info is None else (info.name, info.version)


def _canonical_listing(tools: list[Tool]) -> str:
    """A tool listing as canonical JSON, for "the same tools as before"."""
    dumped = [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]
    return json.dumps(dumped, sort_keys=True, separators=(",", ":"))


def _package_version() -> str:
    """polyloop's version as installed (``polyloop.__version__`` would import the whole core,
    the short path included, from below it)."""
    try:
        return importlib.metadata.version("polyloop")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "0+unknown"


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}"


_CLIENT: Final = Implementation(name="polyloop", version=_package_version())
