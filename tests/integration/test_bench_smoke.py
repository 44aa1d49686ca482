"""The benchmarks keep working: ``run_all --quick`` runs end to end and writes its JSON.

Benchmarks are not timed tests. Nothing here looks at a speed or a size; it checks that every
benchmark ran, produced rows, and that the figures the performance page quotes are present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]

EXPECTED_ROW_KEYS = {
    "per_step": {"store", "steps", "us_per_step", "fsyncs_per_step", "fsyncs_per_step_loop"},
    "many_runs": {"runs", "wall_s", "steps_per_s", "peak_rss_kib", "peak_rss_per_run_kib"},
    "resume_cost": {"store", "state", "steps", "ms", "ms_with_fsync"},
    "prompt_assembly": {"steps", "appended_bytes_per_step", "prefix_reuse_pct"},
}


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where one ``run_all --quick`` wrote everything (run once for the module)."""
    out_dir = tmp_path_factory.mktemp("bench")
    json_out = out_dir / "all.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.run_all",
            "--quick",
            "--json-out",
            str(json_out),
            "--disk-dir",
            str(out_dir / "disk"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return out_dir


@pytest.fixture(scope="module")
def results(out_dir: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((out_dir / "all.json").read_text(encoding="utf-8"))
    return loaded


def test_the_combined_file_describes_the_machine(results: dict[str, object]) -> None:
    machine = results["machine"]
    assert isinstance(machine, dict)
    assert {"nproc", "cpu_model", "python", "disk_filesystem"} <= machine.keys()
    assert results["quick"] is True


@pytest.mark.parametrize("name", sorted(EXPECTED_ROW_KEYS))
def test_every_benchmark_wrote_rows_with_its_figures(results: dict[str, object], name: str) -> None:
    section = results[name]
    assert isinstance(section, dict)
    assert section["benchmark"] == name
    assert str(section["command"]).startswith(f"python -m tools.bench.{name}")
    rows = section["results"]
    assert isinstance(rows, list)
    assert rows, f"{name} produced no rows"
    for row in rows:
        assert EXPECTED_ROW_KEYS[name] <= row.keys()


def test_each_benchmark_also_wrote_its_own_file(out_dir: Path) -> None:
    for name in EXPECTED_ROW_KEYS:
        own = json.loads((out_dir / f"{name}.json").read_text(encoding="utf-8"))
        assert own["benchmark"] == name


def test_per_step_covers_both_stores_and_counts_fsyncs(results: dict[str, object]) -> None:
    per_step = results["per_step"]
    assert isinstance(per_step, dict)
    rows = per_step["results"]
    stores = {row["store"] for row in rows}
    assert {"volatile", "jsonl-disk"} <= stores
    for row in rows:
        if row["store"] == "volatile":
            assert row["fsyncs_per_step"] == 0
        else:
            assert row["fsyncs_per_step"] > 0  # the meter really saw the store's fsyncs


def test_prompt_assembly_reports_full_prefix_reuse(results: dict[str, object]) -> None:
    """Not a speed: every prompt extending the previous one is the prefix-stability guarantee."""
    section = results["prompt_assembly"]
    assert isinstance(section, dict)
    assert all(row["prefix_reuse_pct"] == 100.0 for row in section["results"])
