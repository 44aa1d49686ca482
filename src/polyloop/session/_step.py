"""One step as explicit phases; each phase does one thing and names the phase that follows.

===============  ===============================================  =============================
phase            what it does                                     next
===============  ===============================================  =============================
MODEL_INTENT     write the model-call ``Intent`` (durable)        MODEL_CALL
MODEL_CALL       call the model (bounded); write its              REPLY
                 ``ModelCallResult``; a raise is a failed result
                 (``ContextLengthExceededError`` marked as such)
REPLY            a failed call becomes the step's record; else    STEP_RECORD, or APPROVAL
                 parse (contained, design 0161): a breach,        for an ``Action``
                 ``InvalidDecision`` or ``FinalAnswer`` becomes
                 the step's record and never reaches the executor
APPROVAL         a call whose tool asks for approval (valid       ACTION_INTENT; none when it
                 arguments, ``ToolSpec.needs_approval``): write   stops (``AWAITING_APPROVAL``,
                 its ``ApprovalRequest`` (durable) and stop       the run is left open)
ACTION_INTENT    write the action ``Intent`` with the tool's      ACTION
                 replay policy (``NEVER`` for code/unknown tools)
                 and its idempotency key; a retry after a
                 ``not_executed`` settlement writes the very
                 intent the log holds again
ACTION           execute (bounded). An outcome in doubt (the      STEP_RECORD; ACTION again
                 bound expired, ``ToolOutcomeUnknown``) is an     for a ``SAFE``/``IDEMPOTENT``
                 ``unknown`` settlement by the executor, then     action in doubt (at most
                 settled by policy (design 0227). A child run     ``IN_DOUBT_ATTEMPTS``); none
                 left open (``ChildRunOpenError``) stops the run  when it stays in doubt
                 the same way, left open; one past ``max_depth``  (``RETRIES_EXHAUSTED``, or
                 or ``max_children`` (``TreeLimitError``)         ``RESUME_STATE_UNKNOWN`` for
                 finishes it ``TREE_LIMIT`` (design 0245). Any    ``NEVER``: the driver asks
                 other exception propagates untouched: the log    its reconciler), or after a
                 ends at "action intent, no step"                 child run left open or a
                                                                  tree limit
STEP_RECORD      write ``StepCompleted`` (outcome + step in one   (the step is done)
                 record), take it into the state, emit its event,
                 decide the stop (``polyloop._stopping``)
===============  ===============================================  =============================

A writer that can write two records of a run in one go (``write_pair``: the PostgreSQL store
and its leases, in one commit, design 0212; the JSONL store and its leases, in one file write,
and the volatile store's leases, in one synchronous block, design 0214) gets the model call's
result together with the step's next record (the action intent, the approval request or the
step): nothing is executed or reported between the two, and no write returns before its
records are as durable as they would be written apart, so a step costs three writes instead
of four. Any other writer (the volatile store itself, a user's store, a wrapper) gets the
result on its own, as the table says; ``write_pair`` counts only where the writer's class
declares it (``polyloop.ports.PairWrites``, decided once by ``RunWriter``), so a wrapper that
forwards unknown attributes to a store (``__getattr__``) is not paired past its own write methods.

What a step builds from the library's own values and already validated objects (the model
call, its result, the step and its ``StepCompleted``, the intents, the action's context) is
made with ``polyloop._common.trusted``, without re-running checks that cannot fail: the
request was validated once, a ``ModelReply`` and an ``ActionOutcome`` validated themselves, and
the run's tool schemas are frozen once (design 0214).

A fresh step enters at ``MODEL_INTENT``. Resume enters where the log says the step stands
(``polyloop.session._resume.ENTRY_PHASE``), with what the log holds loaded into the
``StepWork`` first: no phase is told that an earlier one "already happened".
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final, TypeVar

from polyloop import _recovery, _stopping
from polyloop._common import describe_exception, trusted_builder
from polyloop._stopping import StepFacts
from polyloop.errors import (
    ChildRunOpenError,
    ContextLengthExceededError,
    PolyloopTypeError,
    SeamTimeoutError,
    ToolOutcomeUnknown,
    TreeLimitError,
)
from polyloop.ports import (
    Action,
    FinalAnswer,
    InvalidDecision,
    LogRecord,
    ModelCall,
    ParsedReply,
    ToolCall,
    ToolContext,
    ToolProgress,
    TracingSink,
)
from polyloop.session._config import AgentDefinition, RunRequest
from polyloop.session._decisions import (
    ToolFlags,
    approval_request_for,
    parse_reply,
    tool_flags,
)
from polyloop.session._events import deliver_step_event, progress_reporter
from polyloop.session._leasing import RunWriter
from polyloop.session._state import RunState
from polyloop.session._waits import bounded, elapsed_ms
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    ChildRun,
    Intent,
    IntentKind,
    ModelCallResult,
    ModelPrices,
    ModelReply,
    ReplayPolicy,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepCompleted,
    StepRecord,
    StopReason,
)

__all__ = ["IN_DOUBT_ATTEMPTS", "Phase", "StepRunner", "StepWork"]

IN_DOUBT_ATTEMPTS: Final = 3
"""How many times one call of ``run``/``resume`` hands a ``SAFE`` or ``IDEMPOTENT`` action whose
outcome stays unknown to the executor before it stops with ``RETRIES_EXHAUSTED`` (design 0227);
also the bound on a ``NEVER`` action's attempts that its reconciler settles as not executed."""

# Built without ``__post_init__`` (``polyloop._common.trusted``; design 0214).
_new_intent = trusted_builder(Intent)
_new_model_call = trusted_builder(ModelCall)
_new_model_call_result = trusted_builder(ModelCallResult)
_new_action = trusted_builder(Action)
_new_step_completed = trusted_builder(StepCompleted)
_new_step_record = trusted_builder(StepRecord)
_new_tool_context = trusted_builder(ToolContext)


R = TypeVar("R", Intent, StepCompleted, ApprovalRequest)

logger = logging.getLogger("polyloop.session")


class Phase(enum.Enum):
    """The phases of one step, in write-ahead order (the table in the module docstring)."""

    MODEL_INTENT = "model_intent"
    MODEL_CALL = "model_call"
    REPLY = "reply"
    APPROVAL = "approval"
    ACTION_INTENT = "action_intent"
    ACTION = "action"
    STEP_RECORD = "step_record"

    # Members are singletons compared by identity, so identity's hash (in C) is equivalent to
    # Enum's own (a Python-level ``hash(self._name_)``); ``run_from`` looks a phase up in a
    # dict seven times a step.
    __hash__ = object.__hash__


_NO_FACTS = StepFacts(
    model_failed=False, final_answer=False, outcome=None, tool_completes_run=False
)


@dataclass(slots=True)
class StepWork:
    """What one step has learned so far; each phase fills in its part."""

    idx: int
    prompt_chars: int
    started: float = field(default_factory=time.monotonic)
    # The step's wall-clock instants (``_events.StepClock``), for its event's timing.
    started_ns: int = field(default_factory=time.time_ns)
    model_started_ns: int | None = None
    model_finished_ns: int | None = None
    action_started_ns: int | None = None
    action_finished_ns: int | None = None
    reply: ModelReply | None = None
    model_failed: bool = False
    context_length_exceeded: bool = False
    model_ms: int | None = None
    parsed: ParsedReply | None = None
    action: Action | None = None
    flags: ToolFlags | None = None
    model_key: str | None = None
    """The model call's idempotency key: the one its intent records (design 0205)."""
    unwritten_result: ModelCallResult | None = None
    """The model call's result, not yet written: it goes with the step's next record
    (``write_pair``, see the module docstring)."""
    action_key: str | None = None
    """The action's idempotency key: the one its intent records."""
    action_intent: Intent | None = None
    """The action's durable intent, when resume loaded one: a retry after a ``not_executed``
    settlement announces this very intent again (design 0206)."""
    action_ms: int | None = None
    child: ChildRun | None = None
    """The child run the action ran, as its tool reported it (``ToolContext.report_child``,
    design 0245): the step's record names it."""
    attempts: int = 0
    """How many times this call of ``run``/``resume`` handed the action to the executor."""
    in_doubt: str | None = None
    """Why the action's last attempt has no outcome (``ToolOutcomeUnknown``, the action bound;
    design 0227); ``None`` once an attempt returned one."""
    outcome: ActionOutcome | None = None
    record: StepRecord | None = None
    facts: StepFacts = _NO_FACTS
    forced_stop: StopReason | None = None
    """A stop the step imposes whatever the budgets say (``PARSER_ERROR``)."""
    verdict: StopReason | None = None
    """Set when the step is done: why the run stops after it, or ``None`` to go on."""

    @property
    def tool_call(self) -> ToolCall | None:
        return None if self.action is None else self.action.tool_call

    def load_model_result(self, result: ModelCallResult) -> None:
        """Take in a durable model-call result (resume: the step's call already returned)."""
        self.model_ms = result.duration_ms
        self.reply = result.reply
        self.model_failed = result.reply is None
        self.context_length_exceeded = result.context_length_exceeded

    def load_intent(self, intent: Intent) -> None:
        """Take in the durable intent of the open execution: a replay passes its key again
        (an intent written before schema 1.7 has none; its key is derived as it would have been).
        """
        key = intent.idempotency_key or _recovery.idempotency_key(intent.run_id, intent.result_id)
        if intent.kind is IntentKind.MODEL_CALL:
            self.model_key = key
        else:
            self.action_key, self.action_intent = key, intent

    def take_child(self, child: ChildRun) -> None:
        """The action's ``ToolContext.child_reporter``: keep the child run it reports."""
        self.child = child

    def load_action(self, parsed: ParsedReply, action: Action, flags: ToolFlags) -> None:
        """Take in the action a durable reply asks for (resume: its intent is in the log)."""
        self.parsed, self.action, self.flags = parsed, action, flags


_Handler = Callable[["StepRunner", StepWork], Awaitable["Phase | None"]]


class _StepWrites:
    """How a step's model result reaches the writer: on its own, or, for a writer with
    ``write_pair``, together with the step's next record (the module docstring)."""

    __slots__ = ("_pair", "_state", "_writer")

    def __init__(self, writer: RunWriter, state: RunState) -> None:
        self._writer = writer
        self._state = state
        # Declared by the target's class (``PairWrites``), not found through a wrapper's
        # ``__getattr__``: a wrapper that forwards what it does not define to a store with
        # ``write_pair`` and overrides one write method must still see every record of that
        # kind (``RunWriter.pair``).
        self._pair: Callable[[LogRecord, LogRecord], Awaitable[None]] | None = writer.pair

    async def model_result(self, work: StepWork, result: ModelCallResult) -> None:
        """Write the call's result, or keep it for the step's next write (``write_pair``)."""
        result = self._state.marked(result)  # a resume's first record says so (design 0215)
        if self._pair is None:
            await self._writer.write(result)
            self._state.in_flight = None
        else:
            work.unwritten_result = result  # still in flight until it is on record
        work.load_model_result(result)

    def after_result(
        self, work: StepWork, record: R, write: Callable[[R], Awaitable[None]]
    ) -> Awaitable[None]:
        """The write of ``record``, with the step's unwritten model result before it in one
        commit. The caller awaits it at once, and once it returned clears the state's
        ``in_flight`` if it carried the result (``work.unwritten_result`` set before the
        call): no coroutine of its own lives across the commit (design 0214)."""
        record = self._state.marked(record)  # a resume's first record says so (design 0215)
        result, work.unwritten_result = work.unwritten_result, None
        if result is None:
            return write(record)
        assert self._pair is not None
        return self._pair(result, record)


class StepRunner:
    """Runs steps of one run through their phases, writing through ``writer``."""

    def __init__(
        self,
        definition: AgentDefinition,
        request: RunRequest,
        state: RunState,
        writer: RunWriter,
        model_tools: tuple[Mapping[str, object], ...],
    ) -> None:
        self._definition = definition
        self._request = request
        self._progress = progress_reporter(definition.event_sink, request.event_timeout_seconds)
        sink = definition.event_sink  # a tracing scope around each call (design 0245)
        self._action_scope = sink.action_scope if isinstance(sink, TracingSink) else None
        self._state = state
        self._writer = writer
        self._model_tools = model_tools
        self._writes = _StepWrites(writer, state)

    def begin(self) -> StepWork:
        """A new step at the state's next index."""
        return StepWork(idx=self._state.next_step_idx, prompt_chars=self._state.prompt_chars)

    async def run_from(self, phase: Phase, work: StepWork) -> StopReason | None:
        """Run ``work`` from ``phase`` to its end; the verdict: stop reason or ``None``."""
        next_phase: Phase | None = phase
        handlers = _HANDLERS
        while next_phase is not None:
            next_phase = await handlers[next_phase](self, work)
        return work.verdict

    # ------------------------------------------------------------------ the model

    async def _write_intent(
        self, kind: IntentKind, work: StepWork, policy: ReplayPolicy, then: Phase
    ) -> Phase:
        """Write the step's intent of ``kind`` (with its unwritten model result, if any);
        the next phase, ``then``. The phase's one coroutine across the commit."""
        result_id = (
            _recovery.model_result_id(work.idx)
            if kind is IntentKind.MODEL_CALL
            else _recovery.action_result_id(work.idx)
        )
        retried = work.action_intent if kind is IntentKind.ACTION else None
        # Every part is the library's own or the validated request's: no checks to re-run.
        intent = retried or _new_intent(
            run_id=self._state.run_id,
            kind=kind,
            call_index=work.idx,
            result_id=result_id,
            replay_policy=policy,
            idempotency_key=_recovery.idempotency_key(self._state.run_id, result_id),
            resumed=None,
        )
        paired = work.unwritten_result is not None
        await self._writes.after_result(work, intent, self._writer.write)
        if paired:
            self._state.in_flight = None
        work.load_intent(intent)
        return then

    def _write_model_intent(self, work: StepWork) -> Awaitable[Phase]:
        policy = self._request.model_replay_policy
        return self._write_intent(IntentKind.MODEL_CALL, work, policy, Phase.MODEL_CALL)

    async def _call_model(self, work: StepWork) -> Phase:
        result_id = _recovery.model_result_id(work.idx)
        self._state.in_flight = result_id
        call = _new_model_call(
            messages=tuple(self._state.prompt),
            call_index=work.idx,
            run_id=self._state.run_id,
            result_id=result_id,
            binding=self._request.model_binding,
            tools=self._model_tools,
            idempotency_key=work.model_key,
        )
        started = time.monotonic()
        work.model_started_ns = time.time_ns()
        try:
            reply = await bounded(
                self._definition.model_client.call(call),
                self._request.model_call_timeout_seconds,
                "the model call",
                "model_call_timeout_seconds",
            )
        except Exception as exc:  # noqa: BLE001 - the ModelClient contract: any raise is a failed call
            work.model_finished_ns = time.time_ns()
            await self._record_model_failure(work, exc, elapsed_ms(started))
            return Phase.REPLY
        work.model_finished_ns = time.time_ns()
        work.model_ms = elapsed_ms(started)
        if not isinstance(reply, ModelReply):
            raise PolyloopTypeError(
                f"{type(self._definition.model_client).__name__}.call returned "
                f"{type(reply).__name__}; a ModelClient must return a ModelReply"
            )
        result = _new_model_call_result(
            run_id=self._state.run_id,
            result_id=result_id,
            reply=reply,
            failure=None,
            duration_ms=work.model_ms,
            context_length_exceeded=False,
            resumed=None,
        )
        await self._writes.model_result(work, result)
        return Phase.REPLY

    async def _record_model_failure(self, work: StepWork, exc: Exception, model_ms: int) -> None:
        failure = describe_exception(exc)
        logger.warning(
            "run %s step %d: model call failed after %d ms: %s",
            self._state.run_id,
            work.idx,
            model_ms,
            failure,
        )
        result = ModelCallResult(
            run_id=self._state.run_id,
            result_id=_recovery.model_result_id(work.idx),
            reply=None,
            failure=failure,
            duration_ms=model_ms,
            context_length_exceeded=isinstance(exc, ContextLengthExceededError),
        )
        await self._writes.model_result(work, result)

    # ------------------------------------------------------------------ the reply

    async def _read_reply(self, work: StepWork) -> Phase:
        texts = self._definition.synthetic_observations
        if work.model_failed:
            work.record = self._record(work, observation=texts.model_call_failed, synthetic=True)
            work.facts = StepFacts(
                model_failed=True,
                final_answer=False,
                outcome=None,
                tool_completes_run=False,
                context_length_exceeded=work.context_length_exceeded,
            )
            return Phase.STEP_RECORD
        assert work.reply is not None
        parsed = parse_reply(
            self._definition.decision_parser, work.reply, self._state.run_id, work.idx
        )
        if isinstance(parsed, str):
            work.record = self._record(work, observation=parsed, synthetic=True, parse_error=parsed)
            work.forced_stop = StopReason.PARSER_ERROR
            return Phase.STEP_RECORD
        work.parsed = parsed
        decision = parsed.decision
        if isinstance(decision, InvalidDecision):
            explanation = decision.explanation
            work.record = self._record(
                work, observation=explanation, synthetic=True, parse_error=explanation
            )
            return Phase.STEP_RECORD
        if isinstance(decision, FinalAnswer):
            work.record = self._record(work, observation="", synthetic=False)
            work.facts = StepFacts(
                model_failed=False, final_answer=True, outcome=None, tool_completes_run=False
            )
            self._state.final_answer = decision.text
            return Phase.STEP_RECORD
        work.load_action(parsed, decision, tool_flags(self._request.tools, decision))
        return Phase.APPROVAL

    # ------------------------------------------------------------------ approval

    async def _ask_approval(self, work: StepWork) -> Phase | None:
        """Stop for a person's approval when the call's tool asks for it (design 0210)."""
        request = approval_request_for(
            self._request.tools,
            work.action,
            run_id=self._state.run_id,
            step_idx=work.idx,
            expires_seconds=self._request.approval_expires_seconds,
        )
        if request is None:
            return Phase.ACTION_INTENT
        if not self._writer.can_write(ApprovalRequest):
            raise PolyloopTypeError(
                f"tool {request.tool!r} needs approval, but the store "
                f"{type(self._writer.target).__name__} cannot record an approval request (no "
                "write_approval_request: polyloop.ports.SettlingRunStore); use a shipped store"
            )
        paired = work.unwritten_result is not None
        await self._writes.after_result(work, request, self._writer.write)
        if paired:
            self._state.in_flight = None
        self._state.pending_approval = request
        work.verdict = StopReason.AWAITING_APPROVAL
        return None

    def reject(self, work: StepWork, reason: str) -> None:
        """Take in a rejected call (design 0210): the step has no action (nothing executed);
        its observation is the synthetic rejection with the reason."""
        observation = self._definition.synthetic_observations.rejection(reason)
        work.record = self._record(work, observation=observation, synthetic=True)

    # ------------------------------------------------------------------ the action

    def _write_action_intent(self, work: StepWork) -> Awaitable[Phase]:
        assert work.flags is not None
        return self._write_intent(IntentKind.ACTION, work, work.flags.replay_policy, Phase.ACTION)

    async def _execute_action(self, work: StepWork) -> Phase | None:
        action, flags = work.action, work.flags
        assert action is not None
        assert flags is not None
        self._state.in_flight = _recovery.action_result_id(work.idx)
        executor = self._request.executor
        started = time.monotonic()
        work.action_started_ns = time.time_ns()
        work.attempts += 1
        # Only the bound's expiry and ``ToolOutcomeUnknown`` are caught: an executor that
        # raises anything else breaks its contract, and the log must show exactly that
        # ("action intent, no step") so that recovery treats the outcome as unknown.
        try:
            outcome = await _executed(
                self._request, self._action_scope, work, self._with_context(work, action)
            )
        except (SeamTimeoutError, ToolOutcomeUnknown) as exc:
            # Cut off or lost mid-call: whether it acted is unknown (design 0227).
            return await _in_doubt(self._writer, self._state, executor, work, exc)
        except (ChildRunOpenError, TreeLimitError) as exc:  # a child left open, or past a limit
            _stop_for_child(self._state, work, exc)  # (design 0245)
            return None
        work.action_finished_ns = time.time_ns()
        work.action_ms = elapsed_ms(started)
        if not isinstance(outcome, ActionOutcome):
            raise PolyloopTypeError(
                f"{type(executor).__name__}.execute returned "
                f"{type(outcome).__name__}; an ActionExecutor must return an ActionOutcome"
            )
        if outcome.status is ActionStatus.ENV_ERROR and work.in_doubt is not None:
            # A retry that could not reach the tool says nothing about the attempt whose
            # outcome is unknown: the doubt stands, the run stays open (design 0227).
            _stop_in_doubt(self._state.run_id, work, f"a retry failed: {outcome.observation}")
            return None
        work.in_doubt = None
        self._take_outcome(work, action, outcome, flags)
        return Phase.STEP_RECORD

    def _with_context(self, work: StepWork, action: Action) -> Action:
        """The action as the executor gets it: with the run, the step, its key and where its
        progress goes (the sink's ``emit_progress``, if it has one)."""
        assert work.action_key is not None, "the action's intent is written or loaded first"
        context = _context(action, self._state.run_id, work, self._progress, self._writer)
        if type(action) is Action:  # what replace() builds, without its checks or field walk
            return _new_action(text=action.text, tool_call=action.tool_call, context=context)
        return dataclasses.replace(action, context=context)

    def settle(self, work: StepWork, outcome: ActionOutcome) -> None:
        """Take in the settled outcome of the open step's in-doubt action (design 0206): the
        step records it as if the executor had returned it; nothing is executed."""
        action, flags = work.action, work.flags
        assert action is not None
        assert flags is not None
        self._take_outcome(work, action, outcome, flags)

    def _take_outcome(
        self, work: StepWork, action: Action, outcome: ActionOutcome, flags: ToolFlags
    ) -> None:
        texts = self._definition.synthetic_observations
        if outcome.status is ActionStatus.NOT_EXECUTED:
            observation, synthetic = texts.rejection(outcome.observation), True
        elif outcome.status is ActionStatus.ENV_ERROR:
            observation, synthetic = texts.env_failed, True
        else:
            observation, synthetic = outcome.observation, outcome.observation_is_synthetic
        work.outcome = outcome
        work.record = self._record(
            work,
            observation=observation,
            synthetic=synthetic,
            action=action.text,
            action_status=outcome.status,
            truncated_chars=outcome.observation_truncated_chars,
            child=work.child,
        )
        work.facts = StepFacts(
            model_failed=False,
            final_answer=False,
            outcome=outcome,
            tool_completes_run=flags.completes_run,
        )

    # ------------------------------------------------------------------ the record

    async def _record_step(self, work: StepWork) -> None:
        record = work.record
        assert record is not None
        acted = work.outcome is not None
        completed = _new_step_completed(
            run_id=self._state.run_id,
            result_id=_recovery.action_result_id(work.idx) if acted else None,
            action_outcome=work.outcome,
            step=record,
            resumed=None,
        )
        await self._writes.after_result(work, completed, self._writer.write)
        state = self._state
        state.in_flight = None  # the model result's, or the action's: both are on record
        state.add_step(record)
        delivered = await deliver_step_event(
            self._definition.event_sink,
            self._request.event_timeout_seconds,
            run_id=state.run_id,
            record=record,
            model_binding=self._request.model_binding,
            clock=work,
            tool_call=work.tool_call,
            model_failed=work.model_failed,
            failures_before=state.event_failures,
        )
        if not delivered:
            state.event_failures += 1
        verdict = _stopping.stop_after_step(self._request.budget, state.counters, work.facts)
        work.verdict = verdict if work.forced_stop is None else work.forced_stop

    def _record(
        self,
        work: StepWork,
        *,
        observation: str,
        synthetic: bool,
        parse_error: str | None = None,
        action: str | None = None,
        action_status: ActionStatus | None = None,
        truncated_chars: int = 0,
        child: ChildRun | None = None,
    ) -> StepRecord:
        reply, parsed = work.reply, work.parsed
        # Only the library's values and validated objects' (design 0214).
        return _new_step_record(
            step_idx=work.idx,
            # A failed model call has nothing parsed, so its history turn is empty.
            raw_output="" if parsed is None else parsed.history_text,
            content_chars=0 if reply is None else len(reply.content),
            thinking_chars=0 if reply is None else len(reply.thinking),
            action=action,
            parse_ok=parse_error is None,
            parse_error=parse_error,
            observation=observation,
            observation_is_synthetic=synthetic,
            observation_truncated_chars=truncated_chars,
            prompt_chars=work.prompt_chars,
            call_id=None if reply is None else reply.call_id,
            step_wall_ms=elapsed_ms(work.started),
            action_status=action_status,
            usage=None if reply is None else reply.usage,
            model_ms=work.model_ms,
            action_ms=work.action_ms if action_status is not None else None,
            tool_calls=() if parsed is None else parsed.tool_calls,
            cost=_cost_of(self._state.prices, reply),
            child=child,
        )


def _cost_of(prices: ModelPrices | None, reply: ModelReply | None) -> Decimal | None:
    """A step's recorded cost (design 0236): its reported usage at the run's prices; unknown
    (``None``) without prices, without a reply or without reported usage, never zero."""
    if prices is None or reply is None or reply.usage is None:
        return None
    return prices.cost(reply.usage)


_HANDLERS: dict[Phase, _Handler] = {
    Phase.MODEL_INTENT: StepRunner._write_model_intent,
    Phase.MODEL_CALL: StepRunner._call_model,
    Phase.REPLY: StepRunner._read_reply,
    Phase.APPROVAL: StepRunner._ask_approval,
    Phase.ACTION_INTENT: StepRunner._write_action_intent,
    Phase.ACTION: StepRunner._execute_action,
    Phase.STEP_RECORD: StepRunner._record_step,
}
"""Each phase's handler, called with the runner and the step: one table for every run
(a table of bound methods per runner was eight more objects each run kept alive, in a
reference cycle; design 0214)."""


def _stop_for_open_child(state: RunState, work: StepWork, exc: ChildRunOpenError) -> None:
    """A child run stopped left open (awaiting approval, in doubt): the run stops the same
    way, left open, its action intent unanswered, so that resuming it replays the call, which
    re-attaches to the child (design 0245). An approval request is the child's: reachable from
    the top as ``RunResult.pending_approval``."""
    reason = StopReason(exc.stop_reason)
    # The stop is the child's, and the child's log tells it (its own ``ResumeStopped`` when a
    # resume of it stopped again): this run's resume mark, which would say it replayed the
    # call, goes on no ``ResumeStopped`` of this run's (design 0231 ties one to its own stop).
    state.resume_mark = None
    if reason is StopReason.AWAITING_APPROVAL:
        pending = getattr(exc.result, "pending_approval", None)
        state.pending_approval = pending if isinstance(pending, ApprovalRequest) else None
    logger.info(
        "run %s step %d: its child run stopped with %s; this run stops the same way (left open)",
        state.run_id,
        work.idx,
        reason.value,
    )
    work.verdict = reason


async def _executed(
    request: RunRequest,
    scope: Callable[[ToolContext, int], AbstractContextManager[None]] | None,
    work: StepWork,
    action: Action,
) -> ActionOutcome:
    """The executor's outcome of ``action`` (bounded), inside the sink's ``action_scope`` when
    it has one (``TracingSink``, design 0245); whatever the executor raises passes unchanged."""
    execution = bounded(
        request.executor.execute(action),
        request.action_timeout_seconds,
        "the action",
        "action_timeout_seconds",
    )
    if scope is None or action.context is None:
        return await execution
    with scope(action.context, work.started_ns):
        return await execution


def _stop_for_child(
    state: RunState, work: StepWork, exc: ChildRunOpenError | TreeLimitError
) -> None:
    """A child-run call stopped the run: left open below (``ChildRunOpenError``), or refused
    by a tree limit (``TreeLimitError``)."""
    if isinstance(exc, TreeLimitError):
        _stop_for_tree_limit(state, work, exc)
    else:
        _stop_for_open_child(state, work, exc)


def _stop_for_tree_limit(state: RunState, work: StepWork, exc: TreeLimitError) -> None:
    """A child-run call would pass ``max_depth`` or ``max_children``: nothing of the child
    started, so the run finishes ``TREE_LIMIT`` with the call's action intent unanswered (its
    outcome is known: not executed) and ``stop_detail`` naming the limit and the call. A
    resume after a crash before the finish replays the call, which the tool refuses again
    (the limits are read from the log), so it finishes the same way (design 0245)."""
    state.in_flight = None
    state.stop_detail = f"{exc} (call {_recovery.action_result_id(work.idx)})"
    logger.info(
        "run %s step %d: tool %r refused a child run (%s); the run finishes tree_limit",
        state.run_id,
        work.idx,
        exc.tool,
        exc.limit,
    )
    work.verdict = StopReason.TREE_LIMIT


def _context(
    action: Action,
    run_id: str,
    work: StepWork,
    progress: Callable[[ToolProgress], Awaitable[None]] | None,
    writer: RunWriter,
) -> ToolContext:
    """The ``ToolContext`` of ``action``'s execution (``StepRunner._with_context``)."""
    key = work.action_key
    assert key is not None, "the action's intent is written or loaded first"
    call_id = getattr(action.tool_call, "id", None)
    name = getattr(action.tool_call, "name", None)
    # The key and the run id are the library's own, the step index an int, the two names
    # checked right here: nothing for ``__post_init__`` to check.
    return _new_tool_context(
        idempotency_key=key,
        run_id=run_id,
        step_idx=work.idx,
        tool_call_id=call_id if isinstance(call_id, str) and call_id else None,
        tool_name=name if isinstance(name, str) else None,
        progress_reporter=progress,
        child_reporter=work.take_child,
        lease_check=writer.check_lease,  # the run's lease, checked before a child (0245)
    )


async def _in_doubt(
    writer: RunWriter, state: RunState, executor: object, work: StepWork, error: Exception
) -> Phase | None:
    """The executor could not tell whether the action took effect (``error``: the action
    bound's ``SeamTimeoutError`` or ``ToolOutcomeUnknown``; design 0227). On record as an
    ``unknown`` settlement by the executor (when the store records settlements), then: a
    ``SAFE`` or ``IDEMPOTENT`` action goes to the executor again (the same intent, the same
    key) up to ``IN_DOUBT_ATTEMPTS`` times, then stops ``RETRIES_EXHAUSTED``; a ``NEVER`` one
    stops the step with ``RESUME_STATE_UNKNOWN`` (the driver asks its reconciler, if it has
    one; otherwise the run is left open for a person)."""
    assert work.flags is not None
    reason = describe_exception(error)
    work.in_doubt = reason
    result_id = _recovery.action_result_id(work.idx)
    name = work.tool_call.name if work.tool_call is not None else None
    if writer.can_write(Settlement):
        await writer.write(
            Settlement(
                run_id=state.run_id,
                result_id=result_id,
                verdict=SettlementVerdict.UNKNOWN,
                source=SettlementSource.EXECUTOR,
                by=name if isinstance(name, str) and name else type(executor).__name__,
                at=datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
                note=reason,
            )
        )
    policy = work.flags.replay_policy
    logger.warning(
        "run %s step %d: the outcome of %s (%s, attempt %d) is unknown: %s",
        state.run_id,
        work.idx,
        result_id,
        policy.value,
        work.attempts,
        reason,
    )
    if policy is ReplayPolicy.NEVER:
        work.verdict = StopReason.RESUME_STATE_UNKNOWN
        return None
    if work.attempts < IN_DOUBT_ATTEMPTS:
        return Phase.ACTION
    _stop_in_doubt(state.run_id, work, f"{work.attempts} attempts, none with an outcome")
    return None


def _stop_in_doubt(run_id: str, work: StepWork, why: str) -> None:
    """Leave the run open with the action in doubt: a resume tries it again."""
    logger.error(
        "run %s step %d: the action stays in doubt (%s); the run stops with "
        "retries_exhausted, open: resume tries it again with the same idempotency key",
        run_id,
        work.idx,
        why,
    )
    work.verdict = StopReason.RETRIES_EXHAUSTED
