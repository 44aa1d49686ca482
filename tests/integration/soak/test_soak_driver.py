"""The soak driver: budget guard, dispatch, per-run files, command line, and a small real batch."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from _soak_support import ROOT, ScriptedModel, make_run, read_lines
from tools.soak._artifacts import META_KEYS, run_ids_in
from tools.soak.run_soak import (
    BudgetGuard,
    Unit,
    dispatch,
    interleave,
    main,
    persona_rotation,
)
from tools.soak.scenarios.base import PERSONAS, RunOutcome
from tools.soak.scoreboard import CHECK_NAMES

from polyloop.ports import ModelCall
from polyloop.types import Message, Role, TextBlock

pytestmark = pytest.mark.integration


def _names(directory: Path) -> list[str]:
    # ".leases" holds the JSONL store's run-lease lock files (design 0120), not run artefacts.
    return sorted(path.name for path in directory.iterdir() if path.name != ".leases")


def _call(run_id: str) -> ModelCall:
    return ModelCall(
        messages=(Message(role=Role.USER, content=(TextBlock(text="hi"),)),),
        call_index=0,
        run_id=run_id,
        result_id="m0",
        binding={},
    )


def _outcome(label: str) -> RunOutcome:
    return RunOutcome(
        run_id=label,
        scenario="code",
        task_id=label,
        phase=None,
        stop_reason="task_completed",
        steps=1,
        model_calls=1,
        wall_ms=0,
    )


# --------------------------------------------------------------------------- budget guard


async def test_the_guard_counts_attempts_per_run_and_in_total() -> None:
    guard = BudgetGuard(inner=ScriptedModel(["ok", RuntimeError("down"), "ok"]), limit=3)
    await guard.call(_call("a"))
    with pytest.raises(RuntimeError):
        await guard.call(_call("a"))  # a failed attempt is still an attempt
    await guard.call(_call("b"))
    assert (guard.total, guard.calls_for("a"), guard.calls_for("b")) == (3, 2, 1)
    assert guard.exhausted
    assert guard.parameters() == {"kind": "scripted"}
    with pytest.raises(ValueError, match="limit"):
        BudgetGuard(inner=ScriptedModel(["x"]), limit=0)


# --------------------------------------------------------------------------- dispatch


async def test_an_exhausted_budget_stops_dispatch_but_running_units_finish() -> None:
    guard = BudgetGuard(inner=ScriptedModel(["ok"]), limit=2)
    finished: list[str] = []

    def unit(label: str, delay: float) -> Unit:
        async def body() -> Sequence[RunOutcome]:
            await guard.call(_call(label))
            await asyncio.sleep(delay)
            finished.append(label)
            return [_outcome(label)]

        return Unit(label=label, scenario="code", run=body)

    report = await dispatch(
        [unit("a", 0.0), unit("slow", 0.2), unit("c", 0.0), unit("d", 0.0)],
        concurrency=2,
        guard=guard,
    )
    assert (report.dispatched, report.stopped_at) == (2, 3)
    assert sorted(o.run_id for o in report.outcomes) == ["a", "slow"]
    assert "slow" in finished
    assert guard.total == 2


async def test_concurrency_never_exceeds_the_cap() -> None:
    alive = peak = 0

    async def body() -> Sequence[RunOutcome]:
        nonlocal alive, peak
        alive += 1
        peak = max(peak, alive)
        await asyncio.sleep(0.01)
        alive -= 1
        return [_outcome("x")]

    units = [Unit(label=f"u{i}", scenario="code", run=body) for i in range(12)]
    report = await dispatch(units, concurrency=3)
    assert (peak, report.dispatched, len(report.outcomes)) == (3, 12, 12)
    with pytest.raises(ValueError, match="concurrency"):
        await dispatch(units, concurrency=0)


async def test_one_failing_unit_does_not_stop_the_batch() -> None:
    async def boom() -> Sequence[RunOutcome]:
        raise RuntimeError("the environment exploded")

    async def fine() -> Sequence[RunOutcome]:
        return [_outcome("fine")]

    report = await dispatch(
        [Unit(label="bad", scenario="code", run=boom), Unit(label="ok", scenario="code", run=fine)],
        concurrency=1,
    )
    assert report.failures == (("bad", "RuntimeError: the environment exploded"),)
    assert [o.run_id for o in report.outcomes] == ["fine"]


async def test_cancelling_dispatch_cancels_the_units_and_lets_them_clean_up() -> None:
    cleaned: list[str] = []

    async def body() -> Sequence[RunOutcome]:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("done")
        return []

    batch = asyncio.ensure_future(
        dispatch([Unit(label=f"u{i}", scenario="code", run=body) for i in range(2)], concurrency=2)
    )
    await asyncio.sleep(0.05)
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert cleaned == ["done", "done"]


def test_interleave_alternates_scenarios_and_rotation_covers_every_persona() -> None:
    assert interleave([["a0", "a1", "a2"], ["b0", "b1"]]) == ["a0", "b0", "a1", "b1", "a2"]
    assert interleave([]) == []
    personas = persona_rotation([f"t{i:03d}" for i in range(10)], seed=3)
    assert set(personas.values()) == set(PERSONAS)


# --------------------------------------------------------------------------- per-run files


async def test_a_run_leaves_four_files_with_the_exact_meta_keys(tmp_path: Path) -> None:
    outcome = await make_run(tmp_path, "r1", ["look", "finish"], task_id="t007")
    assert (outcome.stop_reason, outcome.steps, outcome.model_calls, outcome.error) == (
        "task_completed",
        2,
        2,
        None,
    )
    assert _names(tmp_path) == [
        "r1.events.jsonl",
        "r1.jsonl",
        "r1.meta.json",
        "r1.result.json",
    ]
    meta = json.loads((tmp_path / "r1.meta.json").read_text())
    assert tuple(sorted(meta)) == tuple(sorted(META_KEYS))
    assert {k: meta[k] for k in META_KEYS if k != "wall_ms"} == {
        "scenario": "code",
        "task_id": "t007",
        "phase": None,
        "model_calls": 2,
        "sink_failures": 0,
        "env_executions": 2,
        "fault": None,
        "success": None,
        "resumed_from_step": 0,
    }
    assert read_lines(tmp_path / "r1.events.jsonl") == [
        {"kind": "step_finished", "run_id": "r1", "step_idx": 0},
        {"kind": "step_finished", "run_id": "r1", "step_idx": 1},
    ]
    result = json.loads((tmp_path / "r1.result.json").read_text())
    assert (result["stop_reason"], result["event_delivery_failures"]) == ("task_completed", 0)


async def test_sink_failures_are_counted_by_the_sink_and_by_the_library(tmp_path: Path) -> None:
    (tmp_path / "r2.events.jsonl").mkdir()  # every append fails
    await make_run(tmp_path, "r2", ["look", "finish"])
    meta = json.loads((tmp_path / "r2.meta.json").read_text())
    result = json.loads((tmp_path / "r2.result.json").read_text())
    assert meta["sink_failures"] == result["event_delivery_failures"] == 2


async def test_a_run_that_raises_still_leaves_its_meta(tmp_path: Path) -> None:
    await make_run(tmp_path / "first", "r3", ["finish"])
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "r3.jsonl").write_bytes((tmp_path / "first" / "r3.jsonl").read_bytes())
    outcome = await make_run(tmp_path / "again", "r3", ["finish"])
    assert outcome.stop_reason is None
    assert outcome.error is not None
    assert outcome.error.startswith("RunIdentityError")
    meta = json.loads((tmp_path / "again" / "r3.meta.json").read_text())
    assert (meta["model_calls"], meta["success"]) == (0, None)
    assert not (tmp_path / "again" / "r3.result.json").exists()


async def test_a_model_error_is_a_stop_reason_not_a_driver_error(tmp_path: Path) -> None:
    outcome = await make_run(tmp_path, "r4", [RuntimeError("gateway down")])
    assert (outcome.stop_reason, outcome.error, outcome.model_calls) == ("llm_error", None, 1)
    assert (tmp_path / "r4.result.json").exists()


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "argv",
    [
        ["--scenario", "code", "--concurrency", "1", "--runs-dir", "x"],
        ["--scenario", "code", "--budget-calls", "5", "--runs-dir", "x"],
        ["--scenario", "code", "--budget-calls", "0", "--concurrency", "1", "--runs-dir", "x"],
        ["--scenario", "nope", "--budget-calls", "5", "--concurrency", "1", "--runs-dir", "x"],
    ],
)
def test_bad_command_lines_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code != 0


async def test_a_runs_dir_that_holds_runs_is_refused(tmp_path: Path) -> None:
    await make_run(tmp_path / "runs", "old", ["finish"])
    argv = ["--scenario", "code", "--budget-calls", "5", "--concurrency", "1"]
    assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


def test_a_small_code_batch_passes_every_check_it_exercises(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = ["--scenario", "code", "--limit", "4", "--budget-calls", "100", "--concurrency", "2"]
    dry = _python(
        "tools.soak.run_soak",
        *common,
        "--runs-dir",
        str(runs),
        "--report",
        str(tmp_path / "dry.md"),
        "--dry-run",
        cwd=ROOT,
    )
    assert dry.returncode == 0, dry.stderr
    assert not runs.exists() or run_ids_in(runs) == []
    # Relative paths, from another working directory: the worker processes change directory,
    # so the harness must hand them absolute paths (a relative ledger path once broke soak.sh).
    load = _python(
        "tools.soak.run_soak",
        *common,
        "--runs-dir",
        "runs",
        "--report",
        "load.md",
        cwd=tmp_path,
    )
    assert load.returncode == 0, load.stderr
    assert run_ids_in(runs) == ["code-t000", "code-t001", "code-t002", "code-t003"]
    assert load.stderr.count("] code/t") == 4  # one progress line per unit
    report = (tmp_path / "load.md").read_text()
    assert "units dispatched: 4 of 4" in report
    assert "| code | 4 | " in report  # every code run graded by the worker's /evaluate
    assert "apps." not in report  # counts only, no task text
    assert "Task" not in report
    board = _python(
        "tools.soak.scoreboard",
        "--runs-dir",
        str(runs),
        "--report",
        str(tmp_path / "sb.md"),
        cwd=ROOT,
    )
    # Four code tasks never take two paths (the code scenario has no final answer, and none
    # of these four personas is stubborn): those checks judged nothing, so the strict
    # scoreboard is undetermined (exit 3), never green. Everything else passed.
    assert board.returncode == 3, board.stdout
    verdicts = {line.split()[0]: line.split()[1] for line in board.stdout.splitlines()[:-1]}
    assert set(verdicts) == set(CHECK_NAMES)
    not_exercised = {name for name, verdict in verdicts.items() if verdict != "passed"}
    assert not_exercised == {"final_answer_nonempty", "step_budget_at_cap"}, board.stdout
    for line in board.stdout.splitlines():
        if line.split()[0] in not_exercised:
            assert line.split(None, 2)[2] == "passed 0, breached 0, undetermined 1, n/a 4"
    assert "verdict undetermined" in board.stdout
