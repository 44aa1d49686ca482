"""A child process for ``test_postgres_group_commit.py``: many runs writing at once through one
``PostgresRunStore`` (so through its group commit), until it is killed.

``python _batch_writer.py CONNINFO ACK_FILE RUNS``: leases runs ``kill-0`` .. ``kill-<RUNS-1>``,
starts each and then appends model-call intents ``m1``, ``m2``, ... to each, all runs at once.
Right after a write *returns* it appends ``<run id> <n>`` to ``ACK_FILE`` (``n``: the run's
record count the store acknowledged; one unbuffered ``os.write`` per line), so every line in
the file names a record the store said was durable. A write refused because the lease was
lost appends ``<run id> lost`` and ends that run. It never exits by itself.
"""

from __future__ import annotations

import asyncio
import os
import sys

from polyloop.errors import RunLeaseLostError
from polyloop.stores import PostgresRunStore
from polyloop.testing import RecordFactory

records = RecordFactory()


async def one_run(store: PostgresRunStore, run_id: str, ack: int) -> None:
    lease = await store.acquire_lease(run_id, wait_seconds=30)
    await lease.write_run_started(records.run_started(run_id=run_id, parameter_snapshot={}))
    os.write(ack, f"{run_id} 1\n".encode())
    count = 1
    while True:
        intent = records.model_call_intent(run_id=run_id, call_index=count, result_id=f"m{count}")
        try:
            await lease.write_intent(intent)
        except RunLeaseLostError:
            os.write(ack, f"{run_id} lost\n".encode())
            return
        count += 1
        os.write(ack, f"{run_id} {count}\n".encode())


async def main(conninfo: str, ack_path: str, runs: int) -> None:
    ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    store = await PostgresRunStore.open(conninfo, pool_size=8, lease_seconds=30)
    await asyncio.gather(*(one_run(store, f"kill-{i}", ack) for i in range(runs)))
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
