"""The main job: ``python -m tools.demo`` in a real subprocess, judged by what it leaves behind.

The demo kills two of its runs with SIGKILL in a child process and resumes them. These tests
read the JSONL logs and the world's ledger (written by the tools, not by polyloop) to check the
story actually happened, instead of trusting the demo's own printout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "r1-total": "task_completed",
    "r2-question": "final_answer",
    "r3-sloppy": "task_completed",
    "r4-budget": "step_budget",
    "r5-kill-safe": "task_completed",
    "r6-kill-never": "resume_state_unknown",
}


@dataclass(frozen=True)
class DemoRun:
    process: subprocess.CompletedProcess[str]
    runs_dir: Path

    def records(self, run_id: str) -> list[dict[str, object]]:
        lines = (self.runs_dir / f"{run_id}.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]

    def ledger(self) -> list[dict[str, object]]:
        text = (self.runs_dir / "world" / "ledger.jsonl").read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines()]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    runs_dir = tmp_path_factory.mktemp("demo") / "runs"
    process = run_demo("--runs-dir", str(runs_dir), "--seed", "7")
    return DemoRun(process=process, runs_dir=runs_dir)


def test_demo_exits_zero_and_every_self_check_holds(demo: DemoRun) -> None:
    assert demo.process.returncode == 0, demo.process.stdout + demo.process.stderr
    match = re.search(r"^Checks: (\d+)/(\d+) held$", demo.process.stdout, re.MULTILINE)
    assert match is not None, demo.process.stdout
    assert match[1] == match[2]
    assert "FAILED" not in demo.process.stdout


def test_summary_table_lists_every_run_with_its_stop_reason(demo: DemoRun) -> None:
    summary = demo.process.stdout.split("\nSummary\n", 1)[1]
    for run_id, reason in EXPECTED.items():
        assert re.search(rf"^\s+{run_id}\s+{reason}\s+\d+\s+\d+\s", summary, re.MULTILINE), (
            run_id,
            summary,
        )
    assert f"head -3 {demo.runs_dir / 'r5-kill-safe.jsonl'}" in demo.process.stdout


def test_every_run_has_a_log_ending_in_its_finish_record(demo: DemoRun) -> None:
    for run_id, reason in EXPECTED.items():
        records = demo.records(run_id)
        kinds = [record["record"] for record in records]
        assert kinds[0] == "run_started"
        assert kinds.count("run_started") == 1, f"{run_id} was started twice"
        if reason == "resume_state_unknown":
            # In doubt, so left open to be settled (design 0206): its last execution is the
            # NEVER action's unanswered intent, and it has no finish record. The demo's resume
            # stopped again in doubt and left its mark on a resume_stopped record after it
            # (schema 1.9, design 0231).
            assert kinds[-2:] == ["intent", "resume_stopped"]
            assert records[-2]["replay_policy"] == "never"
            assert records[-1]["result_id"] == records[-2]["result_id"]
            assert records[-1]["resumed"]["plan"] == "stop_unknown"
            assert "run_finished" not in kinds
            continue
        assert kinds[-1] == "run_finished"
        assert kinds.count("run_finished") == 1
        result = records[-1]["result"]
        assert isinstance(result, dict)
        assert result["stop_reason"] == reason


def test_the_run_killed_in_a_safe_lookup_was_resumed_and_replayed_it(demo: DemoRun) -> None:
    records = demo.records("r5-kill-safe")
    actions = [r for r in records if r["record"] == "intent" and r["kind"] == "action"]
    assert [a["replay_policy"] for a in actions[:2]] == ["safe", "safe"]
    # One intent per action even across the kill: the replay reuses the logged intent.
    assert len({a["result_id"] for a in actions}) == len(actions)
    steps = [r["step"]["step_idx"] for r in records if r["record"] == "step_completed"]
    assert steps == list(range(len(steps)))
    lookups = [
        entry
        for entry in demo.ledger()
        if entry["run_id"] == "r5-kill-safe" and entry["tool"] == "lookup"
    ]
    # Two lookups are needed; the second one ran in the killed child and again on resume.
    assert len(lookups) == 3
    assert lookups[1]["arguments"] == lookups[2]["arguments"]
    assert lookups[0]["pid"] == lookups[1]["pid"] != lookups[2]["pid"]
    assert "SIGKILL" in demo.process.stdout


def test_the_run_killed_in_a_never_action_stops_without_repeating_it(demo: DemoRun) -> None:
    records = demo.records("r6-kill-never")
    last_action = [r for r in records if r["record"] == "intent" and r["kind"] == "action"][-1]
    assert last_action["replay_policy"] == "never"
    settled = {r["result_id"] for r in records if r["record"] == "step_completed"}
    assert last_action["result_id"] not in settled
    notes = (demo.runs_dir / "world" / "notes.txt").read_text(encoding="utf-8").splitlines()
    assert len([line for line in notes if line.startswith("r6-kill-never:")]) == 1
    writes = [
        e for e in demo.ledger() if e["run_id"] == "r6-kill-never" and e["tool"] == "write_note"
    ]
    assert len(writes) == 1


def test_help_documents_the_options() -> None:
    process = run_demo("--help")
    assert process.returncode == 0
    assert "--runs-dir" in process.stdout
    assert "--seed" in process.stdout


def test_a_used_runs_dir_is_refused_and_left_untouched(demo: DemoRun) -> None:
    before = {path: path.read_bytes() for path in demo.runs_dir.rglob("*") if path.is_file()}
    process = run_demo("--runs-dir", str(demo.runs_dir))
    assert process.returncode == 2
    assert "--runs-dir" in process.stderr
    assert "not an empty directory" in process.stderr
    after = {path: path.read_bytes() for path in demo.runs_dir.rglob("*") if path.is_file()}
    assert after == before


def test_the_demo_ends_by_naming_the_inspector_commands_and_they_work(demo: DemoRun) -> None:
    tail = demo.process.stdout.rstrip("\n").split("\nLook at the runs", 1)[1].splitlines()
    commands = [line.strip() for line in tail if " -m polyloop " in line]
    assert [c.split(" -m polyloop ", 1)[1].split()[0] for c in commands] == [
        "ls",
        "show",
        "verify",
        "html",
    ]
    for command in commands:
        argv = command.split(" -m polyloop ", 1)[1].split()
        done = subprocess.run(
            [sys.executable, "-m", "polyloop", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert done.stderr == ""
    assert (demo.runs_dir / "runs.html").is_file()
