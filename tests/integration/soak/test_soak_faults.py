"""The fault batch: the crash store wrapper, the budget skip, and all nine classes for real."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _soak_support import ROOT
from tools.soak import faults
from tools.soak._artifacts import FAULT_CLASSES
from tools.soak._verdict import Verdict
from tools.soak.faults import EXIT_UNDETERMINED, ClassReport, CrashingStore

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


def test_a_class_the_budget_cannot_cover_is_skipped_and_fails_the_step(tmp_path: Path) -> None:
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
    # Nothing breached, but crash_a verified nothing: that is not a green fault step.
    assert done.returncode == EXIT_UNDETERMINED == 3, done.stdout + done.stderr
    assert (
        "crash_a (review): undetermined" in done.stdout
        or "crash_a (code): undetermined" in done.stdout
    )
    assert "skipped: 3 calls left" in done.stdout
    assert "parse_storm (code): passed" in done.stdout
    assert "0 breached, 1 undetermined; verdict undetermined" in done.stdout
    assert "1 classes undetermined (crash_a)" in done.stderr


def test_undetermined_is_accepted_only_when_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def argv(name: str) -> list[str]:
        return ["--runs-dir", str(tmp_path / name), "--budget-calls", "1", "--only", "crash_b"]

    assert faults.main(argv("strict")) == faults.EXIT_UNDETERMINED
    assert "1 classes undetermined (crash_b)" in capsys.readouterr().err
    assert faults.main([*argv("lenient"), "--allow-undetermined"]) == faults.EXIT_PASSED
    assert "verdict undetermined" in capsys.readouterr().out


def test_a_class_that_passed_no_criterion_is_undetermined_at_best() -> None:
    report = ClassReport(name="crash_a", scenario="review")
    assert report.verdict is Verdict.UNDETERMINED  # no criterion at all
    report.judge("budget", None, "skipped")
    assert report.verdict is Verdict.UNDETERMINED
    report.judge("stop_reason", True, "stop reason step_budget")
    assert report.verdict is Verdict.UNDETERMINED  # one pass does not cover the gap
    report.judge("steps_at_cap", False, "3 steps, max_steps 4")
    assert report.verdict is Verdict.BREACHED
    clean = ClassReport(name="step_budget", scenario="code")
    clean.judge("stop_reason", True, "stop reason step_budget")
    assert clean.verdict is Verdict.PASSED


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
    _assert_the_sharpened_criteria(done.stdout)
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


def _assert_the_sharpened_criteria(stdout: str) -> None:
    """The criteria that once could not fail, or compared the harness with itself."""
    lines = {
        line.split(":", 1)[0].split()[-1]: line
        for line in stdout.splitlines()
        if line.startswith("    ")
    }
    assert "history_not_cut" not in lines
    assert "actions_below_cap" not in lines
    # prompt_limit: what step 0 sent equals the initial context, nothing more is claimed
    assert re.search(
        r"passed +initial_context_intact: .*: step 0 sent (\d+) chars, the initial context "
        r"has \1$",
        lines["initial_context_intact"],
    ), lines["initial_context_intact"]
    # step_budget: a criterion a parse failure or failed call on any step would breach
    assert re.search(
        r"passed +every_step_an_action: .*: 4 actions in 4 steps, max_actions 5$",
        lines["every_step_an_action"],
    ), lines["every_step_an_action"]
    assert re.search(
        r"passed +steps_below_cap: .*: 3 steps, max_steps 4$", lines["steps_below_cap"]
    )
    # crash_a and crash_b: resumed_from_step against a count taken from the log's bytes
    found = re.findall(
        r"passed +resumed_from_step_recorded: .*: meta resumed_from_step (\d+); (\d+) step "
        r"records begin before byte (\d+), where the resuming process's records begin$",
        stdout,
        flags=re.MULTILINE,
    )
    assert len(found) == 2, stdout
    for recorded, counted, boundary in found:
        assert recorded == counted != "0"
        assert int(boundary) > 0
