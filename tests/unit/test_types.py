"""Construction-time rules of the public types and shells."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from polyloop import adapters, ports, session, tools, types
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Injection,
    Intent,
    IntentKind,
    Message,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    Role,
    RunFinished,
    RunResult,
    RunStarted,
    StepCompleted,
    StepRecord,
    StopReason,
    SyntheticObservations,
    TextBlock,
)

pytestmark = pytest.mark.unit


def step(**overrides: Any) -> StepRecord:
    fields: dict[str, Any] = {
        "step_idx": 0,
        "raw_output": "out",
        "content_chars": 3,
        "thinking_chars": 0,
        "action": "noop()",
        "parse_ok": True,
        "parse_error": None,
        "observation": "ok",
        "observation_is_synthetic": False,
        "observation_truncated_chars": 0,
        "prompt_chars": 10,
        "call_id": "c1",
        "step_wall_ms": 1,
        "action_status": ActionStatus.EXECUTED,
    }
    fields.update(overrides)
    return StepRecord(**fields)


def outcome(**overrides: Any) -> ActionOutcome:
    fields: dict[str, Any] = {
        "status": ActionStatus.EXECUTED,
        "observation": "ok",
        "observation_is_synthetic": False,
        "env_reported_completion": False,
        "observation_truncated_chars": 0,
    }
    fields.update(overrides)
    return ActionOutcome(**fields)


def _public_dataclasses(*modules: object) -> list[type]:
    found = []
    for module in modules:
        for name in module.__all__:  # type: ignore[attr-defined]
            value = getattr(module, name)
            if isinstance(value, type) and dataclasses.is_dataclass(value):
                found.append(value)
    return found


PUBLIC_DATACLASSES = _public_dataclasses(types, ports, tools, session, adapters)


@pytest.mark.parametrize("cls", PUBLIC_DATACLASSES, ids=lambda c: c.__name__)
def test_public_dataclasses_are_frozen_slotted_and_keyword_only(cls: type) -> None:
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen
    assert "__slots__" in cls.__dict__
    assert all(f.kw_only for f in dataclasses.fields(cls))


def test_stop_reason_has_every_reason_the_spec_needs() -> None:
    assert {r.value for r in StopReason} == {
        "task_completed",
        "final_answer",
        "step_budget",
        "action_budget",
        "parse_failures",
        "prompt_too_large",
        "llm_error",
        "env_error",
        "cancelled",
        "resume_state_unknown",
        # design 0201: the token budgets and the endpoint's context-length refusal
        "token_budget",
        "prompt_token_limit",
        "context_length_exceeded",
        "parser_error",
        "action_timeout",
        # design 0210: a call that waits for a person's approval (the run is left open)
        "awaiting_approval",
        # design 0236: the cost budget
        "cost_budget",
        # design 0227: an action still in doubt after its attempts (the run is left open)
        "retries_exhausted",
        # design 0245: a child-run call past max_depth/max_children (the run finished)
        "tree_limit",
    }


def test_enum_values_are_stable_strings() -> None:
    assert [r.value for r in Role] == ["system", "user", "assistant", "tool"]
    assert [p.value for p in ReplayPolicy] == ["safe", "idempotent", "never"]
    assert [s.value for s in ActionStatus] == ["executed", "not_executed", "env_error"]
    assert [k.value for k in IntentKind] == ["model_call", "action"]
    assert [k.value for k in ports.EventKind] == ["step_finished"]


@pytest.mark.parametrize(
    "field", ["max_steps", "max_actions", "max_consecutive_parse_failures", "max_prompt_chars"]
)
@pytest.mark.parametrize("bad", [0, -1])
def test_budget_limits_must_be_positive(field: str, bad: int) -> None:
    values = dict(max_steps=1, max_actions=1, max_consecutive_parse_failures=1, max_prompt_chars=1)
    values[field] = bad
    with pytest.raises(ValueError, match=f"Budget.{field}"):
        Budget(**values)


def test_budget_refuses_bools_and_floats() -> None:
    with pytest.raises(TypeError, match="Budget.max_steps"):
        Budget(max_steps=True, max_actions=1, max_consecutive_parse_failures=1, max_prompt_chars=1)
    with pytest.raises(TypeError, match="Budget.max_actions"):
        Budget(max_steps=1, max_actions=2.0, max_consecutive_parse_failures=1, max_prompt_chars=1)  # type: ignore[arg-type]


def test_model_reply_call_id_is_none_or_non_empty() -> None:
    assert ModelReply(call_id=None, content="").call_id is None
    with pytest.raises(ValueError, match="call_id"):
        ModelReply(call_id="", content="x")


def test_message_content_is_a_tuple_of_blocks() -> None:
    message = Message(role=Role.USER, content=[TextBlock(text="a")])  # type: ignore[arg-type]
    assert message.content == (TextBlock(text="a"),)
    with pytest.raises(TypeError, match=r"Message.content\[0\]"):
        Message(role=Role.USER, content=("bare string",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Message.content"):
        Message(role=Role.USER, content="bare string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Message.role"):
        Message(role="user", content=())  # type: ignore[arg-type]


def test_context_defaults_to_empty_segments() -> None:
    assert Context() == Context(run_level=(), goal_level=())


def test_injection_ids_must_not_contain_commas() -> None:
    with pytest.raises(ValueError, match="comma"):
        Injection(entry_id="a,b", content="x")
    with pytest.raises(ValueError, match="entry_id"):
        Injection(entry_id="", content="x")


def test_synthetic_observations_must_be_non_empty() -> None:
    with pytest.raises(ValueError, match="env_failed"):
        SyntheticObservations(action_rejected="r", env_failed="", model_call_failed="m")


def test_action_outcome_requires_plain_bools_and_non_negative_truncation() -> None:
    with pytest.raises(TypeError, match="env_reported_completion"):
        outcome(env_reported_completion=0)
    with pytest.raises(ValueError, match="observation_truncated_chars"):
        outcome(observation_truncated_chars=-1)


def test_step_record_action_columns_agree() -> None:
    assert step(action=None, action_status=None).action is None
    with pytest.raises(ValueError, match="action_status"):
        step(action=None)
    with pytest.raises(ValueError, match="action_status"):
        step(action_status=None)


def test_step_record_parse_error_is_set_exactly_when_parse_failed() -> None:
    assert step(parse_ok=False, parse_error="no fence", action=None, action_status=None)
    with pytest.raises(ValueError, match="parse_error"):
        step(parse_ok=False, parse_error=None)
    with pytest.raises(ValueError, match="parse_error"):
        step(parse_ok=True, parse_error="oops")


def test_run_started_snapshot_is_a_read_only_copy() -> None:
    snapshot = {"a": "1"}
    record = RunStarted(run_id="r", parameter_snapshot=snapshot)
    snapshot["a"] = "2"
    assert record.parameter_snapshot == {"a": "1"}
    with pytest.raises(TypeError):
        record.parameter_snapshot["a"] = "3"  # type: ignore[index]


def test_run_started_snapshot_values_must_be_strings() -> None:
    with pytest.raises(TypeError, match="parameter_snapshot"):
        RunStarted(run_id="r", parameter_snapshot={"a": 1})  # type: ignore[dict-item]


def test_intent_validates_its_fields() -> None:
    intent = Intent(
        run_id="r",
        kind=IntentKind.ACTION,
        call_index=0,
        result_id="a0",
        replay_policy=ReplayPolicy.SAFE,
    )
    assert intent.replay_policy is ReplayPolicy.SAFE
    with pytest.raises(ValueError, match="result_id"):
        dataclasses.replace(intent, result_id="")
    with pytest.raises(TypeError, match="replay_policy"):
        dataclasses.replace(intent, replay_policy="safe")


def test_model_call_result_has_exactly_one_of_reply_and_failure() -> None:
    reply = ModelReply(call_id="c", content="x")
    assert ModelCallResult(run_id="r", result_id="m0", reply=reply, failure=None)
    assert ModelCallResult(run_id="r", result_id="m0", reply=None, failure="Boom: x")
    with pytest.raises(ValueError, match="exactly one"):
        ModelCallResult(run_id="r", result_id="m0", reply=None, failure=None)
    with pytest.raises(ValueError, match="exactly one"):
        ModelCallResult(run_id="r", result_id="m0", reply=reply, failure="x")


def test_step_completed_result_id_is_none_iff_outcome_is_none() -> None:
    assert StepCompleted(run_id="r", result_id="a0", action_outcome=outcome(), step=step())
    no_action = step(action=None, action_status=None)
    assert StepCompleted(run_id="r", result_id=None, action_outcome=None, step=no_action)
    with pytest.raises(ValueError, match="if and only if"):
        StepCompleted(run_id="r", result_id="a0", action_outcome=None, step=no_action)
    with pytest.raises(ValueError, match="if and only if"):
        StepCompleted(run_id="r", result_id=None, action_outcome=outcome(), step=step())


def test_run_result_defaults_and_final_answer_rule() -> None:
    result = RunResult(
        run_id="r", stop_reason=StopReason.TASK_COMPLETED, final_answer="42", steps=()
    )
    assert result.event_delivery_failures == 0
    with pytest.raises(ValueError, match="final_answer"):
        RunResult(run_id="r", stop_reason=StopReason.FINAL_ANSWER, final_answer=None, steps=())
    with pytest.raises(ValueError, match="event_delivery_failures"):
        RunResult(
            run_id="r",
            stop_reason=StopReason.CANCELLED,
            final_answer=None,
            steps=(),
            event_delivery_failures=-1,
        )


def test_run_finished_run_id_matches_its_result() -> None:
    result = RunResult(run_id="r", stop_reason=StopReason.CANCELLED, final_answer=None, steps=())
    with pytest.raises(ValueError, match="differs"):
        RunFinished(run_id="other", result=result)


def test_model_call_binding_is_read_only() -> None:
    binding = {"task": "t1"}
    call = ports.ModelCall(messages=(), call_index=0, run_id="r", result_id="m0", binding=binding)
    binding["task"] = "t2"
    assert call.binding == {"task": "t1"}
    with pytest.raises(TypeError):
        call.binding["task"] = "t3"  # type: ignore[index]


def test_invalid_decision_and_final_answer_need_text() -> None:
    with pytest.raises(ValueError, match="explanation"):
        ports.InvalidDecision(explanation="")
    with pytest.raises(ValueError, match="FinalAnswer.text"):
        ports.FinalAnswer(text="")


def test_empty_run_log() -> None:
    assert ports.RunLog().is_empty
    started = RunStarted(run_id="r", parameter_snapshot={})
    assert not ports.RunLog(started=started).is_empty
