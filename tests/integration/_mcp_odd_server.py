"""An MCP server written with the SDK's own server API, for the odd cases of polyloop.mcp.

``python _mcp_odd_server.py LEDGER [--variant 1|2|3|4] [--http PORT] [--silent WHAT]``:
stdio by default; with ``--http`` streamable HTTP on 127.0.0.1:PORT. Every call of ``put``,
``append``, ``hang``, ``die`` and ``die_after_progress`` writes one JSON line (tool,
arguments, the request's ``_meta`` key ``polyloop/idempotencyKey``, and over HTTP the
``X-Test`` header it came with) to ``LEDGER`` before it acts, so a test can count executions
and read what each carried. ``--variant 2`` changes ``echo``'s schema and ``put``'s
annotations (the drift guard's case); ``3`` also offers ``extra``; ``4`` lacks ``append``;
``5`` also offers ``refund``, ``r\\u0435fund`` (a Cyrillic small ie) and ``files.read``
(names a provider refuses, design 0233).
``--silent initialize`` (or ``tools/list``) is a bare stdio JSON-RPC loop, not the SDK, that
never answers that request (and answers the handshake, for ``tools/list``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

IDEMPOTENCY_META_KEY = "polyloop/idempotencyKey"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def build(ledger: Path, variant: int) -> MCPServer:
    server = MCPServer("odd", version=f"1.{variant}.0")

    def record(tool: str, ctx: Context, **arguments: object) -> None:
        meta = ctx.request_context.meta or {}
        headers = ctx.headers or {}
        line = {
            "tool": tool,
            "arguments": arguments,
            "key": meta.get(IDEMPOTENCY_META_KEY),
            "x_test": headers.get("x-test"),
        }
        with ledger.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    if variant != 2:

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        async def echo(text: str) -> str:
            """Say the text back."""
            return text

    else:

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        async def echo(text: str, loud: bool = False) -> str:
            """Say the text back."""
            return text.upper() if loud else text

    put_hints = (
        ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True)
        if variant != 2
        else ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False)
    )

    @server.tool(annotations=put_hints)
    async def put(key: str, value: str, ctx: Context) -> str:
        """Set key to value (the same call twice changes nothing)."""
        record("put", ctx, key=key, value=value)
        return f"{key}={value}"

    if variant != 4:

        @server.tool()
        async def append(item: str, ctx: Context) -> str:
            """Append an item to the list (no annotations: every call adds one)."""
            record("append", ctx, item=item)
            return f"appended {item}"

    if variant == 3:

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        async def extra() -> str:
            """A tool the first variant does not offer."""
            return "extra"

    if variant == 5:  # names outside the provider-safe pattern (design 0233)

        @server.tool(name="refund")
        async def refund(order: str, ctx: Context) -> str:
            """Refund an order."""
            record("refund", ctx, order=order)
            return f"refunded {order}"

        @server.tool(name="r\u0435fund")  # a Cyrillic small ie (U+0435): prints like "refund"
        async def homoglyph(order: str, ctx: Context) -> str:
            """Refund an order (a different tool)."""
            record("r\u0435fund", ctx, order=order)
            return f"refunded {order} elsewhere"

        @server.tool(name="files.read", annotations=ToolAnnotations(readOnlyHint=True))
        async def dotted(path: str) -> str:
            """Read a file (a dotted name)."""
            return f"read {path}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def fails(why: str) -> str:
        """Always fail with the reason given."""
        raise ToolError(f"it failed because {why}")

    @server.tool()
    async def hang(ctx: Context) -> str:
        """Never answer."""
        record("hang", ctx)
        await asyncio.sleep(3600)
        return "woke up"

    @server.tool()
    async def die(ctx: Context) -> str:
        """Exit the server in the middle of the call."""
        record("die", ctx)
        os._exit(3)

    @server.tool()
    async def die_after_progress(ctx: Context) -> str:
        """Report progress (over HTTP the reply stream has started), then exit mid-call."""
        record("die_after_progress", ctx)
        await ctx.report_progress(1, 2, "half way")
        await asyncio.sleep(0.3)
        os._exit(3)

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def slow(steps: int, ctx: Context) -> str:
        """Report progress for each step, then answer."""
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1} of {steps}")
            await asyncio.sleep(0.01)
        return f"{steps} steps done"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def picture() -> Image:
        """A 1x1 PNG."""
        return Image(data=PNG, format="png")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), structured_output=True)
    async def measure(word: str) -> dict[str, int]:
        """The length of a word, as structured content."""
        return {"length": len(word)}

    return server


def silent(never: str) -> None:
    """A bare JSON-RPC loop on stdio that never answers the method ``never``."""
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message or method == never:
            continue
        if method == "initialize":
            version = message["params"].get("protocolVersion", "2025-06-18")
            answer: dict[str, object] = {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "silent", "version": "0"},
            }
            reply: dict[str, object] = {"jsonrpc": "2.0", "id": message["id"], "result": answer}
        else:
            error = {"code": -32601, "message": "no such method"}
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": error}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger", type=Path)
    parser.add_argument("--variant", type=int, default=1, choices=(1, 2, 3, 4, 5))
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--silent", choices=("initialize", "tools/list"), default=None)
    options = parser.parse_args()
    if options.silent is not None:
        silent(options.silent)
        return
    server = build(options.ledger, options.variant)
    if options.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.http)


if __name__ == "__main__":
    main()
