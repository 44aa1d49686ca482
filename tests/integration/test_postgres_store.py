"""PostgresRunStore with the session: crash equivalence at every record boundary, and many
concurrent runs on one pool (the JSONL and volatile stores' tests, adapted)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from _pg_agent import Model, definition, registry, request

from polyloop.errors import LogChecksumError, RunAlreadyStartedError
from polyloop.ports import RunStore
from polyloop.serialization import SCHEMA_VERSION
from polyloop.session import resume, run
from polyloop.stores import PostgresRunStore, VolatileRunStore
from polyloop.types import (
    Intent,
    IntentKind,
    ModelCallResult,
    ReplayPolicy,
    RunFinished,
    RunStarted,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepCompleted,
    StepRecord,
    StopReason,
)

pytestmark = pytest.mark.integration

SCRIPT = ["write a", "write b", "final"]
WRITERS = {
    RunStarted: "write_run_started",
    Intent: "write_intent",
    ModelCallResult: "write_model_call_result",
    StepCompleted: "write_step_completed",
    RunFinished: "write_run_finished",
}


def comparable(steps: tuple[StepRecord, ...]) -> list[StepRecord]:
    return [
        dataclasses.replace(
            step,
            step_wall_ms=0,
            model_ms=None if step.model_ms is None else 0,
            action_ms=None if step.action_ms is None else 0,
        )
        for step in steps
    ]


class _SameParameters(VolatileRunStore):
    """An in-memory store reporting the Postgres store's parameters (its logs are copied)."""

    def parameters(self) -> dict[str, str]:
        return {"kind": "postgres"}


async def test_a_cut_at_every_record_boundary_resumes_like_the_uninterrupted_run(
    postgres_database: str,
) -> None:
    """A Postgres write is one statement, so a crash loses whole records: every prefix of the
    uninterrupted log, resumed, either reproduces the uninterrupted run or (a NEVER action
    whose intent survived without its step) stops as unknown, and no action whose intent and
    step both survived runs again."""
    full_store = _SameParameters()
    reference_executed: list[str] = []
    reference = await run(
        definition(full_store, Model(SCRIPT)), request("full", registry(reference_executed))
    )
    entries = (await full_store.read_log("full")).entries
    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    try:
        for cut in range(1, len(entries)):
            run_id = f"cut-{cut}"
            for entry in entries[:cut]:
                record = dataclasses.replace(entry.record, run_id=run_id)
                await getattr(store, WRITERS[type(record)])(record)
            executed: list[str] = []
            resumed = await resume(
                definition(store, Model(SCRIPT)), request(run_id, registry(executed))
            )
            kept = entries[:cut]
            dangling_action = isinstance(kept[-1].record, Intent) and (
                kept[-1].record.kind is IntentKind.ACTION
            )
            if dangling_action:
                assert resumed.stop_reason is StopReason.RESUME_STATE_UNKNOWN, cut
                assert executed == [], cut
            else:
                assert resumed.stop_reason is reference.stop_reason, cut
                assert comparable(resumed.steps) == comparable(reference.steps), cut
                done = sum(isinstance(e.record, StepCompleted) for e in kept)
                # Only the actions of steps not yet in the log run again.
                assert executed == reference_executed[min(done, len(reference_executed)) :], cut
    finally:
        await store.close()
    assert reference_executed == ["a", "b"]
    assert ReplayPolicy.SAFE  # the model calls are SAFE (request), the tools NEVER


@pytest.mark.slow
async def test_a_thousand_concurrent_runs_on_one_pool_do_not_cross_talk(
    postgres_database: str,
) -> None:
    store: RunStore = await PostgresRunStore.open(postgres_database, pool_size=10)
    executed: list[str] = []
    tools = registry(executed)
    try:
        results = await asyncio.gather(
            *(
                run(definition(store, Model(["write x", "final"])), request(f"run-{i}", tools))
                for i in range(1000)
            )
        )
        assert [r.run_id for r in results] == [f"run-{i}" for i in range(1000)]
        assert all(r.stop_reason is StopReason.FINAL_ANSWER for r in results)
        assert len(executed) == 1000
        for i in (0, 499, 999):
            log = await store.read_log(f"run-{i}")
            assert {record.run_id for record in log.intents} == {f"run-{i}"}
            assert len(log.intents) == 3
            assert log.finished is not None
    finally:
        await store.close()  # type: ignore[attr-defined]


async def test_a_taken_run_id_is_refused_with_run_already_started_error(
    postgres_database: str,
) -> None:
    """The exclusive start raises the polyloop type (still a ``FileExistsError``), from the
    plain method and through a lease, and writes nothing (issue 20)."""
    store = await PostgresRunStore.open(postgres_database, pool_size=1)
    try:
        start = RunStarted(run_id="r1", parameter_snapshot={"k": "v"})
        await store.write_run_started(start)
        taken = r"^PostgresRunStore: run id 'r1' already has a log; start a new run"
        with pytest.raises(RunAlreadyStartedError, match=taken) as plain:
            await store.write_run_started(start)
        lease = await store.acquire_lease("r1")
        try:
            with pytest.raises(RunAlreadyStartedError, match=taken) as leased:
                await lease.write_run_started(start)
        finally:
            await lease.release()
        for caught in (plain.value, leased.value):
            assert isinstance(caught, FileExistsError)
            assert caught.run_id == "r1"
        assert len((await store.read_log("r1")).entries) == 1
    finally:
        await store.close()


async def test_a_settlement_is_a_committed_row_and_an_older_claim_is_refused(
    postgres_database: str,
) -> None:
    """Issue 21: ``write_settlement`` through a lease stores a row read back in
    ``RunLog.settlements`` (the table is unchanged: the line's tag is the kind); a row edited to
    claim an older schema version than the log's first record, without its checksum, is
    refused naming its line, as in the JSONL store."""
    import psycopg

    store = await PostgresRunStore.open(postgres_database, pool_size=1)
    try:
        intent = Intent(
            run_id="r1",
            kind=IntentKind.ACTION,
            call_index=0,
            result_id="a0",
            replay_policy=ReplayPolicy.NEVER,
            idempotency_key="polyloop:r:r1:a0",
        )
        verdict = Settlement(
            run_id="r1",
            result_id="a0",
            verdict=SettlementVerdict.EXECUTED,
            source=SettlementSource.PERSON,
            by="ops@example.com",
            at="2026-01-01T00:00:00Z",
            observation="paid 10 EUR",
        )
        lease = await store.acquire_lease("r1")
        try:
            await lease.write_run_started(RunStarted(run_id="r1", parameter_snapshot={}))
            await lease.write_intent(intent)
            await lease.write_settlement(verdict)
        finally:
            await lease.release()
        log = await store.read_log("r1")
        assert log.settlements == (verdict,)
        assert log.intents == (intent,)
        assert [type(entry.record) for entry in log.entries] == [RunStarted, Intent, Settlement]
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            row = conn.execute(
                "SELECT id, line FROM polyloop_records WHERE run_id = 'r1' ORDER BY id"
            ).fetchall()[2]
            body, _, _ = bytes(row[1]).rpartition(b', "checksum": "')
            edited = body.replace(b"paid 10", b"paid 99").replace(
                b'"schema_version": "%s"' % SCHEMA_VERSION.encode(), b'"schema_version": "1.2"'
            )
            conn.execute(
                "UPDATE polyloop_records SET line = %s WHERE id = %s", (edited + b"}\n", row[0])
            )
        with pytest.raises(LogChecksumError, match=r"^log of run 'r1', line 3: the line claims"):
            await store.read_log("r1")
    finally:
        await store.close()


async def test_a_step_written_in_a_pair_is_not_encoded_again_for_the_finish(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A final-answer step travels with its model result (``write_pair``); the lease encodes
    both through its ``StepLines`` (``RecordWriter._pair_lines``), so the finish, which
    repeats every step, splices the kept text instead of encoding the steps again."""
    from polyloop import serialization

    encoded: list[int] = []
    real = serialization._step_record_fields

    def counting(step: StepRecord) -> dict[str, object]:
        encoded.append(step.step_idx)
        return real(step)

    monkeypatch.setattr(serialization, "_step_record_fields", counting)
    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    executed: list[str] = []
    try:
        result = await run(
            definition(store, Model(["write a", "final"])), request("paired", registry(executed))
        )
        assert result.stop_reason is StopReason.FINAL_ANSWER
        assert encoded == [0, 1]  # each step once: none again for the finish
        log = await store.read_log("paired")
        assert log.finished is not None
        assert log.finished.result.steps == tuple(c.step for c in log.steps)
    finally:
        await store.close()


@pytest.mark.parametrize("bad_id", ["nul\x00id", "lone\ud800surrogate"])
async def test_a_run_id_the_database_cannot_hold_fails_only_its_own_caller(
    postgres_database: str, bad_id: str
) -> None:
    """A batch carries many runs' records in one statement; an id with a NUL or a lone
    surrogate is refused before it is queued (``PolyloopValueError``), so the runs that share
    its batch are written as usual (design 0212: a bad record fails its own caller only)."""
    from polyloop.errors import PolyloopValueError

    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    executed: list[str] = []
    try:
        bad = RunStarted(run_id=bad_id, parameter_snapshot={})
        outcomes = await asyncio.gather(
            store.write_run_started(bad),
            *(
                run(
                    definition(store, Model(["write a", "final"])),
                    request(f"ok-{i}", registry(executed)),
                )
                for i in range(5)
            ),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], PolyloopValueError)
        assert "run_id contains" in str(outcomes[0])
        assert all(r.stop_reason is StopReason.FINAL_ANSWER for r in outcomes[1:])  # type: ignore[union-attr]
        with pytest.raises(PolyloopValueError):
            await store.acquire_lease(bad_id)
        with pytest.raises(PolyloopValueError):
            await store.read_log(bad_id)
    finally:
        await store.close()
