"""``polyloop.testing.RecordFactory``: its products are legal records.

Legal means: constructible (the types' own validation accepted them) and exactly
round-trippable through ``polyloop.serialization``, the only way into a log. A factory
product that a store could not persist would make a contract test fail for the factory's
fault, and a downstream would blame its own store.

What these tests cannot show is that the contract tests only call factory methods that
exist; only executing every contract test does that (``tests/contract/test_suite_coverage.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from polyloop.ports import Action, EventKind, ModelCall, ToolCall
from polyloop.serialization import (
    decode_intent,
    decode_model_call_result,
    decode_run_finished,
    decode_run_result,
    decode_run_started,
    decode_step_completed,
    decode_step_record,
    encode,
)
from polyloop.testing import RecordFactory
from polyloop.types import (
    ActionStatus,
    IntentKind,
    ReplayPolicy,
    Role,
    RunFinished,
    StopReason,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def records() -> RecordFactory:
    return RecordFactory()


# --------------------------------------------------------------------------- round trips


def test_run_started_round_trips(records: RecordFactory) -> None:
    started = records.run_started(run_id="r1", parameter_snapshot={"model": "m-1"})
    assert decode_run_started(encode(started)) == started


def test_model_call_intent_round_trips(records: RecordFactory) -> None:
    intent = records.model_call_intent(run_id="r1", call_index=2, result_id="m2")
    assert decode_intent(encode(intent)) == intent
    assert intent.kind is IntentKind.MODEL_CALL


def test_action_intent_round_trips_with_a_non_default_replay_policy(
    records: RecordFactory,
) -> None:
    # A replay policy lost on the way would silently turn a safe replay into a stop, or worse.
    intent = records.action_intent(
        run_id="r1", call_index=0, result_id="a0", replay_policy=ReplayPolicy.SAFE
    )
    decoded = decode_intent(encode(intent))
    assert decoded == intent
    assert decoded.replay_policy is ReplayPolicy.SAFE
    assert decoded.kind is IntentKind.ACTION


def test_intents_default_to_the_conservative_replay_policy(records: RecordFactory) -> None:
    assert (
        records.action_intent(run_id="r1", call_index=0, result_id="a0").replay_policy
        is ReplayPolicy.NEVER
    )
    assert (
        records.model_call_intent(run_id="r1", call_index=0, result_id="m0").replay_policy
        is ReplayPolicy.NEVER
    )


def test_successful_model_call_result_round_trips(records: RecordFactory) -> None:
    result = records.model_call_result(run_id="r1", result_id="m0", reply=records.reply())
    assert decode_model_call_result(encode(result)) == result


def test_failed_model_call_result_round_trips(records: RecordFactory) -> None:
    result = records.model_call_result(
        run_id="r1", result_id="m0", failure="TimeoutError: connection timed out"
    )
    decoded = decode_model_call_result(encode(result))
    assert decoded == result
    assert decoded.reply is None
    assert decoded.failure == "TimeoutError: connection timed out"


def test_a_model_call_result_without_reply_or_failure_is_a_success(
    records: RecordFactory,
) -> None:
    result = records.model_call_result(run_id="r1", result_id="m0")
    assert result.reply == records.reply()
    assert result.failure is None


def test_step_record_round_trips(records: RecordFactory) -> None:
    step = records.step(step_idx=3)
    assert decode_step_record(encode(step)) == step
    assert step.step_idx == 3


def test_unparsed_step_record_round_trips(records: RecordFactory) -> None:
    step = records.step(parse_ok=False)
    decoded = decode_step_record(encode(step))
    assert decoded == step
    assert decoded.action is None
    assert decoded.action_status is None
    assert decoded.parse_error is not None


def test_step_completed_round_trips(records: RecordFactory) -> None:
    completed = records.step_completed(
        run_id="r1", result_id="a0", action_outcome=records.outcome(), step=records.step()
    )
    assert decode_step_completed(encode(completed)) == completed


def test_step_completed_without_an_action_round_trips(records: RecordFactory) -> None:
    completed = records.step_completed(
        run_id="r1", result_id=None, action_outcome=None, step=records.step(parse_ok=False)
    )
    decoded = decode_step_completed(encode(completed))
    assert decoded == completed
    assert decoded.result_id is None
    assert decoded.action_outcome is None


def test_outcome_carries_a_non_default_status(records: RecordFactory) -> None:
    outcome = records.outcome(status=ActionStatus.ENV_ERROR)
    completed = records.step_completed(
        run_id="r1", result_id="a0", action_outcome=outcome, step=records.step()
    )
    decoded = decode_step_completed(encode(completed))
    assert decoded.action_outcome is not None
    assert decoded.action_outcome.status is ActionStatus.ENV_ERROR


def test_outcome_defaults_to_executed(records: RecordFactory) -> None:
    assert records.outcome().status is ActionStatus.EXECUTED


def test_run_result_round_trips(records: RecordFactory) -> None:
    result = records.result(run_id="r1", stop_reason=StopReason.STEP_BUDGET)
    assert decode_run_result(encode(result)) == result


def test_a_final_answer_result_round_trips(records: RecordFactory) -> None:
    result = records.result(
        run_id="r1",
        stop_reason=StopReason.FINAL_ANSWER,
        final_answer="42",
        steps=[records.step(step_idx=0), records.step(step_idx=1, parse_ok=False)],
    )
    assert decode_run_result(encode(result)) == result


def test_run_finished_round_trips(records: RecordFactory) -> None:
    finished = records.run_finished(run_id="r1", result=records.result(run_id="r1"))
    assert decode_run_finished(encode(finished)) == finished


def test_run_finished_defaults_to_a_result_of_the_same_run(records: RecordFactory) -> None:
    finished = records.run_finished(run_id="r7")
    assert isinstance(finished, RunFinished)
    assert finished.result.run_id == "r7"


# --------------------------------------------------------------------------- run ids


@pytest.mark.parametrize(
    "build",
    [
        lambda r: r.model_call_intent(call_index=0, result_id="m0"),
        lambda r: r.action_intent(call_index=0, result_id="a0"),
        lambda r: r.model_call_result(result_id="m0"),
        lambda r: r.step_completed(
            result_id=None, action_outcome=None, step=r.step(parse_ok=False)
        ),
        lambda r: r.run_started(parameter_snapshot={}),
        lambda r: r.run_finished(),
        lambda r: r.result(),
    ],
    ids=[
        "model_call_intent",
        "action_intent",
        "model_call_result",
        "step_completed",
        "run_started",
        "run_finished",
        "result",
    ],
)
def test_log_record_methods_have_no_default_run_id(
    records: RecordFactory, build: Callable[[RecordFactory], object]
) -> None:
    # A default run id would let "two runs do not leak" degrade into "one run written twice".
    with pytest.raises(TypeError, match="run_id"):
        build(records)


# --------------------------------------------------------------------------- call shells


def test_model_call_defaults_to_one_user_message(records: RecordFactory) -> None:
    call = records.model_call(call_index=0, result_id="m0")
    assert isinstance(call, ModelCall)
    assert len(call.messages) == 1
    assert call.messages[0].role is Role.USER
    assert call.messages[0].content[0].text != ""
    assert call.run_id == "r1"
    assert dict(call.binding) == {}


def test_model_call_accepts_an_explicitly_empty_prompt(records: RecordFactory) -> None:
    # Implementers build failing calls this way; None means "the default", () means "none".
    assert records.model_call(call_index=0, result_id="m0", messages=()).messages == ()


def test_model_call_copies_the_binding(records: RecordFactory) -> None:
    binding = {"task": "t1"}
    call = records.model_call(call_index=0, result_id="m0", binding=binding)
    binding["task"] = "changed"
    assert dict(call.binding) == {"task": "t1"}


def test_reply_defaults(records: RecordFactory) -> None:
    reply = records.reply()
    assert reply.call_id == "call-1"
    assert reply.content == "hi"
    assert reply.thinking == ""
    assert records.reply(call_id=None).call_id is None


def test_action_without_a_tool_name_is_code_style(records: RecordFactory) -> None:
    action = records.action(text="print(1)")
    assert action == Action(text="print(1)", tool_call=None)


def test_action_with_a_tool_name_carries_a_tool_call(records: RecordFactory) -> None:
    action = records.action(text="echo", tool_name="echo", arguments={"n": 1})
    assert isinstance(action.tool_call, ToolCall)
    assert action.tool_call.name == "echo"
    assert dict(action.tool_call.arguments) == {"n": 1}


def test_arguments_without_a_tool_name_are_refused(records: RecordFactory) -> None:
    with pytest.raises(ValueError, match="tool_name"):
        records.action(arguments={"n": 1})


def test_event_carries_a_step_with_the_given_index(records: RecordFactory) -> None:
    event = records.event(step_idx=2)
    assert event.kind is EventKind.STEP_FINISHED
    assert event.step.step_idx == 2
    assert event.run_id == "r1"


def test_action_status_exposes_the_enum(records: RecordFactory) -> None:
    assert records.action_status.EXECUTED is ActionStatus.EXECUTED
