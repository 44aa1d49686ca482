"""Diagnostic: what a JSONL step's syncs cost the process beyond the fsyncs themselves.

``python -m tools.bench.sync_cost [--steps N] [--repeats R] [--disk-dir DIR]``

Not a benchmark (not in ``run_all``): it answers where the CPU of ``per_step``'s JSONL rows
goes. For the JSONL store on the real disk and on tmpfs, one process runs the ``per_step``
workload (N steps, R runs, median of CPU µs a step beyond fsync, as ``per_step`` counts it)
with the barriers' syncs

* ``kernel``: handed to the kernel (Linux AIO), the shipped path;
* ``threads``: in the store's writer threads, the fallback path;
* ``answered-at-once``: **not synced at all**, the descriptor closed and the write answered
  on the next loop iteration. A diagnostic only (nothing it writes is durable): the difference
  to ``kernel`` is what the sync costs the process beyond the fsync, the difference between
  the disk and tmpfs rows of ``answered-at-once`` what the file system costs;
* ``waits-only``: **the volatile store**, each of whose barriers is followed by a kernel
  ``fsync`` of a one-line append to a file in the same place: what a store that keeps
  nothing on disk would pay for waiting as the JSONL store waits. The difference between its
  disk and tmpfs rows is what waiting for this disk costs any store, beyond the ``fsync``.

The header prints the load average and the machine's idle setting (the ``cpuidle`` driver and,
for ``haltpoll``, ``guest_halt_poll_ns``): on a VM whose vCPU halts at once when idle (0),
each wait for the disk ends in a wake-up that costs the waking thread tens of µs of CPU, which
the process is charged for (design 0214, "Fifth pass: what the wait itself costs"). The rows of
one sitting are comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polyloop.stores import _volatile
from polyloop.stores._kernel_sync import KERNEL_SYNC
from polyloop.stores._records import Record, is_barrier
from tools.bench._common import DEFAULT_DISK_DIR, SHM_DIR, FsyncMeter, Workload
from tools.bench.per_step import StoreKind, time_one_run

MODES = ("kernel", "threads", "answered-at-once", "waits-only")


@contextmanager
def sync_mode(mode: str) -> Iterator[None]:
    """Make the JSONL store's barriers sync the way ``mode`` says, for the block."""
    enabled = KERNEL_SYNC.enabled
    try:
        if mode == "threads":
            KERNEL_SYNC.enabled = False
        elif mode == "answered-at-once":

            def answer_at_once(
                loop: asyncio.AbstractEventLoop,
                descriptor: int,
                done: Callable[[BaseException | None], None],
            ) -> bool:
                os.close(descriptor)
                loop.call_soon(done, None)
                return True

            KERNEL_SYNC.submit = answer_at_once  # type: ignore[method-assign]
        yield
    finally:
        KERNEL_SYNC.enabled = enabled
        KERNEL_SYNC.__dict__.pop("submit", None)


@contextmanager
def volatile_waits(directory: Path) -> Iterator[None]:
    """Make every barrier of a ``VolatileRunLease`` wait, after it is stored, for a kernel
    ``fsync`` of a one-line append to a file in ``directory`` (``waits-only``)."""
    lease = _volatile.VolatileRunLease
    write, write_pair = lease._write, lease.write_pair
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "waits-only.log"

    async def wait_for_the_disk() -> None:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
        try:
            os.write(descriptor, b"{}\n")
        except OSError:
            os.close(descriptor)
            raise
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def done(error: BaseException | None) -> None:
            if error is None:
                answered.set_result(None)
            else:
                answered.set_exception(error)

        if not KERNEL_SYNC.submit(loop, descriptor, done):
            os.close(descriptor)
            raise RuntimeError("waits-only needs the kernel's syncs (Linux AIO) here")
        await answered

    async def waiting_write(
        self: _volatile.VolatileRunLease, record: Record, kind: type[Record], method: str
    ) -> None:
        await write(self, record, kind, method)
        if is_barrier(kind):
            await wait_for_the_disk()

    async def waiting_pair(self: _volatile.VolatileRunLease, first: Record, second: Record) -> None:
        await write_pair(self, first, second)
        if is_barrier(type(first)) or is_barrier(type(second)):
            await wait_for_the_disk()

    lease._write = waiting_write  # type: ignore[method-assign]
    lease.write_pair = waiting_pair  # type: ignore[method-assign]
    try:
        yield
    finally:
        lease._write = write  # type: ignore[method-assign]
        lease.write_pair = write_pair  # type: ignore[method-assign]


def machine_idle() -> str:
    """The ``cpuidle`` driver and governor and, when the governor is ``haltpoll``, how long an
    idle vCPU polls before it halts; ``"unknown"`` where Linux does not say."""
    cpuidle = Path("/sys/devices/system/cpu/cpuidle")
    try:
        driver = (cpuidle / "current_driver").read_text().strip()
    except OSError:
        return "unknown"
    try:
        governor = (cpuidle / "current_governor").read_text().strip()
    except OSError:
        governor = "unknown"
    said = f"cpuidle {driver} (governor {governor})"
    if governor != "haltpoll":
        return said
    try:
        poll = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read_text().strip()
    except OSError:
        return said
    return f"{said}, guest_halt_poll_ns {poll}"


async def cpu_per_step(kind: StoreKind, steps: int, repeats: int) -> float:
    workload = Workload.build()
    meter = FsyncMeter()
    with meter.installed():
        await time_one_run(workload, kind, 5, meter, "warmup")
        samples = [
            await time_one_run(workload, kind, steps, meter, f"sync-cost-{index}")
            for index in range(repeats)
        ]
    return statistics.median((s.cpu_s - s.fsync_cpu_s) / steps * 1e6 for s in samples)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.sync_cost")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--disk-dir", type=Path, default=DEFAULT_DISK_DIR)
    args = parser.parse_args(argv)
    places = [("disk", args.disk_dir / f"sync_cost-{os.getpid()}")]
    if SHM_DIR.is_dir():
        places.append(("tmpfs", SHM_DIR / f"polyloop-bench-sync_cost-{os.getpid()}"))
    print(
        f"load average {os.getloadavg()[0]:.2f}; {machine_idle()}; "
        f"CPU µs a step beyond fsync, N = {args.steps}"
    )
    figures: dict[str, Any] = {}
    for mode in MODES:
        if mode == "waits-only" and not KERNEL_SYNC.available():
            print(f"{mode:>17}: skipped, the kernel's syncs are not available here")
            continue
        for place, directory in places:
            try:
                if mode == "waits-only":
                    with volatile_waits(directory):
                        figure = asyncio.run(
                            cpu_per_step(StoreKind(place, None), args.steps, args.repeats)
                        )
                else:
                    with sync_mode(mode):
                        figure = asyncio.run(
                            cpu_per_step(StoreKind(place, directory), args.steps, args.repeats)
                        )
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            figures[f"{mode}/{place}"] = figure
            print(f"{mode:>17} {place:>6}: {figure:7.1f}")
    return figures


if __name__ == "__main__":
    main()
