"""Diagnostic: the CPU of encoding one step's log records (not a benchmark; not in ``run_all``).

``python -m tools.bench.encode_step [--steps N] [--runs R] [--repeats K]``, or
``python -m tools.bench.encode_step --run-only [--jsonl-tmpfs] [--steps N]``

Runs one run of N steps of the ``per_step`` workload on a ``VolatileRunStore`` and reads its
records back. Then, K times, it encodes them R times the way a lease does, through one fresh
``StepLines`` per run: every record in order, with the finish holding the very step objects
of the step records, so it is spliced. It prints the median, lowest and highest µs per step.
Compare two trees in one sitting by alternating ``PYTHONPATH=<tree>/src``.

Instructions per step do not depend on the machine's load (design 0214). Run it under
``PYTHONHASHSEED=0 valgrind --tool=callgrind`` with ``--runs 10 --repeats 1`` and with
``--runs 0 --repeats 1``. Divide the difference of the two totals by ``10 * N``.

``--run-only`` does one warm-up run of 5 steps and the run of N steps, and nothing else, on a
``VolatileRunStore`` or, with ``--jsonl-tmpfs``, a ``JsonlRunStore`` under ``/dev/shm``. Under
callgrind, N = 150 minus N = 50, divided by 100, is the instructions of one whole step.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import statistics
import time
from collections.abc import Sequence

from polyloop.ports import RunStore
from polyloop.session import run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.stores._records import Record, StepLines
from polyloop.types import RunFinished, StepCompleted
from tools.bench._common import SHM_DIR, Workload


async def runs_only(steps: int, *, jsonl_tmpfs: bool) -> None:
    """A warm-up run of 5 steps, then one run of ``steps`` steps: nothing else."""
    workload = Workload.build()
    directory = SHM_DIR / f"polyloop-bench-encode_step-{os.getpid()}"

    def store(tag: str) -> RunStore:
        return JsonlRunStore(directory=directory / tag) if jsonl_tmpfs else VolatileRunStore()

    try:
        await run(workload.definition(store("warm")), workload.request("warm", 5))
        await run(workload.definition(store("run")), workload.request("run", steps))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def run_records(steps: int) -> list[Record]:
    """The records of one run of ``steps`` steps, the finish holding the steps' own objects."""
    workload = Workload.build()
    store = VolatileRunStore()
    await run(workload.definition(store), workload.request("encode-step", steps))
    log = await store.read_log("encode-step")
    records: list[Record] = [entry.record for entry in log.entries]
    finish = records[-1]
    assert isinstance(finish, RunFinished)
    kept = tuple(record.step for record in records if isinstance(record, StepCompleted))
    result = dataclasses.replace(finish.result, steps=kept)
    records[-1] = dataclasses.replace(finish, result=result)
    return records


def encode_run(records: Sequence[Record]) -> None:
    lines = StepLines()
    for record in records:
        lines.encode(record, type(record), "bench")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=200, help="encodings of the run per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--run-only", action="store_true", help="only run (for callgrind)")
    parser.add_argument("--jsonl-tmpfs", action="store_true", help="with --run-only")
    args = parser.parse_args(argv)
    if args.run_only:
        asyncio.run(runs_only(args.steps, jsonl_tmpfs=args.jsonl_tmpfs))
        return
    records = asyncio.run(run_records(args.steps))
    encode_run(records)  # warm-up, and the count of a "--runs 0" baseline
    samples = []
    for _ in range(args.repeats):
        started = time.process_time()
        for _ in range(args.runs):
            encode_run(records)
        elapsed = time.process_time() - started
        samples.append(elapsed / max(args.runs * args.steps, 1) * 1e6)
    print(
        f"encoding one step's records (N={args.steps}, {args.runs} runs x {args.repeats}): "
        f"median {statistics.median(samples):.2f} µs/step "
        f"[{min(samples):.2f}-{max(samples):.2f}]"
    )


if __name__ == "__main__":
    main()
