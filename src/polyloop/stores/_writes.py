"""The write methods of a ``RunStore`` and of a ``RunLease``, written once.

Every shipped store and every lease it grants writes a record the same way, so the methods
live here and each class supplies only where the line goes (``RecordWriter._store_line``).
The record kinds, each kind's typed write method, whether it is exclusive and whether it is a
durability barrier are ``polyloop.types.RECORDS`` (design 0220): the typed methods below are
the ``RunStore``/``RunLease`` seam and the ``SettlingWrites`` capability, and
``write_record`` (the ``polyloop.ports.RecordWrites`` capability) writes a record of any kind
of the table, a kind added after schema 1.8 (which has no typed method) included.

Durability is ``polyloop.stores._records.is_barrier`` (the record table's ``barrier``
column): no code here or in a store restates it. It is the least a store promises:
``PostgresRunStore`` makes every record durable before its write returns (issue 24: its
non-barrier records, committed asynchronously, were lost when the *server* crashed), while the
JSONL store's non-barrier records survive a crash of the writing process and reach the disk
with the next barrier (design 0020). "Exclusive" means the write
refuses a run id that has any record with ``polyloop.errors.RunAlreadyStartedError``
(``started_error``) and stores nothing. Each method first encodes its record
(``encode_line``: a record of another kind, or no record at all, is a ``PolyloopTypeError``
naming ``<Class>.<method>``), so nothing reaches a store that it could not read back. (The
volatile store may keep a record unencoded until the next read, only when encoding it then
must give what encoding it now would: design 0214.)

When what a store stands on fails (a full disk, a file it cannot write, a database that is
down), the store raises ``polyloop.errors.StoreUnavailableError`` built by
``unavailable_error``, with the OS's or driver's error as ``__cause__`` (issue 24): the same
words, naming the store, the run, the record and the file, in every shipped store.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable

from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    RunAlreadyStartedError,
    StoreUnavailableError,
)
from polyloop.stores._records import TAGS, Record, encode_line, is_exclusive
from polyloop.types import (
    RECORDS,
    ApprovalRequest,
    Intent,
    ModelCallResult,
    RunFinished,
    RunStarted,
    Settlement,
    StepCompleted,
)

__all__ = ["RecordWriter", "check_pair", "started_error", "unavailable_error"]

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_SQLSTATE_DISK_FULL = "53100"
"""PostgreSQL's ``disk_full`` condition, as every driver reports it (``.sqlstate``)."""


def started_error(store: str, run_id: str, *, log: str | None = None) -> RunAlreadyStartedError:
    """The refusal of ``write_run_started`` on a run id that already has records (``log``:
    where that log is, for a store whose logs have a path)."""
    found = "a log" if log is None else f"a log ({log})"
    return RunAlreadyStartedError(
        f"{store}: run id {run_id!r} already has {found}; start a new run with a new run id, "
        "or resume this one",
        run_id=run_id,
    )


def unavailable_error(
    store: str,
    cause: BaseException,
    *,
    run_id: str | None,
    record: str,
    path: str | None = None,
) -> StoreUnavailableError:
    """The error for a store whose infrastructure failed; raise it ``from cause``.

    ``record`` is a record's tag for a write, ``"log"`` for a read, ``"lease"`` for taking a
    lease, ``"schema"`` for a database store's tables. The text names ``store``, the run, the
    record and ``path`` (the file, for a store of files), then the cause's own words (on one
    line) and what to do ("free some space" for a full disk: an ``OSError`` of ``ENOSPC`` or
    ``EDQUOT``, or a database error whose ``sqlstate`` is ``53100``); ``errno`` and
    ``strerror`` are copied from an ``OSError`` cause.
    """
    run = "" if run_id is None else f" of run {run_id!r}"
    full = (isinstance(cause, OSError) and cause.errno in _FULL) or getattr(
        cause, "sqlstate", None
    ) == _SQLSTATE_DISK_FULL
    fix = "free some space" if full else "make the store work again"
    if record == "log":
        what, after = f"read the log{run}", f"nothing was changed: {fix}, then read it again"
    elif record == "lease":
        what, after = f"take the lease{run}", f"nothing was written: {fix}, then try again"
    elif record == "schema":
        what = "connect to the database and check its tables"
        after = f"nothing was written: {fix}, then open the store again"
    else:
        what = f"write the {record} record{run}"
        after = f"it may or may not be stored. The log stays readable: {fix}, then resume the run"
    where = "" if path is None else f" ({path})"
    words = " ".join(str(cause).split()) or "no message"
    error = StoreUnavailableError(
        f"{store}: could not {what}{where}: {type(cause).__name__}: {words}; {after}",
        store=store,
        run_id=run_id,
        record=record,
        path=path,
    )
    if isinstance(cause, OSError):
        error.errno, error.strerror = cause.errno, cause.strerror
    return error


def check_pair(first: Record, second: Record, where: str) -> None:
    """Refuse a ``write_pair(first, second)`` (designs 0212, 0214) that is not two records of
    one run, neither a ``RunStarted`` (a start is exclusive and goes alone), before anything
    is encoded or stored."""
    for record in (first, second):
        if type(record) not in TAGS or is_exclusive(type(record)):
            raise PolyloopTypeError(
                f"{where}: each record must be a log record other than RunStarted (a start "
                f"is written alone, by write_run_started), got {type(record).__name__}"
            )
    if first.run_id != second.run_id:
        raise PolyloopValueError(
            f"{where}: both records must belong to one run, got run ids {first.run_id!r} "
            f"and {second.run_id!r}; write each run's records separately"
        )


class RecordWriter:
    """The typed write methods and ``write_record`` (above), each ending in ``_store_line``.

    A subclass implements ``_store_line(record, line, kind, where)``: store ``line`` (the
    encoded ``record``, ending in ``\\n``) as its run's next record, exclusively when
    ``is_exclusive(kind)``, durably before returning when ``is_barrier(kind)``. ``where`` is
    ``"<Class>.<method>"``, for the subclass's own refusals.
    """

    __slots__ = ()

    async def write_run_started(self, record: RunStarted) -> None:
        """Start the run's log: exclusive (``RunAlreadyStartedError``), a barrier."""
        await self._write(record, RunStarted, "write_run_started")

    async def write_intent(self, record: Intent) -> None:
        """Append an intent: a barrier (durable, with every earlier record, on return)."""
        await self._write(record, Intent, "write_intent")

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        """Append a model-call result; durable with the run's next barrier."""
        await self._write(record, ModelCallResult, "write_model_call_result")

    async def write_step_completed(self, record: StepCompleted) -> None:
        """Append a step (outcome and step are one record: both or neither); durable with
        the run's next barrier."""
        await self._write(record, StepCompleted, "write_step_completed")

    async def write_run_finished(self, record: RunFinished) -> None:
        """Append the finish record: a barrier."""
        await self._write(record, RunFinished, "write_run_finished")

    async def write_settlement(self, record: Settlement) -> None:
        """Append the verdict on an execution that was in doubt: a barrier (durable, with
        every earlier record, on return), because it is acted on once it returns."""
        await self._write(record, Settlement, "write_settlement")

    async def write_approval_request(self, record: ApprovalRequest) -> None:
        """Append a call's request for approval: a barrier, since the run stops on it and a
        person decides on it (design 0210)."""
        await self._write(record, ApprovalRequest, "write_approval_request")

    async def write_record(self, record: Record) -> None:
        """Write ``record``, of any kind of ``RECORDS``, as its kind's own write would
        (exclusive, barrier or not); anything else is a ``PolyloopTypeError``."""
        kind = type(record)
        if kind not in TAGS:
            raise PolyloopTypeError(
                f"{type(self).__name__}.write_record takes a log record ({RECORDS.names()}), "
                f"got {kind.__qualname__}"
            )
        await self._write(record, kind, "write_record")

    def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> Awaitable[None]:
        """Store ``line``, the encoded ``record`` (see the class docstring): an awaitable
        (a coroutine of an ``async def``, or one handed on from the store)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _store_line")

    def _encode(self, record: object, kind: type[Record], where: str) -> bytes:
        """``encode_line``; a lease encodes through its run's ``StepLines`` instead (the same
        bytes, with no step encoded twice)."""
        return encode_line(record, kind, where)

    def _pair_lines(self, first: Record, second: Record, where: str) -> tuple[bytes, bytes]:
        """The two lines of ``write_pair(first, second)`` (designs 0212, 0214), ``first``'s
        then ``second``'s, each encoded as its own write would encode it (``_encode``, so a
        lease's step text is kept for its finish), once ``check_pair`` passed them."""
        check_pair(first, second, where)
        return self._encode(first, type(first), where), self._encode(second, type(second), where)

    def _write(self, record: Record, kind: type[Record], method: str) -> Awaitable[None]:
        """Encode and hand on: the awaitable of ``_store_line``, which the write method
        awaits. Not a coroutine of its own, so a write in flight holds one coroutine object
        fewer (at fleet size they live through a batch's commit: design 0214);
        a refusal raises here, inside the write method's call."""
        where = f"{type(self).__name__}.{method}"
        line = self._encode(record, kind, where)  # refuses anything but a ``kind`` record
        return self._store_line(record, line, kind, where)
