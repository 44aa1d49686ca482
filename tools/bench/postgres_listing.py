"""``python -m polyloop ls postgres://...`` of 1,000 runs: wall and CPU seconds of the command.

``python -m tools.bench.postgres_listing [--quick] [--conninfo DSN] [--runs N] [--repeats N]
[--json-out PATH]``

Issue 24's listing target (``ls`` of a server holding 1,000 runs in under a second) is a
figure of this benchmark, not an assertion of a test (issue 34: on a machine running more
than it has cores for, a wall time measures the other work; the test
``tests/integration/test_postgres_listing.py`` counts the listing's statements instead).

Without ``--conninfo`` a throwaway server is started from the system binaries
(``tools/pg_cluster.py``) and removed at the end; with it, the runs are written to that
server's database (run ids ``listing-0`` ...: use an empty database). ``--runs`` finished
one-step runs (1,000; 50 with ``--quick``) are written through the public API (``run()`` of
the benchmarks' no-op workload on a ``PostgresRunStore``). Then the command a user types,
``python -m polyloop ls URL``, runs as a new process (interpreter, imports, connection, the
pages, every run's view) with polyloop's modules compiled once, as an installed package has
them (a first, unmeasured run compiles them into a cache of the benchmark's own), ``--repeats``
times (5; 2 with ``--quick``): the median and the best wall time (``perf_counter`` around the
process) and CPU time (the process's user + system, ``getrusage(RUSAGE_CHILDREN)``), with the
load average (1 min) read just before and just after, because on a shared machine a figure
without it cannot be judged.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polyloop
from polyloop.stores import PostgresRunStore
from tools.bench._common import argument_parser, print_table, results_envelope, write_json
from tools.bench.postgres_store import _runs
from tools.pg_cluster import PgCluster

NAME = "postgres_listing"
ROOT = Path(__file__).resolve().parents[2]


def url_of(conninfo: str) -> str:
    """A keyword conninfo (``host=... port=...``) as the URL a user passes to ``ls``."""
    if "://" in conninfo:
        return conninfo
    words = dict(word.split("=", 1) for word in conninfo.split())
    return (
        f"postgresql://{words.get('user', 'postgres')}@{words.get('host', '127.0.0.1')}:"
        f"{words.get('port', '5432')}/{words.get('dbname', 'postgres')}"
    )


async def write_runs(conninfo: str, runs: int) -> None:
    """``runs`` finished one-step runs, through the store's public write path."""
    store = await PostgresRunStore.open(conninfo, pool_size=20)
    try:
        await _runs(store, "listing", runs, 1)
    finally:
        await store.close()


def time_listing(url: str, runs: int, repeats: int, cache: Path) -> dict[str, Any]:
    """``python -m polyloop ls url``: one compiling run, then ``repeats`` measured ones."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    command = [sys.executable, "-m", "polyloop", "ls", url]
    subprocess.run(command, capture_output=True, timeout=300, cwd=ROOT, env=env, check=True)
    load_before = os.getloadavg()[0]
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=True
        )
        walls.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        listed = len(done.stdout.splitlines()) - 1  # a header line, then a run a line
        if listed != runs:
            raise SystemExit(f"ls listed {listed} runs, not the {runs} written")
    return {
        "measure": f"ls postgres://... of {runs:,} runs",
        "runs": runs,
        "repeats": repeats,
        "wall_s": statistics.median(walls),
        "wall_s_best": min(walls),
        "cpu_s": statistics.median(cpus),
        "cpu_s_best": min(cpus),
        "walls": walls,
        "cpus": cpus,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "polyloop": polyloop.__version__,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--conninfo", default="", help="an existing server (libpq string)")
    parser.add_argument("--runs", type=int, default=None, help="runs to list (default 1,000)")
    parser.add_argument("--repeats", type=int, default=None, help="measured ls commands")
    args = parser.parse_args(argv)
    runs = args.runs or (50 if args.quick else 1000)
    repeats = args.repeats or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="polyloop-bench-listing-") as scratch:
        cluster = None
        conninfo = args.conninfo
        if not conninfo:
            cluster = PgCluster(Path(tempfile.mkdtemp(prefix="polyloop-bench-pg-")))
            cluster.init()
            cluster.start()
            conninfo = cluster.conninfo()
        try:
            asyncio.run(write_runs(conninfo, runs))
            row = time_listing(url_of(conninfo), runs, repeats, Path(scratch) / "pycache")
        finally:
            if cluster is not None:
                cluster.destroy()
    print_table(
        f"python -m polyloop ls (polyloop {polyloop.__version__}, {os.cpu_count()} cores)",
        ["measure", "wall s (best)", "CPU s (best)", "load before/after"],
        [
            [
                row["measure"],
                f"{row['wall_s']:.2f} ({row['wall_s_best']:.2f})",
                f"{row['cpu_s']:.2f} ({row['cpu_s_best']:.2f})",
                f"{row['load_before']:.2f} / {row['load_after']:.2f}",
            ]
        ],
    )
    document = results_envelope(NAME, argv, quick=args.quick, rows=[row])
    if args.json_out:
        write_json(Path(args.json_out), document)
    return document


if __name__ == "__main__":
    main()
