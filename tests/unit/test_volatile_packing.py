"""Volatile store: the logs of runs whose lease ended long ago are packed (design 0244).

``VolatileRunStore`` keeps every run's log in the process. Once the ended, unpacked runs hold
more than ``_pack_budget`` records, the run whose lease ended first is packed: its lines
compressed together against the store's dictionary. These tests bind what that changes (the
bytes a finished run holds, counted with ``tracemalloc``) and what it must not (the lines, the
records, later writes, a run leased again). The contract suites run on a store that packs at
every lease end too (``tests/contract/test_run_stores.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import tracemalloc

import pytest

from _batch_agents import make_agent
from polyloop.batch import run_batch
from polyloop.session import check_log
from polyloop.stores import VolatileRunStore
from polyloop.stores import _volatile as volatile_module
from polyloop.stores._records import encode_line
from polyloop.types import RunFinished

pytestmark = pytest.mark.unit

RUNS = 120


class PackingStore(VolatileRunStore):
    """Packs every run as soon as its lease ends."""

    _pack_budget = 0


def _batch(
    store: VolatileRunStore, runs: int = RUNS, batch_id: str = "b", concurrency: int = 8
) -> list[str]:
    agent = make_agent(store)
    report = asyncio.run(
        run_batch(
            agent,
            (f"k{i}" for i in range(runs)),
            batch_id=batch_id,
            key=lambda item: item,
            concurrency=concurrency,
            progress_stream=None,
        )
    )
    assert report.totals.items == runs
    return list(store._lines)


def _packed(store: VolatileRunStore, run_id: str) -> bool:
    entries = store._lines[run_id]
    return len(entries) == 1 and isinstance(entries[0], volatile_module._Packed)


def test_a_packed_run_reads_back_the_same_lines_and_records() -> None:
    """Packed before any read (records still kept as objects) or after one: the same lines,
    the same log."""
    store = VolatileRunStore()
    run_ids = _batch(store)
    assert not any(_packed(store, run_id) for run_id in run_ids)
    assert any(not isinstance(e, bytes) for e in store._lines[run_ids[0]])  # kept records
    expected = {
        run_id: [e if isinstance(e, bytes) else encode_line(e, type(e), "x") for e in entries]
        for run_id, entries in store._lines.items()
    }
    logs = {run_id: asyncio.run(store.read_log(run_id)) for run_id in run_ids[1::2]}
    for run_id in run_ids:
        store._pack(run_id)
        assert _packed(store, run_id)
    for run_id in run_ids:
        log = asyncio.run(store.read_log(run_id))
        assert list(store._encoded(run_id)) == expected[run_id]
        if run_id in logs:
            assert log == logs[run_id]
        assert check_log(log, run_id) is None


def test_a_run_is_packed_when_its_lease_ends() -> None:
    run_ids = _batch(PackingStore())
    store = PackingStore()
    assert _batch(store) == run_ids
    assert all(_packed(store, run_id) for run_id in run_ids)
    assert store._ended == {}
    assert store._ended_records == 0


def test_a_finished_packed_run_holds_under_a_fifth_of_its_unpacked_bytes() -> None:
    """Counted with ``tracemalloc``: what dropping the store's logs frees, per run (the
    unpacked figure is about 5,000 bytes a two-step run, the packed one under 800)."""
    held = {}
    for store in (PackingStore(), VolatileRunStore()):
        gc.collect()
        tracemalloc.start()
        try:
            _batch(store)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            store._lines.clear()
            gc.collect()
            held[type(store)] = (before - tracemalloc.get_traced_memory()[0]) / RUNS
        finally:
            tracemalloc.stop()
    assert held[VolatileRunStore] > 3_000  # the measurement sees the logs at all
    assert held[PackingStore] < 1_000
    assert held[PackingStore] * 5 < held[VolatileRunStore]


def test_packing_waits_for_the_budget_oldest_ended_run_first() -> None:
    class Budget(VolatileRunStore):
        _pack_budget = 25  # records: two finished two-step runs hold 9 each

    store = Budget()
    run_ids = _batch(store, runs=6, concurrency=1)  # they end in the order they start
    # 6 runs of 9 records: the oldest ended runs are packed until at most 25 remain unpacked.
    packed = [run_id for run_id in run_ids if _packed(store, run_id)]
    unpacked = [run_id for run_id in run_ids if not _packed(store, run_id)]
    assert len(packed) == 4
    assert len(unpacked) == 2
    assert store._ended_records == sum(len(store._lines[r]) for r in unpacked) <= 25
    assert list(store._ended) == unpacked


def test_writes_after_packing_append_and_a_run_leased_again_is_packed_again() -> None:
    store = PackingStore()
    (run_id,) = _batch(store, runs=1)
    lines = store._encoded(run_id)

    async def lease_and_read() -> tuple[bytes, ...]:
        lease = await store.acquire_lease(run_id)
        before = store._encoded(run_id)
        await lease.release()
        return before

    assert asyncio.run(lease_and_read()) == lines
    assert _packed(store, run_id)
    # The batch again: its finished run is read back (no write), packed again, the same log.
    assert _batch(store, runs=1) == [run_id]
    assert _packed(store, run_id)
    assert store._encoded(run_id) == lines


def test_a_held_run_is_not_packed_and_a_write_appends_after_a_pack() -> None:
    class Budget(VolatileRunStore):
        _pack_budget = 10  # records: one finished two-step run holds 9

    store = Budget()
    (first,) = _batch(store, runs=1, batch_id="a")

    async def scenario() -> None:
        lease = await store.acquire_lease(first)  # held again: leaves the ended runs
        (second,) = _batch_in_loop(store, batch_id="b")
        assert not _packed(store, first)
        assert not _packed(store, second)
        assert list(store._ended) == [second]
        await lease.release()  # 18 records ended: the older end (the second run) is packed
        assert _packed(store, second)
        assert not _packed(store, first)
        assert list(store._ended) == [first]
        log = await store.read_log(second)
        finished = next(e.record for e in log.entries if isinstance(e.record, RunFinished))
        again = await store.acquire_lease(second)
        await again.write_run_finished(finished)  # a later write appends after the pack
        assert isinstance(store._lines[second][0], volatile_module._Packed)
        assert len(store._lines[second]) == 2
        assert len((await store.read_log(second)).entries) == len(log.entries) + 1
        await again.release()  # 9 + 2 records ended: the older end (the first run) is packed
        assert _packed(store, first)
        assert len(store._lines[second]) == 2
        assert store._ended == {second: 2}
        store._pack(second)  # a pack and a line after it: packed into one
        assert _packed(store, second)
        assert len((await store.read_log(second)).entries) == len(log.entries) + 1

    asyncio.run(scenario())


def _batch_in_loop(store: VolatileRunStore, batch_id: str) -> list[str]:
    """``_batch`` of one item, from inside a running loop (a thread of its own)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = set(store._lines)
        pool.submit(_batch, store, 1, batch_id).result()
        return [run_id for run_id in store._lines if run_id not in before]
