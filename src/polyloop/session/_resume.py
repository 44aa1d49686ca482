"""Resume: from a stored log to the phase the next process starts at.

``polyloop._recovery.plan_resume`` classifies the log (pure, no agent needed). This module adds
what needs the agent's definition, then says where the step stands:

========================  =====================================================================
``ResumeAction``          what resume does
========================  =====================================================================
FRESH                     refuse: ``RunIdentityError`` (nothing to resume)
CORRUPT                   refuse: ``LogCorruptError`` naming the line; nothing is written
ALREADY_FINISHED          return the stored result; nothing else runs (with a
                          ``FinishedRunDriftWarning`` naming the keys when the settings
                          differ from the recorded ones, design 0217)
STOP_UNKNOWN              finish with ``RESUME_STATE_UNKNOWN``; ``unknown_outcome`` names the
                          unanswered execution
CONTINUE                  the loop, from a new step (``Phase.MODEL_INTENT``)
REDO_MODEL_CALL           ``Phase.MODEL_CALL`` of the open step (its intent is in the log)
CONTINUE_AFTER_MODEL_     ``Phase.REPLY`` of the open step, its model result loaded
CALL
REPLAY_LAST_ACTION        ``Phase.ACTION`` of the open step, its reply re-parsed and its action
                          loaded with the key its intent records (``SAFE``, ``IDEMPOTENT``, or
                          settled as not executed)
RECORD_SETTLED            ``Phase.STEP_RECORD`` of the open step, its action's outcome taken
                          from the settlement that says it was executed (design 0206)
RETRY_SETTLED             ``Phase.ACTION_INTENT`` of the open step, its action loaded: every
                          attempt was settled as not executed, so it is announced again (the
                          same intent, the same key) and runs
AWAITING_APPROVAL         stop with ``AWAITING_APPROVAL`` again, nothing called or executed, no
                          finish written (an expired request is first rejected as "expired",
                          on record, and the log planned again; design 0210)
RUN_APPROVED              ``Phase.ACTION_INTENT`` of the open step, its approved call loaded
                          (its digest checked against the request's)
RECORD_REJECTED           ``Phase.STEP_RECORD`` of the open step: no action, the rejection
                          with its reason as the observation
========================  =====================================================================

A ``STOP_UNKNOWN`` for an action whose tool has a reconciler is first put to the reconciler
(``_settling.ask_reconciler``, at most once per resume call); its answer is on record before the
log is planned again.

After the first three rows and before the others, in this order: the drift guard
(``ParameterDriftError``); a dangling action intent is pinned to the policy the action its
stored reply asks for gets now (``LogCorruptError`` otherwise; a parser that breaks on that
reply stops the run with ``PARSER_ERROR``); and, when steps exist, whether the last stored step
should already have stopped the run (the process died between a step's record and the
``RunFinished``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from polyloop import _recovery, _stopping
from polyloop._recovery import ResumeAction, ResumePlan
from polyloop._stopping import StepFacts
from polyloop.errors import FinishedRunDriftWarning, LogCorruptError, ParameterDriftError
from polyloop.ports import Action, FinalAnswer, ParsedReply, RunLog
from polyloop.session._config import AgentDefinition, RunRequest, full_snapshot, snapshot_drift
from polyloop.session._decisions import (
    approval_request_for,
    is_expired,
    parse_reply,
    tool_flags,
)
from polyloop.session._settling import in_doubt_action
from polyloop.session._state import RunState
from polyloop.session._step import Phase, StepRunner, StepWork
from polyloop.tools import ToolSpec
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    Intent,
    ModelReply,
    RunResult,
    Settlement,
    SettlementSource,
    StopReason,
)

__all__ = ["ENTRY_PHASE", "StoredRun", "settled_outcome"]

ENTRY_PHASE: Final[Mapping[ResumeAction, Phase]] = MappingProxyType(
    {
        ResumeAction.CONTINUE: Phase.MODEL_INTENT,
        ResumeAction.REDO_MODEL_CALL: Phase.MODEL_CALL,
        ResumeAction.CONTINUE_AFTER_MODEL_CALL: Phase.REPLY,
        ResumeAction.REPLAY_LAST_ACTION: Phase.ACTION,
        ResumeAction.RECORD_SETTLED: Phase.STEP_RECORD,
        ResumeAction.RETRY_SETTLED: Phase.ACTION_INTENT,
        ResumeAction.RUN_APPROVED: Phase.ACTION_INTENT,
        ResumeAction.RECORD_REJECTED: Phase.STEP_RECORD,
    }
)
"""The phase of the open step a resume enters at, per plan (the table above)."""

_ACTS_ON_THE_ACTION: Final = frozenset(
    {
        ResumeAction.REPLAY_LAST_ACTION,
        ResumeAction.RECORD_SETTLED,
        ResumeAction.RETRY_SETTLED,
        ResumeAction.RUN_APPROVED,
        ResumeAction.RECORD_REJECTED,
    }
)


_NOT_THE_CALLER: Final = (
    os.path.dirname(os.path.dirname(__file__)) + os.sep,
    os.path.dirname(asyncio.__file__) + os.sep,
    os.path.dirname(os.path.dirname(concurrent.futures.__file__)) + os.sep,
    threading.__file__,
)
"""Frames a warning's location skips: the library, and the event loop and threads it runs in."""


def warn_each_time(warning: Warning) -> None:
    """Issue ``warning`` at the user's call (the first frame outside polyloop, asyncio and the
    thread machinery) and show it *every* time under Python's default filter (design 0217).

    ``warnings.warn`` shows a warning once per text and location under the default action;
    ``warn_explicit`` with no registry remembers nothing, so each call is shown, while the
    filters a program sets (``ignore``, ``error``, ``-W``) still apply to it."""
    frame = sys._getframe(1)  # the caller's frame: where the warning points
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_NOT_THE_CALLER):
        frame = frame.f_back
    warnings.warn_explicit(
        warning,
        type(warning),
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__", "<unknown>"),
        registry=None,
        module_globals=frame.f_globals,
    )


class StoredRun:
    """A run's stored log and its plan, read against the agent that resumes it."""

    def __init__(
        self, definition: AgentDefinition, request: RunRequest, log: RunLog, plan: ResumePlan
    ) -> None:
        self._definition = definition
        self._request = request
        self._run_id = request.run_id
        self.log = log
        self.plan = plan

    def _parse(self, reply: ModelReply, step_idx: int) -> ParsedReply | str:
        return parse_reply(self._definition.decision_parser, reply, self._run_id, step_idx)

    def refuse_if_corrupt(self, plan: ResumePlan | None = None) -> None:
        """Raise ``LogCorruptError`` naming the line when the plan is ``CORRUPT``."""
        plan = self.plan if plan is None else plan
        if plan.action is not ResumeAction.CORRUPT:
            return
        line = None if plan.breach is None else plan.breach.line
        raise LogCorruptError(
            f"run {self._run_id!r}: {plan.detail}; resume refused (the log contradicts itself, "
            "so nothing in it can be trusted to decide what is safe to repeat)",
            line=line,
        )

    def _drift(self) -> ParameterDriftError | None:
        started = self.log.started
        assert started is not None
        current = full_snapshot(self._definition, self._request)
        return snapshot_drift(self._run_id, started.parameter_snapshot, current)

    def check_drift(self) -> None:
        """Raise ``ParameterDriftError`` listing every key that differs from ``RunStarted``'s."""
        drift = self._drift()
        if drift is not None:
            raise drift

    def finished_result(self) -> RunResult:
        """The stored result of an ``ALREADY_FINISHED`` run, with a ``FinishedRunDriftWarning``
        naming every snapshot key that differs from ``RunStarted``'s when any does (design
        0217): the seed's rule stands (nothing runs), but a change is no longer ignored in
        silence."""
        finished = self.log.finished
        assert finished is not None
        drift = self._drift()
        if drift is not None:
            warn_each_time(
                FinishedRunDriftWarning(
                    self._run_id,
                    added=drift.added,
                    removed=drift.removed,
                    changed=tuple(drift.changed),
                )
            )
        return finished.result

    def pending_action(self) -> ParsedReply | StopReason | None:
        """Pin a dangling action intent to the policy its action gets under the settings.

        The intent's policy decides whether the action is repeated, so it must not be trusted
        on its own: re-parsing the stored reply gives the action, the settings its policy.
        Returns the parsed reply of the dangling action (to replay it, record its settled
        outcome or ask its reconciler), ``PARSER_ERROR`` when the parser now breaks its
        contract on a reply whose action would be acted on (nothing is executed then),
        ``None`` when there is no dangling action. Raises
        ``LogCorruptError`` when the reply parses to no action, or the policies differ.
        """
        plan = self.plan
        pending = plan.pending_model_result
        acts = plan.action in _ACTS_ON_THE_ACTION
        dangling = acts or (plan.action is ResumeAction.STOP_UNKNOWN and pending is not None)
        if not dangling or pending is None or pending.reply is None:
            return None
        parsed = self._parse(pending.reply, plan.next_step_idx)
        if isinstance(parsed, str):
            return StopReason.PARSER_ERROR if acts else None
        decision = parsed.decision
        if not isinstance(decision, Action):
            line = self._action_intent_line(plan.next_step_idx)
            where = "" if line is None else f"line {line}: "
            raise LogCorruptError(
                f"run {self._run_id!r}: {where}step {plan.next_step_idx} has an action intent, "
                "but its stored reply parses to no action; resume refused",
                line=line,
            )
        policy = tool_flags(self._request.tools, decision).replay_policy
        self.refuse_if_corrupt(
            _recovery.plan_resume(
                self.log, self._run_id, action_policies={plan.next_step_idx: policy}
            )
        )
        return parsed

    def _action_intent_line(self, step_idx: int) -> int | None:
        wanted = _recovery.action_result_id(step_idx)
        return next(
            (
                entry.line
                for entry in self.log.entries
                if isinstance(entry.record, Intent) and entry.record.result_id == wanted
            ),
            None,
        )

    def stop_for_last_step(self, state: RunState) -> StopReason | None:
        """Whether the last stored step should already have stopped the run.

        The facts are rebuilt from the log: the model result says whether the call failed,
        re-parsing the stored reply says whether it was a final answer (which ``state``
        then carries) and which tool ran.
        """
        completed = self.log.steps[-1]
        model_result = self.plan.last_model_result
        assert model_result is not None
        completes_run = False
        if model_result.reply is not None:
            parsed = self._parse(model_result.reply, completed.step.step_idx)
            if isinstance(parsed, str):
                return StopReason.PARSER_ERROR
            decision = parsed.decision
            if isinstance(decision, FinalAnswer):
                state.final_answer = decision.text
            elif isinstance(decision, Action):
                completes_run = tool_flags(self._request.tools, decision).completes_run
        facts = StepFacts(
            model_failed=model_result.reply is None,
            final_answer=state.final_answer is not None,
            outcome=completed.action_outcome,
            tool_completes_run=completes_run,
            context_length_exceeded=model_result.context_length_exceeded,
        )
        return _stopping.stop_after_step(self._request.budget, state.counters, facts)

    def reconciler_for(self, parsed: ParsedReply | None) -> ToolSpec | None:
        """The spec of the in-doubt action's tool when it has a reconciler to ask."""
        if in_doubt_action(self.plan) is None or parsed is None:
            return None
        action = parsed.decision
        call = action.tool_call if isinstance(action, Action) else None
        if call is None or not isinstance(call.name, str):
            return None
        spec = self._request.tools.spec_for(call.name)
        return spec if spec is not None and spec.reconcile is not None else None

    def expired_request(self, now: datetime.datetime) -> ApprovalRequest | None:
        """The open step's request for approval when it waits and its ``expires_at`` passed."""
        request = self.plan.approval_request
        if self.plan.action is not ResumeAction.AWAITING_APPROVAL or request is None:
            return None
        return request if is_expired(request, now) else None

    def _check_decided_call(self, action: Action) -> None:
        """The call a decision was made on is the call the stored reply asks for (the drift
        guard makes that so; a mismatch means the log or the parser cannot be trusted)."""
        request = self.plan.approval_request
        if request is None:
            return
        expected = approval_request_for(
            self._request.tools,
            action,
            run_id=self._run_id,
            step_idx=self.plan.next_step_idx,
            expires_seconds=None,
        )
        # Compared by tool and canonical arguments, not by digest: a continuation's copy
        # keeps the digest it was decided under, which names the cancelled run.
        if expected is None or (expected.tool, expected.arguments) != (
            request.tool,
            request.arguments,
        ):
            raise LogCorruptError(
                f"run {self._run_id!r}: step {self.plan.next_step_idx}'s stored reply no longer "
                f"asks for the call whose approval request has digest {request.digest}; resume "
                "refused (a decision binds to exactly one call)",
                line=None,
            )

    def open_step(self, runner: StepRunner, replayed: ParsedReply | None) -> StepWork:
        """The open step with what the log holds about it loaded, ready for its entry phase:
        the model result, the open execution's intent (its key), the action its reply asks for
        and, for ``RECORD_SETTLED``, the settled outcome."""
        plan = self.plan
        work = runner.begin()
        if plan.pending_model_result is not None:
            work.load_model_result(plan.pending_model_result)
        if plan.pending_intent is not None:
            work.load_intent(plan.pending_intent)
        if replayed is not None:
            action = replayed.decision
            assert isinstance(action, Action)
            self._check_decided_call(action)
            work.load_action(replayed, action, tool_flags(self._request.tools, action))
        if plan.action is ResumeAction.REPLAY_LAST_ACTION:
            # The replay is of an action in doubt: a replay that cannot reach its tool leaves
            # it in doubt, the run open (design 0227), as an in-process retry does.
            work.in_doubt = plan.detail
        if plan.action is ResumeAction.RECORD_REJECTED and plan.settlement is not None:
            runner.reject(work, rejection_reason(plan.settlement))
        settlement = plan.settlement
        if plan.action is ResumeAction.RECORD_SETTLED and settlement is not None:
            runner.settle(work, settled_outcome(settlement))
        return work


def rejection_reason(decision: Settlement) -> str:
    """What the model reads about a rejected call (in ``SyntheticObservations.action_rejected``'s
    ``{reason}``): a person's reason, or that the request expired."""
    if decision.source is SettlementSource.EXPIRY:
        return "the request for approval expired before anyone decided"
    return f"a person rejected this call: {decision.note}"


def settled_outcome(settlement: Settlement) -> ActionOutcome:
    """The outcome a settlement that says "executed" stands for."""
    assert settlement.observation is not None
    who = (
        "reconciler"
        if settlement.source is SettlementSource.RECONCILER
        else f"person:{settlement.by}"
    )
    return ActionOutcome(
        status=ActionStatus.EXECUTED,
        observation=settlement.observation,
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
        settled_by=who,
    )
