"""PostgreSQL store: steps/s of a fleet of concurrent runs and µs a step of one run alone.

``python -m tools.bench.postgres_store [--quick] [--conninfo DSN] [--repeats N] [--gc-stats]
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
   time from the first start to the last finish), and the slowest and fastest. Then the same
   1,000 (200) runs on ``VolatileRunStore``, as a control: the session's own ceiling on this
   machine at this moment, which no store can beat (on a busy machine it falls too). Each
   fleet figure also gives the client process's CPU per step (``getrusage``), which tells the
   client's share of the two cores from the server's, and its CPU over the wall time
   ("client busy"): the share of one core the client's one event-loop thread used. On a quiet
   machine, below about 95 % means the loop sat idle waiting for commits (design 0212, "fleet
   client CPU"); on a busy one, the other processes' share lowers it too.

3. ``--commit-modes`` (not in the default sitting): how 1,000 concurrent writers of 20 fenced
   records each (``--quick``: 100) commit, records/s: the store's group commit
   (``write_fenced``, each record fenced by its run's epoch), psycopg's pipeline mode (one
   fenced single-record statement per record; the statements a connection sends between two
   syncs form one implicit transaction) on 1 and on 20 connections, and one commit per record
   over a pool of 20 (the store before issue 24). Design 0212 chose from these figures.

``--one-fleet RUNS STEPS`` runs only the warm-up and one fleet of RUNS runs of STEPS steps,
and prints nothing: to count the client's instructions a step, which the machine's load does
not change (design 0212, "fleet client CPU"), run it under ``PYTHONHASHSEED=0 valgrind
--tool=callgrind --callgrind-out-file=/dev/null`` for two step counts and divide the
difference of the totals by the difference of the steps.

``--gc-off`` turns Python's cyclic garbage collector off after the warm-up: a diagnostic, to
show the collector's share of the client's CPU (a fleet's pending writes live for a batch's
commit, long enough to reach the old generations, which makes full collections more
frequent); never a setting to run a fleet with.

``--gc-stats`` (a diagnostic, design 0214's fourth pass) also counts, during each fleet, the
collector's passes per generation, their time per step and the objects they examined per step
(the sizes of the generations each pass collected: a count the machine's load does not move),
through ``gc.callbacks``; sizing the generations takes time of its own, outside the timed
passes, so the fleet's steps/s with it on are not the benchmark's figures.

The pool is ``--pool-size`` connections (20 by default, the issue's setting); the store's
group-commit writers are its default (half the pool), unless ``--writers`` is given. The
script uses nothing but the public API, so it measures an older polyloop too (put its
``src`` first on ``PYTHONPATH``): old and new figures can come from one sitting. One sitting
takes about a minute on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polyloop
from polyloop.session import run
from polyloop.stores import PostgresRunStore, VolatileRunStore
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


# One fenced record in one statement (the store's statement before issue 24, without its
# per-append upsert), for the commit-mode comparison.
_SINGLE = """
WITH l AS (SELECT 1 FROM polyloop_leases WHERE run_id = %(p1)s AND epoch = %(p3)s
      AND NOT released AND expires_at > clock_timestamp() FOR SHARE),
w AS (INSERT INTO polyloop_records (run_id, line) SELECT %(p1)s, %(p2)b FROM l RETURNING 1)
SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM w)
"""
_LINE = b'{"record": "intent", "padding": "' + b"x" * 200 + b'"}\n'


def _load() -> float:
    return os.getloadavg()[0]


async def _open(conninfo: str, pool_size: int, writers: int | None) -> PostgresRunStore:
    options: dict[str, Any] = {"pool_size": pool_size, "lease_seconds": 30.0}
    if writers is not None:
        if "writers" not in inspect.signature(PostgresRunStore.open).parameters:
            raise SystemExit("--writers: this polyloop's PostgresRunStore has no writers option")
        options["writers"] = writers
    return await PostgresRunStore.open(conninfo, **options)


async def _runs(
    store: PostgresRunStore | VolatileRunStore, prefix: str, count: int, steps: int
) -> float:
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


class _GcTally:
    """``--gc-stats``: the collector's passes, their time and the objects they examined, per
    generation, while installed in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.examined = [0, 0, 0]
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            self.examined[generation] += sum(len(gc.get_objects(g)) for g in range(generation + 1))
            self._began = time.perf_counter()
        else:
            self.seconds[generation] += time.perf_counter() - self._began
            self.passes[generation] += 1

    def row(self, steps: int) -> dict[str, object]:
        return {
            "gc_passes": list(self.passes),
            "gc_us_per_step": [t / steps * 1e6 for t in self.seconds],
            "gc_examined_per_step": [n / steps for n in self.examined],
        }


async def bench_fleet(
    store: PostgresRunStore | VolatileRunStore, runs: int, repeats: int, gc_stats: bool = False
) -> dict[str, object]:
    load_before = _load()
    rates = []
    walls = 0.0
    tally = _GcTally() if gc_stats else None
    if tally is not None:
        gc.callbacks.append(tally)
    cpu_before = _cpu_seconds()
    try:
        for i in range(repeats):
            wall = await _runs(store, f"fleet-{runs}-{i}", runs, FLEET_STEPS)
            walls += wall
            rates.append(runs * FLEET_STEPS / wall)
    finally:
        if tally is not None:
            gc.callbacks.remove(tally)
    cpu = _cpu_seconds() - cpu_before
    stats = {} if tally is None else tally.row(repeats * runs * FLEET_STEPS)
    return {
        **stats,
        "measure": f"{runs} concurrent runs"
        + (" (control: volatile)" if isinstance(store, VolatileRunStore) else ""),
        "runs": runs,
        "steps_per_run": FLEET_STEPS,
        "steps_per_s": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "samples": rates,
        "client_cpu_us_per_step": cpu / (repeats * runs * FLEET_STEPS) * 1e6,
        "client_busy": cpu / walls,
        "load_before": load_before,
        "load_after": _load(),
    }


def _cpu_seconds() -> float:
    """CPU time of this process (the client: the session, the store's client side, the
    driver), user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _timed_writers(writers: int, write: Any) -> float:
    began = time.perf_counter()
    await asyncio.gather(*(write(i) for i in range(writers)))
    return time.perf_counter() - began


async def bench_commit_modes(conninfo: str, writers: int) -> list[dict[str, object]]:
    """Records/s of ``writers`` concurrent writers of 20 fenced records, per commit mode."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from polyloop.types import Intent

    per = 20
    store = await PostgresRunStore.open(conninfo, pool_size=20, lease_seconds=300)
    rows: list[dict[str, object]] = []

    def row(mode: str, load_before: float, wall: float) -> None:
        rows.append(
            {
                "measure": mode,
                "writers": writers,
                "records_per_s": writers * per / wall,
                "load_before": load_before,
                "load_after": _load(),
            }
        )

    try:
        leases = [await store.acquire_lease(f"modes-{i}") for i in range(writers)]

        async def grouped(i: int) -> None:
            for _ in range(per):
                await store.write_fenced(leases[i], _LINE, Intent)

        load = _load()
        row("group commit (the store, pool 20)", load, await _timed_writers(writers, grouped))
        for count in (1, 20):
            conns = [
                await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                for _ in range(count)
            ]
            try:
                async with contextlib.AsyncExitStack() as stack:
                    for conn in conns:
                        await stack.enter_async_context(conn.pipeline())

                    async def piped(i: int, conns: list[Any] = conns) -> None:
                        conn = conns[i % len(conns)]
                        for _ in range(per):
                            params = {"p1": leases[i].run_id, "p2": _LINE, "p3": leases[i].epoch}
                            cursor = await conn.execute(_SINGLE, params)
                            assert await cursor.fetchone() == (1, 1)

                    load = _load()
                    wall = await _timed_writers(writers, piped)
                    row(f"pipeline mode, {count} connection(s)", load, wall)
            finally:
                for conn in conns:
                    await conn.close()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            conninfo, min_size=20, max_size=20, kwargs={"autocommit": True}, open=False
        )
        await pool.open(wait=True)
        try:

            async def one_each(i: int) -> None:
                for _ in range(per):
                    async with pool.connection() as conn:
                        params = {"p1": leases[i].run_id, "p2": _LINE, "p3": leases[i].epoch}
                        cursor = await conn.execute(_SINGLE, params, prepare=True)
                        await cursor.fetchone()

            load = _load()
            row("one commit per record, pool 20", load, await _timed_writers(writers, one_each))
        finally:
            await pool.close()
    finally:
        await store.close()
    return rows


async def main_async(args: Any) -> list[dict[str, object]]:
    cluster = None
    conninfo = args.conninfo
    if not conninfo:
        cluster = PgCluster(Path(tempfile.mkdtemp(prefix="polyloop-bench-pg-")))
        cluster.init()
        cluster.start()
        conninfo = cluster.conninfo()
    if args.one_fleet:
        try:
            await _one_fleet(conninfo, *args.one_fleet)
        finally:
            if cluster is not None:
                cluster.destroy()
        return []
    try:
        store = await _open(conninfo, args.pool_size, args.writers)
        try:
            await _runs(store, "warm-up", 50, 5)  # the pool's connections, prepared statements
            if args.gc_off:
                gc.disable()
            rows = [await bench_single(store, 20 if args.quick else 100, args.repeats)]
            for runs in (50, 200) if args.quick else (200, 1000):
                rows.append(await bench_fleet(store, runs, args.repeats, args.gc_stats))
        finally:
            await store.close()
        rows.append(await bench_fleet(VolatileRunStore(), runs, args.repeats, args.gc_stats))
        modes = (
            await bench_commit_modes(conninfo, 100 if args.quick else 1000)
            if args.commit_modes
            else []
        )
    finally:
        if cluster is not None:
            cluster.destroy()
    for row in rows:
        row.update(
            pool_size=args.pool_size,
            writers=args.writers,
            gc_off=args.gc_off,
            gc_stats=args.gc_stats,
            polyloop=polyloop.__version__,
        )
    print_table(
        f"PostgresRunStore, pool of {args.pool_size} (polyloop {polyloop.__version__}, "
        f"{os.cpu_count()} cores{', cyclic GC off' if args.gc_off else ''})",
        ["measure", "figure", "range", "client CPU µs/step", "client busy", "load before/after"],
        [_cells(row) for row in rows],
    )
    if args.gc_stats:
        print_table(
            "the collector during each fleet (--gc-stats): passes, µs and objects examined a step",
            ["measure", "gen 0", "gen 1", "gen 2", "all, µs / objects a step"],
            [_gc_cells(row) for row in rows if "gc_passes" in row],
        )
    if modes:
        print_table(
            "commit modes: concurrent writers of 20 fenced records each",
            ["mode", "writers", "records/s", "load before/after"],
            [
                [
                    m["measure"],
                    m["writers"],
                    f"{m['records_per_s']:.0f}",
                    f"{m['load_before']:.2f} / {m['load_after']:.2f}",
                ]
                for m in modes
            ],
        )
    return rows + modes


async def _one_fleet(conninfo: str, runs: int, steps: int) -> None:
    """``--one-fleet``: the warm-up, then one fleet, nothing printed; leases of 600 s, so
    that a client slowed down by an instruction counter keeps them."""
    store = await PostgresRunStore.open(conninfo, pool_size=20, lease_seconds=600.0)
    try:
        await _runs(store, "warm-up", 50, 5)
        await _runs(store, "fleet", runs, steps)
    finally:
        await store.close()


def _gc_cells(row: dict[str, Any]) -> list[object]:
    passes, us, examined = row["gc_passes"], row["gc_us_per_step"], row["gc_examined_per_step"]
    return [
        row["measure"],
        *(f"{passes[g]} ({us[g]:.1f} µs, {examined[g]:.0f})" for g in range(3)),
        f"{sum(us):.1f} µs / {sum(examined):.0f}",
    ]


def _cells(row: dict[str, object]) -> list[object]:
    load = f"{row['load_before']:.2f} / {row['load_after']:.2f}"
    if "us_per_step" in row:
        return [
            row["measure"],
            f"{row['us_per_step']:.0f} µs/step",
            f"best {row['us_per_step_best']:.0f}",
            "",
            "",
            load,
        ]
    return [
        row["measure"],
        f"{row['steps_per_s']:.0f} steps/s",
        f"{row['steps_per_s_min']:.0f}-{row['steps_per_s_max']:.0f}",
        f"{row['client_cpu_us_per_step']:.0f}",
        f"{row['client_busy']:.0%}",
        load,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argument_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--conninfo", default="", help="an existing server (libpq string)")
    parser.add_argument("--repeats", type=int, default=3, help="sittings of each figure")
    parser.add_argument("--pool-size", type=int, default=20, help="the store's pool")
    parser.add_argument("--writers", type=int, default=None, help="group-commit writers")
    parser.add_argument("--gc-off", action="store_true", help="diagnostic: no cyclic GC")
    parser.add_argument(
        "--gc-stats", action="store_true", help="diagnostic: the collector's passes per fleet"
    )
    parser.add_argument(
        "--commit-modes", action="store_true", help="also compare group commit, pipeline mode"
    )
    parser.add_argument(
        "--one-fleet",
        type=int,
        nargs=2,
        metavar=("RUNS", "STEPS"),
        help="only one fleet, nothing printed (to count instructions under callgrind)",
    )
    args = parser.parse_args(argv)
    rows = asyncio.run(main_async(args))
    if args.json_out:
        write_json(Path(args.json_out), results_envelope(NAME, argv, quick=args.quick, rows=rows))


if __name__ == "__main__":
    main()
