"""Forks of the frozen logs (issue 40, design 0239): every fork point of every fixture, from
0.1.0 to 1.8, either forks into a log that passes ``check_log`` with the source's bytes
unchanged, or is refused because the source's step there has a ``NEVER`` action in doubt (a
``SAFE`` one in doubt is forked at); a fork of a 1.8 log resumes under the demo's agent and
finishes, its copied steps' tools never executed again (the world's ledger).
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
from tools.demo._agent import ConsoleSink
from tools.demo._scenarios import definition_for, request_for, scenario_named
from tools.demo._world import Shop, World

from polyloop.errors import ForkError
from polyloop.session import check_log, fork, resume
from polyloop.stores import JsonlRunStore
from polyloop.types import StopReason

pytestmark = pytest.mark.integration

ALL_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURES = ALL_FIXTURES / "logs-1.8"
EVERY_LOG = sorted(ALL_FIXTURES.glob("logs-*/*.jsonl"))


def _run_id(path: Path) -> str:
    run_id = json.loads(path.read_text(encoding="utf-8").splitlines()[0])["run_id"]
    assert isinstance(run_id, str)
    return run_id


def _same_bytes(left: Path, right: Path) -> bool:
    return left.read_bytes() == right.read_bytes()


@pytest.mark.parametrize("path", EVERY_LOG, ids=lambda p: f"{p.parent.name}/{p.name}")
async def test_every_fork_point_of_a_frozen_log_forks_or_is_refused(
    path: Path, tmp_path: Path
) -> None:
    run_id = _run_id(path)
    shutil.copyfile(path, tmp_path / f"{run_id}.jsonl")
    store = JsonlRunStore(directory=tmp_path)
    steps = len((await store.read_log(run_id)).steps)
    for at in range(steps + 1):
        new = f"{run_id}-at-{at}"
        if (run_id, at) == ("r6-kill-never", 3):  # its step 3 is in doubt (the NEVER note)
            with pytest.raises(ForkError, match="in doubt") as refused:
                await fork(store, run_id, at=at, new_run_id=new)
            assert refused.value.reason == "in_doubt"
            continue
        origin = await fork(store, run_id, at=at, new_run_id=new)
        forked = await store.read_log(new)
        assert check_log(forked, new) is None
        assert len(forked.entries) == origin.records
        assert len(forked.steps) == at
    assert _same_bytes(tmp_path / f"{run_id}.jsonl", path)


async def test_a_fork_of_a_18_log_resumes_under_the_demo_agent(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copyfile(FIXTURES / "r1-total.jsonl", runs / "r1-total.jsonl")
    store = JsonlRunStore(directory=runs)
    await fork(store, "r1-total", at=2, new_run_id="r1-fork")
    world = World(tmp_path / "world", Shop.from_seed(7))
    scenario = scenario_named("r1-total")
    agent = definition_for(scenario, store=store, sink=ConsoleSink(out=io.StringIO()))
    request = dataclasses.replace(request_for(scenario, world), run_id="r1-fork")
    result = await resume(agent, request)
    assert result.stop_reason is StopReason.TASK_COMPLETED
    source = await store.read_log("r1-total")
    assert list(result.steps[:2]) == [c.step for c in source.steps[:2]]
    # The world's ledger holds only the fork's own steps (2 and on): the copied lookups of
    # steps 0 and 1 were not executed again.
    ledger = (tmp_path / "world" / "ledger.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(ledger) == len(source.steps) - 2
    assert check_log(await store.read_log("r1-fork"), "r1-fork") is None
