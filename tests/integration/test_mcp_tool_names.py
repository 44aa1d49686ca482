"""An MCP server's tool names outside the provider-safe pattern (issue 36, point 5; design
0233): mapped by ``safe_tool_name``, the same way on every listing, the server's name kept in
the snapshot and the classification, and a Cyrillic ``r\\u0435fund`` beside ``refund`` shown apart
by ``python -m polyloop approvals``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _mcp_servers import agent_run, odd_server

from polyloop.mcp import McpToolset
from polyloop.session import run
from polyloop.stores import JsonlRunStore
from polyloop.tools import TOOL_NAME_PATTERN, ToolRegistry, safe_tool_name
from polyloop.types import ReplayPolicy, StopReason

pytestmark = pytest.mark.integration

HOMOGLYPH = "r\u0435fund"


async def test_odd_names_are_mapped_apart_deterministically_and_recorded(tmp_path: Path) -> None:
    server = odd_server(tmp_path / "ledger", variant=5)
    # an override names the tool as the model sees it
    overrides = {safe_tool_name("files.read"): ReplayPolicy.NEVER}
    async with McpToolset(server, overrides=overrides) as toolset:
        names = [spec.name for spec in toolset.specs()]
        rows = {row.tool: row for row in toolset.classification()}
        parameters = toolset.registry().executor().parameters()
        table = toolset.table()
    async with McpToolset(odd_server(tmp_path / "ledger", variant=5)) as again:
        assert [spec.name for spec in again.specs()] == names  # a resume finds the same names
    mapped, dotted = safe_tool_name(HOMOGLYPH), safe_tool_name("files.read")
    assert {"refund", mapped, dotted} <= set(names)
    assert all(re.fullmatch(TOOL_NAME_PATTERN, name) for name in names)
    assert mapped != "refund"
    assert rows[mapped].server_name == HOMOGLYPH
    assert rows["refund"].server_name == ""
    assert rows[dotted].replay_policy is ReplayPolicy.NEVER
    assert parameters[f"tool.{mapped}.mcp.tool"] == HOMOGLYPH
    assert f"{mapped} (the server's 'r\\u0435fund')" in table


async def test_a_mapped_tool_calls_the_servers_tool_and_approvals_tells_the_two_apart(
    tmp_path: Path,
) -> None:
    ledger, runs = tmp_path / "ledger", tmp_path / "runs"
    mapped = safe_tool_name(HOMOGLYPH)
    async with McpToolset(odd_server(ledger, variant=5)) as toolset:
        specs = [
            dataclasses.replace(spec, needs_approval=True) if "fund" in spec.name else spec
            for spec in toolset.specs()
        ]
        executed = await ToolRegistry(specs).executor().execute(_call(mapped, {"order": "A-1"}))
        definition, request = agent_run(
            [json.dumps({"tool": mapped, "arguments": {"order": "A-2"}})],
            ToolRegistry(specs),
            "refunds",
            JsonlRunStore(directory=runs),
        )
        result = await run(definition, request)
    assert executed.observation == "refunded A-1 elsewhere"
    assert [line["tool"] for line in map(json.loads, ledger.read_text().splitlines())] == [
        HOMOGLYPH
    ]
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    shown = await asyncio.to_thread(approvals, runs)
    assert f"tool {mapped}" in shown
    assert HOMOGLYPH not in shown
    assert "tool refund" not in shown
    assert "MCP tool 'r\\u0435fund' of server odd" in shown


def approvals(runs: Path) -> str:
    """``python -m polyloop approvals RUNS``'s output."""
    return subprocess.run(
        [sys.executable, "-m", "polyloop", "approvals", str(runs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def _call(name: str, arguments: dict[str, object]):  # type: ignore[no-untyped-def]
    from polyloop.ports import Action, ToolCall, ToolContext

    return Action(
        text=name,
        tool_call=ToolCall(name=name, arguments=arguments),
        context=ToolContext(idempotency_key="k-1", run_id="r", step_idx=0),
    )
