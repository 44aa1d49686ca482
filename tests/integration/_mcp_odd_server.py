"""An MCP server written with the SDK's own server API, for the odd cases of polyloop.mcp.

``python _mcp_odd_server.py LEDGER [--variant 1|2] [--http PORT]``: stdio by default; with
``--http`` streamable HTTP on 127.0.0.1:PORT (it prints ``READY`` to stderr when it listens).
Every call of ``put``, ``append`` and ``hang`` writes one JSON line (tool, arguments, the
request's ``_meta`` key ``polyloop/idempotencyKey``) to ``LEDGER`` before it acts, so a test
can count executions and read the key each carried. ``--variant 2`` changes ``echo``'s
schema and ``put``'s annotations (the drift guard's case).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
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
        line = {"tool": tool, "arguments": arguments, "key": meta.get(IDEMPOTENCY_META_KEY)}
        with ledger.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    if variant == 1:

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
        if variant == 1
        else ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False)
    )

    @server.tool(annotations=put_hints)
    async def put(key: str, value: str, ctx: Context) -> str:
        """Set key to value (the same call twice changes nothing)."""
        record("put", ctx, key=key, value=value)
        return f"{key}={value}"

    @server.tool()
    async def append(item: str, ctx: Context) -> str:
        """Append an item to the list (no annotations: every call adds one)."""
        record("append", ctx, item=item)
        return f"appended {item}"

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger", type=Path)
    parser.add_argument("--variant", type=int, default=1, choices=(1, 2))
    parser.add_argument("--http", type=int, default=None)
    options = parser.parse_args()
    server = build(options.ledger, options.variant)
    if options.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.http)


if __name__ == "__main__":
    main()
