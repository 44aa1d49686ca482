"""A fork resumes after a SIGKILL like any run (issue 40, design 0239).

The source run ``src`` (SAFE ``bump`` and NEVER ``note`` calls) runs to its end here. A child
process (``_fork_child.py``) forks it at step 3 under a new model and is SIGKILLed inside the
fork's own first tool call; a second child runs ``run_fork`` again, which resumes the fork:
the SAFE call is replayed and the fork finishes. The ledger shows that no tool of the copied
steps ran again, the killed call ran twice (it is SAFE: replaying it is allowed), and the
fork's NEVER note ran once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from _fork_child import AT, build

from polyloop.session import check_log, run
from polyloop.stores import JsonlRunStore
from polyloop.types import StopReason

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("_fork_child.py")


def test_a_fork_killed_in_its_own_step_resumes_to_its_end(tmp_path: Path) -> None:
    source = asyncio.run(run(*build(tmp_path, "src")))
    assert source.stop_reason is StopReason.FINAL_ANSWER
    source_bytes = (tmp_path / "src.jsonl").read_bytes()

    with subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "STALLED"
        child.kill()  # SIGKILL, inside the fork's own first tool call
        child.wait(timeout=30)

    done = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"DONE final_answer {AT + 3} forked"

    ledger = (tmp_path / "ledger.txt").read_text(encoding="utf-8").splitlines()
    assert ledger == [
        "src bump 0",
        "src note 1",
        "src bump 2",
        "src note 3",
        f"fork bump {AT}",  # killed inside the call ...
        f"fork bump {AT}",  # ... and replayed (SAFE) by the resume
        f"fork note {AT + 1}",  # NEVER: once
    ]
    assert (tmp_path / "src.jsonl").read_bytes() == source_bytes
    store = JsonlRunStore(directory=tmp_path)
    forked = asyncio.run(store.read_log("fork"))
    assert check_log(forked, "fork") is None
    assert forked.started is not None
    assert forked.started.fork is not None
    assert forked.started.fork.step_idx == AT
