"""Many runs at once: R concurrent runs of 20 steps on one event loop, ``VolatileRunStore``.

``python -m tools.bench.many_runs [--quick] [--json-out PATH]``

Each size R = 1, 10, 100, 1000 is measured in a fresh child process (``--child R``), because
peak RSS is a high-water mark that a process never lowers: sizes measured in one process
would report the largest one's peak for all. The child builds one workload and one shared
store, notes its RSS, starts R runs with ``asyncio.gather`` and times them to the last one's
return. The scripted model yields to the loop once per call (``asyncio.sleep(0)``), so the runs
really interleave; without that each run would finish before the next one started.

Reported: wall time, steps per second over all runs, peak RSS of the child and
``(peak RSS - RSS before the runs) / R`` as the memory one run costs. The store keeps every
run's log (the encoded records) for the life of the process, so that figure includes the log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from polyloop.session import run
from polyloop.stores import VolatileRunStore
from polyloop.types import StopReason
from tools.bench._common import (
    REPO_ROOT,
    NoopModel,
    Workload,
    argument_parser,
    current_rss_kib,
    peak_rss_kib,
    print_table,
    results_envelope,
    write_json,
)

NAME = "many_runs"
SIZES = (1, 10, 100, 1000)
QUICK_SIZES = (1, 10)
STEPS = 20
QUICK_STEPS = 5


async def child(runs: int, steps: int) -> dict[str, object]:
    """Measure one size; runs in the child process."""
    workload = Workload.build()
    definition = workload.definition(VolatileRunStore(), NoopModel(yield_to_loop=True))
    requests = [workload.request(f"run-{index}", steps) for index in range(runs)]
    await run(workload.definition(VolatileRunStore()), workload.request("warmup", 3))
    rss_before = current_rss_kib()
    started = time.perf_counter()
    results = await asyncio.gather(*(run(definition, request) for request in requests))
    wall = time.perf_counter() - started
    peak = peak_rss_kib()
    for result in results:
        if result.stop_reason is not StopReason.STEP_BUDGET or len(result.steps) != steps:
            raise RuntimeError(f"a bench run ended wrongly: {result.stop_reason}")
    return {
        "runs": runs,
        "steps_per_run": steps,
        "wall_s": wall,
        "steps_per_s": runs * steps / wall,
        "us_per_step": wall / (runs * steps) * 1e6,
        "rss_before_kib": rss_before,
        "peak_rss_kib": peak,
        "peak_rss_per_run_kib": max(0, peak - rss_before) / runs,
    }


def measure_in_child(runs: int, steps: int) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-m", f"tools.bench.{NAME}", "--child", str(runs), "--steps", str(steps)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"the child measuring {runs} runs failed (exit {completed.returncode}):\n"
            f"{completed.stderr}"
        )
    result: dict[str, object] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Many concurrent runs on one event loop.")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 20)")
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.child is not None:
        print(json.dumps(asyncio.run(child(args.child, steps))))
        return {}
    sizes = QUICK_SIZES if args.quick else SIZES
    rows = [measure_in_child(runs, steps) for runs in sizes]
    results = results_envelope(NAME, argv, quick=args.quick, rows=rows)
    print_table(
        f"many concurrent runs of {steps} steps, VolatileRunStore, one event loop",
        ["runs", "wall s", "steps/s", "µs/step", "peak RSS MiB", "RSS/run KiB"],
        [
            [
                row["runs"],
                row["wall_s"],
                row["steps_per_s"],
                row["us_per_step"],
                float(row["peak_rss_kib"]) / 1024,  # type: ignore[arg-type]
                row["peak_rss_per_run_kib"],
            ]
            for row in rows
        ],
    )
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
