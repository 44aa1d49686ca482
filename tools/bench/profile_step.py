"""Diagnostic: where one step's time goes (not a benchmark; not in ``run_all``).

``python -m tools.bench.profile_step [--store volatile|jsonl-disk|jsonl-tmpfs] [--steps N]
[--runs R] [--top K] [--sort KEY] [--anatomy]``

Runs R runs of N steps of the ``per_step`` workload under ``cProfile`` and prints the top K
functions by own time (or by another ``pstats`` key such as ``cumulative``). ``cProfile``
sees only the event loop's thread: for the JSONL store the time the loop spends waiting for a
worker thread shows up as ``select``/``epoll`` waits, not as library functions.

``--anatomy`` (JSONL stores only) splits every write that goes through a worker thread into
three parts: from the loop handing it off to the thread starting it, the thread's own work
(including ``fsync``), and from the thread finishing to the awaiting coroutine resuming. It
wraps the private ``polyloop.stores._jsonl._append_line`` and ``_sync_and_close`` and is a
diagnostic only.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polyloop.stores import _jsonl
from tools.bench._common import DEFAULT_DISK_DIR, FsyncMeter, Workload
from tools.bench.per_step import StoreKind, store_kinds, time_one_run


async def profile_runs(kind: StoreKind, steps: int, runs: int) -> cProfile.Profile:
    workload = Workload.build()
    meter = FsyncMeter()
    with meter.installed():
        await time_one_run(workload, kind, 5, meter, "warmup")
        profiler = cProfile.Profile()
        profiler.enable()
        for index in range(runs):
            await time_one_run(workload, kind, steps, meter, f"profile-{index}")
        profiler.disable()
    return profiler


async def anatomy(kind: StoreKind, steps: int, runs: int) -> dict[str, dict[str, float]]:
    """Medians and 90th percentiles (µs) of the three parts of each threaded write."""
    parts: list[tuple[float, float, float]] = []
    marks: dict[str, float] = {}
    real_line = _jsonl._append_line
    real_sync = _jsonl._sync_and_close
    real_append = _jsonl.JsonlRunStore._append

    def timed(real: Any) -> Any:
        def timed_work(*args: Any, **kwargs: Any) -> None:
            marks["thread_start"] = time.perf_counter()
            try:
                real(*args, **kwargs)
            finally:
                marks["thread_end"] = time.perf_counter()

        return timed_work

    async def timed_append(self: _jsonl.JsonlRunStore, *args: Any, **kwargs: Any) -> None:
        marks.clear()
        handed = time.perf_counter()
        await real_append(self, *args, **kwargs)
        resumed = time.perf_counter()
        if "thread_start" in marks:
            parts.append(
                (
                    marks["thread_start"] - handed,
                    marks["thread_end"] - marks["thread_start"],
                    resumed - marks["thread_end"],
                )
            )

    _jsonl._append_line = timed(real_line)
    _jsonl._sync_and_close = timed(real_sync)
    _jsonl.JsonlRunStore._append = timed_append  # type: ignore[method-assign]
    try:
        workload = Workload.build()
        meter = FsyncMeter()
        with meter.installed():
            await time_one_run(workload, kind, 5, meter, "warmup")
            parts.clear()
            for index in range(runs):
                await time_one_run(workload, kind, steps, meter, f"anatomy-{index}")
    finally:
        _jsonl._append_line = real_line
        _jsonl._sync_and_close = real_sync
        _jsonl.JsonlRunStore._append = real_append  # type: ignore[method-assign]
    names = ("loop_to_thread", "thread_work", "thread_to_loop")
    return {
        name: {
            "median_us": statistics.median(p[index] for p in parts) * 1e6,
            "p90_us": sorted(p[index] for p in parts)[int(len(parts) * 0.9)] * 1e6,
            "writes": float(len(parts)),
        }
        for index, name in enumerate(names)
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.profile_step")
    parser.add_argument("--store", default="volatile", help="volatile, jsonl-disk or jsonl-tmpfs")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--sort", default="tottime", help="a pstats sort key, e.g. cumulative")
    parser.add_argument("--disk-dir", type=Path, default=DEFAULT_DISK_DIR)
    parser.add_argument("--anatomy", action="store_true", help="split threaded JSONL writes")
    args = parser.parse_args(argv)
    kinds = {kind.label: kind for kind in store_kinds(args.disk_dir / "profile_step")}
    if args.store not in kinds:
        parser.error(f"--store must be one of {', '.join(kinds)}")
    kind = kinds[args.store]
    if args.anatomy:
        if kind.directory is None:
            parser.error("--anatomy needs a JSONL store")
        figures_by_part = asyncio.run(anatomy(kind, args.steps, args.runs))
        shutil.rmtree(args.disk_dir / "profile_step", ignore_errors=True)
        shutil.rmtree(kind.directory, ignore_errors=True)
        for name, figures in figures_by_part.items():
            print(
                f"{name:>15}: median {figures['median_us']:7.1f} µs   "
                f"p90 {figures['p90_us']:7.1f} µs   ({int(figures['writes'])} writes)"
            )
        return
    profiler = asyncio.run(profile_runs(kind, args.steps, args.runs))
    shutil.rmtree(args.disk_dir / "profile_step", ignore_errors=True)
    if kind.directory is not None:
        shutil.rmtree(kind.directory, ignore_errors=True)
    stats = pstats.Stats(profiler)
    print(f"{args.runs} runs x {args.steps} steps, store {args.store}")
    stats.sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
