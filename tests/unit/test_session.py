"""run() and resume() driven by scripted doubles: every stop reason, the write-ahead log,
failure semantics, events, identity, drift and cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import re
from pathlib import Path

import pytest
from _session_doubles import (
    BUDGET,
    TEXTS,
    CodeExecutor,
    HookedStore,
    ModelBoom,
    RecordingSink,
    ScriptedModel,
    Tally,
    TinyParser,
    definition,
    make_tools,
    request,
    texts_of,
    tool_request,
)

from polyloop.errors import FinishedRunDriftWarning, PolyloopTypeError
from polyloop.ports import Action, FinalAnswer, ParsedReply, RunLog
from polyloop.session import (
    AgentDefinition,
    LogCorruptError,
    ParameterDriftError,
    RunIdentityError,
    RunLeaseHeldError,
    RunRequest,
    resume,
    run,
)
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.tools import ToolRegistry, ToolSpec, ToolValidationError
from polyloop.types import (
    ActionStatus,
    Budget,
    Injection,
    IntentKind,
    ReplayPolicy,
    StopReason,
    SyntheticObservations,
)

pytestmark = pytest.mark.unit


def intent_kinds(log: RunLog) -> list[IntentKind]:
    return [intent.kind for intent in log.intents]


# --------------------------------------------------------------------------- happy paths


async def test_tool_run_completes_and_logs_every_execution_ahead_of_time() -> None:
    tally = Tally()
    model = ScriptedModel(['tool:echo {"text": "hi"}', 'tool:write {"text": "n"}', "tool:finish"])
    sink = RecordingSink()
    agent = definition(model, sink=sink)
    result = await run(agent, tool_request(tally))

    assert result.stop_reason is StopReason.TASK_COMPLETED
    assert [s.action for s in result.steps] == [c for c in model.script]
    assert [s.observation for s in result.steps] == ["echo hi", "written", "submitted"]
    assert tally.runs == {"echo": 1, "write": 1, "finish": 1}
    log = await agent.store.read_log("run-1")
    assert intent_kinds(log) == [IntentKind.MODEL_CALL, IntentKind.ACTION] * 3
    assert [i.replay_policy for i in log.intents if i.kind is IntentKind.ACTION] == [
        ReplayPolicy.SAFE,
        ReplayPolicy.NEVER,
        ReplayPolicy.NEVER,
    ]
    assert [r.result_id for r in log.model_results] == [
        i.result_id for i in log.intents if i.kind is IntentKind.MODEL_CALL
    ]
    assert [s.result_id for s in log.steps] == [
        i.result_id for i in log.intents if i.kind is IntentKind.ACTION
    ]
    assert log.finished is not None
    assert log.finished.result == result
    assert [e.step.step_idx for e in sink.events] == [0, 1, 2]
    assert all(e.run_id == "run-1" for e in sink.events)


async def test_final_answer_stops_with_the_answer_and_no_action() -> None:
    executor = CodeExecutor()
    result = await run(
        definition(ScriptedModel(["code:x = 1", "final:42"])), request(executor=executor)
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.final_answer == "42"
    assert executor.executed == ["x = 1"]
    assert result.steps[-1].action is None
    assert result.steps[-1].action_status is None


async def test_environment_reported_completion_completes_the_task() -> None:
    result = await run(definition(ScriptedModel(["code:done"])), request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.TASK_COMPLETED
    assert result.final_answer is None


# --------------------------------------------------------------------------- budgets


async def test_step_budget_counts_every_model_call() -> None:
    budget = dataclasses.replace(BUDGET, max_steps=4)
    model = ScriptedModel(["code:a", "nonsense", "code:b", "code:c", "code:d"])
    result = await run(definition(model), request(executor=CodeExecutor(), budget=budget))
    assert result.stop_reason is StopReason.STEP_BUDGET
    assert len(result.steps) == 4
    assert len(model.calls) == 4
    assert not result.steps[1].parse_ok, "a parse failure is a step too"


async def test_action_budget_counts_rejected_actions_too() -> None:
    tally = Tally()
    budget = dataclasses.replace(BUDGET, max_actions=2)
    model = ScriptedModel(["tool:nope", "tool:nope", "tool:echo"])
    result = await run(definition(model), tool_request(tally, budget=budget))
    assert result.stop_reason is StopReason.ACTION_BUDGET
    assert [s.action_status for s in result.steps] == [ActionStatus.NOT_EXECUTED] * 2
    assert tally.runs == {}


async def test_consecutive_parse_failures_stop_and_never_touch_the_environment() -> None:
    executor = CodeExecutor()
    model = ScriptedModel(["?", "code:a", "?", "?", "?", "code:b"])
    agent = definition(model)
    result = await run(agent, request(executor=executor))
    assert result.stop_reason is StopReason.PARSE_FAILURES
    assert executor.executed == ["a"]
    assert [s.parse_ok for s in result.steps] == [False, True, False, False, False]
    failed = result.steps[0]
    assert failed.parse_error == "say tool:, code: or final:"
    assert failed.observation == failed.parse_error
    log = await agent.store.read_log("run-1")
    assert intent_kinds(log).count(IntentKind.ACTION) == 1


async def test_prompt_too_large_on_the_first_call_stops_with_no_step_and_no_intent() -> None:
    budget = dataclasses.replace(BUDGET, max_prompt_chars=10)
    model = ScriptedModel(["code:a"])
    agent = definition(model)
    result = await run(agent, request(executor=CodeExecutor(), budget=budget))
    assert result.stop_reason is StopReason.PROMPT_TOO_LARGE
    assert result.steps == ()
    assert model.calls == []
    log = await agent.store.read_log("run-1")
    assert log.intents == ()
    assert log.steps == ()


async def test_prompt_limit_stops_before_the_call_that_would_exceed_it_and_never_truncates() -> (
    None
):
    probe = ScriptedModel(["code:aaaa"] * 3)
    await run(definition(probe), request(executor=CodeExecutor()))
    sizes = [sum(len(b.text) for m in c.messages for b in m.content) for c in probe.calls]
    assert sizes[0] < sizes[1] < sizes[2]

    budget = dataclasses.replace(BUDGET, max_prompt_chars=sizes[1])
    model = ScriptedModel(["code:aaaa"] * 3)
    agent = definition(model)
    result = await run(agent, request(executor=CodeExecutor(), budget=budget))
    assert result.stop_reason is StopReason.PROMPT_TOO_LARGE
    assert len(result.steps) == 2
    assert [s.prompt_chars for s in result.steps] == sizes[:2]
    assert len(model.calls) == 2
    log = await agent.store.read_log("run-1")
    assert intent_kinds(log) == [IntentKind.MODEL_CALL, IntentKind.ACTION] * 2


# --------------------------------------------------------------------------- failures


async def test_model_failure_becomes_a_failed_result_a_step_and_llm_error() -> None:
    model = ScriptedModel(["code:a", ModelBoom("gateway said no")])
    agent = definition(model)
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.LLM_ERROR
    assert len(result.steps) == 2
    failed = result.steps[1]
    assert failed.observation == TEXTS.model_call_failed
    assert failed.observation_is_synthetic
    assert failed.call_id is None
    assert failed.action is None
    log = await agent.store.read_log("run-1")
    assert log.model_results[1].reply is None
    assert log.model_results[1].failure == "ModelBoom: gateway said no"
    assert log.steps[1].result_id is None


async def test_env_error_is_recorded_then_stops_with_the_synthetic_observation() -> None:
    tally = Tally()
    agent = definition(ScriptedModel(["tool:broken", "tool:echo"]))
    result = await run(agent, tool_request(tally))
    assert result.stop_reason is StopReason.ENV_ERROR
    step = result.steps[0]
    assert (step.action_status, step.observation, step.observation_is_synthetic) == (
        ActionStatus.ENV_ERROR,
        TEXTS.env_failed,
        True,
    )
    log = await agent.store.read_log("run-1")
    assert log.steps[0].action_outcome is not None
    assert "sandbox gone" in log.steps[0].action_outcome.observation


async def test_rejected_action_shows_the_synthetic_text_and_keeps_the_explanation_in_the_log() -> (
    None
):
    agent = definition(ScriptedModel(['tool:echo {"text": 5}', "final:ok"]))
    result = await run(agent, tool_request(Tally()))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == TEXTS.action_rejected
    assert result.steps[0].action_status is ActionStatus.NOT_EXECUTED
    log = await agent.store.read_log("run-1")
    outcome = log.steps[0].action_outcome
    assert outcome is not None
    assert "text" in outcome.observation


async def test_an_action_that_errors_is_executed_and_its_error_is_the_observation() -> None:
    result = await run(definition(ScriptedModel(["tool:boom", "final:ok"])), tool_request(Tally()))
    assert result.steps[0].action_status is ActionStatus.EXECUTED
    assert "tool exploded" in result.steps[0].observation
    assert result.stop_reason is StopReason.FINAL_ANSWER


async def test_executor_exception_propagates_untouched_and_leaves_an_unknown_action() -> None:
    executor = CodeExecutor()
    agent = definition(ScriptedModel(["code:crash"]))
    req = request(executor=executor)
    with pytest.raises(OSError, match="executor bug"):
        await run(agent, req)
    log = await agent.store.read_log("run-1")
    assert intent_kinds(log) == [IntentKind.MODEL_CALL, IntentKind.ACTION]
    assert log.steps == ()
    assert log.finished is None

    result = await resume(agent, req)
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.steps == ()
    assert executor.executed == ["crash"], "a NEVER action must not run a second time"


async def test_sink_failures_are_counted_not_fatal_and_not_re_emitted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = RecordingSink(fail=True)
    agent = definition(ScriptedModel(["code:a", "code:b", "final:x"]), sink=sink)
    with caplog.at_level(logging.WARNING, logger="polyloop.session"):
        result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.event_delivery_failures == 3
    assert len(sink.events) == 3
    assert "event delivery failed" in caplog.text
    log = await agent.store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result.event_delivery_failures == 3


# --------------------------------------------------------------------------- identity


async def test_run_twice_on_one_id_is_refused() -> None:
    agent = definition(ScriptedModel(["final:a"]))
    await run(agent, request(executor=CodeExecutor()))
    with pytest.raises(RunIdentityError, match="resume"):
        await run(agent, request(executor=CodeExecutor()))


async def test_two_racing_starts_on_one_id_cannot_both_start() -> None:
    store = VolatileRunStore()
    first = definition(ScriptedModel(["final:a"]), store=store)
    second = definition(ScriptedModel(["final:b"]), store=store)
    outcomes = await asyncio.gather(
        run(first, request(executor=CodeExecutor())),
        run(second, request(executor=CodeExecutor())),
        return_exceptions=True,
    )
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failures) == 1
    # The lease refuses the second one before it reads anything (design 0120).
    assert isinstance(failures[0], RunLeaseHeldError)


async def test_a_racing_start_that_waits_for_the_lease_then_finds_the_id_used() -> None:
    store = VolatileRunStore()
    first = definition(ScriptedModel(["final:a"]), store=store)
    second = definition(ScriptedModel(["final:b"]), store=store)
    outcomes = await asyncio.gather(
        run(first, request(executor=CodeExecutor())),
        run(second, request(executor=CodeExecutor()), lease_wait_seconds=5),
        return_exceptions=True,
    )
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(failures) == 1
    assert isinstance(failures[0], RunIdentityError)


async def test_a_start_that_loses_the_exclusive_create_race_is_an_identity_error(
    tmp_path: Path,
) -> None:
    """The read-then-create window: the id looked free, then someone else created it."""
    store = JsonlRunStore(directory=tmp_path)
    (tmp_path / "run-1.jsonl").write_bytes(b'{"record": "run_sta')  # a start that died mid-write
    assert (await store.read_log("run-1")).is_empty
    model = ScriptedModel(["final:a"])
    with pytest.raises(RunIdentityError, match="racing") as caught:
        await run(definition(model, store=store), request(executor=CodeExecutor()))
    assert isinstance(caught.value.__cause__, FileExistsError)
    assert model.calls == []


async def test_resume_of_an_unknown_run_id_is_refused() -> None:
    model = ScriptedModel(["final:a"])
    with pytest.raises(RunIdentityError, match="run\\(\\)"):
        await resume(definition(model), request(executor=CodeExecutor()))
    assert model.calls == []


async def test_resume_of_a_finished_run_returns_the_stored_result_and_does_nothing() -> None:
    agent = definition(ScriptedModel(["code:a", "final:x"]))
    first = await run(agent, request(executor=CodeExecutor()))
    again_model = ScriptedModel(["final:other"])
    again = dataclasses.replace(agent, model_client=again_model)
    assert await resume(again, request(executor=CodeExecutor())) == first
    assert again_model.calls == []


async def test_resume_refuses_a_corrupt_log() -> None:
    store = VolatileRunStore()
    agent = definition(ScriptedModel(["code:a", "final:x"]), store=store)
    await run(agent, request(executor=CodeExecutor()))
    log = await store.read_log("run-1")
    corrupt = VolatileRunStore()
    await corrupt.write_run_started(log.started)  # type: ignore[arg-type]
    await corrupt.write_model_call_result(log.model_results[0])
    with pytest.raises(LogCorruptError, match="no model-call intent"):
        await resume(definition(ScriptedModel([]), store=corrupt), request(executor=CodeExecutor()))


# --------------------------------------------------------------------------- snapshot & drift


class _BadParameters:
    """Delegates everything to a seam but reports a non-string parameter value."""

    def __init__(self, seam: object) -> None:
        self._seam = seam

    def __getattr__(self, name: str) -> object:
        return getattr(self._seam, name)

    def parameters(self) -> dict[str, object]:
        return {"version": 2}


@pytest.mark.parametrize("seam", ["model_client", "decision_parser", "store", "event_sink"])
async def test_non_string_seam_parameters_are_refused_before_any_model_call(seam: str) -> None:
    model = ScriptedModel(["final:a"])
    store = VolatileRunStore()
    agent = definition(model, store=store)
    agent = dataclasses.replace(agent, **{seam: _BadParameters(getattr(agent, seam))})
    with pytest.raises(PolyloopTypeError, match=rf"{seam}\.parameters\(\)"):
        await run(agent, request(executor=CodeExecutor()))
    assert model.calls == []
    assert (await store.read_log("run-1")).is_empty


async def test_non_string_executor_parameters_are_refused() -> None:
    executor = CodeExecutor()
    executor.parameters = lambda: {1: "x"}  # type: ignore[method-assign,dict-item,return-value]
    with pytest.raises(PolyloopTypeError, match=r"action_executor\.parameters\(\)"):
        await run(definition(ScriptedModel(["final:a"])), request(executor=executor))


def test_snapshot_has_the_documented_key_shapes() -> None:
    tally = Tally()
    req = tool_request(
        tally,
        injections={
            "skill": (Injection(entry_id="s1", content="x"), Injection(entry_id="s2", content="y")),
            "empty": (),
        },
        model_binding={"task": "t3", "gateway.user": "u1"},
        fingerprints={"prompt_template": "sha256:abc"},
    )
    snapshot = req.parameter_snapshot()
    assert snapshot["request.max_steps"] == "10"
    assert snapshot["request.max_actions"] == "10"
    assert snapshot["request.max_consecutive_parse_failures"] == "3"
    assert snapshot["request.max_prompt_chars"] == "100000"
    assert snapshot["request.model_replay_policy"] == "never"
    assert snapshot["request.observation_template"] == "Observation: {observation}"
    assert snapshot["request.cancel_grace_seconds"] == "5.0"
    assert snapshot["request.tools"] == "echo,write,finish,boom,broken,slow"
    assert snapshot["request.injected_entry_ids.skill"] == "s1,s2"
    assert snapshot["request.injected_entry_ids.empty"] == ""
    assert snapshot["request.binding.task"] == "t3"
    assert snapshot["request.binding.gateway.user"] == "u1"
    assert snapshot["request.fingerprint.prompt_template"] == "sha256:abc"
    assert any(key.startswith("action_executor.") for key in snapshot)
    assert all(isinstance(v, str) for v in snapshot.values())
    agent_snapshot = definition(ScriptedModel([])).parameter_snapshot()
    assert agent_snapshot["model_client.model"] == "scripted-v1"
    assert agent_snapshot["decision_parser.kind"] == "tiny"
    assert agent_snapshot["store.kind"] == "volatile"
    assert agent_snapshot["event_sink.kind"] == "recording"
    assert agent_snapshot["synthetic_observations.env_failed"] == TEXTS.env_failed


def test_empty_fingerprints_and_undeclared_channels_add_no_keys() -> None:
    snapshot = request(executor=CodeExecutor()).parameter_snapshot()
    assert not any(key.startswith("request.fingerprint.") for key in snapshot)
    assert not any(key.startswith("request.injected_entry_ids.") for key in snapshot)


async def _crashed_run(agent: AgentDefinition, req: RunRequest) -> None:
    """Run until the executor raises, leaving a resumable log."""
    with pytest.raises(OSError, match="executor bug"):
        await run(agent, req)


DRIFTS = {
    "request.max_steps": lambda a, r: (
        a,
        dataclasses.replace(r, budget=dataclasses.replace(r.budget, max_steps=11)),
    ),
    "request.max_actions": lambda a, r: (
        a,
        dataclasses.replace(r, budget=dataclasses.replace(r.budget, max_actions=11)),
    ),
    "request.max_prompt_chars": lambda a, r: (
        a,
        dataclasses.replace(r, budget=dataclasses.replace(r.budget, max_prompt_chars=7)),
    ),
    "request.model_replay_policy": lambda a, r: (
        a,
        dataclasses.replace(r, model_replay_policy=ReplayPolicy.SAFE),
    ),
    "request.observation_template": lambda a, r: (
        a,
        dataclasses.replace(r, observation_template="{observation}!"),
    ),
    "request.cancel_grace_seconds": lambda a, r: (
        a,
        dataclasses.replace(r, cancel_grace_seconds=1),
    ),
    "request.binding.task": lambda a, r: (a, dataclasses.replace(r, model_binding={"task": "t9"})),
    "request.fingerprint.template": lambda a, r: (
        a,
        dataclasses.replace(r, fingerprints={"template": "sha256:2"}),
    ),
    "request.injected_entry_ids.skill": lambda a, r: (
        a,
        dataclasses.replace(r, injections={"skill": (Injection(entry_id="s9", content=""),)}),
    ),
    "request.max_consecutive_parse_failures": lambda a, r: (
        a,
        dataclasses.replace(
            r, budget=dataclasses.replace(r.budget, max_consecutive_parse_failures=9)
        ),
    ),
    "request.tools": lambda a, r: (
        a,
        dataclasses.replace(
            r, tools=ToolRegistry([ToolSpec(name="extra", description="d", parameters={})])
        ),
    ),
    "decision_parser.kind": lambda a, r: (
        dataclasses.replace(a, decision_parser=_OtherParser()),
        r,
    ),
    "store.kind": lambda a, r: (dataclasses.replace(a, store=_RelabelledStore(a.store)), r),
    "model_client.model": lambda a, r: (
        dataclasses.replace(a, model_client=ScriptedModel(["code:crash"], identity="other")),
        r,
    ),
    "synthetic_observations.action_rejected": lambda a, r: (
        dataclasses.replace(
            a, synthetic_observations=dataclasses.replace(TEXTS, action_rejected="[no]")
        ),
        r,
    ),
    "event_sink.kind": lambda a, r: (dataclasses.replace(a, event_sink=_OtherSink()), r),
    "action_executor.kind": lambda a, r: (
        a,
        dataclasses.replace(r, action_executor=_OtherExecutor()),
    ),
}


class _OtherParser(TinyParser):
    def parameters(self) -> dict[str, str]:
        return {"kind": "other-parser"}


class _RelabelledStore:
    """The same log under a store that reports different parameters."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def parameters(self) -> dict[str, str]:
        return {"kind": "relabelled"}


class _OtherSink(RecordingSink):
    def parameters(self) -> dict[str, str]:
        return {"kind": "other"}


class _OtherExecutor(CodeExecutor):
    def parameters(self) -> dict[str, str]:
        return {"kind": "other-code"}


@pytest.mark.parametrize("key", sorted(DRIFTS))
async def test_resume_refuses_every_kind_of_drift_and_names_the_key(key: str) -> None:
    agent = definition(ScriptedModel(["code:crash"]))
    req = request(
        executor=CodeExecutor(),
        model_binding={"task": "t1"},
        fingerprints={"template": "sha256:1"},
        injections={"skill": (Injection(entry_id="s1", content=""),)},
    )
    await _crashed_run(agent, req)
    drifted_agent, drifted_req = DRIFTS[key](agent, req)
    with pytest.raises(ParameterDriftError, match=key.replace(".", r"\.")) as caught:
        await resume(drifted_agent, drifted_req)
    assert key in caught.value.changed


async def test_drift_lists_added_and_removed_keys() -> None:
    agent = definition(ScriptedModel(["code:crash"]))
    req = request(executor=CodeExecutor(), fingerprints={"old": "1"})
    await _crashed_run(agent, req)
    with pytest.raises(ParameterDriftError) as caught:
        await resume(agent, dataclasses.replace(req, fingerprints={"new": "1"}))
    assert caught.value.added == ("request.fingerprint.new",)
    assert caught.value.removed == ("request.fingerprint.old",)
    assert "request.fingerprint.old" in str(caught.value)
    assert (await agent.store.read_log("run-1")).finished is None, "drift writes nothing"


# --------------------------------------------------------------------------- request checks


def test_request_refuses_an_executor_from_another_registry() -> None:
    tally = Tally()
    tools = make_tools(tally)
    with pytest.raises(ValueError, match="different registry"):
        request(tools=tools, executor=tools.restrict_to(["echo"]).executor())


def test_request_freezes_its_mappings() -> None:
    binding = {"task": "t1"}
    req = request(executor=CodeExecutor(), model_binding=binding)
    binding["task"] = "t2"
    assert req.model_binding == {"task": "t1"}
    with pytest.raises(TypeError):
        req.model_binding["task"] = "t3"  # type: ignore[index]
    assert dataclasses.replace(req, run_id="run-2").model_binding == {"task": "t1"}


@pytest.mark.parametrize(
    ("field", "value", "error", "words"),
    [
        ("model_binding", {"task": 3}, PolyloopTypeError, "RunRequest.model_binding"),
        ("fingerprints", {1: "x"}, PolyloopTypeError, "RunRequest.fingerprints"),
        ("cancel_grace_seconds", -1.0, ValueError, "cancel_grace_seconds"),
        ("cancel_grace_seconds", float("nan"), ValueError, "cancel_grace_seconds"),
        ("observation_template", "no placeholder", ValueError, "observation"),
        ("run_id", "", ValueError, "run_id"),
        ("injections", {"skill": ("raw text",)}, PolyloopTypeError, "Injection"),
    ],
)
def test_request_construction_errors_name_the_field(
    field: str, value: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        request(executor=CodeExecutor(), **{field: value})


def test_request_defaults_suit_a_code_agent() -> None:
    req = RunRequest(
        run_id="r",
        budget=BUDGET,
        action_executor=CodeExecutor(),
        context=request(executor=CodeExecutor()).context,
        model_replay_policy=ReplayPolicy.NEVER,
    )
    assert req.tools == ToolRegistry()
    assert req.parameter_snapshot()["request.tools"] == ""


# --------------------------------------------------------------------------- prompts


async def test_each_prompt_extends_the_previous_one_and_history_is_verbatim() -> None:
    model = ScriptedModel(["code:a", "?", "code:b", "final:z"])
    req = request(
        executor=CodeExecutor(), injections={"skill": (Injection(entry_id="s1", content="SKILL"),)}
    )
    await run(definition(model), req)
    prompts = [texts_of(c.messages) for c in model.calls]
    for earlier, later in itertools.pairwise(prompts):
        assert later[: len(earlier)] == earlier
        assert len(later) == len(earlier) + 2
    assert prompts[0] == [
        ("user", "You are a test agent."),
        ("user", "SKILL"),
        ("user", "Do the task."),
    ]
    assert prompts[2][3:] == [
        ("assistant", "code:a"),
        ("user", "Observation: ran a"),
        ("assistant", "?"),
        ("user", "Observation: say tool:, code: or final:"),
    ]
    assert all(role != "system" for prompt in prompts for role, _ in prompt)


async def test_model_calls_carry_the_binding_and_the_pre_allocated_result_id() -> None:
    model = ScriptedModel(["code:a", "final:z"])
    agent = definition(model)
    await run(agent, request(executor=CodeExecutor(), model_binding={"task": "t1"}))
    assert [dict(c.binding) for c in model.calls] == [{"task": "t1"}] * 2
    log = await agent.store.read_log("run-1")
    assert [c.result_id for c in model.calls] == [r.result_id for r in log.model_results]
    assert [c.call_index for c in model.calls] == [0, 1]


# --------------------------------------------------------------------------- cancellation


async def _cancel_when(started: asyncio.Event, coro: object) -> asyncio.Task[object]:
    task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    return task  # type: ignore[no-any-return]


async def test_cancel_during_the_model_call_writes_one_cancelled_finish_and_re_raises() -> None:
    model = ScriptedModel(["code:a", "code:b"], gate=asyncio.Event())
    model.gate.set()
    agent = definition(model)
    executor = CodeExecutor()
    req = request(executor=executor)
    # Let step 0 pass, then hold step 1's model call.
    hold = asyncio.Event()

    async def held_call(call):  # type: ignore[no-untyped-def]
        if call.call_index == 1:
            hold.set()
            await asyncio.Event().wait()
        return await ScriptedModel.call(model, call)

    model.call = held_call  # type: ignore[method-assign]
    task = await _cancel_when(hold, run(agent, req))
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await agent.store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.CANCELLED
    assert len(log.finished.result.steps) == 1
    assert executor.executed == ["a"]
    # Resuming a cancelled run hands back the marker: it is not silently continued.
    assert (await resume(agent, req)).stop_reason is StopReason.CANCELLED


async def test_cancel_during_the_action_writes_one_cancelled_finish_and_re_raises() -> None:
    tally = Tally(gate=asyncio.Event())
    store = HookedStore()
    agent = definition(ScriptedModel(["tool:slow"]), store=store)
    task = await _cancel_when(tally.started, run(agent, tool_request(tally)))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(store.finishes) == 1
    log = await store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.CANCELLED
    assert intent_kinds(log) == [IntentKind.MODEL_CALL, IntentKind.ACTION]


async def test_cancelled_marker_write_is_bounded_by_the_grace_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = HookedStore()

    async def never_finishes(record):  # type: ignore[no-untyped-def]
        await asyncio.Event().wait()

    store.finish_hook = never_finishes
    model = ScriptedModel(["code:a"], gate=asyncio.Event())
    agent = definition(model, store=store)
    task = await _cancel_when(
        model.started, run(agent, request(executor=CodeExecutor(), cancel_grace_seconds=0.05))
    )
    with (
        caplog.at_level(logging.ERROR, logger="polyloop.session"),
        pytest.raises(asyncio.CancelledError),
    ):
        await asyncio.wait_for(task, 5)
    assert "not durable within" in caplog.text


# --------------------------------------------------------------------------- concurrency


async def test_a_thousand_concurrent_runs_on_one_store_do_not_cross_talk() -> None:
    store = VolatileRunStore()
    model = ScriptedModel(["code:a", "code:b", "final:done"])
    agent = definition(model, store=store)
    executor = CodeExecutor()
    results = await asyncio.gather(
        *(
            run(agent, request(f"run-{i}", executor=executor, model_binding={"task": str(i)}))
            for i in range(1000)
        )
    )
    assert [r.run_id for r in results] == [f"run-{i}" for i in range(1000)]
    assert all(r.stop_reason is StopReason.FINAL_ANSWER for r in results)
    assert all(len(r.steps) == 3 for r in results)
    for i in (0, 499, 999):
        log = await store.read_log(f"run-{i}")
        assert log.started is not None
        assert log.started.parameter_snapshot["request.binding.task"] == str(i)
        assert {i.run_id for i in log.intents} == {f"run-{i}"}
        assert len(log.intents) == 5
    assert all(dict(c.binding) == {"task": c.run_id.split("-")[1]} for c in model.calls)


def test_synthetic_texts_are_required() -> None:
    with pytest.raises(TypeError):
        AgentDefinition(
            model_client=ScriptedModel([]),
            decision_parser=TinyParser(),
            store=VolatileRunStore(),
            event_sink=RecordingSink(),
            synthetic_observations="oops",  # type: ignore[arg-type]
        )
    assert isinstance(TEXTS, SyntheticObservations)
    assert isinstance(BUDGET, Budget)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (ToolValidationError("verdict must be pass or fail", tool="submit"), None),
        (ValueError("storage rejected the finding"), StopReason.TASK_COMPLETED),
    ],
)
async def test_a_completing_tool_completes_only_when_it_was_executed(
    raised: Exception, expected: StopReason | None
) -> None:
    """Design 0016: refusing arguments (ToolValidationError) is NOT_EXECUTED and does not
    complete; any other failure is an EXECUTED action and, for completes_run, ends the run."""

    async def submit(arguments: object) -> str:
        raise raised

    tools = ToolRegistry(
        [
            ToolSpec(
                name="submit", description="d", parameters={}, handler=submit, completes_run=True
            )
        ]
    )
    result = await run(
        definition(ScriptedModel(["tool:submit", "final:gave up"])), request(tools=tools)
    )
    if expected is None:
        assert result.steps[0].action_status is ActionStatus.NOT_EXECUTED
        assert result.stop_reason is StopReason.FINAL_ANSWER
    else:
        assert result.steps[0].action_status is ActionStatus.EXECUTED
        assert result.stop_reason is expected


# --------------------------------------------------------------------------- review findings


class Crash(BaseException):
    """Stands in for the process dying: not an Exception, so nothing in the library catches it."""


async def test_a_redone_model_call_reuses_its_intent_so_a_second_crash_stays_resumable() -> None:
    store = VolatileRunStore()
    attempts: list[int] = []

    class CrashingModel(ScriptedModel):
        async def call(self, call):  # type: ignore[no-untyped-def]
            attempts.append(call.call_index)
            if call.call_index == 1 and attempts.count(1) <= 2:
                raise Crash
            return await super().call(call)

    agent = definition(CrashingModel(["code:a", "final:done"]), store=store)
    req = request(executor=CodeExecutor(), model_policy=ReplayPolicy.SAFE)
    with pytest.raises(Crash):
        await run(agent, req)
    with pytest.raises(Crash):
        await resume(agent, req)  # REDO_MODEL_CALL, and the process dies again
    result = await resume(agent, req)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    log = await store.read_log("run-1")
    ids = [i.result_id for i in log.intents]
    assert ids == ["m0", "a0", "m1"], "a redo must not write a second intent"


async def test_a_failing_cancel_marker_write_does_not_replace_the_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = HookedStore()

    async def disk_full(record: object) -> None:
        raise OSError("disk full")

    store.finish_hook = disk_full
    model = ScriptedModel(["code:a"], gate=asyncio.Event())
    task = await _cancel_when(
        model.started, run(definition(model, store=store), request(executor=CodeExecutor()))
    )
    with (
        caplog.at_level(logging.ERROR, logger="polyloop.session"),
        pytest.raises(asyncio.CancelledError),
    ):
        await task
    assert "failed after the cancellation" in caplog.text
    assert "disk full" in caplog.text


class SlowStartStore(HookedStore):
    """Writes RunStarted, then keeps the caller waiting (a slow fsync)."""

    def __init__(self) -> None:
        super().__init__()
        self.start_written = asyncio.Event()

    async def write_run_started(self, record: object) -> None:
        await self.inner.write_run_started(record)  # type: ignore[arg-type]
        self.start_written.set()
        await asyncio.sleep(0.05)


async def test_cancel_during_the_start_write_still_marks_the_run_cancelled() -> None:
    store = SlowStartStore()
    model = ScriptedModel(["code:a"])
    agent = definition(model, store=store)
    task = await _cancel_when(store.start_written, run(agent, request(executor=CodeExecutor())))
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await store.read_log("run-1")
    assert log.started is not None
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.CANCELLED
    assert model.calls == []


async def test_cancel_during_event_emission_propagates_and_marks_the_run() -> None:
    class HangingSink(RecordingSink):
        def __init__(self) -> None:
            super().__init__()
            self.entered = asyncio.Event()

        async def emit(self, event):  # type: ignore[no-untyped-def]
            self.events.append(event)
            self.entered.set()
            await asyncio.Event().wait()

    sink = HangingSink()
    agent = definition(ScriptedModel(["code:a", "code:b"]), sink=sink)
    task = await _cancel_when(sink.entered, run(agent, request(executor=CodeExecutor())))
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await agent.store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.CANCELLED
    assert len(log.finished.result.steps) == 1


async def test_cancel_during_the_normal_finish_write_leaves_exactly_one_finish() -> None:
    store = HookedStore()
    in_finish = asyncio.Event()

    async def slow_finish(record: object) -> None:
        in_finish.set()
        await asyncio.sleep(0.05)

    store.finish_hook = slow_finish
    agent = definition(ScriptedModel(["final:done"]), store=store)
    task = await _cancel_when(in_finish, run(agent, request(executor=CodeExecutor())))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(store.finishes) == 1
    log = await store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.FINAL_ANSWER


class BadParser(TinyParser):
    def __init__(self, produce: object) -> None:
        self._produce = produce

    def parse(self, reply):  # type: ignore[no-untyped-def]
        return self._produce()


@pytest.mark.parametrize(
    ("produce", "words"),
    [
        (lambda: None, r"BadParser\.parse returned NoneType"),
        (lambda: ParsedReply(history_text="x", decision=Action(text=None)), "Action.text"),  # type: ignore[arg-type]
        (lambda: ParsedReply(history_text=None, decision=FinalAnswer(text="a")), "history_text"),  # type: ignore[arg-type]
        (lambda: ParsedReply(history_text="x", decision="act"), "ParsedReply.decision"),  # type: ignore[arg-type]
    ],
)
async def test_a_parser_that_breaks_its_contract_stops_the_run_before_any_action(
    produce: object, words: str
) -> None:
    # Design 0161: the breach is contained (a step naming it, then PARSER_ERROR), not raised.
    executor = CodeExecutor()
    agent = dataclasses.replace(
        definition(ScriptedModel(["code:a"])), decision_parser=BadParser(produce)
    )
    result = await run(agent, request(executor=executor))
    assert result.stop_reason is StopReason.PARSER_ERROR
    assert executor.executed == []
    (step,) = result.steps
    assert step.parse_ok is False
    assert step.parse_error is not None
    assert re.search(words, step.parse_error)
    log = await agent.store.read_log("run-1")
    assert intent_kinds(log) == [IntentKind.MODEL_CALL]
    assert log.finished is not None
    assert log.finished.result == result


async def test_drift_lists_every_changed_key_not_only_the_first() -> None:
    agent = definition(ScriptedModel(["code:crash"]))
    req = request(executor=CodeExecutor())
    await _crashed_run(agent, req)
    drifted = dataclasses.replace(
        req, budget=dataclasses.replace(req.budget, max_steps=99, max_actions=98)
    )
    with pytest.raises(ParameterDriftError) as caught:
        await resume(agent, drifted)
    assert set(caught.value.changed) == {"request.max_steps", "request.max_actions"}
    assert "request.max_steps" in str(caught.value)
    assert "request.max_actions" in str(caught.value)


async def test_a_finished_run_is_returned_even_when_the_settings_drifted() -> None:
    agent = definition(ScriptedModel(["final:done"]))
    req = request(executor=CodeExecutor())
    first = await run(agent, req)
    drifted = dataclasses.replace(req, budget=dataclasses.replace(req.budget, max_steps=2))
    with pytest.warns(FinishedRunDriftWarning, match=r"request\.max_steps"):  # design 0217
        assert await resume(agent, drifted) == first
