"""Resume cost: time for ``resume()`` of a finished and of an interrupted run of N steps.

``python -m tools.bench.resume_cost [--quick] [--json-out PATH] [--disk-dir DIR]``

For N = 10, 100, 1000 a run of N steps is written once with ``JsonlRunStore`` (real disk,
``--disk-dir``). Then, each timed ``repeats`` times with a fresh store object (nothing cached) and
after a ``gc.collect()``:

* **finished**: ``resume`` of the finished log. It reads and decodes the whole file and returns
  the stored result without doing anything else.
* **interrupted**: the same log with its last two records cut off (the last step's
  ``StepCompleted`` and the ``RunFinished``), which is what a crash right after the last
  action's intent leaves behind. ``resume`` reads and decodes the log, checks the parameter
  snapshot, rebuilds the history, replays the last action (the no-op tool is ``SAFE``), writes
  its step and the finish record. The ``fsync`` of the finish record is measured separately and
  subtracted, like in ``per_step``.

The same two cases run on ``VolatileRunStore`` (a separate run of N steps, since the store kind
is part of the parameter snapshot): the finished run is resumed in the store that ran it; for
the interrupted case the run's writes, minus the last two, are replayed into a fresh store
through its own write methods.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polyloop.ports import RunLog, RunStore
from polyloop.session import resume, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import (
    Intent,
    ModelCallResult,
    RunFinished,
    RunResult,
    RunStarted,
    StepCompleted,
    StopReason,
)
from tools.bench._common import (
    FsyncMeter,
    Workload,
    add_disk_dir_argument,
    argument_parser,
    median,
    print_table,
    results_envelope,
    write_json,
)

NAME = "resume_cost"
SIZES = (10, 100, 1000)
QUICK_SIZES = (5, 20)
REPEATS = 9
QUICK_REPEATS = 2
CUT_RECORDS = 2


class RecordingStore:
    """Delegates to a ``VolatileRunStore`` and remembers every write in order, so that a
    prefix of the run's records can be written into a fresh store later."""

    offers_leases = False  # one run at a time; the writes must reach the recording here

    def __init__(self) -> None:
        self.inner = VolatileRunStore()
        self.writes: list[tuple[str, Any]] = []

    async def _write(self, method: str, record: Any) -> None:
        self.writes.append((method, record))
        await getattr(self.inner, method)(record)

    async def write_run_started(self, record: RunStarted) -> None:
        await self._write("write_run_started", record)

    async def write_intent(self, record: Intent) -> None:
        await self._write("write_intent", record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await self._write("write_model_call_result", record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        await self._write("write_step_completed", record)

    async def write_run_finished(self, record: RunFinished) -> None:
        await self._write("write_run_finished", record)

    async def read_log(self, run_id: str) -> RunLog:
        return await self.inner.read_log(run_id)

    def parameters(self) -> Mapping[str, str]:
        return self.inner.parameters()

    async def replay_into(self, store: VolatileRunStore, *, cut: int) -> None:
        for method, record in self.writes[:-cut]:
            await getattr(store, method)(record)


def cut_last_records(raw: bytes, count: int) -> bytes:
    lines = raw.split(b"\n")[:-1]  # every record ends with "\n"
    return b"".join(line + b"\n" for line in lines[:-count])


def check(result: RunResult, steps: int) -> None:
    if result.stop_reason is not StopReason.STEP_BUDGET or len(result.steps) != steps:
        raise RuntimeError(f"resume ended wrongly: {result.stop_reason}, {len(result.steps)}")


async def timed_resume(
    workload: Workload, store: RunStore, run_id: str, steps: int, meter: FsyncMeter
) -> tuple[float, float]:
    """Seconds for one ``resume`` call, and seconds of it spent inside ``os.fsync``."""
    gc.collect()  # every sample starts from the same collector state
    _, fsync_before = meter.snapshot()
    started = time.perf_counter()
    result = await resume(workload.definition(store), workload.request(run_id, steps))
    wall = time.perf_counter() - started
    check(result, steps)
    return wall, meter.snapshot()[1] - fsync_before


async def measure_size(
    workload: Workload, steps: int, repeats: int, disk_dir: Path, meter: FsyncMeter
) -> list[dict[str, object]]:
    base = disk_dir / f"n{steps}"
    shutil.rmtree(base, ignore_errors=True)
    run_id = f"resume-{steps}"
    check(await run(workload.definition(JsonlRunStore(directory=base / "finished")),
                    workload.request(run_id, steps)), steps)  # fmt: skip
    finished_raw = (base / "finished" / f"{run_id}.jsonl").read_bytes()
    cut_raw = cut_last_records(finished_raw, CUT_RECORDS)
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def add(store: str, state: str, sample: tuple[float, float]) -> None:
        samples.setdefault((store, state), []).append(sample)

    recorded = RecordingStore()
    check(await run(workload.definition(recorded), workload.request(run_id, steps)), steps)
    volatile_finished = recorded.inner
    for repeat in range(repeats):
        jsonl = JsonlRunStore(directory=base / "finished")
        add("jsonl", "finished", await timed_resume(workload, jsonl, run_id, steps, meter))
        directory = base / f"interrupted-{repeat}"
        directory.mkdir(parents=True)
        (directory / f"{run_id}.jsonl").write_bytes(cut_raw)
        jsonl = JsonlRunStore(directory=directory)
        add("jsonl", "interrupted", await timed_resume(workload, jsonl, run_id, steps, meter))
        add(
            "volatile",
            "finished",
            await timed_resume(workload, volatile_finished, run_id, steps, meter),
        )
        volatile = VolatileRunStore()
        await recorded.replay_into(volatile, cut=CUT_RECORDS)
        add("volatile", "interrupted", await timed_resume(workload, volatile, run_id, steps, meter))
    shutil.rmtree(base, ignore_errors=True)
    return [
        {
            "store": store,
            "state": state,
            "steps": steps,
            "log_records": finished_raw.count(b"\n") - (CUT_RECORDS if state != "finished" else 0),
            "log_bytes": len(finished_raw if state == "finished" else cut_raw),
            "repeats": len(values),
            "ms": median([(wall - fsync) * 1e3 for wall, fsync in values]),
            "ms_min": min((wall - fsync) * 1e3 for wall, fsync in values),
            "ms_with_fsync": median([wall * 1e3 for wall, _ in values]),
        }
        for (store, state), values in samples.items()
    ]


async def measure(sizes: Sequence[int], repeats: int, disk_dir: Path) -> list[dict[str, object]]:
    workload = Workload.build()
    meter = FsyncMeter()
    rows: list[dict[str, object]] = []
    with meter.installed():
        await measure_size(workload, 3, 1, disk_dir / NAME, meter)  # warm-up
        for steps in sizes:
            rows += await measure_size(workload, steps, repeats, disk_dir / NAME, meter)
    shutil.rmtree(disk_dir / NAME, ignore_errors=True)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Time to resume a finished and an interrupted run.")
    add_disk_dir_argument(parser)
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    repeats = QUICK_REPEATS if args.quick else REPEATS
    rows = asyncio.run(measure(sizes, repeats, args.disk_dir))
    results = results_envelope(NAME, argv, quick=args.quick, rows=rows, disk_dir=args.disk_dir)
    print_table(
        "resume cost (median of repeats; ms exclude time inside os.fsync)",
        ["store", "log", "N", "records", "KiB", "ms", "ms min", "ms+fsync"],
        [
            [
                row["store"],
                row["state"],
                row["steps"],
                row["log_records"],
                float(row["log_bytes"]) / 1024,  # type: ignore[arg-type]
                row["ms"],
                row["ms_min"],
                row["ms_with_fsync"],
            ]
            for row in rows
        ],
    )
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
