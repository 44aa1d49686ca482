"""Resume planning: read a run's log and decide what the next process may safely do.

Every execution (one model call, one action) is judged by two facts: is its intent in the log,
and is its result? Results are matched to intents by ``result_id`` and nothing else.

=========  ==========  ==========================================================
intent     result      recovery
=========  ==========  ==========================================================
no         no          not started: run it normally
yes        yes         finished: skip it
yes        no          unknown: the replay policy recorded *on the intent* decides:
                       ``SAFE`` runs it again, ``NEVER`` stops the run with
                       ``RESUME_STATE_UNKNOWN``; recovery never guesses
no         yes         impossible: the log is corrupt and resume refuses
=========  ==========  ==========================================================

Ids are allocated deterministically from the step index (``model_result_id`` and
``action_result_id``), so a replay re-uses the intent already in the log instead of writing a
second one, and a reader can tell which step every record belongs to.

``plan_resume`` is pure: it never touches a store, a model or an environment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from polyloop.errors import LogCorruptError
from polyloop.ports import RunLog
from polyloop.types import Intent, IntentKind, ModelCallResult, ReplayPolicy

__all__ = [
    "LogCorruptError",
    "ResumeAction",
    "ResumePlan",
    "action_result_id",
    "model_result_id",
    "plan_resume",
]


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
    """The next step's model call has an intent, no result and ``SAFE``: call again."""
    REPLAY_LAST_ACTION = "replay_last_action"
    """The next step's action has an intent, no result and ``SAFE``: execute it again."""
    STOP_UNKNOWN = "stop_unknown"
    """An execution has an intent, no result and ``NEVER``: finish with
    ``RESUME_STATE_UNKNOWN`` and never execute it again."""
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
    explains the verdict in words.
    """

    action: ResumeAction
    next_step_idx: int = 0
    pending_model_result: ModelCallResult | None = None
    last_model_result: ModelCallResult | None = None
    detail: str = ""


def _corrupt(next_step_idx: int, detail: str) -> ResumePlan:
    return ResumePlan(action=ResumeAction.CORRUPT, next_step_idx=next_step_idx, detail=detail)


def _identity_problem(log: RunLog, run_id: str) -> str | None:
    records: list[tuple[str, str]] = []
    if log.started is not None:
        records.append(("RunStarted", log.started.run_id))
    records += [("Intent", r.run_id) for r in log.intents]
    records += [("ModelCallResult", r.run_id) for r in log.model_results]
    records += [("StepCompleted", r.run_id) for r in log.steps]
    if log.finished is not None:
        records.append(("RunFinished", log.finished.run_id))
    for kind, found in records:
        if found != run_id:
            return f"a {kind} record belongs to run {found!r}, not to {run_id!r}"
    return None


def _follows_id_scheme(intent: Intent) -> bool:
    """Whether the intent's result id is the one the library allocates for its kind and step."""
    expected = (
        model_result_id(intent.call_index)
        if intent.kind is IntentKind.MODEL_CALL
        else action_result_id(intent.call_index)
    )
    return intent.result_id == expected


def plan_resume(log: RunLog, run_id: str) -> ResumePlan:
    """Classify ``log`` (the log of ``run_id``) into a ``ResumePlan``."""
    if log.is_empty:
        return ResumePlan(action=ResumeAction.FRESH, detail="no record exists for this run id")
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
    for position, completed in enumerate(log.steps):
        if completed.step.step_idx != position:
            return _corrupt(
                next_idx,
                f"step record number {position} carries step_idx {completed.step.step_idx}",
            )

    intents: dict[str, Intent] = {}
    for intent in log.intents:
        if not _follows_id_scheme(intent):
            return _corrupt(
                next_idx,
                f"intent {intent.result_id!r} ({intent.kind.value}, call_index "
                f"{intent.call_index}) does not follow the id scheme",
            )
        if intent.result_id in intents:
            return _corrupt(next_idx, f"two intents announce result {intent.result_id!r}")
        if intent.call_index > next_idx:
            return _corrupt(
                next_idx,
                f"intent {intent.result_id!r} is for step {intent.call_index}, but only "
                f"{next_idx} steps are complete",
            )
        intents[intent.result_id] = intent

    model_results: dict[str, ModelCallResult] = {}
    for result in log.model_results:
        announced = intents.get(result.result_id)
        if announced is None or announced.kind is not IntentKind.MODEL_CALL:
            return _corrupt(
                next_idx, f"model call result {result.result_id!r} has no model-call intent"
            )
        if result.result_id in model_results:
            return _corrupt(next_idx, f"two model call results carry {result.result_id!r}")
        model_results[result.result_id] = result

    for completed in log.steps:
        idx = completed.step.step_idx
        if model_result_id(idx) not in model_results:
            return _corrupt(next_idx, f"step {idx} is complete but its model call has no result")
        if completed.result_id is None:
            if action_result_id(idx) in intents:
                return _corrupt(
                    next_idx, f"step {idx} has an action intent but a step record without one"
                )
            continue
        if completed.result_id != action_result_id(idx):
            return _corrupt(next_idx, f"step {idx} carries result id {completed.result_id!r}")
        if completed.result_id not in intents:
            return _corrupt(next_idx, f"step {idx} has an action result but no action intent")

    last_model_result = model_results.get(model_result_id(next_idx - 1)) if next_idx else None
    model_intent = intents.get(model_result_id(next_idx))
    model_result = model_results.get(model_result_id(next_idx))
    action_intent = intents.get(action_result_id(next_idx))

    def plan(action: ResumeAction, detail: str, pending: ModelCallResult | None) -> ResumePlan:
        return ResumePlan(
            action=action,
            next_step_idx=next_idx,
            pending_model_result=pending,
            last_model_result=last_model_result,
            detail=detail,
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
        if model_intent.replay_policy is ReplayPolicy.SAFE:
            return plan(
                ResumeAction.REDO_MODEL_CALL,
                f"step {next_idx}'s model call has no result and may be repeated (safe)",
                None,
            )
        return plan(
            ResumeAction.STOP_UNKNOWN,
            f"step {next_idx}'s model call has no result and must not be repeated (never)",
            None,
        )
    if model_result.reply is None and action_intent is not None:
        return _corrupt(next_idx, f"step {next_idx}'s model call failed but an action followed")
    if action_intent is None:
        return plan(
            ResumeAction.CONTINUE_AFTER_MODEL_CALL,
            f"step {next_idx}'s model call has a result and nothing followed it",
            model_result,
        )
    if action_intent.replay_policy is ReplayPolicy.SAFE:
        return plan(
            ResumeAction.REPLAY_LAST_ACTION,
            f"step {next_idx}'s action has no result and may be repeated (safe)",
            model_result,
        )
    return plan(
        ResumeAction.STOP_UNKNOWN,
        f"step {next_idx}'s action has no result and must not be repeated (never)",
        model_result,
    )
