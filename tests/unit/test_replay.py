"""Replay: a recorded run driven through today's settings offline (issue 40; design 0240).

A changed observation template, parser, tool schema, replay policy or budget is reported at
the step where it first changes what the run does, with what differs; an unchanged setup is
"same" for every committed fixture log (the demo's agent builds their definitions); nothing
is called or executed; a 1,000-step log replays within a CPU bound (the figure is
``tools/bench/replay.py``'s).
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from _session_doubles import (
    CONTEXT,
    CodeExecutor,
    ScriptedModel,
    Tally,
    TinyParser,
    definition,
    make_tools,
    request,
)
from tools.bench.replay import record_run
from tools.demo._scenarios import agent_for

from polyloop.errors import LogCorruptError
from polyloop.inspect import main
from polyloop.ports import ModelCall, ParsedReply
from polyloop.session import (
    AgentDefinition,
    Pricing,
    RunRequest,
    approve,
    reject,
    replay,
    resume,
    run,
    run_fork,
)
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry
from polyloop.types import (
    ActionOutcome,
    Budget,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    RunStarted,
    StopReason,
    TextBlock,
    Usage,
)

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_LOGS = sorted(FIXTURES.glob("logs-*/*.jsonl"))
SCRIPT = ['tool:echo {"text": "a"}', "tool:write {}", 'tool:echo {"text": "b"}', "final:done"]


class _Called(AssertionError):
    """Replay called the model or executed a tool."""


class RefusingModel(ScriptedModel):
    async def before_reply(self, call: ModelCall) -> None:
        raise _Called(f"the model was called for step {call.call_index}")


def _refusing_tools() -> ToolRegistry:
    """``make_tools``' tools (same names, schemas, policies), each failing when executed."""
    registry = make_tools(Tally())
    specs = []
    for name in registry.names():
        spec = registry.spec_for(name)
        assert spec is not None

        async def refuse(arguments: Mapping[str, object], _name: str = name) -> str:
            raise _Called(f"tool {_name} was executed")

        specs.append(dataclasses.replace(spec, handler=refuse))
    return ToolRegistry(specs)


async def _recorded() -> tuple[AgentDefinition, RunRequest, VolatileRunStore]:
    store = VolatileRunStore()
    agent = definition(ScriptedModel(SCRIPT), store=store)
    req = request(tools=make_tools(Tally()))
    result = await run(agent, req)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    return agent, req, store


def _today(
    store: VolatileRunStore,
    *,
    parser: object | None = None,
    tools: ToolRegistry | None = None,
    **extra: object,
) -> tuple[AgentDefinition, RunRequest]:
    agent = definition(RefusingModel(["never used"]), store=store)
    if parser is not None:
        agent = dataclasses.replace(agent, decision_parser=parser)  # type: ignore[arg-type]
    return agent, request(tools=tools or _refusing_tools(), **extra)  # type: ignore[arg-type]


async def test_an_unchanged_setup_replays_the_same_without_calling_anything() -> None:
    _, _, store = await _recorded()
    before = await store.read_log("run-1")
    report = await replay(*_today(store))
    assert report.same, report.describe()
    assert report.describe() == "run-1: same (4 steps)"
    assert await store.read_log("run-1") == before  # nothing written


async def test_a_changed_observation_template_diverges_at_the_first_prompt_it_shapes() -> None:
    _, _, store = await _recorded()
    report = await replay(*_today(store, observation_template="Result: {observation}"))
    found = report.divergence
    assert found is not None
    assert (found.step_idx, found.what) == (1, "prompt")
    # The context is two messages; step 0's observation is message 3.
    assert "first differing message 3" in found.detail
    assert "'Observation: echo a'" in found.detail
    assert "'Result: echo a'" in found.detail
    assert found.detail.count("sha256:") == 2  # the digest of each side


class _StrictParser(TinyParser):
    """Today's parser: ``tool:write`` now needs a ``text`` argument."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = super().parse(reply)
        if reply.content == "tool:write {}":
            return dataclasses.replace(parsed, decision=_invalid("write needs text"))
        return parsed


def _invalid(explanation: str) -> object:
    from polyloop.ports import InvalidDecision

    return InvalidDecision(explanation=explanation)


async def test_a_changed_parser_diverges_at_the_step_it_parses_otherwise() -> None:
    _, _, store = await _recorded()
    report = await replay(*_today(store, parser=_StrictParser()))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (1, "decision")
    assert report.divergence.detail == "parsed: True recorded, False today"


class _HistoryParser(TinyParser):
    """Today's parser shortens what goes back into history."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = super().parse(reply)
        return dataclasses.replace(parsed, history_text=parsed.history_text[:6])


async def test_a_parser_that_changes_the_history_text_is_named() -> None:
    _, _, store = await _recorded()
    report = await replay(*_today(store, parser=_HistoryParser()))
    assert report.divergence is not None
    assert report.divergence.step_idx == 0
    assert report.divergence.detail.startswith("history text: 'tool:echo {")


def _changed(name: str, **changes: object) -> ToolRegistry:
    registry = _refusing_tools()
    specs = [registry.spec_for(n) for n in registry.names()]
    return ToolRegistry(
        [dataclasses.replace(s, **changes) if s.name == name else s for s in specs if s]  # type: ignore[arg-type]
    )


async def test_a_changed_tool_schema_diverges_at_the_first_call_of_the_tool() -> None:
    _, _, store = await _recorded()
    tools = _changed(
        "write", parameters={"type": "object", "properties": {"note": {"type": "string"}}}
    )
    report = await replay(*_today(store, tools=tools))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (1, "tool")
    assert report.divergence.detail.startswith("tool 'write': schema sha256:")
    assert "recorded, sha256:" in report.divergence.detail


async def test_a_changed_replay_policy_is_named_with_both_policies() -> None:
    _, _, store = await _recorded()
    report = await replay(*_today(store, tools=_changed("write", replay_policy=ReplayPolicy.SAFE)))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (1, "tool")
    assert report.divergence.detail == "tool 'write': replay policy never recorded, safe today"


async def test_a_changed_budget_diverges_where_today_would_stop() -> None:
    _, _, store = await _recorded()
    small = Budget(max_steps=2, max_actions=10, max_consecutive_parse_failures=3)
    report = await replay(*_today(store, budget=small))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (1, "stop_reason")
    assert "today's stops (step_budget)" in report.divergence.detail


async def test_a_changed_last_stop_is_named() -> None:
    _, _, store = await _recorded()

    class _NoFinal(TinyParser):
        def parse(self, reply: ModelReply) -> ParsedReply:
            if reply.content.startswith("final:"):
                return ParsedReply(history_text=reply.content, decision=_invalid("no"))  # type: ignore[arg-type]
            return super().parse(reply)

    report = await replay(*_today(store, parser=_NoFinal()))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (3, "decision")


async def test_an_empty_log_is_refused() -> None:
    store = VolatileRunStore()
    with pytest.raises(LogCorruptError, match="replay refused"):
        await replay(*_today(store))


def _fixture_store(path: Path, directory: Path) -> tuple[JsonlRunStore, str]:
    run_id = json.loads(path.read_text(encoding="utf-8").splitlines()[0])["run_id"]
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, directory / f"{run_id}.jsonl")
    return JsonlRunStore(directory=directory), run_id


@pytest.mark.parametrize("path", FIXTURE_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
async def test_every_committed_fixture_log_replays_the_same_under_the_demo_agent(
    path: Path, tmp_path: Path
) -> None:
    store, run_id = _fixture_store(path, tmp_path)
    log = await store.read_log(run_id)
    assert log.started is not None
    agent, req = agent_for(log.started)
    report = await replay(agent, req, log=log)
    assert report.same, report.describe()
    assert report.steps == len(log.steps) > 0


def test_there_are_fixture_logs_of_every_version() -> None:
    assert {p.parent.name for p in FIXTURE_LOGS} >= {
        "logs-0.1.0",
        "logs-1.6",
        "logs-1.7",
        "logs-1.8",
    }


async def test_a_thousand_step_log_replays_within_a_second_of_cpu() -> None:
    agent, req, log = await record_run(1000)
    assert len(log.steps) == 1000
    started = time.process_time()
    report = await replay(agent, req, log=log)
    spent = time.process_time() - started
    assert report.same, report.describe()
    assert spent < 1.0, f"replay of 1,000 steps took {spent:.3f} s of CPU"


# --------------------------------------------------------------------------- the command line


def changed_template_agent(started: RunStarted) -> tuple[AgentDefinition, RunRequest]:
    """A factory for ``--agent``: the demo's agent with another observation template."""
    agent, req = agent_for(started)
    return agent, dataclasses.replace(req, observation_template="Seen: {observation}")


def test_the_command_prints_one_line_per_run_and_fails_on_a_divergence(tmp_path: Path) -> None:
    for path in sorted((FIXTURES / "logs-1.8").glob("*.jsonl")):
        shutil.copyfile(path, tmp_path / path.name)
    out, err = io.StringIO(), io.StringIO()
    status = main(
        ["replay", str(tmp_path), "--agent", "tools.demo._scenarios:agent_for"], out=out, err=err
    )
    lines = out.getvalue().splitlines()
    assert status == 0, out.getvalue() + err.getvalue()
    assert lines[0] == "r1-total: same (5 steps)"
    assert lines[-1] == "replayed 6 runs: 6 same, 0 diverged or not replayed"

    out = io.StringIO()
    status = main(
        ["replay", str(tmp_path), "--agent", "test_replay:changed_template_agent"], out=out, err=err
    )
    lines = out.getvalue().splitlines()
    assert status == 1
    assert lines[0].startswith("r1-total: diverged at step 1: prompt: digest sha256:")
    assert lines[-1] == "replayed 6 runs: 0 same, 6 diverged or not replayed"


def test_the_command_names_a_run_it_cannot_replay(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "logs-1.8" / "r2-question.jsonl", tmp_path / "r2-question.jsonl")
    (tmp_path / "zz.jsonl").write_text("not json\n", encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    status = main(
        ["replay", str(tmp_path), "--agent", "tools.demo._scenarios:agent_for"], out=out, err=err
    )
    lines = out.getvalue().splitlines()
    assert status == 1
    assert lines[0] == "r2-question: same (2 steps)"
    assert lines[1].startswith("zz: not replayed: the log does not decode")
    bad = main(["replay", str(tmp_path), "--agent", "no_such_module:f"], out=out, err=err)
    assert bad == 2
    assert "cannot be imported" in err.getvalue()


async def test_replay_executes_nothing_even_for_an_outcome_it_stands_in_for() -> None:
    _, _, store = await _recorded()
    log = await store.read_log("run-1")
    outcomes = [c.action_outcome for c in log.steps if c.action_outcome is not None]
    assert all(isinstance(o, ActionOutcome) for o in outcomes)
    assert len(outcomes) == 3
    report = await replay(*_today(store))  # the tools and the model refuse to be called
    assert report.same


async def test_a_forks_copied_steps_are_history_and_its_own_steps_are_compared() -> None:
    _, _, store = await _recorded()
    other = dataclasses.replace(
        CONTEXT, goal_level=(Message(role=Role.USER, content=(TextBlock(text="Other."),)),)
    )
    forker = definition(ScriptedModel(["x", "x", "final:forked"]), store=store)
    fork_req = dataclasses.replace(request("fork-1", tools=make_tools(Tally())), context=other)
    await run_fork(forker, fork_req, source_run_id="run-1", at=2)
    agent = definition(RefusingModel(["never used"]), store=store)
    today = dataclasses.replace(request("fork-1", tools=_refusing_tools()), context=other)
    report = await replay(agent, today)
    assert report.same, report.describe()
    # Under the source's context the fork's own step diverges: its prompt was the other one.
    changed = await replay(agent, request("fork-1", tools=_refusing_tools()))
    assert changed.divergence is not None
    assert (changed.divergence.step_idx, changed.divergence.what) == (2, "prompt")


async def test_approved_and_rejected_calls_replay_their_recorded_decisions() -> None:
    store = VolatileRunStore()
    tools = _changed("write", needs_approval=True)
    live = ToolRegistry(
        [
            dataclasses.replace(s, needs_approval=True) if s.name == "write" else s
            for n in make_tools(Tally()).names()
            if (s := make_tools(Tally()).spec_for(n)) is not None
        ]
    )
    script = ["tool:write {}", "tool:write {}", "final:done"]
    agent = definition(ScriptedModel(script), store=store)
    req = request(tools=live)
    first = await run(agent, req)
    assert first.pending_approval is not None
    await reject(store, "run-1", digest=first.pending_approval.digest, by="p", reason="no")
    second = await resume(agent, req)
    assert second.pending_approval is not None
    await approve(store, "run-1", digest=second.pending_approval.digest, by="p")
    assert (await resume(agent, req)).stop_reason is StopReason.FINAL_ANSWER
    report = await replay(*_today(store, tools=tools))
    assert report.same, report.describe()
    assert report.steps == 3


async def test_a_cost_budget_stop_replays_and_a_changed_max_cost_is_named() -> None:
    pricing = Pricing.from_mapping({"priced-model": {"input": "0", "output": "10.00"}})
    reply = ModelReply(
        call_id=None, content="code:x", usage=Usage(prompt_tokens=0, completion_tokens=300)
    )
    store = VolatileRunStore()

    def priced(max_cost: str, model: ScriptedModelClient) -> tuple[AgentDefinition, RunRequest]:
        budget = Budget(
            max_steps=10, max_actions=10, max_consecutive_parse_failures=3, max_cost=max_cost
        )
        agent = dataclasses.replace(definition(ScriptedModel([]), store=store), model_client=model)
        return agent, request(executor=CodeExecutor(), budget=budget, pricing=pricing)

    recorded = ScriptedModelClient(
        [reply], when_exhausted="repeat_last", parameters={"model": "priced-model"}
    )
    result = await run(*priced("0.009", recorded))
    assert result.stop_reason is StopReason.COST_BUDGET
    assert len(result.steps) == 3
    refusing = ScriptedModelClient([], parameters={"model": "priced-model"})
    assert (await replay(*priced("0.009", refusing))).same
    report = await replay(*priced("0.02", refusing))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (2, "stop_reason")
    assert "stopped with cost_budget" in report.divergence.detail


async def test_a_tool_that_now_asks_for_approval_is_named_at_its_first_call() -> None:
    _, _, store = await _recorded()
    report = await replay(*_today(store, tools=_changed("write", needs_approval=True)))
    assert report.divergence is not None
    assert (report.divergence.step_idx, report.divergence.what) == (1, "tool")
    assert report.divergence.detail.startswith("tool 'write': needs_approval absent recorded, ")
