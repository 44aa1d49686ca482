"""Logs written by schema 1.6 (before idempotency keys and settlements) still decode, check
and resume (issue 21).

The fixtures in ``tests/fixtures/logs-1.6/`` are frozen (see their README): the demo's
``r6-kill-never`` run as commit dc01790 wrote it, and the cut of it that a kill inside the
``NEVER`` tool left. Schema 1.7 added fields (an intent's idempotency key, an outcome's
``settled_by``) and a record kind (the settlement); a 1.6 log has none of them and must read
with their defaults, pass ``check_log``, and resume as before: the ``NEVER`` action in doubt
still stops the run with ``resume_state_unknown`` and is not executed again.
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
from polyloop.session import resume
from polyloop.stores import JsonlRunStore
from polyloop.types import IntentKind, ReplayPolicy, StopReason

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-1.6"
ALL_LOGS = sorted(path.name for path in FIXTURES.glob("*.jsonl"))
IN_DOUBT = "u2-dangling-never-action.jsonl"


def _copy_as_store(fixture: str, directory: Path) -> str:
    """Copy a fixture under its run id's file name (the store's naming rule)."""
    source = FIXTURES / fixture
    run_id = json.loads(source.read_text(encoding="utf-8").splitlines()[0])["run_id"]
    assert isinstance(run_id, str)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, directory / f"{run_id}.jsonl")
    return run_id


def test_the_fixtures_are_whole_lines_of_schema_1_6() -> None:
    assert ALL_LOGS == ["r6-kill-never.jsonl", IN_DOUBT]
    for fixture in ALL_LOGS:
        lines = (FIXTURES / fixture).read_bytes().split(b"\n")
        assert lines[-1] == b"", f"{fixture} ends with a whole line"
        versions = {json.loads(line)["schema_version"] for line in lines[:-1]}
        assert versions == {"1.6"}, fixture
        assert all(list(json.loads(line))[-1] == "checksum" for line in lines[:-1])


@pytest.mark.parametrize("fixture", ALL_LOGS)
async def test_a_16_log_decodes_with_defaults_for_the_fields_of_1_7(
    fixture: str, tmp_path: Path
) -> None:
    run_id = _copy_as_store(fixture, tmp_path)
    log = await JsonlRunStore(directory=tmp_path).read_log(run_id)
    assert log.started is not None
    assert log.intents
    assert all(intent.idempotency_key is None for intent in log.intents)
    assert all(
        completed.action_outcome.settled_by is None
        for completed in log.steps
        if completed.action_outcome is not None
    )
    assert log.settlements == ()
    assert check_log(log, run_id) is None


async def test_the_16_log_in_doubt_resumes_to_resume_state_unknown(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_id = _copy_as_store(IN_DOUBT, runs)
    store = JsonlRunStore(directory=runs)
    before = await store.read_log(run_id)
    last = before.intents[-1]
    assert (last.kind, last.replay_policy, last.result_id) == (
        IntentKind.ACTION,
        ReplayPolicy.NEVER,
        "a3",
    )
    assert plan_resume(before, run_id).action is ResumeAction.STOP_UNKNOWN
    scenario = scenario_named(run_id)
    # The demo's default seed: the snapshot's request.fingerprint.shop.seed is "7".
    world = World(tmp_path / "world", Shop.from_seed(7))
    agent = definition_for(scenario, store=store, sink=ConsoleSink(out=io.StringIO()))
    result = await resume(agent, request_for(scenario, world))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert [entry.tool for entry in world.ledger()] == []  # nothing executed again
    after = await store.read_log(run_id)
    assert after.steps == before.steps
    assert after.intents == before.intents
    assert check_log(after, run_id) is None
