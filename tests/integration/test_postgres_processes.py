"""PostgresRunStore against real failures: the server killed mid-run, a holder paused past
its lease. Each test that kills the server starts its own throwaway server."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _pg_agent import Model, definition, registry, request
from tools.pg_cluster import PgCluster

from polyloop.errors import PolyloopError, StoreUnavailableError
from polyloop.session import stop_reason_of
from polyloop.stores import PostgresRunStore
from polyloop.types import StepRecord, StopReason

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).parent


def comparable(steps: tuple[StepRecord, ...]) -> list[StepRecord]:
    """Steps without their timings, the only fields that may differ between two runs."""
    return [
        dataclasses.replace(
            step,
            step_wall_ms=0,
            model_ms=None if step.model_ms is None else 0,
            action_ms=None if step.action_ms is None else 0,
        )
        for step in steps
    ]


@pytest.fixture
def own_cluster(own_pg_cluster: PgCluster) -> PgCluster:
    return own_pg_cluster


async def test_a_run_resumes_to_the_same_result_after_the_server_is_killed(
    own_cluster: PgCluster,
) -> None:
    import psycopg

    script = ["write first", "write second", "write third", "final"]
    conninfo = own_cluster.conninfo()
    store = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=1, connect_timeout=3)
    reference_executed: list[str] = []
    reference = await run_agent(store, Model(script), "reference", reference_executed)

    # The crashing run: the server dies while the model call of step 2 is in flight (its
    # intent is durable); the next write fails.
    executed: list[str] = []
    model = Model(script, gate=asyncio.Event(), gate_at=2)
    crashing = asyncio.ensure_future(run_agent(store, model, "crashed", executed))
    await asyncio.wait_for(model.reached.wait(), 30)
    await asyncio.to_thread(own_cluster.stop, "immediate")
    assert model.gate is not None
    model.gate.set()
    # Typed (issue 24): a PolyloopError naming the store and the run, the driver's as cause.
    with pytest.raises(StoreUnavailableError, match=r"^PostgresRunStore: could not ") as failed:
        await asyncio.wait_for(crashing, 60)
    assert isinstance(failed.value, PolyloopError)
    assert isinstance(failed.value.__cause__, psycopg.OperationalError)
    assert failed.value.run_id == "crashed"
    assert "of run 'crashed'" in str(failed.value)
    await store.close()

    await asyncio.to_thread(own_cluster.start)
    store = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=1, connect_timeout=10)
    try:
        # The dead process's lease expires by the server's clock; resume waits for it.
        tools = registry(executed)
        resumed = await resume_agent(store, Model(script), "crashed", tools)
        log = await store.read_log("crashed")
    finally:
        await store.close()
    assert resumed.stop_reason is reference.stop_reason is StopReason.FINAL_ANSWER
    assert comparable(resumed.steps) == comparable(reference.steps)
    assert executed == reference_executed == ["first", "second", "third"]
    assert len(log.intents) == 7  # 4 model calls, 3 actions: nothing doubled


async def run_agent(store: PostgresRunStore, model: Model, run_id: str, executed: list[str]):  # type: ignore[no-untyped-def]
    from polyloop.session import run

    return await run(definition(store, model), request(run_id, registry(executed)))


async def resume_agent(store: PostgresRunStore, model: Model, run_id: str, tools):  # type: ignore[no-untyped-def]
    from polyloop.session import resume

    return await resume(definition(store, model), request(run_id, tools), lease_wait_seconds=10)


async def test_a_paused_holder_writes_nothing_after_a_takeover(postgres_database: str) -> None:
    script = ["write a", "wait b", "write c", "final"]
    with subprocess.Popen(  # noqa: ASYNC220 - the child is driven step by step
        [sys.executable, str(HERE / "_paused_holder.py"), postgres_database, "paused"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=HERE,
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
            assert line.strip() == "acting"
            os.kill(child.pid, signal.SIGSTOP)
            store = await PostgresRunStore.open(postgres_database, pool_size=2, lease_seconds=1)
            try:
                # The holder's one-second lease is no longer renewed: the takeover waits for it
                # to expire, then finds the NEVER "wait" action unsettled and stops.
                executed: list[str] = []
                result = await resume_agent(store, Model(script), "paused", registry(executed))
                assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
                assert executed == []
                log_after_takeover = await store.read_log("paused")
                os.kill(child.pid, signal.SIGCONT)
                child.stdin.write("go\n")
                child.stdin.flush()
                verdict = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
                assert verdict.strip() == "lost"
                assert await store.read_log("paused") == log_after_takeover
                # The takeover left the run open, in doubt (design 0206), and the paused
                # holder's late write was refused: the run still stands in doubt.
                assert stop_reason_of(log_after_takeover, "paused") is (
                    StopReason.RESUME_STATE_UNKNOWN
                )
            finally:
                await store.close()
        finally:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait(timeout=10)
