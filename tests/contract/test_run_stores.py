"""``RunStoreContract`` wired to both shipped stores.

One suite, two very different shapes (an append-only file per run, and encoded payloads in
memory): an assertion that holds for only one of them goes red here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polyloop.ports import RunStore
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.testing import RunStoreContract

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
