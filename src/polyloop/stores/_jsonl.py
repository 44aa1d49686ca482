"""``JsonlRunStore``: one append-only JSON Lines file per run.

The file format is documented field by field in ``research-wiki/reference/log-format.md``; why
``fsync`` happens where it does and how torn and corrupt lines count is
``research-wiki/design/0020-jsonl-durability-and-torn-lines.md``.

The write path of one record:

1. open ``<directory>/<run_id>.jsonl`` for appending (any write but the start creates it if it
   is missing; ``write_run_started`` instead writes its line into a temporary file and
   hard-links it to the run's name, which fails if the name exists: see ``_start_file``);
2. if the file does not end with ``\\n``, cut off the unterminated tail: it is a write that was
   never confirmed (a crash half-way through), which readers ignore; appending after it would
   glue it to the new record and turn it into a corrupt line;
3. write the line with ``_write_all_bytes`` (loops over short writes; the fault-injection point;
   a ``write_pair`` writes its two lines with one call);
4. ``fsync`` the file if the record is a barrier (run start, intent, settlement, finish) or the
   file is new;
5. close it, and ``fsync`` the directory if the file is new (so the file itself survives).

Where each step of that path runs (designs 0214 and 0219):

======================================  ==================================================
write                                   where
======================================  ==================================================
a model result or a step appended to    all of it on the event loop's thread
an existing file that ends cleanly      (``_write_in_place``): ``open``, ``fstat``, a
                                        one-byte ``pread``, ``write``, ``close`` into the
                                        page cache, a few microseconds
a barrier (intent, settlement, finish,  the bytes the same way on the loop's thread; then
approval request) appended likewise     only the sync leaves it, to a writer thread
                                        (``_WriterThreads``), which closes the descriptor
                                        after the sync
the start, a write that creates the     all of it in a writer thread (``_append_line``,
file, a write that must cut a torn      ``_start_file``): these sync the file and the
tail                                    directory, or the cut, more than once
======================================  ==================================================

Every sync of the store, of a log, a directory or a lease's lock file, is ``_fsync`` (design
0219): ``fcntl(F_FULLFSYNC)`` where the platform has it (macOS, where ``fsync`` only hands the
data to the drive, whose cache may still lose it at a power cut), ``os.fsync`` elsewhere
(Linux: the data and the metadata needed to read it are on stable storage, the drive's cache
flushed, when it returns). A barrier returns after its sync; results and steps become durable
with the next barrier. Measured in ``research-wiki/reference/performance.md``.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import errno
import functools
import os
import re
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from polyloop.errors import PolyloopError, PolyloopTypeError, PolyloopValueError
from polyloop.ports import RunLog
from polyloop.stores._leases import (
    FencedRunLease,
    check_lease_record,
    check_wait_seconds,
    held_error,
    lost_error,
    poll_until,
)
from polyloop.stores._records import (
    TAGS,
    Record,
    assemble_log,
    decode_lines,
    is_barrier,
    is_exclusive,
)
from polyloop.stores._writes import RecordWriter, started_error, unavailable_error

__all__ = ["JsonlRunLease", "JsonlRunStore"]

_NAME = "JsonlRunStore"
LEASE_DIRECTORY = ".leases"
"""Where the lease lock files live, inside the store's directory (run ids never start with
``.``, so no run's log can collide with it)."""

_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9._-]+")
_SUFFIX = ".jsonl"
_MAX_RUN_ID_LENGTH = 255 - len(_SUFFIX)  # the usual file-name limit, in bytes (ids are ASCII)
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_TAIL_BLOCK = 64 * 1024
_PATHS_KEPT = 1024


def check_run_id(run_id: object) -> str:
    """Return ``run_id`` if it can be a file name in the store's directory, else raise.

    The run id *is* the file name (no escaping, no hashing), so that a person can find a run's
    log by its id. It must therefore be a safe name: ASCII letters, digits, ``.``, ``_`` and
    ``-`` only (no ``/``, so no path traversal), not starting with ``.`` (no ``.``/``..``, no
    hidden files), and short enough for a file name.
    """
    if not isinstance(run_id, str):
        raise PolyloopTypeError(f"JsonlRunStore: run_id must be a str, got {type(run_id).__name__}")
    if not _SAFE_RUN_ID.fullmatch(run_id) or run_id.startswith("."):
        raise PolyloopValueError(
            f"JsonlRunStore: run_id {run_id!r} cannot be used: it is the log's file name, so it "
            "may contain only ASCII letters, digits, '.', '_' and '-' and must not start with "
            "'.' (this keeps every log inside the store's directory); choose an id such as "
            "'task-17.attempt-2'"
        )
    if len(run_id) > _MAX_RUN_ID_LENGTH:
        raise PolyloopValueError(
            f"JsonlRunStore: run_id is {len(run_id)} characters long; as a file name it may have "
            f"at most {_MAX_RUN_ID_LENGTH}"
        )
    return run_id


class _RunLock:
    """The lock that serialises writes to one run's file, and how many writes want it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class _Flock(NamedTuple):
    """What a lease holds: the descriptor with the ``flock``, the lock file's path, and the
    ``(st_dev, st_ino)`` of the file it locked."""

    descriptor: int
    path: str
    identity: tuple[int, int]


class JsonlRunStore(RecordWriter):
    """A ``RunStore`` that appends each run's records to ``<directory>/<run_id>.jsonl``.

    * One file per run; one record per line, UTF-8, non-ASCII written as is (the file is meant
      to be read by people). The directory is created on the first write if it is missing.
    * ``run_id`` must be a safe file name (see ``check_run_id``); otherwise every method raises
      ``ValueError`` saying why, reads included.
    * ``write_run_started`` creates the file exclusively: ``RunAlreadyStartedError`` (a
      ``FileExistsError``) if the run id already has a file. This is what stops two processes
      from starting the same run.
    * Durability: ``write_run_started`` (file and directory), ``write_intent``,
      ``write_settlement`` and ``write_run_finished`` are ``fsync``-ed before they return
      (``write_settlement`` is the ``SettlingRunStore`` capability); model results and steps are
      not, and become durable with the next barrier (appends to one file reach the disk in
      order). A write that creates the file also syncs it and the directory.
    * ``write_pair(first, second)`` (the store's and its leases', design 0214)
      appends two records of one run, neither a ``RunStarted``, with one write: one open, the
      two lines in one ``write``, synced if either is a barrier, the lease checked once. The
      session hands it a model result with the step's next record (design 0212). A crash
      leaves ``first`` whole and ``second`` torn, or ``first`` torn (then neither counts):
      what the two writes in order could leave; the next write cuts the torn tail as usual.
    * A record passed to the wrong write method, or an object that is not a log record, is
      refused with ``TypeError`` before anything touches the disk.
    * Writes run one at a time per run id (different runs write in parallel). An append to an
      existing, cleanly ending file writes its bytes on the event loop's thread without an
      ``await`` (microseconds of page-cache I/O on a local file system, so a cancellation
      cannot tear them; on a network file system ``open``, ``write`` and ``close`` may wait
      for the server, and the loop waits with them); a barrier's sync then runs in a writer
      thread of the module. The start, a write that creates
      the file and one that cuts a torn tail run whole in a writer thread (not the loop's
      default executor; design 0214). A write the interpreter's exit finds in a thread still
      completes; if the awaiting task is cancelled, the write and its sync still complete
      and the next write to that run waits for them, so records never interleave;
      ``CancelledError`` reaches the caller at once. The module docstring's table says
      where each write runs.
    * Reading: a missing file is ``RunLog()``; an unterminated last line is a torn write and is
      ignored; blank lines are ignored; any other line that does not decode raises
      ``polyloop.serialization.DecodeError`` naming the run id and line number, and a line
      whose checksum does not match raises ``polyloop.errors.LogCorruptError`` likewise.
    * A failure of the file system under a write, a read or a lease (disk full, no
      permission, an I/O error) raises ``polyloop.errors.StoreUnavailableError`` (a
      ``PolyloopError`` and an ``OSError``) naming the run, the record and the file, the OS's
      error as ``__cause__`` (issue 24). A line the failure tore is not a record (see
      reading), so the log stays readable and the run resumes once the disk has room again.
    * Every sync is ``fcntl(F_FULLFSYNC)`` on macOS (the drive's cache flushed too; ``fsync``
      where the file system does not support it), ``os.fsync`` elsewhere (design 0219;
      ``research-wiki/reference/log-format.md``, "Durability", says what each platform
      guarantees). Durability needs a POSIX file system; on Windows the directory is not
      synced.
    * Files are opened per write; the store holds no file descriptors between calls, except
      one per lease held.
    * Run leases (``LeasingRunStore``, design 0120): ``acquire_lease`` takes an exclusive
      ``flock`` on ``<directory>/.leases/<run_id>.lock``, held by an open descriptor until
      ``release()``. The kernel drops it when the holder dies, so a dead holder frees the run;
      while the holder lives nobody else can take the run over. Each lease write checks,
      under the run's write lock (which ``release()`` also takes) and right before the bytes
      are written, that the lease was not released and that the lock file is still the one
      it locked. ``flock`` is not reliable on network file systems, and a process forked
      (without exec) while holding a lease shares it with its child. ``write_fenced`` and
      ``end_lease`` are the store side of its leases (``polyloop.stores._leases.FencingStore``);
      write through the lease instead.
    """

    __slots__ = ("_directory", "_flocks", "_locks", "_paths")

    def __init__(self, *, directory: Path | str) -> None:
        self._directory = Path(directory)
        self._locks: dict[str, _RunLock] = {}
        self._flocks: dict[FencedRunLease, _Flock] = {}
        self._paths: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"JsonlRunStore(directory={str(self._directory)!r})"

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "jsonl"}``. The directory is left out on purpose: moving logs to another
        path or machine must not count as parameter drift."""
        return {"kind": "jsonl"}

    # -- writes (the seven methods are RecordWriter's) ----------------------------------------

    def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> Awaitable[None]:
        return self._append(record.run_id, line, kind)

    # -- leases ------------------------------------------------------------------------------

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> JsonlRunLease:
        """Lease ``run_id`` to the caller (see ``polyloop.ports.LeasingRunStore``)."""
        path = self._lease_path(run_id)
        wait = check_wait_seconds(wait_seconds, f"{_NAME}.acquire_lease")

        async def attempt() -> JsonlRunLease | None:
            future = asyncio.get_running_loop().run_in_executor(None, _try_lock, path)
            try:
                grant = await asyncio.shield(future)
            except asyncio.CancelledError:
                # The thread may still take the lock: let go of it when it does.
                future.add_done_callback(_drop_grant)
                raise
            except OSError as exc:  # the lock file cannot be created, written or synced
                raise unavailable_error(
                    _NAME, exc, run_id=run_id, record="lease", path=path
                ) from exc
            if grant is None:
                return None
            descriptor, identity, epoch = grant
            lease = JsonlRunLease(self, run_id, epoch)
            self._flocks[lease] = _Flock(descriptor, path, identity)
            return lease

        return await poll_until(attempt, wait, lambda: held_error(_NAME, run_id, wait))

    async def write_pair(self, first: Record, second: Record) -> None:
        """Append two records of one run, ``first`` then ``second``, with one write (design
        0214): synced if either is a barrier, so a model result and the next
        intent cost one open, one write and one ``fsync``. Neither may be a ``RunStarted``.
        A crash can leave ``first`` whole and ``second`` torn, or ``first`` torn (neither
        counts), which is what the two writes in order could leave too."""
        line = b"".join(self._pair_lines(first, second, f"{_NAME}.write_pair"))
        await self._append(first.run_id, line, type(first), second=type(second))

    async def write_fenced_pair(
        self, lease: FencedRunLease, line: bytes, first: type[Record], second: type[Record]
    ) -> None:
        """``write_pair`` for ``lease``: ``line`` holds both records' lines; the lease is
        checked once, under the run's write lock, right before the bytes are written."""
        await self._append(
            lease.run_id, line, first, fence=functools.partial(self._fence, lease), second=second
        )

    async def write_fenced(self, lease: FencedRunLease, line: bytes, kind: type[Record]) -> None:
        """Append ``line`` through the run's write path, checking ``lease`` under the run's
        write lock right before the bytes are written (``_fence``)."""
        await self._append(lease.run_id, line, kind, fence=functools.partial(self._fence, lease))

    async def check_fence(self, lease: FencedRunLease) -> None:
        """``RunLeaseLostError`` unless ``lease`` still holds its lock file, checked under the
        run's write lock as a write's fence is (``_fence``); writes nothing."""
        await self._locked(lease.run_id, functools.partial(self._fence, lease))

    async def end_lease(self, lease: FencedRunLease) -> None:
        """Unlock the run once no write of it is in flight; nothing if already unlocked."""
        if lease not in self._flocks:
            return
        await self._locked(lease.run_id, functools.partial(self._unlock, lease))

    def _fence(self, lease: FencedRunLease) -> None:
        """Refuse the write unless ``lease`` still holds its ``flock`` on the lock file that
        is at its path now (not deleted or replaced: another process may lock a new one)."""
        held = self._flocks.get(lease)
        # ``released`` too: a release cancelled while a write held the run lock has not
        # unlocked yet, but the lease promised no write after release() was called.
        if held is None or lease.released:
            raise lost_error(_NAME, lease.run_id, lease.epoch, "it was released")
        try:
            status = os.stat(held.path)
        except FileNotFoundError:
            status = None
        if status is None or (status.st_dev, status.st_ino) != held.identity:
            raise lost_error(
                _NAME,
                lease.run_id,
                lease.epoch,
                f"its lock file {held.path} was removed or replaced",
            )

    def _unlock(self, lease: FencedRunLease) -> None:
        """Close the lease's descriptor, which drops its ``flock``. A failing close (an I/O
        error) is ``StoreUnavailableError`` naming the lock file: the descriptor is gone
        either way (POSIX ``close``), and the lock with it."""
        held = self._flocks.pop(lease, None)
        if held is None:
            return
        try:
            os.close(held.descriptor)
        except OSError as exc:
            raise unavailable_error(
                _NAME, exc, run_id=lease.run_id, record="lease", path=held.path
            ) from exc

    def _lease_path(self, run_id: object) -> str:
        return os.path.join(self._directory, LEASE_DIRECTORY, check_run_id(run_id) + ".lock")

    async def _locked(self, run_id: str, action: Callable[[], None]) -> None:
        """Run ``action`` under the run's write lock, once no write to the run is in flight."""
        entry = self._locks.get(run_id)
        if entry is None:
            entry = self._locks[run_id] = _RunLock()
        entry.users += 1
        try:
            await entry.lock.acquire()
            try:
                action()
            finally:
                entry.lock.release()
        finally:
            self._forget(run_id, entry)

    # -- reads -------------------------------------------------------------------------------

    async def read_log(self, run_id: str) -> RunLog:
        """Read the run's whole log; ``RunLog()`` if the run id has no file."""
        path = self._path(run_id)
        try:
            raw = await asyncio.to_thread(_read_or_none, path)
        except OSError as exc:  # a missing file is no error (``None``); anything else is
            raise unavailable_error(_NAME, exc, run_id=run_id, record="log", path=path) from exc
        if raw is None:
            return RunLog()
        return parse_log(raw, run_id=run_id)

    # -- internals ---------------------------------------------------------------------------

    def _path(self, run_id: object) -> str:
        """The log's path; ``check_run_id``'s refusal for an id that cannot be a file name.

        Remembered per id (at most ``_PATHS_KEPT``; then forgotten all at once), so a run's
        writes do not check and join its name again each time."""
        path = self._paths.get(run_id) if type(run_id) is str else None
        if path is None:
            name = check_run_id(run_id)
            path = os.path.join(self._directory, name + _SUFFIX)
            if len(self._paths) >= _PATHS_KEPT:
                self._paths.clear()
            self._paths[name] = path
        return path

    async def _append(
        self,
        run_id: str,
        line: bytes,
        kind: type[Record],
        *,
        fence: Callable[[], None] | None = None,
        second: type[Record] | None = None,
    ) -> None:
        """Append ``line`` (a ``kind`` record) to the run's file: exclusively for the start,
        synced for a barrier. ``second``: ``line`` is the two lines of a pair, a ``kind``
        record then a ``second`` one, appended by one write and synced if either is a barrier
        (``write_pair``). An ``OSError`` of the file system (disk full, no permission)
        becomes ``StoreUnavailableError`` naming the run, the record(s) and the file;
        polyloop's own refusals (a lost lease; a taken run id, which is an ``OSError`` too)
        pass as they are."""
        path = self._path(run_id)
        barrier, exclusive = is_barrier(kind), is_exclusive(kind)
        if second is not None:
            barrier = barrier or is_barrier(second)
        entry = self._locks.get(run_id)
        if entry is None:
            entry = self._locks[run_id] = _RunLock()
        entry.users += 1
        handed_off = False
        try:
            try:
                await entry.lock.acquire()
                try:
                    if fence is not None:
                        # Inside the run's write lock, which a lease's release() also takes: no
                        # release can fall between this check and the bytes below.
                        fence()
                    # No await between taking the lock and finishing an in-place write, so no
                    # other write to this run can start in between, and a cancellation cannot
                    # tear it.
                    descriptor = None if exclusive else _write_in_place(path, line)
                    if descriptor is not None and not barrier:
                        os.close(descriptor)
                        return
                    loop = asyncio.get_running_loop()
                    waiter = loop.create_future()
                    # The lock is released when the sync (or the thread's write) is done, not
                    # when this coroutine stops waiting: a cancelled caller must not let the
                    # next write start while this one is still writing or syncing.
                    done = functools.partial(self._written, run_id, entry, waiter)
                    if descriptor is not None:
                        _sync_later(loop, descriptor, done)
                    else:
                        work = functools.partial(
                            _append_line, path, line, barrier=barrier, exclusive=exclusive
                        )
                        _WRITERS.submit(work, loop, done)
                    handed_off = True
                finally:
                    if not handed_off:
                        entry.lock.release()
            finally:
                if not handed_off:
                    self._forget(run_id, entry)
            await waiter
        except PolyloopError:
            raise  # RunLeaseLostError, RunAlreadyStartedError: refusals, not failures
        except OSError as exc:
            tag = TAGS[kind] if second is None else f"{TAGS[kind]} and {TAGS[second]}"
            raise unavailable_error(_NAME, exc, run_id=run_id, record=tag, path=path) from exc

    def _written(
        self,
        run_id: str,
        entry: _RunLock,
        waiter: asyncio.Future[None],
        error: BaseException | None,
    ) -> None:
        """On the loop's thread, once the writer thread is done with a write: free the run's
        lock, then tell the waiting caller, if it still waits."""
        entry.lock.release()
        self._forget(run_id, entry)
        if waiter.cancelled():
            return
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)

    def _forget(self, run_id: str, entry: _RunLock) -> None:
        entry.users -= 1
        if entry.users == 0 and self._locks.get(run_id) is entry:
            del self._locks[run_id]


class JsonlRunLease(FencedRunLease):
    """A ``RunLease`` on one run of a ``JsonlRunStore`` (from ``acquire_lease``).

    The store holds an open descriptor with an exclusive ``flock`` on the run's lock file for
    it. Writes go through the store's write path with a fence that runs under the run's write
    lock, right before the bytes are written: it refuses the write when the lease was released
    or when the lock file at the path is no longer the file this lease locked (someone deleted
    or replaced it, so another process may hold a lock on the new one). The epoch is counted
    in the lock file. ``write_pair`` is the store's, fenced once for both records.
    Everything else is ``polyloop.stores._leases.FencedRunLease``.
    """

    __slots__ = ()

    async def write_pair(self, first: Record, second: Record) -> None:
        """``JsonlRunStore.write_pair`` through this lease: both records or, once the lease is
        lost, neither (``RunLeaseLostError``); a record of another run is refused first."""
        where = "JsonlRunLease.write_pair"
        line = b"".join(self._pair_lines(first, second, where))
        check_lease_record(first.run_id, self._run_id, where)
        store = self._store
        assert isinstance(store, JsonlRunStore)
        await store.write_fenced_pair(self, line, type(first), type(second))


# --------------------------------------------------------------------------- writer threads


class _WriterThreads:
    """The threads that run the JSONL writes that create a file or cut a torn tail, and the
    barriers' syncs (designs 0214 and 0219).

    ================================  =========================================================
    rule                              how
    ================================  =========================================================
    one write, one thread             ``submit(work, loop, done)`` hands ``work`` to an idle
                                      thread (the one that went idle last), which runs it and
                                      has ``done(error)`` called on ``loop``'s thread (``None``
                                      or what ``work`` raised)
    two wake-ups a write              the loop wakes the thread with a byte on the thread's
                                      own pipe; the thread wakes the loop with a byte on the
                                      loop's pipe (``_LoopWaker``, watched by ``add_reader``)
                                      as its last act before it blocks again, so neither side
                                      waits for the other to let go of the GIL. A loop without
                                      ``add_reader`` (or that cannot be weakly referenced, or
                                      on Windows) is woken by ``call_soon_threadsafe``
    writes of different runs overlap  a new thread starts when none is idle, up to
                                      ``MAX_THREADS``; beyond that, writes wait in the backlog,
                                      which a thread empties before it goes idle
    nothing is lost at exit           threads are daemons; an ``atexit`` hook hands every
                                      thread a stop *after* the write it holds (a thread takes
                                      the backlog before it reads its stop) and joins them, so
                                      a write a cancelled caller left behind still completes
                                      before the interpreter ends
    a forked child starts afresh      ``os.register_at_fork``: the child forgets the parent's
                                      threads and their pipes (threads do not survive a fork)
    a closed loop                     the write completes; ``done`` is dropped (nobody waits),
                                      so that run's write lock in that store instance stays
                                      taken: a later loop uses a new ``JsonlRunStore`` for it
    ================================  =========================================================

    Why not the loop's default executor (design 0022, superseded in 0214): its hand-off runs
    ``concurrent.futures`` machinery on both threads (a ``Future`` with a condition, a
    semaphore, ``wrap_future`` and ``shield``), and the thread keeps running Python after it
    has woken the loop, so the two threads hand the GIL back and forth. Why pipes rather than
    a queue, a lock and ``call_soon_threadsafe`` (design 0214): the thread is woken
    only by its own pipe, and wakes the loop only as its last act, so each side blocks
    again before the other needs the GIL, and the loop's answer is a read of its pipe, not
    a ``Handle``, its self-pipe's two reads and a raised ``BlockingIOError``. On a busy
    machine that is fewer context switches a step, and each is a wake-up of an idle CPU,
    which costs more CPU than the write itself.
    """

    MAX_THREADS = min(32, (os.cpu_count() or 1) + 4)  # concurrent.futures' default

    def __init__(self) -> None:
        self._lock: threading.Lock
        self._threads: list[_Thread]
        self._idle: list[_Thread]
        self._backlog: collections.deque[_Job]
        self._wakers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, weakref.ReferenceType[_LoopWaker] | None
        ]  # ``None``: the loop has no add_reader
        self._generation = 0
        self.forget()

    def submit(
        self,
        work: Callable[[], None],
        loop: asyncio.AbstractEventLoop,
        done: Callable[[BaseException | None], None],
    ) -> None:
        job = (work, self._waker(loop), done)
        with self._lock:
            if self._idle:
                thread = self._idle.pop()
            elif len(self._threads) < self.MAX_THREADS:
                thread = _Thread(self._generation)
                thread.start(self._serve, f"polyloop-jsonl-{len(self._threads)}")
                self._threads.append(thread)
            else:
                self._backlog.append(job)
                return
        try:
            thread.give(job)
        except BaseException:
            with self._lock:  # the thread never got the job: it is idle still
                if thread.generation == self._generation:
                    self._idle.append(thread)
            raise

    def _waker(self, loop: asyncio.AbstractEventLoop) -> _LoopWaker | _CallSoon:
        """How a thread wakes ``loop``: its ``_LoopWaker``, made on its first write."""
        if sys.platform == "win32":  # a selector there watches sockets only, not pipes
            return _CallSoon(loop)
        try:
            found = self._wakers.get(loop, False)
        except TypeError:  # the loop cannot be weakly referenced
            return _CallSoon(loop)
        if found is None:
            return _CallSoon(loop)
        waker = None if isinstance(found, bool) else found()
        if waker is None:
            try:
                waker = _LoopWaker(loop)
            except NotImplementedError:  # no add_reader (Windows' proactor loop)
                self._wakers[loop] = None
                return _CallSoon(loop)
            # Weakly: the loop holds its waker (the reader's handle), the waker not the loop.
            self._wakers[loop] = weakref.ref(waker)
        return waker

    def _serve(self, me: _Thread) -> None:
        while True:
            _PIPE_READ(me.wake_in, 1)  # one byte per job given
            job = me.jobs.popleft()
            if job is None:
                me.close()
                return
            while job is not None:
                work, waker, done = job
                error: BaseException | None = None
                try:
                    work()
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting write as is
                    error = exc
                del work
                with self._lock:
                    job = self._backlog.popleft() if self._backlog else None
                    if job is None and me.generation == self._generation:
                        self._idle.append(me)
                # The last act before blocking again: the loop wakes to a thread that is done.
                waker.deliver(done, error)
                del waker, done, error

    def drain(self) -> None:
        """Let every queued write finish, then stop the threads (at interpreter exit)."""
        with self._lock:
            threads, self._threads = self._threads, []
            self._idle = []
            self._generation += 1
        for thread in threads:
            thread.give(None)
        for thread in threads:
            thread.join()

    def forget(self) -> None:
        """Start from nothing (also in a forked child: the parent's threads are not there)."""
        for thread in getattr(self, "_threads", ()):
            thread.close()  # the child's copies of the parent's pipes
        self._lock = threading.Lock()
        self._threads = []
        self._idle = []
        self._backlog = collections.deque()
        self._wakers = weakref.WeakKeyDictionary()
        self._generation += 1


class _Thread:
    """One writer thread, the jobs given to it and the pipe that wakes it (a byte a job)."""

    __slots__ = ("generation", "handle", "jobs", "wake_in", "wake_out")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.jobs: collections.deque[_Job | None] = collections.deque()
        self.wake_in, self.wake_out = os.pipe()
        self.handle: threading.Thread | None = None

    def start(self, serve: Callable[[_Thread], None], name: str) -> None:
        handle = threading.Thread(target=serve, args=(self,), name=name, daemon=True)
        try:
            handle.start()
        except BaseException:
            self.close()
            raise
        self.handle = handle

    def give(self, job: _Job | None) -> None:
        """Queue ``job`` and wake the thread; a raise leaves the job not queued (the thread
        takes a job only for a byte it read, and this byte was never written)."""
        self.jobs.append(job)
        try:
            _PIPE_WRITE(self.wake_out, b"\0")
        except BaseException:
            self.jobs.pop()
            raise

    def join(self) -> None:
        if self.handle is not None:
            self.handle.join()

    def close(self) -> None:
        for descriptor in (self.wake_in, self.wake_out):
            with contextlib.suppress(OSError):
                os.close(descriptor)


class _LoopWaker:
    """How writer threads wake one event loop: a byte on a pipe the loop watches
    (``add_reader``), the finished writes' callbacks in a deque. Made on the loop's thread;
    the loop's reader keeps it alive, and its pipe is closed when it is collected."""

    __slots__ = ("__weakref__", "_done", "_loop", "_wake_in", "_wake_out")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._done: collections.deque[
            tuple[Callable[[BaseException | None], None], BaseException | None]
        ]
        self._done = collections.deque()
        self._wake_in, self._wake_out = os.pipe()
        try:
            os.set_blocking(self._wake_in, False)
            os.set_blocking(self._wake_out, False)
            loop.add_reader(self._wake_in, self._wake)
        except BaseException:
            _close_pipe(self._wake_in, self._wake_out)
            raise
        finalizer = weakref.finalize(self, _close_pipe, self._wake_in, self._wake_out)
        finalizer.atexit = False  # a writer thread may still deliver while the interpreter exits

    def deliver(
        self, done: Callable[[BaseException | None], None], error: BaseException | None
    ) -> None:
        """On a writer thread: have ``done(error)`` called on the loop's thread."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            return  # nobody waits for the write
        del loop
        self._done.append((done, error))
        # A full pipe holds wake-ups the loop has yet to read: it will wake anyway.
        with contextlib.suppress(BlockingIOError):
            _PIPE_WRITE(self._wake_out, b"\0")

    def _wake(self) -> None:
        """On the loop's thread: run the callbacks of every write finished so far."""
        with contextlib.suppress(BlockingIOError):
            _PIPE_READ(self._wake_in, 4096)
        done = self._done
        while done:
            callback, error = done.popleft()
            callback(error)


class _CallSoon:
    """``_LoopWaker``'s stand-in for a loop without ``add_reader``."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def deliver(
        self, done: Callable[[BaseException | None], None], error: BaseException | None
    ) -> None:
        # A loop closed meanwhile raises RuntimeError: nobody waits for the write then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(done, error)


# The wake-ups' own references: a test that replaces ``os.write`` or ``os.read`` to fail a log
# write must not stop the threads and loops from waking.
_PIPE_WRITE = os.write
_PIPE_READ = os.read


def _close_pipe(*descriptors: int) -> None:
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            os.close(descriptor)


_Job = tuple[Callable[[], None], "_LoopWaker | _CallSoon", Callable[[BaseException | None], None]]

_WRITERS = _WriterThreads()
atexit.register(_WRITERS.drain)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WRITERS.forget)


# --------------------------------------------------------------------------- thread-side I/O


def _try_lock(path: str) -> tuple[int, tuple[int, int], int] | None:
    """Take the exclusive ``flock`` on ``path`` without blocking, and count the grant.

    Returns ``(descriptor, (st_dev, st_ino), epoch)``, or ``None`` when another descriptor
    holds the lock. The epoch is the decimal number in the file plus one, written back and
    synced, so it only grows (even across a machine crash).
    """
    import fcntl  # POSIX only; imported here so the store still imports elsewhere

    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        descriptor = os.open(path, flags, 0o644)
    granted = False
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        status = os.fstat(descriptor)
        text = os.pread(descriptor, 64, 0).strip()
        epoch = (int(text) if text.isdigit() else 0) + 1
        data = b"%d\n" % epoch
        os.pwrite(descriptor, data, 0)
        os.ftruncate(descriptor, len(data))
        _fsync(descriptor)
        granted = True
    finally:
        if not granted:
            os.close(descriptor)
    return descriptor, (status.st_dev, status.st_ino), epoch


def _drop_grant(future: asyncio.Future[tuple[int, tuple[int, int], int] | None]) -> None:
    """Close the descriptor of a lock taken for a caller that was cancelled meanwhile."""
    if future.cancelled() or future.exception() is not None:
        return
    grant = future.result()
    if grant is not None:
        os.close(grant[0])


def _write_all_bytes(descriptor: int, data: bytes) -> None:
    """Write all of ``data`` to ``descriptor``, looping over short writes.

    This is the fault-injection point: unit tests replace it (on this module) with a function
    that writes part of the bytes and raises, to check that a record that dies half-way is
    invisible and leaves earlier records intact. It is not part of any public interface.
    """
    view = memoryview(data)
    while view:
        written = os.write(descriptor, view)
        if written <= 0:
            raise OSError(errno.EIO, "os.write wrote nothing; the log line is incomplete")
        view = view[written:]


def _fsync(descriptor: int) -> None:
    """Make what was written to ``descriptor`` durable: the store's one way to the disk.

    Where ``fcntl.F_FULLFSYNC`` exists (macOS) it is used, as SQLite's ``fullfsync`` does:
    there ``fsync`` hands the data to the drive but does not make the drive write its cache,
    so a power cut may still lose an acknowledged record. A file system that does not support
    it (an ``OSError`` saying so: ``ENOTSUP``, ``EOPNOTSUPP``, ``EINVAL``, ``ENOTTY``) gets
    ``os.fsync``; any other error is raised. Everywhere else ``os.fsync``: on Linux that
    returns once the data and the metadata needed to read it back are on stable storage (the
    drive's volatile cache flushed, where the file system issues flushes, as ext4, XFS and
    btrfs do by default).
    """
    full: int | None = getattr(_fcntl, "F_FULLFSYNC", None)
    if full is not None and _fcntl is not None:
        try:
            _fcntl.fcntl(descriptor, full)
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        else:
            return
    os.fsync(descriptor)


_fcntl: ModuleType | None
try:
    import fcntl as _fcntl
except ImportError:  # Windows
    _fcntl = None
_UNSUPPORTED = frozenset(
    code
    for code in (
        getattr(errno, name, None) for name in ("ENOTSUP", "EOPNOTSUPP", "EINVAL", "ENOTTY")
    )
    if code is not None
)


def _fsync_directory(directory: str) -> None:
    """Make a new directory entry durable: ``fsync`` of a file does not cover its name."""
    if sys.platform == "win32":  # directories cannot be opened for fsync there
        return
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _fsync(descriptor)
    finally:
        os.close(descriptor)


def _create(path: str, *, exclusive: bool) -> int:
    flags = _OPEN_FLAGS | os.O_CREAT | (os.O_EXCL if exclusive else 0)
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        # The directory does not exist yet: create it and try once more.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o644)


def _last_byte(descriptor: int, size: int) -> bytes:
    """The byte at ``size - 1``: one ``pread`` where there is one (the file's offset does not
    matter, every write appends), else a seek and a read."""
    if _PREAD is not None:
        return _PREAD(descriptor, 1, size - 1)
    os.lseek(descriptor, size - 1, os.SEEK_SET)
    return os.read(descriptor, 1)


_PREAD: Callable[[int, int, int], bytes] | None = getattr(os, "pread", None)


def _cut_torn_tail(descriptor: int) -> None:
    """Truncate an unterminated last line (a write that never completed), then sync the cut."""
    size = os.fstat(descriptor).st_size
    if size == 0 or _last_byte(descriptor, size) == b"\n":
        return
    keep = 0
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        os.lseek(descriptor, start, os.SEEK_SET)
        block = os.read(descriptor, end - start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    os.ftruncate(descriptor, keep)
    _fsync(descriptor)


def _write_in_place(path: str, line: bytes) -> int | None:
    """Append ``line`` on the event loop's thread if that needs no ``fsync`` before the write;
    return the open descriptor (the caller closes it, or syncs it first for a barrier).

    ``None`` (nothing written, nothing changed, nothing open) when the file does not exist yet
    (creating it syncs the file and the directory) or ends with a torn line (cutting it syncs
    the cut): both go through ``_append_line`` in a writer thread instead.
    """
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(descriptor).st_size
        ends_cleanly = not size or _last_byte(descriptor, size) == b"\n"
        if ends_cleanly:
            _write_all_bytes(descriptor, line)
    except BaseException:
        os.close(descriptor)
        raise
    if not ends_cleanly:
        os.close(descriptor)
        return None
    return descriptor


def _sync_later(
    loop: asyncio.AbstractEventLoop,
    descriptor: int,
    done: Callable[[BaseException | None], None],
) -> None:
    """Sync and close ``descriptor`` in a writer thread, then have ``done(error)`` called on
    ``loop``'s thread. If the thread cannot take it (a raise), the descriptor is closed here
    and the error goes to the caller."""
    try:
        _WRITERS.submit(functools.partial(_sync_and_close, descriptor), loop, done)
    except BaseException:
        os.close(descriptor)
        raise


def _sync_and_close(descriptor: int) -> None:
    """In a writer thread: sync, then close. An error closing the descriptor after a
    successful sync is not reported (the record is durable)."""
    try:
        _fsync(descriptor)
    except BaseException:
        os.close(descriptor)
        raise
    with contextlib.suppress(OSError):
        os.close(descriptor)


def _start_file(path: str, line: bytes) -> None:
    """Create ``path`` holding exactly ``line``, atomically and exclusively.

    The line is written and synced into a private temporary file beside ``path``, which is
    then hard-linked to ``path``: ``link`` fails when the name exists (so of two starters
    exactly one wins; the loser gets ``RunAlreadyStartedError``, a ``FileExistsError``) and
    makes the complete file appear at once. A start
    that dies half-way therefore leaves no file under the run's name and does not claim the
    run id (a leftover ``.start-*.tmp`` file is harmless and may be deleted). The directory is
    synced so the new name survives a crash.
    """
    directory = os.path.dirname(path)
    # Not named after the run: a run id may already use the whole file-name length.
    temporary = os.path.join(directory, f".start-{os.getpid()}-{os.urandom(8).hex()}.tmp")
    descriptor = _create(temporary, exclusive=True)
    try:
        try:
            _write_all_bytes(descriptor, line)
            _fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, path)
        except FileExistsError as exc:
            run_id = os.path.basename(path).removesuffix(_SUFFIX)
            raise started_error(_NAME, run_id, log=path) from exc
    finally:
        os.unlink(temporary)
    _fsync_directory(directory)


def _append_line(path: str, line: bytes, *, barrier: bool, exclusive: bool) -> None:
    if exclusive:
        _start_file(path, line)
        return
    created = False
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        descriptor = _create(path, exclusive=False)
        created = True
    try:
        _cut_torn_tail(descriptor)
        _write_all_bytes(descriptor, line)
        if barrier or created:
            _fsync(descriptor)
    finally:
        os.close(descriptor)
    if created:
        _fsync_directory(os.path.dirname(path))


def _read_or_none(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def parse_log(raw: bytes, *, run_id: str) -> RunLog:
    """Turn a log file's bytes into a ``RunLog``.

    A line counts if and only if it ends with ``\\n``. The bytes after the last ``\\n`` are a
    write that never completed and are ignored, even when they hold a whole JSON object (the
    newline is the last byte written, so its absence means the writer never returned). Lines
    holding only whitespace are ignored. Every other line must decode; one that does not is
    corruption and raises ``DecodeError`` with the run id and 1-based line number. The rule
    itself is ``decode_lines``.
    """
    entries = decode_lines(raw, run_id=run_id)
    return assemble_log((e.record for e in entries), lines=(e.line for e in entries))
