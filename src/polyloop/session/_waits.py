"""Bounded waits on a seam, and the one clock reading the step records use (design 0164)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from polyloop.errors import SeamTimeoutError

__all__ = ["bounded", "elapsed_ms"]

_T = TypeVar("_T")


async def bounded(awaitable: Awaitable[_T], seconds: float | None, what: str, field: str) -> _T:
    """Await ``awaitable``, at most ``seconds`` (``None``: no bound).

    On expiry the awaited call is cancelled and ``SeamTimeoutError`` is raised naming
    ``RunRequest.<field>``; a ``TimeoutError`` the call raises itself, and a cancellation
    from outside, pass unchanged.
    """
    if seconds is None:
        return await awaitable
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise SeamTimeoutError(
            f"{what} did not return within {seconds:g} s (RunRequest.{field})", seconds=seconds
        ) from exc


def elapsed_ms(started: float) -> int:
    """Whole milliseconds since ``started`` (a ``time.monotonic()`` reading)."""
    return int((time.monotonic() - started) * 1000)
