"""One open connection to one MCP server, kept by a task of its own (design 0211).

=================================  ========================================================
event                              what happens
=================================  ========================================================
``open()``                         a keeper task enters the SDK's ``Client`` (stdio: starts
                                   the command; http: connects) and waits; ``open`` waits
                                   for the handshake at most ``connect_timeout_seconds`` and
                                   raises ``McpConnectionError`` naming the server otherwise
``call()``                         ``tools/call`` from the caller's task; waits for the
                                   answer or the keeper's end, whichever comes first
the server dies mid-call           ``ToolEnvironmentError`` naming the server (the SDK fails
                                   the pending request with "Connection closed", or the
                                   keeper ends): an ``ENV_ERROR`` outcome, never a hang
a call after the server died       ``ToolEnvironmentError`` at once
the server answers a JSON-RPC      ``McpToolError`` with the code and message: an executed
error                              action that failed, which the model reads
the caller is cancelled            the request is cancelled and ``CancelledError`` goes on
``close()``                        the keeper leaves the ``Client`` (stdio: the SDK ends the
                                   process); after ``close_timeout_seconds`` it is cancelled
=================================  ========================================================

Why a keeper task: the SDK's transports hold ``anyio`` task groups that must be entered and
left by one task, and a failure inside them cancels that task. Kept apart, a dying server ends
its keeper, not the run. A stdio server's stderr goes to a temporary file whose last lines are
quoted in these errors (never the request's arguments or an HTTP header).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import tempfile
from collections.abc import Awaitable, Mapping
from typing import IO, Any, Final

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, Implementation, Tool
from mcp_types.jsonrpc import CONNECTION_CLOSED

from polyloop.errors import McpConnectionError, McpToolError, ToolEnvironmentError

__all__ = ["Connection", "Progress", "ServerAddress"]

logger = logging.getLogger("polyloop.mcp")

_STDERR_TAIL_CHARS: Final = 400
_LIST_PAGES_CAP: Final = 100
_HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)

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


class Connection:
    """One server's connection; see the module docstring for what each event does."""

    def __init__(
        self,
        address: ServerAddress,
        label: str,
        *,
        connect_timeout_seconds: float,
        close_timeout_seconds: float,
    ) -> None:
        self._address = address
        self.label = label
        self._connect_timeout = connect_timeout_seconds
        self._close_timeout = close_timeout_seconds
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._stderr: IO[str] | None = None
        self._dead: str | None = None

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
            return
        why = (
            self._ended_because()
            if self._keeper.done()
            else f"no handshake within {self._connect_timeout} s (connect_timeout_seconds)"
        )
        await self.close()
        raise McpConnectionError(f"cannot connect to MCP server {self.label!r}: {why}")

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
        """Leave the connection; bounded by ``close_timeout_seconds``, then cancelled."""
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
        """Every tool the server lists, all pages."""
        client = self._live_client()
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES_CAP):
            page = await self._bounded(client.list_tools(cursor=cursor), "tools/list")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
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
        client = self._live_client()
        request = client.call_tool(
            tool,
            dict(arguments),
            progress_callback=progress,
            meta=None if meta is None else dict(meta),  # type: ignore[arg-type]
        )
        result: CallToolResult = await self._bounded(request, f"tools/call {tool!r}")
        return result

    async def _bounded(self, request: Awaitable[Any], what: str) -> Any:
        """``request``'s answer, or the connection's end, whichever is first (never a hang)."""
        keeper = self._keeper
        assert keeper is not None
        pending = asyncio.ensure_future(request)
        try:
            await asyncio.wait({pending, keeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not pending.done():  # the caller was cancelled, or the keeper ended first
                pending.cancel()
                await asyncio.wait({pending}, timeout=self._close_timeout)
        if not pending.done() or pending.cancelled():
            raise self._died(f"the connection ended during {what}: {self._ended_because()}")
        error = pending.exception()
        if isinstance(error, MCPError):
            if error.error.code == CONNECTION_CLOSED and keeper_or_closed(error):
                raise self._died(f"the connection closed during {what}") from error
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
            raise self._died(f"the connection is not open: {self._ended_because()}")
        return self._client

    def _died(self, why: str) -> ToolEnvironmentError:
        tail = self._stderr_tail()
        self._dead = f"MCP server {self.label!r}: {why}" + (
            f"; its stderr ends: {tail}" if tail else ""
        )
        return ToolEnvironmentError(self._dead)

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


def keeper_or_closed(error: MCPError) -> bool:
    """Whether an ``MCPError`` is the SDK's own "the connection closed" (not a server's -32000)."""
    return error.error.message == "Connection closed"


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
