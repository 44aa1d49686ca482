"""A tree of runs on every shipped store (issue 38, design 0245): the same tree, crashed in a
leaf's NEVER call and resumed from the root, ends equal to the uninterrupted tree on the
JSONL, in-memory and PostgreSQL stores, its links (schema 1.9: ``RunStarted.parent``,
``StepRecord.child``) read back as written and whole."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from _trees import Ledger, Tree, TreeModel
from polyloop.ports import RunStore
from polyloop.session import check_tree, run_or_resume
from polyloop.stores import JsonlRunStore, PostgresRunStore, VolatileRunStore
from polyloop.types import StepRecord, StopReason

pytestmark = pytest.mark.integration

TREE = ("root", "root.a1", "root.a1.a1", "root.a1.a3", "root.a3", "root.a3.a1", "root.a3.a3")


class Crash(BaseException):
    """A process dying where it is raised."""


class CrashOnce(Ledger):
    """Dies right after the ``at``-th execution is on the ledger (once)."""

    def __init__(self, path: Path, at: int) -> None:
        super().__init__(path)
        self.at = at

    def _append(self, line: str) -> None:
        super()._append(line)
        if len(self.lines()) == self.at + 1:
            raise Crash


def timeless(steps: tuple[StepRecord, ...]) -> list[StepRecord]:
    return [
        dataclasses.replace(
            s, step_wall_ms=0, model_ms=0 if s.model_ms is not None else None, action_ms=None
        )
        for s in steps
    ]


@pytest.fixture(params=["jsonl", "volatile", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunStore]:
    if request.param == "jsonl":
        yield JsonlRunStore(directory=tmp_path / "runs")
    elif request.param == "volatile":
        yield VolatileRunStore()
    else:
        database = request.getfixturevalue("postgres_database")
        opened = await PostgresRunStore.open(database, pool_size=2)
        try:
            yield opened
        finally:
            await opened.close()


async def test_a_crashed_tree_ends_equal_to_the_uninterrupted_one_on_every_store(
    store: RunStore, tmp_path: Path
) -> None:
    reference_store = VolatileRunStore()
    reference = Tree(TreeModel(), reference_store, Ledger(tmp_path / "ref.txt"), steps=40)
    await run_or_resume(reference.definition, reference.request("root"))
    # The third execution is the first leaf's `note` (NEVER): in doubt after the crash, settled
    # by the ledger's reconciler when the root's resume reaches it.
    ledger = tmp_path / "ledger.txt"
    first = Tree(TreeModel(), store, CrashOnce(ledger, 2), steps=40)
    with pytest.raises(Crash):
        await run_or_resume(first.definition, first.request("root"))
    tree = Tree(TreeModel(), store, Ledger(ledger), steps=40)
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    logs = {run_id: await store.read_log(run_id) for run_id in TREE}
    for run_id in TREE:
        expected = (await reference_store.read_log(run_id)).finished
        finished = logs[run_id].finished
        assert expected is not None
        assert finished is not None
        assert timeless(finished.result.steps) == timeless(expected.result.steps), run_id
        started = logs[run_id].started
        assert started is not None
        assert (started.parent is None) == (run_id == "root")
    assert logs["root.a1.a3"].started.parent.depth == 2  # type: ignore[union-attr]
    assert check_tree(logs) == ()
    notes = [line[0] for line in Ledger(ledger).lines() if line[1] == "note"]
    assert sorted(notes) == sorted(TREE)
