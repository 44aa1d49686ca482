"""Group commit: the pending records of many runs of one process, committed together.

``PostgresRunStore`` hands every write to a ``GroupCommitter`` (issue 24, design 0212). The
committer knows nothing of SQL or of the driver (an import-linter contract keeps the driver in
``polyloop.stores._postgres``): it queues, forms batches and releases callers; the store's
``commit`` coroutine writes one batch in one transaction and says, per record, what happened.

=====================================  ===================================================
rule                                   how
=====================================  ===================================================
one transaction per batch              ``commit(batch)`` writes the whole batch in one
                                       statement (one implicit transaction, one WAL flush)
                                       and returns once that commit is durable
a caller is released only when its     ``submit`` returns the record's ``Outcome`` after
own record is durable                  ``commit`` returned for the batch that carried it;
                                       never earlier, never from another batch
each record fenced by its own run      an ``Outcome`` is per record (``held``,
                                       ``written``): a record whose lease is lost, or a
                                       start on a taken run id, fails its own caller only;
                                       the other records of the batch are committed
a failed commit fails its batch        an exception of ``failures`` (the driver's, or an
                                       ``OSError``) raised by ``commit`` reaches every
                                       caller of that batch (the store turns it into
                                       ``StoreUnavailableError``: "may or may not be
                                       stored"); the next batch tries again
write order within a run               a batch holds at most one write per run (its lines
                                       in order), and a run with a write in a batch being
                                       committed waits for the next batch: a run's records
                                       commit in the order they were submitted
a caller cancelled while queued        its record is dropped before it is sent (never
                                       written); once sent, it may or may not be stored,
                                       as a cancelled statement
batch size                             whatever is pending when a writer is free, at most
                                       ``max_batch``; ``writers`` batches are in flight at
                                       once, so a lone record waits for no one and a
                                       busy fleet's records share commits
a large batch is answered in parts     a committed batch's callers are released in parts
                                       of about half the writes outstanding (queued or in
                                       flight), at least 64, the loop running one part's
                                       callers before the next part is released: their
                                       next writes go out while the rest are answered, so
                                       a fleet is never one convoy with the loop idle while
                                       it commits; a writer cancelled between parts
                                       answers the rest at once (they are durable)
closing                                ``close()`` stops the writers once the queue is
                                       empty; a record still queued or in a cancelled
                                       batch fails with ``ConnectionError`` (an
                                       ``OSError``: the store raises it as unavailable)
a bug in ``commit``                    any other exception reaches the batch's callers as
                                       it is, is logged, and ends that writer, which leaves
                                       the writers at once: the next ``submit`` (even one
                                       made by a caller of that batch) starts a new one
what a caller gets                     its ``Pending``'s ``answer(outcome)`` or
                                       ``fail(error)`` decides, called once while its future
                                       is pending: the outcome or the error as they are, or
                                       what a store's subclass makes of them (``put``)
=====================================  ===================================================

``Batcher`` is the same idea for the store's statements that are not record writes (lease
grants, first reads, releases; design 0212): whatever is queued when one of its ``workers``
is free, at most ``max_batch`` items, goes to one ``run(items)`` call (one statement), and
each caller gets its own item's answer once that call returned. A caller cancelled while
queued is dropped unsent; an exception of ``run`` reaches every caller of that batch (and
only them: the next batch runs as usual); a cancelled batch fails its callers with
``ConnectionError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["Batcher", "GroupCommitter", "Outcome", "Pending"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger("polyloop.stores.postgres")

# A committed batch is answered in parts of about a ``_PARTS``-th of the writes outstanding
# (queued or in flight: about the fleet's size), at least ``_MIN_PART`` (design 0212, "fleet
# client CPU"): a fleet then keeps that many groups of runs in turn, one on the loop while the
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
    """One write waiting for a batch: its run, its encoded lines (one record, or two written
    back to back, in order and atomically: ``PostgresRunStore.write_pair``), the epoch that
    fences them (``None``: an unfenced write), whether it is a run's exclusive start (then of
    one line), and its caller's future.

    The committer releases the caller through ``answer`` (the batch is durable: the record's
    ``Outcome``) or ``fail`` (the batch's error); both run only while the future is pending.
    Here they hand the future exactly that; a store's subclass may turn them into what its
    write returns or raises (``PostgresRunStore``'s fenced writes: ``None``, or the error of
    a lost lease), so that its write path needs no coroutine of its own around the future
    (design 0214, fourth pass)."""

    run_id: str
    lines: tuple[bytes, ...]
    epoch: int | None
    start: bool
    future: asyncio.Future[Any] = field(repr=False)

    def answer(self, outcome: Outcome) -> None:
        """The batch carrying this write is durable: release the caller with ``outcome``."""
        self.future.set_result(outcome)

    def fail(self, error: BaseException) -> None:
        """The batch carrying this write failed (or never ran): release the caller with it."""
        self.future.set_exception(error)


Commit = Callable[[Sequence[Pending]], Awaitable[Sequence[Outcome]]]


class GroupCommitter:
    """Batches submitted records into ``commit`` calls (the table in the module docstring)."""

    __slots__ = (
        "_busy_runs",
        "_closing",
        "_commit",
        "_failures",
        "_idle",
        "_in_flight",
        "_max_batch",
        "_queue",
        "_writers",
        "_writers_wanted",
    )

    def __init__(
        self,
        commit: Commit,
        *,
        writers: int,
        max_batch: int,
        failures: tuple[type[BaseException], ...],
    ) -> None:
        self._commit = commit
        self._writers_wanted = writers
        self._max_batch = max_batch
        self._failures = failures
        self._queue: deque[Pending] = deque()
        self._busy_runs: set[str] = set()
        self._in_flight: list[list[Pending]] = []
        self._idle: deque[asyncio.Future[None]] = deque()  # writers waiting for work
        self._writers: list[asyncio.Task[None]] = []
        self._closing = False

    async def submit(
        self, run_id: str, lines: tuple[bytes, ...], epoch: int | None, start: bool
    ) -> Outcome:
        """Queue one write (its records ``lines``, all of ``run_id``) and return its outcome
        once the batch carrying it is durable."""
        return await self.enqueue(run_id, lines, epoch, start)

    def enqueue(
        self, run_id: str, lines: tuple[bytes, ...], epoch: int | None, start: bool
    ) -> asyncio.Future[Outcome]:
        """``submit`` without its coroutine: the future its caller awaits (cancelling it
        while the record is queued drops the record). The store's write path awaits it
        directly, one coroutine fewer per write (design 0212, "Cost")."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.put(Pending(run_id, lines, epoch, start, future))
        return future

    def put(self, pending: Pending) -> None:
        """Queue ``pending`` (a store's own ``Pending`` subclass, whose future its caller
        awaits): ``enqueue`` without building the write."""
        if self._closing:
            raise ConnectionError("the store is closed")
        self._queue.append(pending)
        if len(self._writers) < self._writers_wanted:
            self._start_writers()
        self._wake_one()

    def _wake_one(self) -> None:
        """Wake one idle writer (not all of them: the others would find nothing)."""
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _start_writers(self) -> None:
        while len(self._writers) < self._writers_wanted:
            task = asyncio.ensure_future(self._write_batches())
            task.add_done_callback(self._writer_stopped)
            self._writers.append(task)

    def _writer_stopped(self, task: asyncio.Task[None]) -> None:
        """A writer ended (the store closed, or a bug): the next submit starts another."""
        if task in self._writers:
            self._writers.remove(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a group-commit writer failed", exc_info=task.exception())

    async def close(self) -> None:
        """Let the queue drain, then stop the writers (a queued record fails, see above)."""
        self._closing = True
        if self._queue:
            self._start_writers()  # a writer that died of a bug leaves the queue to a new one
        waiting = [p.future for p in self._queue]
        waiting += [p.future for batch in self._in_flight for p in batch]
        if waiting:
            await asyncio.wait(waiting)
        writers, self._writers = self._writers, []
        for task in writers:
            task.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        _settle(list(self._queue), ConnectionError("the store was closed before the write"))
        self._queue.clear()

    async def _write_batches(self) -> None:
        try:
            while True:
                # No local keeps a committed batch while the writer waits for the next one:
                # its writes (lines, futures) are freed at once instead of aging into the
                # collector's old generations, which made its full passes grow with the fleet.
                await self._write_batch(await self._take())
        except Exception:
            # A writer ending of a bug in commit leaves the list at once: the callers of its
            # batch run before its done callback, and a write they submit next must find no
            # writer there and start one (it used to wait for a writer that was gone). Only
            # here, where the loop is running (a coroutine closed by the collector after its
            # loop closed has no current task); a cancelled writer leaves it in its callback.
            task = asyncio.current_task()
            if task in self._writers:
                self._writers.remove(task)
            raise

    async def _write_batch(self, batch: list[Pending]) -> None:
        """Commit one batch and release its callers (the table in the module docstring).

        A large batch's callers are answered a part at a time: the loop runs the callers of
        one part (and a free writer sends their next writes) before it answers the next.
        Answering a whole fleet at once made it one convoy, every run's next write waiting
        for the last run's turn on the loop, then all of them for one commit while the loop
        sat idle (design 0212, "fleet client CPU")."""
        self._in_flight.append(batch)
        outcomes: Sequence[Outcome] | None = None
        answered = 0
        try:
            outcomes = _one_each(await self._commit(batch), batch)
            part = max(_MIN_PART, self._outstanding() // _PARTS)
            while answered < len(batch):
                if answered:
                    await asyncio.sleep(0)  # the callers answered so far run first
                _answer(batch, outcomes, answered, answered + part, self._busy_runs)
                answered = min(answered + part, len(batch))
        except self._failures as exc:
            _settle(batch, exc)
        except Exception as exc:  # a bug in commit: its callers get it, then it propagates
            _settle(batch, exc)
            raise
        finally:
            self._in_flight.remove(batch)
            if outcomes is not None:  # cancelled between parts: the rest is durable too
                _answer(batch, outcomes, answered, len(batch), self._busy_runs)
            else:
                for pending in batch:
                    self._busy_runs.discard(pending.run_id)
                # Cancelled (the store closed while the batch was out): nobody waits forever.
                _settle(batch, ConnectionError("the store's writer stopped before the commit"))

    def _outstanding(self) -> int:
        """Writes queued or in a batch being committed: about the fleet's size."""
        return len(self._queue) + sum(len(batch) for batch in self._in_flight)

    async def _take(self) -> list[Pending]:
        """The next batch: queued writes in order, one per run, none of a run whose earlier
        write is in a batch being committed."""
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
            # waited for a batch is taken by that batch's writer, which comes back here.)
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            await waiter


def _one_each(outcomes: Sequence[Outcome], batch: list[Pending]) -> Sequence[Outcome]:
    """``commit``'s answer, checked: one outcome per write (otherwise a bug of the store's
    commit, raised to the batch's callers like any other bug of it)."""
    if len(outcomes) != len(batch):
        raise RuntimeError(
            f"the group commit's commit gave {len(outcomes)} outcomes for {len(batch)} writes"
        )
    return outcomes


def _answer(
    batch: list[Pending], outcomes: Sequence[Outcome], begin: int, end: int, busy: set[str]
) -> None:
    """Release the callers ``batch[begin:end]`` with their outcomes; their runs may write
    again (their next write can go in the next batch)."""
    for index in range(begin, min(end, len(batch))):
        pending = batch[index]
        busy.discard(pending.run_id)
        if not pending.future.done():
            pending.answer(outcomes[index])


def _settle(batch: Sequence[Pending], error: BaseException) -> None:
    """Hand ``error`` to every write of ``batch`` whose caller still waits."""
    for pending in batch:
        if not pending.future.done():
            pending.fail(error)


def _fail(futures: Iterable[asyncio.Future[Any]], error: BaseException) -> None:
    """Hand ``error`` to every caller still waiting (the ``Batcher``'s fan-out)."""
    for future in futures:
        if not future.done():
            future.set_exception(error)


class Batcher(Generic[T, R]):
    """Runs submitted items in batches through ``run`` (the module docstring, last part)."""

    __slots__ = ("_max_batch", "_queue", "_run", "_tasks", "_workers")

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        workers: int,
        max_batch: int,
    ) -> None:
        self._run = run
        self._workers = workers
        self._max_batch = max_batch
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        """Queue ``item``; return its answer once the batch carrying it has run."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if len(self._tasks) < self._workers:
            task = asyncio.ensure_future(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def close(self) -> None:
        """Wait for the batches queued or running."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            await self._drain_queue()
        finally:
            # Leave the workers before the callers just answered run: a submit they make at
            # once must start a worker, not count this finished one (issue 34: a hang).
            self._tasks.discard(asyncio.current_task())

    async def _drain_queue(self) -> None:
        queue = self._queue
        while queue:
            batch: list[tuple[T, asyncio.Future[R]]] = []
            while queue and len(batch) < self._max_batch:
                entry = queue.popleft()
                if not entry[1].done():  # its caller was cancelled: never sent
                    batch.append(entry)
            if not batch:
                continue
            try:
                answers = await self._run([item for item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
                _fail((future for _, future in batch), exc)
            else:
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
            finally:
                # Cancelled while out: nobody waits forever.
                _fail(
                    (future for _, future in batch),
                    ConnectionError("the store's batch was cancelled"),
                )
