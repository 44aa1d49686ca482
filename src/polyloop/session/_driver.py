"""The driver of one run id: lease, start, resume, continuation, the loop, cancellation, finish.

===================  ==========================================================================
entry                what happens, in order
===================  ==========================================================================
``start``            lease; refuse a used run id (``RunIdentityError``); write ``RunStarted``
                     with the snapshot (and the context, unless ``record_context=False``,
                     design 0215); the loop from a new step
``resume``           lease; plan the log (``polyloop._recovery``); refuse FRESH and CORRUPT;
                     return a finished run's result; drift guard; pin a dangling action's
                     policy; rebuild the state from the stored steps; the last stored step's
                     stop, if it should have stopped; then the plan's entry phase
                     (``_resume.ENTRY_PHASE``), the first record it writes (of whatever
                     kind) carrying the resume mark (``resumed``, design 0215)
``continue_         lease (of the new id); copy the cancelled run minus its finish
cancelled``          (``_continuation``; for ``continue_run`` also a run stopped by
                     ``ACTION_TIMEOUT`` or ``LLM_ERROR``, design 0243); then as ``resume``
``fork``             lease (of the new id); copy the source's first *k* steps under the new
                     settings, unless the id already holds that fork (``_continuation``);
                     then as ``resume`` (design 0239)
===================  ==========================================================================

The loop checks the stop conditions before every model call (``stop_before_call``: the budgets
and the prompt limits, which never truncate) and after every step (``stop_after_step``).
Exactly one ``RunFinished`` is written, shielded, and is durable before the call returns,
except for the stops that leave the run open for a decision from outside:
``RESUME_STATE_UNKNOWN`` (design 0206), ``AWAITING_APPROVAL`` (design 0210) and
``RETRIES_EXHAUSTED`` (design 0227: a resume tries the action in doubt again). A ``NEVER``
action the executor leaves in doubt is put to its tool's reconciler within the same call
(``_step_from``), as a resume would (design 0227).

Cancellation: a ``CancelledError`` is re-raised unchanged after a ``RunFinished`` with
``CANCELLED`` is written, waiting at most ``cancel_grace_seconds`` for that write (a normal
finish already being written is waited for instead: one finish per run).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Coroutine
from typing import Any

from polyloop import _recovery, _stopping
from polyloop._recovery import ResumeAction, ResumePlan
from polyloop.errors import RunIdentityError
from polyloop.ports import (
    Action,
    ParsedReply,
    RunLog,
    ToolContext,
    frozen_tool_schemas,
)
from polyloop.session._config import AgentDefinition, RunRequest, full_snapshot, run_prices
from polyloop.session._continuation import (
    begin_fork,
    complete_copy,
    complete_fork,
    copy_cancelled,
)
from polyloop.session._leasing import RunWriter, checked_lease_wait, held_lease
from polyloop.session._resume import ENTRY_PHASE, StoredRun, settled_outcome
from polyloop.session._seams import claimed_max_output_tokens, claims_native_tool_calls
from polyloop.session._settling import ask_reconciler, expire
from polyloop.session._state import LEFT_OPEN, RunState
from polyloop.session._step import IN_DOUBT_ATTEMPTS, Phase, StepRunner, StepWork
from polyloop.tools import ToolSpec
from polyloop.types import (
    ResumeMark,
    ResumeStopped,
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    SettlementVerdict,
    StopReason,
)

__all__ = ["RunDriver"]

logger = logging.getLogger("polyloop.session")


class RunDriver:
    """The loop for one run id. Not reusable; one instance per ``run``/``resume`` call."""

    def __init__(
        self, definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float
    ) -> None:
        self._definition = definition
        self._request = request
        self._store = definition.store
        self._run_id = request.run_id
        self._lease_wait_seconds = checked_lease_wait(lease_wait_seconds)
        self._state = RunState(request, run_prices(definition, request))
        self._max_output_tokens = claimed_max_output_tokens(definition.model_client)
        self._finish_task: asyncio.Task[None] | None = None
        # Set once the lease is held: every write of the run goes through it (design 0220).
        self._held: RunWriter | None = None
        self._steps: StepRunner | None = None

    # ---------------------------------------------------------------- entry points

    async def start(self) -> RunResult:
        async with held_lease(self._store, self._run_id, self._lease_wait_seconds) as writer:
            self._hold(writer)
            await self._start()
            # Not from inside ``_start``: its frame (the start's task, the snapshot) would
            # stay alive for the whole run (design 0214).
            return await self._guarded(self._loop(first=None))

    async def resume(self) -> RunResult:
        async with held_lease(self._store, self._run_id, self._lease_wait_seconds) as writer:
            self._hold(writer)
            return await self._resume()

    async def continue_cancelled(
        self,
        stopped_run_id: str,
        allowed: frozenset[StopReason] = frozenset({StopReason.CANCELLED}),
    ) -> RunResult:
        """Copy the run ``stopped_run_id`` (stopped for one of ``allowed``) and resume."""
        async with held_lease(self._store, self._run_id, self._lease_wait_seconds) as writer:
            self._hold(writer)
            await copy_cancelled(self._store, writer, stopped_run_id, self._run_id, allowed)
            return await self._resume()

    async def fork(self, source_run_id: str, at: int) -> RunResult:
        async with held_lease(self._store, self._run_id, self._lease_wait_seconds) as writer:
            self._hold(writer)
            request = self._request
            settings = (
                full_snapshot(self._definition, request),
                request.context if request.record_context else None,
            )
            await begin_fork(self._store, writer, source_run_id, self._run_id, at, settings)
            # A fork made earlier (this call again, or python -m polyloop fork) continues
            # exactly as a resume, its interrupted copy completed first.
            return await self._resume()

    def _hold(self, writer: RunWriter) -> None:
        self._held = writer
        # Offered on every model call when the parser reads native tool calls (design 0100);
        # the run's registry (narrowed or not) is the one source, as for validation.
        # Frozen here, once: every ModelCall of the run passes them on as they are.
        model_tools = (
            frozen_tool_schemas(self._request.tools.schema_for_model())
            if claims_native_tool_calls(self._definition.decision_parser)
            else ()
        )
        self._steps = StepRunner(self._definition, self._request, self._state, writer, model_tools)

    @property
    def _writer(self) -> RunWriter:
        assert self._held is not None, "the lease is taken before anything is written"
        return self._held

    @property
    def _runner(self) -> StepRunner:
        assert self._steps is not None, "the lease is taken before any step runs"
        return self._steps

    # ---------------------------------------------------------------- start and resume

    async def _start(self) -> None:
        """Write the run's ``RunStarted`` (its id must have no log)."""
        log = await self._store.read_log(self._run_id)
        if not log.is_empty:
            raise RunIdentityError(
                f"run id {self._run_id!r} already has a log; call resume() to continue it, "
                "or choose a new run id"
            )
        snapshot = full_snapshot(self._definition, self._request)
        start_write = asyncio.ensure_future(
            self._writer.write(
                RunStarted(
                    run_id=self._run_id,
                    parameter_snapshot=snapshot,
                    context=self._request.context if self._request.record_context else None,
                    parent=self._request.parent,
                )
            )
        )
        try:
            # Shielded: a store may finish the write even if we stop waiting (the JSONL store
            # writes in a thread). If it lands, the run exists and must get its marker.
            await asyncio.shield(start_write)
        except asyncio.CancelledError:
            if await _settled_within_grace(
                start_write,
                grace=self._request.cancel_grace_seconds,
                run_id=self._run_id,
                what="the RunStarted record",
            ):
                await self._finish_after_cancel()
            raise
        except FileExistsError as exc:
            raise RunIdentityError(
                f"run id {self._run_id!r} was claimed by another start between our check and "
                "our first write (two processes racing on one id), or an earlier start died "
                "before its first record was complete; only one of them may own the id. "
                "Choose a new run id, or inspect the store's entry for this id"
            ) from exc

    async def _read_stored(self) -> StoredRun:
        log = await self._store.read_log(self._run_id)
        stored = StoredRun(
            self._definition, self._request, log, _recovery.plan_resume(log, self._run_id)
        )
        if stored.plan.action is ResumeAction.FRESH:
            raise RunIdentityError(
                f"run id {self._run_id!r} has no log in this store, so there is nothing to "
                "resume; call run() to start it (and check that the store points at the "
                "right place)"
            )
        stored.refuse_if_corrupt()
        return stored

    async def _resume(self) -> RunResult:
        stored = await self._read_stored()
        if await complete_copy(self._store, self._writer, stored.log) or await complete_fork(
            self._store, self._writer, stored.log
        ):
            # An interrupted continue_cancelled or fork: its copy is whole now (designs
            # 0206, 0239).
            stored = await self._read_stored()
        if stored.plan.action is ResumeAction.ALREADY_FINISHED:
            return stored.finished_result()  # warns when the settings changed (design 0217)
        stored.check_drift()
        pending = stored.pending_action()
        reconciler = stored.reconciler_for(pending if isinstance(pending, ParsedReply) else None)
        expired = stored.expired_request(datetime.datetime.now(datetime.UTC))
        if reconciler is not None and isinstance(pending, ParsedReply):
            # Asked once per resume call; its answer is on record, so plan the log again.
            await self._ask_reconciler(stored, reconciler, pending)
            stored = await self._read_stored()
            pending = stored.pending_action()
        elif expired is not None:
            # The request outlived its expiry: rejected, on record, before anything acts on it.
            await expire(expired, self._writer)
            stored = await self._read_stored()
            pending = stored.pending_action()
        for completed in stored.log.steps:
            self._state.add_step(completed.step)
        if isinstance(pending, StopReason):
            return await self._guarded(self._finish(pending))
        return await self._guarded(self._resume_from(stored, pending))

    async def _ask_reconciler(self, stored: StoredRun, spec: ToolSpec, parsed: ParsedReply) -> None:
        intent = stored.plan.pending_intent
        action = parsed.decision
        assert intent is not None
        assert isinstance(action, Action)
        assert action.tool_call is not None
        call_id = getattr(action.tool_call, "id", None)
        context = ToolContext(
            idempotency_key=intent.idempotency_key
            or _recovery.idempotency_key(intent.run_id, intent.result_id),
            run_id=self._run_id,
            step_idx=intent.call_index,
            tool_call_id=call_id if isinstance(call_id, str) and call_id else None,
        )
        await ask_reconciler(
            spec,
            context,
            action.tool_call.arguments,
            result_id=intent.result_id,
            timeout_seconds=self._request.reconcile_timeout_seconds,
            writer=self._writer,
        )

    async def _resume_from(self, stored: StoredRun, replayed: ParsedReply | None) -> RunResult:
        plan: ResumePlan = stored.plan
        # The first record this resume writes, whatever its kind, says so (design 0215); a
        # fork's first run is no resume (design 0239): nothing of its own ran before it.
        if not _unrun_fork(stored.log):
            self._state.resume_mark = _resume_mark(plan, self._writer)
        if self._state.steps:
            reason = stored.stop_for_last_step(self._state)
            if reason is not None:
                return await self._finish(reason)
        if plan.action is ResumeAction.STOP_UNKNOWN:
            idx = plan.next_step_idx
            unanswered = plan.pending_model_result is None
            self._state.in_flight = (
                _recovery.model_result_id(idx) if unanswered else _recovery.action_result_id(idx)
            )
            # An action in doubt: no RunFinished, the run stays open, so that a reconciler can
            # be asked again or a person can settle it (resolve); every resume until then
            # returns this same result and executes nothing (design 0206). A model call in
            # doubt cannot be settled by anyone (its reply cannot be supplied), so that run
            # finishes: its RunFinished is written.
            return await self._finish(StopReason.RESUME_STATE_UNKNOWN, leave_open=not unanswered)
        if plan.action is ResumeAction.AWAITING_APPROVAL:
            self._state.pending_approval = plan.approval_request
            return await self._finish(StopReason.AWAITING_APPROVAL)
        phase = ENTRY_PHASE[plan.action]
        if phase is Phase.MODEL_INTENT:
            return await self._loop(first=None)
        work = stored.open_step(self._runner, replayed)
        return await self._loop(first=await self._step_from(phase, work))

    # ---------------------------------------------------------------- the loop

    async def _loop(self, first: StopReason | None) -> RunResult:
        """Step until a stop reason appears; ``first`` is the verdict of a step already done."""
        reason = first
        while reason is None:
            reason = _stopping.stop_before_call(
                self._request.budget,
                self._state.counters,
                self._state.prompt_chars,
                prices=self._state.prices,
                max_output_tokens=self._max_output_tokens,
            )
            if reason is not None:
                break
            reason = await self._step_from(Phase.MODEL_INTENT, self._runner.begin())
        return await self._finish(reason)

    async def _step_from(self, phase: Phase, work: StepWork) -> StopReason | None:
        """Run ``work`` from ``phase``; a ``NEVER`` action the executor left in doubt goes to
        its tool's reconciler now, as a resume would send it (design 0227): ``executed``
        records the step with its observation, ``not_executed`` announces the action again
        and runs it (at most ``IN_DOUBT_ATTEMPTS`` attempts), ``unknown`` (or no reconciler,
        or a store that cannot record settlements) leaves the run open."""
        verdict = await self._runner.run_from(phase, work)
        while verdict is StopReason.RESUME_STATE_UNKNOWN and work.in_doubt is not None:
            spec = self._reconciler_of(work)
            if spec is None:
                return verdict
            settlement = await self._ask_about(spec, work)
            if settlement.verdict is SettlementVerdict.EXECUTED:
                self._runner.settle(work, settled_outcome(settlement))
                phase = Phase.STEP_RECORD
            elif settlement.verdict is SettlementVerdict.NOT_EXECUTED:
                if work.attempts >= IN_DOUBT_ATTEMPTS:
                    return StopReason.RETRIES_EXHAUSTED  # resume retries it (RETRY_SETTLED)
                phase = Phase.ACTION_INTENT
            else:
                return verdict
            work.in_doubt = None
            verdict = await self._runner.run_from(phase, work)
        return verdict

    def _reconciler_of(self, work: StepWork) -> ToolSpec | None:
        call = work.tool_call
        if call is None or not isinstance(call.name, str):
            return None
        spec = self._request.tools.spec_for(call.name)
        if spec is None or spec.reconcile is None or not self._writer.can_write(Settlement):
            return None
        return spec

    async def _ask_about(self, spec: ToolSpec, work: StepWork) -> Settlement:
        call = work.tool_call
        assert call is not None
        assert work.action_key is not None
        call_id = getattr(call, "id", None)
        context = ToolContext(
            idempotency_key=work.action_key,
            run_id=self._run_id,
            step_idx=work.idx,
            tool_call_id=call_id if isinstance(call_id, str) and call_id else None,
        )
        return await ask_reconciler(
            spec,
            context,
            call.arguments,
            result_id=_recovery.action_result_id(work.idx),
            timeout_seconds=self._request.reconcile_timeout_seconds,
            writer=self._writer,
        )

    # ---------------------------------------------------------------- cancellation

    async def _guarded(self, body: Coroutine[Any, Any, RunResult]) -> RunResult:
        """Run the loop; on cancellation write the CANCELLED finish, then re-raise."""
        try:
            result = await body
        except asyncio.CancelledError:
            await self._finish_after_cancel()
            raise
        return result

    async def _finish_after_cancel(self) -> None:
        """Write the ``CANCELLED`` finish (unless a finish is already being written) and wait
        for it within the grace period. Never raises: the caller re-raises the cancellation."""
        if self._finish_task is None:
            self._finish_task = asyncio.ensure_future(
                self._writer.write(
                    self._state.marked(
                        RunFinished(
                            run_id=self._run_id, result=self._state.result(StopReason.CANCELLED)
                        )
                    )
                )
            )
        # If a normal finish was already being written, waiting for it is all there is to do:
        # a run gets exactly one RunFinished record.
        await _settled_within_grace(
            self._finish_task,
            grace=self._request.cancel_grace_seconds,
            run_id=self._run_id,
            what="the cancelled-run marker",
        )

    # ---------------------------------------------------------------- finishing

    async def _finish(self, reason: StopReason, *, leave_open: bool | None = None) -> RunResult:
        result = self._state.result(reason)
        if reason in LEFT_OPEN if leave_open is None else leave_open:
            # No RunFinished: the run waits for a decision from outside (a settlement, an
            # approval) and goes on once it is on record (designs 0206, 0210).
            await self._mark_stopped_resume(result)
            return result
        self._finish_task = asyncio.ensure_future(
            self._writer.write(self._state.marked(RunFinished(run_id=self._run_id, result=result)))
        )
        # Shielded: a cancellation arriving now must not tear the one finish record; the
        # cancel path waits for this same task instead of writing a second record.
        await asyncio.shield(self._finish_task)
        return result

    async def _mark_stopped_resume(self, result: RunResult) -> None:
        """A resume that stops again, waiting, with its mark not yet on any record: write
        the mark on a ``ResumeStopped`` (design 0231), so the resume is visible. Skipped for a
        store that cannot take the kind (no ``write_record``: a store written against 0.2.0),
        which keeps the 1.8 behaviour of such a resume: no trace."""
        mark = self._state.resume_mark
        if (
            mark is None
            or result.stop_reason not in LEFT_OPEN
            or not self._writer.can_write(ResumeStopped)
        ):
            return
        request = result.pending_approval
        waits_on = result.unknown_outcome if request is None else request.result_id
        assert waits_on is not None, "a run left open waits on an execution or a call"
        self._state.resume_mark = None
        await self._writer.write(
            ResumeStopped(
                run_id=self._run_id,
                stop_reason=result.stop_reason,
                result_id=waits_on,
                resumed=mark,
            )
        )


async def _settled_within_grace(
    write: asyncio.Future[None], *, grace: float, run_id: str, what: str
) -> bool:
    """Wait for a store write after a cancellation, at most ``grace`` seconds (the request's
    ``cancel_grace_seconds``).

    True when the write completed. A write that times out or fails is logged and reported
    as False; its exception must not replace the ``CancelledError`` the caller re-raises.
    """
    try:
        await asyncio.wait_for(asyncio.shield(write), grace)
    except TimeoutError:
        logger.error(  # noqa: TRY400 - a timeout has no useful traceback
            "run %s: %s was not durable within %.1f s of the cancellation; the run will "
            "look interrupted (resumable) rather than cancelled",
            run_id,
            what,
            grace,
        )
        return False
    except Exception:  # the store failed; the cancellation still wins and is re-raised
        logger.exception(
            "run %s: writing %s failed after the cancellation; the run will look "
            "interrupted (resumable) rather than cancelled",
            run_id,
            what,
        )
        return False
    return True


def _unrun_fork(log: RunLog) -> bool:
    """Whether ``log`` is a fork holding its copy and nothing of its own (design 0239): the
    process that goes on from it is the fork's first, not a resume (no mark, design 0215)."""
    started = log.started
    origin = None if started is None else started.fork
    return origin is not None and len(log.entries) <= origin.records


def _resume_mark(plan: ResumePlan, writer: RunWriter) -> ResumeMark:
    """What the first record of this resume says about it (design 0215): when, the plan,
    the step it enters at and the fencing epoch of the lease it holds (``None`` without one)."""
    epoch = writer.epoch
    return ResumeMark(
        at=datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        plan=plan.action.value,
        step_idx=plan.next_step_idx,
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
    )
