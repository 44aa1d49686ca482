"""Resume planning: read a run's log and decide what the next process may safely do.

Every execution (one model call, one action) is judged by two facts: is its intent in the log,
and is its result? Results are matched to intents by ``result_id`` and nothing else.

=========  ==========  ==========================================================
intent     result      recovery
=========  ==========  ==========================================================
no         no          not started: run it normally
yes        yes         finished: skip it
yes        no          in doubt: a settlement of it decides first (the last one:
                       ``executed`` records its step from the settlement;
                       ``not_executed`` for every attempt announces it again, the
                       same intent, and runs it); else the replay policy recorded
                       *on the intent*: ``SAFE`` runs it again, ``IDEMPOTENT``
                       runs it again with the idempotency key its intent records
                       (the tool's system deduplicates), ``NEVER`` stops the run
                       with ``RESUME_STATE_UNKNOWN`` and leaves it open (the session
                       asks the tool's reconciler first, if it has one); recovery
                       never guesses
no         yes         impossible: the log is corrupt and resume refuses
=========  ==========  ==========================================================

Settlements (design 0206) exist only for actions: a model call in doubt is decided by its
policy alone. A call that waits for a person's approval (design 0210) has its
``ApprovalRequest`` and no action intent yet: with no decision the plan is
``AWAITING_APPROVAL``; an ``approved`` decision makes it ``RUN_APPROVED`` (announce and run),
a ``rejected`` one ``RECORD_REJECTED`` (record the step without an action).

Ids are allocated deterministically from the step index (``model_result_id`` and
``action_result_id``), so a replay re-uses the intent already in the log instead of writing a
second one, and a reader can tell which step every record belongs to.

Before any of that, ``check_log`` checks the whole log against the rules the library's own
writes always keep (see its docstring); ``plan_resume`` calls it first, so a log whose records
contradict each other is ``CORRUPT`` (and ``resume`` refuses it with ``LogCorruptError`` naming
the line) whether or not the run finished. The same function is the structural check of any
tool that verifies logs, so the two can never disagree.

In the code, the table is ``_open_step_plan``, applied to the first step without a step
record. Every step before it must be settled (``_step_record_problem``), and the table's last
row, a result without its intent, is refused before that: by ``check_log``, and again by
``_model_results_by_result_id`` and ``_step_record_problem``.

``plan_resume`` and ``check_log`` are pure: they never touch a store, a model or an environment.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from polyloop.errors import LogCorruptError
from polyloop.ports import LogEntry, LogRecord, RunLog
from polyloop.types import (
    RECORDS,
    ActionStatus,
    ApprovalRequest,
    Intent,
    IntentKind,
    ModelCallResult,
    ReplayPolicy,
    ResumeStopped,
    RunFinished,
    RunStarted,
    Settlement,
    SettlementVerdict,
    StepCompleted,
    StopReason,
)

__all__ = [
    "MODEL_POLICY_KEY",
    "UNANSWERED_AT_FINISH",
    "LogBreach",
    "LogCorruptError",
    "ResumeAction",
    "ResumePlan",
    "action_result_id",
    "check_log",
    "check_tree",
    "child_run_id",
    "idempotency_key",
    "model_result_id",
    "plan_resume",
]


_VERBATIM_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")


def idempotency_key(run_id: str, result_id: str) -> str:
    """The idempotency key of the execution ``result_id`` of run ``run_id`` (design 0205).

    ``polyloop:r:<run_id>:<result_id>`` when the run id is 1-200 characters of
    ``[A-Za-z0-9._-]`` (a person finds it by the run id), else
    ``polyloop:h:<first 32 hex digits of sha256(run_id)>:<result_id>``. Deterministic, so it
    is the same on every replay of the execution; different for every other execution (other
    steps and kinds have other result ids, other runs other ids; ``:`` separates the parts and
    appears in no verbatim run id). At most 255 characters of ``[A-Za-z0-9._:-]``: it fits an
    HTTP ``Idempotency-Key`` header. The session records it on the intent; a replay passes the
    recorded key, so a continuation's copied in-flight execution keeps its original key.
    """
    return _key_prefix(run_id) + result_id


@functools.lru_cache(maxsize=1024)
def _key_prefix(run_id: str) -> str:
    """``idempotency_key``'s run part with its trailing ``:``, worked out once per run id
    (two keys a step; design 0214)."""
    if _VERBATIM_RUN_ID.fullmatch(run_id):
        return f"polyloop:r:{run_id}:"
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"polyloop:h:{digest}:"


def model_result_id(step_idx: int) -> str:
    """The ``result_id`` of step ``step_idx``'s model call (``"m<step>"``)."""
    return f"m{step_idx}"


def action_result_id(step_idx: int) -> str:
    """The ``result_id`` of step ``step_idx``'s action (``"a<step>"``)."""
    return f"a{step_idx}"


class ResumeAction(enum.Enum):
    """What a resuming process does next."""

    FRESH = "fresh"
    """The log is empty: nothing was ever started under this run id."""
    ALREADY_FINISHED = "already_finished"
    """The log has a ``RunFinished``: hand back its result, do nothing."""
    CONTINUE = "continue"
    """Every execution in the log is settled: start the next step normally."""
    CONTINUE_AFTER_MODEL_CALL = "continue_after_model_call"
    """The next step's model call has its result but nothing followed: parse the stored reply
    and go on (no side effect has happened yet, so nothing is repeated)."""
    REDO_MODEL_CALL = "redo_model_call"
    """The next step's model call has an intent, no result and ``SAFE`` or ``IDEMPOTENT``:
    call again (with the key recorded on its intent)."""
    REPLAY_LAST_ACTION = "replay_last_action"
    """The next step's action has an intent and no result and is ``SAFE`` or
    ``IDEMPOTENT``: execute it again under that intent (with the key it records)."""
    RETRY_SETTLED = "retry_settled"
    """The next step's action was in doubt and every attempt of it was settled as not
    executed: announce it again (a new intent, same result id and key) and run it, so that a
    retry that dies is in doubt again (design 0206)."""
    AWAITING_APPROVAL = "awaiting_approval"
    """The next step's call waits for a person's approval (its request is in the log, no
    decision yet): stop with ``AWAITING_APPROVAL`` again, calling and executing nothing (the
    session first rejects it as "expired" when its ``expires_at`` has passed; design 0210)."""
    RUN_APPROVED = "run_approved"
    """The next step's call was approved: announce it and execute it under its policy."""
    RECORD_REJECTED = "record_rejected"
    """The next step's call was rejected: record the step with the rejection as its
    observation; the call never executes."""
    RECORD_SETTLED = "record_settled"
    """The next step's action was in doubt and its last settlement says it was executed:
    record its step with the settlement's observation, execute nothing (design 0206)."""
    STOP_UNKNOWN = "stop_unknown"
    """An execution has an intent, no result, ``NEVER`` and no settlement that decides it:
    stop with ``RESUME_STATE_UNKNOWN`` and never execute it again (for an action whose tool
    has a reconciler, the session asks it first; design 0206)."""
    CORRUPT = "corrupt"
    """The log breaks a structural rule (see ``ResumePlan.detail``): refuse."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumePlan:
    """The verdict of ``plan_resume``.

    ``next_step_idx`` is the index of the first step without a ``StepCompleted`` record.
    ``pending_model_result`` is the stored result of that step's model call, when there is one
    (``CONTINUE_AFTER_MODEL_CALL``, ``REPLAY_LAST_ACTION``, and ``STOP_UNKNOWN`` for an action).
    ``last_model_result`` is the model result of the last completed step, which the session
    needs to re-check whether that step should already have stopped the run. ``detail``
    explains the verdict in words. ``pending_intent`` is the intent of the open execution
    (the one without a result), whose ``idempotency_key`` a replay passes again;
    ``settlement`` is the last settlement of the open action, if any (design 0206).
    """

    action: ResumeAction
    next_step_idx: int = 0
    pending_model_result: ModelCallResult | None = None
    last_model_result: ModelCallResult | None = None
    detail: str = ""
    breach: LogBreach | None = None
    pending_intent: Intent | None = None
    settlement: Settlement | None = None
    approval_request: ApprovalRequest | None = None
    """The open step's request for approval, when its call waits or waited for one."""


def _corrupt(next_step_idx: int, detail: str) -> ResumePlan:
    return ResumePlan(action=ResumeAction.CORRUPT, next_step_idx=next_step_idx, detail=detail)


def _identity_problem(log: RunLog, run_id: str) -> str | None:
    for kind in RECORDS.kinds:
        if kind.log_field is None:
            continue
        held = getattr(log, kind.log_field)
        for record in () if held is None else (held,) if kind.single else held:
            if record.run_id != run_id:
                return (
                    f"a {_kind(record)} record belongs to run {record.run_id!r}, not to {run_id!r}"
                )
    return None


def _follows_id_scheme(intent: Intent) -> bool:
    """Whether the intent's result id is the one the library allocates for its kind and step."""
    expected = (
        model_result_id(intent.call_index)
        if intent.kind is IntentKind.MODEL_CALL
        else action_result_id(intent.call_index)
    )
    return intent.result_id == expected


MODEL_POLICY_KEY = "request.model_replay_policy"
"""The snapshot key that holds the replay policy of every model-call intent."""

_TOOL_POLICY_KEY = re.compile(r"action_executor\.tool\..+\.replay_policy")
_INDEXED_ID = re.compile(r"[ma]([0-9]{1,18})")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogBreach:
    """The first record of a log that breaks a rule of ``check_log``.

    ``line`` is the record's 1-based line in the store (``LogEntry.line``), or ``None`` when
    the store kept no entries (the records were checked in their canonical order instead).
    ``detail`` says which rule the record breaks, in words. ``str(breach)`` is
    ``"line <n>: <detail>"``.
    """

    line: int | None
    detail: str

    def __str__(self) -> str:
        where = "no line known" if self.line is None else f"line {self.line}"
        return f"{where}: {self.detail}"


def _kind(record: LogRecord) -> str:
    return type(record).__name__


def _attempt_order(log: RunLog) -> dict[int, int]:
    """For each action intent and in-doubt settlement (by ``id``), its place among its
    action's attempts: the k-th announcement of an action is ``2k``, the settlements of that
    attempt ``2k + 1``; a ``not_executed`` settlement ends its attempt, so the next
    announcement (the retry, design 0206) comes after it."""
    order: dict[int, int] = {}
    announced: dict[str, int] = {}
    for intent in log.intents:
        if intent.kind is IntentKind.ACTION:
            attempt = announced.get(intent.result_id, 0)
            announced[intent.result_id] = attempt + 1
            order[id(intent)] = 2 * attempt
    ended: dict[str, int] = {}
    for settlement in log.settlements:
        if settlement.is_approval_decision:
            continue
        attempt = ended.get(settlement.result_id, 0)
        order[id(settlement)] = 2 * attempt + 1
        if settlement.verdict is SettlementVerdict.NOT_EXECUTED:
            ended[settlement.result_id] = attempt + 1
    return order


def _canonical_entries(log: RunLog) -> tuple[LogEntry, ...]:
    """The per-kind tuples merged into the order the library writes them (lines unknown = 0)."""
    attempts = _attempt_order(log)

    def position(record: LogRecord) -> tuple[int, int, int]:
        if isinstance(record, Intent):
            if record.kind is IntentKind.MODEL_CALL:
                return record.call_index, 0, 0
            return record.call_index, 4, attempts.get(id(record), 0)
        if isinstance(record, ModelCallResult | Settlement | ApprovalRequest):
            match = _INDEXED_ID.fullmatch(record.result_id)
            step = int(match.group(1)) if match else len(log.steps)
            if isinstance(record, ModelCallResult):
                return step, 1, 0
            if isinstance(record, ApprovalRequest):
                return step, 2, 0
            # A decision on a call that waited for approval comes before its action intent;
            # a verdict on an action in doubt comes after the attempt it answers.
            if record.is_approval_decision:
                return step, 3, 0
            return step, 4, attempts.get(id(record), 1)
        if isinstance(record, StepCompleted):
            return record.step.step_idx, 6, 0
        return len(log.steps), 5, 0  # a kind with no rule of its own: in the open step

    # The sort is stable: the settlements of one execution keep their write order.
    middle: list[LogRecord] = [
        record
        for kind in RECORDS.kinds
        if kind.log_field is not None and not kind.single
        for record in getattr(log, kind.log_field)
    ]
    middle.sort(key=position)
    records: list[LogRecord] = []
    if log.started is not None:
        records.append(log.started)
    records += middle
    if log.finished is not None:
        records.append(log.finished)
    return tuple(LogEntry(line=0, record=record) for record in records)


def _allowed_action_policies(snapshot: Mapping[str, str]) -> frozenset[str] | None:
    """The action policies a snapshot allows, when it declares its tools' policies.

    An action gets its tool's policy, or ``never`` (code actions, unknown tools), so with a
    registry executor the allowed set is ``never`` plus every tool's policy. ``None`` when
    the snapshot does not say (another executor): then only the caller can tell.
    """
    if snapshot.get("action_executor.kind") != "registry":
        return None
    declared = {value for key, value in snapshot.items() if _TOOL_POLICY_KEY.fullmatch(key)}
    return frozenset({ReplayPolicy.NEVER.value, *declared})


UNANSWERED_AT_FINISH = frozenset(
    {
        StopReason.CANCELLED,
        StopReason.RESUME_STATE_UNKNOWN,
        StopReason.ACTION_TIMEOUT,
        StopReason.PARSER_ERROR,
        StopReason.TREE_LIMIT,
    }
)
"""The stop reasons whose finish record may follow an intent that never got its result
(the last three for an action intent only: a timed-out executor, design 0164; a parser breach
before a safe replay, design 0161; a child-run call refused by a tree limit, nothing
started, design 0245).

A cancellation can interrupt an execution in flight; a resume that refuses to guess finishes a
run whose ``NEVER`` execution's outcome is unknown. Every other stop is reached after the last
execution was answered (a failed model call and an ``ENV_ERROR`` action get their results too).
"""


def _unanswered_at_finish(intent: Intent, reason: StopReason) -> str | None:
    """Why ``intent``, unanswered when the run finished for ``reason``, breaks the log, or None."""
    if reason is StopReason.CANCELLED:
        return None
    if intent.kind is IntentKind.ACTION and reason in _UNANSWERED_ACTION_REASONS:
        # action_timeout: the executor was cancelled at its bound (design 0164); parser_error:
        # the stored reply broke the parser before a safe replay (design 0161); tree_limit: a
        # child-run call refused before its child started (design 0245).
        return None
    policy, kind = intent.replay_policy.value, intent.kind.value
    if reason is StopReason.RESUME_STATE_UNKNOWN:
        if intent.replay_policy is ReplayPolicy.NEVER:
            return None
        return (
            f"an unanswered {kind} intent {intent.result_id!r} with policy {policy} before a "
            "resume_state_unknown finish (recovery replays a safe execution; only a never one "
            "stops the run)"
        )
    return (
        f"an unanswered {kind} intent {intent.result_id!r} (policy {policy}) before a finish "
        f"with stop reason {reason.value}; only cancelled or resume_state_unknown (and, for "
        "an action, action_timeout, parser_error or tree_limit) may leave one"
    )


_UNANSWERED_ACTION_REASONS = frozenset(
    {StopReason.ACTION_TIMEOUT, StopReason.PARSER_ERROR, StopReason.TREE_LIMIT}
)


class _Checker:
    """The state machine behind ``check_log``: one pass over the entries in write order."""

    def __init__(self, run_id: str, action_policies: Mapping[int, ReplayPolicy] | None) -> None:
        self.run_id = run_id
        self.action_policies = action_policies or {}
        self.snapshot: Mapping[str, str] = {}
        # A fork's copied steps ran under its source's settings, not its own snapshot
        # (design 0239): their intents' policies are not held to it.
        self.copied_steps = 0
        self.started_line: int | None = None
        self.finished_line: int | None = None
        self.next_idx = 0
        # Phase of step ``next_idx``: "" nothing yet, "intent" model intent written, "reply" /
        # "failed" model result written, "action" action intent written.
        self.phase = ""
        self.intent_lines: dict[str, int] = {}
        self.result_ids: set[str] = set()
        self.steps: list[StepCompleted] = []
        # The intent of the open step's execution that has no result yet (phase "intent" or
        # "action"); the finish record must explain why it was never answered.
        self.open_intent: Intent | None = None
        # The last settlement of the open action (phase "action"), and its line (design 0206).
        self.settled: Settlement | None = None
        self.settled_line = 0
        # The open step's approval request and the decision on it (design 0210).
        self.approval: ApprovalRequest | None = None
        self.decision: Settlement | None = None

    def check(self, entry: LogEntry) -> str | None:
        record = entry.record
        if record.run_id != self.run_id:
            return (
                f"a {_kind(record)} record belongs to run {record.run_id!r}, not to {self.run_id!r}"
            )
        if self.finished_line is not None:
            if isinstance(record, RunFinished):
                return (
                    f"a second RunFinished record (the run finished on line {self.finished_line})"
                )
            where = f"line {self.finished_line}"
            return f"a {_kind(record)} record follows the RunFinished record ({where})"
        if isinstance(record, RunStarted):
            if self.started_line is not None:
                return f"a second RunStarted record (the first is on line {self.started_line})"
            if self.intent_lines or self.result_ids or self.steps:
                return "the RunStarted record is not the first record"
            self.started_line = entry.line
            self.snapshot = record.parameter_snapshot
            fork = getattr(record, "fork", None)
            self.copied_steps = 0 if fork is None else fork.step_idx
            return None
        if self.started_line is None:
            return "records exist but the RunStarted record is missing (it must come first)"
        problem = _resume_mark_problem(record)
        if problem is not None:
            return problem
        if isinstance(record, Intent):
            return self._intent(record, entry.line)
        if isinstance(record, ModelCallResult):
            return self._model_result(record)
        if isinstance(record, StepCompleted):
            return self._step(record)
        if isinstance(record, Settlement):
            if record.is_approval_decision:
                return self._approval_decision(record)
            return self._settlement(record, entry.line)
        if isinstance(record, ApprovalRequest):
            return self._approval_request(record)
        if isinstance(record, RunFinished):
            return self._finished(record, entry.line)
        return None  # a record kind with no rule beyond those above (design 0220)

    def _approval_request(self, request: ApprovalRequest) -> str | None:
        """A request names the open step's action, after its model reply and before any action
        intent; one per step (design 0210)."""
        idx = self.next_idx
        name = f"the approval request of {request.result_id!r}"
        if request.result_id != action_result_id(idx) or request.step_idx != idx:
            return f"{name} (step {request.step_idx}) is not for the open step {idx}'s action"
        if self.phase != "reply":
            return f"{name} does not follow step {idx}'s model reply (nor may an action intent)"
        if self.approval is not None:
            return f"two approval requests for step {idx}'s action"
        self.approval = request
        return None

    def _approval_decision(self, decision: Settlement) -> str | None:
        """A decision answers the open step's request, names its digest, and is the only one."""
        request = self.approval
        name = f"the {decision.verdict.value} decision on {decision.result_id!r}"
        if request is None or decision.result_id != request.result_id:
            return f"{name} answers no approval request of the open step"
        if self.phase != "reply":
            return f"{name} comes after the action was announced"
        if decision.digest != request.digest:
            return f"{name} names digest {decision.digest!r}, not the request's {request.digest!r}"
        if self.decision is not None:
            return f"two decisions on the approval request of {decision.result_id!r}"
        self.decision = decision
        return None

    def _intent(self, intent: Intent, line: int) -> str | None:
        name = f"intent {intent.result_id!r} ({intent.kind.value}, call_index {intent.call_index})"
        if not _follows_id_scheme(intent):
            return f"{name} does not follow the id scheme"
        first = self.intent_lines.get(intent.result_id)
        if first is not None:
            if self._announces_a_retry(intent):
                # The write-ahead of a retry after a ``not_executed`` settlement: a new attempt,
                # in doubt until it is answered or settled again (design 0206).
                self.settled = None
                return None
            return (
                f"two intents announce result {intent.result_id!r} (the first is on line {first})"
            )
        self.intent_lines[intent.result_id] = line
        problem = self._policy_problem(intent, name)
        if problem is not None:
            return problem
        idx = self.next_idx
        if intent.call_index != idx:
            return (
                f"{name} is for step {intent.call_index}, but step {idx} is next "
                f"({idx} steps are complete)"
            )
        if intent.kind is IntentKind.MODEL_CALL:
            # A model intent for the next step while this step has one is the duplicate above.
            self.phase = "intent"
            self.open_intent = intent
            return None
        if self.phase == "":
            return f"step {idx} has an action intent but no model call"
        if self.phase == "intent":
            return f"step {idx} has an action intent but no model call result"
        if self.phase == "failed":
            return f"step {idx}'s model call failed but an action followed"
        if self.approval is not None and self.decision is None:
            return f"{name} announces a call that waits for approval, with no decision on it"
        if self.decision is not None and self.decision.verdict is SettlementVerdict.REJECTED:
            return f"{name} announces a call that was rejected: it must never execute"
        self.phase = "action"
        self.open_intent = intent
        return None

    def _announces_a_retry(self, intent: Intent) -> bool:
        """Whether ``intent`` repeats the open action's intent right after a settlement that
        says the action was not executed (the only way one result id is announced twice)."""
        settled = self.settled
        return (
            self.phase == "action"
            and intent == self.open_intent
            and settled is not None
            and settled.result_id == intent.result_id
            and settled.verdict is SettlementVerdict.NOT_EXECUTED
        )

    def _policy_problem(self, intent: Intent, name: str) -> str | None:
        if intent.call_index < self.copied_steps:
            return None  # a fork's copied step: recorded under its source's settings
        policy = intent.replay_policy.value
        if intent.kind is IntentKind.MODEL_CALL:
            recorded = self.snapshot.get(MODEL_POLICY_KEY)
            if recorded is not None and recorded != policy:
                return (
                    f"{name} has replay policy {policy!r}, but the run's snapshot says "
                    f"{MODEL_POLICY_KEY} = {recorded!r}"
                )
            return None
        expected = self.action_policies.get(intent.call_index)
        if expected is not None and expected.value != policy:
            return (
                f"{name} has replay policy {policy!r}, but the action its stored reply asks "
                f"for has policy {expected.value!r} under the run's settings"
            )
        allowed = _allowed_action_policies(self.snapshot)
        if allowed is not None and policy not in allowed:
            return (
                f"{name} has replay policy {policy!r}, but the run's snapshot declares no tool "
                f"with that policy (allowed: {', '.join(sorted(allowed))})"
            )
        return None

    def _model_result(self, result: ModelCallResult) -> str | None:
        name = f"model call result {result.result_id!r}"
        line = self.intent_lines.get(result.result_id)
        if line is None or not result.result_id.startswith("m"):
            return f"{name} has no model-call intent before it"
        if result.result_id in self.result_ids:
            return f"two model call results carry {result.result_id!r}"
        self.result_ids.add(result.result_id)
        if result.result_id != model_result_id(self.next_idx) or self.phase != "intent":
            return f"{name} is out of write order (step {self.next_idx} is the open step)"
        self.phase = "failed" if result.reply is None else "reply"
        return None

    def _step(self, completed: StepCompleted) -> str | None:
        idx = self.next_idx
        got = completed.step.step_idx
        if got != idx:
            return f"step record number {idx} carries step_idx {got}"
        if self.phase in ("", "intent"):
            return f"step {idx} is complete but its model call has no result"
        if self.phase == "action":
            if completed.result_id is None:
                return f"step {idx} has an action intent but a step record without one"
            if completed.result_id != action_result_id(idx):
                return f"step {idx} carries result id {completed.result_id!r}"
        elif completed.result_id is not None:
            if completed.result_id == action_result_id(idx):
                return f"step {idx} has an action result but no action intent"
            return f"step {idx} carries result id {completed.result_id!r}"
        problem = self._settled_outcome_problem(completed, idx) or self._decided_step_problem(
            completed, idx
        )
        if problem is not None:
            return problem
        self.steps.append(completed)
        self.next_idx += 1
        self.phase = ""
        self.settled = None
        self.approval = self.decision = None
        return None

    def _decided_step_problem(self, completed: StepCompleted, idx: int) -> str | None:
        """A call that waited for approval has its step only after the decision, and a rejected
        one was never executed (design 0210)."""
        if self.approval is None:
            return None
        if self.decision is None:
            return f"step {idx} is complete, but its call still waits for approval"
        return None

    def _settlement(self, settlement: Settlement, line: int) -> str | None:
        """A settlement names the open action: announced, the last execution, no result yet;
        after an ``executed`` one, the execution is not settled again (design 0206)."""
        result_id = settlement.result_id
        name = (
            f"the settlement of {result_id!r} ({settlement.verdict.value}, by "
            f"{settlement.source.value} {settlement.by!r})"
        )
        if result_id not in self.intent_lines:
            return f"{name} names no intent: no execution {result_id!r} was in doubt"
        if result_id.startswith("m"):
            return (
                f"{name} names a model call; only an action in doubt is settled (a model call "
                "in doubt is called again or stops the run)"
            )
        if self.phase != "action" or result_id != action_result_id(self.next_idx):
            return (
                f"{name} names an execution that was not in doubt: its result is in the log "
                f"(step {self.next_idx} is the open step)"
            )
        previous = self.settled
        if previous is not None and previous.verdict is SettlementVerdict.EXECUTED:
            return (
                f"two resolutions of {result_id!r}: {name} follows the executed settlement on "
                f"line {self.settled_line}, after which only the step's record may follow"
            )
        if previous is not None and previous.verdict is SettlementVerdict.NOT_EXECUTED:
            # The verdict licensed one retry, which is announced again before it runs; a
            # second verdict first would let the count of verdicts outrun the attempts.
            return (
                f"two resolutions of {result_id!r}: {name} follows the not-executed settlement "
                f"on line {self.settled_line}, after which only the action's retry may follow"
            )
        self.settled = settlement
        self.settled_line = line
        return None

    def _settled_outcome_problem(self, completed: StepCompleted, idx: int) -> str | None:
        """An outcome says ``settled_by`` exactly when an ``executed`` settlement of its action
        came before it, and then it is that settlement's: executed, the same observation."""
        outcome = completed.action_outcome
        if outcome is None:
            return None
        settled = self.settled
        if settled is None or settled.verdict is not SettlementVerdict.EXECUTED:
            if outcome.settled_by is None:
                return None
            last = "no settlement" if settled is None else f"a {settled.verdict.value} settlement"
            return (
                f"step {idx}'s outcome says it was settled by {outcome.settled_by!r}, but "
                f"{last} of {completed.result_id!r} precedes it (only an executed one does)"
            )
        where = f"step {idx}'s outcome after the executed settlement on line {self.settled_line}"
        if outcome.settled_by is None:
            return f"{where} does not say it was settled (settled_by is null)"
        if outcome.status is not ActionStatus.EXECUTED:
            return f"{where} has status {outcome.status.value}, not executed"
        if outcome.observation != settled.observation:
            return f"{where} has another observation than the settlement's"
        return None

    def _finished(self, finished: RunFinished, line: int) -> str | None:
        result = finished.result
        if result.run_id != self.run_id:
            return f"the RunFinished record's result belongs to run {result.run_id!r}"
        logged = tuple(completed.step for completed in self.steps)
        count = len(result.steps)
        # A cancellation can land while a step record is being written: that step is in the
        # log before the finish but not in the cancelled result. Nothing else can differ.
        missing = len(logged) - count
        allowed = 1 if result.stop_reason is StopReason.CANCELLED else 0
        if result.steps != logged[:count] or not 0 <= missing <= allowed:
            return (
                f"the RunFinished record's result holds {count} steps that do not match the "
                f"{len(logged)} step records before it"
            )
        if self.phase in ("intent", "action") and self.open_intent is not None:
            problem = _unanswered_at_finish(self.open_intent, result.stop_reason)
            if problem is not None:
                return problem
            settled = self.settled
            executed = settled is not None and settled.verdict is SettlementVerdict.EXECUTED
            # A cancellation can fall in between; and a parser that now breaks on the stored
            # reply (design 0161) leaves no way to write the step record.
            explained = (StopReason.CANCELLED, StopReason.PARSER_ERROR)
            if executed and result.stop_reason not in explained:
                return (
                    f"the action {self.open_intent.result_id!r} was settled as executed on line "
                    f"{self.settled_line}, but the run finished ({result.stop_reason.value}) "
                    "without its step record; only a cancellation or a parser breach can fall "
                    "in between"
                )
        self.finished_line = line
        return None


_MARKED_PLANS = frozenset(
    action.value
    for action in ResumeAction
    if action
    not in {
        ResumeAction.FRESH,
        ResumeAction.CORRUPT,
        ResumeAction.ALREADY_FINISHED,
        ResumeAction.AWAITING_APPROVAL,
    }
)
"""The plans after which a resume writes a record that carries its mark (design 0215): every
``ResumeAction`` but fresh, corrupt, already finished and ``awaiting_approval`` (which writes
nothing). ``stop_unknown`` writes only a ``RunFinished`` (a model call in doubt), so only that
record may carry a mark with that plan."""


_STOPPED_PLANS: Final = {
    StopReason.RESUME_STATE_UNKNOWN: ResumeAction.STOP_UNKNOWN.value,
    StopReason.AWAITING_APPROVAL: ResumeAction.AWAITING_APPROVAL.value,
    StopReason.RETRIES_EXHAUSTED: ResumeAction.REPLAY_LAST_ACTION.value,
}
"""The plan of a resume that stopped again, open, by the stop it reports (``ResumeStopped``,
design 0231): the only marks with the plan ``awaiting_approval``, and besides a
``RunFinished``'s the only ones with ``stop_unknown``. ``retries_exhausted`` is reported by a
resume that ran the action in doubt again without announcing it (``replay_last_action``: every
other plan that reaches the action writes an intent first, which carries the mark)."""


def _marked_step(record: LogRecord) -> int | None:
    """The step of a record that can carry a resume mark (``None``: a ``RunFinished``, or a
    model result whose id does not follow the scheme, which another rule reports)."""
    if isinstance(record, Intent):
        return record.call_index
    if isinstance(record, StepCompleted):
        return record.step.step_idx
    if isinstance(record, ApprovalRequest):
        return record.step_idx
    if isinstance(record, ModelCallResult):
        digits = record.result_id[1:]
        return int(digits) if digits.isascii() and digits.isdigit() else None
    return None


def _resume_mark_problem(record: LogRecord) -> str | None:
    """A resume mark (schema 1.8) names a plan that writes something, and a step no later
    than the record that carries it (a resume writes its first record at or after its entry
    step)."""
    mark = getattr(record, "resumed", None)
    if mark is None:
        return None
    name = f"a {_kind(record)} record"
    if isinstance(record, ResumeStopped):
        # A resume that stopped again, waiting (schema 1.9, design 0231): its plan is the
        # stop it reports.
        expected = _STOPPED_PLANS.get(record.stop_reason)
        if mark.plan != expected:
            return (
                f"{name} reports {record.stop_reason.value} but carries a resume mark with plan "
                f"{mark.plan!r}, not {expected!r}"
            )
        return None
    if mark.plan not in _MARKED_PLANS or (
        mark.plan == ResumeAction.STOP_UNKNOWN.value and not isinstance(record, RunFinished)
    ):
        return f"{name} carries a resume mark with plan {mark.plan!r}, which never writes one"
    step = _marked_step(record)
    if step is not None and mark.step_idx > step:
        return (
            f"{name} carries a resume mark that entered at step {mark.step_idx}, after its own "
            f"step {step}"
        )
    return None


def check_log(
    log: RunLog,
    run_id: str,
    *,
    action_policies: Mapping[int, ReplayPolicy] | None = None,
) -> LogBreach | None:
    """Return the first record of ``log`` that the library could not have written, or ``None``.

    Pure and total: any ``RunLog`` of decoded records gives an answer, never an exception.
    The records are checked in write order (``log.entries``; when a store kept none, the
    per-kind tuples in the order the library writes them, and the breach names no line).
    The rules, each a sentence of the write-ahead discipline:

    * every record belongs to ``run_id``; the first record is the one ``RunStarted``; a
      record kind with no rule of its own below (one added to ``polyloop.types.RECORDS``,
      design 0220) obeys these and the resume-mark rule, and nothing else;
    * at most one ``RunFinished``, and nothing after it; its result's steps are the step
      records before it (a ``CANCELLED`` result may lack the very last one: the cancellation
      can arrive while that step's record is being written);
    * steps are contiguous from 0, and each step's records come in write order: model
      intent, model result, then (after a reply, never after a failure) an action intent, then
      the ``StepCompleted``, whose ``result_id`` is the action's exactly when one was announced;
    * every intent follows the id scheme (``m<step>``/``a<step>``), no result id is announced
      twice, no result comes without its intent; an intent without its result may only be the
      last execution of the log (followed by nothing, or by the ``RunFinished``), and before a
      ``RunFinished`` only when its stop reason explains it (``UNANSWERED_AT_FINISH``:
      ``CANCELLED``, ``RESUME_STATE_UNKNOWN`` for a ``NEVER`` intent, ``ACTION_TIMEOUT``,
      ``PARSER_ERROR`` or ``TREE_LIMIT`` for an action intent);
    * a ``Settlement`` (schema 1.7, design 0206) names the action in doubt: the open step's
      action intent, announced, the last execution, without its result. One that names no
      intent, a model call, or an execution whose result is in the log was not in doubt.
      Settlements of one execution may follow each other while the verdicts are
      ``not_executed`` or ``unknown`` (it is retried, or asked again); after an ``executed``
      one only that step's ``StepCompleted`` may follow (a second settlement is "two
      resolutions"), or a ``CANCELLED`` finish (the cancellation fell between the two
      writes). An action in doubt may still end an unfinished log after its settlements
      (the run is parked in doubt), and a finish after them is judged as above;
    * an action outcome's ``settled_by`` is set exactly when an ``executed`` settlement of its
      action precedes its ``StepCompleted``, and then the outcome is ``executed`` with the
      settlement's observation;
    * an ``ApprovalRequest`` (design 0210) names the open step's action (``a<step>``, its
      ``step_idx``), follows that step's model reply (not a failed call, not an action
      intent) and is the only one of its step; a decision (a ``Settlement`` with verdict
      ``approved`` or ``rejected``) answers that request, names its digest, comes before the
      action intent and is the only one. An action intent after a request needs an
      ``approved`` decision (after ``rejected`` the call must never execute: no intent, so
      its step has no action), and the step is recorded only after the decision. A request
      may end an unfinished log (the run is parked awaiting approval);
    * a model-call intent's replay policy equals the snapshot's ``request.model_replay_policy``;
      an action intent's policy is one the snapshot declares (``never`` or a registry tool's
      ``action_executor.tool.<name>.replay_policy``) and, for the steps in
      ``action_policies`` (step index -> the policy the library assigns to the action that
      step's stored reply asks for, computed by the caller), exactly that policy; a fork's
      copied steps (before its ``RunStarted.fork.step_idx``, design 0239) are exempt: they
      were recorded under the source's settings;
    * a resume mark (schema 1.8, design 0215), on whichever record a resume wrote first,
      names a plan after which a resume writes something (``_MARKED_PLANS``; ``stop_unknown``
      only on a ``RunFinished``) and a step no later than the record's own step.
    """
    entries = log.entries if log.entries else _canonical_entries(log)
    checker = _Checker(run_id, action_policies)
    for entry in entries:
        detail = checker.check(entry)
        if detail is not None:
            return LogBreach(line=entry.line if log.entries else None, detail=detail)
    return None


def plan_resume(
    log: RunLog,
    run_id: str,
    *,
    action_policies: Mapping[int, ReplayPolicy] | None = None,
) -> ResumePlan:
    """Classify ``log`` (the log of ``run_id``) into a ``ResumePlan``.

    ``check_log`` runs first (with ``action_policies``): a breach is a ``CORRUPT`` plan whose
    ``breach`` names the line, for finished runs too. The checks after it read the per-kind
    tuples (``check_log`` read ``entries`` when the store kept them) in this order, and the
    first contradiction is a ``CORRUPT`` plan's ``detail``: the run's identity, the step
    numbering, the intents, the model results, the step records. Only then is the first step
    without a step record classified (``_open_step_plan``).
    """
    if log.is_empty:
        return ResumePlan(action=ResumeAction.FRESH, detail="no record exists for this run id")
    breach = check_log(log, run_id, action_policies=action_policies)
    if breach is not None:
        return ResumePlan(
            action=ResumeAction.CORRUPT,
            next_step_idx=len(log.steps),
            detail=str(breach),
            breach=breach,
        )
    problem = _identity_problem(log, run_id)
    if problem is not None:
        return _corrupt(0, problem)
    if log.started is None:
        return _corrupt(0, "records exist but the RunStarted record is missing")
    if log.finished is not None:
        return ResumePlan(
            action=ResumeAction.ALREADY_FINISHED,
            next_step_idx=len(log.steps),
            detail="the run already has a RunFinished record",
        )

    next_idx = len(log.steps)
    problem = _step_numbering_problem(log.steps)
    if problem is not None:
        return _corrupt(next_idx, problem)
    problem, intents = _intents_by_result_id(log.intents, next_idx)
    if problem is not None:
        return _corrupt(next_idx, problem)
    problem, model_results = _model_results_by_result_id(log.model_results, intents)
    if problem is not None:
        return _corrupt(next_idx, problem)
    problem = _step_record_problem(log.steps, intents, model_results)
    if problem is not None:
        return _corrupt(next_idx, problem)
    return _open_step_plan(
        next_idx, intents, model_results, log.settlements, log.intents, log.approval_requests
    )


def _step_numbering_problem(steps: tuple[StepCompleted, ...]) -> str | None:
    """The first step record whose ``step_idx`` is not its position in the log, if any."""
    for position, completed in enumerate(steps):
        if completed.step.step_idx != position:
            return f"step record number {position} carries step_idx {completed.step.step_idx}"
    return None


def _intents_by_result_id(
    intents: tuple[Intent, ...], next_idx: int
) -> tuple[str | None, dict[str, Intent]]:
    """``(problem, intents)``: the intents by ``result_id``, or the first one that cannot be.

    An intent may be for a completed step or for the next one (``next_idx``), never for a later
    one.
    """
    by_id: dict[str, Intent] = {}
    for intent in intents:
        if not _follows_id_scheme(intent):
            return (
                f"intent {intent.result_id!r} ({intent.kind.value}, call_index "
                f"{intent.call_index}) does not follow the id scheme"
            ), {}
        if intent.result_id in by_id and not _is_retry(by_id[intent.result_id], intent):
            return f"two intents announce result {intent.result_id!r}", {}
        if intent.call_index > next_idx:
            return (
                f"intent {intent.result_id!r} is for step {intent.call_index}, but only "
                f"{next_idx} steps are complete"
            ), {}
        by_id[intent.result_id] = intent
    return None, by_id


def _is_retry(first: Intent, again: Intent) -> bool:
    """Whether ``again`` can be the write-ahead of a retry of ``first``: an action settled as
    not executed is announced again, identically, before it runs again (design 0206;
    ``check_log`` checks that a ``not_executed`` settlement stands between the two)."""
    return first.kind is IntentKind.ACTION and again == first


def _model_results_by_result_id(
    results: tuple[ModelCallResult, ...], intents: Mapping[str, Intent]
) -> tuple[str | None, dict[str, ModelCallResult]]:
    """``(problem, results)``: the model results by ``result_id``, each under a model-call
    intent (an action intent's id does not count), or the first result that breaks that."""
    by_id: dict[str, ModelCallResult] = {}
    for result in results:
        announced = intents.get(result.result_id)
        if announced is None or announced.kind is not IntentKind.MODEL_CALL:
            return f"model call result {result.result_id!r} has no model-call intent", {}
        if result.result_id in by_id:
            return f"two model call results carry {result.result_id!r}", {}
        by_id[result.result_id] = result
    return None, by_id


def _step_record_problem(
    steps: tuple[StepCompleted, ...],
    intents: Mapping[str, Intent],
    model_results: Mapping[str, ModelCallResult],
) -> str | None:
    """The first completed step whose records contradict its step record, if any.

    A completed step has its model result, and its step record carries the action's result id
    exactly when an action intent was written for that step.
    """
    for completed in steps:
        idx = completed.step.step_idx
        if model_result_id(idx) not in model_results:
            return f"step {idx} is complete but its model call has no result"
        if completed.result_id is None:
            if action_result_id(idx) in intents:
                return f"step {idx} has an action intent but a step record without one"
            continue
        if completed.result_id != action_result_id(idx):
            return f"step {idx} carries result id {completed.result_id!r}"
        if completed.result_id not in intents:
            return f"step {idx} has an action result but no action intent"
    return None


_REPLAYABLE = frozenset({ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT})


def _last_settlement(settlements: Sequence[Settlement], result_id: str) -> Settlement | None:
    return next((s for s in reversed(settlements) if s.result_id == result_id), None)


def _open_action_plan(
    next_idx: int, action_intent: Intent, settlements: Sequence[Settlement], attempts: int
) -> tuple[ResumeAction, str]:
    """The verdict on step ``next_idx``'s action, which has an intent and no result.

    ``attempts`` is how many times the action was announced (one intent, plus one per retry
    after a ``not_executed`` settlement). Settlements decide first: an ``executed`` one
    records the step; when every attempt has a ``not_executed`` settlement, the action is
    retried (announced again, then run); otherwise the last attempt is in doubt and its
    policy decides. Counting, not order, tells them apart, so a retry that died is in doubt
    again instead of being retried on the old verdict.
    """
    mine = [
        s
        for s in settlements
        if s.result_id == action_intent.result_id and not s.is_approval_decision
    ]
    last = mine[-1] if mine else None
    where = f"step {next_idx}'s action has no result"
    if last is not None and last.verdict is SettlementVerdict.EXECUTED:
        return (
            ResumeAction.RECORD_SETTLED,
            f"{where}; {last.source.value} {last.by!r} settled it as executed",
        )
    not_executed = sum(1 for s in mine if s.verdict is SettlementVerdict.NOT_EXECUTED)
    if last is not None and not_executed >= attempts:
        return (
            ResumeAction.RETRY_SETTLED,
            f"{where}; {last.source.value} {last.by!r} settled it as not executed, so it is "
            "announced again and runs now with its idempotency key",
        )
    policy = action_intent.replay_policy
    if policy in _REPLAYABLE:
        return ResumeAction.REPLAY_LAST_ACTION, f"{where} and may be repeated ({policy.value})"
    answered = (
        ""
        if last is None
        else f"; the last answer ({last.by!r}): {last.note or last.verdict.value}"
    )
    return ResumeAction.STOP_UNKNOWN, f"{where} and must not be repeated (never){answered}"


def _approval_plan(
    next_idx: int, request: ApprovalRequest, settlements: Sequence[Settlement]
) -> tuple[ResumeAction, str, Settlement | None]:
    """The verdict on step ``next_idx``'s call that waited for approval (design 0210)."""
    decision = next(
        (
            s
            for s in reversed(settlements)
            if s.is_approval_decision
            and s.result_id == request.result_id
            and s.digest == request.digest
        ),
        None,
    )
    where = f"step {next_idx}'s call of {request.tool!r} ({request.digest})"
    if decision is None:
        expiry = "" if request.expires_at is None else f", expires {request.expires_at}"
        return (
            ResumeAction.AWAITING_APPROVAL,
            f"{where} waits for approval since {request.requested_at}{expiry}",
            None,
        )
    who = f"{decision.source.value} {decision.by!r}"
    if decision.verdict is SettlementVerdict.APPROVED:
        return ResumeAction.RUN_APPROVED, f"{where} was approved by {who}", decision
    return (
        ResumeAction.RECORD_REJECTED,
        f"{where} was rejected by {who}: {decision.note}",
        decision,
    )


def _open_step_plan(
    next_idx: int,
    intents: Mapping[str, Intent],
    model_results: Mapping[str, ModelCallResult],
    settlements: Sequence[Settlement] = (),
    all_intents: Sequence[Intent] = (),
    approval_requests: Sequence[ApprovalRequest] = (),
) -> ResumePlan:
    """The plan for step ``next_idx``, the first without a step record: the module docstring's
    table, applied to its model call and then to its action.

    Every earlier step is settled (``_step_record_problem`` said so), but this step's own
    records may still contradict each other (an action intent without a model call, or after a
    failed one): that is a ``CORRUPT`` plan, not a guess.
    """
    last_model_result = model_results.get(model_result_id(next_idx - 1)) if next_idx else None
    model_intent = intents.get(model_result_id(next_idx))
    model_result = model_results.get(model_result_id(next_idx))
    action_intent = intents.get(action_result_id(next_idx))

    def plan(
        action: ResumeAction,
        detail: str,
        pending: ModelCallResult | None,
        intent: Intent | None = None,
        settlement: Settlement | None = None,
    ) -> ResumePlan:
        return ResumePlan(
            action=action,
            next_step_idx=next_idx,
            pending_model_result=pending,
            last_model_result=last_model_result,
            detail=detail,
            pending_intent=intent,
            settlement=settlement,
        )

    if model_intent is None:
        # A result without its intent was refused above, so nothing of this step exists.
        if action_intent is not None:
            return _corrupt(next_idx, f"step {next_idx} has an action intent but no model call")
        return plan(ResumeAction.CONTINUE, f"step {next_idx} has not started", None)
    if model_result is None:
        if action_intent is not None:
            return _corrupt(
                next_idx, f"step {next_idx} has an action intent but no model call result"
            )
        policy = model_intent.replay_policy
        if policy in _REPLAYABLE:
            return plan(
                ResumeAction.REDO_MODEL_CALL,
                f"step {next_idx}'s model call has no result and may be repeated ({policy.value})",
                None,
                model_intent,
            )
        return plan(
            ResumeAction.STOP_UNKNOWN,
            f"step {next_idx}'s model call has no result and must not be repeated (never)",
            None,
            model_intent,
        )
    if model_result.reply is None and action_intent is not None:
        return _corrupt(next_idx, f"step {next_idx}'s model call failed but an action followed")
    if action_intent is None:
        request = next(
            (r for r in reversed(approval_requests) if r.result_id == action_result_id(next_idx)),
            None,
        )
        if request is not None:
            action, detail, decision = _approval_plan(next_idx, request, settlements)
            return dataclasses.replace(
                plan(action, detail, model_result, settlement=decision),
                approval_request=request,
            )
        return plan(
            ResumeAction.CONTINUE_AFTER_MODEL_CALL,
            f"step {next_idx}'s model call has a result and nothing followed it",
            model_result,
        )
    settlement = _last_settlement(settlements, action_intent.result_id)
    attempts = sum(1 for i in all_intents if i.result_id == action_intent.result_id)
    action, detail = _open_action_plan(next_idx, action_intent, settlements, attempts)
    return plan(action, detail, model_result, action_intent, settlement)


# --------------------------------------------------------------------------- trees of runs
#
# A child run's id comes from the idempotency key of the call that started it (design 0245):
# a replayed call carries the same key, so it re-attaches to the same child.

_VERBATIM_KEY = re.compile(r"polyloop:r:([A-Za-z0-9._-]{1,200}):([A-Za-z0-9]{1,20})")
_SAFE_CHILD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def child_run_id(key: str) -> str:
    """The run id of the child run started by the call whose idempotency key is ``key``.

    ``<parent run id>.<result id>`` (``"root.a3"``, ``"root.a3.a1"``: a person reads the tree
    in the ids) when the key is the verbatim form (``idempotency_key``) and the id fits 200
    characters, else ``child-<40 hex digits of sha256(key)>``. Deterministic: a replayed call
    (the same key) gets the same id, every other call another. A continuation's replayed call
    keeps the key it copied, so it re-attaches to the child of the run it continues.
    """
    match = _VERBATIM_KEY.fullmatch(key)
    if match is not None:
        candidate = f"{match.group(1)}.{match.group(2)}"
        if _SAFE_CHILD_ID.fullmatch(candidate):
            return candidate
    return "child-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _lineage(logs: Mapping[str, RunLog], run_id: str) -> set[str]:
    """``run_id`` and the runs whose records it copied: the run it continues
    (``RunStarted.continues``, design 0163) or forks (``RunStarted.fork``, design 0239), and
    theirs. A copied step that ran a child names that child for the copy too."""
    seen: set[str] = set()
    waiting = [run_id]
    while waiting:
        current = waiting.pop()
        if current in seen:
            continue
        seen.add(current)
        started = logs[current].started if current in logs else None
        if started is None:
            continue
        if started.continues:
            waiting.append(started.continues)
        fork = getattr(started, "fork", None)
        if fork is not None:
            waiting.append(fork.run_id)
    return seen


def _names_child(parent: RunLog, link_step: int, key: str, child: str) -> bool:
    """Whether the parent's log names ``child`` at ``link_step``: a step whose ``child`` is
    it, or the step still open with the action intent whose key the child's id comes from."""
    for completed in parent.steps:
        if completed.step.step_idx == link_step:
            named = completed.step.child
            return named is not None and (
                named.run_id == child
                or named.run_id.startswith(child + "-c")
                or child.startswith(named.run_id + "-c")
            )
    return any(
        i.kind is IntentKind.ACTION and i.call_index == link_step and i.idempotency_key == key
        for i in parent.intents
    )


def _child_problems(
    logs: Mapping[str, RunLog], run_id: str, log: RunLog, heirs: Mapping[str, list[str]]
) -> list[str]:
    """What is wrong with the child run ``run_id``'s link to its parent (``[]``: nothing).
    ``heirs``: each run id to the runs whose lineage (``_lineage``) holds it."""
    started = log.started
    link = None if started is None else started.parent
    if link is None:
        return []
    parent = logs.get(link.run_id)
    if parent is None or parent.started is None:
        return [f"run {run_id}: its parent {link.run_id} is not in the store"]
    problems = []
    derived = child_run_id(link.idempotency_key)
    if run_id != derived and not run_id.startswith(derived + "-c"):
        problems.append(
            f"run {run_id}: its id is not the one its parent's call derives ({derived})"
        )
    above = parent.started.parent
    if link.depth != (0 if above is None else above.depth) + 1:
        problems.append(
            f"run {run_id}: depth {link.depth} under a parent at depth "
            f"{0 if above is None else above.depth}"
        )
    if not any(
        _names_child(logs[r], link.step_idx, link.idempotency_key, run_id)
        for r in heirs.get(link.run_id, ())
    ):
        problems.append(
            f"run {run_id}: its parent {link.run_id} does not name it back (no step "
            f"{link.step_idx} with this child, no open call with its key)"
        )
    return problems


def check_tree(logs: Mapping[str, RunLog]) -> tuple[str, ...]:
    """Every broken link between the runs of ``logs`` (run id to its stored log), as one line
    each, naming the run; ``()`` when every tree is whole (design 0245).

    A child run (``RunStarted.parent`` set) must have its parent in ``logs``, the id its
    parent's call derives (``child_run_id``, or a continuation of it: ``<id>-c``), the depth
    one below its parent's, and a parent that names it back: the step of the link records it
    (``StepRecord.child``), or that step is still open with the very call's action intent.
    A step that records a child (``StepRecord.child``) must find it in ``logs``, its
    ``RunStarted.parent`` naming this run (or a run this one continues or forks: a copied
    step names its source's child). Pure: no store is read; ``python -m polyloop verify``
    passes it the logs of a place.
    """
    # Each run's lineage once, and its inverse: linear in the runs of a place, not quadratic.
    lineages = {run_id: _lineage(logs, run_id) for run_id in logs}
    heirs: dict[str, list[str]] = {}
    for run_id, lineage in lineages.items():
        for source in lineage:
            heirs.setdefault(source, []).append(run_id)
    problems: list[str] = []
    for run_id, log in logs.items():
        problems += _child_problems(logs, run_id, log, heirs)
        lineage = lineages[run_id]
        for completed in log.steps:
            child = completed.step.child
            if child is None:
                continue
            found = logs.get(child.run_id)
            link = None if found is None or found.started is None else found.started.parent
            if found is None:
                problems.append(
                    f"run {run_id}: step {completed.step.step_idx} names the "
                    f"child {child.run_id}, which is not in the store"
                )
            elif link is None or link.run_id not in lineage:
                problems.append(
                    f"run {run_id}: step {completed.step.step_idx} names the "
                    f"child {child.run_id}, whose start names another parent"
                )
    return tuple(problems)
