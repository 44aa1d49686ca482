"""Trees of runs (issue 38, design 0245): a child run is a tool, the link is on record both
ways, a crash anywhere resumes to the uninterrupted tree, budgets and limits hold for the
tree, what waits below stops the top, cancellation goes down the tree.

The trees are ``tests/_trees.py``'s: a root with two children, each with two children, and
``note`` (NEVER), ``bump`` (IDEMPOTENT), ``peek`` (SAFE) at every level.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from _trees import CHILD_TOOL, Ledger, Tree, TreeModel, script_for
from polyloop.agent import AgentResult, child_run_id, tree_totals
from polyloop.ports import ModelCall, RunLog, ToolContext
from polyloop.serialization import decode_run_result, encode
from polyloop.session import (
    approve,
    check_log,
    check_tree,
    continue_cancelled,
    reject,
    run_or_resume,
)
from polyloop.stores import VolatileRunStore
from polyloop.types import (
    ModelReply,
    ParentLink,
    RunFinished,
    RunResult,
    StepRecord,
    StopReason,
)

pytestmark = pytest.mark.unit

TREE = ("root", "root.a1", "root.a1.a1", "root.a1.a3", "root.a3", "root.a3.a1", "root.a3.a3")
TREE_STEPS = 34  # 6 at the root, 6 in each child, 4 in each of the four leaves


class Crash(BaseException):
    """A process dying where it is raised (it passes through the session untouched)."""


def timeless(steps: tuple[StepRecord, ...]) -> list[StepRecord]:
    return [
        dataclasses.replace(
            s,
            step_wall_ms=0,
            model_ms=None if s.model_ms is None else 0,
            action_ms=None,  # a step settled from the ledger has no executor time
        )
        for s in steps
    ]


async def logs_of(store: VolatileRunStore, ids: tuple[str, ...] = TREE) -> dict[str, RunLog]:
    logs = {run_id: await store.read_log(run_id) for run_id in ids}
    return {run_id: log for run_id, log in logs.items() if not log.is_empty}


async def whole_tree(tmp_path: Path) -> tuple[dict[str, RunLog], TreeModel, Ledger]:
    store = VolatileRunStore()
    model = TreeModel()
    ledger = Ledger(tmp_path / "reference-ledger.txt")
    tree = Tree(model, store, ledger, steps=40)
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    return await logs_of(store), model, ledger


async def test_a_child_run_is_a_tool_and_the_link_is_on_record_both_ways(tmp_path: Path) -> None:
    logs, model, ledger = await whole_tree(tmp_path)
    assert set(logs) == set(TREE)
    assert len(model.calls) == TREE_STEPS
    root = logs["root"]
    assert root.finished is not None
    steps = root.finished.result.steps
    # The parent's steps name their children; the observation is the child's final answer.
    assert [s.child.run_id if s.child else None for s in steps] == [
        None,
        "root.a1",
        None,
        "root.a3",
        None,
        None,
    ]
    assert steps[1].observation == "done root.a1"
    assert steps[1].child is not None
    assert steps[1].child.steps == 14
    assert steps[1].child.stop_reason is StopReason.FINAL_ANSWER
    assert tree_totals(steps).steps == TREE_STEPS
    # The children's starts name their parents: run, step, call key, depth.
    key = next(i.idempotency_key for i in root.intents if i.result_id == "a1")
    assert key is not None
    assert child_run_id(key) == "root.a1"
    assert logs["root.a1"].started is not None
    assert logs["root.a1"].started.parent == ParentLink(
        run_id="root", step_idx=1, idempotency_key=key, depth=1
    )
    leaf = logs["root.a3.a1"].started
    assert leaf is not None
    assert leaf.parent is not None
    assert (leaf.parent.run_id, leaf.parent.step_idx, leaf.parent.depth) == ("root.a3", 1, 2)
    assert check_tree(logs) == ()
    # Every tool at every level ran once.
    assert len(ledger.lines()) == 3 * len(TREE)


async def test_check_tree_names_a_child_whose_parent_does_not_name_it_back(
    tmp_path: Path,
) -> None:
    logs, _, _ = await whole_tree(tmp_path)
    orphan = dict(logs)
    del orphan["root"]
    assert any("root.a1: its parent root is not in the store" in p for p in check_tree(orphan))
    lost_child = dict(logs)
    del lost_child["root.a3.a3"]
    assert any("root.a3.a3, which is not in the store" in p for p in check_tree(lost_child))


async def test_running_a_finished_root_again_makes_no_model_call(tmp_path: Path) -> None:
    store = VolatileRunStore()
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "ledger.txt"), steps=40)
    first = await run_or_resume(tree.definition, tree.request("root"))
    calls = len(model.calls)
    again = await run_or_resume(tree.definition, tree.request("root"))
    assert len(model.calls) == calls == TREE_STEPS
    assert again == first


class CrashingModel(TreeModel):
    """Dies (``Crash``) when it receives its ``at``-th call, counted over the whole tree."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    async def call(self, call: ModelCall) -> ModelReply:
        if len(self.calls) == self.at:
            self.calls.append(call)
            raise Crash
        return await super().call(call)


class CrashingLedger(Ledger):
    """Dies right after its ``at``-th execution is on the ledger: the effect happened, the
    log does not know (a ``NEVER`` call is in doubt, settled by the ledger's reconciler)."""

    def __init__(self, path: Path, at: int) -> None:
        super().__init__(path)
        self.at = at

    def _append(self, line: str) -> None:
        super()._append(line)
        if len(self.lines()) == self.at + 1:
            raise Crash


@pytest.mark.parametrize("where", ["model", "tool"])
async def test_a_crash_anywhere_in_the_tree_resumes_to_the_uninterrupted_tree(
    tmp_path: Path, where: str
) -> None:
    reference, _, _ = await whole_tree(tmp_path)
    points = range(TREE_STEPS) if where == "model" else range(3 * len(TREE))
    for at in points:
        store = VolatileRunStore()
        ledger_path = tmp_path / f"{where}-{at}.txt"
        if where == "model":
            first = Tree(CrashingModel(at), store, Ledger(ledger_path), steps=40)
        else:
            first = Tree(TreeModel(), store, CrashingLedger(ledger_path, at), steps=40)
        with pytest.raises(Crash):
            await run_or_resume(first.definition, first.request("root"))
        finished_before = {
            r for r, log in (await logs_of(store)).items() if log.finished is not None
        }
        model = TreeModel()
        tree = Tree(model, store, Ledger(ledger_path), steps=40)
        result = await run_or_resume(tree.definition, tree.request("root"))
        assert result.stop_reason is StopReason.FINAL_ANSWER, (where, at)
        # 0 model calls by a child after it finished.
        assert not finished_before & {call.run_id for call in model.calls}, (where, at)
        logs = await logs_of(store)
        for run_id, log in reference.items():
            assert log.finished is not None
            assert logs[run_id].finished is not None
            assert timeless(logs[run_id].finished.result.steps) == timeless(
                log.finished.result.steps
            ), (where, at, run_id)
        # No NEVER effect twice; and a finished child made no model call after it finished.
        notes = [line[0] for line in Ledger(ledger_path).lines() if line[1] == "note"]
        assert sorted(notes) == sorted(TREE), (where, at)
        assert check_tree(logs) == ()


async def test_a_finished_child_is_never_run_again_when_its_parent_resumes(
    tmp_path: Path,
) -> None:
    """The crash lands in the root's step after its first child finished: the resumed root
    replays nothing of that child (0 model calls for it)."""
    store = VolatileRunStore()
    crash_at = 2 + 14  # the root's two calls, the first child's subtree: the root's third
    first = Tree(CrashingModel(crash_at), store, Ledger(tmp_path / "l.txt"), steps=40)
    with pytest.raises(Crash):
        await run_or_resume(first.definition, first.request("root"))
    assert (await store.read_log("root.a1")).finished is not None
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "l.txt"), steps=40)
    await run_or_resume(tree.definition, tree.request("root"))
    counted = collections.Counter(call.run_id for call in model.calls)
    assert not {"root.a1", "root.a1.a1", "root.a1.a3"} & set(counted)


@pytest.mark.parametrize("budget", [3, 5, 9, 12, 20])
async def test_a_tree_step_budget_bounds_every_run_of_the_tree(tmp_path: Path, budget: int) -> None:
    store = VolatileRunStore()
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "l.txt"), steps=budget)
    result = await run_or_resume(tree.definition, tree.request("root"))
    # One path of the tree runs at a time: at most one child in flight per level.
    assert len(model.calls) <= budget
    assert tree_totals(result.steps).steps == len(model.calls)
    assert result.stop_reason is StopReason.STEP_BUDGET
    logs = await logs_of(store)
    cut = [
        log.finished.result
        for run_id, log in logs.items()
        if run_id != "root" and log.finished is not None
    ]
    if budget < TREE_STEPS and cut:
        # A limit reached in a child stops the child with its own reason; the parent sees it.
        stopped = [r for r in cut if r.stop_reason is StopReason.STEP_BUDGET]
        assert stopped, [r.stop_reason for r in cut]
        assert check_tree(logs) == ()


async def test_a_tree_token_budget_bounds_the_tree(tmp_path: Path) -> None:
    store = VolatileRunStore()
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "l.txt"), steps=40, tokens=150)
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert tree_totals(result.steps).tokens <= 150
    assert len(model.calls) * 15 <= 150
    assert result.stop_reason is StopReason.TOKEN_BUDGET


async def test_max_depth_stops_the_calling_run_with_tree_limit(tmp_path: Path) -> None:
    """A call past ``max_depth`` starts nothing and finishes the calling run ``tree_limit``,
    its ``stop_detail`` naming the limit and the call; its parent reads that stop as the
    tool's outcome (a limit reached in a child stops the child) and goes on."""
    store = VolatileRunStore()
    ledger = Ledger(tmp_path / "l.txt")
    tree = Tree(TreeModel(), store, ledger, steps=40, max_depth=1)
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    logs = await logs_of(store)
    assert set(logs) == {"root", "root.a1", "root.a3"}  # no grandchild started
    for child_id in ("root.a1", "root.a3"):
        finished = logs[child_id].finished
        assert finished is not None
        child = finished.result
        assert child.stop_reason is StopReason.TREE_LIMIT
        assert child.stop_detail == (
            f"tool 'delegate': max_depth 1 reached: a child of run {child_id!r} would be at "
            "depth 2 (call a1)"
        )
        # Nothing after the refused call: its intent is the child's last execution, unanswered.
        assert len(child.steps) == 1
        assert [i.result_id for i in logs[child_id].intents][-1] == "a1"
        assert check_log(logs[child_id], child_id) is None
    assert result.steps[1].child is not None
    assert result.steps[1].child.stop_reason is StopReason.TREE_LIMIT
    assert "tree_limit" in result.steps[1].observation
    assert check_tree(logs) == ()
    decoded = decode_run_result(encode(logs["root.a1"].finished.result))
    assert decoded.stop_detail == logs["root.a1"].finished.result.stop_detail


async def test_max_children_stops_the_calling_run_with_tree_limit(tmp_path: Path) -> None:
    store = VolatileRunStore()
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "l.txt"), steps=40, max_children=1)
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.TREE_LIMIT
    assert result.stop_detail == (
        "tool 'delegate': max_children 1 reached: run 'root' has started 1 child runs (call a3)"
    )
    assert len(result.steps) == 3
    assert result.steps[1].child is not None
    assert (await store.read_log("root.a3")).is_empty  # nothing started
    summary = AgentResult(result=result, output=None).summary()
    assert result.stop_detail in summary


class _CrashAtTreeLimitFinish(VolatileRunStore):
    """Dies (``Crash``) once, writing the first ``tree_limit`` finish."""

    crashed = False

    async def write_fenced(self, lease: Any, line: bytes, kind: type[Any]) -> None:
        if kind is RunFinished and b"tree_limit" in line and not self.crashed:
            self.crashed = True
            raise Crash
        await super().write_fenced(lease, line, kind)


async def test_a_crash_before_the_tree_limit_finish_resumes_to_the_same_finish(
    tmp_path: Path,
) -> None:
    """The crash falls in the child ``root.a1`` between its refused call's intent and its
    finish: resuming the root replays the root's call, which resumes the child, whose
    replayed call is refused again (the limit is read from the log)."""
    reference_model = TreeModel()
    reference_store = VolatileRunStore()
    reference = Tree(reference_model, reference_store, Ledger(tmp_path / "r.txt"), max_children=1)
    expected = await run_or_resume(reference.definition, reference.request("root"))
    store = _CrashAtTreeLimitFinish()
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "l.txt"), max_children=1)
    with pytest.raises(Crash):
        await run_or_resume(tree.definition, tree.request("root"))
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert len(model.calls) == len(reference_model.calls)  # no model call made twice
    child = (await store.read_log("root.a1")).finished
    assert child is not None
    assert child.result.stop_reason is StopReason.TREE_LIMIT
    assert child.result.stop_detail == (
        (await reference_store.read_log("root.a1")).finished.result.stop_detail  # type: ignore[union-attr]
    )
    assert result.stop_reason is StopReason.TREE_LIMIT
    assert result.stop_detail == expected.stop_detail
    assert timeless(result.steps) == timeless(expected.steps)
    assert (await store.read_log("root.a3")).is_empty


async def _settle_all(store: VolatileRunStore, tree: Tree, decide: str) -> list[RunResult]:
    """Run the root; while it stops awaiting approval, decide the call (approve, or reject
    the first and approve the rest) where it waits, then resume the root."""
    stops = []
    result = await run_or_resume(tree.definition, tree.request("root"))
    while result.stop_reason is StopReason.AWAITING_APPROVAL:
        stops.append(result)
        pending = result.pending_approval
        assert pending is not None
        if decide == "reject" and len(stops) == 1:
            await reject(store, pending.run_id, digest=pending.digest, by="ops", reason="no")
        else:
            await approve(store, pending.run_id, digest=pending.digest, by="ops")
        result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    stops.append(result)
    return stops


@pytest.mark.parametrize("decide", ["approve", "reject"])
async def test_an_approval_two_levels_down_stops_the_root_and_runs_once(
    tmp_path: Path, decide: str
) -> None:
    store = VolatileRunStore()
    ledger = Ledger(tmp_path / "l.txt")
    tree = Tree(
        TreeModel(), store, ledger, steps=40, note_options={"needs_approval": True}, note_level=2
    )
    first = await run_or_resume(tree.definition, tree.request("root"))
    assert first.stop_reason is StopReason.AWAITING_APPROVAL
    assert first.pending_approval is not None
    assert first.pending_approval.run_id == "root.a1.a1"
    for run_id in ("root", "root.a1", "root.a1.a1"):
        assert (await store.read_log(run_id)).finished is None  # left open, all the way up
    stops = await _settle_all(store, tree, decide)
    waited = [s.pending_approval.run_id for s in stops[:-1] if s.pending_approval]
    assert waited == ["root.a1.a1", "root.a1.a3", "root.a3.a1", "root.a3.a3"]
    notes = collections.Counter(line[0] for line in ledger.lines() if line[1] == "note")
    leaves = {"root.a1.a1", "root.a1.a3", "root.a3.a1", "root.a3.a3"}
    expected = {r: 1 for r in TREE if decide == "approve" or r != "root.a1.a1"}
    assert notes == expected
    assert leaves - set(notes) == (set() if decide == "approve" else {"root.a1.a1"})
    assert check_tree(await logs_of(store)) == ()


class HoldingModel(TreeModel):
    """Holds the leaf ``root.a1.a1``'s first call until cancelled; says when it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()

    async def call(self, call: ModelCall) -> ModelReply:
        if call.run_id == "root.a1.a1" and call.call_index == 0:
            self.holding.set()
            await asyncio.Event().wait()
        return await super().call(call)


async def test_cancelling_the_root_cancels_every_running_child_and_continuing_it_ends_the_tree(
    tmp_path: Path,
) -> None:
    store = VolatileRunStore()
    ledger = Ledger(tmp_path / "l.txt")
    model = HoldingModel()
    tree = Tree(model, store, ledger, steps=40)
    task = asyncio.ensure_future(run_or_resume(tree.definition, tree.request("root")))
    await model.holding.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for run_id in ("root", "root.a1", "root.a1.a1"):
        finished = (await store.read_log(run_id)).finished
        assert finished is not None, run_id
        assert finished.result.stop_reason is StopReason.CANCELLED, run_id
    # Continuing the root continues the cancelled children, each under <id>-c.
    again = Tree(TreeModel(), store, ledger, steps=40)
    result = await continue_cancelled(
        again.definition, again.request("root-2"), cancelled_run_id="root"
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[1].child is not None
    assert result.steps[1].child.run_id == "root.a1-c"
    notes = collections.Counter(line[0] for line in ledger.lines() if line[1] == "note")
    assert all(count == 1 for count in notes.values()), notes
    assert notes["root.a1.a1-c"] == 1
    assert "root.a1.a1" not in notes
    cancelled = ("root", "root.a1", "root.a1.a1")
    continued = ("root-2", "root.a1-c", "root.a1.a1-c", "root.a1-c.a3")
    fresh = ("root-2.a3", "root-2.a3.a1", "root-2.a3.a3")
    logs = await logs_of(store, (*TREE, *continued, *fresh))
    assert set(logs) == {*cancelled, *continued, *fresh}
    assert check_tree(logs) == ()


def test_the_scripts_depend_on_the_level_only() -> None:
    assert script_for("root.a1")[:-1] == script_for("root.a3")[:-1]
    assert len(script_for("root")) == 6
    assert len(script_for("root.a1.a3")) == 4


async def test_a_child_tool_outside_a_tree_store_says_where_the_parent_log_is_missing(
    tmp_path: Path,
) -> None:
    tree = Tree(TreeModel(), VolatileRunStore(), Ledger(tmp_path / "l.txt"), steps=40)
    spec = tree.tools(0).spec_for(CHILD_TOOL)
    assert spec is not None
    assert spec.handler is not None
    context = ToolContext(idempotency_key="polyloop:r:nowhere:a0", run_id="nowhere", step_idx=0)
    with pytest.raises(Exception, match="has no log in the child's store"):
        await spec.handler({"task": "x"}, context)  # type: ignore[call-arg]


async def test_a_child_held_by_another_holder_leaves_the_parent_call_open(
    tmp_path: Path,
) -> None:
    """A parent taken over while its old holder still runs the child: the new holder's call
    waits for the child's lease (here: not at all), then ``RunLeaseHeldError`` leaves the
    parent's call open on record, never an executed call; the next attempt re-attaches."""
    from polyloop.errors import RunLeaseHeldError

    store = VolatileRunStore()
    ledger = Ledger(tmp_path / "l.txt")
    tree = Tree(TreeModel(), store, ledger, steps=40, lease_wait_seconds=0.0)
    held = await store.acquire_lease("root.a1")
    with pytest.raises(RunLeaseHeldError):
        await run_or_resume(tree.definition, tree.request("root"))
    root = await store.read_log("root")
    assert [c.step.step_idx for c in root.steps] == [0]  # step 1's call stays open
    assert any(i.result_id == "a1" for i in root.intents)
    await held.release()
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[1].child is not None
    assert result.steps[1].child.run_id == "root.a1"
    assert check_tree(await logs_of(store)) == ()


async def test_agent_as_tool_runs_a_child_agent_whose_typed_answer_is_the_observation(
    tmp_path: Path,
) -> None:
    from polyloop import Agent, tool
    from polyloop.parsers import JsonToolCallParser
    from polyloop.testing import ScriptedModelClient
    from polyloop.types import ReplayPolicy

    @dataclasses.dataclass
    class Census:
        city: str
        people: int

    @tool(replay="safe")
    async def population(city: str) -> str:
        """How many people live in a city."""
        return "522000"

    store = VolatileRunStore()
    researcher = Agent(
        ScriptedModelClient(
            [
                '{"tool": "population", "arguments": {"city": "Lyon"}}',
                '{"tool": "final_result", "arguments": {"city": "Lyon", "people": 522000}}',
            ]
        ),
        parser=JsonToolCallParser(),
        tools=[population],
        output_type=Census,
        store=store,
    )
    spec = researcher.as_tool("research", "Ask the researcher.", max_depth=1)
    assert spec.replay_policy is ReplayPolicy.IDEMPOTENT
    assert list(spec.parameters["required"]) == ["task"]  # type: ignore[call-overload]
    coordinator = Agent(
        ScriptedModelClient(
            [
                '{"tool": "research", "arguments": {"task": "People in Lyon?"}}',
                '{"final_answer": "522,000"}',
            ]
        ),
        parser=JsonToolCallParser(),
        tools=[spec],
        store=store,
    )
    result = await coordinator.run("How many people live in Lyon?", run_id="trip")
    assert result.output == "522,000"
    assert result.steps[0].child is not None
    assert result.steps[0].child.run_id == "trip.a0"
    assert json.loads(result.steps[0].observation) == {"city": "Lyon", "people": 522000}
    child = await store.read_log("trip.a0")
    assert child.started is not None
    assert child.started.parent is not None
    assert child.started.parent.max_depth == 1


async def test_a_tree_cost_budget_bounds_the_tree(tmp_path: Path) -> None:
    """With cost on record (design 0236), a root's ``max_cost`` counts its children's cost:
    each call costs 15 here, so a budget of 150 ends the tree within 150."""
    import decimal

    store = VolatileRunStore()
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "l.txt"), steps=40, cost=decimal.Decimal(150))
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert tree_totals(result.steps).cost <= 150
    assert len(model.calls) * 15 <= 150
    children = [s.child for s in result.steps if s.child is not None]
    assert children
    assert all(c.cost is not None and c.cost == 15 * c.steps for c in children)
    # A limit reached in a child stops the child with its own reason.
    assert StopReason.COST_BUDGET in {c.stop_reason for c in children}


async def test_a_fork_of_a_root_shares_the_children_of_its_copied_steps(tmp_path: Path) -> None:
    """A fork (design 0239) of a tree's root after its first child: the copied step names that
    child (no second child, no model call for it), later calls start the fork's own children,
    and the links of every run check whole (a copy names the children of its source)."""
    from polyloop.session import run_fork

    store = VolatileRunStore()
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "l.txt"), steps=40)
    await run_or_resume(tree.definition, tree.request("root"))
    model = TreeModel()
    again = Tree(model, store, Ledger(tmp_path / "l.txt"), steps=40)
    result = await run_fork(again.definition, again.request("twin"), source_run_id="root", at=2)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[1].child is not None
    assert result.steps[1].child.run_id == "root.a1"  # the source's child, shared
    assert result.steps[3].child is not None
    assert result.steps[3].child.run_id == "twin.a3"  # the fork's own
    assert not {"root.a1", "root.a1.a1", "root.a1.a3"} & {c.run_id for c in model.calls}
    ids = (*TREE, "twin", "twin.a3", "twin.a3.a1", "twin.a3.a3")
    assert check_tree(await logs_of(store, ids)) == ()


async def test_a_run_of_another_tree_under_a_child_id_is_never_adopted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Found in review: child ids are '<parent>.<call>', so a top-level run named 'root.a1' in
    # the tree's store was taken for root's first child: its stored answer became root's
    # observation (or, unfinished, it was resumed under root's call), no child ever started.
    store = VolatileRunStore()
    model = TreeModel()
    tree = Tree(model, store, Ledger(tmp_path / "ledger.txt"), steps=40)
    stranger = await run_or_resume(tree.definition, tree.request("root.a1", "another job"))
    assert stranger.stop_reason is StopReason.FINAL_ANSWER
    calls = len(model.calls)
    result = await run_or_resume(tree.definition, tree.request("root"))
    assert result.stop_reason is StopReason.ENV_ERROR
    assert result.steps[-1].observation == "[env]"  # the tree's env_failed template
    [refused] = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert "child run id 'root.a1'" in str(refused)
    assert "taken in the store by a run of no parent" in str(refused)
    assert all(step.child is None for step in result.steps)
    assert len(model.calls) - calls == 2, "root's two steps; nothing ran for root.a1"
    again = await store.read_log("root.a1")
    assert again.started is not None
    assert again.started.parent is None
    assert again.finished is not None
    assert again.finished.result.steps == stranger.steps


async def test_check_tree_reads_each_runs_lineage_once_not_once_per_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found in review: each child's "names it back" check walked the lineage of every run of
    # the place, so `verify` of a store of n runs did about n * n / 2 walks (840,400 for
    # 1,400 runs; hours for a store of 100,000).
    from polyloop import _recovery

    store = VolatileRunStore()
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "ledger.txt"), steps=40)
    for n in range(6):
        await run_or_resume(tree.definition, tree.request(f"t{n}"))
    logs = {run_id: await store.read_log(run_id) for run_id in list(store._lines)}
    assert len(logs) == 6 * len(TREE)
    walks = 0
    walk = _recovery._lineage

    def counted(of: Any, run_id: str) -> set[str]:
        nonlocal walks
        walks += 1
        return walk(of, run_id)

    monkeypatch.setattr(_recovery, "_lineage", counted)
    assert check_tree(logs) == ()
    assert walks == len(logs)
