"""The approvals guide, executed as written: the agent pauses, a person lists the waiting call
with the CLI and approves it from another process with the agent (``decide.py``, issue 36,
design 0230), the agent resumes and the refund happens exactly once (issue 22)."""

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
GUIDE = ROOT / "research-wiki" / "guides" / "asking-before-acting.md"


def _scripts() -> tuple[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 2, "the guide has two scripts: refund_agent.py and decide.py"
    return blocks[0], blocks[1]


def _run(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_guide_pauses_is_approved_from_another_process_and_resumes(tmp_path: Path) -> None:
    script, decide = _scripts()
    assert "@tool(needs_approval=" in script, "the decorator takes the option (issue 36)"
    (tmp_path / "refund_agent.py").write_text(script, encoding="utf-8")
    (tmp_path / "decide.py").write_text(decide, encoding="utf-8")
    first = _run([sys.executable, "refund_agent.py"], tmp_path)
    assert first.splitlines()[0].startswith(
        'awaiting_approval after 0 steps and 1 tool call: refund({"amount":250,"order":"A-17"}) '
        "waits for a person's approval"
    )
    assert not (tmp_path / "refunds.txt").exists(), "nothing ran before the approval"
    listing = _run([sys.executable, "-m", "polyloop", "approvals", "runs"], tmp_path)
    assert 'arguments: {"amount":250,"order":"A-17"}' in listing
    log = tmp_path / "runs" / "refund-a17.jsonl"
    (request,) = [
        json.loads(line)
        for line in log.read_text(encoding="utf-8").splitlines()
        if json.loads(line)["record"] == "approval_request"
    ]
    assert request["digest"] in listing
    # The summary prints the call that approves it, digest included.
    shown = re.search(
        r"approve: agent\.approve_sync\('refund-a17', digest='(sha256:[0-9a-f]+)'", first
    )
    assert shown is not None
    assert shown[1] == request["digest"]
    recorded = _run([sys.executable, "decide.py", shown[1], "alice"], tmp_path)
    assert recorded == "recorded\n"
    second = _run([sys.executable, "refund_agent.py"], tmp_path)
    assert second.splitlines() == [
        "final_answer after 2 steps and 1 tool call (refund approved by alice): Order A-17 was "
        "refunded 250 EUR."
    ]
    third = _run([sys.executable, "refund_agent.py"], tmp_path)
    assert "already finished: this is its stored result and nothing ran now" in third
    ledger = (tmp_path / "refunds.txt").read_text(encoding="utf-8").splitlines()
    assert ledger == ["A-17 250 polyloop:r:refund-a17:a0"], "refunded exactly once"
