"""PostgresRunStore when the PostgreSQL *server* crashes (issue 24, item 0).

Each test starts its own throwaway server on 127.0.0.1 (``tools/pg_cluster.py``, default
durability: ``fsync`` and ``synchronous_commit`` on) and crashes it with ``pg_ctl stop -m
immediate`` (``PgCluster.restart``): every backend dies at once, no checkpoint, nothing
flushed, WAL replayed at the next start. The promises checked:

* **nothing acknowledged is lost**: every record whose write returned (recorded by a store
  subclass right after ``write_fenced`` returned), and every step whose event the sink got, is
  in the log after the restart;
* the runs in flight fail with ``StoreUnavailableError`` (a ``PolyloopError``, the driver's
  error as its cause) or, for a run whose lease ran out while the server was down,
  ``RunLeaseLostError``, never with the driver's own exception;
* every run then resumes to its final answer, no ``NEVER`` action runs twice (an action in
  doubt is settled by its reconciler from the ledger, design 0206), and every log passes
  ``check_log``.

Before issue 24 steps and model results committed with ``synchronous_commit`` off, and the
first test lost step 0 in about half of its trials.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Mapping, Sequence

import pytest
from _pg_agent import Model, Parser, request
from tools.pg_cluster import PgCluster

from polyloop.errors import PolyloopError, RunLeaseLostError, StoreUnavailableError
from polyloop.ports import Event, ToolContext
from polyloop.session import AgentDefinition, check_log, run_or_resume
from polyloop.stores import PostgresRunStore, decode_line
from polyloop.stores._group_commit import Outcome, Pending
from polyloop.stores._leases import FencedRunLease
from polyloop.stores._records import Record
from polyloop.testing import RecordFactory
from polyloop.tools import Reconciliation, ToolRegistry, ToolSpec
from polyloop.types import StepCompleted, StopReason, SyntheticObservations

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE_SECONDS = 1.0
LEASE_WAIT = 15.0


@pytest.fixture
def cluster(own_pg_cluster: PgCluster) -> PgCluster:
    return own_pg_cluster


class AckedStore(PostgresRunStore):
    """The real store; remembers every line whose write *returned* (was acknowledged), and
    the size of every group commit (design 0212) that returned."""

    acked: collections.Counter[tuple[str, bytes]]
    on_ack: list[object]
    batch_sizes: list[int]

    async def _commit_batch(self, batch: Sequence[Pending]) -> list[Outcome]:
        outcomes = await super()._commit_batch(batch)
        self.batch_sizes.append(len(batch))
        return outcomes

    async def write_fenced(
        self,
        lease: FencedRunLease,
        line: bytes | tuple[bytes, ...],
        kind: type[Record] | str,
    ) -> None:
        # Every fenced write of a lease (a single record or a pair) passes here.
        await super().write_fenced(lease, line, kind)
        for each in (line,) if isinstance(line, bytes) else line:
            self.acked[(lease.run_id, each)] += 1
        for hook in self.on_ack:
            hook(lease.run_id, kind)  # type: ignore[operator]


async def open_store(conninfo: str, acked: collections.Counter[tuple[str, bytes]]) -> AckedStore:
    store = await AckedStore.open(
        conninfo, pool_size=10, lease_seconds=LEASE_SECONDS, connect_timeout=10
    )
    assert isinstance(store, AckedStore)
    store.acked = acked
    store.on_ack = []
    store.batch_sizes = []
    return store


class Sink:
    """Records every delivered event; ``after`` (when set) runs after the event is taken."""

    def __init__(self, after: object = None, delay: float = 0.0) -> None:
        self.delivered: list[tuple[str, int]] = []
        self.after = after
        self.delay = delay

    async def emit(self, event: Event) -> None:
        self.delivered.append((event.run_id, event.step.step_idx))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.after is not None:
            await self.after(event)  # type: ignore[operator]

    def parameters(self) -> Mapping[str, str]:
        return {"sink": "crash-test"}


class CrashTrigger:
    """Sets ``reached`` right after the ``threshold``-th step of a round is acknowledged."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.steps = 0
        self.reached = asyncio.Event()

    def on_ack(self, run_id: str, kind: type[Record]) -> None:
        if kind is StepCompleted:
            self.steps += 1
            if self.steps == self.threshold:
                self.reached.set()


def ledger_registry(ledger: collections.Counter[tuple[str, str]]) -> ToolRegistry:
    """``write``: a NEVER tool counting its executions per (run, text); its reconciler answers
    from that ledger, as a payment system's lookup by key would."""

    async def write(arguments: Mapping[str, object], context: ToolContext) -> str:
        ledger[(context.run_id, str(arguments["text"]))] += 1
        return "written"

    write.takes_context = True  # type: ignore[attr-defined]

    async def reconcile(context: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        if ledger[(context.run_id, str(arguments["text"]))]:
            return Reconciliation.executed("written")
        return Reconciliation.not_executed()

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return ToolRegistry(
        [
            ToolSpec(
                name="write",
                description="NEVER",
                parameters=schema,
                handler=write,
                reconcile=reconcile,
            )
        ]
    )


def agent(store: PostgresRunStore, script: list[str], sink: Sink) -> AgentDefinition:
    return AgentDefinition(
        model_client=Model(script),
        decision_parser=Parser(),
        store=store,
        event_sink=sink,
        synthetic_observations=SyntheticObservations(
            action_rejected="rejected", env_failed="env failed", model_call_failed="failed"
        ),
    )


def stored_lines(conninfo: str) -> collections.Counter[tuple[str, bytes]]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute("SELECT run_id, line FROM polyloop_records").fetchall()
    return collections.Counter((row[0], bytes(row[1])) for row in rows)


def assert_nothing_acknowledged_lost(
    conninfo: str, acked: collections.Counter[tuple[str, bytes]], delivered: list[tuple[str, int]]
) -> None:
    stored = stored_lines(conninfo)
    lost = acked - stored
    assert not lost, f"{sum(lost.values())} acknowledged records lost: {sorted(lost)[:3]}"
    steps = collections.Counter[tuple[str, int]]()
    for (run_id, line), count in stored.items():
        record = decode_line(line[:-1], run_id=run_id, line_number=1)
        if isinstance(record, StepCompleted):
            steps[(run_id, record.step.step_idx)] += count
    missing = [pair for pair in delivered if not steps[pair]]
    assert not missing, f"steps whose event was delivered are not in the log: {missing[:3]}"


def steps_left(conninfo: str, run_ids: list[str], actions: int) -> int:
    """How many of the runs' steps (``actions`` and the final answer each) are not on record."""
    done = sum(
        count
        for (run_id, line), count in stored_lines(conninfo).items()
        if run_id in run_ids and line.startswith(b'{"record": "step_completed"')
    )
    return len(run_ids) * (actions + 1) - done


def assert_typed(failure: BaseException) -> None:
    """A run that failed with the server failed with a polyloop type naming the store."""
    assert isinstance(failure, PolyloopError), repr(failure)
    if isinstance(failure, StoreUnavailableError):
        import psycopg

        assert isinstance(failure.__cause__, psycopg.Error), repr(failure.__cause__)
        assert str(failure).startswith("PostgresRunStore: could not ")
        assert failure.store == "PostgresRunStore"
        assert failure.run_id is not None
        assert f"run {failure.run_id!r}" in str(failure)
    else:
        assert isinstance(failure, RunLeaseLostError), repr(failure)


def server_durability(conninfo: str) -> tuple[str, str]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        fsync = conn.execute("SHOW fsync").fetchone()
        commit = conn.execute("SHOW synchronous_commit").fetchone()
    assert fsync is not None
    assert commit is not None
    return str(fsync[0]), str(commit[0])


@pytest.mark.parametrize("database_commits", ["server default", "off"])
async def test_a_step_whose_event_was_delivered_survives_a_server_crash_right_after_it(
    cluster: PgCluster, database_commits: str
) -> None:
    """The issue's case: a two-step run (a NEVER action, then the final answer) whose sink
    crashes and restarts the server right after step 0's event. Step 0 must be in the log,
    and the resume must finish without running the action again. Also when the database says
    ``synchronous_commit = off`` (a DBA's speed-up): the store raises it to on for its
    connections."""
    import psycopg

    conninfo = cluster.conninfo()
    assert server_durability(conninfo) == ("on", "on")  # the server's defaults
    if database_commits == "off":
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("ALTER DATABASE postgres SET synchronous_commit = off")
        assert server_durability(conninfo) == ("on", "off")
    script = ["write a", "final"]
    acked: collections.Counter[tuple[str, bytes]] = collections.Counter()
    ledger: collections.Counter[tuple[str, str]] = collections.Counter()
    tools = ledger_registry(ledger)
    failures = 0
    for trial in range(6):
        run_id = f"two-step-{trial}"

        async def crash_after_step_0(event: Event) -> None:
            if event.step.step_idx == 0:
                await asyncio.to_thread(cluster.restart)

        sink = Sink(after=crash_after_step_0)
        store = await open_store(conninfo, acked)
        try:
            await run_or_resume(agent(store, script, sink), request(run_id, tools))
        except Exception as exc:  # the run's next write met the crash; checked below
            failure: BaseException | None = exc
        else:
            failure = None
        finally:
            await store.close()
        assert sink.delivered[:1] == [(run_id, 0)]
        assert_nothing_acknowledged_lost(conninfo, acked, sink.delivered)
        if failure is not None:
            failures += 1
            assert_typed(failure)

        resumed_sink = Sink()
        store = await open_store(conninfo, acked)
        try:
            result = await run_or_resume(
                agent(store, script, resumed_sink),
                request(run_id, tools),
                lease_wait_seconds=LEASE_WAIT,
            )
            log = await store.read_log(run_id)
        finally:
            await store.close()
        assert result.stop_reason is StopReason.FINAL_ANSWER, (trial, result.stop_reason)
        assert ledger[(run_id, "a")] == 1, "the NEVER action ran again"
        assert [step.step_idx for step in result.steps] == [0, 1]
        assert check_log(log, run_id) is None
        assert log.settlements == ()  # step 0 was on record: nothing was in doubt
    assert failures >= 1, "no run met the crash: the test proved nothing"
    print(
        f"\n[{database_commits}] 6 trials, {failures} runs failed on the crash, step 0 on record "
        "after every restart, 0 NEVER doubled"
    )


async def test_runs_in_flight_lose_nothing_acknowledged_across_server_crashes(
    cluster: PgCluster,
) -> None:
    """24 runs of six steps (five NEVER actions, then the final answer) on one pool and a slow
    sink; the server is crashed and restarted right after a randomly chosen step is
    acknowledged, three times. After each restart every acknowledged record and every
    delivered step is in the log; then every run is resumed (``run_or_resume``) until it ends:
    final answer, each action executed exactly once, ``check_log`` clean."""
    conninfo = cluster.conninfo()
    rng = random.Random(2424)
    script = [*(f"write s{i}" for i in range(5)), "final"]
    run_ids = [f"fleet-{i}" for i in range(24)]
    acked: collections.Counter[tuple[str, bytes]] = collections.Counter()
    ledger: collections.Counter[tuple[str, str]] = collections.Counter()
    tools = ledger_registry(ledger)
    delivered: list[tuple[str, int]] = []
    finished: dict[str, StopReason] = {}
    crashes = in_flight_failures = shared_commits = 0
    for _ in range(8):
        pending = [run_id for run_id in run_ids if run_id not in finished]
        if not pending:
            break
        crash_round = crashes < 3
        store = await open_store(conninfo, acked)  # creates the tables on the first round
        trigger = CrashTrigger(rng.randint(1, max(1, steps_left(conninfo, run_ids, 5) // 3)))
        store.on_ack.append(trigger.on_ack)
        sink = Sink(delay=0.002)

        async def crasher(trigger: CrashTrigger = trigger) -> None:
            await trigger.reached.wait()
            await asyncio.to_thread(cluster.restart)

        crash_task = asyncio.ensure_future(crasher()) if crash_round else None
        try:
            outcomes = await asyncio.gather(
                *(
                    run_or_resume(
                        agent(store, script, sink),
                        request(run_id, tools),
                        lease_wait_seconds=LEASE_WAIT,
                    )
                    for run_id in pending
                ),
                return_exceptions=True,
            )
        finally:
            if crash_task is not None:
                if not trigger.reached.is_set():
                    crash_task.cancel()  # the runs ended before the threshold: no crash
                # A crash under way is waited for: the server must be up again after it.
                await asyncio.gather(crash_task, return_exceptions=True)
            await store.close()
        shared_commits += sum(size > 1 for size in store.batch_sizes)
        crashed = crash_round and trigger.reached.is_set()
        crashes += crashed
        delivered += sink.delivered
        assert_nothing_acknowledged_lost(conninfo, acked, delivered)
        for run_id, outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                assert crashed, f"{run_id} failed without a crash: {outcome!r}"
                assert_typed(outcome)
                in_flight_failures += 1
            else:
                assert outcome.stop_reason is StopReason.FINAL_ANSWER, (run_id, outcome)
                finished[run_id] = outcome.stop_reason

    assert sorted(finished) == sorted(run_ids), "some runs did not reach their end"
    assert crashes == 3
    assert in_flight_failures >= 3, "the crashes met no run in flight: the test proved nothing"
    assert shared_commits > 0, "no commit carried records of several runs: group commit untested"
    doubled = {key: count for key, count in ledger.items() if count != 1}
    assert not doubled, f"NEVER actions not executed exactly once: {doubled}"
    assert len(ledger) == len(run_ids) * 5
    store = await open_store(conninfo, acked)
    settled = 0
    try:
        for run_id in run_ids:
            log = await store.read_log(run_id)
            assert check_log(log, run_id) is None, run_id
            assert log.finished is not None
            assert log.finished.result.stop_reason is StopReason.FINAL_ANSWER
            settled += len(log.settlements)
    finally:
        await store.close()
    print(
        f"\n{len(run_ids)} runs, {crashes} server crashes, {in_flight_failures} runs failed in "
        f"flight, {sum(acked.values())} acknowledged records (0 lost), {shared_commits} commits "
        f"shared by several runs, {len(delivered)} events, "
        f"{settled} actions in doubt settled by their reconciler, 0 NEVER doubled"
    )


async def test_with_the_server_down_every_entry_point_raises_store_unavailable_error(
    cluster: PgCluster,
) -> None:
    """``open``, ``read_log``, ``acquire_lease`` and a write, each with the server crashed:
    a ``StoreUnavailableError`` naming what it could not do, the driver's error as cause."""
    import psycopg

    conninfo = cluster.conninfo()
    store = await PostgresRunStore.open(conninfo, pool_size=3, connect_timeout=2)
    try:
        lease = await store.acquire_lease("down")
        await asyncio.to_thread(cluster.crash)
        attempts = {
            "log": store.read_log("down"),
            "lease": store.acquire_lease("down-2"),
            "intent": lease.write_intent(
                RecordFactory().model_call_intent(run_id="down", call_index=0, result_id="m0")
            ),
        }
        for record, attempt in attempts.items():
            with pytest.raises(StoreUnavailableError) as caught:
                await attempt
            assert caught.value.record == record
            assert caught.value.store == "PostgresRunStore"
            assert caught.value.path is None
            assert isinstance(caught.value.__cause__, psycopg.Error)
            assert str(caught.value).startswith("PostgresRunStore: could not ")
            assert "of run 'down" in str(caught.value)
        with pytest.raises(StoreUnavailableError) as refused:
            await PostgresRunStore.open(conninfo, pool_size=1, connect_timeout=1)
        assert refused.value.record == "schema"
        assert refused.value.run_id is None
        assert str(refused.value).startswith(
            "PostgresRunStore: could not connect to the database and check its tables: "
        )
    finally:
        await store.close()
        await asyncio.to_thread(cluster.start)
