"""check_log and settlements (schema 1.7, issue 21, design 0206).

A settlement is the verdict on an action in doubt (its intent durable, its result lost with
a process). The log check knows the record: a settlement must name the open action; one for
an execution that was not in doubt, or a second one after an ``executed`` verdict, is a
breach naming the line; an outcome says ``settled_by`` exactly when an executed settlement
precedes it. Every rule is checked on stored lines (with line numbers) and on the per-kind
tuples of a store that keeps no entries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from polyloop._recovery import ResumeAction, check_log, plan_resume
from polyloop.ports import RunLog
from polyloop.stores._records import assemble_log, decode_line, encode_line
from polyloop.testing import RecordFactory
from polyloop.types import (
    ActionStatus,
    Intent,
    ModelCallResult,
    ReplayPolicy,
    RunFinished,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepCompleted,
    StopReason,
)

pytestmark = pytest.mark.unit

RUN = "r1"
SAFE, NEVER = ReplayPolicy.SAFE, ReplayPolicy.NEVER
EXECUTED, NOT_EXECUTED, UNKNOWN = (
    SettlementVerdict.EXECUTED,
    SettlementVerdict.NOT_EXECUTED,
    SettlementVerdict.UNKNOWN,
)
SNAPSHOT = {
    "request.model_replay_policy": "safe",
    "action_executor.kind": "registry",
    "action_executor.tool.add.replay_policy": "safe",
    "action_executor.tool.pay.replay_policy": "never",
}
OBSERVED = "transfer 17 went through"

RECORDS = RecordFactory()


def model_intent(idx: int) -> Intent:
    return RECORDS.model_call_intent(
        run_id=RUN, call_index=idx, result_id=f"m{idx}", replay_policy=SAFE
    )


def action_intent(idx: int, policy: ReplayPolicy = NEVER) -> Intent:
    return RECORDS.action_intent(
        run_id=RUN,
        call_index=idx,
        result_id=f"a{idx}",
        replay_policy=policy,
        idempotency_key=f"polyloop:r:{RUN}:a{idx}",
    )


def result(idx: int) -> ModelCallResult:
    reply = RECORDS.reply(call_id=f"c{idx}", content="go")
    return RECORDS.model_call_result(run_id=RUN, result_id=f"m{idx}", reply=reply)


def step(idx: int, *, settled_by: str | None = None, observation: str = OBSERVED) -> StepCompleted:
    return RECORDS.step_completed(
        run_id=RUN,
        result_id=f"a{idx}",
        action_outcome=RECORDS.outcome(observation=observation, settled_by=settled_by),
        step=RECORDS.step(step_idx=idx),
    )


def settle(result_id: str, verdict: SettlementVerdict = EXECUTED) -> Settlement:
    return RECORDS.settlement(
        run_id=RUN,
        result_id=result_id,
        verdict=verdict,
        by="pay" if verdict is UNKNOWN else "ops@example.com",
        observation=OBSERVED if verdict is EXECUTED else None,
    )


def finished(*steps: StepCompleted, reason: StopReason) -> RunFinished:
    return RECORDS.run_finished(
        run_id=RUN,
        result=RECORDS.result(run_id=RUN, stop_reason=reason, steps=(s.step for s in steps)),
    )


def in_doubt() -> list[object]:
    """Step 0 done, step 1's NEVER action announced without a result: lines 1..8."""
    return [
        RECORDS.run_started(run_id=RUN, parameter_snapshot=SNAPSHOT),
        model_intent(0),
        result(0),
        action_intent(0, SAFE),
        step(0),
        model_intent(1),
        result(1),
        action_intent(1),
    ]


SETTLED = "person:ops@example.com"


def log_of(records: list[object]) -> RunLog:
    """The records as a store hands them back: each line encoded, decoded, numbered."""
    lines = [
        encode_line(record, type(record), "test")  # type: ignore[arg-type]
        for record in records
    ]
    return assemble_log(
        decode_line(line[:-1], run_id=RUN, line_number=number)
        for number, line in enumerate(lines, start=1)
    )


def without_entries(log: RunLog) -> RunLog:
    """The same log from a store that keeps no entries: checked in canonical order."""
    return dataclasses.replace(log, entries=())


# --------------------------------------------------------------------------- accepted logs


@pytest.mark.parametrize(
    "tail",
    [
        [],
        [settle("a1", UNKNOWN)],
        [settle("a1", UNKNOWN), settle("a1", UNKNOWN)],
        [settle("a1", UNKNOWN), settle("a1", EXECUTED)],
        [settle("a1", UNKNOWN), settle("a1", NOT_EXECUTED)],
        [settle("a1", NOT_EXECUTED), action_intent(1), settle("a1", NOT_EXECUTED)],
        [settle("a1", EXECUTED)],
        [settle("a1", EXECUTED), step(1, settled_by=SETTLED)],
        [settle("a1", EXECUTED), step(1, settled_by="reconciler")],
        [settle("a1", NOT_EXECUTED), step(1, observation="paid now")],
        [settle("a1", UNKNOWN), step(1, observation="paid now")],
        [
            settle("a1", NOT_EXECUTED),
            action_intent(1),
            settle("a1", EXECUTED),
            step(1, settled_by=SETTLED),
        ],
        [settle("a1", UNKNOWN), finished(step(0), reason=StopReason.RESUME_STATE_UNKNOWN)],
        [settle("a1", NOT_EXECUTED), finished(step(0), reason=StopReason.ACTION_TIMEOUT)],
        [settle("a1", NOT_EXECUTED), finished(step(0), reason=StopReason.PARSER_ERROR)],
        [settle("a1", EXECUTED), finished(step(0), reason=StopReason.CANCELLED)],
        [
            settle("a1", EXECUTED),
            step(1, settled_by=SETTLED),
            finished(step(0), step(1, settled_by=SETTLED), reason=StopReason.STEP_BUDGET),
        ],
    ],
    ids=[
        "parked-in-doubt",
        "parked-after-unknown",
        "asked-twice",
        "unknown-then-executed",
        "unknown-then-not-executed",
        "retried-twice",
        "executed-step-not-yet-written",
        "executed-then-its-step",
        "reconciled-then-its-step",
        "not-executed-then-run",
        "unknown-then-run",
        "not-executed-then-executed",
        "unknown-then-stopped",
        "retried-then-timed-out",
        "retried-then-parser-breach",
        "executed-then-cancelled",
        "executed-then-finished",
    ],
)
def test_a_settled_log_the_library_can_write_has_no_breach(tail: list[object]) -> None:
    log = log_of([*in_doubt(), *tail])
    assert check_log(log, RUN) is None
    assert check_log(without_entries(log), RUN) is None
    assert plan_resume(log, RUN).action is not ResumeAction.CORRUPT


def test_a_never_action_in_doubt_is_still_unknown_after_an_unknown_settlement() -> None:
    plan = plan_resume(log_of([*in_doubt(), settle("a1", UNKNOWN)]), RUN)
    assert plan.action is ResumeAction.STOP_UNKNOWN


# --------------------------------------------------------------------------- breaches


Mutation = Callable[[list[object]], list[object]]


@pytest.mark.parametrize(
    ("mutate", "line", "words"),
    [
        # a settlement for an execution that was not in doubt
        (lambda r: [*r, settle("a7")], 9, "names no intent: no execution 'a7' was in doubt"),
        (lambda r: [*r, settle("a0")], 9, "names an execution that was not in doubt"),
        (lambda r: [*r[:6], settle("m1")], 7, "names a model call"),
        (lambda r: [*r[:7], settle("a1")], 8, "names no intent"),
        (
            lambda r: [*r, settle("a1"), step(1, settled_by=SETTLED), settle("a1")],
            11,
            "not in doubt: its result is in the log",
        ),
        # two resolutions
        (
            lambda r: [*r, settle("a1"), settle("a1")],
            10,
            "two resolutions of 'a1': the settlement of 'a1' (executed, by person "
            "'ops@example.com') follows the executed settlement on line 9",
        ),
        (lambda r: [*r, settle("a1"), settle("a1", NOT_EXECUTED)], 10, "two resolutions"),
        # a not-executed verdict licenses one retry, announced before anything else
        (
            lambda r: [*r, settle("a1", NOT_EXECUTED), settle("a1", NOT_EXECUTED)],
            10,
            "after which only the action's retry may follow",
        ),
        # after an executed settlement only its step (as settled) may follow
        (lambda r: [*r, settle("a1"), step(1)], 10, "does not say it was settled"),
        (
            lambda r: [*r, settle("a1"), step(1, settled_by=SETTLED, observation="other")],
            10,
            "has another observation than the settlement's",
        ),
        (
            lambda r: [
                *r,
                settle("a1"),
                dataclasses.replace(
                    step(1, settled_by=SETTLED),
                    action_outcome=RECORDS.outcome(
                        status=ActionStatus.NOT_EXECUTED, observation=OBSERVED, settled_by=SETTLED
                    ),
                ),
            ],
            10,
            "has status not_executed, not executed",
        ),
        (
            lambda r: [*r, settle("a1"), finished(step(0), reason=StopReason.RESUME_STATE_UNKNOWN)],
            10,
            "was settled as executed on line 9, but the run finished (resume_state_unknown)",
        ),
        # settled_by without an executed settlement
        (lambda r: [*r, step(1, settled_by=SETTLED)], 9, "but no settlement of 'a1' precedes"),
        (
            lambda r: [*r, settle("a1", NOT_EXECUTED), step(1, settled_by=SETTLED)],
            10,
            "but a not_executed settlement of 'a1' precedes it",
        ),
        # the existing rules hold for settlements too
        (lambda r: [settle("a1"), *r], 1, "RunStarted record is missing"),
        (
            lambda r: [
                *r,
                settle("a1", UNKNOWN),
                finished(step(0), reason=StopReason.CANCELLED),
                settle("a1"),
            ],
            11,
            "follows the RunFinished",
        ),
    ],
    ids=[
        "no-such-intent",
        "has-its-result",
        "model-call",
        "before-its-intent",
        "after-its-step",
        "executed-twice",
        "executed-then-not-executed",
        "not-executed-twice-without-a-retry",
        "step-not-marked-settled",
        "other-observation",
        "not-executed-status",
        "finished-without-the-step",
        "settled-by-without-settlement",
        "settled-by-after-not-executed",
        "before-the-start",
        "after-the-finish",
    ],
)
def test_a_settlement_the_library_cannot_have_written_is_a_breach_naming_its_line(
    mutate: Mutation, line: int, words: str
) -> None:
    log = log_of(mutate(in_doubt()))
    breach = check_log(log, RUN)
    assert breach is not None
    assert breach.line == line
    assert words in breach.detail
    assert plan_resume(log, RUN).action is ResumeAction.CORRUPT


def test_a_store_without_entries_is_checked_in_canonical_order() -> None:
    log = without_entries(log_of([*in_doubt(), settle("a1"), settle("a1")]))
    breach = check_log(log, RUN)
    assert breach is not None
    assert breach.line is None
    assert "two resolutions" in breach.detail
    other_run = dataclasses.replace(
        without_entries(log_of(in_doubt())),
        settlements=(dataclasses.replace(settle("a1"), run_id="r2"),),
    )
    wrong = check_log(other_run, RUN)
    assert wrong is not None
    assert "a Settlement record belongs to run 'r2'" in wrong.detail


def test_a_settlement_of_another_run_is_a_breach() -> None:
    other = dataclasses.replace(settle("a1"), run_id="r2")
    breach = check_log(log_of([*in_doubt(), other]), RUN)
    assert breach is not None
    assert breach.line == 9
    assert "a Settlement record belongs to run 'r2'" in breach.detail


def test_a_reconciler_and_a_person_each_settle_through_the_same_rules() -> None:
    by_reconciler = RECORDS.settlement(
        run_id=RUN,
        result_id="a1",
        source=SettlementSource.RECONCILER,
        by="pay",
        observation=OBSERVED,
    )
    tail = [by_reconciler, step(1, settled_by="reconciler")]
    assert check_log(log_of([*in_doubt(), *tail]), RUN) is None
    assert plan_resume(log_of([*in_doubt(), by_reconciler]), RUN).action is (
        ResumeAction.RECORD_SETTLED
    )
