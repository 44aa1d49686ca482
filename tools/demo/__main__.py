"""``python -m tools.demo [--runs-dir DIR] [--seed N]``: the offline demo.

Runs the six scenarios of ``tools.demo._scenarios`` against one ``JsonlRunStore``, kills two of
them for real and resumes them, prints a summary table and where the logs are, then checks
that every run ended the way the story says. Exit status: 0 when every check holds, 1 when one
does not, 2 for a bad command line (for example a ``--runs-dir`` that already holds runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from polyloop.session import resume, run
from polyloop.stores import JsonlRunStore
from polyloop.types import ReplayPolicy, RunResult
from tools.demo._agent import ConsoleSink
from tools.demo._scenarios import SCENARIOS, Scenario, definition_for, request_for
from tools.demo._victim import FINISHED_MARKER, IN_FLIGHT_MARKER
from tools.demo._world import Shop, World, format_price

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_SECONDS: Final = 30.0
DEFAULT_SEED: Final = 7


class DemoError(Exception):
    """The demo itself went wrong (not a run: runs end with stop reasons)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: Scenario
    result: RunResult
    remark: str = ""
    child_pid: int | None = None


# --------------------------------------------------------------------------- running


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


async def _plain_run(scenario: Scenario, world: World, store: JsonlRunStore) -> Outcome:
    definition = definition_for(scenario, store=store, sink=ConsoleSink())
    result = await run(definition, request_for(scenario, world))
    print(f"    => {result.stop_reason.value} after {_plural(len(result.steps), 'step')}")
    return Outcome(scenario=scenario, result=result)


async def _relay_until_in_flight(process: asyncio.subprocess.Process) -> str:
    """Echo the child's progress lines until it reports the stalled call; return the tool."""
    assert process.stdout is not None
    while True:
        raw = await process.stdout.readline()
        if not raw:
            return ""
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if line.startswith(IN_FLIGHT_MARKER):
            return line.removeprefix(IN_FLIGHT_MARKER).strip()
        if line.startswith(FINISHED_MARKER):
            raise DemoError(f"the child finished its run ({line}) instead of stalling")
        print(f"    [pid {process.pid}] {line}")


async def _kill_and_resume(
    scenario: Scenario, world: World, store: JsonlRunStore, runs_dir: Path
) -> Outcome:
    kill = scenario.kill
    assert kill is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.demo._victim",
        "--runs-dir",
        str(runs_dir),
        "--seed",
        str(world.shop.seed),
        "--run",
        scenario.run_id,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        print(f"    run() in child process {process.pid}:")
        try:
            tool = await asyncio.wait_for(_relay_until_in_flight(process), CHILD_TIMEOUT_SECONDS)
        except TimeoutError as exc:
            raise DemoError(
                f"child process {process.pid} did not reach its {kill.tool} call within "
                f"{CHILD_TIMEOUT_SECONDS:.0f} s"
            ) from exc
        if not tool:
            await process.wait()
            assert process.stderr is not None
            errors = (await process.stderr.read()).decode("utf-8", errors="replace")
            raise DemoError(
                f"child process {process.pid} exited ({process.returncode}) before its "
                f"{kill.tool} call was in flight:\n{errors}"
            )
        log = await store.read_log(scenario.run_id)
        intent = log.intents[-1]
        policy = intent.replay_policy
        print(
            f"    the child is inside {tool}: its log holds {_plural(len(log.steps), 'step')} "
            f"and the intent of action {intent.result_id}\n"
            f"    (replay policy {policy.value}) with no result"
        )
        process.kill()
        await process.communicate()
        how = "SIGKILL" if process.returncode == -9 else f"exit status {process.returncode}"
        print(f"    killed process {process.pid} ({how}): no step, no finish record")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    verdict = "so it runs again" if policy is ReplayPolicy.SAFE else "so it must not run again"
    print(f"    resume() in this process ({os.getpid()}): {tool} is {policy.name}, {verdict}")
    definition = definition_for(scenario, store=store, sink=ConsoleSink())
    result = await resume(definition, request_for(scenario, world))
    print(f"    => {result.stop_reason.value} after {_plural(len(result.steps), 'step')}")
    if policy is ReplayPolicy.NEVER:
        print(
            f"    {tool} did its work before the kill (see {world.directory.name}/notes.txt), "
            "but the log\n    cannot show that; polyloop stops instead of guessing, and a "
            "person decides what comes next"
        )
    remark = f"killed in {kill.tool}, resumed"
    return Outcome(scenario=scenario, result=result, remark=remark, child_pid=process.pid)


async def _run_all(runs_dir: Path, seed: int) -> list[Outcome]:
    world = World(runs_dir / "world", Shop.from_seed(seed))
    store = JsonlRunStore(directory=runs_dir)
    outcomes = []
    for scenario in SCENARIOS:
        print(f"\n== {scenario.run_id}: {scenario.story}")
        if scenario.kill is None:
            outcomes.append(await _plain_run(scenario, world, store))
        else:
            outcomes.append(await _kill_and_resume(scenario, world, store, runs_dir))
    return outcomes


# --------------------------------------------------------------------------- reporting


def _answer(outcome: Outcome, world: World) -> str:
    if outcome.result.final_answer is not None:
        return outcome.result.final_answer
    submitted = world.submission(outcome.scenario.run_id)
    return f"submitted {submitted}" if submitted is not None else "-"


def _print_summary(outcomes: Sequence[Outcome], world: World) -> None:
    header = ("run", "stop reason", "steps", "actions", "answer", "remark")
    rows = [header]
    for outcome in outcomes:
        steps = outcome.result.steps
        rows.append(
            (
                outcome.scenario.run_id,
                outcome.result.stop_reason.value,
                str(len(steps)),
                str(sum(step.action is not None for step in steps)),
                _answer(outcome, world),
                outcome.remark,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    print("\nSummary")
    for row in rows:
        cells = [
            cell.rjust(width) if column in (2, 3) else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("  " + "  ".join(cells).rstrip())


def _print_locations(runs_dir: Path, world: World) -> None:
    example = runs_dir / "r5-kill-safe.jsonl"
    print(
        f"\nLogs: one JSON Lines file per run in {runs_dir}/ (written by JsonlRunStore)\n"
        f"  read one:  head -3 {example}\n"
        '  every line is one record; its "record" key says which: run_started (holds the\n'
        "  parameter snapshot), intent (durable before every model call and every action, with\n"
        "  its replay policy), model_call_result, step_completed (action outcome and step in one\n"
        "  line), run_finished (the stop reason). A crash leaves an intent without a result.\n"
        f"World files (written by the tools, not by polyloop) in {world.directory}/:\n"
        "  ledger.jsonl  one line per tool execution, with the pid of the process that ran it\n"
        "  notes.txt     what write_note wrote"
    )


def _print_inspector(runs_dir: Path) -> None:
    """The last lines of the demo: how to look at its runs with ``python -m polyloop``."""
    page = runs_dir / "runs.html"
    venv = REPO_ROOT / ".venv"
    in_venv = Path(sys.prefix).resolve() == venv.resolve()
    python = ".venv/bin/python" if in_venv else "python"
    print(
        "\nLook at the runs (python -m polyloop, standard library only):\n"
        f"  {python} -m polyloop ls {runs_dir}\n"
        f"  {python} -m polyloop show {runs_dir / 'r6-kill-never.jsonl'}\n"
        f"  {python} -m polyloop verify {runs_dir}\n"
        f"  {python} -m polyloop html {runs_dir} -o {page}\n"
        f"  then open {page} in a browser"
    )


# --------------------------------------------------------------------------- checking


def _expected_total(world: World, scenario: Scenario) -> str:
    first, second = scenario.goal(world).items
    return format_price(world.shop.prices[first] + world.shop.prices[second])


async def _checks(
    outcomes: Sequence[Outcome], world: World, store: JsonlRunStore, runs_dir: Path
) -> list[tuple[str, bool]]:
    by_id = {outcome.scenario.run_id: outcome for outcome in outcomes}
    checks = [
        (
            f"{o.scenario.run_id} ends with {o.scenario.expected.value}",
            o.result.stop_reason is o.scenario.expected,
        )
        for o in outcomes
    ]
    checks += [
        (f"{run_id}.jsonl exists", (runs_dir / f"{run_id}.jsonl").is_file()) for run_id in by_id
    ]
    for run_id in ("r1-total", "r3-sloppy", "r5-kill-safe"):
        total = _expected_total(world, by_id[run_id].scenario)
        checks.append(
            (f"{run_id} submitted the right total ({total})", world.submission(run_id) == total)
        )
    r2 = by_id["r2-question"]
    item = r2.scenario.goal(world).items[0]
    price = format_price(world.shop.prices[item])
    checks.append((f"r2-question answered {price}", price in (r2.result.final_answer or "")))
    first_step = by_id["r3-sloppy"].result.steps[0]
    checks.append(("r3-sloppy's first reply was rejected by the parser", not first_step.parse_ok))
    checks.append(
        ("r4-budget made exactly 4 model calls", len(by_id["r4-budget"].result.steps) == 4)
    )

    ledger = world.ledger()
    r5 = by_id["r5-kill-safe"]
    second_item = r5.scenario.goal(world).items[1]
    pids = [
        entry.pid
        for entry in ledger
        if entry.run_id == r5.scenario.run_id
        and entry.tool == "lookup"
        and entry.arguments.get("item") == second_item
    ]
    checks.append(
        (
            f"r5-kill-safe: lookup {second_item!r} ran in the killed child and again on resume",
            pids == [r5.child_pid, os.getpid()],
        )
    )
    r6_notes = [line for line in world.notes() if line.startswith("r6-kill-never:")]
    checks.append(("r6-kill-never: the note exists exactly once", len(r6_notes) == 1))
    checks.append(
        ("r6-kill-never: nothing was submitted", world.submission("r6-kill-never") is None)
    )

    before = len(ledger)
    r1 = by_id["r1-total"]
    again = await resume(
        definition_for(r1.scenario, store=store, sink=ConsoleSink()),
        request_for(r1.scenario, world),
    )
    checks.append(
        (
            "resume() of the finished r1-total returns its stored result and runs nothing",
            again == r1.result and len(world.ledger()) == before,
        )
    )
    return checks


# --------------------------------------------------------------------------- command line


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.demo",
        description=(
            "Offline polyloop demo: six runs of a rule-based shop assistant, two of them "
            "killed mid-action and resumed, logged with JsonlRunStore. Needs no network."
        ),
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="an empty or new directory for the run logs and world files "
        "(default: ./runs/demo-<timestamp>)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"seed of the shop's price list and of the items each run asks about "
        f"(default: {DEFAULT_SEED})",
    )
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.runs_dir is None:
        args.runs_dir = Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    runs_dir = args.runs_dir.resolve()
    if runs_dir.exists() and (not runs_dir.is_dir() or any(runs_dir.iterdir())):
        parser.error(
            f"--runs-dir {runs_dir} already exists and is not an empty directory; the demo "
            "starts new runs, and run() refuses a run id that already has a log. Pass a new "
            "or empty directory."
        )
    args.runs_dir = runs_dir
    return args


async def _main(runs_dir: Path, seed: int) -> int:
    started = time.monotonic()
    print(f"polyloop demo: seed {seed}, logs in {runs_dir}")
    outcomes = await _run_all(runs_dir, seed)
    world = World(runs_dir / "world", Shop.from_seed(seed))
    _print_summary(outcomes, world)
    _print_locations(runs_dir, world)
    checks = await _checks(outcomes, world, JsonlRunStore(directory=runs_dir), runs_dir)
    failed = [name for name, held in checks if not held]
    print(f"\nChecks: {len(checks) - len(failed)}/{len(checks)} held")
    for name in failed:
        print(f"  FAILED: {name}")
    print(f"Done in {time.monotonic() - started:.1f} s.")
    _print_inspector(runs_dir)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        return asyncio.run(_main(args.runs_dir, args.seed))
    except DemoError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
