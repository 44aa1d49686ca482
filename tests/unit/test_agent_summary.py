"""``AgentResult.summary()`` and ``RunTotals.actions``: a run that offered tools and never had
one called must be easy to notice (issue 26 item 1, design 0216). Offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyloop import Agent, tool
from polyloop.testing import ScriptedModelClient
from polyloop.types import ModelReply, NativeToolCall, RunTotals

pytestmark = pytest.mark.unit


@tool(replay="safe")
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def _call(name: str, arguments: dict[str, object], index: int) -> ModelReply:
    call = NativeToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))
    return ModelReply(call_id=f"r{index}", content="", tool_calls=(call,))


async def test_the_summary_counts_steps_and_tool_calls(tmp_path: Path) -> None:
    model = ScriptedModelClient(
        [_call("add", {"a": 2, "b": 3}, 0), _call("add", {"a": "x", "b": 1}, 1), "5"],
        native_tool_calls=True,
    )
    result = await Agent(model, tools=[add], store=tmp_path).run("2 + 3?", run_id="r")
    assert result.totals.actions == 2  # the refused call (a string for an int) counts too
    assert result.totals.steps == 3
    assert result.summary() == "final_answer after 3 steps and 2 tool calls: 5"


async def test_a_run_that_offered_tools_and_called_none_says_so(tmp_path: Path) -> None:
    model = ScriptedModelClient(["What is 2 + 3?"], native_tool_calls=True)
    result = await Agent(model, tools=[add], store=tmp_path).run("What is 2 + 3?", run_id="r")
    assert result.summary() == (
        "final_answer after 1 step and 0 tool calls (none of the offered tools add was called: "
        "does the server show the model its tools?): What is 2 + 3?"
    )


async def test_a_run_without_tools_or_answer_says_only_its_counts(tmp_path: Path) -> None:
    model = ScriptedModelClient([""], native_tool_calls=True, when_exhausted="repeat_last")
    agent = Agent(model, store=tmp_path)
    result = await agent.run("hello", run_id="r")
    assert result.summary() == f"parse_failures after {len(result.steps)} steps and 0 tool calls"


def test_totals_count_actions_and_default_to_zero_for_old_callers() -> None:
    totals = RunTotals(
        steps=1,
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=0,
        steps_without_usage=1,
        model_ms=0,
        action_ms=0,
    )
    assert totals.actions == 0
    with pytest.raises(ValueError, match="actions"):
        RunTotals(**{**_fields(totals), "actions": -1})


def _fields(totals: RunTotals) -> dict[str, int]:
    return {name: getattr(totals, name) for name in totals.__dataclass_fields__}
