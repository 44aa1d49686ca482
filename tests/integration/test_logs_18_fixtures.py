"""Logs written by schema 1.8 (release 0.2.0) still decode, check, show and resume.

The fixtures in ``tests/fixtures/logs-1.8/`` are frozen (see their README): the demo's six
runs as commit c4fb486 wrote them. Every later schema must read them unchanged: a finished run
resumes to its stored result without a model call, and the run left in doubt inside its
``NEVER`` tool resumes to ``resume_state_unknown`` without executing anything again.
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

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-1.8"
ALL_LOGS = sorted(path.name for path in FIXTURES.glob("*.jsonl"))
FINISHED = ["r1-total.jsonl", "r2-question.jsonl", "r3-sloppy.jsonl", "r4-budget.jsonl"]


def test_the_fixtures_are_whole_checksummed_lines_of_schema_1_8() -> None:
    assert [*FINISHED, "r5-kill-safe.jsonl", "r6-kill-never.jsonl"] == ALL_LOGS
    for fixture in ALL_LOGS:
        lines = (FIXTURES / fixture).read_bytes().split(b"\n")
        assert lines[-1] == b"", f"{fixture} ends with a whole line"
        versions = {json.loads(line)["schema_version"] for line in lines[:-1]}
        assert versions == {"1.8"}, fixture
        assert all(list(json.loads(line))[-1] == "checksum" for line in lines[:-1])


@pytest.mark.parametrize("fixture", ALL_LOGS)
async def test_a_18_log_decodes_checks_and_renders(fixture: str, tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / fixture, tmp_path / fixture)
    run_id = fixture.removesuffix(".jsonl")
    log = await JsonlRunStore(directory=tmp_path).read_log(run_id)
    assert log.started is not None
    assert check_log(log, run_id) is None
    view = load_file(FIXTURES / fixture)
    assert view.run_id == run_id
    assert run_id in render_html([view])


@pytest.mark.parametrize("fixture", [*FINISHED, "r5-kill-safe.jsonl"])
async def test_a_finished_18_log_resumes_to_its_stored_result(fixture: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copyfile(FIXTURES / fixture, runs / fixture)
    run_id = fixture.removesuffix(".jsonl")
    store = JsonlRunStore(directory=runs)
    before = (runs / fixture).read_bytes()
    scenario = scenario_named(run_id)
    world = World(tmp_path / "world", Shop.from_seed(7))
    agent = definition_for(scenario, store=store, sink=ConsoleSink(out=io.StringIO()))
    result = await resume(agent, request_for(scenario, world))
    log = await store.read_log(run_id)
    assert log.finished is not None
    assert result == log.finished.result
    assert [entry.tool for entry in world.ledger()] == []  # nothing executed again
    assert (runs / fixture).read_bytes() == before  # a finished log is not written to


async def test_the_18_log_in_doubt_resumes_to_resume_state_unknown(tmp_path: Path) -> None:
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
    assert [entry.tool for entry in world.ledger()] == []
    after = await store.read_log("r6-kill-never")
    assert after.intents == before.intents
    assert check_log(after, "r6-kill-never") is None
    # The resume is visible (schema 1.9, design 0231): one resume_stopped record after the
    # 1.8 lines, which the page and show count and describe.
    added = [entry.record for entry in after.entries[len(before.entries) :]]
    assert [type(record) for record in added] == [ResumeStopped]
    assert load_file(FIXTURES / "r6-kill-never.jsonl").resumes == ()
    view = load_file(runs / "r6-kill-never.jsonl")
    assert [(r.plan, r.stopped, r.step_idx) for r in view.resumes] == [
        ("stop_unknown", "resume_state_unknown", 3)
    ]
    page = render_html([view])
    assert "1 resume " in page or "1 resume<" in page
    assert "stopped again as resume_state_unknown" in page
