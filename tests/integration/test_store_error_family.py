"""``except polyloop.errors.StoreError`` catches every failure of the three shipped stores
(issue 34, design 0221): each failure a store's infrastructure can cause, from each public
method it reaches, and the lease refusals.

============  ==================================  ===============================  =============
store         unavailable                         disk full                        lease held,
                                                                                   lease lost
============  ==================================  ===============================  =============
JSONL         its directory is under a regular    a tiny tmpfs, filled (root; CI   both
              file, before and after a lease      runs as root)
PostgreSQL    the server crashed                  the data directory on a tmpfs,   both
                                                  filled (root)
volatile      none: it keeps records in this      none, for the same reason        both
              process's memory, nothing under
              it can fail but the process itself
============  ==================================  ===============================  =============

Every error caught is also the specific class it was before (``StoreUnavailableError``,
``RunLeaseHeldError``, ``RunLeaseLostError``): the family only adds a way to catch them. The
run-level behaviour on a full disk and a crashed server (the typed error from ``run()``, the
resume afterwards) is ``test_jsonl_disk_full.py``, ``tests/unit/test_store_unavailable.py``
and ``test_postgres_server_crash.py``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tools.pg_cluster import HOW_TO_INSTALL, PgCluster, binaries_available

from _infra import skip_unless_available, tmpfs
from polyloop.errors import (
    RunLeaseHeldError,
    RunLeaseLostError,
    StoreError,
    StoreUnavailableError,
)
from polyloop.ports import LeasingRunStore, RunLease
from polyloop.stores import JsonlRunStore, PostgresRunStore, VolatileRunStore
from polyloop.testing import RecordFactory

pytestmark = pytest.mark.integration

RECORDS = RecordFactory()


def _start(run_id: str) -> Any:
    return RECORDS.run_started(run_id=run_id, parameter_snapshot={"k": "v"})


def _intent(run_id: str, index: int) -> Any:
    return RECORDS.model_call_intent(run_id=run_id, call_index=index, result_id=f"m{index}")


async def _store_error(attempt: Awaitable[object]) -> StoreError:
    """What ``attempt`` raised, asserting a caller's ``except StoreError`` catches it."""
    try:
        await attempt
    except StoreError as caught:  # the promise: the family catches it
        return caught
    raise AssertionError("no StoreError was raised")


# --------------------------------------------------------------------------- tmpfs (root only)


def _fill(directory: Path) -> None:
    """Write a file in ``directory`` until its file system is full (``ENOSPC``)."""
    with open(directory / "filler", "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


async def _writes_until_refused(lease: RunLease, run_id: str) -> StoreError:
    """Write intents through ``lease`` until the store refuses one (a full disk may still
    hold the rest of a page); at most 200 tries."""
    for index in range(200):
        try:
            await lease.write_intent(_intent(run_id, index))
        except StoreError as caught:
            return caught
    raise AssertionError("200 writes on a full disk all succeeded")


# --------------------------------------------------------------------------- JSONL


async def test_jsonl_a_directory_that_cannot_exist_is_a_store_error_from_every_method(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("a regular file where a directory should be")
    store = JsonlRunStore(directory=tmp_path / "file" / "logs")
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "run_started": lambda: store.write_run_started(_start("r")),
        "intent": lambda: store.write_intent(_intent("r", 0)),
        "log": lambda: store.read_log("r"),
        "lease": lambda: store.acquire_lease("r"),
    }
    for record, attempt in attempts.items():
        caught = await _store_error(attempt())
        assert isinstance(caught, StoreUnavailableError), record
        assert caught.record == record
        assert isinstance(caught.__cause__, OSError)


async def test_jsonl_a_directory_gone_under_a_held_lease_is_a_store_error(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "logs"
    store = JsonlRunStore(directory=directory)
    lease = await store.acquire_lease("r")
    await lease.write_run_started(_start("r"))
    shutil.rmtree(directory)
    directory.write_text("now a regular file")
    caught = await _store_error(lease.write_intent(_intent("r", 0)))
    assert isinstance(caught, StoreUnavailableError | RunLeaseLostError)
    assert isinstance(await _store_error(store.read_log("r")), StoreUnavailableError)
    await lease.release()  # never raises for infrastructure (FencingStore.end_lease)


async def test_jsonl_a_full_disk_is_a_store_error() -> None:
    with tmpfs("64k") as disk:
        store = JsonlRunStore(directory=disk)
        lease = await store.acquire_lease("held")
        await lease.write_run_started(_start("held"))
        await store.write_run_started(_start("plain"))
        _fill(disk)

        caught = await _store_error(store.write_run_started(_start("new")))
        assert isinstance(caught, StoreUnavailableError)
        assert caught.errno == errno.ENOSPC
        through_lease = await _writes_until_refused(lease, "held")
        assert isinstance(through_lease, StoreUnavailableError)
        assert through_lease.errno == errno.ENOSPC
        other = await _store_error(store.acquire_lease("new"))
        assert isinstance(other, StoreUnavailableError)
        assert other.errno == errno.ENOSPC
        await lease.release()


# --------------------------------------------------------------------------- every store: leases


async def _lease_refusals(store: LeasingRunStore) -> None:
    lease = await store.acquire_lease("leased")
    await lease.write_run_started(_start("leased"))
    held = await _store_error(store.acquire_lease("leased"))
    assert isinstance(held, RunLeaseHeldError)
    await lease.release()
    lost = await _store_error(lease.write_intent(_intent("leased", 0)))
    assert isinstance(lost, RunLeaseLostError)
    second = await store.acquire_lease("leased")
    stale = await _store_error(lease.write_intent(_intent("leased", 0)))
    assert isinstance(stale, RunLeaseLostError)
    await second.release()


async def test_jsonl_lease_refusals_are_store_errors(tmp_path: Path) -> None:
    await _lease_refusals(JsonlRunStore(directory=tmp_path))


async def test_volatile_lease_refusals_are_store_errors() -> None:
    await _lease_refusals(VolatileRunStore())


async def test_postgres_lease_refusals_are_store_errors(postgres_database: str) -> None:
    store = await PostgresRunStore.open(postgres_database, pool_size=3)
    try:
        await _lease_refusals(store)
    finally:
        await store.close()


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def cluster(own_pg_cluster: PgCluster) -> PgCluster:
    return own_pg_cluster


async def test_postgres_a_crashed_server_is_a_store_error_from_every_method(
    cluster: PgCluster,
) -> None:
    import psycopg

    conninfo = cluster.conninfo()
    store = await PostgresRunStore.open(conninfo, pool_size=3, connect_timeout=2)
    try:
        lease = await store.acquire_lease("down")
        await lease.write_run_started(_start("down"))
        await asyncio.to_thread(cluster.crash)
        attempts: dict[str, Callable[[], Awaitable[object]]] = {
            "write_run_started": lambda: store.write_run_started(_start("other")),
            "write_intent": lambda: store.write_intent(_intent("down", 0)),
            "lease.write_intent": lambda: lease.write_intent(_intent("down", 0)),
            "read_log": lambda: store.read_log("down"),
            "acquire_lease": lambda: store.acquire_lease("down-2"),
            "list_runs": lambda: store.list_runs(),
            "read_log_bytes": lambda: store.read_log_bytes(["down"]),
            "open": lambda: PostgresRunStore.open(conninfo, pool_size=1, connect_timeout=1),
        }
        for method, attempt in attempts.items():
            caught = await _store_error(attempt())
            assert isinstance(caught, StoreUnavailableError), method
            assert isinstance(caught.__cause__, psycopg.Error | OSError), method
        await lease.release()  # logged, never raised: the lease expires by itself
    finally:
        await store.close()


async def test_postgres_a_full_disk_is_a_store_error() -> None:
    """The server's data directory on a tmpfs that is then filled: the insert that needs a new
    page of the records table fails with the server's "could not extend file" (SQLSTATE
    53100, disk full), or, if the server could not write at all, a broken connection; both
    are ``StoreUnavailableError``s."""
    import psycopg

    skip_unless_available(binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL)
    with tmpfs("160m", owner="postgres") as disk:
        server = PgCluster(disk)
        try:
            server.init()
            server.start()
            store = await PostgresRunStore.open(server.conninfo(), pool_size=3, connect_timeout=5)
            try:
                lease = await store.acquire_lease("full")
                await lease.write_run_started(_start("full"))
                _fill(disk)
                through_lease = await _writes_until_refused(lease, "full")
                assert isinstance(through_lease, StoreUnavailableError)
                assert isinstance(through_lease.__cause__, psycopg.Error)
                noise = os.urandom(6000).hex()  # a new page (or TOAST) even compressed
                big = RECORDS.run_started(run_id="fresh", parameter_snapshot={"k": noise})
                plain = await _store_error(store.write_run_started(big))
                assert isinstance(plain, StoreUnavailableError)
                print(f"\nthrough the lease: {through_lease}\nplain: {plain}")
            finally:
                await store.close()
        finally:
            server.destroy()
