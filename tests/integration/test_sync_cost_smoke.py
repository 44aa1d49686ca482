"""The ``sync_cost`` diagnostic keeps working (it patches private seams, which may move).

Not a timed test: nothing here looks at a figure's size. It checks that every mode ran on
every place, and that ``waits-only`` really waits for the kernel at each barrier of the
volatile store (the row would otherwise be the volatile store's own cost, and mislead).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tools.bench import sync_cost
from tools.bench._common import FsyncMeter, Workload
from tools.bench.per_step import StoreKind, time_one_run

from _syncs import use_sync_path
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
    use_sync_path(monkeypatch, "kernel")
    steps = 4
    submitted, meter = KERNEL_SYNC.submitted, FsyncMeter()
    with sync_cost.volatile_waits(tmp_path), meter.installed():
        sample = asyncio.run(
            time_one_run(Workload.build(), StoreKind("disk", None), steps, meter, "w")
        )
    # Two intents a step (the model call's and the action's), plus the run's finish.
    assert KERNEL_SYNC.submitted - submitted >= 2 * steps + 1
    assert sample.fsyncs == KERNEL_SYNC.submitted - submitted  # the meter counted them
    assert (tmp_path / "waits-only.log").read_bytes() == b"{}\n" * sample.fsyncs
    # Afterwards the volatile store's barriers no longer wait.
    submitted = KERNEL_SYNC.submitted
    asyncio.run(time_one_run(Workload.build(), StoreKind("v", None), steps, FsyncMeter(), "x"))
    assert KERNEL_SYNC.submitted == submitted
