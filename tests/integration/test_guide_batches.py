"""The batches guide, executed as written: the script twice (the second run makes no model
call), then the command line's run and its report rebuilt from the store (design 0242)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "research-wiki" / "guides" / "batches.md"


def _script() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 1, "the guide has one script"
    return blocks[0]


def _run(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_guide_runs_resumes_for_free_and_its_commands_print_what_it_shows(
    tmp_path: Path,
) -> None:
    (tmp_path / "grade_batch.py").write_text(_script(), encoding="utf-8")
    page = GUIDE.read_text(encoding="utf-8")
    first = _run([sys.executable, "grade_batch.py"], tmp_path)
    second = _run([sys.executable, "grade_batch.py"], tmp_path)
    assert first.strip() in page
    assert second.strip() == "{'final_answer': 6} retried 2, model calls 0"
    assert second.strip() in page
    report = tmp_path / "runs" / "batches" / "demo"
    rows = [json.loads(line) for line in (report / "report.jsonl").read_text().splitlines()]
    assert sorted(row["attempts"] for row in rows) == [1, 1, 1, 1, 2, 2]
    tasks = "\n".join(json.dumps(t) for t in _tasks(tmp_path))  # what the guide's one-liner writes
    (tmp_path / "tasks.jsonl").write_text(tasks + "\n", encoding="utf-8")
    argv = "--items tasks.jsonl --agent grade_batch:make_agent --batch-id demo2 --store runs"
    ran = _run(
        [sys.executable, "-m", "polyloop", "batch", "run", *argv.split(), "--key-field", "id",
         "--concurrency", "4"],
        tmp_path,
    )  # fmt: skip
    assert ran.splitlines()[0] in page
    shown = _run(
        [sys.executable, "-m", "polyloop", "batch", "runs", "--batch-id", "demo2"], tmp_path
    )
    lines = shown.splitlines()
    assert lines[0] == ran.splitlines()[0]
    assert lines[1] in page
    row = next(line for line in page.splitlines() if line.startswith("q0-flaky "))
    wall = 6  # the wall time, which differs from run to run
    assert lines[2].split()[:wall] == row.split()[:wall], "the first row: the retried item"
    assert lines[2].split()[wall + 1 :] == row.split()[wall + 1 :]


def _tasks(cwd: Path) -> list[object]:
    out = _run(
        [sys.executable, "-c", "import grade_batch, json; print(json.dumps(grade_batch.TASKS))"],
        cwd,
    )
    return json.loads(out)
