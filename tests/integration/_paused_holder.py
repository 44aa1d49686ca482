"""A process that runs a run on PostgreSQL and blocks inside a NEVER action until told.

``python _paused_holder.py CONNINFO RUN_ID``: opens the store with a one-second lease, starts
the run (script: ``write a``, ``wait b``, ``write c``, ``final``), prints ``acting`` when the
``wait`` action has started, then blocks until a line arrives on stdin; the action then
returns and the run goes on. It prints ``lost`` and exits 0 when a write raises
``RunLeaseLostError``, ``finished`` if the run ends normally.
"""

from __future__ import annotations

import asyncio
import sys

from _pg_agent import Model, definition, registry, request

from polyloop.errors import RunLeaseLostError
from polyloop.session import run
from polyloop.stores import PostgresRunStore

SCRIPT = ("write a", "wait b", "write c", "final")


async def main(conninfo: str, run_id: str) -> None:
    store = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=1.0)
    loop = asyncio.get_running_loop()

    async def hold() -> None:
        print("acting", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)

    executed: list[str] = []
    try:
        await run(definition(store, Model(SCRIPT)), request(run_id, registry(executed, hold)))
    except RunLeaseLostError:
        print("lost", flush=True)
    else:
        print("finished", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
