"""JSONL store: every sync is the one ``_fsync`` (design 0219), ``fcntl(F_FULLFSYNC)`` where
the platform has it (macOS; as SQLite's ``fullfsync``), ``os.fsync`` elsewhere, and
``os.fsync`` too where the file system refuses ``F_FULLFSYNC`` as unsupported.

The platform is simulated: ``F_FULLFSYNC`` is set on (or removed from) the ``fcntl`` module
and its calls are recorded, so both branches run on every machine. That a barrier, a start and
a lease reach ``_fsync`` at all is pinned by ``test_stores.py`` and ``test_lease_base.py``
(``tests/_syncs.py`` records it).
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from pathlib import Path

import pytest

from _syncs import INTENT, RUN, STARTED
from polyloop.errors import StoreUnavailableError
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl as jsonl_module

fcntl = pytest.importorskip("fcntl", reason="POSIX only: the store syncs with os.fsync elsewhere")

pytestmark = pytest.mark.unit

F_FULLFSYNC = 51  # macOS's value; any number does, the call is recorded, not made


class Syncs:
    """The ``fcntl.fcntl`` calls with ``F_FULLFSYNC`` and the ``os.fsync`` calls, each as
    ``("file" | "directory", inode)``; ``refuse`` makes ``F_FULLFSYNC`` raise it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full: list[tuple[str, int]] = []
        self.plain: list[tuple[str, int]] = []
        self.refuse: OSError | None = None
        real_fcntl, real_fsync = fcntl.fcntl, os.fsync

        def fake_fcntl(descriptor: int, command: int, *args: object) -> object:
            if command != F_FULLFSYNC:
                return real_fcntl(descriptor, command, *args)  # type: ignore[call-overload]
            if self.refuse is not None:
                raise self.refuse
            self.full.append(_describe(descriptor))
            real_fsync(descriptor)  # the sync still happens, so the files are durable
            return 0

        def fake_fsync(descriptor: int) -> None:
            self.plain.append(_describe(descriptor))
            real_fsync(descriptor)

        monkeypatch.setattr(fcntl, "fcntl", fake_fcntl)
        monkeypatch.setattr(os, "fsync", fake_fsync)


def _describe(descriptor: int) -> tuple[str, int]:
    info = os.fstat(descriptor)
    return ("directory" if stat.S_ISDIR(info.st_mode) else "file", info.st_ino)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    return Syncs(monkeypatch)


async def _start_and_intend(directory: Path) -> None:
    store = JsonlRunStore(directory=directory)
    await store.write_run_started(STARTED)
    await store.write_intent(INTENT)


async def test_where_f_fullfsync_exists_every_sync_is_a_full_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs
) -> None:
    """As on macOS: the start (the file, then the directory entry), a barrier, and a
    lease's lock file are all ``fcntl(F_FULLFSYNC)``; ``os.fsync`` is never called."""
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", F_FULLFSYNC, raising=False)
    directory = tmp_path / "logs"
    await _start_and_intend(directory)
    log_inode = (directory / f"{RUN}.jsonl").stat().st_ino
    assert syncs.full[1:] == [("directory", directory.stat().st_ino), ("file", log_inode)]
    assert syncs.full[0][0] == "file"  # the start's temporary file, linked to the log's name
    assert syncs.plain == []
    lease = await JsonlRunStore(directory=directory).acquire_lease("other")
    await lease.release()
    assert len(syncs.full) == 4
    assert syncs.plain == []


async def test_where_f_fullfsync_does_not_exist_every_sync_is_os_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs
) -> None:
    """As on Linux and the BSDs: ``os.fsync``, and no ``F_FULLFSYNC`` call."""
    monkeypatch.delattr(fcntl, "F_FULLFSYNC", raising=False)
    directory = tmp_path / "logs"
    await _start_and_intend(directory)
    log_inode = (directory / f"{RUN}.jsonl").stat().st_ino
    assert syncs.plain[1:] == [("directory", directory.stat().st_ino), ("file", log_inode)]
    assert syncs.full == []


@pytest.mark.parametrize("code", ["ENOTSUP", "EINVAL", "ENOTTY"])
async def test_a_file_system_without_f_fullfsync_gets_os_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs, code: str
) -> None:
    """``F_FULLFSYNC`` refused as unsupported (a network or FUSE file system): the same
    descriptor is synced with ``os.fsync`` instead, and the write succeeds."""
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", F_FULLFSYNC, raising=False)
    syncs.refuse = OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
    await _start_and_intend(tmp_path)
    log_inode = (tmp_path / f"{RUN}.jsonl").stat().st_ino
    assert syncs.plain[-1] == ("file", log_inode)
    assert len(syncs.plain) == 3  # the start's file, the directory, the intent
    assert (await JsonlRunStore(directory=tmp_path).read_log(RUN)).intents == (INTENT,)


async def test_any_other_failure_of_f_fullfsync_reaches_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: Syncs
) -> None:
    """An I/O error is not "unsupported": the barrier fails with ``StoreUnavailableError``
    rather than pretending an ``os.fsync`` made the record durable."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", F_FULLFSYNC, raising=False)
    syncs.plain.clear()
    syncs.refuse = OSError(errno.EIO, "Input/output error")
    with pytest.raises(StoreUnavailableError) as caught:
        await store.write_intent(INTENT)
    assert caught.value.errno == errno.EIO
    assert syncs.plain == []
    syncs.refuse = None
    await asyncio.wait_for(store.write_intent(INTENT), timeout=5)  # the run is free again
    assert syncs.full == [("file", (tmp_path / f"{RUN}.jsonl").stat().st_ino)]


def test_the_store_has_one_sync_function() -> None:
    """No other ``os.fsync`` in the store's module: every sync goes through ``_fsync``."""
    source = Path(jsonl_module.__file__).read_text(encoding="utf-8")
    assert source.count("os.fsync(") == 1
