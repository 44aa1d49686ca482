"""PostgreSQL store: driver choice, write latencies, per-step overhead, many concurrent runs.

``python -m tools.bench.postgres_store [--quick] [--conninfo DSN] [--json-out PATH]``

Without ``--conninfo`` a throwaway server is started from the system binaries
(``tools/pg_cluster.py``) and stopped at the end. Four measurements, in one sitting:

1. **Drivers** on the store's real statements (``polyloop.stores._postgres``'s SQL): psycopg 3
   with its pool and asyncpg with its pool, each executing the fenced intent (barrier), the
   fenced step (non-barrier; since issue 24 the same statement, both committing with
   ``synchronous_commit`` on) and the read of a 20-record log, sequentially, ``n`` times; p50
   and p90 in µs.
2. **Barrier / non-barrier latency** of ``PostgresRunStore`` itself (p50, p90 over ``n``).
3. **Per-step overhead** of a whole ``run()`` of N steps (median of 3) for the volatile store,
   the JSONL store (``--disk-dir``) and the Postgres store.
4. **Throughput** of R concurrent 20-step runs on one server, with the pool size, in steps/s.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from polyloop.session import run
from polyloop.stores import JsonlRunStore, PostgresRunStore, VolatileRunStore
from polyloop.stores._postgres import STATEMENTS, to_psycopg  # what the store really sends
from polyloop.types import StopReason
from tools.bench._common import (
    NoopModel,
    Workload,
    add_disk_dir_argument,
    argument_parser,
    print_table,
    results_envelope,
    write_json,
)
from tools.pg_cluster import PgCluster

NAME = "postgres_store"
LINE = b'{"record": "intent", "schema_version": "1.0", "padding": "' + b"x" * 120 + b'"}\n'


def _percentiles(samples: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] * 1e6, ordered[int(len(ordered) * 0.9)] * 1e6


async def _timed(n: int, once: Callable[[int], Awaitable[object]]) -> tuple[float, float]:
    samples = []
    for i in range(n):
        began = time.perf_counter()
        await once(i)
        samples.append(time.perf_counter() - began)
    return _percentiles(samples)


async def _lease_row(conninfo: str, run_id: str) -> int:
    store = await PostgresRunStore.open(conninfo, pool_size=1, lease_seconds=3600)
    try:
        lease = await store.acquire_lease(run_id)
        for _ in range(20):
            await lease.write_intent(_intent(run_id))
        return lease.epoch
    finally:
        await store.close()


def _intent(run_id: str) -> Any:
    from polyloop.types import Intent, IntentKind, ReplayPolicy

    return Intent(
        run_id=run_id,
        kind=IntentKind.MODEL_CALL,
        call_index=0,
        result_id="m0",
        replay_policy=ReplayPolicy.SAFE,
    )


async def bench_drivers(conninfo: str, n: int) -> list[dict[str, object]]:
    import asyncpg
    from psycopg_pool import AsyncConnectionPool

    rows: list[dict[str, object]] = []
    epoch = await _lease_row(conninfo, "drivers")
    statements = {
        "intent (barrier)": STATEMENTS["fenced_barrier"],
        "step (non-barrier)": STATEMENTS["fenced_non_barrier"],
    }

    psy: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await psy.open(wait=True)
    try:
        for label, text in statements.items():
            query = to_psycopg(text)

            async def psy_once(_: int, query: str = query) -> None:
                async with psy.connection() as conn:
                    cur = await conn.execute(query, {"p1": "drivers", "p2": LINE, "p3": epoch})
                    await cur.fetchone()

            p50, p90 = await _timed(n, psy_once)
            rows.append(
                {"driver": "psycopg 3 + pool", "statement": label, "p50_us": p50, "p90_us": p90}
            )

        async def psy_read(_: int) -> None:
            async with psy.connection() as conn:
                cur = await conn.execute(to_psycopg(STATEMENTS["read_log"]), {"p1": "drivers"})
                await cur.fetchall()

        p50, p90 = await _timed(n, psy_read)
        rows.append(
            {"driver": "psycopg 3 + pool", "statement": "read log", "p50_us": p50, "p90_us": p90}
        )
    finally:
        await psy.close()

    dsn = conninfo
    apg = await asyncpg.create_pool(dsn=_asyncpg_dsn(dsn), min_size=2, max_size=2)
    try:
        for label, text in statements.items():

            async def apg_once(_: int, text: str = text) -> None:
                async with apg.acquire() as conn:
                    await conn.fetchrow(text, "drivers", LINE, epoch)

            p50, p90 = await _timed(n, apg_once)
            rows.append(
                {"driver": "asyncpg + pool", "statement": label, "p50_us": p50, "p90_us": p90}
            )

        async def apg_read(_: int) -> None:
            async with apg.acquire() as conn:
                await conn.fetch(STATEMENTS["read_log"], "drivers")

        p50, p90 = await _timed(n, apg_read)
        rows.append(
            {"driver": "asyncpg + pool", "statement": "read log", "p50_us": p50, "p90_us": p90}
        )
    finally:
        await apg.close()
    return rows


def _asyncpg_dsn(conninfo: str) -> str:
    parts = dict(item.split("=", 1) for item in conninfo.split())
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


async def bench_store_writes(conninfo: str, n: int) -> list[dict[str, object]]:
    from polyloop.types import ModelCallResult, ModelReply

    store = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=3600)
    try:
        lease = await store.acquire_lease("writes")

        async def barrier(_: int) -> None:
            await lease.write_intent(_intent("writes"))

        async def non_barrier(i: int) -> None:
            await lease.write_model_call_result(
                ModelCallResult(
                    run_id="writes",
                    result_id="m0",
                    reply=ModelReply(call_id=None, content="x" * 100, thinking=""),
                    failure=None,
                )
            )

        rows = []
        for label, once in (
            ("barrier (intent)", barrier),
            ("non-barrier (model result)", non_barrier),
        ):
            p50, p90 = await _timed(n, once)
            rows.append({"write": label, "p50_us": p50, "p90_us": p90})
        await lease.release()
        return rows
    finally:
        await store.close()


def _scratch_dir(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="postgres-bench-", dir=parent))


async def bench_per_step(conninfo: str, disk_dir: Path, steps: int) -> list[dict[str, object]]:
    workload = Workload.build()
    disk_dir = _scratch_dir(disk_dir)
    rows = []
    pg = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=60)
    try:
        makers: list[tuple[str, Callable[[int], Any]]] = [
            ("volatile", lambda i: VolatileRunStore()),
            ("jsonl (disk)", lambda i: JsonlRunStore(directory=disk_dir / f"per-step-{i}")),
            ("postgres", lambda i: pg),
        ]
        for label, make in makers:
            samples = []
            for i in range(3):
                store = make(i)
                began = time.perf_counter()
                result = await run(
                    workload.definition(store),
                    workload.request(f"step-{label.split()[0]}-{i}", steps),
                )
                samples.append(time.perf_counter() - began)
                assert result.stop_reason is StopReason.STEP_BUDGET
            rows.append(
                {
                    "store": label,
                    "steps": steps,
                    "us_per_step": statistics.median(samples) / steps * 1e6,
                }
            )
    finally:
        await pg.close()
        shutil.rmtree(disk_dir, ignore_errors=True)
    return rows


async def bench_many(conninfo: str, runs: int, pool_size: int) -> dict[str, object]:
    workload = Workload.build()
    store = await PostgresRunStore.open(conninfo, pool_size=pool_size, lease_seconds=120)
    try:
        model = NoopModel(yield_to_loop=True)
        began = time.perf_counter()
        results = await asyncio.gather(
            *(
                run(
                    workload.definition(store, model), workload.request(f"many-{pool_size}-{i}", 20)
                )
                for i in range(runs)
            )
        )
        wall = time.perf_counter() - began
    finally:
        await store.close()
    assert all(r.stop_reason is StopReason.STEP_BUDGET for r in results)
    return {
        "runs": runs,
        "steps_per_run": 20,
        "pool_size": pool_size,
        "wall_s": wall,
        "steps_per_s": runs * 20 / wall,
        "runs_per_s": runs / wall,
    }


async def main_async(args: Any) -> dict[str, object]:
    quick = args.quick
    cluster = None
    conninfo = args.conninfo
    base = Path(tempfile.mkdtemp(prefix="polyloop-bench-pg-"))
    if not conninfo:
        cluster = PgCluster(base)
        cluster.init()
        cluster.start()
        conninfo = cluster.conninfo()
    try:
        n = 50 if quick else 500
        drivers = await bench_drivers(conninfo, n)
        writes = await bench_store_writes(conninfo, n)
        per_step = await bench_per_step(conninfo, Path(args.disk_dir), 10 if quick else 100)
        many = [
            await bench_many(conninfo, 50 if quick else 1000, size)
            for size in ((4,) if quick else (10, 20))
        ]
    finally:
        if cluster is not None:
            cluster.destroy()
    print_table(
        "drivers on the store's statements",
        ["driver", "statement", "p50 µs", "p90 µs"],
        [
            [r["driver"], r["statement"], f"{r['p50_us']:.0f}", f"{r['p90_us']:.0f}"]
            for r in drivers
        ],
    )
    print_table(
        "PostgresRunStore writes",
        ["write", "p50 µs", "p90 µs"],
        [[r["write"], f"{r['p50_us']:.0f}", f"{r['p90_us']:.0f}"] for r in writes],
    )
    print_table(
        "per-step overhead",
        ["store", "steps", "µs/step"],
        [[r["store"], r["steps"], f"{r['us_per_step']:.0f}"] for r in per_step],
    )
    print_table(
        "concurrent 20-step runs on one server",
        ["runs", "pool", "wall s", "steps/s", "runs/s"],
        [
            [
                m["runs"],
                m["pool_size"],
                f"{m['wall_s']:.1f}",
                f"{m['steps_per_s']:.0f}",
                f"{m['runs_per_s']:.1f}",
            ]
            for m in many
        ],
    )
    return {"drivers": drivers, "writes": writes, "per_step": per_step, "many": many}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argument_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--conninfo", default="", help="an existing server (libpq string)")
    add_disk_dir_argument(parser)
    args = parser.parse_args(argv)
    data = asyncio.run(main_async(args))
    if args.json_out:
        rows = [*data["drivers"], *data["writes"], *data["per_step"], *data["many"]]
        write_json(
            Path(args.json_out),
            results_envelope(NAME, argv, quick=args.quick, rows=rows, disk_dir=args.disk_dir),
        )


if __name__ == "__main__":
    main()
