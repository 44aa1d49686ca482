"""The trees-of-runs guide, executed as written (issue 38): a coordinator hands a question to a
researcher through ``Agent.as_tool``; run again, nothing runs twice; the inspector sees the
tree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "research-wiki" / "guides" / "agents-that-call-agents.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)


def _run(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_guide_runs_a_tree_once_and_the_inspector_sees_it(tmp_path: Path) -> None:
    (script,) = _blocks("python")
    printed, listing = _blocks("text")
    assert ".as_tool(" in script
    (tmp_path / "trip.py").write_text(script, encoding="utf-8")
    first = _run([sys.executable, "trip.py"], tmp_path)
    assert first == printed
    second = _run([sys.executable, "trip.py"], tmp_path)
    assert second == printed
    assert (tmp_path / "lookups.txt").read_text(encoding="utf-8") == "Lyon\n"  # ran once
    ls = _run([sys.executable, "-m", "polyloop", "ls", "runs"], tmp_path)
    shown = [line.split() for line in listing.splitlines()[1:]]
    got = [line.split() for line in ls.splitlines()]
    # Durations differ from run to run; every other column is as the guide shows it.
    assert [row[:3] + row[-4:] for row in got] == [row[:3] + row[-4:] for row in shown]
    verified = _run([sys.executable, "-m", "polyloop", "verify", "runs"], tmp_path)
    assert verified.endswith("verified 2 logs: 0 breached\n")
