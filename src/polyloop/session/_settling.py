"""Settling an execution in doubt: a reconciler's answer, or a person's resolution (0206).

An execution is *in doubt* when its ``NEVER`` action intent is durable and its result is not
(the process died inside the tool). Recovery never guesses; this room gets the verdict from
someone who knows, puts it on record as a ``Settlement`` (a durability barrier, written through
the run's lease), and only then does resume act on it:

==============  ======================================  ==================================
verdict         resume then                             written by
==============  ======================================  ==================================
executed        records the step with the verdict's     a reconciler, or ``resolve``
                observation (``settled_by`` set);
                executes nothing
not_executed    executes the action now, with its       a reconciler, or ``resolve``
                recorded idempotency key
unknown         stops with ``resume_state_unknown``     a reconciler only (its reason, or
                (no finish is written: the run stays    the exception or timeout that
                in doubt, to be asked again or          stood in for an answer)
                resolved)
==============  ======================================  ==================================

``resolve`` refuses (``ResolutionError``, nothing written) when there is nothing to settle.

A person's decision on a call that waits for approval (design 0210) is the same kind of record
on the same path (``_decide``: under the run's lease, plan the log, refuse or write one
``Settlement`` as a barrier): ``approve`` and ``reject`` write verdict ``approved`` or
``rejected`` with the call's ``digest``, and ``expire`` (called by resume, not under a lease of
its own: the resuming driver holds it) rejects a request whose ``expires_at`` passed.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

from polyloop import _recovery
from polyloop._common import describe_exception, require_nonempty_str, require_str
from polyloop._recovery import ResumeAction, ResumePlan
from polyloop.errors import (
    LogCorruptError,
    PolyloopTypeError,
    PolyloopValueError,
    ResolutionError,
    SeamTimeoutError,
)
from polyloop.ports import RunStore, ToolContext
from polyloop.session._decisions import is_expired
from polyloop.session._leasing import RunWriter, checked_lease_wait, held_lease
from polyloop.session._waits import bounded
from polyloop.tools import Reconciliation, ToolSpec
from polyloop.types import (
    ApprovalRequest,
    IntentKind,
    Settlement,
    SettlementSource,
    SettlementVerdict,
)

__all__ = ["approve", "ask_reconciler", "expire", "in_doubt_action", "reject", "resolve"]

logger = logging.getLogger("polyloop.session")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def in_doubt_action(plan: ResumePlan) -> str | None:
    """The result id of the action in doubt under ``plan``, or ``None``."""
    intent = plan.pending_intent
    if plan.action is not ResumeAction.STOP_UNKNOWN or intent is None:
        return None
    return intent.result_id if intent.kind is IntentKind.ACTION else None


async def _write(writer: RunWriter, settlement: Settlement) -> None:
    if not writer.can_write(Settlement):
        raise ResolutionError(
            f"run {settlement.run_id!r}: the store {type(writer.target).__name__} cannot record a "
            "settlement (it has no write_settlement); use a shipped store, or add the method "
            "(polyloop.ports.SettlingRunStore)",
            reason="store_cannot_settle",
        )
    await writer.write(settlement)


async def ask_reconciler(
    spec: ToolSpec,
    context: ToolContext,
    arguments: object,
    *,
    result_id: str,
    timeout_seconds: float | None,
    writer: RunWriter,
) -> Settlement:
    """Ask ``spec.reconcile`` about the in-doubt execution ``result_id`` and put the answer on
    record. A reconciler that raises, returns no ``Reconciliation`` or outlives
    ``timeout_seconds`` is an ``unknown`` answer whose reason says so (and is logged)."""
    reconcile = spec.reconcile
    assert reconcile is not None
    answer: object
    try:
        answer = await bounded(
            reconcile(context, arguments),  # type: ignore[arg-type]
            timeout_seconds,
            f"the reconciler of tool {spec.name!r}",
            "reconcile_timeout_seconds",
        )
    except SeamTimeoutError as exc:
        answer = Reconciliation.unknown(str(exc))
    except Exception as exc:  # the Reconciler contract: a raise is an unknown answer, reported
        logger.warning(
            "run %s: the reconciler of tool %r raised; %s stays in doubt",
            context.run_id,
            spec.name,
            result_id,
            exc_info=exc,
        )
        answer = Reconciliation.unknown(f"the reconciler raised {describe_exception(exc)}")
    if not isinstance(answer, Reconciliation):
        answer = Reconciliation.unknown(
            f"the reconciler returned {type(answer).__name__}, not a Reconciliation"
        )
    settlement = Settlement(
        run_id=context.run_id,
        result_id=result_id,
        verdict=answer.verdict,
        source=SettlementSource.RECONCILER,
        by=spec.name,
        at=_now(),
        observation=answer.observation,
        note=answer.reason,
    )
    await _write(writer, settlement)
    logger.info(
        "run %s: the reconciler of tool %r settled %s as %s",
        context.run_id,
        spec.name,
        result_id,
        answer.verdict.value,
    )
    return settlement


def _check_resolution_arguments(
    executed: object, observation: object, by: object, note: object
) -> None:
    if not isinstance(executed, bool):
        raise PolyloopTypeError(
            f"resolve: executed must be True or False, got {type(executed).__name__}"
        )
    if executed and not isinstance(observation, str):
        raise PolyloopTypeError(
            "resolve: executed=True needs observation=<str>: what the tool's system says "
            f"happened becomes the step's observation; got {type(observation).__name__}"
        )
    if not executed and observation is not None:
        raise PolyloopValueError(
            "resolve: executed=False takes no observation (the action runs now and its "
            "own observation is recorded)"
        )
    require_nonempty_str("resolve", "by", by)
    require_str("resolve", "note", note)


def _refusal(run_id: str, plan: ResumePlan, result_id: str) -> ResolutionError | None:
    """Why ``result_id`` of ``run_id`` cannot be settled under ``plan``, or ``None``."""
    where = f"resolve: run {run_id!r}"
    if plan.action is ResumeAction.FRESH:
        return ResolutionError(f"{where} has no log in this store", reason="no_log")
    if plan.action is ResumeAction.ALREADY_FINISHED:
        return ResolutionError(
            f"{where} is finished; nothing in it can be settled any more", reason="finished"
        )
    intent = plan.pending_intent
    if plan.action is ResumeAction.STOP_UNKNOWN and intent is not None:
        if intent.kind is IntentKind.MODEL_CALL:
            return ResolutionError(
                f"{where}: what is in doubt is the model call {intent.result_id!r}; only an "
                "action can be settled (a model call's reply cannot be supplied by hand)",
                reason="model_call",
            )
        if intent.result_id != result_id:
            return ResolutionError(
                f"{where}: the execution in doubt is {intent.result_id!r}, not {result_id!r}",
                reason="wrong_result_id",
            )
        return None
    return ResolutionError(
        f"{where} has no action in doubt ({plan.detail}); there is nothing to settle",
        reason="nothing_in_doubt",
    )


async def _decide(
    store: RunStore,
    run_id: str,
    lease_wait_seconds: float,
    decide: Callable[[ResumePlan], Settlement | None],
) -> Settlement:
    """The one path of every decision from outside a run (``resolve``, ``approve``,
    ``reject``): under the run's lease, read and plan the log, let ``decide`` refuse (raise),
    answer with the decision already on record (return ``None`` for "nothing to write"), or
    build the ``Settlement`` that is then written, fenced, as a barrier."""
    require_nonempty_str("decision", "run_id", run_id)
    wait = checked_lease_wait(lease_wait_seconds)
    async with held_lease(store, run_id, wait) as writer:
        log = await store.read_log(run_id)
        plan = _recovery.plan_resume(log, run_id)
        if plan.action is ResumeAction.CORRUPT:
            raise LogCorruptError(
                f"run {run_id!r}: {plan.detail}; the decision is refused",
                line=None if plan.breach is None else plan.breach.line,
            )
        settlement = decide(plan)
        if settlement is None:
            assert plan.settlement is not None
            return plan.settlement
        await _write(writer, settlement)
    return settlement


async def resolve(
    store: RunStore,
    run_id: str,
    *,
    result_id: str,
    executed: bool,
    observation: str | None = None,
    by: str,
    note: str = "",
    lease_wait_seconds: float = 0.0,
) -> Settlement:
    """Settle the run's one execution in doubt by a person's word; return the record written.

    ``executed=True`` with ``observation``: it happened (``resume`` records the step with that
    observation); ``executed=False``: it did not (``resume`` executes the action, with its
    recorded idempotency key). Written under the run's lease (``RunLeaseHeldError`` after
    ``lease_wait_seconds`` when someone holds it) and fenced like every write. Refused with
    ``ResolutionError`` (``reason`` names why; nothing written) when the run has no log, is
    finished, has no action in doubt, when ``result_id`` is not the one in doubt, or the store
    cannot record settlements; ``LogCorruptError`` when the log fails ``check_log``. It does
    not resume the run: call ``resume``/``run_or_resume`` next.
    """
    require_nonempty_str("resolve", "result_id", result_id)
    _check_resolution_arguments(executed, observation, by, note)

    def decide(plan: ResumePlan) -> Settlement:
        refusal = _refusal(run_id, plan, result_id)
        if refusal is not None:
            raise refusal
        return Settlement(
            run_id=run_id,
            result_id=result_id,
            verdict=SettlementVerdict.EXECUTED if executed else SettlementVerdict.NOT_EXECUTED,
            source=SettlementSource.PERSON,
            by=by,
            at=_now(),
            observation=observation if executed else None,
            note=note,
        )

    return await _decide(store, run_id, lease_wait_seconds, decide)


def _approval_refusal(
    run_id: str, plan: ResumePlan, digest: str, verdict: SettlementVerdict, now: datetime.datetime
) -> ResolutionError | None:
    """Why the decision ``verdict`` on the call with ``digest`` cannot be recorded now."""
    where = f"run {run_id!r}"
    if plan.action is ResumeAction.FRESH:
        return ResolutionError(f"{where} has no log in this store", reason="no_log")
    request = plan.approval_request
    if request is None:
        return ResolutionError(
            f"{where} has no call waiting for approval ({plan.detail})", reason="not_awaiting"
        )
    if request.digest != digest:
        return ResolutionError(
            f"{where}: the call waiting for approval has digest {request.digest}, not {digest}; "
            "a decision binds to exactly the call it names (list them: python -m polyloop "
            "approvals)",
            reason="wrong_digest",
        )
    decided = plan.settlement
    if decided is not None and decided.verdict is not verdict:
        return ResolutionError(
            f"{where}: the call {digest} was already {decided.verdict.value} by "
            f"{decided.source.value} {decided.by!r}; a decision is not changed",
            reason="conflicting_decision",
        )
    if decided is None and is_expired(request, now):
        return ResolutionError(
            f"{where}: the request for {digest} expired at {request.expires_at}; resume rejects "
            "it as expired",
            reason="expired",
        )
    return None


async def _decide_approval(
    store: RunStore,
    run_id: str,
    *,
    digest: str,
    verdict: SettlementVerdict,
    by: str,
    note: str,
    lease_wait_seconds: float,
) -> Settlement:
    require_nonempty_str(verdict.value, "digest", digest)
    require_nonempty_str(verdict.value, "by", by)
    require_str(verdict.value, "note", note)

    def decide(plan: ResumePlan) -> Settlement | None:
        now = datetime.datetime.now(datetime.UTC)
        at = now.isoformat(timespec="milliseconds")
        refusal = _approval_refusal(run_id, plan, digest, verdict, now)
        if refusal is not None:
            raise refusal
        if plan.settlement is not None:
            return None  # the same decision again: accepted once, then a no-op
        assert plan.approval_request is not None
        return Settlement(
            run_id=run_id,
            result_id=plan.approval_request.result_id,
            verdict=verdict,
            source=SettlementSource.PERSON,
            by=by,
            at=at,
            note=note,
            digest=digest,
        )

    return await _decide(store, run_id, lease_wait_seconds, decide)


async def approve(
    store: RunStore,
    run_id: str,
    *,
    digest: str,
    by: str,
    note: str = "",
    lease_wait_seconds: float = 0.0,
) -> Settlement:
    """Approve the call the run ``run_id`` waits on (design 0210); return the decision.

    ``digest`` is the call's (``RunResult.pending_approval.digest``; ``python -m polyloop
    approvals`` lists them), so the decision binds to exactly that call. Written under the
    run's lease, fenced, as a barrier. The same approval again returns the one on record and
    writes nothing. Refused with ``ResolutionError`` (nothing written): ``no_log``,
    ``not_awaiting``, ``wrong_digest``, ``conflicting_decision`` (it was rejected),
    ``expired`` (its ``expires_at`` passed), ``store_cannot_settle``. Then ``resume`` runs the
    call under its replay policy.
    """
    return await _decide_approval(
        store,
        run_id,
        digest=digest,
        verdict=SettlementVerdict.APPROVED,
        by=by,
        note=note,
        lease_wait_seconds=lease_wait_seconds,
    )


async def reject(
    store: RunStore,
    run_id: str,
    *,
    digest: str,
    by: str,
    reason: str,
    lease_wait_seconds: float = 0.0,
) -> Settlement:
    """Reject the call the run ``run_id`` waits on (design 0210); return the decision.

    As ``approve``, with a non-empty ``reason``: ``resume`` records the step without executing
    anything, the model reads the synthetic rejection text with ``{reason}`` filled in, and the
    run goes on.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise PolyloopValueError(
            "reject: reason must be a non-empty str; the model reads it and decides what next"
        )
    return await _decide_approval(
        store,
        run_id,
        digest=digest,
        verdict=SettlementVerdict.REJECTED,
        by=by,
        note=reason,
        lease_wait_seconds=lease_wait_seconds,
    )


async def expire(request: ApprovalRequest, writer: RunWriter) -> Settlement:
    """Reject ``request`` as expired (resume found its ``expires_at`` passed); on record."""
    settlement = Settlement(
        run_id=request.run_id,
        result_id=request.result_id,
        verdict=SettlementVerdict.REJECTED,
        source=SettlementSource.EXPIRY,
        by="polyloop",
        at=_now(),
        note="expired",
        digest=request.digest,
    )
    await _write(writer, settlement)
    return settlement
