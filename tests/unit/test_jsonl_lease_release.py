"""JSONL store: a lease whose lock file descriptor fails to close raises the store's error
family (``StoreUnavailableError``, naming the lock file), never a raw ``OSError``; the lease
is released either way and the run can be leased again."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from polyloop.errors import StoreError, StoreUnavailableError
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl as jsonl_module

pytestmark = pytest.mark.unit


async def test_a_failing_close_at_release_is_a_store_error_and_frees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    lease = await store.acquire_lease("run-1")
    real_close = os.close
    closed: list[int] = []

    def failing_close(descriptor: int) -> None:
        real_close(descriptor)  # POSIX: the descriptor is gone even when close reports EIO
        closed.append(descriptor)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(jsonl_module.os, "close", failing_close)
    with pytest.raises(StoreUnavailableError) as caught:
        await lease.release()
    monkeypatch.undo()
    assert isinstance(caught.value, StoreError)
    assert ".lock" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)
    assert len(closed) == 1
    again = await store.acquire_lease("run-1")  # the flock went with the descriptor
    await again.release()
