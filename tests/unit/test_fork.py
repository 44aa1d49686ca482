"""Fork: a new run from a run's first k steps, with 0 calls for them (issue 40; design 0239).

The fork's steps ``0 .. k-1`` are the source's records, copied under the new run id: a model
client and tools that fail the test when called for them prove that nothing is called or
executed; a ``NEVER`` tool's ledger proves that the prefix's effect is not repeated; the
source's bytes are compared before and after; the fork then lives like any run (new
settings on record, a crash and a resume, an interrupted copy completed).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, Tally, definition, make_tools, request, tool_request

from polyloop import Agent, tool
from polyloop.errors import (
    ForkError,
    ParameterDriftError,
    PolyloopValueError,
    RunIdentityError,
)
from polyloop.inspect import load_target, main, render_html
from polyloop.ports import ModelCall, RunStore
from polyloop.serialization import decode_run_started
from polyloop.session import (
    AgentDefinition,
    RunRequest,
    check_log,
    fork,
    resume,
    run,
    run_fork,
)
from polyloop.session._continuation import prefix_digest
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import Budget, ModelReply, NativeToolCall, ReplayPolicy, StopReason

pytestmark = pytest.mark.unit

SOURCE_SCRIPT = ["tool:echo {}", "tool:write {}", "tool:echo {}", "tool:write {}", "final:old"]


class _CalledTooEarly(AssertionError):
    """A model call or a tool call for a step the fork copies."""


class GuardedModel(ScriptedModelClient):
    """Raises (fails the test) for any call of a step before ``first``."""

    def __init__(
        self,
        script: list[str | BaseException],
        *,
        first: int,
        identity: str = "scripted-v1",
        native_tool_calls: bool = False,
    ) -> None:
        super().__init__(
            script,
            thinking="hmm",
            parameters={"model": identity},
            native_tool_calls=native_tool_calls,
        )
        self.first = first

    async def before_reply(self, call: ModelCall) -> None:
        if call.call_index < self.first:
            raise _CalledTooEarly(f"model called for copied step {call.call_index}")


def _specs(registry: ToolRegistry) -> list[ToolSpec]:
    return [spec for name in registry.names() if (spec := registry.spec_for(name)) is not None]


def _guarded_tools(tally: Tally, first: int) -> ToolRegistry:
    """``make_tools``' tools, each failing the test when its action is of a copied step."""
    specs = []
    for spec in _specs(make_tools(tally)):
        inner = spec.handler
        assert inner is not None

        async def handler(arguments: Mapping[str, object], ctx: object, _inner=inner) -> str:  # type: ignore[no-untyped-def]
            step = getattr(ctx, "step_idx", None)
            if step is None or step < first:
                raise _CalledTooEarly(f"tool called for copied step {step}")
            return await _inner(arguments)  # type: ignore[no-any-return]

        handler.takes_context = True  # type: ignore[attr-defined]
        specs.append(dataclasses.replace(spec, handler=handler))
    return ToolRegistry(specs)


async def _source(store: RunStore, tally: Tally) -> None:
    agent = definition(ScriptedModel(SOURCE_SCRIPT), store=store)
    result = await run(agent, tool_request(tally))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert tally.runs == {"echo": 2, "write": 2}


def _fork_agent(
    store: RunStore, tally: Tally, at: int, script: list[str], **extra: object
) -> tuple[AgentDefinition, RunRequest, GuardedModel]:
    model = GuardedModel(script, first=at, identity=str(extra.pop("identity", "scripted-v1")))
    agent = definition(model, store=store)
    req = request("fork-1", tools=_guarded_tools(tally, at), **extra)  # type: ignore[arg-type]
    return agent, req, model


@pytest.mark.parametrize("at", [0, 2, 4, 5])
async def test_a_fork_makes_no_call_for_its_copied_steps_and_goes_on_live(
    at: int, tmp_path: Path
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    tally = Tally()
    await _source(store, tally)
    before = (tmp_path / "run-1.jsonl").read_bytes()
    script = ["x"] * at + ["tool:echo {}", "final:new"]
    agent, req, model = _fork_agent(store, tally, at, script)

    result = await run_fork(agent, req, source_run_id="run-1", at=at)

    assert (tmp_path / "run-1.jsonl").read_bytes() == before  # the source is untouched
    assert [call.call_index for call in model.calls] == (
        [at, at + 1] if at < 5 else []  # forked after the final answer: it stops at once
    )
    source = await store.read_log("run-1")
    forked = await store.read_log("fork-1")
    assert check_log(forked, "fork-1") is None
    assert [s.step for s in forked.steps[:at]] == [s.step for s in source.steps[:at]]
    origin = forked.started.fork if forked.started is not None else None
    assert origin is not None
    prefix = [e.record for e in source.entries][: origin.records]
    assert (origin.run_id, origin.step_idx, origin.chain) == ("run-1", at, ())
    assert origin.digest == prefix_digest(prefix[1:])
    assert forked.entries[origin.records - 1].record.run_id == "fork-1"
    writes_in_prefix = sum(1 for s in source.steps[:at] if s.step.action == "tool:write {}")
    # The NEVER tool's ledger: the source wrote twice; the fork repeated none of the
    # prefix's writes (its own steps called echo only).
    assert tally.runs["write"] == 2
    assert tally.runs["echo"] == 2 + (1 if at < 5 else 0)
    assert writes_in_prefix == sum(1 for s in forked.steps[:at] if s.step.action == "tool:write {}")
    if at < 5:
        assert result.stop_reason is StopReason.FINAL_ANSWER
        assert result.final_answer == "new"
    else:
        assert result.stop_reason is StopReason.FINAL_ANSWER
        assert result.final_answer == "old"  # re-parsing the copied last step stops it


async def test_the_fork_runs_under_its_own_settings_and_is_guarded_against_drift_from_them() -> (
    None
):
    store = VolatileRunStore()
    tally = Tally()
    await _source(store, tally)
    agent, req, _ = _fork_agent(
        store,
        tally,
        2,
        ["x", "x", "tool:echo {}", "final:new"],
        identity="another-model",
        budget=Budget(max_steps=6, max_actions=6, max_consecutive_parse_failures=1),
    )
    await fork(store, "run-1", at=2, new_run_id="fork-1", definition=agent, request=req)
    forked = await store.read_log("fork-1")
    assert forked.started is not None
    snapshot = forked.started.parameter_snapshot
    assert snapshot["model_client.model"] == "another-model"
    assert snapshot["request.max_steps"] == "6"
    # Its settings are the new ones: a resume under the source's drifts, under them it runs.
    source_agent = definition(ScriptedModel(SOURCE_SCRIPT), store=store)
    with pytest.raises(ParameterDriftError, match="model_client.model"):
        await resume(source_agent, dataclasses.replace(tool_request(tally), run_id="fork-1"))
    result = await resume(agent, req)
    assert result.final_answer == "new"
    again = await run_fork(agent, req, source_run_id="run-1", at=2)  # idempotent
    assert again == result
    with pytest.raises(PolyloopValueError, match="both definition and request"):
        await fork(store, "run-1", at=2, new_run_id="fork-2", definition=agent)


async def test_a_fork_resumes_after_a_crash_like_any_run() -> None:
    class Crash(BaseException):
        """A process death in the middle of the fork's own step."""

    store = VolatileRunStore()
    tally = Tally()
    await _source(store, tally)
    agent, req, _ = _fork_agent(
        store, tally, 2, ["x", "x", "tool:write {}", "final:new"], model_policy=ReplayPolicy.SAFE
    )
    crashing = dataclasses.replace(
        agent, model_client=GuardedModel(["x", "x", "tool:write {}", Crash()], first=2)
    )
    with pytest.raises(Crash):
        await run_fork(crashing, req, source_run_id="run-1", at=2)
    assert tally.runs["write"] == 3  # the fork's own write, once
    result = await resume(agent, req)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.final_answer == "new"
    assert tally.runs["write"] == 3  # nothing repeated by the resume
    assert check_log(await store.read_log("fork-1"), "fork-1") is None


async def test_an_interrupted_copy_is_completed_before_the_fork_goes_on(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    tally = Tally()
    await _source(store, tally)
    origin = await fork(store, "run-1", at=4, new_run_id="fork-1")
    whole = (tmp_path / "fork-1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(whole) == origin.records
    # A crash after the fork's fourth line: a valid prefix of the copy.
    (tmp_path / "fork-1.jsonl").write_text("".join(whole[:4]), encoding="utf-8")
    agent, req, model = _fork_agent(store, tally, 4, ["x"] * 4 + ["final:new"])
    result = await resume(agent, req)
    assert result.final_answer == "new"
    assert [call.call_index for call in model.calls] == [4]
    completed = (tmp_path / "fork-1.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["record"] for line in completed[: origin.records]] == [
        json.loads(line)["record"] for line in whole
    ]
    assert tally.runs == {"echo": 2, "write": 2}


async def test_a_fork_of_a_fork_records_its_chain() -> None:
    store = VolatileRunStore()
    tally = Tally()
    await _source(store, tally)
    first = await fork(store, "run-1", at=3, new_run_id="f1")
    second = await fork(store, "f1", at=2, new_run_id="f2")
    assert second.run_id == "f1"
    assert second.chain == (first,)
    third = await fork(store, "f2", at=1, new_run_id="f3")
    assert [o.run_id for o in third.lineage] == ["f2", "f1", "run-1"]
    # The same prefix has the same digest whichever run holds it.
    direct = await fork(store, "run-1", at=1, new_run_id="f4")
    assert third.digest == direct.digest
    for run_id in ("f1", "f2", "f3", "f4"):
        assert check_log(await store.read_log(run_id), run_id) is None


async def test_the_origin_round_trips_through_the_log(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    tally = Tally()
    await _source(store, tally)
    await fork(store, "run-1", at=2, new_run_id="f1")
    origin = await fork(store, "f1", at=1, new_run_id="f2")
    first_line = json.loads((tmp_path / "f2.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first_line["schema_version"] == "1.9"
    first_line.pop("record")
    first_line.pop("checksum", None)
    assert decode_run_started(first_line).fork == origin
    # The viewer and show say where it came from, the whole chain.
    (view,) = [v for v in load_target(str(tmp_path)).runs if v.run_id == "f2"]
    assert view.forked_from == "f1 at step 1 <- run-1 at step 2"
    page = render_html([view])
    assert '<div class="fork">Forked from f1 at step 1 &lt;- run-1 at step 2' in page
    out = io.StringIO()
    assert main(["show", str(tmp_path / "f2.jsonl")], out=out) == 0
    assert "forked from: f1 at step 1 <- run-1 at step 2 (step 0 copied, " in out.getvalue()


async def test_fork_points_that_cannot_be_forked_are_refused_with_the_fix() -> None:
    store = VolatileRunStore()
    tally = Tally()
    await _source(store, tally)
    with pytest.raises(PolyloopValueError, match="between 0 and 5"):
        await fork(store, "run-1", at=6, new_run_id="f1")
    with pytest.raises(RunIdentityError, match="no log"):
        await fork(store, "nope", at=0, new_run_id="f1")
    with pytest.raises(PolyloopValueError, match="source run itself"):
        await fork(store, "run-1", at=1, new_run_id="run-1")
    await fork(store, "run-1", at=1, new_run_id="f1")
    with pytest.raises(RunIdentityError, match="already has a log"):
        await fork(store, "run-1", at=1, new_run_id="f1")
    agent, req, _ = _fork_agent(store, tally, 1, ["x", "final:y"])
    with pytest.raises(RunIdentityError, match="not a fork of 'run-1' at step 2"):
        await run_fork(agent, dataclasses.replace(req, run_id="f1"), source_run_id="run-1", at=2)
    assert (await store.read_log("f2")).is_empty


async def test_a_step_in_doubt_at_the_fork_point_is_refused() -> None:
    class Crash(BaseException):
        """The process dies inside the NEVER tool."""

    tally = Tally()
    store = VolatileRunStore()

    async def dies(arguments: Mapping[str, object]) -> str:
        tally.hit("write")
        raise Crash

    tools = ToolRegistry(
        [
            *(s for s in _specs(make_tools(tally)) if s.name != "write"),
            ToolSpec(name="write", description="write a note", parameters={}, handler=dies),
        ]
    )
    agent = definition(ScriptedModel(["tool:echo {}", "tool:write {}"]), store=store)
    with pytest.raises(Crash):
        await run(agent, request(tools=tools))
    with pytest.raises(ForkError, match="step 1 is in doubt") as refused:
        await fork(store, "run-1", at=1, new_run_id="f1")
    assert refused.value.reason == "in_doubt"
    assert (await store.read_log("f1")).is_empty
    await fork(store, "run-1", at=0, new_run_id="f0")  # before the doubt: fine


async def test_a_call_waiting_for_approval_at_the_fork_point_is_refused() -> None:
    tally = Tally()
    store = VolatileRunStore()
    tools = ToolRegistry(
        [
            dataclasses.replace(spec, needs_approval=True) if spec.name == "write" else spec
            for spec in _specs(make_tools(tally))
        ]
    )
    agent = definition(ScriptedModel(["tool:echo {}", "tool:write {}"]), store=store)
    result = await run(agent, request(tools=tools))
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    with pytest.raises(ForkError, match="waits for a person's approval") as refused:
        await fork(store, "run-1", at=1, new_run_id="f1")
    assert refused.value.reason == "awaiting_approval"


@tool(replay="safe")
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


def _native(name: str, arguments: dict[str, object], index: int) -> ModelReply:
    call = NativeToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))
    return ModelReply(call_id=f"r{index}", content="", tool_calls=(call,))


async def test_an_agent_forks_with_its_definition_and_request_and_continues_with_run(
    tmp_path: Path,
) -> None:
    """The short path: ``run_fork(agent.definition(), agent.request(prompt, new_id), ...)``,
    then ``agent.run(prompt, run_id=new_id)`` is the fork's ``run_or_resume``."""
    first = Agent(
        ScriptedModelClient(
            [_native("add", {"a": 2, "b": 3}, 0), _native("add", {"a": 5, "b": 4}, 1), "9"],
            native_tool_calls=True,
        ),
        tools=[add],
        store=tmp_path,
    )
    assert (await first.run("Add 2, 3 and 4.", run_id="sum")).final_answer == "9"
    second = Agent(
        GuardedModel(["x", "The sum so far is 5."], first=1, native_tool_calls=True),
        tools=[add],
        store=tmp_path,
        instructions="Answer at once.",
    )
    prompt = "Add 2 and 3, then stop."
    result = await run_fork(
        second.definition(), second.request(prompt, "sum-fork"), source_run_id="sum", at=1
    )
    assert result.final_answer == "The sum so far is 5."
    again = await second.run(prompt, run_id="sum-fork")  # resumes: the stored result
    assert again.final_answer == "The sum so far is 5."
