"""``RunStoreContract`` and ``RunLeaseContract`` wired to the shipped stores.

One suite, two very different shapes (an append-only file per run, and encoded payloads in
memory): an assertion that holds for only one of them goes red here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polyloop.ports import LeasingRunStore, RunStore
from polyloop.stores import JsonlRunStore, VolatileRunStore
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
