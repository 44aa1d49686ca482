"""Diagnostic: what a JSONL step's syncs cost the process beyond the fsyncs themselves.

``python -m tools.bench.sync_cost [--steps N] [--repeats R] [--disk-dir DIR]``

Not a benchmark (not in ``run_all``): it answers where the CPU of ``per_step``'s JSONL rows
goes. For the JSONL store on the real disk and on tmpfs, one process runs the ``per_step``
workload (N steps, R runs, median of CPU µs a step beyond fsync, as ``per_step`` counts it)
with the barriers' syncs

* ``kernel``: handed to the kernel (Linux AIO), the shipped path;
* ``threads``: in the store's writer threads, the fallback path;
* ``answered-at-once``: **not synced at all**, the descriptor closed and the write answered
  on the next loop iteration. A diagnostic only (nothing it writes is durable): the difference
  to ``kernel`` is what the sync costs the process beyond the fsync, the difference between
  the disk and tmpfs rows of ``answered-at-once`` what the file system costs.

The rows of one sitting are comparable; print the load average with them (design 0214, fourth
pass, uses them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polyloop.stores._kernel_sync import KERNEL_SYNC
from tools.bench._common import DEFAULT_DISK_DIR, SHM_DIR, FsyncMeter, Workload
from tools.bench.per_step import StoreKind, time_one_run

MODES = ("kernel", "threads", "answered-at-once")


@contextmanager
def sync_mode(mode: str) -> Iterator[None]:
    """Make the JSONL store's barriers sync the way ``mode`` says, for the block."""
    enabled = KERNEL_SYNC.enabled
    try:
        if mode == "threads":
            KERNEL_SYNC.enabled = False
        elif mode == "answered-at-once":

            def answer_at_once(
                loop: asyncio.AbstractEventLoop,
                descriptor: int,
                done: Callable[[BaseException | None], None],
            ) -> bool:
                os.close(descriptor)
                loop.call_soon(done, None)
                return True

            KERNEL_SYNC.submit = answer_at_once  # type: ignore[method-assign]
        yield
    finally:
        KERNEL_SYNC.enabled = enabled
        KERNEL_SYNC.__dict__.pop("submit", None)


async def cpu_per_step(kind: StoreKind, steps: int, repeats: int) -> float:
    workload = Workload.build()
    meter = FsyncMeter()
    with meter.installed():
        await time_one_run(workload, kind, 5, meter, "warmup")
        samples = [
            await time_one_run(workload, kind, steps, meter, f"sync-cost-{index}")
            for index in range(repeats)
        ]
    return statistics.median((s.cpu_s - s.fsync_cpu_s) / steps * 1e6 for s in samples)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.sync_cost")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--disk-dir", type=Path, default=DEFAULT_DISK_DIR)
    args = parser.parse_args(argv)
    places = [("disk", args.disk_dir / f"sync_cost-{os.getpid()}")]
    if SHM_DIR.is_dir():
        places.append(("tmpfs", SHM_DIR / f"polyloop-bench-sync_cost-{os.getpid()}"))
    print(f"load average {os.getloadavg()[0]:.2f}; CPU µs a step beyond fsync, N = {args.steps}")
    figures: dict[str, Any] = {}
    for mode in MODES:
        for place, directory in places:
            with sync_mode(mode):
                figure = asyncio.run(
                    cpu_per_step(StoreKind(place, directory), args.steps, args.repeats)
                )
            shutil.rmtree(directory, ignore_errors=True)
            figures[f"{mode}/{place}"] = figure
            print(f"{mode:>17} {place:>6}: {figure:7.1f}")
    return figures


if __name__ == "__main__":
    main()
