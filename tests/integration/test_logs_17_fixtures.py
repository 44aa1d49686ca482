"""Logs written by schema 1.7 (before the run's context and resume marks) still decode, check,
show in the viewer and resume (issue 26, design 0215).

The fixtures in ``tests/fixtures/logs-1.7/`` are frozen (see their README): the demo's
``r5-kill-safe`` (killed inside a ``SAFE`` tool, resumed to its end) and ``r6-kill-never``
(killed inside a ``NEVER`` tool, left in doubt) as commit 1ae3ac3 wrote them. Schema 1.8 added
``RunStarted.context`` and ``Intent.resumed``; a 1.7 log has neither and must read with
``None`` for both, pass ``check_log``, render (saying that the context is not on record), and
resume as before. A resume under 1.8 appends 1.8 lines to it, which a reader accepts (a log
grows by newer minors, design 0209).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from tools.demo._agent import ConsoleSink
from tools.demo._scenarios import definition_for, request_for, scenario_named
from tools.demo._world import Shop, World

from polyloop._recovery import ResumeAction, check_log, plan_resume
from polyloop.inspect._html import render_html
from polyloop.inspect._load import load_file
from polyloop.session import resume
from polyloop.stores import JsonlRunStore
from polyloop.types import ResumeStopped, StopReason

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-1.7"
ALL_LOGS = sorted(path.name for path in FIXTURES.glob("*.jsonl"))


def test_the_fixtures_are_whole_checksummed_lines_of_schema_1_7() -> None:
    assert ALL_LOGS == ["r5-kill-safe.jsonl", "r6-kill-never.jsonl"]
    for fixture in ALL_LOGS:
        lines = (FIXTURES / fixture).read_bytes().split(b"\n")
        assert lines[-1] == b"", f"{fixture} ends with a whole line"
        versions = {json.loads(line)["schema_version"] for line in lines[:-1]}
        assert versions == {"1.7"}, fixture
        assert all(list(json.loads(line))[-1] == "checksum" for line in lines[:-1])


@pytest.mark.parametrize("fixture", ALL_LOGS)
async def test_a_17_log_decodes_with_no_context_and_no_marks_and_checks(
    fixture: str, tmp_path: Path
) -> None:
    shutil.copyfile(FIXTURES / fixture, tmp_path / fixture)
    run_id = fixture.removesuffix(".jsonl")
    log = await JsonlRunStore(directory=tmp_path).read_log(run_id)
    assert log.started is not None
    assert log.started.context is None
    assert all(intent.resumed is None for intent in log.intents)
    assert check_log(log, run_id) is None
    view = load_file(FIXTURES / fixture)
    assert (view.context, view.resumes) == (None, ())
    assert 'class="context absent"' in render_html([view])


async def test_the_17_log_in_doubt_resumes_to_resume_state_unknown(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copyfile(FIXTURES / "r6-kill-never.jsonl", runs / "r6-kill-never.jsonl")
    store = JsonlRunStore(directory=runs)
    before = await store.read_log("r6-kill-never")
    assert plan_resume(before, "r6-kill-never").action is ResumeAction.STOP_UNKNOWN
    scenario = scenario_named("r6-kill-never")
    world = World(tmp_path / "world", Shop.from_seed(7))
    agent = definition_for(scenario, store=store, sink=ConsoleSink(out=io.StringIO()))
    result = await resume(agent, request_for(scenario, world))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert [entry.tool for entry in world.ledger()] == []  # nothing executed again
    after = await store.read_log("r6-kill-never")
    assert after.intents == before.intents  # nothing announced, nothing executed
    # Since schema 1.9 (design 0231) the resume that stops again leaves its mark on one
    # resume_stopped record, appended after the 1.7 lines (which are read unchanged); until
    # 1.9 it wrote nothing and no reader could see it.
    added = [entry.record for entry in after.entries[len(before.entries) :]]
    assert [type(record) for record in added] == [ResumeStopped]
    assert added[0].resumed is not None
    assert added[0].resumed.plan == "stop_unknown"
    assert check_log(after, "r6-kill-never") is None
