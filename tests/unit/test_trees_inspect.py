"""Trees of runs in the inspector (issue 38, design 0245): ``approvals`` lists a request two
levels down from the root's place with its tree path, ``approve`` writes into the child and
resuming the root runs the call once; ``verify`` checks the links; ``ls`` and ``show`` say
where each run sits. On a ``JsonlRunStore``, as a person would use it."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from _trees import Ledger, Tree, TreeModel
from polyloop.inspect import main
from polyloop.session import run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.types import StopReason

pytestmark = pytest.mark.unit


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def approval_tree(directory: Path, ledger: Ledger) -> Tree:
    return Tree(
        TreeModel(),
        JsonlRunStore(directory=directory),
        ledger,
        steps=40,
        note_options={"needs_approval": True},
        note_level=2,
    )


def test_an_approval_two_levels_down_is_listed_from_the_root_place_and_approved_by_cli(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    ledger = Ledger(tmp_path / "ledger.txt")
    tree = approval_tree(runs, ledger)
    result = asyncio.run(run_or_resume(tree.definition, tree.request("root")))
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    code, out, _ = cli("approvals", str(runs))
    assert code == 0
    assert "run root.a1.a1" in out
    assert "tree: root > root.a1 > root.a1.a1 (resume the root, root)" in out
    assert "1 call waits for approval" in out
    code, out, _ = cli("approvals", str(runs), "--json")
    (listed,) = json.loads(out)
    assert listed["tree_path"] == ["root", "root.a1", "root.a1.a1"]
    code, out, err = cli(
        "approve", str(runs), "--run-id", "root.a1.a1", "--digest", listed["digest"], "--by", "ops"
    )
    assert code == 0, err
    assert [line for line in ledger.lines() if line[1] == "note" and line[0] == "root.a1.a1"] == []
    again = approval_tree(runs, ledger)
    result = asyncio.run(run_or_resume(again.definition, again.request("root")))
    assert result.stop_reason is StopReason.AWAITING_APPROVAL  # the next leaf asks now
    assert result.pending_approval is not None
    assert result.pending_approval.run_id == "root.a1.a3"
    notes = [line for line in ledger.lines() if line[1] == "note" and line[0] == "root.a1.a1"]
    assert len(notes) == 1  # the approved call ran, once


def test_verify_ls_and_show_see_the_tree(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tree = Tree(TreeModel(), JsonlRunStore(directory=runs), Ledger(tmp_path / "l.txt"), steps=40)
    asyncio.run(run_or_resume(tree.definition, tree.request("root")))
    code, out, _ = cli("verify", str(runs))
    assert code == 0
    assert out.endswith("verified 7 logs: 0 breached\n")
    code, out, _ = cli("ls", str(runs))
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["run"].endswith("tree")
    assert lines["root"].endswith("2 children")
    assert lines["root.a1.a3"].endswith("0 children, under root.a1")
    code, out, _ = cli("ls", str(runs), "--roots")
    assert [line.split()[0] for line in out.splitlines()] == ["run", "root"]
    assert out.splitlines()[1].endswith("2 children")
    code, out, _ = cli("ls", str(runs), "--json")
    listed = {run["run_id"]: run for run in json.loads(out)}
    assert listed["root"]["children"] == ["root.a1", "root.a3"]
    assert listed["root.a3"]["parent"] == "root"
    code, out, _ = cli("show", str(runs / "root.a1.jsonl"))
    assert "parent: root, step 1 (depth 1)" in out
    assert "child: root.a1.a3 (step 3): final_answer, 4 steps and 60 tokens" in out
    # A child whose parent is gone is a broken link.
    (runs / "root.jsonl").unlink()
    code, out, _ = cli("verify", str(runs))
    assert code != 0
    assert "BREACH  tree: run root.a1: its parent root is not in the store" in out


def test_the_viewer_links_parent_and_children_both_ways(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tree = Tree(TreeModel(), JsonlRunStore(directory=runs), Ledger(tmp_path / "l.txt"), steps=40)
    asyncio.run(run_or_resume(tree.definition, tree.request("root")))
    page = tmp_path / "runs.html"
    code, _, err = cli("html", str(runs), "-o", str(page))
    assert code == 0, err
    html = page.read_text(encoding="utf-8")
    assert '<a class="tree-child" href="#run-root.a1">root.a1</a>' in html
    assert '<a class="tree-parent" href="#run-root.a1">root.a1</a> (step 3, depth 2)' in html
    assert 'id="run-root.a1.a3"' in html  # the link's target exists


def test_frozen_1_8_logs_read_as_runs_outside_any_tree() -> None:
    """Schema 1.9 adds the links as optional fields: a 1.8 log reads with none, its place
    verifies whole, and ``ls`` shows no tree column for it."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "logs-1.8"
    store = JsonlRunStore(directory=fixtures)
    ids = [path.stem for path in sorted(fixtures.glob("*.jsonl"))]
    logs = {run_id: asyncio.run(store.read_log(run_id)) for run_id in ids}
    assert all(log.started is not None and log.started.parent is None for log in logs.values())
    assert all(c.step.child is None for log in logs.values() for c in log.steps)
    code, out, _ = cli("verify", str(fixtures))
    assert code == 0
    assert "broken links" not in out
    code, out, _ = cli("ls", str(fixtures))
    assert not out.splitlines()[0].endswith("tree")


def test_show_tree_prints_the_tree_under_a_run_with_what_waits_below(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tree = approval_tree(runs, Ledger(tmp_path / "l.txt"))
    asyncio.run(run_or_resume(tree.definition, tree.request("root")))
    code, out, err = cli("show", str(runs), "--run", "root", "--tree")
    assert code == 0, err
    tail = out.split("\ntree:\n", 1)[1].splitlines()
    assert tail == [
        "  root  unfinished  1 steps; subtree 1 steps, 15 tokens",
        "    root.a1  unfinished  1 steps; subtree 1 steps, 15 tokens",
        "      root.a1.a1  unfinished  0 steps; subtree 0 steps, 0 tokens",
    ]


def test_show_names_the_limit_and_the_call_of_a_tree_limit_stop(tmp_path: Path) -> None:
    """A run stopped by ``max_children`` (design 0245): ``show`` prints the stop reason with
    which limit and which call; ``verify`` finds the log whole (the refused call's intent is
    unanswered, as ``tree_limit`` allows)."""
    runs = tmp_path / "runs"
    store = JsonlRunStore(directory=runs)
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "l.txt"), steps=40, max_children=1)
    result = asyncio.run(run_or_resume(tree.definition, tree.request("root")))
    assert result.stop_reason is StopReason.TREE_LIMIT
    code, out, _ = cli("verify", str(runs))
    assert code == 0, out
    code, out, _ = cli("show", str(runs / "root.jsonl"))
    assert (
        "stop reason: tree_limit (tool 'delegate': max_children 1 reached: run 'root' has "
        "started 1 child runs (call a3))"
    ) in out
