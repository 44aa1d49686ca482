"""The MCP guide, executed as written: the script prints the classification table the guide
shows, dies after its commit, and a second run resumes without committing again (issue 23)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _mcp_servers import git_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "research-wiki" / "guides" / "mcp-tools.md"


def _blocks(kind: str) -> list[str]:
    """The guide's fenced blocks whose fence names ``kind`` ("" for a bare fence)."""
    blocks: list[str] = []
    current: list[str] | None = None
    fence = ""
    for line in GUIDE.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, fence = [], line[3:].strip()
            else:
                if fence == kind:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env}
    return subprocess.run(
        argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_guide_prints_its_table_crashes_and_resumes_without_a_second_commit(
    tmp_path: Path,
) -> None:
    git_server(tmp_path)  # skips (fails in CI) when mcp-server-git is missing
    [script] = _blocks("python")
    (tmp_path / "git_agent.py").write_text(script, encoding="utf-8")
    table = next(block for block in _blocks("") if block.startswith("tool "))
    crashed = _run([sys.executable, "git_agent.py"], tmp_path, CRASH_AFTER_COMMIT="1")
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    assert crashed.stdout == table, "the guide's table is not what the script prints"
    resumed = _run([sys.executable, "git_agent.py"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout == table + "final_answer - Committed notes.txt.\n"
    log = _run(["git", "-C", "repo", "log", "--format=%s"], tmp_path)
    assert log.stdout.splitlines() == ["Add notes"]
    shown = _run([sys.executable, "-m", "polyloop", "show", "runs/commit-notes.jsonl"], tmp_path)
    show_block = next(block for block in _blocks("") if block.startswith("tool replay"))
    for line in show_block.splitlines():
        if line.strip() != "...":
            assert line in shown.stdout.splitlines(), line
