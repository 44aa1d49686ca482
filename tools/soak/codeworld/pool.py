"""A pool of environment worker processes: start N, lease them out, kill and restart broken ones.

Workers play the role containers played in the original harness: each is a separate process
(``python -m tools.soak.codeworld.worker``) with its own loopback port, serving one task at a
time. The pool is asyncio-native and lives in the driver's event loop::

    async with WorkerPool(size=4) as pool:
        async with pool.lease() as worker:   # waits while all workers are out
            ...                              # talk to worker.url (see ``client``)

Return rules (what makes a lease never rot with a run):

* a lease always goes back, however the ``async with`` body ends (normal exit, exception,
  cancellation);
* a worker that is dead, marked ``dirty`` (its session saw a transport error) or returned by a
  body that raised (it may be in the middle of executing code) is **restarted** in the
  background - killed, respawned on a new port - and only then offered again; ``restarts``
  counts these;
* a worker found dead when it is leased is respawned before it is handed out.

``kill(pid)`` really kills one worker with ``SIGKILL`` (fault injection); the lease holder finds
out through its next request, and the pool restarts it when the lease comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

__all__ = ["PoolError", "WorkerHandle", "WorkerPool"]

logger = logging.getLogger("tools.soak.codeworld.pool")

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
_READY: Final = "READY "


class PoolError(RuntimeError):
    """The pool cannot serve: a worker did not start, or the pool is not running."""


@dataclass(slots=True, eq=False)
class WorkerHandle:
    """One worker process as the pool tracks it. ``dirty`` asks for a restart on return."""

    index: int
    process: asyncio.subprocess.Process
    port: int
    dirty: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


class WorkerPool:
    """``size`` worker processes; see the module docstring for the lease and restart rules."""

    def __init__(
        self,
        *,
        size: int,
        exec_timeout: float = 10.0,
        startup_timeout: float = 20.0,
        python: str = sys.executable,
    ) -> None:
        if size < 1:
            raise ValueError(f"WorkerPool(size=...) must be >= 1, got {size}")
        if exec_timeout <= 0 or startup_timeout <= 0:
            raise ValueError("WorkerPool exec_timeout and startup_timeout must be > 0 seconds")
        self.size = size
        self.exec_timeout = exec_timeout
        self._startup_timeout = startup_timeout
        self._python = python
        self._handles: list[WorkerHandle] = []
        self._free: asyncio.Queue[WorkerHandle] = asyncio.Queue()
        self._background: set[asyncio.Task[None]] = set()
        self._state = "new"
        self.leased = 0
        """Leases currently out."""
        self.restarts = 0
        """Workers respawned since start (after a kill, a dirty return or a crash)."""

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start every worker (concurrently); on any failure, stop the ones that started."""
        if self._state != "new":
            raise PoolError(f"WorkerPool.start: the pool is {self._state}; pools are single-use")
        self._state = "starting"
        spawns = [asyncio.ensure_future(self._spawn(index)) for index in range(self.size)]
        try:
            self._handles = list(await asyncio.gather(*spawns))
        except BaseException:
            for spawn in spawns:
                spawn.cancel()
            await asyncio.wait(spawns)
            for spawn in spawns:
                if not spawn.cancelled() and spawn.exception() is None:
                    await _kill(spawn.result().process)
            self._state = "stopped"
            raise
        for handle in self._handles:
            self._free.put_nowait(handle)
        self._state = "running"

    async def stop(self) -> None:
        """Kill every worker (leased or not) and wait for them; idempotent."""
        if self._state == "stopped":
            return
        self._state = "stopped"
        if self._background:
            await asyncio.wait(set(self._background))
        for handle in self._handles:
            await _kill(handle.process)
        if self.leased:
            logger.warning(
                "WorkerPool.stop: %d lease(s) still out; their workers were killed", self.leased
            )

    # ---------------------------------------------------------------- leasing

    @property
    def available(self) -> int:
        """Workers ready to be leased right now."""
        return self._free.qsize()

    def pids(self) -> list[int]:
        """Process ids of the current workers, by worker index."""
        return [handle.pid for handle in self._handles]

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[WorkerHandle]:
        """Lease one worker for the body of the ``async with`` (waits while none is free)."""
        if self._state != "running":
            raise PoolError(f"WorkerPool.lease: the pool is {self._state}, not running")
        handle = await self._free.get()
        if not handle.alive:
            try:
                await self._respawn(handle)
            except BaseException:
                self._free.put_nowait(handle)
                raise
        self.leased += 1
        clean = False
        try:
            yield handle
            clean = True
        finally:
            self.leased -= 1
            if clean and handle.alive and not handle.dirty:
                self._free.put_nowait(handle)
            else:
                self._schedule_restart(handle)

    async def settled(self) -> None:
        """Wait until every restart in progress has finished."""
        while self._background:
            await asyncio.wait(set(self._background))

    async def kill(self, pid: int) -> None:
        """Kill the worker with process id ``pid`` (``SIGKILL``) and wait until it is gone."""
        for handle in self._handles:
            if handle.pid == pid:
                await _kill(handle.process)
                return
        raise PoolError(f"WorkerPool.kill: no worker has pid {pid}; current pids {self.pids()}")

    # ---------------------------------------------------------------- internals

    def _schedule_restart(self, handle: WorkerHandle) -> None:
        if self._state != "running":
            return
        task = asyncio.ensure_future(self._restart_and_return(handle))
        self._background.add(task)
        task.add_done_callback(self._restart_done)

    def _restart_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            # The worker goes back dead; the next lease respawns it and raises if that fails.
            logger.error("WorkerPool: restarting a worker failed: %s", error, exc_info=error)

    async def _restart_and_return(self, handle: WorkerHandle) -> None:
        try:
            await self._respawn(handle)
        finally:
            self._free.put_nowait(handle)

    async def _respawn(self, handle: WorkerHandle) -> None:
        await _kill(handle.process)
        fresh = await self._spawn(handle.index)
        handle.process, handle.port, handle.dirty = fresh.process, fresh.port, False
        self.restarts += 1

    async def _spawn(self, index: int) -> WorkerHandle:
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(
            part for part in (str(REPO_ROOT), environment.get("PYTHONPATH", "")) if part
        )
        process = await asyncio.create_subprocess_exec(
            self._python,
            "-m",
            "tools.soak.codeworld.worker",
            "--port",
            "0",
            "--exec-timeout",
            str(self.exec_timeout),
            cwd=REPO_ROOT,
            env=environment,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), self._startup_timeout)
        except BaseException:
            await _kill(process)
            raise
        text = line.decode("utf-8", "replace").strip()
        if not text.startswith(_READY) or not text[len(_READY) :].isdigit():
            await _kill(process)
            raise PoolError(
                f"worker {index} did not start: expected 'READY <port>' on its stdout, got "
                f"{text[:200]!r} (exit code {process.returncode}); run "
                "'python -m tools.soak.codeworld.worker' by hand to see why"
            )
        return WorkerHandle(index=index, process=process, port=int(text[len(_READY) :]))


async def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it exited between the check and kill
            process.kill()
    await process.wait()
