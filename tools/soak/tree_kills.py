"""The tree kill storm (issue 38, design 0245): three-level trees of runs SIGKILLed at random
moments, restarted until they end, then judged.

::

    python -m tools.soak.tree_kills --trees 100 --kills-per-tree 10 --dir tree-storm \\
        [--seed 3838] [--min-kills N]

Each tree (``tools.soak.trees``: a root with two children, each with two children; ``NEVER``,
``IDEMPOTENT`` and ``SAFE`` tools at every level) is driven by ``tools.soak.tree_child``
processes: each is SIGKILLed after a random delay drawn within what is left of a typical
attempt (learnt from the attempts that ran a whole tree, scaled by the model calls still to
make), at most ``--kills-per-tree`` times, then one runs unkilled to the end. A ``NEVER``
call left in doubt by a kill is settled from the ledger by the tool's reconciler when the
root's resume reaches it. The verdict, per tree:

* every ``NEVER`` effect executed exactly once (the fsynced ledger);
* no model call for a run made by an attempt that began after that run had finished;
* every run of the tree finished, the root with its final answer, the links whole
  (``check_tree``);
* each run's trajectory equal to the uninterrupted tree's (timings aside).

Prints the figures and every violation, one line each; exits 1 when there is any. The test
suite runs ``storm`` at a CI size (``tests/integration/test_tree_kill.py``); the figure and
its command are in ``research-wiki/reference/reliability.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from polyloop.ports import RunLog
from polyloop.session import check_tree, run_or_resume
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import SettlementSource, StepRecord, StopReason
from tools.soak.trees import Ledger, Tree, TreeModel

TREE_CALLS = 34
"""Model calls of a whole tree: 6 at the root, 6 in each child, 4 in each of four leaves."""
UNKILLED_SECONDS = 120.0


def tree_ids(root: str) -> tuple[str, ...]:
    """The seven runs of the tree ``root``."""
    children = (f"{root}.a1", f"{root}.a3")
    return (root, *children, *(f"{c}.a{k}" for c in children for k in (1, 3)))


def timeless(steps: tuple[StepRecord, ...]) -> list[StepRecord]:
    return [
        dataclasses.replace(
            s, step_wall_ms=0, model_ms=None if s.model_ms is None else 0, action_ms=None
        )
        for s in steps
    ]


@dataclasses.dataclass
class Figures:
    """What the storm went through, and what it found."""

    trees: int = 0
    kills: int = 0
    attempts: int = 0
    in_doubt_settled: int = 0
    violations: list[str] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"trees {self.trees}, attempts {self.attempts}, SIGKILLs {self.kills}, NEVER calls "
            f"settled from the ledger {self.in_doubt_settled}, violations "
            f"{len(self.violations)}",
            *self.violations,
        ]


async def _logs(store: JsonlRunStore | VolatileRunStore, root: str) -> dict[str, RunLog]:
    found = {run_id: await store.read_log(run_id) for run_id in tree_ids(root)}
    return {run_id: log for run_id, log in found.items() if not log.is_empty}


async def _reference(directory: Path, root: str) -> dict[str, RunLog]:
    """The uninterrupted tree ``root``, in memory."""
    store = VolatileRunStore()
    tree = Tree(TreeModel(), store, Ledger(directory / f"reference-{root}.txt"), steps=40)
    await run_or_resume(tree.definition, tree.request(root))
    return await _logs(store, root)


def _attempt(directory: Path, root: str, attempt: str, kill_after: float | None) -> bool:
    """One child process; True when it ended the tree, False when it was killed."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tools.soak.tree_child", str(directory), root, attempt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    ready = child.stdout.readline()
    if ready != b"READY\n":
        child.kill()
        _, err = child.communicate()
        raise RuntimeError(f"tree {root}: the child did not start: {ready!r} {err.decode()}")
    try:
        out, err = child.communicate(timeout=UNKILLED_SECONDS if kill_after is None else kill_after)
    except subprocess.TimeoutExpired:
        if kill_after is None:
            child.kill()
            child.communicate()
            raise RuntimeError(f"tree {root}: an unkilled attempt did not end") from None
        child.send_signal(signal.SIGKILL)
        child.communicate()
        return False
    if child.returncode != 0 or not out.startswith(b"DONE "):
        raise RuntimeError(f"tree {root}: the child failed: {out!r} {err.decode()}")
    return True


def _judge(
    figures: Figures, root: str, directory: Path, reference: dict[str, RunLog], calls_ok: bool
) -> None:
    logs = asyncio.run(_logs(JsonlRunStore(directory=directory / "runs"), root))
    ledger = Ledger(directory / "ledger.txt").lines()
    notes = collections.Counter(line[0] for line in ledger if line[1] == "note")
    for run_id in tree_ids(root):
        log = logs.get(run_id)
        if log is None or log.finished is None:
            figures.violations.append(f"{run_id}: not brought to its end")
            continue
        expected = reference[run_id].finished
        assert expected is not None
        if timeless(log.finished.result.steps) != timeless(expected.result.steps):
            figures.violations.append(f"{run_id}: its trajectory differs from the uninterrupted")
        if notes[run_id] != 1:
            figures.violations.append(f"{run_id}: its NEVER tool ran {notes[run_id]} times")
        figures.in_doubt_settled += sum(
            1 for s in log.settlements if s.source is SettlementSource.RECONCILER
        )
    root_log = logs.get(root)
    if (
        root_log is None
        or root_log.finished is None
        or (root_log.finished.result.stop_reason is not StopReason.FINAL_ANSWER)
    ):
        figures.violations.append(f"{root}: the root did not end with its final answer")
    figures.violations += [f"{root}: {problem}" for problem in check_tree(logs)]
    if not calls_ok:
        figures.violations.append(f"{root}: a finished run made a model call")


def _finished(directory: Path, root: str) -> set[str]:
    logs = asyncio.run(_logs(JsonlRunStore(directory=directory / "runs"), root))
    return {run_id for run_id, log in logs.items() if log.finished is not None}


def _calls_after_finish(directory: Path, attempt: str, finished: set[str]) -> bool:
    """Whether attempt ``attempt`` made no model call for a run in ``finished``."""
    path = directory / "calls.txt"
    lines = path.read_text("utf-8").splitlines() if path.exists() else []
    return not any(
        parts[0] == attempt and parts[1] in finished for parts in (line.split() for line in lines)
    )


def _calls_made(directory: Path) -> int:
    """How many of the tree's model calls were made so far (each counted once)."""
    path = directory / "calls.txt"
    lines = path.read_text("utf-8").splitlines() if path.exists() else []
    return len({tuple(line.split()[1:]) for line in lines})


def storm(
    directory: Path, *, trees: int, kills_per_tree: int, seed: int, min_kills: int = 0
) -> Figures:
    """Run the storm in ``directory`` (the trees' ids are ``tree-<seed>-<n>``): ``trees``
    trees, and more (up to ten times as many) until ``min_kills`` SIGKILLs landed, since an
    attempt that ends before its kill is drawn kills nothing (a fast machine, a short rest)."""
    rng = random.Random(seed)
    figures = Figures()
    pace = 0.5  # seconds an attempt at a whole tree takes, learnt from the unkilled ones
    number = -1
    while figures.trees < trees or (figures.kills < min_kills and figures.trees < 10 * trees):
        number += 1
        root = f"tree-{seed}-{number}"
        place = directory / root
        place.mkdir(parents=True, exist_ok=True)
        reference = asyncio.run(_reference(place, root))
        calls_ok = True
        kills = 0
        while True:
            attempt = f"{root}:{figures.attempts}"
            figures.attempts += 1
            finished = _finished(place, root)
            left = pace * max(0.15, 1.0 - _calls_made(place) / TREE_CALLS)
            kill_after = rng.uniform(0.0, left) if kills < kills_per_tree else None
            began = time.monotonic()
            ended = _attempt(place, root, attempt, kill_after)
            calls_ok = calls_ok and _calls_after_finish(place, attempt, finished)
            if ended:
                if not finished:  # the whole tree in one attempt: the pace of a tree
                    pace = max(0.2, time.monotonic() - began)
                break
            kills += 1
            figures.kills += 1
        figures.trees += 1
        _judge(figures, root, place, reference, calls_ok)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.soak.tree_kills")
    parser.add_argument("--trees", type=int, required=True)
    parser.add_argument("--kills-per-tree", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=3838)
    parser.add_argument("--min-kills", type=int, default=0)
    args = parser.parse_args(argv)
    figures = storm(
        args.dir,
        trees=args.trees,
        kills_per_tree=args.kills_per_tree,
        seed=args.seed,
        min_kills=args.min_kills,
    )
    for line in figures.lines():
        print(line)
    return 1 if figures.violations else 0


if __name__ == "__main__":
    sys.exit(main())
