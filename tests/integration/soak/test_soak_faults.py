"""The fault batch: the crash store wrapper, the budget skip, and all nine classes for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _soak_support import ROOT
from tools.soak._artifacts import FAULT_CLASSES
from tools.soak.faults import CrashingStore

from polyloop.stores import JsonlRunStore

pytestmark = pytest.mark.integration


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_crash_wrapper_reports_the_inner_parameters_unchanged(tmp_path: Path) -> None:
    inner = JsonlRunStore(directory=tmp_path)
    wrapped = CrashingStore(
        inner, mode="a", ledger_count=lambda: 0, completing_tools=frozenset({"submit_finding"})
    )
    assert wrapped.parameters() == inner.parameters()
    with pytest.raises(TypeError):
        CrashingStore(inner, mode="a", completing_tools=frozenset())  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="mode"):
        CrashingStore(inner, mode="c", ledger_count=lambda: 0, completing_tools=frozenset())


def test_a_class_the_budget_cannot_cover_is_skipped_as_undetermined(tmp_path: Path) -> None:
    done = _python(
        "tools.soak.faults",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--budget-calls",
        "3",
        "--only",
        "crash_a",
        "--only",
        "parse_storm",
    )
    assert done.returncode == 0, done.stderr
    assert (
        "crash_a (review): undetermined" in done.stdout
        or "crash_a (code): undetermined" in done.stdout
    )
    assert "skipped: 3 calls left" in done.stdout
    assert "parse_storm (code): passed" in done.stdout


@pytest.mark.slow
def test_all_nine_classes_pass_and_their_runs_satisfy_the_scoreboard(tmp_path: Path) -> None:
    runs = tmp_path / "fault-runs"
    done = _python("tools.soak.faults", "--runs-dir", str(runs), "--budget-calls", "400")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in FAULT_CLASSES:
        assert any(
            line.startswith(f"{name} (") and ": passed - " in line
            for line in done.stdout.splitlines()
        ), (name, done.stdout)
    assert ", 0 breached, 0 undetermined; verdict passed" in done.stdout
    strict = _python(
        "tools.soak.scoreboard",
        "--runs-dir",
        str(runs),
        "--report",
        str(tmp_path / "sb.md"),
        "--completing-tool",
        "submit_finding",
    )
    assert strict.returncode == 3, strict.stdout  # cancelled runs have no result: undetermined
    lenient = _python(
        "tools.soak.scoreboard",
        "--runs-dir",
        str(runs),
        "--report",
        str(tmp_path / "sb.md"),
        "--completing-tool",
        "submit_finding",
        "--allow-undetermined",
    )
    assert lenient.returncode == 0, lenient.stdout
    assert "breached 0" in lenient.stdout
