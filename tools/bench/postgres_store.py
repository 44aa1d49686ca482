"""PostgreSQL store: steps/s of a fleet of concurrent runs and µs a step of one run alone.

``python -m tools.bench.postgres_store [--quick] [--conninfo DSN] [--repeats N]
[--pool-size N] [--json-out PATH]``

Without ``--conninfo`` a throwaway server is started from the system binaries
(``tools/pg_cluster.py``, the server's defaults: ``fsync`` and ``synchronous_commit`` on) and
removed at the end. Every figure goes through the public API as a user's runs would:
``run()`` of the benchmarks' no-op workload (``tools/bench/_common.py``) on one
``PostgresRunStore``, each run holding its lease (the session takes it), and every figure is
printed with the load average (1 min) read just before and just after it, because on a shared
machine a figure without it cannot be judged.

1. **One run alone**: a 100-step run (20 with ``--quick``), ``--repeats`` times; the median
   µs per step, and the fastest.
2. **A fleet**: 200 and 1,000 concurrent 20-step runs (50 and 200 with ``--quick``) started
   together, ``--repeats`` times each; the median steps/s (steps of all runs over the wall
   time from the first start to the last finish), and the slowest and fastest.

The pool is ``--pool-size`` connections (20 by default, the issue's setting); the store's
group-commit writers are its default (half the pool), unless ``--writers`` is given. The
script uses nothing but the public API, so it measures an older polyloop too (put its
``src`` first on ``PYTHONPATH``): old and new figures can come from one sitting. One sitting
takes about a minute on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polyloop
from polyloop.session import run
from polyloop.stores import PostgresRunStore
from polyloop.types import StopReason
from tools.bench._common import (
    NoopModel,
    Workload,
    argument_parser,
    print_table,
    results_envelope,
    write_json,
)
from tools.pg_cluster import PgCluster

NAME = "postgres_store"
FLEET_STEPS = 20


def _load() -> float:
    return os.getloadavg()[0]


async def _open(conninfo: str, pool_size: int, writers: int | None) -> PostgresRunStore:
    options: dict[str, Any] = {"pool_size": pool_size, "lease_seconds": 30.0}
    if writers is not None:
        if "writers" not in inspect.signature(PostgresRunStore.open).parameters:
            raise SystemExit("--writers: this polyloop's PostgresRunStore has no writers option")
        options["writers"] = writers
    return await PostgresRunStore.open(conninfo, **options)


async def _runs(store: PostgresRunStore, prefix: str, count: int, steps: int) -> float:
    """Run ``count`` runs of ``steps`` steps at once; the wall time in seconds."""
    workload = Workload.build()
    model = NoopModel(yield_to_loop=True)
    began = time.perf_counter()
    results = await asyncio.gather(
        *(
            run(workload.definition(store, model), workload.request(f"{prefix}-{i}", steps))
            for i in range(count)
        )
    )
    wall = time.perf_counter() - began
    stops = {r.stop_reason for r in results}
    assert stops == {StopReason.STEP_BUDGET}, f"a run stopped with {stops}"
    return wall


async def bench_single(store: PostgresRunStore, steps: int, repeats: int) -> dict[str, object]:
    load_before = _load()
    samples = [await _runs(store, f"single-{i}", 1, steps) / steps * 1e6 for i in range(repeats)]
    return {
        "measure": "one run alone",
        "runs": 1,
        "steps_per_run": steps,
        "us_per_step": statistics.median(samples),
        "us_per_step_best": min(samples),
        "samples": samples,
        "load_before": load_before,
        "load_after": _load(),
    }


async def bench_fleet(store: PostgresRunStore, runs: int, repeats: int) -> dict[str, object]:
    load_before = _load()
    rates = []
    for i in range(repeats):
        wall = await _runs(store, f"fleet-{runs}-{i}", runs, FLEET_STEPS)
        rates.append(runs * FLEET_STEPS / wall)
    return {
        "measure": f"{runs} concurrent runs",
        "runs": runs,
        "steps_per_run": FLEET_STEPS,
        "steps_per_s": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "samples": rates,
        "load_before": load_before,
        "load_after": _load(),
    }


async def main_async(args: Any) -> list[dict[str, object]]:
    cluster = None
    conninfo = args.conninfo
    if not conninfo:
        cluster = PgCluster(Path(tempfile.mkdtemp(prefix="polyloop-bench-pg-")))
        cluster.init()
        cluster.start()
        conninfo = cluster.conninfo()
    try:
        store = await _open(conninfo, args.pool_size, args.writers)
        try:
            await _runs(store, "warm-up", 50, 5)  # the pool's connections, prepared statements
            rows = [await bench_single(store, 20 if args.quick else 100, args.repeats)]
            for runs in (50, 200) if args.quick else (200, 1000):
                rows.append(await bench_fleet(store, runs, args.repeats))
        finally:
            await store.close()
    finally:
        if cluster is not None:
            cluster.destroy()
    for row in rows:
        row.update(pool_size=args.pool_size, writers=args.writers, polyloop=polyloop.__version__)
    print_table(
        f"PostgresRunStore, pool of {args.pool_size} (polyloop {polyloop.__version__}, "
        f"{os.cpu_count()} cores)",
        ["measure", "figure", "range", "load before/after"],
        [_cells(row) for row in rows],
    )
    return rows


def _cells(row: dict[str, object]) -> list[object]:
    load = f"{row['load_before']:.2f} / {row['load_after']:.2f}"
    if "us_per_step" in row:
        return [
            row["measure"],
            f"{row['us_per_step']:.0f} µs/step",
            f"best {row['us_per_step_best']:.0f}",
            load,
        ]
    return [
        row["measure"],
        f"{row['steps_per_s']:.0f} steps/s",
        f"{row['steps_per_s_min']:.0f}-{row['steps_per_s_max']:.0f}",
        load,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argument_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--conninfo", default="", help="an existing server (libpq string)")
    parser.add_argument("--repeats", type=int, default=3, help="sittings of each figure")
    parser.add_argument("--pool-size", type=int, default=20, help="the store's pool")
    parser.add_argument("--writers", type=int, default=None, help="group-commit writers")
    args = parser.parse_args(argv)
    rows = asyncio.run(main_async(args))
    if args.json_out:
        write_json(Path(args.json_out), results_envelope(NAME, argv, quick=args.quick, rows=rows))


if __name__ == "__main__":
    main()
