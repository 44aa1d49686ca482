"""Fork cost: time to fork a recorded run of N steps at its last step into a ``JsonlRunStore``.

``python -m tools.bench.fork [--quick] [--steps N] [--disk-dir DIR] [--json-out PATH]``

The run of ``tools/bench/replay.py`` (N steps of a ``SAFE`` lookup tool, then an answer) is
recorded once into a ``JsonlRunStore`` in a fresh directory under ``--disk-dir`` (default
``bench-results/tmp``, on the machine's disk; removed afterwards), then
``polyloop.session.fork`` copies its steps ``0 .. N-2`` to a new run id, timed by the wall
clock and ``time.process_time``. The copy writes each record through the store's typed
methods, so every copied intent is a durability barrier (an ``fsync``): the wall time is
mostly those.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polyloop.session import fork, run
from polyloop.stores import JsonlRunStore
from tools.bench._common import (
    add_disk_dir_argument,
    argument_parser,
    results_envelope,
    write_json,
)
from tools.bench.replay import agent

__all__ = ["main"]

NAME = "fork"
STEPS = 1000


async def _fork_seconds(directory: Path, steps: int) -> tuple[float, float, int]:
    definition, request = agent(steps)
    definition = dataclasses.replace(definition, store=JsonlRunStore(directory=directory))
    await run(definition, request)
    store = JsonlRunStore(directory=directory)
    wall, cpu = time.perf_counter(), time.process_time()
    origin = await fork(store, request.run_id, at=steps - 1, new_run_id="bench-fork")
    return time.perf_counter() - wall, time.process_time() - cpu, origin.records


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Time of forking a recorded run of N steps (JSONL).")
    add_disk_dir_argument(parser)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args(argv)
    steps = 20 if args.quick else args.steps
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="polyloop-bench-fork-", dir=args.disk_dir))
    try:
        wall, cpu, records = asyncio.run(_fork_seconds(directory, steps))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    row = {"steps": steps, "records": records, "wall_s": wall, "cpu_s": cpu}
    write_json(args.json_out, results_envelope(NAME, argv, quick=args.quick, rows=[row]))
    print(
        f"fork of a {steps}-step run at step {steps - 1}: {records} records copied, "
        f"wall {wall:.2f} s, CPU {cpu:.2f} s"
    )
    return row


if __name__ == "__main__":
    main()
