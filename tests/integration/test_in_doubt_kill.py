"""In-doubt kill test (issue 21): payments runs SIGKILLed at random moments, settled, finished.

A loopback "payments" service (``_payments_service.py``, its own process, a fsynced ledger)
deduplicates ``POST /charge`` by ``Idempotency-Key`` and does not deduplicate ``POST
/transfer``. Each run (``_payments_child.py``: ``CALLS`` payments, then a final answer) is
driven by child processes that the test SIGKILLs after a random delay inside the run (at most
``MAX_KILLS_PER_RUN`` times), then restarts (``run_or_resume``) until one returns. The tools
sleep after the service answered, so many kills land in the in-doubt window: the money moved,
the log does not know. Three modes:

* ``idempotent``: ``charge``, ``ReplayPolicy.IDEMPOTENT``: recovery replays with the same key;
* ``reconciled``: ``transfer``, ``NEVER`` with a reconciler asking ``GET /transfers?key=``;
* ``unreconciled``: ``transfer``, ``NEVER`` without one: the run stops
  ``resume_state_unknown`` (left open), the test settles it the way an operator would (is
  there a ledger entry with the intent's key?) with ``polyloop.session.resolve`` (or, once,
  ``python -m polyloop resolve`` when the CLI has it) and runs it on.

For every mode: every payment happened exactly once at the service (no double, none lost),
every run finished with its final answer (none left ``resume_state_unknown``), every step's
observation is the ledger's entry, every action intent carries a well-formed key of its own,
every log passes ``check_log``; each mode was killed at least as often as it has runs; and at
least one execution really was in doubt and settled (a replay the service deduplicated; a
``Settlement`` in the log), or the test would prove nothing. Its figures are printed (and
recorded in ``research-wiki/reference/reliability.md``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _payments_child import CALLS, MODES, observation_of, tool_of

from polyloop.session import check_log, resolve
from polyloop.stores import JsonlRunStore
from polyloop.types import IntentKind, SettlementSource, SettlementVerdict, StopReason

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 2121
RUNS_PER_MODE = 8
MAX_KILLS_PER_RUN = 5
MAX_ATTEMPTS_PER_RUN = 16
CONCURRENT_RUNS = 3
KEY = re.compile(r"[A-Za-z0-9._:-]{1,255}")
STARTUP_SECONDS = 30.0  # a child's imports, or the service's start, on a loaded machine
UNKILLED_SECONDS = 60.0
HERE = Path(__file__).parent
CHILD = HERE / "_payments_child.py"
SERVICE = HERE / "_payments_service.py"


@contextlib.contextmanager
def payments_service(directory: Path) -> Iterator[int]:
    """The service in its own process on 127.0.0.1; its port. Stopped on the way out."""
    directory.mkdir(parents=True, exist_ok=True)
    errors = (directory / "service.stderr").open("wb")  # a file: a full pipe would block it
    process = subprocess.Popen(
        [sys.executable, str(SERVICE), str(directory)], stdout=subprocess.PIPE, stderr=errors
    )
    try:
        assert process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=STARTUP_SECONDS):
            pytest.fail(f"the payments service did not start within {STARTUP_SECONDS} s")
        line = process.stdout.readline().decode()
        selector.close()
        if not line.startswith("PORT "):
            process.kill()
            process.communicate()
            err = (directory / "service.stderr").read_text("utf-8", errors="replace")
            pytest.fail(f"the payments service did not start: {line!r} {err}")
        yield int(line.split()[1])
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        errors.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]


@dataclasses.dataclass
class Figures:
    """What one mode's runs went through."""

    runs: int = 0
    kills: int = 0
    attempts: int = 0
    unknown_stops: int = 0
    resolutions: dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    cli_resolutions: int = 0


@dataclasses.dataclass
class Pace:
    """How long a step takes in a child (updated from the attempts that returned), so that a
    kill can be drawn within what is left of the run, whatever the machine's load."""

    per_step: float = 0.15


async def attempt(
    directory: Path, run_id: str, mode: str, port: int, kill_after: float | None
) -> tuple[str, str | None, int, float] | None:
    """One child, killed ``kill_after`` seconds after it said READY (None: never). When it
    returned: ``(stop_reason, unknown_outcome, steps, seconds from READY)``; None when killed."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        str(directory),
        run_id,
        mode,
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    try:
        ready = await asyncio.wait_for(child.stdout.readline(), STARTUP_SECONDS)
    except TimeoutError:
        ready = b""
    if ready != b"READY\n":
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        _, err = await child.communicate()
        pytest.fail(f"run {run_id}: the child did not start: {ready!r}\n{err.decode()}")
    began = time.monotonic()
    try:
        done = await asyncio.wait_for(
            child.stdout.readline(), kill_after if kill_after is not None else UNKILLED_SECONDS
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()  # SIGKILL
        await child.communicate()
        if kill_after is None:
            pytest.fail(f"run {run_id}: an unkilled child did not return in {UNKILLED_SECONDS} s")
        return None
    _, err = await child.communicate()
    assert child.returncode == 0, f"run {run_id}: {done!r}\n{err.decode()}"
    words = done.decode().split()
    assert words[:1] == ["DONE"], f"run {run_id}: {done!r}\n{err.decode()}"
    return words[1], None if words[2] == "-" else words[2], int(words[3]), time.monotonic() - began


def cli_has_resolve() -> bool:
    probe = subprocess.run(
        [sys.executable, "-m", "polyloop", "resolve", "--help"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


async def settle_as_an_operator(
    directory: Path, run_id: str, result_id: str, service_dir: Path, figures: Figures, cli: bool
) -> None:
    """What a person would do: look the in-doubt execution's key up in the service's books."""
    store = JsonlRunStore(directory=directory)
    log = await store.read_log(run_id)
    assert log.finished is None, f"run {run_id}: a NEVER action in doubt must leave the run open"
    # More than one intent when a settled "not executed" ran again and was killed in doubt again.
    intents = [i for i in log.intents if i.result_id == result_id]
    assert intents, f"run {run_id}: no intent for the result in doubt {result_id}"
    intent = intents[-1]
    assert intent.kind is IntentKind.ACTION, intent
    assert intent.idempotency_key, intent
    assert {i.idempotency_key for i in intents} == {intent.idempotency_key}, intents
    entries = [
        e for e in read_jsonl(service_dir / "ledger.jsonl") if e["key"] == intent.idempotency_key
    ]
    assert len(entries) <= 1, entries
    executed = bool(entries)
    figures.resolutions["executed" if executed else "not_executed"] += 1
    if cli:
        verdict = (
            ["--executed", "--observation", observation_of(entries[0])]
            if executed
            else ["--not-executed"]
        )
        done = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "polyloop",
            "resolve",
            str(directory / f"{run_id}.jsonl"),
            "--result-id",
            result_id,
            *verdict,
            "--by",
            "kill-test-operator",
            "--note",
            "looked the key up in the payments ledger",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await done.communicate()
        assert done.returncode == 0, (out + err).decode()
        figures.cli_resolutions += 1
        return
    await resolve(
        store,
        run_id,
        result_id=result_id,
        executed=executed,
        observation=observation_of(entries[0]) if executed else None,
        by="kill-test-operator",
        note="looked the key up in the payments ledger",
    )


async def drive(
    mode: str,
    run_id: str,
    directory: Path,
    port: int,
    service_dir: Path,
    figures: Figures,
    pace: Pace,
    use_cli_once: list[bool],
) -> None:
    """Kill the run's children at random moments and restart them until one finishes it."""
    rng = random.Random(f"{SEED}-{run_id}")
    kills = 0
    for _ in range(MAX_ATTEMPTS_PER_RUN):
        log = await JsonlRunStore(directory=directory).read_log(run_id)
        left = CALLS + 1 - len(log.steps)
        kill_after = rng.uniform(0.0, left * pace.per_step) if kills < MAX_KILLS_PER_RUN else None
        figures.attempts += 1
        returned = await attempt(directory, run_id, mode, port, kill_after)
        if returned is None:
            kills += 1
            figures.kills += 1
            continue
        stop_reason, unknown, steps, seconds = returned
        if steps > len(log.steps):
            pace.per_step = 0.5 * pace.per_step + 0.5 * seconds / (steps - len(log.steps))
        if stop_reason == StopReason.RESUME_STATE_UNKNOWN.value:
            figures.unknown_stops += 1
            assert mode == "unreconciled", f"run {run_id} ({mode}) stopped in doubt on {unknown}"
            assert unknown is not None, f"run {run_id}: in doubt, but on no result id"
            cli = use_cli_once[0]
            use_cli_once[0] = False
            await settle_as_an_operator(directory, run_id, unknown, service_dir, figures, cli)
            continue
        assert stop_reason == StopReason.FINAL_ANSWER.value, f"run {run_id}: {stop_reason}"
        return
    pytest.fail(f"run {run_id} did not finish in {MAX_ATTEMPTS_PER_RUN} attempts")


async def judge(mode: str, run_ids: list[str], tmp_path: Path, service_dir: Path) -> dict[str, int]:
    """Assert the mode's promises; the counts of executions that really were in doubt."""
    tool = tool_of(mode)
    ledger = [e for e in read_jsonl(service_dir / "ledger.jsonl") if e["run_id"] in run_ids]
    requests = [r for r in read_jsonl(service_dir / "requests.jsonl") if r["run_id"] in run_ids]
    per_key = collections.Counter(e["key"] for e in ledger)
    per_call = collections.Counter((e["run_id"], e["call"]) for e in ledger)
    doubles = sum(n - 1 for n in per_key.values() if n > 1) + sum(
        n - 1 for n in per_call.values() if n > 1
    )
    assert doubles == 0, f"{mode}: {tool} executed twice: {per_key}, {per_call}"
    expected = {(run_id, n) for run_id in run_ids for n in range(CALLS)}
    assert set(per_call) == expected, f"{mode}: payments lost: {expected - set(per_call)}"
    assert all(e["kind"] == tool for e in ledger)

    counts: collections.Counter[str] = collections.Counter()
    requests_per_key = collections.Counter(r["key"] for r in requests)
    if mode == "idempotent":
        counts["deduplicated replays"] = sum(1 for n in requests_per_key.values() if n > 1)
    for run_id in run_ids:
        log = await JsonlRunStore(directory=tmp_path / mode / run_id).read_log(run_id)
        breach = check_log(log, run_id)
        assert breach is None, f"run {run_id}: {breach}"
        assert log.finished is not None, f"run {run_id} did not finish"
        result = log.finished.result
        assert result.stop_reason is StopReason.FINAL_ANSWER, (run_id, result.stop_reason)
        assert result.final_answer == "paid"
        assert len(result.steps) == CALLS + 1
        keys = {i.idempotency_key for i in log.intents if i.kind is IntentKind.ACTION}
        for key in keys:
            assert key is not None, f"run {run_id}: an action intent without its key"
            assert KEY.fullmatch(key), f"run {run_id}: {key!r} does not fit Idempotency-Key"
        per_action = collections.Counter(
            i.result_id for i in log.intents if i.kind is IntentKind.ACTION
        )
        assert len(keys) == len(per_action), f"run {run_id}: keys are not one per execution"
        by_call = {e["call"]: e for e in ledger if e["run_id"] == run_id}
        for n, step in enumerate(result.steps[:CALLS]):
            assert step.observation == observation_of(by_call[n]), (run_id, n, step.observation)
            assert by_call[n]["key"] in keys, f"run {run_id}: the service saw a foreign key"
        for settlement in log.settlements:
            assert settlement.verdict is not SettlementVerdict.UNKNOWN, settlement
            counts[f"{settlement.source.value} {settlement.verdict.value}"] += 1
        settled = collections.Counter(s.result_id for s in log.settlements)
        counts["settled more than once"] += sum(n - 1 for n in settled.values())
        if mode != "unreconciled":
            assert all(s.source is SettlementSource.RECONCILER for s in log.settlements)
    return dict(counts)


async def test_in_doubt_payments_killed_at_random_moments_settle_exactly_once(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    service_dir = tmp_path / "service"
    cli = [cli_has_resolve()]
    with payments_service(service_dir) as port:
        figures = {mode: Figures(runs=RUNS_PER_MODE) for mode in MODES}
        pace = Pace()
        gate = asyncio.Semaphore(CONCURRENT_RUNS)
        jobs = []

        async def one(mode: str, run_id: str) -> None:
            async with gate:
                directory = tmp_path / mode / run_id
                directory.mkdir(parents=True)
                await drive(mode, run_id, directory, port, service_dir, figures[mode], pace, cli)

        for number in range(RUNS_PER_MODE):
            for mode in MODES:  # interleaved, so a slow moment hits every mode alike
                jobs.append(one(mode, f"{mode[:3]}{number}"))
        await asyncio.gather(*jobs)

        settled = {}
        for mode in MODES:
            run_ids = [f"{mode[:3]}{n}" for n in range(RUNS_PER_MODE)]
            settled[mode] = await judge(mode, run_ids, tmp_path, service_dir)

    elapsed = time.monotonic() - started
    for mode in MODES:
        f = figures[mode]
        print(
            f"\nin-doubt kill test [{mode}]: seed {SEED}, {f.runs} runs, {f.attempts} attempts, "
            f"{f.kills} SIGKILLs, doubles 0, lost 0, finished {f.runs}/{f.runs}, "
            f"resume_state_unknown stops {f.unknown_stops} (resolved {dict(f.resolutions)}, "
            f"{f.cli_resolutions} through the CLI), in doubt and settled {settled[mode]}"
        )
    print(f"in-doubt kill test: {elapsed:.1f} s")

    for mode in MODES:
        assert figures[mode].kills >= figures[mode].runs, f"{mode}: too few kills to mean anything"
    assert settled["idempotent"].get("deduplicated replays", 0) >= 1, (
        "no charge was replayed in doubt: the idempotent mode proved nothing"
    )
    assert sum(v for k, v in settled["reconciled"].items() if k.startswith("reconciler")) >= 1, (
        "no transfer was reconciled: the reconciled mode proved nothing"
    )
    people = sum(v for k, v in settled["unreconciled"].items() if k.startswith("person"))
    assert people >= 1, "no transfer was resolved by a person: the unreconciled mode proved nothing"
    assert people == sum(figures["unreconciled"].resolutions.values())
