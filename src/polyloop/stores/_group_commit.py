"""One batching engine for ``PostgresRunStore``'s statements: many runs' items, one statement.

``PostgresRunStore`` sends each kind of statement through its own ``Batcher`` (designs 0212,
0218): record writes (the group commit), lease grants, first reads and lease releases. The
engine knows nothing of SQL or of the driver (an import-linter contract keeps the driver in
``polyloop.stores._postgres``): it queues items, forms batches and releases callers; the
store's ``run`` coroutine sends one batch as one statement and answers each item.

=====================================  ===================================================
rule                                   how
=====================================  ===================================================
one statement per batch                ``run(batch)`` sends the whole batch as one
                                       statement (a write's or a grant's: one implicit
                                       transaction, one WAL flush) and returns once it is
                                       done (a commit: durable)
a caller is released only when its     its future is answered after ``run`` returned for
own item is done                       the batch that carried it; never earlier, never
                                       from another batch
an answer per item                     ``run`` returns one answer per item, in batch
                                       order (a record's ``Outcome``: ``held``,
                                       ``written``): a record whose lease is lost, or a
                                       start on a taken run id, fails its own caller only;
                                       more or fewer answers than items is a bug of the
                                       store, raised to the batch's callers as
                                       ``polyloop.errors.BatchAnswerError`` naming the
                                       statement
a failed statement fails its batch     an exception of ``failures`` (the driver's, or an
                                       ``OSError``) raised by ``run`` reaches every
                                       caller of that batch (the store turns it into
                                       ``StoreUnavailableError``: "may or may not be
                                       stored"); the next batch tries again
one item per run per batch, in order   a batch holds at most one item per run (a record
                                       write: its lines, in order), and a run with an item
                                       in a batch in flight waits for the next batch: a
                                       run's records commit in the order they were
                                       submitted, and a run id asked twice for a lease is
                                       granted to the first asker
a caller cancelled while queued        its item is dropped before it is sent; once sent,
                                       it may or may not be done, as a cancelled statement
batch size                             whatever is queued when a worker is free, at most
                                       ``max_batch``; ``workers`` batches are in flight at
                                       once, so a lone item waits for no one and a busy
                                       fleet's items share statements
a worker for every queued item         a worker waits for work until ``close()``; one that
                                       answered a batch is back at the queue before its
                                       callers run, and one that ends (a bug) leaves the
                                       workers first: a caller that submits again as soon
                                       as it is answered is always taken (design 0218:
                                       else it could wait, at a fleet's tail forever)
a large batch is answered in parts     a batch's callers are released in parts of about
                                       half the items outstanding (queued or in flight),
                                       at least 64, the loop running one part's callers
                                       before the next part is released: their next items
                                       go out while the rest are answered, so a fleet is
                                       never one convoy with the loop idle while it
                                       commits; a worker cancelled between parts answers
                                       the rest at once (they are done)
closing                                ``close()`` stops the workers once the queue is
                                       empty; a later ``submit`` raises, and an item still
                                       queued or in a cancelled batch fails with,
                                       ``ConnectionError`` (an ``OSError``: the store
                                       raises it as unavailable)
a bug in ``run``                       any other exception reaches the batch's callers as
                                       it is, is logged, and ends that worker, which leaves
                                       the workers at once: the next ``submit`` (even one
                                       made by a caller of that batch) starts a new one, and
                                       items still queued (ones it held back) are handed to
                                       a new worker at once
what a caller gets                     its ``Pending``'s ``answer(result)`` or
                                       ``fail(error)`` decides, called once while its future
                                       is pending: the answer or the error as they are, or
                                       what a store's subclass makes of them (``put``)
=====================================  ===================================================
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from polyloop.errors import BatchAnswerError

__all__ = ["Batcher", "Outcome", "Pending"]

R = TypeVar("R")

logger = logging.getLogger("polyloop.stores.postgres")

# A batch is answered in parts of about a ``_PARTS``-th of the items outstanding (queued or
# in flight: about the fleet's size), at least ``_MIN_PART`` (design 0212, "fleet client
# CPU"): a fleet then keeps that many groups of runs in turn, one on the loop while the
# others' commits are on the server, and each extra part costs one more statement.
_PARTS = 2
_MIN_PART = 64


class Outcome(NamedTuple):
    """What the commit did with one record: whether its lease was held (always true for an
    unfenced record) and whether the record was stored (false for a start on a run id that
    has records, or a record whose lease was not held)."""

    held: bool
    written: bool


@dataclass(slots=True, eq=False)
class Pending:
    """One item waiting for a batch: its run; for a record write its encoded lines (one
    record, or two written back to back, in order and atomically:
    ``PostgresRunStore.write_pair``), the epoch that fences them (``None``: an unfenced
    write) and whether it is a run's exclusive start (then of one line); for a lease release
    the lease's epoch (a grant or a first read: the run only); and its caller's future.

    The engine releases the caller through ``answer`` (the batch is done: the item's answer)
    or ``fail`` (the batch's error); both run only while the future is pending. Here they
    hand the future exactly that; a store's subclass may turn them into what its write
    returns or raises (``PostgresRunStore``'s fenced writes: ``None``, or the error of a lost
    lease), so that its write path needs no coroutine of its own around the future (design
    0214)."""

    run_id: str
    lines: tuple[bytes, ...]
    epoch: int | None
    start: bool
    future: asyncio.Future[Any] = field(repr=False)

    def answer(self, result: Any) -> None:
        """The batch carrying this item is done: release the caller with ``result``."""
        self.future.set_result(result)

    def fail(self, error: BaseException) -> None:
        """The batch carrying this item failed (or never ran): release the caller with it."""
        self.future.set_exception(error)


class Batcher(Generic[R]):
    """Sends submitted items through ``run``, a batch at a time (the module docstring's table);
    ``name`` names the statement in errors and logs."""

    __slots__ = (
        "_busy_runs",
        "_closing",
        "_failures",
        "_idle",
        "_in_flight",
        "_max_batch",
        "_name",
        "_queue",
        "_run",
        "_workers",
        "_workers_wanted",
    )

    def __init__(
        self,
        run: Callable[[list[Pending]], Awaitable[Sequence[R]]],
        *,
        name: str,
        workers: int,
        max_batch: int,
        failures: tuple[type[BaseException], ...],
    ) -> None:
        self._run = run
        self._name = name
        self._workers_wanted = workers
        self._max_batch = max_batch
        self._failures = failures
        self._queue: deque[Pending] = deque()
        self._busy_runs: set[str] = set()
        self._in_flight: list[list[Pending]] = []
        self._idle: deque[asyncio.Future[None]] = deque()  # workers waiting for work
        self._workers: list[asyncio.Task[None]] = []
        self._closing = False

    def submit(
        self,
        run_id: str,
        lines: tuple[bytes, ...] = (),
        epoch: int | None = None,
        start: bool = False,
    ) -> asyncio.Future[R]:
        """Queue one item (``Pending``'s fields) and return the future its caller awaits: the
        item's answer once the batch carrying it is done. Cancelling it while the item is
        queued drops the item. A future, not a coroutine: one object fewer per write (design
        0212, "Cost")."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.put(Pending(run_id, lines, epoch, start, future))
        return future

    def put(self, pending: Pending) -> None:
        """Queue ``pending`` (a store's own ``Pending`` subclass, whose future its caller
        awaits): ``submit`` without building the item."""
        if self._closing:
            raise ConnectionError("the store is closed")
        self._queue.append(pending)
        if len(self._workers) < self._workers_wanted:
            self._start_workers()
        self._wake_one()

    def _wake_one(self) -> None:
        """Wake one idle worker (not all of them: the others would find nothing)."""
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _start_workers(self) -> None:
        while len(self._workers) < self._workers_wanted:
            task = asyncio.ensure_future(self._work())
            task.add_done_callback(self._worker_stopped)
            self._workers.append(task)

    def _worker_stopped(self, task: asyncio.Task[None]) -> None:
        """A worker ended (the store closed, or a bug): the next submit starts another."""
        if task in self._workers:
            self._workers.remove(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a worker of the %s failed", self._name, exc_info=task.exception())

    async def close(self) -> None:
        """Let the queue drain, then stop the workers (a queued item fails, see above)."""
        self._closing = True
        if self._queue:
            self._start_workers()  # a worker that died of a bug leaves the queue to a new one
        waiting = [p.future for p in self._queue]
        waiting += [p.future for batch in self._in_flight for p in batch]
        if waiting:
            await asyncio.wait(waiting)
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        _settle(list(self._queue), ConnectionError("the store was closed before the statement"))
        self._queue.clear()

    async def _work(self) -> None:
        try:
            while True:
                # No local keeps a finished batch while the worker waits for the next one:
                # its items (lines, futures) are freed at once instead of aging into the
                # collector's old generations, where they would make its full passes grow
                # with the fleet.
                await self._run_batch(await self._take())
        except Exception:
            # A worker ending of a bug in run leaves the list at once: the callers of its
            # batch run before its done callback, and an item they submit next must find no
            # worker there and start one (else it would wait for a worker that is gone). Only
            # here, where the loop is running (a coroutine closed by the collector after its
            # loop closed has no current task); a cancelled worker leaves it in its callback.
            task = asyncio.current_task()
            if task in self._workers:
                self._workers.remove(task)
            if self._queue and not self._closing:
                # Items this worker held back (a run's next item, a batch's overflow) are
                # handed to a new worker: nothing else may come along to start one.
                self._start_workers()
                self._wake_one()
            raise

    async def _run_batch(self, batch: list[Pending]) -> None:
        """Run one batch and release its callers (the table in the module docstring).

        A large batch's callers are answered a part at a time: the loop runs the callers of
        one part (and a free worker sends their next items) before it answers the next.
        Answering a whole fleet at once made it one convoy, every run's next write waiting
        for the last run's turn on the loop, then all of them for one commit while the loop
        sat idle (design 0212, "fleet client CPU")."""
        self._in_flight.append(batch)
        answers: Sequence[R] | None = None
        answered = 0
        try:
            answers = _one_each(await self._run(batch), batch, self._name)
            part = max(_MIN_PART, self._outstanding() // _PARTS)
            while answered < len(batch):
                if answered:
                    await asyncio.sleep(0)  # the callers answered so far run first
                _answer(batch, answers, answered, answered + part, self._busy_runs)
                answered = min(answered + part, len(batch))
        except self._failures as exc:
            _settle(batch, exc)
        except Exception as exc:  # a bug in run: its callers get it, then it propagates
            _settle(batch, exc)
            raise
        finally:
            self._in_flight.remove(batch)
            if answers is not None:  # cancelled between parts: the rest is done too
                _answer(batch, answers, answered, len(batch), self._busy_runs)
            else:
                for pending in batch:
                    self._busy_runs.discard(pending.run_id)
                # Cancelled (the store closed while the batch was out): nobody waits forever.
                _settle(batch, ConnectionError("the store's worker stopped before the answer"))

    def _outstanding(self) -> int:
        """Items queued or in a batch in flight: about the fleet's size."""
        return len(self._queue) + sum(len(batch) for batch in self._in_flight)

    async def _take(self) -> list[Pending]:
        """The next batch: queued items in order, one per run, none of a run whose earlier
        item is in a batch in flight."""
        while True:
            batch: list[Pending] = []
            later: list[Pending] = []
            queue, busy = self._queue, self._busy_runs
            while queue and len(batch) < self._max_batch:
                pending = queue.popleft()
                if pending.future.done():  # its caller was cancelled: never sent
                    continue
                if pending.run_id in busy:
                    later.append(pending)
                    continue
                busy.add(pending.run_id)
                batch.append(pending)
            queue.extendleft(reversed(later))
            if batch:
                return batch
            # Nothing, or only runs with a batch in flight: wait for a submit. (A run that
            # waited for a batch is taken by that batch's worker, which comes back here.)
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            await waiter


def _one_each(answers: Sequence[R], batch: list[Pending], name: str) -> Sequence[R]:
    """``run``'s answers, checked: one per item (otherwise a bug of the store's statement,
    raised to the batch's callers like any other bug of it)."""
    if len(answers) != len(batch):
        raise BatchAnswerError(
            f"the store's {name} statement gave {len(answers)} answers for {len(batch)} items "
            "(a bug of the store)"
        )
    return answers


def _answer(
    batch: list[Pending], answers: Sequence[Any], begin: int, end: int, busy: set[str]
) -> None:
    """Release the callers ``batch[begin:end]`` with their answers; their runs may submit
    again (their next item can go in the next batch)."""
    for index in range(begin, min(end, len(batch))):
        pending = batch[index]
        busy.discard(pending.run_id)
        if not pending.future.done():
            pending.answer(answers[index])


def _settle(batch: Sequence[Pending], error: BaseException) -> None:
    """Hand ``error`` to every item of ``batch`` whose caller still waits."""
    for pending in batch:
        if not pending.future.done():
            pending.fail(error)
