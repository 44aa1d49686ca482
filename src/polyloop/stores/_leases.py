"""What the shipped stores' run leases share: one lease class, the store side it calls, the
argument checks, the refusal texts and the wait.

The lease semantics are ``polyloop.ports.RunLease`` / ``LeasingRunStore`` and design 0120.
``FencedRunLease`` is the one lease class (``JsonlRunLease``, ``VolatileRunLease`` and
``PostgresRunLease`` only name it per store): it carries the run id, the epoch and whether it
was released, refuses a record of another run, and hands every write and its release to its
store through ``FencingStore``, the whole of what a store offers its leases:

==========================================  ===================================================
store side (``FencingStore``)               contract
==========================================  ===================================================
``await write_fenced(lease, line, kind)``   store ``line`` (an encoded ``kind`` record of
                                            ``lease.run_id``) only if ``lease`` is still the
                                            run's current lease, checked *atomically with the
                                            write* (in the same critical section or SQL
                                            statement, no suspension point between); if it is
                                            not, raise ``lost_error(...)`` and store nothing.
                                            Exclusive for ``RunStarted`` (``started_error``
                                            when the run has any record), durable on return
                                            when ``is_barrier(kind)``: the plain write's rules
``await check_fence(lease)``                raise ``lost_error(...)`` unless ``lease`` is
                                            still the run's current lease, checked as
                                            ``write_fenced`` checks it; writes nothing
                                            (``lease.check_current()``, design 0245)
``await end_lease(lease)``                  free the run ``lease`` holds; a write of it in
                                            flight lands first or not at all. Idempotent, and
                                            never raises for infrastructure failures. Called
                                            by every ``lease.release()``, after
                                            ``lease.released`` became true
==========================================  ===================================================

How a store holds and fences is its own (a ``flock`` and the lock file's identity, a holder
table in memory, an epoch on a lease row); each uses the helpers below so the three stores
word the same situation the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from polyloop._common import check_seconds
from polyloop.errors import PolyloopValueError, RunLeaseHeldError, RunLeaseLostError
from polyloop.stores._records import Record, StepLines
from polyloop.stores._writes import RecordWriter

__all__ = [
    "FencedRunLease",
    "FencingStore",
    "check_lease_record",
    "check_wait_seconds",
    "held_error",
    "lost_error",
    "poll_until",
]

T = TypeVar("T")

_FIRST_POLL = 0.002
_MAX_POLL = 0.05


class FencingStore(Protocol):
    """What a store offers the leases it grants (the table in the module docstring)."""

    def write_fenced(
        self, lease: FencedRunLease, line: bytes, kind: type[Record]
    ) -> Awaitable[None]:
        """Store ``line`` for ``lease.run_id`` iff ``lease`` is current, atomically: the
        awaitable returns once it is done (a coroutine function, or a function returning
        a future as ``PostgresRunStore``'s does)."""
        ...

    async def check_fence(self, lease: FencedRunLease) -> None:
        """Raise ``lost_error(...)`` unless ``lease`` is the run's current lease."""
        ...

    async def end_lease(self, lease: FencedRunLease) -> None:
        """Free the run ``lease`` holds; idempotent, never raises for infrastructure."""
        ...


class FencedRunLease(RecordWriter):
    """A ``polyloop.ports.RunLease`` granted by a shipped store (from its ``acquire_lease``).

    =============================  ==============================================================
    part                           behaviour
    =============================  ==============================================================
    ``run_id``, ``epoch``          the leased run id; the fencing token, larger for every later
                                   grant of the run id on the same backend
    ``released``                   whether ``release()`` was called
    the seven write methods        the store's plain writes (same records, exclusive start,
                                   durability: ``polyloop.stores._writes``; the last two are
                                   ``write_settlement`` and ``write_approval_request``), each
                                   refusing a
                                   record of another run (``PolyloopValueError``) and then
                                   fenced by the store (``FencingStore.write_fenced``):
                                   ``RunLeaseLostError`` and nothing stored once the lease is
                                   no longer the run's current one
    ``release()``                  frees the run (``FencingStore.end_lease``); idempotent; a
                                   write in flight lands before it takes effect or not at all
    =============================  ==============================================================

    Built only by the stores; a lease is never shared between stores.
    """

    __slots__ = ("_epoch", "_lines", "_released", "_run_id", "_store")

    def __init__(self, store: FencingStore, run_id: str, epoch: int) -> None:
        self._store = store
        self._run_id = run_id
        self._epoch = epoch
        self._released = False
        self._lines = StepLines()  # the run's steps, encoded once (design 0214)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run_id={self._run_id!r}, epoch={self._epoch})"

    @property
    def run_id(self) -> str:
        """The leased run id."""
        return self._run_id

    @property
    def epoch(self) -> int:
        """The fencing token: larger for every later grant of this run id on this backend."""
        return self._epoch

    @property
    def released(self) -> bool:
        """Whether ``release()`` was called."""
        return self._released

    async def check_current(self) -> None:
        """``RunLeaseLostError`` unless this lease is still the run's current one, checked
        as its writes are fenced; writes nothing (``polyloop.ports.CheckedLease``)."""
        await self._store.check_fence(self)

    async def release(self) -> None:
        """Free the run; idempotent. Every later write through this lease raises
        ``RunLeaseLostError``."""
        self._released = True
        await self._store.end_lease(self)

    def _encode(self, record: object, kind: type[Record], where: str) -> bytes:
        return self._lines.encode(record, kind, where)

    def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> Awaitable[None]:
        check_lease_record(record.run_id, self._run_id, where)
        return self._store.write_fenced(self, line, kind)


def check_wait_seconds(value: object, where: str) -> float:
    """Return ``value`` as a float if it is a finite number >= 0, else raise naming ``where``
    (``polyloop._common.check_seconds`` for the argument ``wait_seconds``)."""
    return check_seconds(value, where=where, field="wait_seconds", zero_means="for no wait")


def check_lease_record(record_run_id: str, lease_run_id: str, where: str) -> None:
    """Refuse a record of another run than the lease's, before anything is stored."""
    if record_run_id != lease_run_id:
        raise PolyloopValueError(
            f"{where}: the record belongs to run {record_run_id!r} but this lease holds run "
            f"{lease_run_id!r}; write each run's records through that run's own lease"
        )


def held_error(store: str, run_id: str, wait_seconds: float) -> RunLeaseHeldError:
    """The refusal of a run whose lease someone else holds."""
    waited = "did not wait" if wait_seconds == 0 else f"waited {wait_seconds:g} s"
    return RunLeaseHeldError(
        f"{store}: run {run_id!r} is leased by another process or task (it is being run or "
        f"resumed right now); {waited}. Leave it to its holder, or retry later or with a "
        "longer lease wait (lease_wait_seconds=...)",
        run_id=run_id,
    )


def lost_error(store: str, run_id: str, epoch: int, why: str) -> RunLeaseLostError:
    """The refusal of a write through a lease that is no longer the run's current lease."""
    return RunLeaseLostError(
        f"{store}: the lease on run {run_id!r} (epoch {epoch}) is no longer held ({why}); "
        "nothing was written. Stop working on this run: another holder may be extending "
        "its log. Resume it later to continue from what is stored",
        run_id=run_id,
        epoch=epoch,
    )


async def poll_until(
    attempt: Callable[[], Awaitable[T | None]],
    wait_seconds: float,
    on_timeout: Callable[[], Exception],
) -> T:
    """Call ``attempt`` until it returns a value, backing off, for at most ``wait_seconds``.

    ``attempt`` is always called at least once; when the time is up, ``on_timeout()`` is
    raised. Cancellation propagates from the sleep between attempts.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    delay = _FIRST_POLL
    while True:
        granted = await attempt()
        if granted is not None:
            return granted
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise on_timeout()
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, _MAX_POLL)
