"""check_log: an intent left unanswered before the finish needs a stop reason that explains it.

Only a cancellation (an execution interrupted in flight) and a resume that refused to guess
(``resume_state_unknown``, for a ``NEVER`` execution: a ``SAFE`` one is replayed instead) end
a run with an execution unanswered. The soak scoreboard had this rule on its own; it is now
part of the one structural check that resume, ``python -m polyloop verify`` and the scoreboard
share (design 0181).
"""

from __future__ import annotations

import pytest
from test_log_checks import (
    NEVER,
    RUN,
    SAFE,
    clean_records,
    finished,
    intent,
    log_of,
    result,
    step,
)

from polyloop.session import check_log
from polyloop.types import IntentKind, ReplayPolicy, RunStarted, StopReason

pytestmark = pytest.mark.unit


def _dangling(kind: IntentKind, policy: ReplayPolicy, reason: StopReason) -> list[object]:
    records = clean_records()[:-1]  # two complete steps, no finish
    if kind is IntentKind.MODEL_CALL:
        snapshot = {**records[0].parameter_snapshot}  # type: ignore[attr-defined]
        snapshot["request.model_replay_policy"] = policy.value
        records[0] = RunStarted(run_id=RUN, parameter_snapshot=snapshot)
        records = [
            intent(IntentKind.MODEL_CALL, r.call_index, policy) if _is_model_intent(r) else r
            for r in records
        ]
        records.append(intent(IntentKind.MODEL_CALL, 2, policy))
    else:
        records += [intent(IntentKind.MODEL_CALL, 2, SAFE), result(2)]
        records.append(intent(IntentKind.ACTION, 2, policy))
    return [*records, finished(step(0), step(1), reason=reason)]


def _is_model_intent(record: object) -> bool:
    return getattr(record, "kind", None) is IntentKind.MODEL_CALL


@pytest.mark.parametrize("kind", [IntentKind.MODEL_CALL, IntentKind.ACTION])
@pytest.mark.parametrize(
    ("policy", "reason", "allowed"),
    [
        (SAFE, StopReason.CANCELLED, True),
        (NEVER, StopReason.CANCELLED, True),
        (NEVER, StopReason.RESUME_STATE_UNKNOWN, True),
        (SAFE, StopReason.RESUME_STATE_UNKNOWN, False),
        (NEVER, StopReason.STEP_BUDGET, False),
        (SAFE, StopReason.ENV_ERROR, False),
        (NEVER, StopReason.TASK_COMPLETED, False),
    ],
)
async def test_an_unanswered_intent_before_the_finish_needs_a_reason_that_explains_it(
    kind: IntentKind, policy: ReplayPolicy, reason: StopReason, allowed: bool
) -> None:
    records = _dangling(kind, policy, reason)
    breach = check_log(await log_of(records), RUN)
    if allowed:
        assert breach is None
        return
    assert breach is not None
    assert breach.line == len(records)  # the finish record is what contradicts the intent
    assert f"unanswered {kind.value} intent" in breach.detail
    assert reason.value in breach.detail


async def test_without_a_finish_the_unanswered_intent_is_a_crash_and_no_breach() -> None:
    records = _dangling(IntentKind.ACTION, NEVER, StopReason.STEP_BUDGET)[:-1]
    assert check_log(await log_of(records), RUN) is None
