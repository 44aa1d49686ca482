"""A finished run asked for again under changed settings: its result, and a warning (design 0217).

The seed's rule stays (``resume`` and ``run_or_resume`` of a finished run return its stored
result and run nothing); what issue 26 item 2 adds is that a change is no longer ignored in
silence: ``FinishedRunDriftWarning`` names every key that differs and says to pick a new run id.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.errors import FinishedRunDriftWarning, PolyloopError
from polyloop.session import AgentDefinition, RunRequest, resume, run, run_or_resume
from polyloop.types import StopReason

pytestmark = pytest.mark.unit


async def _finished() -> tuple[ScriptedModel, AgentDefinition, RunRequest]:
    model = ScriptedModel(["final:42"])
    agent = definition(model)
    req = request(fingerprints={"prompt": "sha256:1"})
    result = await run(agent, req)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    return model, agent, req


async def test_changed_settings_warn_naming_every_key_and_return_the_stored_result() -> None:
    model, agent, req = await _finished()
    stored = (await agent.store.read_log("run-1")).finished
    assert stored is not None
    changed_req = dataclasses.replace(
        req,
        budget=dataclasses.replace(req.budget, max_steps=req.budget.max_steps + 1),
        fingerprints={"prompt": "sha256:2", "instructions": "sha256:3"},
    )
    changed_agent = dataclasses.replace(agent, model_client=ScriptedModel([], identity="v2"))
    with pytest.warns(FinishedRunDriftWarning) as caught:
        result = await run_or_resume(changed_agent, changed_req)
    assert result == stored.result
    assert len(caught) == 1
    warning = caught[0].message
    assert isinstance(warning, FinishedRunDriftWarning)
    assert isinstance(warning, PolyloopError)
    assert isinstance(warning, UserWarning)
    text = str(warning)
    for key in (
        "model_client.model",
        "request.max_steps",
        "request.fingerprint.prompt",
        "request.fingerprint.instructions",
    ):
        assert key in text, key
    assert "'run-1' is finished" in text
    assert "pick a new run id" in text
    assert warning.added == ("request.fingerprint.instructions",)
    assert warning.removed == ()
    assert set(warning.changed) == {
        "model_client.model",
        "request.max_steps",
        "request.fingerprint.prompt",
    }
    assert len(model.calls) == 1, "nothing ran again: the one call is the first run's"


async def test_resume_of_a_finished_run_warns_too() -> None:
    _, agent, req = await _finished()
    with pytest.warns(FinishedRunDriftWarning, match=r"request\.max_steps"):
        await resume(
            agent, dataclasses.replace(req, budget=dataclasses.replace(req.budget, max_steps=7))
        )


async def test_unchanged_settings_return_the_result_without_a_warning() -> None:
    _, agent, req = await _finished()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = await run_or_resume(agent, req)
    assert result.final_answer == "42"


_THREE_RERUNS = """
import asyncio, dataclasses, sys, tempfile
sys.path.insert(0, sys.argv[1])
from _session_doubles import ScriptedModel, definition, request
from polyloop.session import run, run_or_resume
from polyloop.stores import JsonlRunStore

async def main():
    store = JsonlRunStore(directory=tempfile.mkdtemp())
    agent = dataclasses.replace(definition(ScriptedModel(["final:42"])), store=store)
    await run(agent, request())
    changed = dataclasses.replace(agent, model_client=ScriptedModel([], identity="v2"))
    for _ in range(3):
        await run_or_resume(changed, request())  # THE USER'S CALL

asyncio.run(main())
"""


def test_three_changed_reruns_in_one_process_warn_three_times_at_the_users_call(
    tmp_path: Path,
) -> None:
    """Under Python's default filter (a fresh interpreter, no ``-W``), the same change asked
    for three times warns three times, each pointing at the caller's line, not the library's
    (issue 26 review, defect 3; design 0217). ``-W ignore::...`` still silences it."""
    script = tmp_path / "three_reruns.py"
    script.write_text(_THREE_RERUNS, encoding="utf-8")
    tests_unit = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("PYTHONWARNINGS", None)
    shown = subprocess.run(
        [sys.executable, str(script), tests_unit], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stderr.splitlines() if "FinishedRunDriftWarning" in line]
    assert len(lines) == 3, shown.stderr
    call_line = 1 + _THREE_RERUNS.splitlines().index(
        "        await run_or_resume(changed, request())  # THE USER'S CALL"
    )
    assert all(line.startswith(f"{script}:{call_line}: ") for line in lines), shown.stderr
    assert "_driver.py" not in shown.stderr
    assert shown.stderr.count("# THE USER'S CALL") == 3  # the source line shown under each
    quiet = subprocess.run(
        [sys.executable, "-W", "ignore::polyloop.errors.FinishedRunDriftWarning", str(script),
         tests_unit], env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr
    assert "FinishedRunDriftWarning" not in quiet.stderr
