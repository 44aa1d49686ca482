"""``RunStoreContract`` and ``RunLeaseContract`` wired to the shipped stores.

One suite, two very different shapes (an append-only file per run, and encoded payloads in
memory): an assertion that holds for only one of them goes red here.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polyloop.ports import LeasingRunStore, RunStore
from polyloop.stores import JsonlRunStore, PostgresRunStore, VolatileRunStore
from polyloop.testing import RunLeaseContract, RunStoreContract

pytestmark = pytest.mark.contract


class TestJsonlRunStore(RunStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> RunStore:
        # pytest gives every test a fresh tmp_path, so every test gets an empty store.
        return JsonlRunStore(directory=tmp_path)


class TestVolatileRunStore(RunStoreContract):
    @pytest.fixture
    def store(self) -> RunStore:
        return VolatileRunStore()


class TestJsonlRunLeases(RunLeaseContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LeasingRunStore:
        return JsonlRunStore(directory=tmp_path)

    @pytest.fixture
    def second_store(self, tmp_path: Path) -> LeasingRunStore:
        # A second instance on the same directory: its flock is a separate open file
        # description, so it is excluded exactly like another process.
        return JsonlRunStore(directory=tmp_path)


class TestVolatileRunLeases(RunLeaseContract):
    @pytest.fixture
    def store(self) -> LeasingRunStore:
        return VolatileRunStore()


async def _postgres_store(conninfo: str) -> AsyncIterator[PostgresRunStore]:
    store = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=5.0)
    try:
        yield store
    finally:
        await store.close()


def _fresh_database(conninfo: str) -> str:
    """A new, empty database on the test server, so every test gets an empty store."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # a fresh hex name: nothing to escape
    return conninfo.replace("dbname=postgres", f"dbname={name}")


class TestPostgresRunStore(RunStoreContract):
    @pytest.fixture
    async def store(self, postgres_conninfo: str) -> AsyncIterator[RunStore]:
        async for made in _postgres_store(_fresh_database(postgres_conninfo)):
            yield made


class TestPostgresRunLeases(RunLeaseContract):
    @pytest.fixture
    def database(self, postgres_conninfo: str) -> str:
        return _fresh_database(postgres_conninfo)

    @pytest.fixture
    async def store(self, database: str) -> AsyncIterator[LeasingRunStore]:
        async for made in _postgres_store(database):
            yield made

    @pytest.fixture
    async def second_store(self, database: str) -> AsyncIterator[LeasingRunStore]:
        async for made in _postgres_store(database):
            yield made
