"""What README and scope.md tell a new user holds (issue 36, point 8; design 0235): the
install commands name real extras and the wheel this version builds; the advice for a small
local model (a smaller step budget) ends a model that loops on one tool call where the README
says; ``scope.md`` describes the defaults ``Agent`` really has."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import polyloop
from polyloop import Agent, tool
from polyloop.parsers import NativeToolCallParser
from polyloop.stores import JsonlRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.types import Budget, ModelReply, NativeToolCall, StopReason

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SCOPE = (ROOT / "research-wiki" / "explanation" / "scope.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_install_section_names_real_extras_and_this_versions_wheel() -> None:
    install = _section("Installing polyloop in your own project")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = set(project["optional-dependencies"])
    named = {
        extra
        for group in re.findall(r"polyloop[^\s\"]*\[([a-z,]+)\]", install)
        for extra in group.split(",")
    }
    assert named
    assert named <= extras, named - extras
    wheels = re.findall(r"polyloop-[^\s\"\[]+\.whl", install)
    assert wheels == [f"{project['name']}-{polyloop.__version__}-py3-none-any.whl"]
    assert "pip install -e" in install
    assert ".venv/bin/pip install" in install


class NativeScript(ScriptedModelClient):
    """A scripted model that speaks native tool calls, as the guide's server does."""

    native_tool_calls = True


@tool(replay="safe")
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def test_a_model_that_loops_on_add_is_ended_by_the_budget_the_readme_suggests(
    tmp_path: Path,
) -> None:
    """The 270M base model's behaviour (a native call of ``add(1, 2)``, again and again), and
    the README's first remedy: ``budget=Budget(max_steps=6, max_actions=6)``."""
    advice = _section("A first agent")
    assert "budget=Budget(max_steps=6, max_actions=6)" in advice
    assert "step_budget after 30 steps and 30 tool calls" in advice
    call = NativeToolCall(id="c", name="add", arguments='{"a": 1, "b": 2}')
    looping = NativeScript(
        [ModelReply(call_id="r", content="", tool_calls=(call,))], when_exhausted="repeat_last"
    )
    agent = Agent(looping, tools=[add], store=tmp_path, budget=Budget(max_steps=6, max_actions=6))
    result = agent.run_sync("What is (2 + 3) * 4?", run_id="small-model")
    assert result.stop_reason is StopReason.STEP_BUDGET
    assert len(looping.calls) == 6
    assert result.summary().startswith("step_budget after 6 steps and 6 tool calls")


def test_scope_names_the_defaults_agent_really_has(tmp_path: Path) -> None:
    flat = " ".join(SCOPE.split())
    for found in re.finditer(r"no default store", flat):  # said of the core only, never of Agent
        assert "`AgentDefinition`" in flat[max(0, found.start() - 120) : found.start()]
    for named in ('`JsonlRunStore("runs")`', "`NativeToolCallParser`", "`GatewayModelClient`"):
        assert named in SCOPE, named
    definition = Agent(NativeScript(["x"]), tools=[add]).definition()
    assert isinstance(definition.store, JsonlRunStore)
    assert repr(definition.store) == "JsonlRunStore(directory='runs')"
    assert isinstance(definition.decision_parser, NativeToolCallParser)
