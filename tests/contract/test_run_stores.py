"""``RunStoreContract`` and ``RunLeaseContract`` wired to the shipped stores.

One suite, two very different shapes (an append-only file per run, and encoded payloads in
memory): an assertion that holds for only one of them goes red here. ``ForwardingRunStore``
(the base for store wrappers) is wired too, over the volatile store: a wrapper built on it
keeps the wrapped store's leases, so it passes both suites. ``UnsettlingStore``
(``tests/_shared_doubles.py``) is a correct leasing store without the optional
``write_settlement`` and ``write_approval_request`` (``SettlingRunStore``): it is how the
suite's skips for a store without that capability run here at least once. A volatile store
that packs every run as soon as its lease ends (design 0244) is wired too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from _shared_doubles import UnsettlingStore
from polyloop.ports import LeasingRunStore, RunStore, SettlingRunStore
from polyloop.stores import (
    ForwardingRunStore,
    JsonlRunStore,
    PostgresRunStore,
    VolatileRunStore,
)
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


class PackingVolatileRunStore(VolatileRunStore):
    """Packs every run as soon as its lease ends (design 0244; the shipped store waits for
    131,072 records of ended runs): the contract holds for packed runs too."""

    _pack_budget = 0


class TestPackingVolatileRunStore(RunStoreContract):
    @pytest.fixture
    def store(self) -> RunStore:
        return PackingVolatileRunStore()


class TestPackingVolatileRunLeases(RunLeaseContract):
    @pytest.fixture
    def store(self) -> LeasingRunStore:
        return PackingVolatileRunStore()


class TestForwardingRunStore(RunStoreContract):
    @pytest.fixture
    def store(self) -> RunStore:
        return ForwardingRunStore(VolatileRunStore())


class TestForwardingRunStoreLeases(RunLeaseContract):
    @pytest.fixture
    def store(self) -> LeasingRunStore:
        wrapper = ForwardingRunStore(VolatileRunStore())
        assert isinstance(wrapper, LeasingRunStore)
        return wrapper


class TestStoreWithoutSettlements(RunStoreContract):
    @pytest.fixture
    def store(self) -> RunStore:
        made = UnsettlingStore()
        assert isinstance(made, LeasingRunStore)
        assert not isinstance(made, SettlingRunStore)
        return made


class TestStoreWithoutSettlementsLeases(RunLeaseContract):
    @pytest.fixture
    def store(self) -> LeasingRunStore:
        return UnsettlingStore()


async def _postgres_store(conninfo: str) -> AsyncIterator[PostgresRunStore]:
    store = await PostgresRunStore.open(conninfo, pool_size=2, lease_seconds=5.0)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def empty_database(postgres_conninfo: str) -> str:
    """The server's ``postgres`` database with polyloop's tables emptied (if they exist yet),
    so every test starts from an empty store without the cost of a new database."""
    import psycopg

    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN IF to_regclass('polyloop_records') IS NOT NULL THEN "
            "TRUNCATE polyloop_records, polyloop_runs, polyloop_leases; END IF; END $$"
        )
    return postgres_conninfo


class TestPostgresRunStore(RunStoreContract):
    @pytest.fixture
    async def store(self, empty_database: str) -> AsyncIterator[RunStore]:
        async for made in _postgres_store(empty_database):
            yield made


class TestPostgresRunLeases(RunLeaseContract):
    @pytest.fixture
    async def store(self, empty_database: str) -> AsyncIterator[LeasingRunStore]:
        async for made in _postgres_store(empty_database):
            yield made

    @pytest.fixture
    async def second_store(self, empty_database: str) -> AsyncIterator[LeasingRunStore]:
        # A second pool on the same database: another process's view of the leases.
        async for made in _postgres_store(empty_database):
            yield made
