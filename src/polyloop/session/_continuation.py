"""Copying a run's records to a new run id: the first half of ``continue_cancelled`` and
``continue_run`` (a stopped run's log, minus its finish) and a fork's (a run's first *k* steps,
design 0239).

Cancellation stays exact (design 0163): the cancelled run keeps its ``CANCELLED`` finish. The
new run id gets every other record in write order, so resuming it is exactly resuming after a
crash at the moment of the cancellation. ``continue_run`` (design 0242) copies the same way a
run that stopped with ``ACTION_TIMEOUT`` (its action's intent stays unanswered: the copy is
resumed by that action's replay policy, a ``NEVER`` action is never repeated) or with
``LLM_ERROR``; for ``LLM_ERROR`` the failed step (its model intent, the failed result and the
step record; it executed nothing) is left out too, so the continuation makes that model call
again as a new step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Final

from polyloop import _recovery, serialization
from polyloop._recovery import ResumeAction
from polyloop.errors import (
    ForkError,
    LogCorruptError,
    PolyloopTypeError,
    PolyloopValueError,
    RunIdentityError,
)
from polyloop.ports import LogRecord, RunLog, RunStore
from polyloop.session._leasing import RunWriter
from polyloop.types import (
    Context,
    ForkOrigin,
    Intent,
    IntentKind,
    ReplayPolicy,
    ResumeStopped,
    RunFinished,
    RunStarted,
    SettlementVerdict,
    StepCompleted,
    StopReason,
)

__all__ = [
    "CONTINUABLE",
    "begin_fork",
    "complete_copy",
    "complete_fork",
    "continued_records",
    "copy_cancelled",
    "copy_prefix",
    "prefix_digest",
]

CONTINUABLE: Final = frozenset(
    {StopReason.CANCELLED, StopReason.ACTION_TIMEOUT, StopReason.LLM_ERROR}
)
"""The stop reasons ``continue_run`` continues from (design 0242)."""

_ONLY_CANCELLED: Final = frozenset({StopReason.CANCELLED})


def continued_records(source: RunLog) -> list[LogRecord]:
    """The records of the stopped run ``source`` a continuation copies, in write order: every
    one but the finish, and for ``LLM_ERROR`` also the failed step's (from its model intent on:
    the call failed, so nothing was executed in it)."""
    records: list[LogRecord] = [
        e.record for e in source.entries if not isinstance(e.record, RunFinished)
    ]
    finished = source.finished
    if finished is None or finished.result.stop_reason is not StopReason.LLM_ERROR:
        return records
    for index in range(len(records) - 1, -1, -1):
        record = records[index]
        if isinstance(record, Intent) and record.kind is IntentKind.MODEL_CALL:
            return records[:index]
    return records


def _check_source(
    source: RunLog, source_id: str, allowed: frozenset[StopReason] = _ONLY_CANCELLED
) -> None:
    """Refuse a source that is not a readable run stopped for an ``allowed`` reason, with a
    write order."""
    plan = _recovery.plan_resume(source, source_id)
    if plan.action is ResumeAction.FRESH:
        raise RunIdentityError(f"run id {source_id!r} has no log in this store to continue")
    if plan.action is ResumeAction.CORRUPT:
        raise LogCorruptError(
            f"run {source_id!r}: {plan.detail}; continue_cancelled refused",
            line=None if plan.breach is None else plan.breach.line,
        )
    finished = source.finished
    if finished is None or finished.result.stop_reason not in allowed:
        state = (
            "is unfinished"
            if finished is None
            else (f"finished as {finished.result.stop_reason.value}")
        )
        which = " or ".join(sorted(reason.value for reason in allowed))
        raise RunIdentityError(
            f"run {source_id!r} {state}; only a run that stopped as {which} can be continued "
            "this way (resume() an unfinished run; a run that finished otherwise is done)"
        )
    if not source.entries:
        raise PolyloopValueError(
            f"continue_cancelled: the store returned no write order for run {source_id!r} "
            "(RunLog.entries is empty), so its records cannot be copied in order"
        )


async def copy_cancelled(
    store: RunStore,
    writer: RunWriter,
    source_id: str,
    target_id: str,
    allowed: frozenset[StopReason] = _ONLY_CANCELLED,
) -> None:
    """Write the records of the stopped run ``source_id`` a continuation copies
    (``continued_records``), as ``target_id``; the source must have stopped for an ``allowed``
    reason (``CANCELLED`` only for ``continue_cancelled``).

    Reads through ``store``, writes through ``writer`` (the target's lease when there is one).
    Raises ``PolyloopValueError`` when the two ids are the same, ``RunIdentityError`` when the
    source is not a cancelled run or the target already has a log (or is claimed meanwhile),
    ``LogCorruptError`` when the source fails ``check_log``.
    """
    if source_id == target_id:
        raise PolyloopValueError(
            f"continue_cancelled: request.run_id {source_id!r} is the cancelled run itself; "
            "a cancelled run stays cancelled, so continue it under a new run id"
        )
    source = await store.read_log(source_id)
    _check_source(source, source_id, allowed)
    target = await store.read_log(target_id)
    if not target.is_empty:
        raise RunIdentityError(
            f"run id {target_id!r} already has a log; continue the stopped run under a new run id"
        )
    for copied in continued_records(source):
        record = dataclasses.replace(copied, run_id=target_id)
        if isinstance(record, RunStarted):
            record = dataclasses.replace(record, continues=source_id)
            try:
                await writer.write(record)
            except FileExistsError as exc:
                raise RunIdentityError(
                    f"run id {target_id!r} was claimed while the cancelled run was being "
                    "copied to it; choose another new run id"
                ) from exc
        else:
            await writer.write(record)


async def complete_copy(store: RunStore, writer: RunWriter, target: RunLog) -> bool:
    """Finish an interrupted copy of the cancelled run ``target`` continues; ``True`` if any
    record was written (the caller reads the log again).

    A copy cut short by a crash leaves a valid prefix of the cancelled run's records. Resumed
    as it stands, it would redo what the cancelled run had already done after the cut (under
    new idempotency keys, too). So, under the target's lease, the records the prefix lacks are
    copied first. A target that is not a prefix of its source (it went on after its copy) is
    left alone.
    """
    started = target.started
    if started is None or started.continues is None or target.finished is not None:
        return False
    source = await store.read_log(started.continues)
    wanted = continued_records(source)
    have = [e.record for e in target.entries]
    if len(have) >= len(wanted):
        return False
    copied = [dataclasses.replace(r, run_id=started.run_id) for r in wanted]
    if isinstance(copied[0], RunStarted):
        copied[0] = dataclasses.replace(copied[0], continues=started.continues)
    if copied[: len(have)] != have:
        return False
    for record in copied[len(have) :]:
        await writer.write(record)
    return True


# --------------------------------------------------------------------------- fork (design 0239)


def prefix_digest(records: Sequence[LogRecord]) -> str:
    """``sha256:<hex>`` of ``records`` (a source's copied records after its ``RunStarted``), as
    the source holds them: each record's payload without its run id, schema version and resume
    mark, as canonical JSON (sorted keys, no spaces), one per line. It names the prefix, not the run
    that holds it: two forks of one source at one step have the same digest."""
    digest = hashlib.sha256()
    for record in records:
        payload = serialization.encode(record)
        for name in (serialization.VERSION_KEY, "resumed", "run_id"):
            payload.pop(name, None)
        line = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest.update(line.encode("utf-8", "surrogatepass") + b"\n")
    return "sha256:" + digest.hexdigest()


def _forkable(source: RunLog) -> list[LogRecord]:
    """The source's records a fork may copy, in write order: all but its ``resume_stopped``
    records, which hold nothing but a mark of the source's own processes (design 0231), and a
    fork drops every mark (``_copied``)."""
    return [entry.record for entry in source.entries if not isinstance(entry.record, ResumeStopped)]


def _prefix(source: RunLog, source_id: str, at: object) -> list[LogRecord]:
    """The source's records that a fork at ``at`` copies: its ``RunStarted`` and every record
    up to and including step ``at - 1``'s ``StepCompleted``, in write order, without its
    ``resume_stopped`` records (``_forkable``)."""
    if isinstance(at, bool) or not isinstance(at, int):
        raise PolyloopTypeError(f"fork: at must be an int step index, got {type(at).__name__}")
    completed = len(source.steps)
    if not 0 <= at <= completed:
        raise PolyloopValueError(
            f"fork: at={at} is outside run {source_id!r}'s completed steps: a fork copies steps "
            f"0 .. at-1, so at must be between 0 and {completed} (the number of steps it "
            "completed)"
        )
    _refuse_open_effect(source, source_id, at)
    records = _forkable(source)
    if at == 0:
        return records[:1]
    end = next(
        index
        for index, record in enumerate(records)
        if isinstance(record, StepCompleted) and record.step.step_idx == at - 1
    )
    return records[: end + 1]


def _refuse_open_effect(source: RunLog, source_id: str, at: int) -> None:
    """Refuse a fork point whose step has an action in doubt (unless its policy is ``SAFE``:
    running it again is harmless) or a call waiting for a person: the source's step ``at``
    may have acted (or may yet act) in the world, and the fork's own step ``at`` could do it
    again (design 0239). An ``IDEMPOTENT`` one is refused too: the fork's calls carry keys of
    the fork's own run id, which the tool's system cannot match to the source's."""
    if any(completed.step.step_idx == at for completed in source.steps):
        return  # the step is complete: its outcome is known, the fork re-decides it
    settled = {
        s.result_id
        for s in source.settlements
        if s.verdict in (SettlementVerdict.EXECUTED, SettlementVerdict.NOT_EXECUTED)
    }
    decided = {s.result_id for s in source.settlements if s.is_approval_decision}
    for intent in source.intents:
        if (
            intent.kind is IntentKind.ACTION
            and intent.call_index == at
            and intent.result_id not in settled
            and intent.replay_policy is not ReplayPolicy.SAFE  # running it again is harmless
        ):
            first = (
                "Settle it first (python -m polyloop resolve)"
                if intent.replay_policy is ReplayPolicy.NEVER
                # IDEMPOTENT: a resume of the source runs it again with its key (nothing to
                # settle: resolve refuses it).
                else "Resume the source run first (it runs the action again with its "
                "idempotency key)"
            )
            raise ForkError(
                f"fork: run {source_id!r}'s step {at} is in doubt (its action's intent "
                f"{intent.result_id} has no result): it may have acted, and a fork at {at} "
                f"could act again. {first}, or fork at a step before {at}",
                reason="in_doubt",
            )
    for request in source.approval_requests:
        if request.step_idx == at and request.result_id not in decided:
            raise ForkError(
                f"fork: run {source_id!r}'s step {at} waits for a person's approval of "
                f"{request.tool!r}: decide it first (python -m polyloop approve or reject), or "
                f"fork at a step before {at}",
                reason="awaiting_approval",
            )


def _copied(record: LogRecord, target_id: str) -> LogRecord:
    """A source's record as the fork holds it: its run id, no resume mark (the mark tells of
    the source's processes)."""
    if getattr(record, "resumed", None) is not None:
        return dataclasses.replace(record, run_id=target_id, resumed=None)  # type: ignore[arg-type]
    return dataclasses.replace(record, run_id=target_id)


def _checked_source(source: RunLog, source_id: str) -> RunStarted:
    plan = _recovery.plan_resume(source, source_id)
    if plan.action is ResumeAction.FRESH:
        raise RunIdentityError(f"fork: run id {source_id!r} has no log in this store to fork")
    if plan.action is ResumeAction.CORRUPT:
        raise LogCorruptError(
            f"run {source_id!r}: {plan.detail}; fork refused",
            line=None if plan.breach is None else plan.breach.line,
        )
    if not source.entries or source.started is None:
        raise PolyloopValueError(
            f"fork: the store returned no write order for run {source_id!r} "
            "(RunLog.entries is empty), so its records cannot be copied in order"
        )
    return source.started


async def begin_fork(
    store: RunStore,
    writer: RunWriter,
    source_id: str,
    target_id: str,
    at: int,
    settings: tuple[Mapping[str, str], Context | None],
) -> None:
    """Write the fork of ``source_id`` at step ``at`` as ``target_id`` when its log is empty
    (``copy_prefix``); when it already holds exactly that fork (this call again, or ``python -m
    polyloop fork``), write nothing: the caller resumes it. Any other log under ``target_id``
    raises ``RunIdentityError`` naming both runs."""
    target = await store.read_log(target_id)
    origin = None if target.started is None else target.started.fork
    if target.is_empty:
        await copy_prefix(store, writer, source_id, target_id, at, settings=settings)
    elif origin is None or (origin.run_id, origin.step_idx) != (source_id, at):
        raise RunIdentityError(
            f"run id {target_id!r} already has a log that is not a fork of {source_id!r} at "
            f"step {at}; choose a new run id for the fork"
        )


async def copy_prefix(
    store: RunStore,
    writer: RunWriter,
    source_id: str,
    target_id: str,
    at: int,
    *,
    settings: tuple[Mapping[str, str], Context | None] | None,
) -> ForkOrigin:
    """Write a fork of ``source_id`` at step ``at`` as ``target_id`` (whose log must be
    empty): its ``RunStarted`` with the origin and ``settings`` (the snapshot and context it
    runs under; ``None``: the source's), then the copied records. Reads through ``store``,
    writes through ``writer`` (the target's lease). Nothing is called or executed."""
    if source_id == target_id:
        raise PolyloopValueError(
            f"fork: the new run id {target_id!r} is the source run itself; a fork is a new run"
        )
    source = await store.read_log(source_id)
    started = _checked_source(source, source_id)
    prefix = _prefix(source, source_id, at)
    target = await store.read_log(target_id)
    if not target.is_empty:
        raise RunIdentityError(f"fork: run id {target_id!r} already has a log; choose a new run id")
    origin = ForkOrigin(
        run_id=source_id,
        step_idx=at,
        records=len(prefix),
        digest=prefix_digest(prefix[1:]),
        chain=() if started.fork is None else started.fork.lineage,
    )
    snapshot, context = (
        (started.parameter_snapshot, started.context) if settings is None else settings
    )
    start = RunStarted(run_id=target_id, parameter_snapshot=snapshot, context=context, fork=origin)
    try:
        await writer.write(start)
    except FileExistsError as exc:
        raise RunIdentityError(
            f"fork: run id {target_id!r} was claimed while the fork was being made; choose "
            "another new run id"
        ) from exc
    for record in prefix[1:]:
        await writer.write(_copied(record, target_id))
    return origin


async def complete_fork(store: RunStore, writer: RunWriter, target: RunLog) -> bool:
    """Finish an interrupted fork copy of ``target``; ``True`` if any record was written.

    A fork whose copy was cut short holds fewer records than its origin counts and nothing
    of its own: resumed as it stands it would redo, live, steps the fork copies. So the
    missing records are copied first, under the fork's lease, after checking that the
    source's prefix still has the digest the origin names (``LogCorruptError`` otherwise).
    """
    started = target.started
    origin = None if started is None else started.fork
    if origin is None or len(target.entries) >= origin.records:
        return False
    source = await store.read_log(origin.run_id)
    prefix = _forkable(source)[: origin.records]
    if len(prefix) < origin.records or prefix_digest(prefix[1:]) != origin.digest:
        raise LogCorruptError(
            f"run {target.entries[0].record.run_id!r} is a fork of {origin.run_id!r} at step "
            f"{origin.step_idx} whose copy was interrupted, and the source no longer holds the "
            f"prefix with digest {origin.digest}; resume refused",
            line=None,
        )
    run_id = target.entries[0].record.run_id
    have = [entry.record for entry in target.entries[1:]]
    wanted = [_copied(record, run_id) for record in prefix[1:]]
    if wanted[: len(have)] != have:
        return False
    for record in wanted[len(have) :]:
        await writer.write(record)
    return True
