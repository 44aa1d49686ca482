"""Seeing and holding the JSONL store's ``fsync``s, whichever way they run.

A barrier's bytes are written on the loop's thread; its sync runs in the kernel (Linux AIO,
``polyloop.stores._kernel_sync``) where it can, else in a writer thread (``os.fsync``).
Durability tests must see every sync either way (``SyncRecorder``), and tests that hold a sync
in flight must hold it on both paths (``SyncGate``). ``use_sync_path`` picks the path a test
runs on: ``"kernel"`` skips (fails in CI) where the kernel cannot take syncs, ``"threads"``
turns the kernel path off.
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from _infra import skip_unless_available
from polyloop.stores._kernel_sync import KERNEL_SYNC

__all__ = ["SYNC_PATHS", "SyncGate", "SyncRecorder", "use_sync_path"]

SYNC_PATHS = ("kernel", "threads")

Done = Callable[[BaseException | None], None]


def use_sync_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Make the JSONL store sync through ``path`` (one of ``SYNC_PATHS``) for this test."""
    if path == "threads":
        monkeypatch.setattr(KERNEL_SYNC, "enabled", False)
        return
    assert path == "kernel", path
    skip_unless_available(
        KERNEL_SYNC.available(),
        what="Linux native AIO (io_setup) for the JSONL store's kernel syncs",
        how_to_install="run on Linux 4.18 or later without a seccomp filter on io_setup",
    )


class SyncRecorder:
    """Records every sync, ``os.fsync`` or handed to the kernel: ``(kind, inode)``, where kind
    is ``"file"`` or ``"directory"``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        real_fsync, real_submit = os.fsync, KERNEL_SYNC.submit

        def fsync(descriptor: int) -> None:
            self._note(descriptor)
            real_fsync(descriptor)

        def submit(loop: asyncio.AbstractEventLoop, descriptor: int, done: Done) -> bool:
            self._note(descriptor)  # before: another loop may close it once it is answered
            taken = real_submit(loop, descriptor, done)
            if not taken:
                self.calls.pop()  # refused: the writer thread's ``os.fsync`` records it
            return taken

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(KERNEL_SYNC, "submit", submit)

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
    held. On the thread path the writer thread waits inside ``os.fsync``; on the kernel path
    the sync completes but its answer is held back, so the write is still in flight for the
    store (its caller waits, the run's lock stays taken) exactly as while the disk is slow."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.entered = threading.Event()
        self._gate = threading.Event()
        self._held: list[tuple[asyncio.AbstractEventLoop, Done, BaseException | None]] = []
        self._lock = threading.Lock()
        self._path = path
        real_fsync, real_submit = os.fsync, KERNEL_SYNC.submit

        def fsync(descriptor: int) -> None:
            if self._matches(descriptor):
                self.entered.set()
                if not self._gate.wait(timeout=10):
                    raise TimeoutError("the gate was never opened")
            real_fsync(descriptor)

        def submit(loop: asyncio.AbstractEventLoop, descriptor: int, done: Done) -> bool:
            if not self._matches(descriptor):
                return real_submit(loop, descriptor, done)

            def held(error: BaseException | None) -> None:
                with self._lock:
                    if not self._gate.is_set():
                        self._held.append((loop, done, error))
                        return
                done(error)

            taken = real_submit(loop, descriptor, held)
            if taken:
                self.entered.set()
            return taken

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(KERNEL_SYNC, "submit", submit)

    def _matches(self, descriptor: int) -> bool:
        try:
            wanted = os.stat(self._path)
        except FileNotFoundError:
            return False
        info = os.fstat(descriptor)
        return (info.st_dev, info.st_ino) == (wanted.st_dev, wanted.st_ino)

    def open(self) -> None:
        """Let the held syncs finish: each held answer is delivered on its own loop."""
        with self._lock:
            self._gate.set()
            held, self._held = self._held, []
        for loop, done, error in held:
            if not loop.is_closed():
                loop.call_soon_threadsafe(done, error)
