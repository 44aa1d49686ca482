"""``fsync`` without a thread: Linux's native AIO syncs a file while the event loop runs on.

The JSONL store's barriers (design 0214, fourth pass) write their bytes on the loop's thread and
hand only the ``fsync`` to the kernel: ``io_submit`` with ``IOCB_CMD_FSYNC`` (Linux 4.18 and
later run it on a kernel worker), the completion signalled on an ``eventfd`` the loop watches
with ``add_reader``. The sync is the same ``vfs_fsync`` of the same descriptor that
``os.fsync`` runs: the durability rule does not change, only who waits. What it saves is the
hand-off to a writer thread: on tmpfs a JSONL step costs ~135 µs of CPU with the kernel's
syncs against ~280 with the threads' on a quiet 2-vCPU VM; on this VM's disk ~240 against
~270, the rest being what waiting for the disk costs the loop's vCPU, which any store that
waits pays (``python -m tools.bench.sync_cost``, its ``waits-only`` row; design 0214, fifth
pass; ``research-wiki/reference/performance.md``).

===================================  ========================================================
rule                                 how
===================================  ========================================================
where it is used                     Linux on x86-64 or AArch64, a 64-bit interpreter
                                     (``syscall_numbers``), ``os.eventfd``, a loop with
                                     ``add_reader``; ``submit`` says ``False`` anywhere else,
                                     and when the kernel refuses (no AIO, a seccomp filter,
                                     ``aio-max-nr`` reached, a full queue, a file without
                                     AIO ``fsync``): the caller syncs in a writer thread
one context for the process          made on the first ``submit`` (``io_setup``, 64
                                     requests, about 128 of the machine's ``aio-max-nr``),
                                     never destroyed (``io_destroy`` waits for every sync in
                                     flight); each loop has its own ``eventfd``, named in
                                     each request it submits
``done(error)`` on the loop's thread  after the kernel's answer: ``None``, or ``OSError``
                                     with the kernel's ``errno``; the descriptor is closed
                                     first, whatever the answer (an error closing it after
                                     the sync is not reported: the record is durable)
answers for another loop             a loop that collects an answer that belongs to another
                                     loop (one context, many loops in threads) queues it for
                                     that loop and signals its ``eventfd``
a closed loop                        its answers are still collected (by any loop that
                                     collects later) and their descriptors closed; ``done`` is
                                     dropped (nobody waits)
a cancelled caller                   changes nothing here: the sync completes and ``done``
                                     runs (the JSONL store then frees the run's write lock)
interpreter exit, a killed process   the bytes were written before the submit (they are in
                                     the page cache, as after a write that returned); a sync
                                     in flight was never acknowledged to anyone
a forked child                       forgets the parent's context and loops and closes its
                                     copies of the descriptors in flight
                                     (``os.register_at_fork``): AIO contexts are not inherited
===================================  ========================================================

Tests force the thread path by setting ``KERNEL_SYNC.enabled = False``; ``submitted`` counts the
syncs handed to the kernel (the benchmarks' fsync meter reads it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import platform
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = ["KERNEL_SYNC", "KernelSync"]

Done = Callable[[BaseException | None], None]

_SYSCALLS = {  # io_setup, io_submit, io_getevents
    "x86_64": (206, 209, 208),
    "aarch64": (0, 2, 4),
}


def syscall_numbers() -> tuple[int, int, int] | None:
    """This interpreter's numbers for ``io_setup``, ``io_submit`` and ``io_getevents``, or
    ``None``. ``platform.machine()`` names the kernel's CPU, not the interpreter's: a 32-bit
    interpreter (i386, x32) on an x86-64 kernel has other numbers (206 is ``setgroups32``
    there), so only a 64-bit interpreter is served."""
    if ctypes.sizeof(ctypes.c_void_p) != _POINTER_BYTES:
        return None
    return _SYSCALLS.get(platform.machine())


_POINTER_BYTES = 8
_IOCB_CMD_FSYNC = 2
_IOCB_FLAG_RESFD = 1
_QUEUE_DEPTH = 64
"""Syncs in flight at once for the whole process; a submit beyond that is refused (``EAGAIN``)
and that write is synced in a writer thread. The kernel counts about twice this against the
machine's ``fs.aio-max-nr`` (65,536 by default) for as long as the process lives: kept small so
that many processes, and other programs that use native AIO (databases), still get theirs."""
_HARVEST = 64


def _gone() -> None:
    """Stands in for a dead weak reference."""
    return None


class KernelSync:
    """Submits ``fsync``s to the kernel and runs their callbacks on the submitting loop.

    One instance for the process (``KERNEL_SYNC``); the module docstring's table is its
    contract.
    """

    def __init__(self) -> None:
        self.enabled = sys.platform == "linux" and hasattr(os, "eventfd")
        self.submitted = 0
        self._abi: _Abi | None = None
        self._broken = False
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[_Completions, Done, int]] = {}
        self._next = 0
        self._last: tuple[Callable[[], object], Callable[[], _Completions | None]]
        self._last = (_gone, _gone)
        """The loop of the last submit and its ``_Completions``, weakly: most submits are its."""
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Completions | None] = (
            weakref.WeakKeyDictionary()
        )  # ``None``: the loop cannot watch an eventfd

    def available(self) -> bool:
        """Whether ``submit`` can hand syncs to the kernel here (opens the context if needed)."""
        if not self.enabled or self._broken:
            return False
        if self._abi is None:
            with self._lock:  # one context, even when two loops' first submits race
                if self._abi is None and not self._broken:
                    self._abi = _Abi.open()
                    self._broken = self._abi is None
        return not self._broken

    def submit(self, loop: asyncio.AbstractEventLoop, descriptor: int, done: Done) -> bool:
        """Sync ``descriptor`` in the kernel, then close it and call ``done`` on ``loop``'s
        thread. ``False``: nothing was submitted (the descriptor is still the caller's)."""
        if not self.enabled:
            return False
        last_loop, last_completions = self._last
        completions = last_completions()
        if last_loop() is not loop or completions is None:
            completions = self._completions(loop)
            if completions is not None:
                self._last = (weakref.ref(loop), weakref.ref(completions))
        abi = self._abi
        if completions is None or abi is None:
            return False
        with self._lock:
            token = self._next = self._next + 1
            self._pending[token] = (completions, done, descriptor)
            accepted = abi.submit_fsync(token, descriptor, completions.eventfd)
            if not accepted:
                del self._pending[token]
                return False
            self.submitted += 1
        return True

    def _completions(self, loop: asyncio.AbstractEventLoop) -> _Completions | None:
        """``loop``'s eventfd and reader, made on its first submit; ``None`` when there can be
        none (no AIO here, no ``add_reader``, a loop that cannot be weakly referenced)."""
        try:
            with self._lock:
                known, found = loop in self._loops, self._loops.get(loop)
        except TypeError:  # the loop cannot be weakly referenced
            return None
        if known:
            return found
        if not self.available():
            return None
        try:
            found = _Completions(self, loop)
        except NotImplementedError:  # no add_reader: never for this loop
            found = None
        except OSError:  # no eventfd now (EMFILE, ENOMEM): a writer thread syncs this write
            return None
        with self._lock:  # the dictionary is shared by the loops of every thread
            self._loops[loop] = found
        return found

    def collect(self, me: _Completions) -> None:
        """On ``me``'s loop: take every answer the kernel has, run ``me``'s callbacks, queue
        the others' for their loops."""
        abi = self._abi
        assert abi is not None, "a loop collects only after its first submit"
        others: set[_Completions] = set()
        while True:
            with self._lock:
                collected = abi.collect()
                answers = [
                    (self._pending.pop(token), result)
                    for token, result in collected
                    if token in self._pending
                ]
            for index, ((owner, done, descriptor), result) in enumerate(answers):
                try:
                    _route(me, owner, done, descriptor, result, others)
                except BaseException:
                    # Nothing taken from the kernel may be lost: the rest go to their loops'
                    # queues as they are (run at their next wake-up), then the error goes on.
                    for (later, later_done, later_descriptor), later_result in answers[index + 1 :]:
                        later.ready.append((later_done, _answer_error(later_result)))
                        _close(later_descriptor)
                    raise
            if len(collected) < _HARVEST:  # the kernel had no more
                break
        for owner in others:
            owner.signal()
        ready = me.ready
        while ready:
            done, error = ready.popleft()
            done(error)

    def forget(self) -> None:
        """Start from nothing (in a forked child: the parent's context is not there, and the
        child's copies of the descriptors the parent was syncing are closed)."""
        for _, _, descriptor in getattr(self, "_pending", {}).values():
            _close(descriptor)
        self._last = (_gone, _gone)
        self._abi = None
        self._broken = False
        self._lock = threading.Lock()
        self._pending = {}
        self._loops = weakref.WeakKeyDictionary()


def _route(
    me: _Completions,
    owner: _Completions,
    done: Done,
    descriptor: int,
    result: int,
    others: set[_Completions],
) -> None:
    """One answer: close the log's descriptor (an error closing it after the sync is not a
    durability failure and is not reported), then queue ``done`` for the loop that waits."""
    _close(descriptor)
    if owner is me:
        me.ready.append((done, _answer_error(result)))
    elif owner.waiting():
        owner.ready.append((done, _answer_error(result)))
        others.add(owner)
    # else: its loop is closed or gone, nobody waits (and ``done`` would keep that loop alive
    # through its future)


def _answer_error(result: int) -> BaseException | None:
    """The kernel's answer as the error to report: ``None`` for success, else ``OSError``."""
    return None if result >= 0 else OSError(-result, os.strerror(-result))


class _Completions:
    """One loop's side: the ``eventfd`` the kernel signals, and the answers queued for it."""

    __slots__ = ("__weakref__", "_loop", "eventfd", "ready")

    def __init__(self, owner: KernelSync, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self.ready: collections.deque[tuple[Done, BaseException | None]] = collections.deque()
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            loop.add_reader(self.eventfd, self._wake, owner)
        except BaseException:
            os.close(self.eventfd)
            raise
        finalizer = weakref.finalize(self, _close, self.eventfd)
        finalizer.atexit = False

    def _wake(self, owner: KernelSync) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.eventfd)
        owner.collect(self)

    def waiting(self) -> bool:
        """Whether this loop can still run an answer (it exists and is not closed)."""
        loop = self._loop()
        return loop is not None and not loop.is_closed()

    def signal(self) -> None:
        """From another loop's thread: wake this loop to run the answers queued for it."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self.eventfd, 1)


class _Request(ctypes.Structure):
    """``struct iocb`` (``linux/aio_abi.h``, the little-endian layout of both CPUs served)."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _Answer(ctypes.Structure):
    """``struct io_event``."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


class _Abi:
    """The three system calls, through ``ctypes``: one context, one request buffer (the
    kernel copies a request when it is submitted), one buffer of answers."""

    def __init__(self, syscall: Any, context: int, numbers: tuple[int, int, int]) -> None:
        self._syscall = syscall
        self._context = ctypes.c_ulong(context)
        self._submit_number = ctypes.c_long(numbers[1])
        self._collect_number = ctypes.c_long(numbers[2])
        self._request = _Request(aio_lio_opcode=_IOCB_CMD_FSYNC, aio_flags=_IOCB_FLAG_RESFD)
        self._requests = (ctypes.c_void_p * 1)(ctypes.addressof(self._request))
        self._answers = (_Answer * _HARVEST)()
        self._no_wait = (ctypes.c_long * 2)(0, 0)
        # Every integer argument as a C ``long``: ``syscall`` is variadic and reads longs.
        self._one, self._none, self._most = (
            ctypes.c_long(1),
            ctypes.c_long(0),
            ctypes.c_long(_HARVEST),
        )

    @classmethod
    def open(cls) -> _Abi | None:
        """A new AIO context, or ``None`` where there is none (other CPUs, no AIO, a refusal:
        ``ENOSYS``, ``EPERM`` from a seccomp filter, ``EAGAIN`` when ``aio-max-nr`` is
        reached)."""
        numbers = syscall_numbers()
        if numbers is None:
            return None
        syscall = ctypes.CDLL(None, use_errno=True).syscall
        syscall.restype = ctypes.c_long
        context = ctypes.c_ulong(0)
        depth = ctypes.c_long(_QUEUE_DEPTH)
        if syscall(ctypes.c_long(numbers[0]), depth, ctypes.byref(context)) != 0:
            return None
        return cls(syscall, context.value, numbers)

    def submit_fsync(self, token: int, descriptor: int, eventfd: int) -> bool:
        """One ``IOCB_CMD_FSYNC`` for ``descriptor``, answered with ``token`` on ``eventfd``.
        ``False`` when the kernel refuses it (``EAGAIN``: a full queue; ``EINVAL``: no AIO
        ``fsync`` for this file): then nothing is pending. Called under ``KernelSync``'s
        lock: the one request buffer is reused."""
        request = self._request
        request.aio_data = token
        request.aio_fildes = descriptor
        request.aio_resfd = eventfd
        taken = self._syscall(self._submit_number, self._context, self._one, self._requests)
        return bool(taken == 1)

    def collect(self) -> list[tuple[int, int]]:
        """Every answer available now (``token``, ``result``: 0 or ``-errno``), at most
        ``_HARVEST``, without waiting."""
        answers = self._answers
        count = self._syscall(
            self._collect_number, self._context, self._none, self._most, answers, self._no_wait
        )
        return [(answers[i].data, answers[i].res) for i in range(max(count, 0))]


def _close(descriptor: int) -> None:
    with contextlib.suppress(OSError):
        os.close(descriptor)


KERNEL_SYNC = KernelSync()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=KERNEL_SYNC.forget)
