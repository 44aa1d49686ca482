"""Run leases across real processes: what ``RunLeaseContract`` cannot check in one process.

A holder in a child process excludes the parent; a holder that is killed frees the run at
once (the kernel drops its ``flock``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import _resume_racer as racer
import pytest

from polyloop.errors import RunLeaseHeldError
from polyloop.ports import RunStore
from polyloop.session import run
from polyloop.stores import JsonlRunStore, PostgresRunStore, VolatileRunStore
from polyloop.types import Intent, ModelCallResult, RunStarted, StepCompleted

pytestmark = pytest.mark.integration

HOLDER = """
import asyncio, sys
from polyloop.stores import JsonlRunStore

async def main():
    lease = await JsonlRunStore(directory=sys.argv[1]).acquire_lease("run-1")
    print(lease.epoch, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_killed_jsonl_holder_frees_the_run_at_once(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    with subprocess.Popen(  # noqa: ASYNC220 - the test blocks on purpose; nothing else runs
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            child_epoch = int(child.stdout.readline())
            with pytest.raises(RunLeaseHeldError):
                await store.acquire_lease("run-1")
        finally:
            child.kill()
            child.wait(timeout=10)
    lease = await store.acquire_lease("run-1")
    assert lease.epoch == child_epoch + 1
    await lease.release()


# --------------------------------------------------------------------------- two resumers

TRIALS = 200
BATCH = 10
"""Run ids sent to both racers at once; each racer resumes them concurrently (every run id
is still raced by exactly two processes), which keeps 200 trials within seconds."""
RACER = Path(__file__).with_name("_resume_racer.py")


class _Template(VolatileRunStore):
    """An in-memory store that reports the target store's parameters (the logs it makes are
    copied there, and the snapshot must match the target's for resume)."""

    def __init__(self, parameters: Mapping[str, str]) -> None:
        super().__init__()
        self._target_parameters = dict(parameters)

    def parameters(self) -> Mapping[str, str]:
        return self._target_parameters


async def _unfinished_runs(store: RunStore, count: int, scratch: Path) -> list[str]:
    """``count`` runs whose log stops right after step 0 (a NEVER write that ran): the next
    resume executes step 1's NEVER write, then finishes. One template run is made in memory;
    each run's log is its records up to the first step, with the run id replaced."""
    template_store = _Template(store.parameters())
    await run(racer.agent(template_store), racer.request("template", str(scratch / "t.ledger")))
    entries = (await template_store.read_log("template")).entries
    cut = next(i for i, e in enumerate(entries) if isinstance(e.record, StepCompleted))
    prefix = [entry.record for entry in entries[: cut + 1]]
    writers = {
        RunStarted: "write_run_started",
        Intent: "write_intent",
        ModelCallResult: "write_model_call_result",
        StepCompleted: "write_step_completed",
    }

    async def copy(run_id: str) -> None:
        for record in prefix:
            await getattr(store, writers[type(record)])(dataclasses.replace(record, run_id=run_id))

    run_ids = [f"race-{i}" for i in range(count)]
    await asyncio.gather(*(copy(run_id) for run_id in run_ids))
    return run_ids


def _race(kind: str, location: str, run_ids: list[str], ledger: Path) -> dict[str, list[str]]:
    """Two racer processes; each run id is sent to both at once; their verdicts per run id."""
    command = [sys.executable, str(RACER), kind, location, str(ledger)]
    racers = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    verdicts: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    try:
        for racer_process in racers:
            assert racer_process.stdout is not None
            assert racer_process.stdout.readline().strip() == "ready"
        for start in range(0, len(run_ids), BATCH):
            batch = run_ids[start : start + BATCH]
            for racer_process in racers:
                assert racer_process.stdin is not None
                racer_process.stdin.write(" ".join(batch) + "\n")
                racer_process.stdin.flush()
            for racer_process in racers:
                assert racer_process.stdout is not None
                for _ in batch:
                    answered, verdict = racer_process.stdout.readline().split()
                    verdicts[answered].append(verdict)
        for racer_process in racers:
            assert racer_process.stdin is not None
            racer_process.stdin.write("quit\n")
            racer_process.stdin.close()
            racer_process.wait(timeout=30)
    finally:
        for racer_process in racers:
            if racer_process.poll() is None:
                racer_process.kill()
                racer_process.wait(timeout=10)
            if racer_process.stdout is not None:
                racer_process.stdout.close()
    return verdicts


async def _check_race(store: RunStore, kind: str, location: str, tmp_path: Path) -> None:
    run_ids = await _unfinished_runs(store, TRIALS, tmp_path)
    ledger = tmp_path / "side-effects.ledger"
    verdicts = await asyncio.to_thread(_race, kind, location, run_ids, ledger)
    assert {run_id: sorted(v) for run_id, v in verdicts.items()} == {
        run_id: ["advanced", "held"] for run_id in run_ids
    }
    executions = ledger.read_text().splitlines()
    # Step 1's NEVER write ran exactly once per run, and nothing else ran in the racers.
    assert sorted(line.rsplit(" ", 1)[0] for line in executions) == sorted(
        f"{run_id} second" for run_id in run_ids
    )
    for run_id in run_ids[:: TRIALS // 10]:
        log = await store.read_log(run_id)
        assert log.finished is not None
        assert len(log.finished.result.steps) == 3


@pytest.mark.slow
async def test_two_jsonl_resumers_at_once_exactly_one_advances(tmp_path: Path) -> None:
    directory = tmp_path / "runs"
    await _check_race(JsonlRunStore(directory=directory), "jsonl", str(directory), tmp_path)


@pytest.mark.slow
async def test_two_postgres_resumers_at_once_exactly_one_advances(
    tmp_path: Path, postgres_database: str
) -> None:
    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    try:
        await _check_race(store, "postgres", postgres_database, tmp_path)
    finally:
        await store.close()
