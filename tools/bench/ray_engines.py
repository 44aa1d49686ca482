"""Runs per second and per-run overhead: the local engine vs Ray task-per-run vs Ray actors.

``python -m tools.bench.ray_engines [--quick] [--json-out PATH] [--runs N] [--in-flight N]``

The workload is ``tools.ray_workload``: a scripted model that takes a fixed 50 ms per call
(``asyncio.sleep``, so concurrency shows), six tool steps and a final answer (seven model
calls, 350 ms of model time per run), a ``JsonlRunStore`` in a temporary directory. Three
engines run the same runs:

* ``local``: ``run_or_resume`` for every run on this process's event loop, at most
  ``--in-flight`` at once (``asyncio.Semaphore``);
* ``ray-tasks``: ``run_on_ray(engine=RayTasks(num_cpus=0.25))`` on a loopback cluster of a
  head and two one-CPU worker nodes (so at most eight worker processes run runs at once);
* ``ray-actors``: ``run_on_ray(engine=RayActors(actors=2, runs_per_actor=32))`` on the same
  cluster.

Two figures per engine: **throughput** (``--runs`` runs, at most ``--in-flight`` in flight;
runs per second from the call to the last result, so actor start-up is included) and
**per-run overhead** (eleven runs one at a time; the time from the first result to the last,
divided by ten, minus a run's 350 ms of model time: start-up is excluded). Each Ray engine
gets a warm-up batch first (worker processes start lazily).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# tools.ray_cluster first: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported.
from tools.ray_cluster import LoopbackCluster  # isort: skip
from polyloop.ray import RayActors, RayTasks, run_on_ray
from polyloop.session import run_or_resume
from tools.bench._common import argument_parser, print_table, results_envelope, write_json
from tools.netns import exit_unless_loopback_namespace
from tools.ray_workload import WorkloadTask, build_run

NAME = "ray_engines"
ACTIONS = 6
LATENCY = 0.05
MODEL_SECONDS = (ACTIONS + 1) * LATENCY


def _tasks(prefix: str, count: int, root: Path) -> list[WorkloadTask]:
    store = root / "store"
    ledger = root / "ledger"
    store.mkdir(parents=True, exist_ok=True)
    ledger.mkdir(parents=True, exist_ok=True)
    return [
        WorkloadTask(
            run_id=f"{prefix}-{index}",
            store_dir=str(store),
            ledger_dir=str(ledger),
            actions=ACTIONS,
            model_latency=LATENCY,
        )
        for index in range(count)
    ]


async def _local(tasks: Sequence[WorkloadTask], in_flight: int) -> tuple[float, float]:
    """(wall from the call to the last result, wall from the first result to the last)."""
    gate = asyncio.Semaphore(in_flight)
    finished: list[float] = []

    async def one(task: WorkloadTask) -> None:
        async with gate, build_run(task) as (definition, request):
            await run_or_resume(definition, request)
        finished.append(time.perf_counter())

    started = time.perf_counter()
    await asyncio.gather(*(one(task) for task in tasks))
    return finished[-1] - started, finished[-1] - finished[0]


async def _on_ray(
    tasks: Sequence[WorkloadTask], in_flight: int, engine: Any
) -> tuple[float, float]:
    finished: list[float] = []
    started = time.perf_counter()
    async for outcome in run_on_ray(build_run, tasks, max_in_flight=in_flight, engine=engine):
        if outcome.error is not None:
            raise RuntimeError(f"a bench run failed: {outcome.error}")
        finished.append(time.perf_counter())
    return finished[-1] - started, finished[-1] - finished[0]


def _row(
    engine: str, runs: int, in_flight: int, wall: float, sequential: float, n: int
) -> dict[str, Any]:
    per_run = sequential / (n - 1)
    return {
        "engine": engine,
        "runs": runs,
        "in_flight": in_flight,
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "sequential_runs": n,
        "sequential_s_per_run": per_run,
        "overhead_ms_per_run": (per_run - MODEL_SECONDS) * 1000,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Local engine vs Ray tasks vs Ray actors, 50 ms model.")
    parser.add_argument("--runs", type=int, default=None, help="runs per throughput batch")
    parser.add_argument("--in-flight", type=int, default=32, help="runs in flight at most")
    args = parser.parse_args(argv)
    exit_unless_loopback_namespace("tools.bench.ray_engines")
    runs = args.runs or (16 if args.quick else 128)
    sequential = 4 if args.quick else 11
    in_flight = args.in_flight
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as scratch:
        root = Path(scratch)
        wall, _ = asyncio.run(_local(_tasks("local", runs, root), in_flight))
        _, seq = asyncio.run(_local(_tasks("local-seq", sequential, root), 1))
        rows.append(_row("local", runs, in_flight, wall, seq, sequential))

        with LoopbackCluster(workers=2, cpus_per_worker=1):
            engines = (
                ("ray-tasks", RayTasks(num_cpus=0.25)),
                ("ray-actors", RayActors(actors=2, runs_per_actor=32)),
            )
            for label, engine in engines:
                asyncio.run(_on_ray(_tasks(f"{label}-warm", 8, root), 8, engine))
                wall, _ = asyncio.run(_on_ray(_tasks(label, runs, root), in_flight, engine))
                _, seq = asyncio.run(_on_ray(_tasks(f"{label}-seq", sequential, root), 1, engine))
                rows.append(_row(label, runs, in_flight, wall, seq, sequential))
    results = results_envelope(
        NAME,
        argv,
        quick=args.quick,
        rows=rows,
        model_seconds_per_run=MODEL_SECONDS,
        cluster="head num_cpus=0 + 2 worker nodes num_cpus=1, one machine, loopback",
    )
    print_table(
        f"{runs} runs of {ACTIONS + 1} model calls x {LATENCY * 1000:.0f} ms, "
        f"at most {in_flight} in flight; overhead from {sequential} runs one at a time",
        ["engine", "runs/s", "wall s", "s/run alone", "overhead ms/run"],
        [
            [
                row["engine"],
                row["runs_per_s"],
                row["wall_s"],
                row["sequential_s_per_run"],
                row["overhead_ms_per_run"],
            ]
            for row in rows
        ],
    )
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
