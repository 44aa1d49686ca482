"""The batching engine's rules (``polyloop.stores._group_commit``), against a fake statement.

The fake records each batch and can hold a batch open (an ``asyncio.Event``), so the tests see
exactly when a caller is released. The record writes' rules (the group commit) come first,
then the engine as the store's lease grants, first reads and releases use it. The SQL side
(fencing inside the statement, durability on return) is tested against a real server in
``tests/integration/test_postgres_group_commit.py``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import pytest

from polyloop.errors import BatchAnswerError
from polyloop.stores._group_commit import Batcher, Outcome, Pending

STORED = Outcome(held=True, written=True)


class FakeCommit:
    """Records every batch as (run_id, line) pairs; a batch waits for ``gate`` when set;
    ``lost`` run ids come back not held, ``fail`` makes the next commit raise."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, bytes]]] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.lost: set[str] = set()
        self.fail: BaseException | None = None

    async def __call__(self, batch: Sequence[Pending]) -> list[Outcome]:
        self.batches.append([(p.run_id, b"".join(p.lines)) for p in batch])
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        return [
            Outcome(held=False, written=False) if p.run_id in self.lost else STORED for p in batch
        ]


def committer(
    fake: Callable[[list[Pending]], Awaitable[Sequence[Outcome]]],
    writers: int = 1,
    max_batch: int = 100,
) -> Batcher[Outcome]:
    return Batcher(
        fake, name="record writes", workers=writers, max_batch=max_batch, failures=(OSError,)
    )


async def test_records_pending_while_a_batch_commits_share_the_next_commit() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    group = committer(fake)
    first = asyncio.ensure_future(group.submit("a", (b"a1",), 1, False))
    await fake.entered.wait()  # batch 1 (a1) is being committed
    others = [asyncio.ensure_future(group.submit(f"r{i}", (b"x",), 1, False)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert not first.done(), "released before its batch returned"
    assert not any(o.done() for o in others), "released before durable"
    fake.gate.set()
    assert await first == STORED
    assert await asyncio.gather(*others) == [STORED] * 5
    assert fake.batches == [[("a", b"a1")], [(f"r{i}", b"x") for i in range(5)]]
    await group.close()


async def test_a_caller_is_released_only_when_the_batch_carrying_its_record_returned() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    group = committer(fake)
    write = asyncio.ensure_future(group.submit("a", (b"a1",), 1, False))
    await fake.entered.wait()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not write.done()
    fake.gate.set()
    assert await write == STORED
    await group.close()


async def test_a_fenced_out_record_fails_its_own_caller_only() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    fake.lost = {"stale"}
    group = committer(fake)
    blocker = asyncio.ensure_future(group.submit("x", (b"x",), 1, False))
    await fake.entered.wait()
    writes = [
        asyncio.ensure_future(group.submit(run_id, (b"l",), 1, False))
        for run_id in ("a", "stale", "b")
    ]
    await asyncio.sleep(0)
    fake.gate.set()
    await blocker
    assert await asyncio.gather(*writes) == [STORED, Outcome(False, False), STORED]
    assert fake.batches[1] == [("a", b"l"), ("stale", b"l"), ("b", b"l")]
    await group.close()


async def test_a_failed_commit_fails_every_caller_of_its_batch_and_the_next_batch_works() -> None:
    fake = FakeCommit()
    fake.fail = ConnectionResetError("server closed the connection")
    group = committer(fake)
    with pytest.raises(ConnectionResetError, match="server closed"):
        await group.submit("a", (b"a1",), 1, False)
    assert await group.submit("a", (b"a1 again",), 1, False) == STORED
    await group.close()


async def test_a_run_has_at_most_one_record_per_batch_and_keeps_its_order() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    group = committer(fake, writers=3)
    blocker = asyncio.ensure_future(group.submit("x", (b"x",), 1, False))
    await fake.entered.wait()
    # Two records of run "a" queued at once (the library never does; the committer copes).
    writes = [
        asyncio.ensure_future(group.submit(run_id, (line,), 1, False))
        for run_id, line in (("a", b"a1"), ("b", b"b1"), ("a", b"a2"))
    ]
    await asyncio.sleep(0.01)
    fake.gate.set()
    await asyncio.gather(blocker, *writes)
    a_batches = [i for i, batch in enumerate(fake.batches) for run_id, _ in batch if run_id == "a"]
    assert all(len({run for run, _ in batch}) == len(batch) for batch in fake.batches)
    a_lines = [line for batch in fake.batches for run_id, line in batch if run_id == "a"]
    assert a_lines == [b"a1", b"a2"]
    assert a_batches[0] < a_batches[1]
    await group.close()


async def test_a_record_whose_caller_was_cancelled_while_queued_is_never_sent() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    group = committer(fake)
    blocker = asyncio.ensure_future(group.submit("x", (b"x",), 1, False))
    await fake.entered.wait()
    doomed = asyncio.ensure_future(group.submit("a", (b"never",), 1, False))
    await asyncio.sleep(0)
    doomed.cancel()
    fake.gate.set()
    await blocker
    assert await group.submit("b", (b"b1",), 1, False) == STORED
    assert ("a", b"never") not in [pair for batch in fake.batches for pair in batch]
    await group.close()


async def test_batches_are_capped_at_max_batch() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    group = committer(fake, max_batch=4)
    blocker = asyncio.ensure_future(group.submit("x", (b"x",), 1, False))
    await fake.entered.wait()
    writes = [asyncio.ensure_future(group.submit(f"r{i}", (b"l",), 1, False)) for i in range(10)]
    await asyncio.sleep(0)
    fake.gate.set()
    await asyncio.gather(blocker, *writes)
    assert [len(batch) for batch in fake.batches] == [1, 4, 4, 2]
    await group.close()


async def test_close_commits_what_is_queued_and_refuses_later_writes() -> None:
    fake = FakeCommit()
    group = committer(fake, writers=2)
    writes = [asyncio.ensure_future(group.submit(f"r{i}", (b"l",), 1, False)) for i in range(3)]
    await asyncio.sleep(0)
    await group.close()
    assert await asyncio.gather(*writes) == [STORED] * 3
    with pytest.raises(ConnectionError, match="closed"):
        await group.submit("late", (b"l",), 1, False)


async def test_a_bug_in_the_commit_reaches_the_callers_and_a_new_writer_takes_over() -> None:
    fake = FakeCommit()
    fake.fail = KeyError("a bug")  # not one of the store's failures
    group = committer(fake)
    with pytest.raises(KeyError, match="a bug"):
        await group.submit("a", (b"a1",), 1, False)
    await asyncio.sleep(0)
    assert await group.submit("a", (b"a2",), 1, False) == STORED
    await group.close()


async def test_a_write_submitted_by_a_caller_of_the_failed_batch_at_once_is_committed() -> None:
    """The callers of a batch whose commit hit a bug run before the writer's done callback:
    a write one of them submits at once must start a new writer, not wait for the gone one."""
    fake = FakeCommit()
    fake.fail = KeyError("a bug")
    group = committer(fake)
    with pytest.raises(KeyError, match="a bug"):
        await group.submit("a", (b"a1",), 1, False)
    queued = group.submit("a", (b"a2",), 1, False)  # at once, before any other callback
    assert await asyncio.wait_for(queued, 5) == STORED
    await group.close()


@dataclass(slots=True, eq=False)
class Judged(Pending):
    """A store's own write: the commit's outcome becomes the caller's value or error."""

    def answer(self, outcome: Outcome) -> None:
        if outcome.held:
            self.future.set_result("stored")
        else:
            self.future.set_exception(LookupError(f"{self.run_id}: not held"))

    def fail(self, error: BaseException) -> None:
        self.future.set_exception(RuntimeError(f"{self.run_id}: {error}"))


async def test_a_stores_own_pending_turns_the_outcome_into_its_callers_answer() -> None:
    """``put`` queues a ``Pending`` subclass; the committer releases its caller through the
    subclass's ``answer`` (the batch is durable) and ``fail`` (the batch failed)."""
    fake = FakeCommit()
    fake.lost = {"lost"}
    group = committer(fake)
    loop = asyncio.get_running_loop()

    def put(run_id: str) -> asyncio.Future[object]:
        pending = Judged(run_id, (b"l",), 1, False, loop.create_future())
        group.put(pending)
        return pending.future

    assert await put("kept") == "stored"
    with pytest.raises(LookupError, match="lost: not held"):
        await put("lost")
    fake.fail = OSError("the disk")
    with pytest.raises(RuntimeError, match="failed: the disk"):
        await put("failed")
    assert [run for batch in fake.batches for run, _ in batch] == ["kept", "lost", "failed"]
    await group.close()


async def test_a_committed_write_is_freed_at_once_not_kept_by_its_idle_writer() -> None:
    """Design 0212, "Cost": a writer waiting for work keeps no committed batch alive, so a
    fleet's writes do not age into the collector's old generations."""
    fake = FakeCommit()
    group = committer(fake, writers=1)
    future = group.submit("a", (b"a1",), 1, False)
    assert await future == STORED
    freed = weakref.ref(future)
    del future
    for _ in range(3):
        await asyncio.sleep(0)  # the writer is back waiting for the next batch
    assert freed() is None, "the idle writer still holds the committed batch"
    await group.close()


# -- The same engine as the lease grants, first reads and releases use (designs 0212, 0218) --


class FakeRun:
    """Records each batch (its items: run ids that are numbers); a batch waits for ``gate``
    when set; ``fail`` makes the next batch raise; the answer to an item is the item doubled."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate: asyncio.Event | None = None
        self.fail: BaseException | None = None

    async def __call__(self, batch: list[Pending]) -> list[int]:
        items = [int(pending.run_id) for pending in batch]
        self.batches.append(items)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        return [item * 2 for item in items]


def asker(run: FakeRun, *, workers: int, max_batch: int) -> Batcher[int]:
    return Batcher(
        run, name="lease grants", workers=workers, max_batch=max_batch, failures=(OSError,)
    )


def ask(batcher: Batcher[int], item: int) -> asyncio.Future[int]:
    return batcher.submit(str(item))


async def test_batcher_runs_what_is_queued_together_and_answers_each_caller() -> None:
    run = FakeRun()
    run.gate = asyncio.Event()
    batcher: Batcher[int] = asker(run, workers=1, max_batch=100)
    first = asyncio.ensure_future(ask(batcher, 0))
    await asyncio.sleep(0)  # the first batch is out, held by the gate
    rest = [asyncio.ensure_future(ask(batcher, i)) for i in range(1, 6)]
    await asyncio.sleep(0)
    run.gate.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [2, 4, 6, 8, 10]
    assert run.batches == [[0], [1, 2, 3, 4, 5]]  # one call for everything queued meanwhile


async def test_batcher_respects_its_batch_cap() -> None:
    run = FakeRun()
    batcher: Batcher[int] = asker(run, workers=1, max_batch=2)
    assert await asyncio.gather(*(ask(batcher, i) for i in range(5))) == [0, 2, 4, 6, 8]
    assert [len(b) for b in run.batches] == [2, 2, 1]


async def test_batcher_never_sends_a_caller_cancelled_while_queued() -> None:
    run = FakeRun()
    run.gate = asyncio.Event()
    batcher: Batcher[int] = asker(run, workers=1, max_batch=100)
    first = asyncio.ensure_future(ask(batcher, 0))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(ask(batcher, 7))
    kept = asyncio.ensure_future(ask(batcher, 8))
    await asyncio.sleep(0)
    gone.cancel()
    run.gate.set()
    assert (await first, await kept) == (0, 16)
    assert gone.cancelled()
    assert run.batches == [[0], [8]]


async def test_batcher_failure_reaches_that_batch_only() -> None:
    run = FakeRun()
    run.gate = asyncio.Event()
    batcher: Batcher[int] = asker(run, workers=1, max_batch=100)
    run.fail = OSError("server down")
    failed = [asyncio.ensure_future(ask(batcher, i)) for i in range(3)]
    await asyncio.sleep(0)
    run.gate.set()
    outcomes = await asyncio.gather(*failed, return_exceptions=True)
    assert all(isinstance(o, OSError) for o in outcomes)
    assert await ask(batcher, 4) == 8  # the next batch runs as usual
    await batcher.close()


async def test_a_large_batch_is_answered_in_parts_so_the_fleet_is_not_one_convoy() -> None:
    """The callers answered first write again, and a free writer commits those writes, before
    the last callers of the same batch are answered (design 0212, "fleet client CPU"): a fleet
    does not move as one block of writes, the loop idle while that block commits."""
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    answered = 0
    answered_when_committed: list[int] = []

    async def counting(batch: Sequence[Pending]) -> list[Outcome]:
        answered_when_committed.append(answered)  # the answered count as it reaches the commit
        return await fake(batch)

    group = committer(counting, writers=2, max_batch=1_000)

    async def run(i: int) -> None:
        nonlocal answered
        assert await group.submit(f"r{i:03d}", (b"first",), 1, False) == STORED
        answered += 1
        assert await group.submit(f"r{i:03d}", (b"second",), 1, False) == STORED

    runs = [asyncio.ensure_future(run(i)) for i in range(300)]
    await fake.entered.wait()
    fake.gate.set()
    await asyncio.gather(*runs)
    assert len(fake.batches[0]) == 300, "the 300 first writes shared one commit"
    seconds = [
        n
        for n, batch in zip(answered_when_committed, fake.batches, strict=True)
        if batch and batch[0][1] == b"second"
    ]
    assert seconds[0] < 300, "no second write was committed before every first was answered"
    # Each run's second write still follows its first, and every write was committed once.
    committed = [entry for batch in fake.batches for entry in batch]
    assert sorted(committed) == sorted(
        [(f"r{i:03d}", b"first") for i in range(300)]
        + [(f"r{i:03d}", b"second") for i in range(300)]
    )
    await group.close()


async def test_each_caller_of_a_batch_answered_in_parts_gets_its_own_outcome() -> None:
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    fake.lost = {"r250"}
    group = committer(fake, max_batch=1_000)
    writes = [asyncio.ensure_future(group.submit(f"r{i}", (b"x",), 1, False)) for i in range(300)]
    await fake.entered.wait()
    fake.gate.set()
    outcomes = await asyncio.gather(*writes)
    assert len(fake.batches) == 1
    assert outcomes[250] == Outcome(held=False, written=False)
    assert outcomes[:250] + outcomes[251:] == [STORED] * 299
    await group.close()


async def test_a_writer_stopped_between_parts_answers_the_rest_with_their_outcomes() -> None:
    """The rest of a committed batch is durable: a writer cancelled between two parts (as
    ``close()`` cancels its writers) answers them at once, never with "may not be stored"."""
    fake = FakeCommit()
    stopped: list[bool] = []

    async def stop_after_the_first_part(batch: Sequence[Pending]) -> list[Outcome]:
        writer = asyncio.current_task()  # the worker running this batch
        assert writer is not None

        def stop(_: object) -> None:  # runs once the first part is answered, before the next
            stopped.append(not batch[-1].future.done())
            writer.cancel()

        batch[0].future.add_done_callback(stop)
        return await fake(batch)

    group = committer(stop_after_the_first_part, max_batch=1_000)
    writes = [asyncio.ensure_future(group.submit(f"r{i}", (b"x",), 1, False)) for i in range(300)]
    assert await asyncio.gather(*writes) == [STORED] * 300
    assert stopped == [True], "the writer was not stopped between two parts"
    await group.close()


async def test_batcher_answers_a_caller_that_submits_again_as_soon_as_it_is_answered() -> None:
    """Issue 34: a submit made by a caller the batcher has just answered, in the same turn of
    the loop, used to find the finished worker still counted as live and wait for a later
    submit that, at a fleet's tail, never comes (bounded here, so a regression fails)."""
    run = FakeRun()
    batcher: Batcher[int] = asker(run, workers=1, max_batch=100)

    async def twice() -> tuple[int, int]:
        return await ask(batcher, 1), await ask(batcher, 2)

    assert await asyncio.wait_for(twice(), timeout=10) == (2, 4)
    await batcher.close()


async def test_batcher_answers_callers_of_two_workers_that_submit_again_in_the_same_turn() -> None:
    """Two callers start the two workers in one turn; the first worker answers both, and both
    submit again in the turn in which both workers have just finished."""
    run = FakeRun()
    batcher: Batcher[int] = asker(run, workers=2, max_batch=100)

    async def twice(item: int) -> tuple[int, int]:
        return await ask(batcher, item), await ask(batcher, item + 10)

    callers = asyncio.gather(twice(1), twice(2))
    assert await asyncio.wait_for(callers, timeout=10) == [(2, 22), (4, 24)]
    assert run.batches[0] == [1, 2], "both first submits were answered by one batch"
    await batcher.close()


@pytest.mark.parametrize("extra", [-1, 1], ids=["short", "long"])
async def test_more_or_fewer_answers_than_items_is_a_typed_error_naming_the_statement(
    extra: int,
) -> None:
    """A statement that answers a batch with a short or long list is a bug of the store: every
    caller of that batch gets ``BatchAnswerError`` naming the statement (a short list used to
    reach the lease grants' callers as "the store's batch was cancelled"); the next batch
    runs as usual."""
    run = FakeRun()

    async def miscounting(batch: list[Pending]) -> list[int]:
        answers = await run(batch)
        if len(run.batches) > 1:  # only the first batch is answered wrong
            return answers
        return answers[:-1] if extra < 0 else [*answers, 0]

    batcher: Batcher[int] = Batcher(
        miscounting, name="lease grants", workers=1, max_batch=100, failures=(OSError,)
    )
    callers = [ask(batcher, i) for i in range(3)]
    for outcome in await asyncio.gather(*callers, return_exceptions=True):
        assert isinstance(outcome, BatchAnswerError)
        assert isinstance(outcome, RuntimeError)
        assert f"lease grants statement gave {3 + extra} answers for 3 items" in str(outcome)
    assert await asyncio.wait_for(ask(batcher, 4), timeout=10) == 8
    await batcher.close()


async def test_a_commit_answering_fewer_writes_than_its_batch_fails_them_typed() -> None:
    fake = FakeCommit()

    async def short(batch: list[Pending]) -> list[Outcome]:
        return (await fake(batch))[:-1]

    group = committer(short)
    with pytest.raises(BatchAnswerError, match="record writes statement gave 0 answers for 1"):
        await group.submit("a", (b"a1",), 1, False)
    await group.close()


async def test_a_write_held_back_when_its_worker_dies_of_a_bug_is_committed_by_a_new_one() -> None:
    """A worker that ends of a bug in the commit leaves writes it held back (the next write of
    a run in its batch) in the queue: a new worker takes them, with no later submit to start
    one, and the store still closes."""
    fake = FakeCommit()
    fake.gate = asyncio.Event()
    fake.fail = KeyError("a bug")
    group = committer(fake, writers=2)
    first = group.submit("x", (b"x1",), 1, False)
    await fake.entered.wait()  # x1 is out: the next write of x waits for the next batch
    second = group.submit("x", (b"x2",), 1, False)
    fake.gate.set()
    with pytest.raises(KeyError, match="a bug"):
        await first
    assert await asyncio.wait_for(second, 5) == STORED
    await asyncio.wait_for(group.close(), 5)


async def test_a_bad_answer_count_never_strands_the_next_write_of_its_run() -> None:
    """The typed error of a short answer list ends its worker like any bug of the statement;
    the run's next write, held back behind that batch, is still committed."""
    gate = asyncio.Event()
    calls = 0

    async def short_once(batch: Sequence[Pending]) -> list[Outcome]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await gate.wait()
            return []
        return [STORED for _ in batch]

    group = committer(short_once, writers=2)
    first = group.submit("x", (b"x1",), 1, False)
    await asyncio.sleep(0)
    second = group.submit("x", (b"x2",), 1, False)
    gate.set()
    with pytest.raises(BatchAnswerError):
        await first
    assert await asyncio.wait_for(second, 5) == STORED
    await asyncio.wait_for(group.close(), 5)
