"""The ``sync_cost`` diagnostic keeps working (it patches private seams, which may move).

Not a timed test: nothing here looks at a figure's size. It checks that every mode ran on
every place, and that ``waits-only`` really waits for the kernel at each barrier of the
volatile store (the row would otherwise be the volatile store's own cost, and mislead).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tools.bench import sync_cost
from tools.bench._common import FsyncMeter, Workload
from tools.bench.per_step import StoreKind, time_one_run

from _syncs import use_sync_path
from polyloop.stores import _volatile
from polyloop.stores._kernel_sync import KERNEL_SYNC

pytestmark = pytest.mark.integration


def test_every_mode_reports_a_figure_for_every_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_sync_path(monkeypatch, "kernel")  # waits-only needs it; skips (never in CI) without
    figures = sync_cost.main(["--steps", "3", "--repeats", "1", "--disk-dir", str(tmp_path)])
    places = {key.split("/")[1] for key in figures}
    assert "disk" in places
    assert set(figures) == {f"{mode}/{place}" for mode in sync_cost.MODES for place in places}
    assert all(figure > 0 for figure in figures.values())
    assert list(tmp_path.iterdir()) == []  # every place's files were removed


def test_waits_only_waits_for_a_kernel_sync_at_every_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One kernel sync after each barrier (the start, the two intents of every step, the
    finish), none after any other record, and each answered before the run writes again."""
    use_sync_path(monkeypatch, "kernel")
    steps = 4
    real_submit = KERNEL_SYNC.submit
    in_flight: list[int] = []
    started_while_in_flight: list[str] = []

    def submit(loop: Any, descriptor: int, done: Any) -> bool:
        in_flight.append(descriptor)

        def answered(error: BaseException | None) -> None:
            in_flight.remove(descriptor)
            done(error)

        return real_submit(loop, descriptor, answered)

    monkeypatch.setattr(KERNEL_SYNC, "submit", submit)
    lease = _volatile.VolatileRunLease
    real_write, real_pair = lease._write, lease.write_pair
    submitted, meter = KERNEL_SYNC.submitted, FsyncMeter()
    with sync_cost.volatile_waits(tmp_path), meter.installed():
        waiting_write, waiting_pair = lease._write, lease.write_pair

        async def write(self: Any, record: Any, kind: Any, method: str) -> None:
            if in_flight:
                started_while_in_flight.append(method)
            await waiting_write(self, record, kind, method)

        async def pair(self: Any, first: Any, second: Any) -> None:
            if in_flight:
                started_while_in_flight.append("write_pair")
            await waiting_pair(self, first, second)

        # By hand, not monkeypatch: its undo would put back the *waiting* methods after
        # volatile_waits has restored the real ones, for every later test.
        lease._write, lease.write_pair = write, pair  # type: ignore[method-assign]
        try:
            sample = asyncio.run(
                time_one_run(Workload.build(), StoreKind("disk", None), steps, meter, "w")
            )
        finally:
            lease._write, lease.write_pair = waiting_write, waiting_pair  # type: ignore[method-assign]
    assert (lease._write, lease.write_pair) == (real_write, real_pair), "all restored"
    assert KERNEL_SYNC.submitted - submitted == 2 * steps + 2
    assert sample.fsyncs == 2 * steps + 2  # the meter counted them
    assert started_while_in_flight == [], "a write started before the last wait was answered"
    assert (tmp_path / "waits-only.log").read_bytes() == b"{}\n" * sample.fsyncs
    # Afterwards the volatile store's barriers no longer wait.
    submitted = KERNEL_SYNC.submitted
    asyncio.run(time_one_run(Workload.build(), StoreKind("v", None), steps, FsyncMeter(), "x"))
    assert KERNEL_SYNC.submitted == submitted
