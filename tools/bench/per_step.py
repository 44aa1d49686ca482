"""Per-step overhead: µs and fsyncs per step for runs of N steps, per store.

``python -m tools.bench.per_step [--quick] [--json-out PATH] [--disk-dir DIR]``

For N = 10, 50, 200, 1000 and each store (``VolatileRunStore``; ``JsonlRunStore`` on the real
disk under ``--disk-dir``; ``JsonlRunStore`` on tmpfs ``/dev/shm`` when it exists) one run of
N steps is timed from ``run()``'s call to its return, ``repeats`` times, each after a
``gc.collect()`` (so every sample starts from the same collector state; collections during the
run still count); the median is reported. ``us_per_step`` is (wall time - time inside
``os.fsync``) / N, so it includes the run's fixed costs (snapshot, start and finish records)
spread over its steps.
``cpu_us_per_step`` is (CPU time of the process, every thread, ``time.process_time`` - CPU
time spent inside ``os.fsync``) / N: the CPU the run costs beyond its fsyncs. The two differ
by the time the process sits idle, waiting for a worker thread to wake up or for the loop to
wake up after it (the JSONL store's barriers are synced in its writer threads, design 0219):
on a shared VM those wake-ups cost tens of µs each in wall time and almost no CPU.
``fsyncs_per_step`` counts every fsync of the run / N; ``fsyncs_per_step_loop`` counts only
those between the second and the last model call, i.e. the steady-state cost of one step.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyloop.ports import ModelCall, RunStore
from polyloop.session import run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import StopReason
from tools.bench._common import (
    SHM_DIR,
    FsyncMeter,
    NoopModel,
    Workload,
    add_disk_dir_argument,
    argument_parser,
    median,
    print_table,
    results_envelope,
    write_json,
)

NAME = "per_step"
SIZES = (10, 50, 200, 1000)
QUICK_SIZES = (5, 20)
REPEATS = 5
QUICK_REPEATS = 2


@dataclass(frozen=True)
class StoreKind:
    """How to make a fresh store for one timed run."""

    label: str
    directory: Path | None  # None: VolatileRunStore

    def make(self, tag: str) -> RunStore:
        if self.directory is None:
            return VolatileRunStore()
        return JsonlRunStore(directory=self.directory / tag)

    def cleanup(self, tag: str) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory / tag, ignore_errors=True)


@dataclass
class Sample:
    wall_s: float
    fsync_s: float
    cpu_s: float
    fsync_cpu_s: float
    fsyncs: int
    loop_fsyncs: int


async def time_one_run(
    workload: Workload, kind: StoreKind, steps: int, meter: FsyncMeter, tag: str
) -> Sample:
    """One run of ``steps`` steps on a fresh store, timed."""
    marks: dict[int, int] = {}

    def on_call(call: ModelCall) -> None:
        if call.call_index in (1, steps - 1):
            marks[call.call_index] = meter.snapshot()[0]

    store = kind.make(tag)
    definition = workload.definition(store, NoopModel(on_call=on_call))
    request = workload.request(f"bench-{tag}", steps)
    gc.collect()  # every sample starts from the same collector state
    count_before, seconds_before = meter.snapshot()
    fsync_cpu_before = meter.cpu_snapshot()
    started, started_cpu = time.perf_counter(), time.process_time()
    result = await run(definition, request)
    wall, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    count_after, seconds_after = meter.snapshot()
    fsync_cpu = meter.cpu_snapshot() - fsync_cpu_before
    kind.cleanup(tag)
    if result.stop_reason is not StopReason.STEP_BUDGET or len(result.steps) != steps:
        raise RuntimeError(
            f"the bench run ended wrongly: {result.stop_reason}, {len(result.steps)}"
        )
    loop_fsyncs = marks.get(steps - 1, 0) - marks.get(1, 0) if steps > 2 else 0
    return Sample(
        wall_s=wall,
        fsync_s=seconds_after - seconds_before,
        cpu_s=cpu,
        fsync_cpu_s=fsync_cpu,
        fsyncs=count_after - count_before,
        loop_fsyncs=loop_fsyncs,
    )


def store_kinds(disk_dir: Path) -> list[StoreKind]:
    kinds = [StoreKind("volatile", None), StoreKind("jsonl-disk", disk_dir / "per_step")]
    if SHM_DIR.is_dir():
        # One directory per process: two benchmarks on one machine must not share (and
        # remove) each other's logs and lock files.
        kinds.append(StoreKind("jsonl-tmpfs", SHM_DIR / f"polyloop-bench-per_step-{os.getpid()}"))
    return kinds


async def measure(sizes: Sequence[int], repeats: int, disk_dir: Path) -> list[dict[str, object]]:
    workload = Workload.build()
    meter = FsyncMeter()
    rows: list[dict[str, object]] = []
    with meter.installed():
        for kind in store_kinds(disk_dir):
            await time_one_run(workload, kind, 5, meter, "warmup")  # imports, thread pool, caches
            for steps in sizes:
                samples = [
                    await time_one_run(workload, kind, steps, meter, f"n{steps}-r{repeat}")
                    for repeat in range(repeats)
                ]
                rows.append(summarise(kind.label, steps, samples))
            if kind.directory is not None:
                shutil.rmtree(kind.directory, ignore_errors=True)
    return rows


def summarise(store: str, steps: int, samples: Sequence[Sample]) -> dict[str, object]:
    beyond_fsync = [(s.wall_s - s.fsync_s) / steps * 1e6 for s in samples]
    cpu_beyond_fsync = [(s.cpu_s - s.fsync_cpu_s) / steps * 1e6 for s in samples]
    total_fsyncs = median([s.fsyncs for s in samples])
    fsync_seconds = sum(s.fsync_s for s in samples)
    fsync_calls = sum(s.fsyncs for s in samples)
    return {
        "store": store,
        "steps": steps,
        "repeats": len(samples),
        "us_per_step": median(beyond_fsync),
        "us_per_step_min": min(beyond_fsync),
        "us_per_step_with_fsync": median([s.wall_s / steps * 1e6 for s in samples]),
        "cpu_us_per_step": median(cpu_beyond_fsync),
        "cpu_us_per_step_min": min(cpu_beyond_fsync),
        "fsyncs_per_run": total_fsyncs,
        "fsyncs_per_step": total_fsyncs / steps,
        "fsyncs_per_step_loop": (
            median([s.loop_fsyncs for s in samples]) / (steps - 2) if steps > 2 else None
        ),
        "us_per_fsync": fsync_seconds / fsync_calls * 1e6 if fsync_calls else None,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Per-step overhead of the run loop, per store.")
    add_disk_dir_argument(parser)
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    repeats = QUICK_REPEATS if args.quick else REPEATS
    rows = asyncio.run(measure(sizes, repeats, args.disk_dir))
    results = results_envelope(NAME, argv, quick=args.quick, rows=rows, disk_dir=args.disk_dir)
    print_table(
        "per-step overhead (median of repeats; µs exclude time inside os.fsync)",
        [
            "store",
            "N",
            "µs/step",
            "CPU µs/step",
            "µs/step+fsync",
            "fsyncs/step",
            "fsyncs/step loop",
            "µs/fsync",
        ],
        [
            [
                row["store"],
                row["steps"],
                row["us_per_step"],
                row["cpu_us_per_step"],
                row["us_per_step_with_fsync"],
                row["fsyncs_per_step"],
                "-" if row["fsyncs_per_step_loop"] is None else row["fsyncs_per_step_loop"],
                "-" if row["us_per_fsync"] is None else row["us_per_fsync"],
            ]
            for row in rows
        ],
    )
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
