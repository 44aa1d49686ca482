"""Time from a worker node's death to its runs resuming on a survivor.

``python -m tools.bench.ray_failover [--quick] [--json-out PATH] [--runs N]``

Starts a loopback cluster (a head and two one-CPU worker nodes, fast health checks as in Ray's
own tests: ``health_check_period_ms=100``, ``health_check_failure_threshold=10``), runs the
cluster fault batch of ``tools.ray_faults`` (``--runs`` runs of six tool steps and a final
answer, a 50 ms model, async actors), removes the worker node holding the most run processes
after six runs have finished (``remove_node(..., allow_graceful=False)``) and SIGKILLs one
run process on the survivor after sixteen. For every run that had an attempt in a process of
the removed node, the delay is the time from the start of ``remove_node`` to that run's next
attempt starting in another process (each attempt writes a timestamped line to the workload's
ledger when the factory is entered); ``remove_node`` itself takes part of it, reported
separately. Reported: how many runs that was, the median and the maximum delay, and the
batch's own verdict (no ``NEVER`` action twice, ...).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# tools.ray_cluster first: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported.
from tools.ray_cluster import FAST_HEALTH_CHECKS, LoopbackCluster  # isort: skip
from tools.bench._common import argument_parser, print_table, results_envelope, write_json
from tools.netns import exit_unless_loopback_namespace
from tools.ray_faults import run_fault_batch

NAME = "ray_failover"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Time from a node's death to its runs resuming elsewhere.")
    parser.add_argument("--runs", type=int, default=None, help="runs in the batch (default 40)")
    args = parser.parse_args(argv)
    exit_unless_loopback_namespace("tools.bench.ray_failover")
    runs = args.runs or (16 if args.quick else 40)
    with (
        tempfile.TemporaryDirectory(prefix="bench-failover-") as scratch,
        LoopbackCluster(workers=2) as cluster,
    ):
        report = asyncio.run(
            run_fault_batch(
                cluster,
                Path(scratch),
                runs=runs,
                duplicates=5 if runs >= 20 else 2,
                remove_after=6 if runs >= 20 else 3,
                kill_after=16 if runs >= 20 else 8,
            )
        )
    delays = report.resume_after_node_death_s
    row = {
        "runs": runs,
        "wall_s": report.wall_s,
        "runs_resumed_after_node_death": len(delays),
        "resume_delay_median_s": statistics.median(delays) if delays else None,
        "resume_delay_max_s": max(delays) if delays else None,
        "resume_delays_s": sorted(delays),
        "in_flight_at_removal": report.in_flight_at_removal,
        "remove_node_s": report.removal_seconds,
        "runs_executed_again": report.runs_executed_again,
        "resume_state_unknown": len(report.unknown_runs),
        "stop_reasons": dict(report.stop_reasons),
        "breaches": report.breaches,
    }
    results = results_envelope(
        NAME,
        argv,
        quick=args.quick,
        rows=[row],
        health_checks=FAST_HEALTH_CHECKS,
        cluster="head num_cpus=0 + 2 worker nodes num_cpus=1, one machine, loopback",
    )
    print_table(
        f"node removed after 6 of {runs} runs finished; delay = removal -> next attempt starts",
        ["runs", "resumed", "median s", "max s", "unknown", "breaches"],
        [
            [
                runs,
                len(delays),
                row["resume_delay_median_s"] if delays else "-",
                row["resume_delay_max_s"] if delays else "-",
                len(report.unknown_runs),
                len(report.breaches),
            ]
        ],
    )
    print(report.summary())
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
