"""A tree of runs on every shipped store (issue 38, design 0245): the same tree, crashed in a
leaf's NEVER call and resumed from the root, ends equal to the uninterrupted tree on the
JSONL, in-memory and PostgreSQL stores, its links (schema 1.9: ``RunStarted.parent``,
``StepRecord.child``) read back as written and whole."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from _trees import CHILD_TOOL, Ledger, Tree, TreeModel
from polyloop.agent import child_tool
from polyloop.errors import RunLeaseLostError
from polyloop.ports import RunStore
from polyloop.session import AgentDefinition, check_tree, run_or_resume
from polyloop.stores import JsonlRunStore, PostgresRunStore, VolatileRunStore
from polyloop.tools import ToolRegistry
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


def _recording(store: RunStore) -> dict[str, Any]:
    """Make ``store`` remember the last lease granted per run id (the dict returned), so a
    test can take a run's lease away from its holder as an expiry or a takeover would."""
    leases: dict[str, Any] = {}

    class Recording(type(store)):  # type: ignore[misc]
        __slots__ = ()

        async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> Any:
            lease = await super().acquire_lease(run_id, wait_seconds=wait_seconds)
            leases[run_id] = lease
            return lease

    store.__class__ = Recording
    return leases


async def test_a_holder_that_lost_the_parents_lease_starts_no_child(
    store: RunStore, tmp_path: Path
) -> None:
    """Issue 38: a child started by a lost parent lease is refused, fenced like every write.
    The root's lease is lost (released, and granted to another holder) while the root's call
    of the child tool runs: the stale holder's call raises ``RunLeaseLostError`` before the
    child's log exists, the call stays open on the root's record; once the new holder lets go,
    the root resumes and starts the child once."""
    leases = _recording(store)
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "ledger.txt"), steps=40)
    taken: list[Any] = []
    real = tree.definition

    async def taken_over() -> AgentDefinition:
        if not taken:  # the first child call: the root's lease goes to another holder
            await leases["root"].release()
            taken.append(await store.acquire_lease("root"))  # type: ignore[attr-defined]
        return real

    spec = child_tool(
        taken_over,
        lambda arguments, run_id: tree.request(run_id, str(arguments["task"])),
        name=CHILD_TOOL,
        description="hand a task to a sub-agent",
    )
    level = tree.tools(0)
    plain = [level.spec_for(name) for name in level.names() if name != CHILD_TOOL]
    tools = ToolRegistry([*(s for s in plain if s is not None), spec])
    with pytest.raises(RunLeaseLostError):
        await run_or_resume(
            real,
            dataclasses.replace(
                tree.request("root"), tools=tools, action_executor=tools.executor()
            ),
        )
    assert (await store.read_log("root.a1")).is_empty  # the stale holder started nothing
    root = await store.read_log("root")
    assert [i.result_id for i in root.intents][-1] == "a1"  # the call is open on record
    assert root.finished is None
    await taken[0].release()
    result = await run_or_resume(
        real,
        dataclasses.replace(tree.request("root"), tools=tools, action_executor=tools.executor()),
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[1].child is not None
    assert result.steps[1].child.run_id == "root.a1"
