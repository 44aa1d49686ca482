"""``python -m tools.bench.postgres_store --quick --commit-modes`` keeps working and reports
what the performance page quotes: every figure with the load average of its sitting.

Not a timed test: nothing here looks at a speed (the figures are in
``research-wiki/reference/performance.md`` with their command).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tools.pg_cluster import HOW_TO_INSTALL, binaries_available

from _infra import skip_unless_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]


def _bench(module: str, *args: str, json_out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tools.bench.<module> <args>``, results in ``json_out``; it must succeed."""
    completed = subprocess.run(
        [sys.executable, "-m", f"tools.bench.{module}", *args, "--json-out", str(json_out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def _quick_bench(flag: str, json_out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tools.bench.postgres_store --quick --repeats 1 <flag>``, results in
    ``json_out``; it must succeed."""
    return _bench("postgres_store", "--quick", "--repeats", "1", flag, json_out=json_out)


def test_the_postgres_benchmark_reports_fleet_single_run_and_commit_mode_figures(
    tmp_path: Path,
) -> None:
    skip_unless_available(binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL)
    json_out = tmp_path / "pg.json"
    completed = _quick_bench("--commit-modes", json_out)
    rows = json.loads(json_out.read_text())["results"]
    measures = [row["measure"] for row in rows]
    assert measures[:4] == [
        "one run alone",
        "50 concurrent runs",
        "200 concurrent runs",
        "200 concurrent runs (control: volatile)",
    ]
    assert rows[0]["us_per_step"] > 0
    assert all(row["steps_per_s"] > 0 for row in rows[1:4])
    # The client's CPU over the wall time: the share of one core its event loop used.
    assert all(0 < row["client_busy"] < 2 for row in rows[1:4])
    assert "client busy" in completed.stdout
    modes = [row for row in rows if "records_per_s" in row]
    assert modes[0]["measure"] == "group commit (the store, pool 20)"
    assert len(modes) == 4
    assert all({"load_before", "load_after"} <= row.keys() for row in rows)
    assert "load before/after" in completed.stdout


def test_one_fleet_runs_a_fleet_and_prints_nothing() -> None:
    """``--one-fleet RUNS STEPS`` (for counting instructions under callgrind) runs the warm-up
    and one fleet through the public API, and prints no table."""
    skip_unless_available(binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL)
    completed = subprocess.run(
        [sys.executable, "-m", "tools.bench.postgres_store", "--one-fleet", "3", "2"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout == ""


def test_gc_stats_reports_the_collectors_passes_per_generation(tmp_path: Path) -> None:
    """``--gc-stats`` (a diagnostic, design 0214's fourth pass): each fleet's row says how many
    passes of each generation the collector made, their µs and the objects they examined a
    step, and the table prints them."""
    skip_unless_available(binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL)
    json_out = tmp_path / "pg.json"
    completed = _quick_bench("--gc-stats", json_out)
    fleets = [row for row in json.loads(json_out.read_text())["results"] if "runs" in row][1:]
    assert len(fleets) == 3
    for row in fleets:
        assert len(row["gc_passes"]) == len(row["gc_us_per_step"]) == 3
        assert row["gc_passes"][0] > 0, row  # a fleet of 50 runs makes young garbage
        assert row["gc_examined_per_step"][0] > 0
    assert "objects examined a step" in completed.stdout


def test_the_listing_benchmark_times_ls_of_the_runs_it_wrote(tmp_path: Path) -> None:
    """``python -m tools.bench.postgres_listing``: the ``ls`` figure of issue 24 (the test of
    the listing counts statements instead, issue 34). It lists every run it wrote, and gives
    wall and CPU seconds with the load of the sitting."""
    skip_unless_available(binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL)
    json_out = tmp_path / "listing.json"
    completed = _bench("postgres_listing", "--runs", "5", "--repeats", "1", json_out=json_out)
    (row,) = json.loads(json_out.read_text())["results"]
    assert row["measure"] == "ls postgres://... of 5 runs"
    assert len(row["walls"]) == len(row["cpus"]) == 1
    assert row["cpu_s"] > 0
    assert {"load_before", "load_after"} <= row.keys()
    assert "ls postgres://... of 5 runs" in completed.stdout
