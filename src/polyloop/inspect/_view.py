"""One run, as every inspector output shows it: a ``RunView`` built from its decoded records.

``view_run`` is the single interpretation of a log that ``show``, ``ls``, ``diff`` and ``html``
render; none of them reads records on its own, so the transcript, the list and the HTML page
cannot disagree about what a step was or what resume would do.

A step's view joins the records of step ``n`` by the library's result-id scheme (``m<n>`` is its
model call, ``a<n>`` its action): the model-call intent and result, the action intent, and the
``StepCompleted`` record. A step whose ``StepCompleted`` is missing is shown as *incomplete*
(what a crash or a kill leaves); the run's resume plan says what ``resume`` would do with it.

The log keeps no prompt text (only each step's ``prompt_chars``) and no wall-clock timestamps
(only each step's ``step_wall_ms``); a view shows what the log has and says so, it never
reconstructs what the log does not hold.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from polyloop.ports import LogEntry, RunLog
from polyloop.session import ResumeAction, ResumePlan, plan_resume
from polyloop.stores import assemble_log
from polyloop.types import (
    Intent,
    IntentKind,
    ModelCallResult,
    RunFinished,
    RunStarted,
    StepCompleted,
    Usage,
)

__all__ = ["RunView", "StepKind", "StepView", "resume_sentence", "view_run"]


class StepKind(enum.Enum):
    """What a step turned out to be (``INCOMPLETE``: its ``StepCompleted`` record is missing)."""

    ACTION = "action"
    FINAL_ANSWER = "final_answer"
    PARSE_FAILURE = "parse_failure"
    MODEL_FAILURE = "model_failure"
    INCOMPLETE = "incomplete"


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
    log: RunLog

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
        ResumeAction.STOP_UNKNOWN: (
            "resume would stop the run as resume_state_unknown without executing anything"
        ),
        ResumeAction.CORRUPT: "resume would refuse the log (LogCorruptError)",
    }[plan.action]
    return f"{what}: {plan.detail}" if plan.detail else what


def _caveat(plan: ResumePlan) -> str:
    if plan.action in (
        ResumeAction.CONTINUE,
        ResumeAction.CONTINUE_AFTER_MODEL_CALL,
        ResumeAction.REDO_MODEL_CALL,
        ResumeAction.REPLAY_LAST_ACTION,
        ResumeAction.STOP_UNKNOWN,
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
    for numbered in records:
        record = numbered.record
        idx: int | None = None
        if isinstance(record, RunStarted):
            snapshot = record.parameter_snapshot
        elif isinstance(record, Intent):
            intents.setdefault(record.result_id, record)
            idx = record.call_index
        elif isinstance(record, ModelCallResult):
            results.setdefault(record.result_id, record)
            idx = _index_of(record.result_id)
        elif isinstance(record, StepCompleted):
            completed.setdefault(record.step.step_idx, record)
            idx = record.step.step_idx
        else:
            finished = record
        if idx is not None:
            by_step.setdefault(idx, []).append(numbered)
    steps = tuple(
        _step_view(idx, by_step[idx], intents, results, completed.get(idx))
        for idx in sorted(by_step)
    )
    model_calls = sum(1 for i in intents.values() if i.kind is IntentKind.MODEL_CALL)
    actions = sum(1 for s in steps if s.action is not None)
    duration = sum(s.wall_ms or 0 for s in steps)
    resume = None
    if finished is None:
        resume = resume_sentence(plan) + _caveat(plan)
    return RunView(
        run_id=run_id,
        source=source,
        line_count=max((n.line for n in records), default=0),
        torn_bytes=torn_bytes,
        snapshot=snapshot,
        steps=steps,
        stop_reason=None if finished is None else finished.result.stop_reason.value,
        final_answer=None if finished is None else finished.result.final_answer,
        event_delivery_failures=(
            None if finished is None else finished.result.event_delivery_failures
        ),
        plan=plan,
        resume=resume,
        actions=actions,
        model_calls=model_calls,
        duration_ms=duration,
        log=log,
    )


def _index_of(result_id: str) -> int | None:
    digits = result_id[1:]
    return int(digits) if result_id[:1] in ("m", "a") and digits.isdigit() else None


def _step_view(
    idx: int,
    records: Sequence[LogEntry],
    intents: Mapping[str, Intent],
    results: Mapping[str, ModelCallResult],
    completed: StepCompleted | None,
) -> StepView:
    model_intent = intents.get(f"m{idx}")
    action_intent = intents.get(f"a{idx}")
    result = results.get(f"m{idx}")
    reply = None if result is None or result.reply is None else result.reply
    step = None if completed is None else completed.step
    outcome = None if completed is None else completed.action_outcome
    if step is None:
        kind = StepKind.INCOMPLETE
    elif result is not None and result.reply is None:
        kind = StepKind.MODEL_FAILURE
    elif step.action is not None:
        kind = StepKind.ACTION
    elif not step.parse_ok:
        kind = StepKind.PARSE_FAILURE
    else:
        kind = StepKind.FINAL_ANSWER
    pending = ""
    if step is None:
        if model_intent is not None and result is None:
            pending = (
                f"the model call has an intent ({model_intent.replay_policy.value}) but no result"
            )
        elif action_intent is not None:
            pending = (
                f"the action has an intent ({action_intent.replay_policy.value}) but no result"
            )
        else:
            pending = "the model call has a result but nothing followed it"
    return StepView(
        idx=idx,
        kind=kind,
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
        pending=pending,
        tool_calls=()
        if reply is None
        else tuple((call.id, call.name, call.arguments) for call in reply.tool_calls),
        usage=_usage_words(reply.usage if reply is not None else None),
        finish_reason=None if reply is None else reply.finish_reason,
        model_ms=result.duration_ms if result is not None else None,
        action_ms=None if step is None else step.action_ms,
    )


def _usage_words(usage: Usage | None) -> str | None:
    if usage is None:
        return None
    cached = f" ({usage.cached_tokens} cached)" if usage.cached_tokens is not None else ""
    return f"{usage.prompt_tokens} prompt{cached} + {usage.completion_tokens} completion tokens"
