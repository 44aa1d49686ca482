"""One run, as every inspector output shows it: a ``RunView`` built from its decoded records.

``view_run`` is the single interpretation of a log that ``show``, ``ls``, ``diff`` and ``html``
render; none of them reads records on its own, so the transcript, the list and the HTML page
cannot disagree about what a step was or what resume would do.

A step's view joins the records of step ``n`` by the library's result-id scheme (``m<n>`` is its
model call, ``a<n>`` its action): the model-call intent and result, the action intent, and the
``StepCompleted`` record. A step whose ``StepCompleted`` is missing is shown as *incomplete*
(what a crash or a kill leaves); the run's resume plan says what ``resume`` would do with it.

A ``Settlement`` (schema 1.7, design 0206: the verdict of a reconciler or a person on an
execution that was in doubt) belongs to the step its result id names; a step whose outcome came
from one says so (``settled_by``). An unfinished run whose plan is ``STOP_UNKNOWN`` is *in
doubt*: ``RunView.in_doubt`` names the execution, its idempotency key, what the stored reply
asked for, the last answer a reconciler gave, and the ``python -m polyloop resolve`` commands
that settle it.

The log keeps no wall-clock timestamps (only each step's ``step_wall_ms``) and, of the prompt,
only each step's ``prompt_chars`` and, since schema 1.8, the run's context (``RunStarted.
context``: the run-level instructions and the goal-level question, unless the run was started
with ``record_context=False``; ``RunView.context``). A view shows what the log has and says so,
it never reconstructs what the log does not hold. Settlements and resume marks are the records
with a time (``at``).

A resume (schema 1.8, design 0215) marks the first record it writes, whatever its kind (an
intent, a model call result redone under the intent on record, a step record, an approval
request, the run's finish; the ``resumed`` field): when, the plan it followed, the step it
entered at and its lease epoch. ``RunView.resumes`` lists them in file order and each is also
on the step it entered at (``StepView.resumed``). A resume that stopped again, open, and wrote
nothing that carries a mark (nothing, or only an executor's ``unknown`` settlements before
``retries_exhausted``) leaves its mark on a ``ResumeStopped`` record (schema 1.9, design 0231;
``ResumeView.stopped``). A log older than 1.8 has no marks, and in a 1.8 log such a resume left
none; the view never guesses one.

A step whose call was rejected (a ``rejected`` decision on its request) is ``StepKind.REJECTED``,
not a final answer: no action, its observation the rejection the model read.

An ``ApprovalRequest`` (design 0210: a call that waits for a person's approval) belongs to its
step (``StepView.approval``); an approval decision is a ``Settlement`` whose verdict is
``approved`` or ``rejected`` and whose ``digest`` names the call. An unfinished run whose plan
is ``AWAITING_APPROVAL`` is *awaiting approval*: ``RunView.awaiting`` names the request and the
``python -m polyloop approve``/``reject`` commands that decide it.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath

from polyloop._common import money_text
from polyloop.errors import PolyloopValueError
from polyloop.ports import LogEntry, LogRecord, RunLog
from polyloop.session import Pricing, ResumeAction, ResumePlan, plan_resume
from polyloop.stores import assemble_log
from polyloop.types import (
    ApprovalRequest,
    Context,
    ForkOrigin,
    Intent,
    IntentKind,
    ModelCallResult,
    ResumeMark,
    ResumeStopped,
    RunFinished,
    RunStarted,
    Settlement,
    StepCompleted,
    StepRecord,
    Usage,
)

__all__ = [
    "ApprovalView",
    "Awaiting",
    "InDoubt",
    "ResumeView",
    "RunView",
    "SettlementView",
    "StepKind",
    "StepView",
    "approval_command_lines",
    "approval_commands",
    "priced_run",
    "resolve_command_lines",
    "resolve_commands",
    "resume_sentence",
    "step_index",
    "view_run",
]


class StepKind(enum.Enum):
    """What a step turned out to be (``INCOMPLETE``: its ``StepCompleted`` record is missing)."""

    ACTION = "action"
    REJECTED = "rejected"
    """The step's call waited for approval and was rejected (by a person, or as expired): no
    action, and the observation is the rejection the model read (design 0210; shown as such
    since design 0231, where it had been taken for a final answer)."""
    FINAL_ANSWER = "final_answer"
    PARSE_FAILURE = "parse_failure"
    MODEL_FAILURE = "model_failure"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True, kw_only=True)
class SettlementView:
    """One ``Settlement`` record: the verdict on an execution that was in doubt.

    ``line`` is its 1-based source line; ``step_idx`` the step its ``result_id`` names
    (``None`` for an id outside the ``m<n>``/``a<n>`` scheme). ``verdict`` is ``executed``,
    ``not_executed`` or ``unknown``; ``source`` is ``person`` or ``reconciler``; ``by`` who
    (a person's name, or the tool whose reconciler answered); ``at`` when (ISO 8601, UTC);
    ``note`` the person's note, or for ``unknown`` the reason nobody could tell.
    """

    line: int
    step_idx: int | None
    result_id: str
    verdict: str
    source: str
    by: str
    at: str
    observation: str | None
    note: str
    digest: str | None = None
    """For an approval decision (``approved``, ``rejected``): the digest of the call."""

    @property
    def who(self) -> str:
        """``"person 'alice'"`` or ``"reconciler 'pay'"``."""
        return f"{self.source} {self.by!r}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeView:
    """One resume, from the mark on the first record it wrote (``resumed``, of whatever kind).

    ``step_idx`` is the step it entered at, ``plan`` the ``ResumeAction`` value it followed,
    ``at`` when (ISO 8601, UTC), ``epoch`` its lease's fencing epoch (``None``: no lease);
    ``line`` is the 1-based line of the record that carries the mark, ``result_id`` its result
    id (``None`` for a step record without an action and for the run's finish), ``carrier``
    that record in words (``"intent m3"``, ``"model call result m3"``, ``"run finish record"``).
    """

    line: int
    result_id: str | None
    carrier: str
    step_idx: int
    plan: str
    at: str
    epoch: int | None
    stopped: str | None = None
    """For a resume that stopped again, open, and wrote no record that carries a mark (a
    ``ResumeStopped`` record, schema 1.9, design 0231): the stop reason it returned;
    ``None`` otherwise."""

    @property
    def words(self) -> str:
        """``"resumed at 2026-12-01T10:00:00.000+00:00 (lease epoch 2): replay_last_action"``;
        for a resume that stopped again: ``"...: stopped again as resume_state_unknown (an
        action in doubt that nothing settled), nothing called or executed"`` (for
        ``retries_exhausted``: ``"..., the action was tried again"``)."""
        epoch = f" (lease epoch {self.epoch})" if self.epoch is not None else ""
        if self.stopped is not None:
            why = _STOPPED_WORDS.get(self.stopped, self.stopped)
            done = (
                "the action was tried again"
                if self.stopped == "retries_exhausted"
                else "nothing called or executed"
            )
            return f"resumed at {self.at}{epoch}: stopped again as {self.stopped} ({why}), {done}"
        return f"resumed at {self.at}{epoch}: {self.plan.replace('_', ' ')}"


_STOPPED_WORDS = {
    "resume_state_unknown": "an action in doubt that nothing settled",
    "awaiting_approval": "a call still waiting for a person's decision",
    "retries_exhausted": (
        "the action's outcome stayed unknown after every attempt; running again tries it again"
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalView:
    """One ``ApprovalRequest`` record: a call that waits (or waited) for a person's approval.

    ``arguments`` is the canonical JSON exactly as digested; ``digest`` is what a decision
    names; ``requested_at`` and ``expires_at`` (``None``: never) are ISO 8601, UTC; ``line`` is
    the record's 1-based source line.
    """

    line: int
    step_idx: int
    result_id: str
    tool: str
    tool_call_id: str | None
    arguments: str
    digest: str
    requested_at: str
    expires_at: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Awaiting:
    """The call an unfinished run waits on: its plan is ``AWAITING_APPROVAL`` (a request and no
    decision). ``commands`` are the ``python -m polyloop approve`` and ``reject`` command lines
    (``NAME`` and ``TEXT`` to fill in); ``note`` says anything else a person must know first."""

    request: ApprovalView
    commands: tuple[str, str]
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class InDoubt:
    """The execution an unfinished run is stuck on: its plan is ``STOP_UNKNOWN`` (an intent
    whose replay policy is ``never``, no result, and no settlement that decides it).

    ``kind`` is ``"action"`` or ``"model_call"``; only an action can be settled, and then
    ``commands`` are the two ``python -m polyloop resolve`` command lines (executed, not
    executed) with ``TEXT`` and ``NAME`` to fill in. ``idempotency_key`` is the one its intent
    records (``None`` for intents written before schema 1.7): the key to look up in the tool's
    own system. ``tool_calls`` and ``reply`` are what the step's stored reply asked for (the
    action's own text is logged only with its step record, which is missing).
    ``last_answer`` is its last settlement, if any: a reconciler's ``unknown``, or a
    ``not_executed`` verdict whose execution died in doubt again;
    ``note`` says anything else a person must know first (empty otherwise).
    """

    step_idx: int
    result_id: str
    kind: str
    replay_policy: str
    idempotency_key: str | None
    tool_calls: tuple[tuple[str, str, str], ...]
    reply: str | None
    last_answer: SettlementView | None
    commands: tuple[str, ...]
    note: str = ""

    @property
    def settleable(self) -> bool:
        """Whether a person can settle it (``resolve``): an action can, a model call cannot."""
        return self.kind == IntentKind.ACTION.value


@dataclass(frozen=True, slots=True, kw_only=True)
class StepView:
    """Everything the log says about one step, joined across its records.

    ``reply`` is the model's full text from the ``ModelCallResult`` (``None`` when there is no
    result or the call failed); ``history_text`` is what the parser put back into the prompt
    history (``StepRecord.raw_output``), which may differ from the reply. ``lines`` are the
    1-based source lines of every record of the step, in file order.
    """

    idx: int
    kind: StepKind
    lines: tuple[int, ...]
    model_policy: str | None
    reply: str | None
    thinking: str
    failure: str | None
    call_id: str | None
    history_text: str | None
    parse_error: str | None
    action: str | None
    action_policy: str | None
    action_status: str | None
    observation: str | None
    observation_is_synthetic: bool
    observation_truncated_chars: int
    env_reported_completion: bool
    prompt_chars: int | None
    wall_ms: int | None
    pending: str
    """For an incomplete step, what is missing, in words; empty otherwise."""
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    """The reply's native tool calls as ``(id, name, arguments)``, in the model's order."""
    usage: str | None = None
    """The reply's token usage in words (``"812 prompt (512 cached) + 40 completion tokens"``)."""
    finish_reason: str | None = None
    model_ms: int | None = None
    action_ms: int | None = None
    idempotency_key: str | None = None
    """The key the action's intent records (``None``: no action intent, or one written before
    schema 1.7)."""
    settled_by: str | None = None
    """For an action whose outcome came from a settlement: ``"reconciler"`` or
    ``"person:<name>"``."""
    settlements: tuple[SettlementView, ...] = ()
    """The settlements of this step's action, in file order."""
    approval: ApprovalView | None = None
    """The step's request for approval, when its call needed one."""
    resumed: ResumeView | None = None
    """The resume that entered the run at this step (the last one, if several did)."""
    tokens: tuple[int, int] | None = None
    """The reply's ``(prompt, completion)`` tokens, when the endpoint reported usage."""
    cost: Decimal | None = None
    """The step's cost (design 0236): as recorded (schema 1.9, a run with pricing), or as
    ``priced_run`` computed it from the usage on read; ``None`` when unknown."""
    reported_usage: Usage | None = None
    """The reply's usage as reported, which ``priced_run`` prices."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView:
    """One run's log, interpreted once.

    ``run_id`` is the id the records carry (a renamed file keeps its run's id).
    ``stop_reason`` is the finish record's value, or ``None`` for an unfinished run (then
    ``resume`` says what ``polyloop.session.resume`` would do, from ``plan``). ``duration_ms``
    is the sum of the steps' ``step_wall_ms`` (the log has no timestamps). ``model_calls``
    counts model-call intents (a redone call re-uses its intent, so it counts once).
    """

    run_id: str
    source: str
    line_count: int
    torn_bytes: int
    snapshot: Mapping[str, str]
    steps: tuple[StepView, ...]
    stop_reason: str | None
    final_answer: str | None
    event_delivery_failures: int | None
    plan: ResumePlan
    resume: str | None
    actions: int
    model_calls: int
    duration_ms: int
    stop_detail: str | None = None
    """Which limit and which call stopped a ``tree_limit`` run (design 0245), else ``None``."""
    log: RunLog
    settlements: tuple[SettlementView, ...] = ()
    """Every settlement of the run, in file order (each also on its step's view)."""
    in_doubt: InDoubt | None = None
    """For an unfinished run whose plan is ``STOP_UNKNOWN``: the execution in doubt."""
    approval_requests: tuple[ApprovalView, ...] = ()
    """Every approval request of the run, in file order (each also on its step's view)."""
    awaiting: Awaiting | None = None
    """For an unfinished run whose plan is ``AWAITING_APPROVAL``: the call it waits on."""
    context: Context | None = None
    """The run's context as ``RunStarted`` recorded it (schema 1.8): ``None`` when the run was
    started with ``record_context=False`` or the log is older."""
    resumes: tuple[ResumeView, ...] = ()
    """Every resume mark of the run, in file order (each also on the step it entered at)."""

    @property
    def fork(self) -> ForkOrigin | None:
        """Where the run was forked from (schema 1.9, design 0239): ``None`` for a run that
        is no fork."""
        started = self.log.started
        return None if started is None else started.fork

    @property
    def forked_from(self) -> str | None:
        """``"<source> at step <k>"``, then each earlier source (``<-``), for a fork."""
        if self.fork is None:
            return None
        return " <- ".join(f"{o.run_id} at step {o.step_idx}" for o in self.fork.lineage)

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def completed_steps(self) -> int:
        """Steps with a ``StepCompleted`` record (an incomplete last step is not counted)."""
        return sum(1 for step in self.steps if step.kind is not StepKind.INCOMPLETE)

    @property
    def status(self) -> str:
        """The stop reason's value, or ``"unfinished"``."""
        return self.stop_reason if self.stop_reason is not None else "unfinished"

    @property
    def cost(self) -> Decimal | None:
        """The sum of the steps' known costs (design 0236); ``None`` when no step has one."""
        costs = [step.cost for step in self.steps if step.cost is not None]
        return sum(costs, Decimal(0)) if costs else None

    @property
    def cost_text(self) -> str | None:
        """``cost`` as its decimal string, ``">="`` before it when some completed step's cost
        is unknown (its endpoint reported no usage, or a fork copied it from a run without
        prices); ``None`` when no step has a cost."""
        cost = self.cost
        if cost is None:
            return None
        partial = any(s.cost is None and s.kind is not StepKind.INCOMPLETE for s in self.steps)
        return (">=" if partial else "") + money_text(cost)


def priced_run(view: RunView, pricing: Pricing) -> RunView:
    """``view`` with a cost on every step that reported usage but recorded none (a log written
    before schema 1.9, or a run without pricing), at ``pricing``'s prices for the run's model
    (``model_client.model`` in its snapshot, else ``"*"``). A run whose model ``pricing`` does
    not price is returned unchanged: its costs stay unknown."""
    try:
        prices = pricing.for_model(view.snapshot.get("model_client.model"))
    except PolyloopValueError:
        return view
    steps = tuple(
        dataclasses.replace(step, cost=prices.cost(step.reported_usage))
        if step.cost is None and step.reported_usage is not None
        else step
        for step in view.steps
    )
    return dataclasses.replace(view, steps=steps)


def resume_sentence(plan: ResumePlan) -> str:
    """What ``resume`` would do under ``plan``, as one sentence (``detail`` says why)."""
    step = plan.next_step_idx
    what = {
        ResumeAction.FRESH: "resume would refuse (RunIdentityError): there is nothing to resume",
        ResumeAction.ALREADY_FINISHED: "resume would return the stored result and do nothing",
        ResumeAction.CONTINUE: f"resume would start step {step} normally",
        ResumeAction.CONTINUE_AFTER_MODEL_CALL: (
            f"resume would parse step {step}'s stored reply and go on (nothing is called again)"
        ),
        ResumeAction.REDO_MODEL_CALL: f"resume would call the model again for step {step}",
        ResumeAction.REPLAY_LAST_ACTION: f"resume would execute step {step}'s action again",
        ResumeAction.RETRY_SETTLED: (
            f"resume would announce step {step}'s action again and execute it, with its key"
        ),
        ResumeAction.RECORD_SETTLED: (
            f"resume would record step {step} with the settlement's observation and execute nothing"
        ),
        ResumeAction.STOP_UNKNOWN: (
            "resume would stop the run as resume_state_unknown without executing anything "
            "(and leave it unfinished)"
        ),
        ResumeAction.CORRUPT: "resume would refuse the log (LogCorruptError)",
        ResumeAction.AWAITING_APPROVAL: (
            f"resume would stop the run as awaiting_approval again, calling and executing "
            f"nothing, until a person decides step {step}'s call (or, once its expires_at has "
            "passed, reject it as expired and go on)"
        ),
        ResumeAction.RUN_APPROVED: (
            f"resume would announce step {step}'s approved call and execute it under its "
            "replay policy"
        ),
        ResumeAction.RECORD_REJECTED: (
            f"resume would record step {step} with the rejection as its observation (the call "
            "never executes) and go on"
        ),
    }[plan.action]
    return f"{what}: {plan.detail}" if plan.detail else what


def _caveat(plan: ResumePlan) -> str:
    if plan.action in (
        ResumeAction.CONTINUE,
        ResumeAction.CONTINUE_AFTER_MODEL_CALL,
        ResumeAction.REDO_MODEL_CALL,
        ResumeAction.REPLAY_LAST_ACTION,
        ResumeAction.RETRY_SETTLED,
        ResumeAction.RECORD_SETTLED,
        ResumeAction.STOP_UNKNOWN,
        ResumeAction.AWAITING_APPROVAL,
        ResumeAction.RUN_APPROVED,
        ResumeAction.RECORD_REJECTED,
    ):
        if plan.next_step_idx == 0:
            return (
                " (resume first checks the agent's settings for drift; that needs its definition)"
            )
        return (
            f" (resume first checks the agent's settings for drift and whether step "
            f"{plan.next_step_idx - 1} already met a stop condition; both need its definition)"
        )
    return ""


def view_run(
    run_id: str, source: str, records: Sequence[LogEntry], *, torn_bytes: int = 0
) -> RunView:
    """Interpret the decoded ``records`` of ``run_id``'s log, read from ``source``."""
    log = assemble_log((n.record for n in records), lines=(n.line for n in records))
    plan = plan_resume(log, run_id)
    by_step: dict[int, list[LogEntry]] = {}
    intents: dict[str, Intent] = {}
    results: dict[str, ModelCallResult] = {}
    completed: dict[int, StepCompleted] = {}
    snapshot: Mapping[str, str] = {}
    finished: RunFinished | None = None
    settlements: list[SettlementView] = []
    requests: list[ApprovalView] = []
    resumes: list[ResumeView] = []
    context: Context | None = None
    for numbered in records:
        record = numbered.record
        idx: int | None = None
        if getattr(record, "resumed", None) is not None:  # any kind a resume writes first
            resumes.append(_resume_view(record, numbered.line))
        if isinstance(record, RunStarted):
            snapshot = record.parameter_snapshot
            context = record.context
        elif isinstance(record, Intent):
            intents.setdefault(record.result_id, record)
            idx = record.call_index
        elif isinstance(record, ModelCallResult):
            results.setdefault(record.result_id, record)
            idx = step_index(record.result_id)
        elif isinstance(record, StepCompleted):
            completed.setdefault(record.step.step_idx, record)
            idx = record.step.step_idx
        elif isinstance(record, Settlement):
            settlements.append(_settlement_view(record, numbered.line))
            # One that names no step of this log is shown on its own (verify names the breach).
            idx = settlements[-1].step_idx if settlements[-1].step_idx in by_step else None
        elif isinstance(record, ApprovalRequest):
            requests.append(_approval_view(record, numbered.line))
            idx = record.step_idx
        elif isinstance(record, RunFinished):
            finished = record
        elif isinstance(record, ResumeStopped):
            idx = step_index(record.result_id)  # on the step it stopped at (design 0231)
        if idx is not None:
            by_step.setdefault(idx, []).append(numbered)
    steps = tuple(
        _step_view(idx, by_step[idx], intents, results, completed.get(idx), settlements, requests)
        for idx in sorted(by_step)
    )
    steps = _with_resumes(steps, resumes)
    model_calls = sum(1 for i in intents.values() if i.kind is IntentKind.MODEL_CALL)
    actions = sum(1 for s in steps if s.action is not None)
    duration = sum(s.wall_ms or 0 for s in steps)
    resume = None if finished is not None else resume_sentence(plan) + _caveat(plan)
    return RunView(
        run_id=run_id,
        source=source,
        line_count=max((n.line for n in records), default=0),
        torn_bytes=torn_bytes,
        snapshot=snapshot,
        steps=steps,
        stop_reason=None if finished is None else finished.result.stop_reason.value,
        final_answer=None if finished is None else finished.result.final_answer,
        stop_detail=None if finished is None else finished.result.stop_detail,
        event_delivery_failures=(
            None if finished is None else finished.result.event_delivery_failures
        ),
        plan=plan,
        resume=resume,
        actions=actions,
        model_calls=model_calls,
        duration_ms=duration,
        log=log,
        settlements=tuple(settlements),
        in_doubt=None if finished is not None else _in_doubt(run_id, source, plan, steps),
        approval_requests=tuple(requests),
        awaiting=None if finished is not None else _awaiting(run_id, source, plan, requests),
        context=context,
        resumes=tuple(resumes),
    )


def _with_resumes(
    steps: tuple[StepView, ...], resumes: Sequence[ResumeView]
) -> tuple[StepView, ...]:
    """``steps`` with each resume on the step it entered at (the last, if several did)."""
    entered = {resume.step_idx: resume for resume in resumes}
    return tuple(
        dataclasses.replace(step, resumed=entered[step.idx]) if step.idx in entered else step
        for step in steps
    )


def _resume_view(record: LogRecord, line: int) -> ResumeView:
    mark = getattr(record, "resumed", None)
    assert isinstance(mark, ResumeMark)
    return ResumeView(
        line=line,
        result_id=getattr(record, "result_id", None),
        carrier=_carrier(record),
        step_idx=mark.step_idx,
        plan=mark.plan,
        at=mark.at,
        epoch=mark.epoch,
        stopped=record.stop_reason.value if isinstance(record, ResumeStopped) else None,
    )


def _carrier(record: LogRecord) -> str:
    """The record that carries a resume mark, in words (``"intent m3"``)."""
    if isinstance(record, Intent):
        return f"intent {record.result_id}"
    if isinstance(record, ModelCallResult):
        return f"model call result {record.result_id}"
    if isinstance(record, StepCompleted):
        return f"step record of step {record.step.step_idx}"
    if isinstance(record, ApprovalRequest):
        return f"approval request {record.result_id}"
    if isinstance(record, ResumeStopped):
        return f"resume stop record (waiting on {record.result_id})"
    return "run finish record"


def step_index(result_id: str) -> int | None:
    """The step a result id of the library's scheme names (``m3``, ``a3``: 3), else ``None``."""
    digits = result_id[1:]
    return int(digits) if result_id[:1] in ("m", "a") and digits.isdigit() else None


def _settlement_view(record: Settlement, line: int) -> SettlementView:
    return SettlementView(
        line=line,
        step_idx=step_index(record.result_id),
        result_id=record.result_id,
        verdict=record.verdict.value,
        source=record.source.value,
        by=record.by,
        at=record.at,
        observation=record.observation,
        note=record.note,
        digest=record.digest,
    )


def _approval_view(record: ApprovalRequest, line: int) -> ApprovalView:
    return ApprovalView(
        line=line,
        step_idx=record.step_idx,
        result_id=record.result_id,
        tool=record.tool,
        tool_call_id=record.tool_call_id,
        arguments=record.arguments,
        digest=record.digest,
        requested_at=record.requested_at,
        expires_at=record.expires_at,
    )


def _store_log(source: str, run_id: str) -> str:
    """The log a command names for ``run_id``: ``source``, or when the file is not named after
    its run (a copy), ``<run_id>.jsonl`` beside it, where ``JsonlRunStore`` keeps the run."""
    path = PurePath(source)
    if path.name != f"{run_id}.jsonl":
        path = path.with_name(f"{run_id}.jsonl")
    return shlex.quote(str(path))


def approval_commands(source: str, run_id: str, digest: str) -> tuple[str, str]:
    """The ``python -m polyloop approve`` and ``reject`` command lines for the call with
    ``digest`` of the run whose log is ``source`` (``NAME``: who decides; ``TEXT``: why)."""
    return approval_command_lines(_store_log(source, run_id), digest)


def approval_command_lines(log: str, digest: str) -> tuple[str, str]:
    """``approval_commands`` for the run that ``log`` names on a command line, as it is
    written there (a quoted log file; a store URL and ``--run-id``)."""
    quoted = shlex.quote(digest)
    return (
        f"python -m polyloop approve {log} --digest {quoted} --by NAME",
        f"python -m polyloop reject {log} --digest {quoted} --by NAME --reason TEXT",
    )


def _awaiting(
    run_id: str, source: str, plan: ResumePlan, requests: Sequence[ApprovalView]
) -> Awaiting | None:
    """The call waiting for approval under ``plan`` (``AWAITING_APPROVAL``), or ``None``."""
    request = plan.approval_request
    if plan.action is not ResumeAction.AWAITING_APPROVAL or request is None:
        return None
    view = next(
        (r for r in reversed(requests) if r.digest == request.digest),
        _approval_view(request, 0),
    )
    note = ""
    if PurePath(source).name != f"{run_id}.jsonl":
        note = (
            f"this file is not named after its run {run_id!r} (a copy?): JsonlRunStore keeps "
            f"that run in {run_id}.jsonl, which the commands name; decide where its store "
            "keeps it"
        )
    return Awaiting(
        request=view, commands=approval_commands(source, run_id, request.digest), note=note
    )


def resolve_commands(source: str, run_id: str, result_id: str) -> tuple[str, str]:
    """The two ``python -m polyloop resolve`` command lines for ``result_id`` of the run whose
    log is ``source``: executed (``TEXT``: what the tool's system says happened) and not
    executed; ``NAME`` is who decides. A log whose file name is not its run id is named by the
    file ``JsonlRunStore`` would keep it in, ``<run_id>.jsonl`` beside it."""
    return resolve_command_lines(_store_log(source, run_id), result_id)


def resolve_command_lines(log: str, result_id: str) -> tuple[str, str]:
    """``resolve_commands`` for the run that ``log`` names on a command line, as it is
    written there (a quoted log file; a store URL and ``--run-id``)."""
    head = f"python -m polyloop resolve {log} --result-id {result_id}"
    return (
        f"{head} --executed --observation TEXT --by NAME",
        f"{head} --not-executed --by NAME",
    )


def _in_doubt(
    run_id: str, source: str, plan: ResumePlan, steps: Sequence[StepView]
) -> InDoubt | None:
    """The execution in doubt under ``plan`` (``STOP_UNKNOWN``), or ``None``."""
    intent = plan.pending_intent
    if plan.action is not ResumeAction.STOP_UNKNOWN or intent is None:
        return None
    step = next((s for s in steps if s.idx == plan.next_step_idx), None)
    action = intent.kind is IntentKind.ACTION
    note = ""
    commands: tuple[str, ...] = ()
    if action:
        commands = resolve_commands(source, run_id, intent.result_id)
        if PurePath(source).name != f"{run_id}.jsonl":
            note = (
                f"this file is not named after its run {run_id!r} (a copy?): JsonlRunStore "
                f"keeps that run in {run_id}.jsonl, which the commands name; settle the run "
                "where its store keeps it"
            )
    else:
        note = (
            "a model call cannot be settled by hand (its reply cannot be supplied); the run "
            "stays at resume_state_unknown: start the task again under a new run id"
        )
    return InDoubt(
        step_idx=plan.next_step_idx,
        result_id=intent.result_id,
        kind=intent.kind.value,
        replay_policy=intent.replay_policy.value,
        idempotency_key=intent.idempotency_key,
        tool_calls=() if step is None or not action else step.tool_calls,
        reply=None if step is None or not action else step.reply,
        last_answer=None
        if step is None
        else next((v for v in reversed(step.settlements) if v.result_id == intent.result_id), None),
        commands=commands,
        note=note,
    )


def _step_kind(
    idx: int,
    step: StepRecord | None,
    result: ModelCallResult | None,
    settlements: Sequence[SettlementView],
) -> StepKind:
    """What the step was: incomplete, a failed model call, an action, a rejected call (its
    step has no action, design 0231), a parse failure, or the final answer."""
    if step is None:
        return StepKind.INCOMPLETE
    if result is not None and result.reply is None:
        return StepKind.MODEL_FAILURE
    if step.action is not None:
        return StepKind.ACTION
    if any(s.step_idx == idx and s.verdict == "rejected" for s in settlements):
        return StepKind.REJECTED
    if not step.parse_ok:
        return StepKind.PARSE_FAILURE
    return StepKind.FINAL_ANSWER


def _pending_words(
    idx: int,
    step: StepRecord | None,
    model_intent: Intent | None,
    action_intent: Intent | None,
    result: ModelCallResult | None,
    requests: Sequence[ApprovalView],
) -> str:
    """Where an incomplete step stands, in words; ``""`` for a recorded step."""
    if step is not None:
        return ""
    if model_intent is not None and result is None:
        return f"the model call has an intent ({model_intent.replay_policy.value}) but no result"
    if action_intent is not None:
        return f"the action has an intent ({action_intent.replay_policy.value}) but no result"
    if any(r.step_idx == idx for r in requests):
        return "its call has a request for approval and no action yet"
    return "the model call has a result but nothing followed it"


def _step_view(
    idx: int,
    records: Sequence[LogEntry],
    intents: Mapping[str, Intent],
    results: Mapping[str, ModelCallResult],
    completed: StepCompleted | None,
    settlements: Sequence[SettlementView] = (),
    requests: Sequence[ApprovalView] = (),
) -> StepView:
    model_intent = intents.get(f"m{idx}")
    action_intent = intents.get(f"a{idx}")
    result = results.get(f"m{idx}")
    reply = None if result is None or result.reply is None else result.reply
    step = None if completed is None else completed.step
    outcome = None if completed is None else completed.action_outcome
    return StepView(
        idx=idx,
        kind=_step_kind(idx, step, result, settlements),
        lines=tuple(n.line for n in records),
        model_policy=None if model_intent is None else model_intent.replay_policy.value,
        reply=None if reply is None else reply.content,
        thinking="" if reply is None else reply.thinking,
        failure=None if result is None else result.failure,
        call_id=(reply.call_id if reply is not None else None) if step is None else step.call_id,
        history_text=None if step is None else step.raw_output,
        parse_error=None if step is None else step.parse_error,
        action=None if step is None else step.action,
        action_policy=None if action_intent is None else action_intent.replay_policy.value,
        action_status=(
            None if step is None or step.action_status is None else step.action_status.value
        ),
        observation=None if step is None else step.observation,
        observation_is_synthetic=False if step is None else step.observation_is_synthetic,
        observation_truncated_chars=0 if step is None else step.observation_truncated_chars,
        env_reported_completion=False if outcome is None else outcome.env_reported_completion,
        prompt_chars=None if step is None else step.prompt_chars,
        wall_ms=None if step is None else step.step_wall_ms,
        pending=_pending_words(idx, step, model_intent, action_intent, result, requests),
        tool_calls=()
        if reply is None
        else tuple((call.id, call.name, call.arguments) for call in reply.tool_calls),
        usage=_usage_words(reply.usage if reply is not None else None),
        finish_reason=None if reply is None else reply.finish_reason,
        model_ms=result.duration_ms if result is not None else None,
        action_ms=None if step is None else step.action_ms,
        idempotency_key=None if action_intent is None else action_intent.idempotency_key,
        settled_by=None if outcome is None else outcome.settled_by,
        settlements=tuple(s for s in settlements if s.step_idx == idx),
        approval=next((r for r in reversed(requests) if r.step_idx == idx), None),
        tokens=None
        if reply is None or reply.usage is None
        else (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        cost=None if step is None else step.cost,
        reported_usage=None if reply is None else reply.usage,
    )


def _usage_words(usage: Usage | None) -> str | None:
    if usage is None:
        return None
    cached = f" ({usage.cached_tokens} cached)" if usage.cached_tokens is not None else ""
    return f"{usage.prompt_tokens} prompt{cached} + {usage.completion_tokens} completion tokens"
