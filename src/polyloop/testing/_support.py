"""Helpers shared by the contract bases: skip reasons, the cancellation probe, mapping checks.

Everything here is private. The public promise is the behaviour of the contract tests, not
these helpers; they exist so that the five bases word the same situation the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TypeVar

import pytest

from polyloop.testing._records import RecordFactory

T = TypeVar("T")

UNVERIFIABLE_PREFIX = "cannot be verified at this layer."
"""Every unconditional skip reason starts with this, so a reader of ``pytest -rs`` (and the
suite's own census test) can tell "this layer cannot check it" from any other skip."""

FINISHED_BEFORE_CANCEL = (
    "finished before it could be cancelled: the call completed within one event-loop tick, "
    "so it never held a suspension point where a cancellation could have been swallowed. "
    "This is not a breach and needs no change; the check only bites for implementations "
    "that really wait (a network round trip, a subprocess, a container session)."
)
"""Reason of the conditional skip in the two cancellation tests."""


def unverifiable(*, promise: str, why_not_here: str, check_it_yourself: str) -> str:
    """Format the reason of an unconditional skip: the promise, why this suite cannot check
    it, and where or how the implementer (or the library) checks it instead."""
    return (
        f"{UNVERIFIABLE_PREFIX} Promise: {promise} "
        f"Why not here: {why_not_here} "
        f"Check it yourself: {check_it_yourself}"
    )


def string_mapping_problems(value: object) -> list[str]:
    """Describe every way ``value`` fails to be a mapping of ``str`` to ``str``.

    Returns an empty list for a valid mapping. The descriptions name the offending entry, so
    a failing assertion tells the implementer which key to fix.
    """
    if not isinstance(value, Mapping):
        return [f"parameters() returned a {type(value).__name__}, not a Mapping"]
    problems: list[str] = []
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"key {key!r} is a {type(key).__name__}, not a str")
        if not isinstance(item, str):
            problems.append(
                f"value of {key!r} is a {type(item).__name__} ({item!r}), not a str; "
                "convert it with str() or describe it as text"
            )
    return problems


async def cancel_midway(awaitable: Awaitable[T]) -> None:
    """Start ``awaitable`` as a task, let it run one tick, cancel it, and require that
    ``asyncio.CancelledError`` comes out.

    If the task returns normally after the cancel, the cancellation was swallowed and the
    test fails. If the task already finished after that one tick, ``cancel()`` returns
    ``False`` and the test is skipped with ``FINISHED_BEFORE_CANCEL``: an implementation that
    never suspends had no chance to swallow anything. The finished task's own result is read
    first, so an exception it raised is reported instead of being hidden behind the skip.
    """
    task = asyncio.ensure_future(awaitable)
    await asyncio.sleep(0)
    if not task.cancel():
        task.result()
        pytest.skip(FINISHED_BEFORE_CANCEL)
    try:
        returned = await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # the test itself is being cancelled; that cancellation is not ours to judge
        return
    pytest.fail(
        f"the call was cancelled while suspended but returned {returned!r} instead of "
        "raising asyncio.CancelledError: the cancellation was swallowed. Let it propagate "
        "and release resources in a finally block."
    )


class ContractBase:
    """Common parent of the five contract bases. It only hands ``records`` to the tests.

    This is not a fixture mixin that a downstream has to combine with its subclass: the
    ``records`` fixture is supplied by the suite, and nothing here needs overriding.
    """

    @pytest.fixture
    def records(self) -> RecordFactory:
        """The record factory. Supplied by the suite; do not override it."""
        return RecordFactory()
