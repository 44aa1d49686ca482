"""PostgresRunStore's group commit and fleet leases against a real server (issue 24 items 1-3,
design 0212).

* records of many runs share one transaction, each fenced by its own run's epoch: a record
  whose lease was taken over fails its own caller only, and the rest of its batch is stored;
* the client process is killed (SIGKILL) while batched commits are in flight: every record a
  caller was told is durable is in the log, and nothing a run wrote after its lease was taken
  over is;
* all of a store's held leases are renewed by one statement (one transaction) per period, on
  a connection of their own, while writes keep the pool busy.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from polyloop.errors import RunLeaseLostError
from polyloop.stores import PostgresRunStore
from polyloop.testing import RecordFactory

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).parent
records = RecordFactory()


def xmins(conninfo: str, run_ids: list[str], after_id: int) -> dict[str, int]:
    """The transaction id of each run's records written after ``after_id``."""
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT run_id, xmin::text::bigint FROM polyloop_records "
            "WHERE run_id = ANY(%s) AND id > %s",
            (run_ids, after_id),
        ).fetchall()
    return {run_id: int(xmin) for run_id, xmin in rows}


def max_record_id(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM polyloop_records").fetchone()
    assert row is not None
    return int(row[0])


def take_over(conninfo: str, run_ids: list[str]) -> dict[str, int]:
    """Take the runs' leases over as another holder would (a new epoch), and return each run's
    last record id as of the takeover (the update waits for writes holding the lease row)."""
    with psycopg.connect(conninfo) as conn, conn.transaction():
        conn.execute(
            "UPDATE polyloop_leases SET epoch = epoch + 1 WHERE run_id = ANY(%s)", (run_ids,)
        )
        rows = conn.execute(
            "SELECT run_id, max(id) FROM polyloop_records WHERE run_id = ANY(%s) GROUP BY run_id",
            (run_ids,),
        ).fetchall()
    return {run_id: int(last) for run_id, last in rows}


async def test_a_batch_shares_one_transaction_and_a_fenced_out_record_fails_alone(
    postgres_database: str,
) -> None:
    store = await PostgresRunStore.open(postgres_database, pool_size=2, writers=1)
    run_ids = [f"batch-{i}" for i in range(30)]
    try:
        leases = [await store.acquire_lease(run_id) for run_id in run_ids]
        await asyncio.gather(
            *(
                lease.write_run_started(
                    records.run_started(run_id=lease.run_id, parameter_snapshot={})
                )
                for lease in leases
            )
        )
        stale = run_ids[7]
        take_over(postgres_database, [stale])
        before = max_record_id(postgres_database)
        outcomes = await asyncio.gather(
            *(
                lease.write_intent(
                    records.model_call_intent(run_id=lease.run_id, call_index=0, result_id="m0")
                )
                for lease in leases
            ),
            return_exceptions=True,
        )
        failed = {run_id for run_id, o in zip(run_ids, outcomes, strict=True) if o is not None}
        assert failed == {stale}
        assert isinstance(outcomes[7], RunLeaseLostError)
        written = xmins(postgres_database, run_ids, before)
        assert stale not in written
        assert len(written) == len(run_ids) - 1
        per_transaction = collections.Counter(written.values())
        # One writer: the first record goes alone, the others queue and share a commit.
        assert max(per_transaction.values()) >= 20, per_transaction
        for run_id in run_ids:
            log = await store.read_log(run_id)
            assert len(log.intents) == (0 if run_id == stale else 1)
    finally:
        await store.close()


def read_acks(path: Path) -> tuple[dict[str, int], set[str]]:
    acked: dict[str, int] = {}
    lost: set[str] = set()
    for line in path.read_text().splitlines():
        run_id, _, what = line.partition(" ")
        if what == "lost":
            lost.add(run_id)
        else:
            acked[run_id] = max(acked.get(run_id, 0), int(what))
    return acked, lost


def count_acks(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


async def wait_for_acks(path: Path, at_least: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while await asyncio.to_thread(count_acks, path) < at_least:
        assert loop.time() < deadline, "the writer process did not get going"
        await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("trial", [0, 1])
async def test_a_client_killed_mid_batch_loses_nothing_acknowledged_and_leaks_no_fenced_write(
    postgres_database: str, tmp_path: Path, trial: int
) -> None:
    runs = 200
    ack_path = tmp_path / "acks"
    child = subprocess.Popen(  # noqa: ASYNC220 - killed by the test, never awaited
        [
            sys.executable,
            str(HERE / "_batch_writer.py"),
            postgres_database,
            str(ack_path),
            str(runs),
        ],
        cwd=HERE,
    )
    try:
        await wait_for_acks(ack_path, runs * 5)
        stolen = [f"kill-{i}" for i in range(trial, runs, 10)]
        at_takeover = await asyncio.to_thread(take_over, postgres_database, stolen)
        acks_at_takeover = await asyncio.to_thread(count_acks, ack_path)
        # Keep writing: 200 runs with a record each in flight, so commits are always under way.
        await wait_for_acks(ack_path, acks_at_takeover + runs * 5)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        await asyncio.to_thread(child.wait, 30)
    acked, lost = read_acks(ack_path)
    assert len(acked) == runs
    assert lost, "no write met the takeover: the fence was never tested"
    assert lost <= set(stolen)
    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    try:
        stored_beyond_ack = 0
        for run_id, count in acked.items():
            log = await store.read_log(run_id)  # decodes every stored line
            assert log.started is not None
            assert log.started.run_id == run_id
            stored = 1 + len(log.intents)
            assert stored >= count, f"{run_id}: {count} acknowledged, {stored} stored"
            # Records are stored in write order, each the one its write carried.
            assert [i.result_id for i in log.intents] == [f"m{n}" for n in range(1, stored)]
            stored_beyond_ack += stored - count
    finally:
        await store.close()
    with psycopg.connect(postgres_database) as conn:
        leaked = conn.execute(
            "SELECT run_id, count(*) FROM polyloop_records WHERE run_id = ANY(%s) "
            "AND id > (%s::jsonb ->> run_id)::bigint GROUP BY run_id",
            (stolen, psycopg.types.json.Jsonb(at_takeover)),
        ).fetchall()
    assert leaked == [], f"records written after their run's lease was taken over: {leaked}"
    print(
        f"\ntrial {trial}: {sum(acked.values())} acknowledged records of {runs} runs, 0 lost, "
        f"{stored_beyond_ack} stored beyond the last acknowledgement (committed, not yet "
        f"acknowledged at the kill), {len(lost)} of {len(stolen)} taken-over runs refused, "
        "0 records after a takeover"
    )


async def test_all_held_leases_are_renewed_by_one_statement_while_writes_fill_the_pool(
    postgres_database: str,
) -> None:
    store = await PostgresRunStore.open(
        postgres_database, pool_size=2, writers=2, lease_seconds=0.6
    )
    run_ids = [f"renew-{i}" for i in range(1000)]
    try:
        leases = [await store.acquire_lease(run_id) for run_id in run_ids]
        stop = asyncio.Event()

        async def flood(lease: object, n: int) -> None:
            while not stop.is_set():
                await lease.write_intent(  # type: ignore[attr-defined]
                    records.model_call_intent(run_id=lease.run_id, call_index=n, result_id="m")  # type: ignore[attr-defined]
                )

        writers = [asyncio.ensure_future(flood(lease, 0)) for lease in leases[:200]]
        await asyncio.sleep(3 * 0.6)  # five renewal periods, the pool busy with writes
        stop.set()
        await asyncio.gather(*writers)  # no RunLeaseLostError: every lease stayed held
        with psycopg.connect(postgres_database) as conn:
            rows = conn.execute(
                "SELECT xmin::text, count(*) FROM polyloop_leases WHERE run_id = ANY(%s) "
                "AND expires_at > clock_timestamp() GROUP BY 1",
                (run_ids,),
            ).fetchall()
        # Renewed since they were granted (one transaction each at grant time otherwise), all
        # by the same statement.
        assert len(rows) == 1, rows
        assert rows[0][1] == len(run_ids), rows
        for lease in leases:
            await lease.release()
    finally:
        await store.close()


async def test_a_step_costs_three_commits_its_model_result_sharing_the_next_records(
    postgres_database: str,
) -> None:
    """With ``write_pair`` the session writes the model result together with the step's next
    record (action intent, or the step itself for a final answer): one transaction."""
    from _pg_agent import Model, definition, registry, request

    from polyloop.session import run

    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    try:
        executed: list[str] = []
        script = ["write a", "write b", "final"]
        result = await run(definition(store, Model(script)), request("paired", registry(executed)))
        assert executed == ["a", "b"]
        log = await store.read_log("paired")
    finally:
        await store.close()
    assert len(result.steps) == 3
    with psycopg.connect(postgres_database) as conn:
        rows = conn.execute(
            "SELECT convert_from(line, 'UTF8')::jsonb ->> 'record', xmin::text "
            "FROM polyloop_records WHERE run_id = 'paired' ORDER BY id"
        ).fetchall()
    assert len(rows) == len(log.entries)
    for index, (tag, xmin) in enumerate(rows):
        if tag == "model_call_result":
            following_tag, following_xmin = rows[index + 1]
            assert following_tag in {"intent", "step_completed"}
            assert following_xmin == xmin, f"record {index} and the next were two commits"
    transactions = len({xmin for _, xmin in rows})
    # the start; two acting steps of three commits (model intent, result + action intent, step);
    # the final answer's two (model intent, result + step); the finish. Before: 4 + 4 + 3.
    assert transactions == 1 + 2 * 3 + 2 + 1, rows


async def test_write_pair_refuses_a_start_two_runs_and_a_lost_lease_stores_neither(
    postgres_database: str,
) -> None:
    from polyloop.errors import PolyloopTypeError, PolyloopValueError

    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    try:
        lease = await store.acquire_lease("pair")
        intent = records.model_call_intent(run_id="pair", call_index=0, result_id="m0")
        result = records.model_call_result(run_id="pair", result_id="m0")
        with pytest.raises(PolyloopTypeError, match=r"PostgresRunLease.write_pair: .*RunStarted"):
            await lease.write_pair(
                records.run_started(run_id="pair", parameter_snapshot={}), intent
            )
        other = records.model_call_intent(run_id="other", call_index=0, result_id="m0")
        with pytest.raises(PolyloopValueError, match="one run"):
            await lease.write_pair(result, other)
        take_over(postgres_database, ["pair"])
        with pytest.raises(RunLeaseLostError):
            await lease.write_pair(result, intent)
        assert (await store.read_log("pair")).entries == ()
        await store.write_pair(result, intent)  # unfenced: both, in order
        log = await store.read_log("pair")
        assert [type(e.record).__name__ for e in log.entries] == ["ModelCallResult", "Intent"]
    finally:
        await store.close()


def lease_xmins(conninfo: str, run_ids: list[str]) -> dict[str, tuple[int, bool]]:
    """Each lease row's transaction id and whether it is released."""
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT run_id, xmin::text::bigint, released FROM polyloop_leases "
            "WHERE run_id = ANY(%s)",
            (run_ids,),
        ).fetchall()
    return {run_id: (int(xmin), bool(released)) for run_id, xmin, released in rows}


async def test_fleet_lease_grants_first_reads_and_releases_share_statements(
    postgres_database: str,
) -> None:
    """Concurrent acquires of 200 runs are granted by a few statements (shared transactions),
    an acquire of a run id asked twice at once is granted once, the first reads are right for
    every run, and the releases share transactions too, each lease released once."""
    store = await PostgresRunStore.open(postgres_database, pool_size=4, writers=1)
    run_ids = [f"grant-{i}" for i in range(200)]
    try:
        await store.write_run_started(records.run_started(run_id="grant-0", parameter_snapshot={}))
        outcomes = await asyncio.gather(
            *(store.acquire_lease(run_id) for run_id in [*run_ids, "grant-7"]),
            return_exceptions=True,
        )
        leases = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        assert sorted(lease.run_id for lease in leases) == sorted(run_ids)  # grant-7 once
        assert len(refused) == 1
        assert "grant-7" in str(refused[0])
        granted = lease_xmins(postgres_database, run_ids)
        assert len({xmin for xmin, _ in granted.values()}) < 20  # shared grant statements
        logs = await asyncio.gather(*(store.read_log(run_id) for run_id in run_ids))
        assert [log.is_empty for log in logs] == [run_id != "grant-0" for run_id in run_ids]
        await asyncio.gather(*(lease.release() for lease in leases))
        released = lease_xmins(postgres_database, run_ids)
        assert all(flag for _, flag in released.values())
        assert len({xmin for xmin, _ in released.values()}) < 20  # shared release statements
        again = await store.acquire_lease("grant-3")  # released: free for the next holder
        assert again.epoch == 2
        await again.release()
    finally:
        await store.close()


class _FailingCommits(PostgresRunStore):
    """The real store, whose next batch commit raises ``fail_with`` instead of committing."""

    fail_with: BaseException | None = None

    async def _commit_batch(self, batch):  # type: ignore[no-untyped-def]
        error, self.fail_with = self.fail_with, None
        if error is not None:
            raise error
        return await super()._commit_batch(batch)


async def test_a_fenced_writes_caller_gets_what_its_batch_found(postgres_database: str) -> None:
    """A lease's write returns once durable, or raises what the commit found (design 0214,
    fourth pass: the committer answers the caller's future itself): the driver's error as
    ``StoreUnavailableError`` naming the run and the record (the error as cause), any other
    error (a bug) as it is, a lost lease as ``RunLeaseLostError``, a store closed under it as
    unavailable; a later write of the run goes on as usual."""
    from polyloop.errors import StoreUnavailableError

    store = await _FailingCommits.open(postgres_database, pool_size=2, writers=1)
    assert isinstance(store, _FailingCommits)
    closed = False
    try:
        lease = await store.acquire_lease("fenced-answers")
        await lease.write_run_started(
            records.run_started(run_id="fenced-answers", parameter_snapshot={})
        )
        intent = records.model_call_intent(run_id="fenced-answers", call_index=0, result_id="m0")
        result = records.model_call_result(run_id="fenced-answers", result_id="m0")
        driver_error = psycopg.OperationalError("the server went away")
        store.fail_with = driver_error
        with pytest.raises(
            StoreUnavailableError, match="the intent record of run 'fenced-answers'"
        ) as caught:
            await lease.write_intent(intent)
        assert caught.value.__cause__ is driver_error
        store.fail_with = RuntimeError("a bug in the commit")
        with pytest.raises(RuntimeError, match="a bug in the commit"):
            await lease.write_pair(result, intent)
        await lease.write_intent(intent)  # the next batch commits as usual
        await lease.write_pair(result, intent)
        tags = [type(e.record).__name__ for e in (await store.read_log("fenced-answers")).entries]
        assert tags == ["RunStarted", "Intent", "ModelCallResult", "Intent"]
        take_over(postgres_database, ["fenced-answers"])
        with pytest.raises(RunLeaseLostError, match="expired or was taken over"):
            await lease.write_intent(intent)
        other = await store.acquire_lease("fenced-closed")
        await store.close()
        closed = True
        with pytest.raises(
            StoreUnavailableError, match="the intent record of run 'fenced-closed'"
        ) as gone:
            await other.write_intent(
                records.model_call_intent(run_id="fenced-closed", call_index=0, result_id="m0")
            )
        assert isinstance(gone.value.__cause__, ConnectionError)
    finally:
        if not closed:
            await store.close()


class _GatedCommits(PostgresRunStore):
    """The real store, whose batch commits wait for ``gate`` once ``closing`` is set (so a
    write can be held queued while something else happens)."""

    closing = False
    gate: asyncio.Event | None = None
    held: asyncio.Event | None = None

    async def _commit_batch(self, batch):  # type: ignore[no-untyped-def]
        if self.closing and self.gate is not None and self.held is not None:
            self.held.set()
            await self.gate.wait()
        return await super()._commit_batch(batch)


async def test_a_write_queued_when_its_lease_is_released_is_refused_as_released(
    postgres_database: str,
) -> None:
    """``release()`` marks the lease row released in its own statement, which need not wait for
    a write still queued in the group committer; that write's commit then finds the lease not
    held, and its caller is told why: "it was released" (not "expired or was taken over",
    which would send a person looking for another holder). Nothing of it is stored."""
    store = await _GatedCommits.open(postgres_database, pool_size=2, writers=1)
    assert isinstance(store, _GatedCommits)
    try:
        lease = await store.acquire_lease("released-queued")
        await lease.write_run_started(
            records.run_started(run_id="released-queued", parameter_snapshot={})
        )
        store.gate, store.held, store.closing = asyncio.Event(), asyncio.Event(), True
        intent = records.model_call_intent(run_id="released-queued", call_index=0, result_id="m0")
        queued = asyncio.ensure_future(lease.write_intent(intent))
        await asyncio.wait_for(store.held.wait(), 10)  # the write's batch waits at the gate
        await asyncio.wait_for(lease.release(), 10)  # the row is released meanwhile
        store.closing = False
        store.gate.set()
        with pytest.raises(RunLeaseLostError, match=r"\(it was released\); nothing was written"):
            await asyncio.wait_for(queued, 10)
        tags = [type(e.record).__name__ for e in (await store.read_log("released-queued")).entries]
        assert tags == ["RunStarted"]
    finally:
        await store.close()
