"""Orders of events, for the tests that would otherwise assert on a wall-clock duration.

A test may not assert "this took at least (or at most) N seconds"
(``tests/unit/test_no_wall_clock_assertions.py``). What such an assertion meant is usually an
order of events, and that is what the test asserts instead:

* *not before its bound*: an ``Alarm(bound)`` set on the running loop before the operation
  starts has rung by the time the operation's answer (or error) came. The loop's clock is
  ``time.monotonic``, the one the library reads to decide that its bound has passed, and the
  loop runs a due timer no later than the loop turn after the one in which the library
  decided; ``Alarm.rang`` waits those turns (two ``sleep(0)``), never more, so an answer
  that came early is seen as early (a load that stalls the loop in those two turns past the
  deadline could hide an early answer, never fail a correct one);
* *not forever*: a bounded wait, ``asyncio.wait_for(operation, guard)`` or
  ``asyncio.timeout(guard)``, whose expiry raises ``TimeoutError`` instead of the library's
  own error: the library's bound fired first. A guard is a hang detector, generous for a
  loaded machine, not a speed claim; speed is measured in ``tools/bench/``.
"""

from __future__ import annotations

import asyncio

__all__ = ["Alarm"]


class Alarm:
    """A timer of ``seconds`` on the running loop's clock, set when the alarm is made."""

    def __init__(self, seconds: float) -> None:
        self._rung = False
        self._handle = asyncio.get_running_loop().call_later(seconds, self._ring)

    def _ring(self) -> None:
        self._rung = True

    async def rang(self) -> bool:
        """Whether the timer has run, once every timer due when the caller's answer came had
        its turn: called right after an operation ends, ``True`` exactly when the operation
        ended at or after the alarm's deadline. Cancels the timer."""
        for _ in range(2):  # the turn in which a due timer is popped, then one it has run in
            await asyncio.sleep(0)
        self._handle.cancel()
        return self._rung
