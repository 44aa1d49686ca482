"""What the shipped stores' run leases share: argument checks, the refusal texts, the wait.

The lease semantics are ``polyloop.ports.RunLease`` / ``LeasingRunStore`` and design 0120;
each store implements the holding and the fencing its own way, and uses these helpers so the
three stores word the same situation the same way.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    RunLeaseHeldError,
    RunLeaseLostError,
)

__all__ = ["check_lease_record", "check_wait_seconds", "held_error", "lost_error", "poll_until"]

T = TypeVar("T")

_FIRST_POLL = 0.002
_MAX_POLL = 0.05


def check_wait_seconds(value: object, where: str) -> float:
    """Return ``value`` as a float if it is a finite number >= 0, else raise naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(
            f"{where}: wait_seconds must be a number of seconds (0 for no wait), got "
            f"{type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0:
        raise PolyloopValueError(
            f"{where}: wait_seconds must be finite and >= 0 (0 for no wait), got {value!r}"
        )
    return float(value)


def check_lease_record(record_run_id: str, lease_run_id: str, where: str) -> None:
    """Refuse a record of another run than the lease's, before anything is stored."""
    if record_run_id != lease_run_id:
        raise PolyloopValueError(
            f"{where}: the record belongs to run {record_run_id!r} but this lease holds run "
            f"{lease_run_id!r}; write each run's records through that run's own lease"
        )


def held_error(store: str, run_id: str, wait_seconds: float) -> RunLeaseHeldError:
    """The refusal of a run whose lease someone else holds."""
    waited = "did not wait" if wait_seconds == 0 else f"waited {wait_seconds:g} s"
    return RunLeaseHeldError(
        f"{store}: run {run_id!r} is leased by another process or task (it is being run or "
        f"resumed right now); {waited}. Leave it to its holder, or retry later or with a "
        "longer lease wait (lease_wait_seconds=...)",
        run_id=run_id,
    )


def lost_error(store: str, run_id: str, epoch: int, why: str) -> RunLeaseLostError:
    """The refusal of a write through a lease that is no longer the run's current lease."""
    return RunLeaseLostError(
        f"{store}: the lease on run {run_id!r} (epoch {epoch}) is no longer held ({why}); "
        "nothing was written. Stop working on this run: another holder may be extending "
        "its log. Resume it later to continue from what is stored",
        run_id=run_id,
        epoch=epoch,
    )


async def poll_until(
    attempt: Callable[[], Awaitable[T | None]],
    wait_seconds: float,
    on_timeout: Callable[[], Exception],
) -> T:
    """Call ``attempt`` until it returns a value, backing off, for at most ``wait_seconds``.

    ``attempt`` is always called at least once; when the time is up, ``on_timeout()`` is
    raised. Cancellation propagates from the sleep between attempts.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    delay = _FIRST_POLL
    while True:
        granted = await attempt()
        if granted is not None:
            return granted
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise on_timeout()
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, _MAX_POLL)
