"""A record kind added in a scratch table is stored, read and checked by ``PostgresRunStore``
and its leases too (design 0220; the JSONL and volatile stores: tests/unit/test_record_table.py).
"""

from __future__ import annotations

import dataclasses

from polyloop import _recovery
from polyloop.session._leasing import RunWriter
from polyloop.stores import PostgresRunStore
from polyloop.types import RECORDS, RecordKind, RunStarted


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CallCost:
    """A record kind the library does not have: what a model call cost."""

    run_id: str
    result_id: str
    cost_microdollars: int
    currency: str | None


async def test_postgres_stores_reads_and_checks_a_scratch_kind(postgres_database: str) -> None:
    store = await PostgresRunStore.open(postgres_database, pool_size=1)
    cost = CallCost(run_id="r1", result_id="m0", cost_microdollars=1200, currency="USD")
    try:
        with RECORDS.scratch(RecordKind(record_cls=CallCost, tag="call_cost", barrier=False)):
            start = RunStarted(run_id="r1", parameter_snapshot={"k": "v"})
            await store.write_run_started(start)
            await store.write_record(cost)
            lease = await store.acquire_lease("r2")
            writer = RunWriter(lease)
            await writer.write(dataclasses.replace(start, run_id="r2"))
            await writer.write(dataclasses.replace(cost, run_id="r2"))
            await lease.release()
            for run_id in ("r1", "r2"):
                log = await store.read_log(run_id)
                assert [type(entry.record) for entry in log.entries] == [RunStarted, CallCost]
                assert log.entries[1].record == dataclasses.replace(cost, run_id=run_id)
                assert _recovery.check_log(log, run_id) is None
    finally:
        await store.close()
