"""The fork-and-replay guide, executed as written (issue 40; designs 0239, 0240): its script
records a run and forks it with no call for the copied steps, and its commands show the
fork, fork from the command line and replay the runs, "same" and then, after the template
change the guide describes, "diverged at step 1: prompt" with the lines it shows.

Each ``console`` block's ``$`` lines are run in order in one directory; the lines after them
are what the command must print (``...`` stands for any text: digests).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme_blocks import INFO_STRING, fenced_blocks

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "research-wiki" / "guides" / "fork-and-replay.md"
CHANGED_TEMPLATE = 'OBSERVATION_TEMPLATE = "Result: {observation}"'


def _matches(expected: str, line: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, line) is not None


def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    blocks = fenced_blocks(GUIDE.read_text(encoding="utf-8"))
    (script,) = [b.code for b in blocks if b.info == INFO_STRING]
    (tmp_path / "note_agent.py").write_text(script, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    replays = 0
    for block in (b for b in blocks if b.info == "console"):
        lines = block.code.splitlines()
        command = shlex.split(lines[0].removeprefix("$ "))
        assert command[0] == ".venv/bin/python", command  # the reader's virtualenv
        if command[:4] == [".venv/bin/python", "-m", "polyloop", "replay"]:
            replays += 1
            if replays == 2:  # the change the guide describes before its second replay
                source = (tmp_path / "note_agent.py").read_text(encoding="utf-8")
                assert 'OBSERVATION_TEMPLATE = "Observation: {observation}"' in source
                (tmp_path / "note_agent.py").write_text(
                    source.replace(
                        'OBSERVATION_TEMPLATE = "Observation: {observation}"', CHANGED_TEMPLATE
                    ),
                    encoding="utf-8",
                )
        done = subprocess.run(
            [sys.executable, *command[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        expected_status = 1 if any("diverged at" in line for line in lines) else 0
        assert done.returncode == expected_status, done.stdout + done.stderr
        printed = done.stdout.splitlines()
        for expected, line in zip(lines[1:], printed, strict=False):
            assert _matches(expected, line), (expected, line)
        assert len(printed) >= len(lines) - 1
    assert replays == 2
    assert (tmp_path / "ledger.txt").read_text(encoding="utf-8").splitlines() == ["tea 4, cake 6"]
    shown = subprocess.run(
        [sys.executable, "-m", "polyloop", "show", "runs", "--run", "no-note"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert (
        "forked from: tea-and-cake at step 2 (steps 0-1 copied, 9 records, prefix sha256:" in shown
    )
