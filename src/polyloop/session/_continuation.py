"""The first half of ``continue_cancelled`` and ``continue_run``: copy a stopped run's log, minus
its finish, to a new id.

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
from typing import Final

from polyloop import _recovery
from polyloop._recovery import ResumeAction
from polyloop.errors import LogCorruptError, PolyloopValueError, RunIdentityError
from polyloop.ports import RunLog, RunStore
from polyloop.session._leasing import RunWriter
from polyloop.types import (
    Intent,
    IntentKind,
    LogRecord,
    RunFinished,
    RunStarted,
    StopReason,
)

__all__ = ["CONTINUABLE", "complete_copy", "continued_records", "copy_cancelled"]

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
