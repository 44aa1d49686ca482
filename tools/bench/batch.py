"""``polyloop.batch`` against a hand-written ``asyncio.gather`` + semaphore, and its chaos mode.

``python -m tools.bench.batch [--quick] [--json-out PATH] [--postgres] [--ray] [--stream N]
[--chaos]``

* **throughput** (always; ``--postgres`` adds a throwaway PostgreSQL cluster): the same N
  runs of the scripted agent of ``tests/_batch_agents.py`` (two steps: a ``never`` tool call,
  then an answer; the model yields to the loop once per call), C at a time, once through
  ``run_batch`` and once through ``gather`` over ``run_or_resume`` under a semaphore, in
  alternation (each first every other repeat), fresh run ids each time; the median of the
  repeats. ``batch/gather`` is the
  ratio of their runs per second.
* **--ray** (inside ``unshare -n``: it starts a loopback cluster): the engine's per-run
  overhead, items one at a time (``concurrency=1``) through ``run_batch(engine=RayActors())``
  against the one-loop engine, on one ``JsonlRunStore``: ``(wall_ray - wall_loop) / N``; then
  both again, every item now read back (no model call), which leaves the engine's round trip.
* **--stream N**: N items from a generator through ``run_batch`` in a child process, peak RSS
  before and after: on ``VolatileRunStore`` (which keeps every run's log in the process,
  packing the logs of runs that ended long ago, design 0244: the lines' size, the packed
  runs and the batch's CPU are reported beside the growth) and on one that drops a run's log
  when the run's call ends (the batch's own memory).
* **--chaos**: ``tools/batch_chaos.kill_storm`` with 100 SIGKILLs and 2,000 items on a JSONL
  directory and on PostgreSQL (the figures in ``research-wiki/reference/reliability.md``).

Each section prints the load average before it (``os.getloadavg``): the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.bench._common import (
    REPO_ROOT,
    argument_parser,
    current_rss_kib,
    peak_rss_kib,
    print_table,
    results_envelope,
    write_json,
)

NAME = "batch"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _agent(store: Any) -> Any:
    sys.path.insert(0, str(REPO_ROOT))
    from tests._batch_agents import make_agent

    return make_agent(store)


async def _gather(agent: Any, prefix: str, runs: int, concurrency: int) -> float:
    from polyloop.session import run_or_resume

    definition = agent.definition()
    semaphore = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with semaphore:
            await run_or_resume(definition, agent.request(f"k{index}", f"{prefix}-{index}"))

    began = time.perf_counter()
    await asyncio.gather(*(one(index) for index in range(runs)))
    return time.perf_counter() - began


async def _batch(agent: Any, prefix: str, runs: int, concurrency: int, **extra: Any) -> float:
    from polyloop.batch import run_batch

    began = time.perf_counter()
    report = await run_batch(
        agent,
        (f"k{index}" for index in range(runs)),
        batch_id=prefix,
        key=lambda item: item,
        concurrency=concurrency,
        progress_stream=None,
        **extra,
    )
    assert report.totals.by_stop_reason == {"final_answer": runs}, report.totals
    return time.perf_counter() - began


async def throughput(
    store: Any, label: str, runs: int, concurrency: int, repeats: int
) -> dict[str, Any]:
    """Median runs/s of ``run_batch`` and of a hand-written gather over the same runs."""
    agent = _agent(store)
    load = _load()
    walls: dict[str, list[float]] = {"batch": [], "gather": []}
    for repeat in range(repeats):
        # In alternation, each first every other time: the store grows with every repeat.
        order = ("gather", "batch") if repeat % 2 == 0 else ("batch", "gather")
        for which in order:
            measure = _gather if which == "gather" else _batch
            walls[which].append(await measure(agent, f"{which[0]}{repeat}", runs, concurrency))
    gather, batch = (statistics.median(walls[k]) for k in ("gather", "batch"))
    return {
        "store": label,
        "runs": runs,
        "concurrency": concurrency,
        "gather_runs_per_s": round(runs / gather, 1),
        "batch_runs_per_s": round(runs / batch, 1),
        "batch_over_gather": round(gather / batch, 3),
        "load_average": load,
    }


def _postgres_rows(runs: int, concurrency: int, repeats: int) -> list[dict[str, Any]]:
    from tools.pg_cluster import PgCluster, binaries_available

    if not binaries_available():
        print("no PostgreSQL binaries: --postgres skipped", file=sys.stderr)
        return []
    cluster = PgCluster(Path(tempfile.mkdtemp(prefix="bench-batch-pg-")))
    try:
        cluster.init()
        cluster.start()

        async def measure() -> dict[str, Any]:
            from polyloop.stores import PostgresRunStore

            store = await PostgresRunStore.open(cluster.conninfo(), pool_size=10)
            try:
                return await throughput(store, "postgres", runs, concurrency, repeats)
            finally:
                await store.close()

        return [asyncio.run(measure())]
    finally:
        cluster.destroy()


def ray_overhead(items: int) -> dict[str, Any]:
    """Per-item overhead of ``RayActors`` over the one-loop engine, one item at a time."""
    sys.path.insert(0, str(REPO_ROOT))
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported (loopback)
    import ray
    from tests._batch_agents import JsonlItemFactory

    from polyloop.batch import run_batch
    from polyloop.ray import RayActors
    from tools.ray_cluster import LoopbackCluster

    work = Path(tempfile.mkdtemp(prefix="bench-batch-ray-"))
    factory = JsonlItemFactory(str(work / "runs"), str(work / "ledger.txt"))
    load = _load()

    async def timed(batch_id: str, engine: Any) -> float:
        began = time.perf_counter()
        await run_batch(
            factory, [f"k{i}" for i in range(items)], batch_id=batch_id, key=lambda i: i,
            concurrency=1, progress_stream=None, engine=engine,
        )  # fmt: skip
        return time.perf_counter() - began

    with LoopbackCluster(workers=1, cpus_per_worker=1):
        engine = RayActors(actors=1, runs_per_actor=1)
        asyncio.run(timed("warm", engine))  # the actor's process and imports, once
        on_ray = asyncio.run(timed("ray", engine))
        on_loop = asyncio.run(timed("loop", None))
        # The same batches again: every item is read back, so what is left is the engine's.
        ray_again = asyncio.run(timed("ray", engine))
        loop_again = asyncio.run(timed("loop", None))
        ray.shutdown()
    per_item = {
        "loop_ms_per_item": on_loop,
        "ray_ms_per_item": on_ray,
        "ray_overhead_ms_per_item": on_ray - on_loop,
        "loop_read_back_ms_per_item": loop_again,
        "ray_read_back_ms_per_item": ray_again,
    }
    return {
        "items": items,
        **{name: round(1000 * seconds / items, 2) for name, seconds in per_item.items()},
        "load_average": load,
    }


def _forgetting_store() -> Any:
    """A ``VolatileRunStore`` that drops a run's log when its lease ends (the run's call is
    over): the batch's own memory, without the logs a real store keeps outside the process."""
    from polyloop.stores import VolatileRunStore

    class Forgetting(VolatileRunStore):
        async def end_lease(self, lease: Any) -> None:
            await super().end_lease(lease)
            self._lines.pop(lease.run_id, None)
            self._ended_records -= self._ended.pop(lease.run_id, 0)  # nothing left to pack

    return Forgetting()


async def _stream_child(items: int, forgetting: bool) -> dict[str, Any]:
    from polyloop.batch import run_batch
    from polyloop.stores import VolatileRunStore

    store = _forgetting_store() if forgetting else VolatileRunStore()
    agent = _agent(store)
    before = current_rss_kib()
    cpu = time.process_time()
    report = await run_batch(
        agent, (f"k{i}" for i in range(items)), batch_id="s", key=lambda i: i,
        concurrency=64, progress_stream=None,
    )  # fmt: skip
    cpu = time.process_time() - cpu
    peak = peak_rss_kib()
    packed = sum(1 for lines in store._lines.values() if type(lines[0]).__name__ == "_Packed")
    log_bytes = sum(len(line) for run_id in store._lines for line in store._encoded(run_id))
    return {
        "store": "volatile, forgetting finished logs" if forgetting else "volatile",
        "items": items,
        "done": report.totals.items,
        "rss_before_mib": round(before / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "growth_mib": round((peak - before) / 1024, 1),
        "store_log_mib": round(log_bytes / 2**20, 1),
        "packed_runs": packed,
        "batch_cpu_s": round(cpu, 1),
        "load_average": _load(),
    }


def stream(items: int) -> list[dict[str, Any]]:
    """``_stream_child`` in fresh processes (peak RSS is a high-water mark): on the volatile
    store, which keeps every log in the process, and on one that forgets finished logs."""
    rows = []
    for flag in ("--stream-child", "--stream-forgetting-child"):
        done = subprocess.run(
            [sys.executable, "-m", "tools.bench.batch", flag, str(items)],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=3600,
        )  # fmt: skip
        rows.append(dict(json.loads(done.stdout.splitlines()[-1])))
    return rows


def chaos(items: int, kills: int, postgres: bool) -> list[dict[str, Any]]:
    """The kill storm on a JSONL directory (and PostgreSQL): what it did and found."""
    from tools.batch_chaos import kill_storm

    rows = []
    work = Path(tempfile.mkdtemp(prefix="bench-batch-chaos-"))
    places = [("jsonl", str(work / "runs"))]
    cluster = None
    if postgres:
        from tools.bench.postgres_listing import url_of
        from tools.pg_cluster import PgCluster

        cluster = PgCluster(Path(tempfile.mkdtemp(prefix="bench-batch-chaos-pg-")))
        cluster.init()
        cluster.start()
        places.append(("postgres", url_of(cluster.conninfo())))
    try:
        for label, place in places:
            load = _load()
            storm = kill_storm(place, work / label, items=items, kills=kills, seed=7)
            rows.append({"store": label, **vars(storm), "load_average": load})
    finally:
        if cluster is not None:
            cluster.destroy()
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "polyloop.batch against gather, on Ray, streaming, chaos.")
    parser.add_argument("--postgres", action="store_true", help="also on a throwaway PostgreSQL")
    parser.add_argument("--ray", action="store_true", help="the Ray engine's per-run overhead")
    parser.add_argument("--stream", type=int, help="N items through a child process (RSS)")
    parser.add_argument("--chaos", action="store_true", help="100 kills, 2,000 items")
    parser.add_argument("--stream-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stream-forgetting-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stream_child is not None:
        print(json.dumps(asyncio.run(_stream_child(args.stream_child, False))))
        return {}
    if args.stream_forgetting_child is not None:
        print(json.dumps(asyncio.run(_stream_child(args.stream_forgetting_child, True))))
        return {}
    runs, repeats = (200, 1) if args.quick else (2000, 4)
    from polyloop.stores import VolatileRunStore

    rows = [asyncio.run(throughput(VolatileRunStore(), "volatile", runs, 64, repeats))]
    if args.postgres:
        rows += _postgres_rows(runs, 64, repeats)
    print_table(
        f"{runs} two-step runs, 64 at a time: run_batch vs asyncio.gather + semaphore",
        ["store", "gather runs/s", "batch runs/s", "batch/gather", "load avg"],
        [[r["store"], r["gather_runs_per_s"], r["batch_runs_per_s"], r["batch_over_gather"],
          r["load_average"]] for r in rows],
    )  # fmt: skip
    extra: dict[str, Any] = {}
    if args.ray:
        extra["ray"] = ray_overhead(20 if args.quick else 100)
        print("ray:", extra["ray"])
    if args.stream:
        extra["stream"] = stream(args.stream)
        print("stream:", extra["stream"])
    if args.chaos:
        extra["chaos"] = chaos(2000, 100, args.postgres)
        for row in extra["chaos"]:
            print("chaos:", row)
    results = results_envelope(NAME, argv, quick=args.quick, rows=rows, **extra)
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
