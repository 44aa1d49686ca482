"""JSONL store: the writer threads that sync its barriers keep the promises of the executor
they replaced (design 0214; design 0219).

The store writes a barrier's bytes on the loop's thread and syncs them in threads of its own;
a write that creates the file or cuts a torn tail runs whole in a thread. What the loop's
default executor gave for free is pinned here: a write whose caller was cancelled still
completes when the interpreter exits right after (``asyncio.run`` used to wait for the
executor), a forked child writes with threads of its own, and a write or a sync that fails
reaches its caller as the store's error.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import polyloop
from _syncs import INTENT, RUN, STARTED, SyncGate
from polyloop.errors import StoreUnavailableError
from polyloop.ports import RunLog
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl as jsonl_module
from polyloop.types import Intent, IntentKind, ReplayPolicy, RunStarted

pytestmark = pytest.mark.unit


_PREAMBLE = """
import asyncio, os, sys, time
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl
from polyloop.types import Intent, IntentKind, ReplayPolicy, RunStarted
STARTED = RunStarted(run_id="r1", parameter_snapshot={"k": "v"})
INTENT = Intent(run_id="r1", kind=IntentKind.MODEL_CALL, call_index=0, result_id="m0",
                replay_policy=ReplayPolicy.NEVER)
store = JsonlRunStore(directory=sys.argv[1])
"""

_CANCEL_THEN_EXIT = """
async def main():
    await store.write_run_started(STARTED)
    slow_down()
    write = asyncio.ensure_future(store.write_intent(INTENT))
    await asyncio.sleep(0.05)  # the intent is in flight (slowed down by slow_down)
    write.cancel()
    try:
        await write
    except asyncio.CancelledError:
        print("cancelled")

asyncio.run(main())
# The interpreter exits here, with the intent still in flight.
"""

_CANCELLED_THEN_EXIT = (
    """
real = _jsonl._write_all_bytes

def slow(descriptor, data):
    time.sleep(0.5)
    real(descriptor, data)

def slow_down():
    # A torn tail: the next write runs whole in a writer thread (cut, write, sync), which
    # sleeps before its bytes.
    with open(os.path.join(sys.argv[1], "r1.jsonl"), "ab") as log:
        log.write(b'{"torn')
    _jsonl._write_all_bytes = slow
"""
    + _CANCEL_THEN_EXIT
)

_CANCELLED_SYNC_THEN_EXIT = (
    """
real = _jsonl._fsync

def slow(descriptor):
    time.sleep(0.5)
    real(descriptor)
    with open(os.path.join(sys.argv[1], "synced"), "w"):  # the sync did finish
        pass

def slow_down():
    # The bytes are written on the loop; the sync sleeps in its thread.
    _jsonl._fsync = slow
"""
    + _CANCEL_THEN_EXIT
)

_FORKED_CHILD_WRITES = """
asyncio.run(store.write_run_started(STARTED))  # the parent's writer thread exists now
asyncio.run(store.write_intent(INTENT))  # and has synced a barrier
pid = os.fork()
if pid == 0:
    try:
        asyncio.run(asyncio.wait_for(store.write_intent(INTENT), 10))
    except BaseException:
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit code", os.waitstatus_to_exitcode(status))
"""


def _run_child(script: str, directory: Path) -> subprocess.CompletedProcess[str]:
    source = str(Path(polyloop.__file__).resolve().parents[1])
    command = [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _PREAMBLE + script]
    return subprocess.run(
        [*command, str(directory)],
        env={**os.environ, "PYTHONPATH": source},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_a_cancelled_write_completes_when_the_interpreter_exits_right_after(
    tmp_path: Path,
) -> None:
    """The caller was told ``CancelledError``; the write was still in its thread (it had a
    torn tail to cut), and ``asyncio.run`` returned. The bytes still land before the process
    ends (the exit hook lets queued and running writes finish), as they did with the loop's
    default executor."""
    child = await asyncio.to_thread(_run_child, _CANCELLED_THEN_EXIT, tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "cancelled"
    log = await JsonlRunStore(directory=tmp_path).read_log(RUN)
    assert log.intents == (INTENT,)


async def test_a_cancelled_sync_completes_when_the_interpreter_exits_right_after(
    tmp_path: Path,
) -> None:
    """The same with only the sync in flight: the bytes were written before it was handed
    off, and a writer thread's sync still finishes before the process ends (the marker its
    ``fsync`` writes after syncing is there)."""
    child = await asyncio.to_thread(_run_child, _CANCELLED_SYNC_THEN_EXIT, tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "cancelled"
    log = await JsonlRunStore(directory=tmp_path).read_log(RUN)
    assert log.intents == (INTENT,)
    assert (tmp_path / "synced").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork exists only on POSIX")
async def test_a_forked_child_writes_with_threads_of_its_own(tmp_path: Path) -> None:
    """Threads do not survive ``fork``: without starting afresh, the child would queue its
    write for a thread that exists only in the parent and wait forever."""
    child = await asyncio.to_thread(_run_child, _FORKED_CHILD_WRITES, tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "child exit code 0"
    log = await JsonlRunStore(directory=tmp_path).read_log(RUN)
    assert log.intents == (INTENT, INTENT)


async def test_a_failed_write_reaches_the_caller_and_frees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write's ``OSError`` is the caller's ``StoreUnavailableError``; the run's lock is
    free again, so the next write goes through."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    real = jsonl_module._write_all_bytes
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def full_once(descriptor: int, data: bytes) -> None:
        if failures:
            raise failures.pop()
        real(descriptor, data)

    monkeypatch.setattr(jsonl_module, "_write_all_bytes", full_once)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.write_intent(INTENT)
    assert caught.value.errno == errno.ENOSPC
    await asyncio.wait_for(store.write_intent(INTENT), timeout=5)
    assert (await store.read_log(RUN)).intents == (INTENT,)


async def test_a_failed_sync_in_the_thread_reaches_the_caller_and_frees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync that fails in its writer thread (an I/O error of the disk) is the caller's
    ``StoreUnavailableError``; the next write goes through."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    real = jsonl_module._fsync
    failures = [OSError(errno.EIO, "Input/output error")]

    def failing_once(descriptor: int) -> None:
        if failures:
            raise failures.pop()
        real(descriptor)

    monkeypatch.setattr(jsonl_module, "_fsync", failing_once)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.write_intent(INTENT)
    assert caught.value.errno == errno.EIO
    await asyncio.wait_for(store.write_intent(INTENT), timeout=5)
    assert (await store.read_log(RUN)).intents[-1] == INTENT


def _intent(run_id: str) -> Intent:
    return Intent(
        run_id=run_id,
        kind=IntentKind.MODEL_CALL,
        call_index=0,
        result_id="m0",
        replay_policy=ReplayPolicy.NEVER,
    )


async def test_writes_of_different_runs_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A barrier of one run stuck in its sync (a slow disk) does not hold up another run's:
    a second thread takes it."""
    store = JsonlRunStore(directory=tmp_path)
    for run_id in ("slow", "fast"):
        await store.write_run_started(RunStarted(run_id=run_id, parameter_snapshot={}))
    gate = SyncGate(monkeypatch, tmp_path / "slow.jsonl")
    slow = asyncio.create_task(store.write_intent(_intent("slow")))
    try:
        assert await asyncio.to_thread(gate.entered.wait, 10)
        await asyncio.wait_for(store.write_intent(_intent("fast")), timeout=5)
        assert not slow.done()
    finally:
        gate.open()
    await asyncio.wait_for(slow, timeout=5)
    assert (await store.read_log("slow")).intents == (_intent("slow"),)


async def test_writes_beyond_the_thread_limit_wait_and_all_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one thread allowed, the syncs of three runs queue behind the one in the thread
    and are all done once it is."""
    writers = jsonl_module._WriterThreads()
    writers.MAX_THREADS = 1  # type: ignore[misc]
    monkeypatch.setattr(jsonl_module, "_WRITERS", writers)
    store = JsonlRunStore(directory=tmp_path)
    runs = ("a", "b", "c")
    for run_id in runs:
        await store.write_run_started(RunStarted(run_id=run_id, parameter_snapshot={}))
    gate = SyncGate(monkeypatch, tmp_path / "a.jsonl")
    try:
        writes = [asyncio.create_task(store.write_intent(_intent(run_id))) for run_id in runs]
        assert await asyncio.to_thread(gate.entered.wait, 10)
        await asyncio.sleep(0.05)
        assert not any(write.done() for write in writes)
    finally:
        gate.open()
    await asyncio.wait_for(asyncio.gather(*writes), timeout=5)
    for run_id in runs:
        assert (await store.read_log(run_id)).intents == (_intent(run_id),)
    await asyncio.to_thread(writers.drain)


async def test_a_loop_closed_while_its_write_runs_is_not_woken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller was cancelled and its loop closed while the sync was still to come: the
    write lands, and the thread neither fails nor wakes the closed loop (nobody waits)."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    gate = SyncGate(monkeypatch, tmp_path / f"{RUN}.jsonl")
    failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)

    async def cancelled_write() -> None:
        write = asyncio.create_task(store.write_intent(INTENT))
        assert await asyncio.to_thread(gate.entered.wait, 10)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write

    await asyncio.to_thread(asyncio.run, cancelled_write())  # its loop is closed on return
    gate.open()
    reread = JsonlRunStore(directory=tmp_path)
    for _ in range(500):
        if (await reread.read_log(RUN)).intents:
            break
        await asyncio.sleep(0.01)
    assert (await reread.read_log(RUN)).intents == (INTENT,)
    await asyncio.wait_for(reread.write_intent(INTENT), timeout=5)  # the threads still serve
    assert (await reread.read_log(RUN)).intents == (INTENT, INTENT)
    assert failures == []


async def test_a_loop_without_add_reader_is_woken_another_way(tmp_path: Path) -> None:
    """A loop that cannot watch a pipe (Windows' proactor loop) gets its writes' answers
    through ``call_soon_threadsafe``."""

    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, *args: Any) -> None:
            raise NotImplementedError("no readers here")

    def write_on_that_loop() -> RunLog:
        loop = NoReaders()
        try:
            store = JsonlRunStore(directory=tmp_path)
            loop.run_until_complete(store.write_run_started(STARTED))
            loop.run_until_complete(store.write_intent(INTENT))
            return loop.run_until_complete(store.read_log(RUN))
        finally:
            loop.close()

    log = await asyncio.to_thread(write_on_that_loop)
    assert log.intents == (INTENT,)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_loops_that_come_and_go_leave_no_descriptors_behind(tmp_path: Path) -> None:
    """Each loop gets a pipe its writes wake it through; a loop that is gone takes it
    along."""
    store = JsonlRunStore(directory=tmp_path)
    asyncio.run(store.write_run_started(STARTED))
    asyncio.run(store.write_intent(INTENT))  # the writer thread and its pipe exist now
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        asyncio.run(store.write_intent(INTENT))
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before
    assert len(asyncio.run(store.read_log(RUN)).intents) == 21
