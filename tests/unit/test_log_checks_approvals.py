"""check_log and approvals (issue 22, design 0210).

A call that waits for a person's approval is its ``ApprovalRequest`` on record, after the
step's model reply and before any action intent; the decision on it is a ``Settlement`` with
verdict ``approved`` or ``rejected`` that names the request's digest. The log check knows both
records: the library's own shapes pass (approved then announced and run; rejected, or expired,
then a step without an action; parked on the request), and each breach names its line: a
decision without a request, with another digest, a second decision, an action intent with no
decision or after a rejection (an execution of a rejected call), two requests for one step, a
request that does not follow the step's model reply. Every rule is checked on stored lines
(with line numbers) and on the per-kind tuples of a store that keeps no entries.
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
    ApprovalRequest,
    Intent,
    ModelCallResult,
    ReplayPolicy,
    RunFinished,
    Settlement,
    StepCompleted,
    StopReason,
)

pytestmark = pytest.mark.unit

RUN = "r1"
SAFE, NEVER = ReplayPolicy.SAFE, ReplayPolicy.NEVER
SNAPSHOT = {
    "request.model_replay_policy": "safe",
    "action_executor.kind": "registry",
    "action_executor.tool.add.replay_policy": "safe",
    "action_executor.tool.pay.replay_policy": "never",
    "action_executor.tool.pay.needs_approval": "always",
}

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
    reply = RECORDS.reply(call_id=f"c{idx}", content="pay")
    return RECORDS.model_call_result(run_id=RUN, result_id=f"m{idx}", reply=reply)


def executed(idx: int) -> StepCompleted:
    return RECORDS.step_completed(
        run_id=RUN,
        result_id=f"a{idx}",
        action_outcome=RECORDS.outcome(observation="paid 250"),
        step=RECORDS.step(step_idx=idx),
    )


def not_run(idx: int) -> StepCompleted:
    """The step of a rejected call as the session records it: no action, no outcome, the
    synthetic rejection as its observation."""
    record = dataclasses.replace(
        RECORDS.step(step_idx=idx),
        action=None,
        action_status=None,
        observation="The call was rejected: a person rejected this call: not this amount",
        observation_is_synthetic=True,
    )
    return RECORDS.step_completed(run_id=RUN, result_id=None, action_outcome=None, step=record)


def ask(idx: int = 1, amount: int = 250) -> ApprovalRequest:
    return RECORDS.approval_request(
        run_id=RUN, step_idx=idx, tool="pay", arguments=f'{{"amount":{amount}}}'
    )


def approve(request: ApprovalRequest | None = None, **changes: str) -> Settlement:
    return RECORDS.approval_decision(request or ask(), **changes)  # type: ignore[arg-type]


def reject(request: ApprovalRequest | None = None) -> Settlement:
    return RECORDS.approval_decision(request or ask(), approved=False)


def expire(request: ApprovalRequest | None = None) -> Settlement:
    return RECORDS.approval_decision(request or ask(), approved=False, expired=True)


def finished(*steps: StepCompleted, reason: StopReason) -> RunFinished:
    return RECORDS.run_finished(
        run_id=RUN,
        result=RECORDS.result(run_id=RUN, stop_reason=reason, steps=(s.step for s in steps)),
    )


def replied() -> list[object]:
    """Step 0 done (a safe action), step 1's model call answered: lines 1..7."""
    return [
        RECORDS.run_started(run_id=RUN, parameter_snapshot=SNAPSHOT),
        model_intent(0),
        result(0),
        action_intent(0, SAFE),
        executed(0),
        model_intent(1),
        result(1),
    ]


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
    ("tail", "plan"),
    [
        ([ask()], ResumeAction.AWAITING_APPROVAL),
        ([ask(), approve()], ResumeAction.RUN_APPROVED),
        ([ask(), approve(), action_intent(1)], ResumeAction.STOP_UNKNOWN),
        ([ask(), approve(), action_intent(1), executed(1)], ResumeAction.CONTINUE),
        ([ask(), reject()], ResumeAction.RECORD_REJECTED),
        ([ask(), reject(), not_run(1)], ResumeAction.CONTINUE),
        ([ask(), expire()], ResumeAction.RECORD_REJECTED),
        ([ask(), expire(), not_run(1)], ResumeAction.CONTINUE),
        (
            [ask(), reject(), not_run(1), model_intent(2), result(2), ask(2, 9000)],
            ResumeAction.AWAITING_APPROVAL,
        ),
        (
            [
                ask(),
                approve(),
                action_intent(1),
                executed(1),
                finished(executed(0), executed(1), reason=StopReason.STEP_BUDGET),
            ],
            ResumeAction.ALREADY_FINISHED,
        ),
        (
            [ask(), finished(executed(0), reason=StopReason.CANCELLED)],
            ResumeAction.ALREADY_FINISHED,
        ),
    ],
    ids=[
        "parked-awaiting-approval",
        "approved-not-yet-announced",
        "approved-then-in-doubt",
        "approved-then-run",
        "rejected-step-not-yet-written",
        "rejected-then-a-step-without-action",
        "expired-step-not-yet-written",
        "expired-then-a-step-without-action",
        "rejected-then-asked-again-next-step",
        "approved-run-then-finished",
        "cancelled-while-the-request-was-written",
    ],
)
def test_an_approval_log_the_library_can_write_has_no_breach(
    tail: list[object], plan: ResumeAction
) -> None:
    log = log_of([*replied(), *tail])
    assert check_log(log, RUN) is None
    assert check_log(without_entries(log), RUN) is None
    assert plan_resume(log, RUN).action is plan
    assert plan_resume(without_entries(log), RUN).action is plan


def test_a_parked_run_plans_its_request_and_a_decided_one_its_decision() -> None:
    waiting = plan_resume(log_of([*replied(), ask()]), RUN)
    assert (waiting.approval_request, waiting.settlement) == (ask(), None)
    assert "waits for approval" in waiting.detail
    decided = plan_resume(log_of([*replied(), ask(), expire()]), RUN)
    assert (decided.approval_request, decided.settlement) == (ask(), expire())
    assert "was rejected by expiry 'polyloop': expired" in decided.detail


# --------------------------------------------------------------------------- breaches


Mutation = Callable[[list[object]], list[object]]


@pytest.mark.parametrize(
    ("mutate", "line", "words"),
    [
        # a decision without a request
        (
            lambda r: [*r, approve()],
            8,
            "the approved decision on 'a1' answers no approval request of the open step",
        ),
        (lambda r: [*r, reject()], 8, "answers no approval request"),
        (lambda r: [*r, ask(), approve(ask(2))], 9, "answers no approval request"),
        (
            lambda r: [*r, ask(), reject(), not_run(1), reject()],
            11,
            "answers no approval request",
        ),
        # a decision with another digest than the request's
        (
            lambda r: [*r, ask(), approve(digest=ask(amount=9000).digest)],
            9,
            f"names digest {ask(amount=9000).digest!r}, not the request's {ask().digest!r}",
        ),
        # two decisions
        (
            lambda r: [*r, ask(), approve(), approve()],
            10,
            "two decisions on the approval request of 'a1'",
        ),
        (lambda r: [*r, ask(), reject(), approve()], 10, "two decisions"),
        (lambda r: [*r, ask(), approve(), expire()], 10, "two decisions"),
        (
            lambda r: [*r, ask(), approve(), action_intent(1), reject()],
            11,
            "the rejected decision on 'a1' comes after the action was announced",
        ),
        # an action intent with no decision on its request
        (
            lambda r: [*r, ask(), action_intent(1)],
            9,
            "intent 'a1' (action, call_index 1) announces a call that waits for approval, "
            "with no decision on it",
        ),
        # an execution of a rejected call
        (
            lambda r: [*r, ask(), reject(), action_intent(1)],
            10,
            "announces a call that was rejected: it must never execute",
        ),
        (lambda r: [*r, ask(), expire(), action_intent(1)], 10, "was rejected"),
        (
            lambda r: [*r, ask(), reject(), executed(1)],
            10,
            "step 1 has an action result but no action intent",
        ),
        # a step recorded while its call still waits
        (
            lambda r: [*r, ask(), not_run(1)],
            9,
            "step 1 is complete, but its call still waits for approval",
        ),
        # two requests for one step
        (lambda r: [*r, ask(), ask()], 9, "two approval requests for step 1's action"),
        (lambda r: [*r, ask(), ask(amount=9000)], 9, "two approval requests"),
        # a request that does not follow the step's model reply
        (
            lambda r: [*r[:6], ask()],
            7,
            "the approval request of 'a1' does not follow step 1's model reply",
        ),
        (lambda r: [*r, action_intent(1), ask()], 9, "does not follow step 1's model reply"),
        (
            lambda r: (
                [*r[:6], RECORDS.model_call_result(run_id=RUN, result_id="m1", failure="x"), ask()]
            ),
            8,
            "does not follow step 1's model reply",
        ),
        (
            lambda r: [*r, ask(2)],
            8,
            "the approval request of 'a2' (step 2) is not for the open step 1's action",
        ),
        (lambda r: [*r[:4], ask(0)], 5, "does not follow step 0's model reply"),
        # the existing rules hold for requests too
        (lambda r: [ask(), *r], 1, "RunStarted record is missing"),
        (
            lambda r: [*r, finished(executed(0), reason=StopReason.CANCELLED), ask()],
            9,
            "a ApprovalRequest record follows the RunFinished record",
        ),
    ],
    ids=[
        "approval-without-request",
        "rejection-without-request",
        "decision-on-another-steps-call",
        "decision-after-the-step",
        "another-digest",
        "approved-twice",
        "rejected-then-approved",
        "approved-then-expired",
        "decided-again-after-the-intent",
        "intent-while-waiting",
        "intent-after-rejection",
        "intent-after-expiry",
        "executed-step-after-rejection",
        "step-while-waiting",
        "two-requests",
        "two-requests-other-arguments",
        "request-before-the-model-result",
        "request-after-the-action-intent",
        "request-after-a-failed-model-call",
        "request-for-another-step",
        "request-after-a-safe-action-intent",
        "before-the-start",
        "after-the-finish",
    ],
)
def test_an_approval_record_the_library_cannot_have_written_is_a_breach_naming_its_line(
    mutate: Mutation, line: int, words: str
) -> None:
    log = log_of(mutate(replied()))
    breach = check_log(log, RUN)
    assert breach is not None
    assert breach.line == line
    assert words in breach.detail
    assert plan_resume(log, RUN).action is ResumeAction.CORRUPT


@pytest.mark.parametrize(
    ("tail", "words"),
    [
        ([approve()], "answers no approval request"),
        ([ask(), approve(digest=ask(amount=9000).digest)], "not the request's"),
        ([ask(), approve(), approve()], "two decisions"),
        ([ask(), action_intent(1)], "waits for approval, with no decision on it"),
        ([ask(), reject(), action_intent(1)], "was rejected: it must never execute"),
        ([ask(), ask()], "two approval requests"),
        ([ask(), not_run(1)], "still waits for approval"),
    ],
    ids=[
        "decision-without-request",
        "another-digest",
        "two-decisions",
        "intent-while-waiting",
        "intent-after-rejection",
        "two-requests",
        "step-while-waiting",
    ],
)
def test_a_store_without_entries_is_checked_in_canonical_order(
    tail: list[object], words: str
) -> None:
    breach = check_log(without_entries(log_of([*replied(), *tail])), RUN)
    assert breach is not None
    assert breach.line is None
    assert words in breach.detail


def test_an_approval_request_of_another_run_is_a_breach() -> None:
    other = dataclasses.replace(ask(), run_id="r2")
    breach = check_log(log_of([*replied(), other]), RUN)
    assert breach is not None
    assert breach.line == 8
    assert "a ApprovalRequest record belongs to run 'r2'" in breach.detail
