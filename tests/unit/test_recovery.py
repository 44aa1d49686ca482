"""plan_resume: every row of the four-state table, for model calls and for actions, plus the
structural rules that make a log corrupt."""

from __future__ import annotations

import dataclasses

import pytest

from polyloop._recovery import (
    ResumeAction,
    action_result_id,
    model_result_id,
    plan_resume,
)
from polyloop.ports import RunLog
from polyloop.testing import RecordFactory
from polyloop.types import (
    Intent,
    ModelCallResult,
    ReplayPolicy,
    StepCompleted,
    StopReason,
)

pytestmark = pytest.mark.unit

RUN = "r1"
SAFE, NEVER = ReplayPolicy.SAFE, ReplayPolicy.NEVER


RECORDS = RecordFactory()


def model_intent(idx: int, policy: ReplayPolicy = NEVER) -> Intent:
    return RECORDS.model_call_intent(
        run_id=RUN, call_index=idx, result_id=model_result_id(idx), replay_policy=policy
    )


def action_intent(idx: int, policy: ReplayPolicy = NEVER) -> Intent:
    return RECORDS.action_intent(
        run_id=RUN, call_index=idx, result_id=action_result_id(idx), replay_policy=policy
    )


def model_result(idx: int, *, failed: bool = False) -> ModelCallResult:
    if failed:
        return RECORDS.model_call_result(
            run_id=RUN, result_id=model_result_id(idx), failure="Boom: x"
        )
    reply = RECORDS.reply(call_id=f"c{idx}", content="go")
    return RECORDS.model_call_result(run_id=RUN, result_id=model_result_id(idx), reply=reply)


def completed(idx: int, *, with_action: bool = True) -> StepCompleted:
    """A step with an executed action, or (``with_action=False``) a parse failure."""
    return RECORDS.step_completed(
        run_id=RUN,
        result_id=action_result_id(idx) if with_action else None,
        action_outcome=RECORDS.outcome() if with_action else None,
        step=RECORDS.step(step_idx=idx, parse_ok=with_action),
    )


STARTED = RECORDS.run_started(run_id=RUN, parameter_snapshot={"k": "v"})


def two_clean_steps() -> RunLog:
    """Step 0 with an action, step 1 without one (say, a parse failure)."""
    return RunLog(
        started=STARTED,
        intents=(model_intent(0), action_intent(0), model_intent(1)),
        model_results=(model_result(0), model_result(1)),
        steps=(completed(0), completed(1, with_action=False)),
    )


def extend(log: RunLog, **extra: tuple[object, ...]) -> RunLog:
    changes = {name: getattr(log, name) + values for name, values in extra.items()}
    return dataclasses.replace(log, **changes)


def test_empty_log_is_fresh() -> None:
    assert plan_resume(RunLog(), RUN).action is ResumeAction.FRESH


def test_finished_run_is_handed_back() -> None:
    clean = two_clean_steps()
    result = RECORDS.result(
        run_id=RUN,
        stop_reason=StopReason.STEP_BUDGET,
        steps=tuple(completed.step for completed in clean.steps),
    )
    log = dataclasses.replace(clean, finished=RECORDS.run_finished(run_id=RUN, result=result))
    assert plan_resume(log, RUN).action is ResumeAction.ALREADY_FINISHED


def test_settled_log_continues_with_the_next_step() -> None:
    plan = plan_resume(two_clean_steps(), RUN)
    assert plan.action is ResumeAction.CONTINUE
    assert plan.next_step_idx == 2
    assert plan.last_model_result == model_result(1)


def test_only_run_started_continues_at_step_zero() -> None:
    plan = plan_resume(RunLog(started=STARTED), RUN)
    assert (plan.action, plan.next_step_idx, plan.last_model_result) == (
        ResumeAction.CONTINUE,
        0,
        None,
    )


# --- model call: intent x result


def test_model_intent_and_result_without_step_continues_after_the_call() -> None:
    log = extend(two_clean_steps(), intents=(model_intent(2),), model_results=(model_result(2),))
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.CONTINUE_AFTER_MODEL_CALL
    assert plan.pending_model_result == model_result(2)


def test_failed_model_call_without_step_continues_after_the_call() -> None:
    log = extend(
        two_clean_steps(), intents=(model_intent(2),), model_results=(model_result(2, failed=True),)
    )
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.CONTINUE_AFTER_MODEL_CALL
    assert plan.pending_model_result is not None
    assert plan.pending_model_result.reply is None


def test_dangling_safe_model_intent_redoes_the_call() -> None:
    log = extend(two_clean_steps(), intents=(model_intent(2, SAFE),))
    assert plan_resume(log, RUN).action is ResumeAction.REDO_MODEL_CALL


def test_dangling_never_model_intent_stops_unknown() -> None:
    log = extend(two_clean_steps(), intents=(model_intent(2, NEVER),))
    assert plan_resume(log, RUN).action is ResumeAction.STOP_UNKNOWN


def test_model_result_without_intent_is_corrupt() -> None:
    log = extend(two_clean_steps(), model_results=(model_result(2),))
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.CORRUPT
    assert "m2" in plan.detail


# --- action: intent x result


def test_dangling_safe_action_intent_replays_the_action() -> None:
    log = extend(
        two_clean_steps(),
        intents=(model_intent(2), action_intent(2, SAFE)),
        model_results=(model_result(2),),
    )
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.REPLAY_LAST_ACTION
    assert plan.pending_model_result == model_result(2)


def test_dangling_never_action_intent_stops_unknown() -> None:
    log = extend(
        two_clean_steps(),
        intents=(model_intent(2, SAFE), action_intent(2, NEVER)),
        model_results=(model_result(2),),
    )
    assert plan_resume(log, RUN).action is ResumeAction.STOP_UNKNOWN


def test_action_result_without_intent_is_corrupt() -> None:
    log = RunLog(
        started=STARTED,
        intents=(model_intent(0),),
        model_results=(model_result(0),),
        steps=(completed(0),),
    )
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.CORRUPT
    assert "no action intent" in plan.detail


# --- other structural corruption


@pytest.mark.parametrize(
    ("log", "words"),
    [
        (RunLog(intents=(model_intent(0),)), "RunStarted"),
        (
            RunLog(started=RECORDS.run_started(run_id="other", parameter_snapshot={})),
            "belongs to run 'other'",
        ),
        (
            dataclasses.replace(two_clean_steps(), steps=(completed(0), completed(0))),
            "step_idx",
        ),
        (extend(two_clean_steps(), intents=(model_intent(1),)), "two intents"),
        (extend(two_clean_steps(), intents=(model_intent(5),)), "step 5"),
        (
            extend(two_clean_steps(), intents=(action_intent(2),)),
            "action intent but no model call",
        ),
        (
            extend(two_clean_steps(), intents=(model_intent(2), action_intent(2))),
            "no model call result",
        ),
        (
            extend(
                two_clean_steps(),
                intents=(model_intent(2), action_intent(2)),
                model_results=(model_result(2, failed=True),),
            ),
            "failed but an action followed",
        ),
        (extend(two_clean_steps(), intents=(action_intent(1),)), "step record without one"),
        (
            RunLog(started=STARTED, steps=(completed(0, with_action=False),)),
            "no result",
        ),
        (
            extend(
                RunLog(started=STARTED),
                intents=(RECORDS.model_call_intent(run_id=RUN, call_index=0, result_id="x"),),
            ),
            "id scheme",
        ),
    ],
)
def test_structural_violations_are_corrupt(log: RunLog, words: str) -> None:
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.CORRUPT
    assert words in plan.detail


def test_result_ids_are_distinct_per_kind_and_step() -> None:
    ids = {model_result_id(i) for i in range(50)} | {action_result_id(i) for i in range(50)}
    assert len(ids) == 100
