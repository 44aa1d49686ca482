"""No test asserts on a wall-clock duration it measured (issue 34, item 7).

A test that asserts "this took under a second" measures the machine, not the code: on a
loaded machine it fails (issue 34 saw ``ls`` of 1,000 runs take 1.96 s at load 6.9 on 0.70 s of
CPU). Speed belongs in ``tools/bench/``, with the command next to the figure. A test binds the
behaviour instead: a CPU-time bound (``resource.getrusage``, ``time.process_time``), a count
(statements, calls, loop turns), or an order of events (``tests/_ordering.py``: the library's
error comes after a timer of its bound, or before a guard).

What this scan refuses, in every ``.py`` file under ``tests/``: an ``assert`` whose test
compares a *duration read off a wall clock*: an expression that subtracts a clock reading
(``time.monotonic()``, ``time.perf_counter()``, ``time.time()``, their ``_ns`` forms,
``loop.time()``, ``datetime.now()``) or a name that holds one, or a name (or list) that was
given such a difference. Both directions count: ``elapsed < 1.0`` and ``elapsed >= 0.2``.

What it allows, since none of it asserts a duration:

* a bounded wait that turns a hang into a failure: ``asyncio.wait_for(x, 30)``,
  ``asyncio.timeout(...)``, ``subprocess.run(..., timeout=60)``, and a polling loop's guard
  ``assert time.monotonic() < deadline`` (a clock reading against a deadline, no difference);
* a time budget that decides how many cases a fuzz or kill test tries (a ``while`` test, not
  an ``assert``), and durations computed to pace a test or to print;
* the durations the library records (``duration_ms``, ``step_wall_ms``): fields of a log, not
  the test's own clock.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from _ordering import Alarm

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]

_CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
"""Functions of ``time`` (or of a loop, for ``time``) that read a wall clock."""


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or node.args or node.keywords:
        return False
    func = node.func
    if isinstance(func, ast.Name):  # from time import monotonic
        return func.id in _CLOCKS - {"time"}
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr in {"now", "utcnow"}:
        return isinstance(func.value, ast.Name) and func.value.id == "datetime"
    return func.attr in _CLOCKS


def _key(target: ast.AST) -> str | None:
    """The name an assignment binds (``x``, ``self.x`` as ``.x``)."""
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return "." + target.attr
    return None


class _Clocks:
    """The names of one file that hold a clock reading (points) or a difference of one
    (durations), found by propagating through assignments until nothing changes."""

    def __init__(self, tree: ast.AST) -> None:
        self.points: set[str] = set()
        self.durations: set[str] = set()
        flows = list(_flows(tree))
        changed = True
        while changed:
            changed = False
            for name, value in flows:
                if name not in self.durations and self.has_duration(value):
                    self.durations.add(name)
                    changed = True
                elif name not in self.points and self.has_point(value):
                    self.points.add(name)
                    changed = True

    def _named(self, node: ast.AST, names: set[str]) -> bool:
        key = _key(node) if isinstance(node, ast.Name | ast.Attribute) else None
        return key is not None and key in names

    def has_point(self, node: ast.AST) -> bool:
        return any(_is_clock_call(n) or self._named(n, self.points) for n in ast.walk(node))

    def has_duration(self, node: ast.AST) -> bool:
        for n in ast.walk(node):
            if self._named(n, self.durations):
                return True
            if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)):
                continue
            if self.has_point(n.left) or self.has_point(n.right):
                return True
        return False


def _flows(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """Every (name, value) an assignment, an augmented assignment or ``name.append(value)``
    gives a name."""
    flows: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in ast.walk(target)]
            flows.extend((k, node.value) for k in map(_key, targets) if k)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            key = _key(node.target)
            if key:
                flows.append((key, node.value))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"append", "add", "extend"}
            and node.args
        ):
            key = _key(node.func.value)
            if key:
                flows.append((key, node.args[0]))
    return flows


def wall_clock_assertions(source: str) -> list[int]:
    """The line of every ``assert`` in ``source`` that compares a wall-clock duration."""
    tree = ast.parse(source)
    clocks = _Clocks(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            if any(clocks.has_duration(side) for side in (compare.left, *compare.comparators)):
                found.append(node.lineno)
                break
    return found


def test_no_test_asserts_on_a_wall_clock_duration() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in wall_clock_assertions(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], (
        "these asserts compare a wall-clock duration: bound CPU time, count statements or "
        "calls, or order events instead (module docstring); speed goes in tools/bench/"
    )


CAUGHT = [
    sample
    for sample in (TESTS / "fixtures" / "wall-clock-samples" / "caught.txt")
    .read_text(encoding="utf-8")
    .split("# --- sample\n")
    if sample
]
"""Test code that asserts on a wall-clock duration, kept as data (see its README) so that no
scan of the suite takes a sample for an assertion of this file."""


@pytest.mark.parametrize("source", CAUGHT)
def test_the_scan_finds_a_duration_asserted_either_way(source: str) -> None:
    assert len(CAUGHT) == 8  # every sample read: a damaged file cannot empty the test
    assert wall_clock_assertions(source) == [source.count("\n")]


@pytest.mark.parametrize(
    "source",
    [
        # a polling loop's guard: a reading against a deadline turns a hang into a failure
        "deadline = time.monotonic() + 60\nwhile not ready():\n"
        "    assert time.monotonic() < deadline, 'never ready'\n",
        "loop = asyncio.get_running_loop()\ndeadline = loop.time() + 60\n"
        "while not done():\n    assert loop.time() < deadline\n",
        # a bounded wait
        "result = await asyncio.wait_for(run(), 30)\nassert result.ok\n",
        "async with asyncio.timeout(30):\n    r = await run()\nassert r.stop_reason is FINAL\n",
        # a time budget for a fuzz loop, and a duration that is only printed
        "started = time.monotonic()\ncases = 0\n"
        "while cases < 10 or time.monotonic() - started < BUDGET:\n    cases += 1\n"
        "print(f'{time.monotonic() - started:.1f} s')\nassert cases >= 10\n",
        # what the library recorded
        "durations = [r.duration_ms for r in log.model_results]\nassert durations[0] >= 30\n",
        # CPU time is what a test may bound
        "before = resource.getrusage(resource.RUSAGE_CHILDREN)\nrun()\n"
        "after = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "cpu = after.ru_utime - before.ru_utime\nassert cpu < 1.0\n",
        "start = time.process_time()\nrun()\nassert time.process_time() - start < 1.0\n",
    ],
)
def test_bounded_waits_budgets_and_recorded_durations_are_not_assertions_on_the_clock(
    source: str,
) -> None:
    assert wall_clock_assertions(source) == []


async def test_an_alarm_tells_an_answer_before_its_bound_from_one_after_it() -> None:
    """``tests/_ordering.Alarm``: an operation answered at once is before the alarm (of 30 s:
    the loop's two turns never take that long); one that waits the alarm's time on the loop's
    clock (a timer set after the alarm's) is not."""
    early = Alarm(30.0)
    await asyncio.sleep(0)
    assert not await early.rang()
    late = Alarm(0.05)
    await asyncio.sleep(0.05)
    assert await late.rang()
