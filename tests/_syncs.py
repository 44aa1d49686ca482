"""Seeing and holding the JSONL store's syncs.

Every sync of the JSONL store, of a log, a directory or a lease's lock file, goes through
``polyloop.stores._jsonl._fsync`` (design 0219: ``F_FULLFSYNC`` on macOS, ``os.fsync``
elsewhere); a barrier's runs in a writer thread. Durability tests see every sync
(``SyncRecorder``); tests that hold a sync in flight hold it there (``SyncGate``), so the
write is in flight for the store (its caller waits, the run's lock stays taken) exactly as
while the disk is slow.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from polyloop.stores import _jsonl
from polyloop.types import Intent, IntentKind, ReplayPolicy, RunStarted

__all__ = ["INTENT", "RUN", "STARTED", "SyncGate", "SyncRecorder"]

RUN = "r1"
"""The run the JSONL sync tests write: its start and a barrier intent."""
STARTED = RunStarted(run_id=RUN, parameter_snapshot={"k": "v"})
INTENT = Intent(
    run_id=RUN,
    kind=IntentKind.MODEL_CALL,
    call_index=0,
    result_id="m0",
    replay_policy=ReplayPolicy.NEVER,
)


class SyncRecorder:
    """Records every sync: ``(kind, inode)``, where kind is ``"file"`` or ``"directory"``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        real_fsync = _jsonl._fsync

        def fsync(descriptor: int) -> None:
            self._note(descriptor)
            real_fsync(descriptor)

        monkeypatch.setattr(_jsonl, "_fsync", fsync)

    def _note(self, descriptor: int) -> None:
        info = os.fstat(descriptor)
        self.calls.append(("directory" if stat.S_ISDIR(info.st_mode) else "file", info.st_ino))

    def kinds(self) -> list[str]:
        """The kinds recorded since the last call."""
        kinds = [kind for kind, _ in self.calls]
        self.calls.clear()
        return kinds


class SyncGate:
    """Holds the syncs of one file (``path``) until ``open()``: ``entered`` is set once one is
    held. The writer thread waits inside the sync."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.entered = threading.Event()
        self._gate = threading.Event()
        self._path = path
        real_fsync = _jsonl._fsync

        def fsync(descriptor: int) -> None:
            if self._matches(descriptor):
                self.entered.set()
                if not self._gate.wait(timeout=10):
                    raise TimeoutError("the gate was never opened")
            real_fsync(descriptor)

        monkeypatch.setattr(_jsonl, "_fsync", fsync)

    def _matches(self, descriptor: int) -> bool:
        try:
            wanted = os.stat(self._path)
        except FileNotFoundError:
            return False
        info = os.fstat(descriptor)
        return (info.st_dev, info.st_ino) == (wanted.st_dev, wanted.st_ino)

    def open(self) -> None:
        """Let the held syncs finish."""
        self._gate.set()
