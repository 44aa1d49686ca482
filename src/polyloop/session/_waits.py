"""Bounded waits on a seam, and the one clock reading the step records use (design 0164).

=================================  ==========================================================
the awaited call                   how the bound is kept
=================================  ==========================================================
no bound (``seconds is None``)     awaited as it is
a coroutine that returns before    it is never suspended, so nothing could cancel it: no timer
it first suspends                  is armed (design 0214); a ``TimeoutError`` it
                                   raises itself passes unchanged
a coroutine that suspends, and     ``asyncio.timeout_at`` with the deadline read *before* its
any other awaitable                first step, so the bound counts the call from its start;
                                   on expiry the call is cancelled: ``SeamTimeoutError``
=================================  ==========================================================
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Coroutine, Generator
from types import CoroutineType
from typing import Any, TypeVar

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
    deadline_at = asyncio.get_running_loop().time() + seconds
    if type(awaitable) is CoroutineType:
        coroutine: Coroutine[Any, Any, _T] = awaitable
        try:
            pending = coroutine.send(None)
        except StopIteration as done:  # returned without suspending: no timer to arm
            result: _T = done.value
            return result
        awaitable = _Resumed(coroutine, pending)
    deadline = asyncio.timeout_at(deadline_at)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise SeamTimeoutError(
            f"{what} did not return within {seconds:g} s (RunRequest.{field})", seconds=seconds
        ) from exc


class _Resumed(Awaitable[_T]):
    """A coroutine that was already stepped once and suspended on ``pending``: awaiting this
    hands ``pending`` to the task and then drives the coroutine on exactly as ``await`` would
    (every value sent and every exception thrown in, ``CancelledError`` included, goes to
    the coroutine)."""

    __slots__ = ("_coroutine", "_pending")

    def __init__(self, coroutine: Coroutine[Any, Any, _T], pending: object) -> None:
        self._coroutine = coroutine
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, _T]:
        coroutine, pending = self._coroutine, self._pending
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown in by the task: passed on
                thrown: BaseException | None = exc
            else:
                thrown = None
            try:
                pending = coroutine.send(sent) if thrown is None else coroutine.throw(thrown)
            except StopIteration as done:
                result: _T = done.value
                return result


def elapsed_ms(started: float) -> int:
    """Whole milliseconds since ``started`` (a ``time.monotonic()`` reading)."""
    return int((time.monotonic() - started) * 1000)
