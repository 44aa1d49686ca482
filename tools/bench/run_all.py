"""Every benchmark, one after the other (``make bench``).

``python -m tools.bench.run_all [--quick] [--json-out PATH] [--disk-dir DIR]``

Writes one JSON file holding the machine description and each benchmark's results under its
name (``per_step``, ``many_runs``, ``resume_cost``, ``prompt_assembly``); each benchmark's own
file goes next to it (``<dir of PATH>/<name>.json``). Default PATH: ``bench-results/all.json``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tools.bench import many_runs, per_step, prompt_assembly, resume_cost
from tools.bench._common import (
    RESULTS_DIR,
    add_disk_dir_argument,
    argument_parser,
    command_line,
    machine_info,
    write_json,
)

NAME = "run_all"
BENCHMARKS: tuple[tuple[str, Callable[[Sequence[str]], dict[str, Any]], bool], ...] = (
    # (name, main, takes --disk-dir)
    ("per_step", per_step.main, True),
    ("many_runs", many_runs.main, False),
    ("resume_cost", resume_cost.main, True),
    ("prompt_assembly", prompt_assembly.main, False),
)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Run every benchmark.")
    parser.set_defaults(json_out=RESULTS_DIR / "all.json")
    add_disk_dir_argument(parser)
    args = parser.parse_args(argv)
    combined: dict[str, Any] = {
        "command": command_line(NAME, sys.argv[1:] if argv is None else argv),
        "quick": args.quick,
        "machine": machine_info(args.disk_dir),
    }
    for name, bench_main, takes_disk_dir in BENCHMARKS:
        bench_argv = ["--json-out", str(args.json_out.parent / f"{name}.json")]
        if args.quick:
            bench_argv.append("--quick")
        if takes_disk_dir:
            bench_argv += ["--disk-dir", str(args.disk_dir)]
        started = time.perf_counter()
        print(f"\n=== {name} ===")
        combined[name] = bench_main(bench_argv)
        print(f"({name} took {time.perf_counter() - started:.1f} s)")
    write_json(args.json_out, combined)
    print(f"\nall results written to {args.json_out}")
    return combined


if __name__ == "__main__":
    main()
