"""``VolatileRunStore``: the JSONL store's contract, held in process memory."""

from __future__ import annotations

from collections.abc import Mapping

from polyloop.errors import PolyloopTypeError
from polyloop.ports import RunLog
from polyloop.stores._leases import (
    check_lease_record,
    check_wait_seconds,
    held_error,
    lost_error,
    poll_until,
)
from polyloop.stores._records import Record, assemble_log, decode_line, encode_line
from polyloop.types import Intent, ModelCallResult, RunFinished, RunStarted, StepCompleted

__all__ = ["VolatileRunLease", "VolatileRunStore"]

_NAME = "VolatileRunStore"


class VolatileRunStore:
    """A ``RunStore`` in memory: what it lacks is recovery across processes, nothing else.

    * It keeps, per run id, the exact bytes the JSONL store would write, and decodes them on
      every ``read_log``. So nothing aliases: changing a snapshot dict after writing it, or a
      record read back, never changes the log; and every ``DecodeError`` has the same text as
      the JSONL store's (records are numbered like the lines of the JSONL file).
    * ``write_run_started`` raises ``FileExistsError`` when the run id has *any* record (the
      JSONL store's criterion: any write creates the file).
    * A record with wrongly typed fields (values JSON can still represent) is accepted on write
      and fails on read; a value JSON cannot represent is refused on write; a record passed
      to the wrong write method, or an object that is not a log record, is refused with
      ``TypeError`` and leaves nothing behind (not even an empty entry for its run id).
    * Run ids have no shape restriction here (``"a/b"`` is fine), unlike the JSONL store.
    * Writes contain no ``await``, so each one is atomic with respect to other tasks on the same
      event loop. The store is not thread-safe: use one instance per event loop.
    * Run leases (``LeasingRunStore``, design 0120) exclude other tasks using this instance;
      a lease write checks, in the same synchronous block as the append, that its lease is
      still the run's current one. Nothing here spans processes, and leases never expire.
    """

    __slots__ = ("_epochs", "_holders", "_lines")

    def __init__(self) -> None:
        self._lines: dict[str, list[bytes]] = {}
        self._holders: dict[str, VolatileRunLease] = {}
        self._epochs: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"VolatileRunStore(<{len(self._lines)} runs>)"

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "volatile"}``; never instance state such as how many runs it holds."""
        return {"kind": "volatile"}

    async def write_run_started(self, record: RunStarted) -> None:
        """Start a run's log; ``FileExistsError`` if the run id has any record already."""
        line = encode_line(record, RunStarted, "VolatileRunStore.write_run_started")
        self._start(record.run_id, line)

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> VolatileRunLease:
        """Lease ``run_id`` to the caller (see ``polyloop.ports.LeasingRunStore``)."""
        if not isinstance(run_id, str):
            raise PolyloopTypeError(
                f"{_NAME}.acquire_lease: run_id must be a str, got {type(run_id).__name__}"
            )
        wait = check_wait_seconds(wait_seconds, f"{_NAME}.acquire_lease")

        async def attempt() -> VolatileRunLease | None:
            if run_id in self._holders:
                return None
            epoch = self._epochs.get(run_id, 0) + 1
            self._epochs[run_id] = epoch
            lease = self._holders[run_id] = VolatileRunLease(self, run_id, epoch)
            return lease

        return await poll_until(attempt, wait, lambda: held_error(_NAME, run_id, wait))

    def _start(self, run_id: str, line: bytes) -> None:
        if run_id in self._lines:
            raise FileExistsError(
                f"VolatileRunStore: run id {run_id!r} already has a log; start a new run "
                "with a new run id, or resume this one"
            )
        self._lines[run_id] = [line]

    async def write_intent(self, record: Intent) -> None:
        """Append an intent."""
        self._append(record, encode_line(record, Intent, "VolatileRunStore.write_intent"))

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        """Append a model-call result."""
        where = "VolatileRunStore.write_model_call_result"
        self._append(record, encode_line(record, ModelCallResult, where))

    async def write_step_completed(self, record: StepCompleted) -> None:
        """Append a step; outcome and step are one entry."""
        where = "VolatileRunStore.write_step_completed"
        self._append(record, encode_line(record, StepCompleted, where))

    async def write_run_finished(self, record: RunFinished) -> None:
        """Append the finish record."""
        where = "VolatileRunStore.write_run_finished"
        self._append(record, encode_line(record, RunFinished, where))

    async def read_log(self, run_id: str) -> RunLog:
        """Decode the run's records afresh; ``RunLog()`` for an unknown run id."""
        lines = tuple(self._lines.get(run_id, ()))
        return assemble_log(
            decode_line(line[:-1], run_id=run_id, line_number=number)
            for number, line in enumerate(lines, start=1)
        )

    def _append(self, record: Record, line: bytes) -> None:
        self._lines.setdefault(record.run_id, []).append(line)

    def _fence(self, lease: VolatileRunLease) -> None:
        """Raise ``RunLeaseLostError`` unless ``lease`` is the run's current lease."""
        if self._holders.get(lease.run_id) is not lease:
            why = "it was released" if lease.released else "another lease replaced it"
            raise lost_error(_NAME, lease.run_id, lease.epoch, why)

    def _release(self, lease: VolatileRunLease) -> None:
        if self._holders.get(lease.run_id) is lease:
            del self._holders[lease.run_id]


class VolatileRunLease:
    """A ``RunLease`` on one run of a ``VolatileRunStore`` (from ``acquire_lease``).

    Each write encodes the record, then checks the lease and appends in one synchronous block
    (no ``await`` in between), so no release or takeover can fall between check and append.
    """

    __slots__ = ("_epoch", "_released", "_run_id", "_store")

    def __init__(self, store: VolatileRunStore, run_id: str, epoch: int) -> None:
        self._store = store
        self._run_id = run_id
        self._epoch = epoch
        self._released = False

    def __repr__(self) -> str:
        return f"VolatileRunLease(run_id={self._run_id!r}, epoch={self._epoch})"

    @property
    def run_id(self) -> str:
        """The leased run id."""
        return self._run_id

    @property
    def epoch(self) -> int:
        """The fencing token: larger for every later grant of this run id in this store."""
        return self._epoch

    @property
    def released(self) -> bool:
        """Whether ``release()`` was called."""
        return self._released

    async def write_run_started(self, record: RunStarted) -> None:
        """``VolatileRunStore.write_run_started``, fenced by this lease."""
        line = self._line(record, RunStarted, "write_run_started")
        self._store._fence(self)
        self._store._start(record.run_id, line)

    async def write_intent(self, record: Intent) -> None:
        """``VolatileRunStore.write_intent``, fenced by this lease."""
        self._append(record, self._line(record, Intent, "write_intent"))

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        """``VolatileRunStore.write_model_call_result``, fenced by this lease."""
        self._append(record, self._line(record, ModelCallResult, "write_model_call_result"))

    async def write_step_completed(self, record: StepCompleted) -> None:
        """``VolatileRunStore.write_step_completed``, fenced by this lease."""
        self._append(record, self._line(record, StepCompleted, "write_step_completed"))

    async def write_run_finished(self, record: RunFinished) -> None:
        """``VolatileRunStore.write_run_finished``, fenced by this lease."""
        self._append(record, self._line(record, RunFinished, "write_run_finished"))

    async def release(self) -> None:
        """Free the run; idempotent. Later writes through this lease raise."""
        self._released = True
        self._store._release(self)

    def _line(self, record: Record, expected: type[Record], method: str) -> bytes:
        where = f"VolatileRunLease.{method}"
        line = encode_line(record, expected, where)
        check_lease_record(record.run_id, self._run_id, where)
        return line

    def _append(self, record: Record, line: bytes) -> None:
        self._store._fence(self)
        self._store._append(record, line)
