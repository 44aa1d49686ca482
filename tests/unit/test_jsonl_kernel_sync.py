"""JSONL store: the syncs it hands to the kernel (Linux AIO, design 0214, fourth pass).

A barrier's bytes are written on the loop's thread and only its ``fsync`` goes to the kernel
(``polyloop.stores._kernel_sync``). These tests pin the table in that module's docstring: a
barrier is synced there and nowhere else, a sync the kernel answers with an error is the
caller's ``StoreUnavailableError``, a sync the kernel refuses runs in a writer thread instead,
answers reach the loop that waits for them when several loops share the one context, and a
loop that is gone leaves no descriptor behind. The writer-thread path and the promises both
paths share are ``test_jsonl_writer_threads.py``'s and ``test_stores.py``'s.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import gc
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from _syncs import use_sync_path
from polyloop.errors import StoreUnavailableError
from polyloop.stores import JsonlRunStore
from polyloop.stores import _kernel_sync as kernel_sync
from polyloop.stores._kernel_sync import KERNEL_SYNC
from polyloop.types import Intent, IntentKind, ReplayPolicy, RunStarted

pytestmark = pytest.mark.unit


def _started(run_id: str) -> RunStarted:
    return RunStarted(run_id=run_id, parameter_snapshot={"k": "v"})


def _intent(run_id: str, call_index: int = 0) -> Intent:
    return Intent(
        run_id=run_id,
        kind=IntentKind.MODEL_CALL,
        call_index=call_index,
        result_id=f"m{call_index}",
        replay_policy=ReplayPolicy.NEVER,
    )


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The kernel path, and its live system-call layer (for the tests that fake an answer)."""
    use_sync_path(monkeypatch, "kernel")
    return KERNEL_SYNC._abi


async def test_a_barrier_is_synced_by_the_kernel_not_by_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Any
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(_started("r1"))
    thread_syncs: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (thread_syncs.append(fd), real(fd))[1])
    before = KERNEL_SYNC.submitted
    await store.write_intent(_intent("r1"))
    assert (KERNEL_SYNC.submitted - before, thread_syncs) == (1, [])
    assert (await store.read_log("r1")).intents == (_intent("r1"),)


async def test_an_error_the_kernel_answers_is_the_callers_and_frees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Any
) -> None:
    """The kernel's ``-EIO`` for the sync becomes ``StoreUnavailableError`` with that errno,
    naming the file; the run's lock is free again and the next write goes through."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(_started("r1"))
    real_collect = kernel.collect
    failures = [True]

    def collect_with_one_failure() -> list[tuple[int, int]]:
        answers = real_collect()
        if answers and failures:
            failures.pop()
            token, _ = answers[0]
            answers[0] = (token, -errno.EIO)
        return answers

    monkeypatch.setattr(kernel, "collect", collect_with_one_failure)
    with pytest.raises(StoreUnavailableError) as caught:
        await asyncio.wait_for(store.write_intent(_intent("r1")), timeout=5)
    assert caught.value.errno == errno.EIO
    assert "r1.jsonl" in str(caught.value)
    await asyncio.wait_for(store.write_intent(_intent("r1", 1)), timeout=5)
    assert (await store.read_log("r1")).intents[-1] == _intent("r1", 1)


async def test_a_sync_the_kernel_refuses_runs_in_a_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Any
) -> None:
    """A full queue (``EAGAIN``) or a file without AIO ``fsync``: the same descriptor is
    synced by ``os.fsync`` in a writer thread, and the write returns after it."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(_started("r1"))
    monkeypatch.setattr(kernel, "submit_fsync", lambda token, descriptor, eventfd: False)
    thread_syncs: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (thread_syncs.append(fd), real(fd))[1])
    await asyncio.wait_for(store.write_intent(_intent("r1")), timeout=5)
    assert len(thread_syncs) == 1
    assert (await store.read_log("r1")).intents == (_intent("r1"),)


async def test_loops_in_threads_each_get_their_own_answers(tmp_path: Path, kernel: Any) -> None:
    """One kernel context, four loops in four threads, 25 barriers each: every write returns
    (an answer collected by the wrong loop is passed on to its own) and every record is
    there, in order."""
    store_directory = tmp_path

    def one_loop(run_id: str) -> None:
        async def writes() -> None:
            store = JsonlRunStore(directory=store_directory)
            await store.write_run_started(_started(run_id))
            for call in range(25):
                await asyncio.wait_for(store.write_intent(_intent(run_id, call)), timeout=10)

        asyncio.run(writes())

    threads = [threading.Thread(target=one_loop, args=(f"run-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive()
    reader = JsonlRunStore(directory=tmp_path)
    for i in range(4):
        intents = (await reader.read_log(f"run-{i}")).intents
        assert intents == tuple(_intent(f"run-{i}", call) for call in range(25))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_sync_answered_after_its_loop_closed_closes_its_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Any
) -> None:
    """The caller's loop is gone before it collects its answer: the next loop to collect
    answers closes the log's descriptor (nobody is told: nobody waits)."""
    store = JsonlRunStore(directory=tmp_path)
    asyncio.run(store.write_run_started(_started("r1")))
    asyncio.run(store.write_intent(_intent("r1")))  # the context exists
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    with monkeypatch.context() as deaf:
        # This loop never reads its eventfd: the answer stays with the kernel until another
        # loop collects, as when a loop closes before the disk answers.
        deaf.setattr(kernel_sync._Completions, "_wake", lambda self, owner: None)

        async def cancelled_write() -> None:
            write = asyncio.create_task(store.write_intent(_intent("r1", 1)))
            await asyncio.sleep(0.05)
            assert not write.done()
            write.cancel()
            with pytest.raises(asyncio.CancelledError):
                await write

        asyncio.run(cancelled_write())
    other = JsonlRunStore(directory=tmp_path)
    asyncio.run(asyncio.wait_for(other.write_intent(_intent("r1", 2)), 5))  # collects both
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before
    intents = asyncio.run(other.read_log("r1")).intents
    assert intents == (_intent("r1"), _intent("r1", 1), _intent("r1", 2))


async def test_a_submit_that_raises_closes_the_log_and_frees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Any
) -> None:
    """Neither the kernel nor a thread took the sync: the caller gets the store's error, the
    log's descriptor is closed, and the next write goes through."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(_started("r1"))
    opened: list[int] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(real_open(*a, **k)) or opened[-1])

    def broken(loop: object, descriptor: int, done: object) -> bool:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(KERNEL_SYNC, "submit", broken)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.write_intent(_intent("r1"))
    assert caught.value.errno == errno.ENOMEM
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(opened[-1])
    monkeypatch.undo()
    use_sync_path(monkeypatch, "kernel")
    await asyncio.wait_for(store.write_intent(_intent("r1", 1)), timeout=5)
    assert (await store.read_log("r1")).intents[-1] == _intent("r1", 1)


def test_only_a_64_bit_interpreter_on_a_known_cpu_gets_the_system_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 32-bit interpreter on an x86-64 kernel has other system-call numbers (206 is
    ``setgroups32`` there): it must never call them."""
    monkeypatch.setattr(kernel_sync.platform, "machine", lambda: "x86_64")
    assert kernel_sync.syscall_numbers() == (206, 209, 208)
    monkeypatch.setattr(kernel_sync, "_POINTER_BYTES", 4)  # as if pointers were not 8 bytes
    assert kernel_sync.syscall_numbers() is None
    assert kernel_sync._Abi.open() is None
    monkeypatch.setattr(kernel_sync, "_POINTER_BYTES", 8)
    monkeypatch.setattr(kernel_sync.platform, "machine", lambda: "riscv64")
    assert kernel_sync.syscall_numbers() is None


def test_the_structures_have_the_kernels_sizes() -> None:
    """``struct iocb`` is 64 bytes and ``struct io_event`` 32 (``linux/aio_abi.h``): a field
    of the wrong width would hand the kernel another descriptor or another opcode."""
    assert ctypes.sizeof(kernel_sync._Request) == 64
    assert ctypes.sizeof(kernel_sync._Answer) == 32
    request = kernel_sync._Request(aio_lio_opcode=2, aio_flags=1, aio_fildes=7, aio_resfd=9)
    raw = bytes(request)
    assert (raw[16:18], raw[20:24], raw[56:60], raw[60:64]) == (
        (2).to_bytes(2, "little"),
        (7).to_bytes(4, "little"),
        (1).to_bytes(4, "little"),
        (9).to_bytes(4, "little"),
    )


def test_nothing_goes_to_the_kernel_when_it_is_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KERNEL_SYNC, "enabled", False)
    loop = asyncio.new_event_loop()
    try:
        read, write = os.pipe()
        try:
            assert not KERNEL_SYNC.submit(loop, read, lambda error: None)
        finally:
            os.close(read)
            os.close(write)
    finally:
        loop.close()
