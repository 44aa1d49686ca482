"""Counts and durations in words a person reads at a glance (issue 36, point 8; design 0234).

``plural(1, "run")`` is ``"1 run"``, ``plural(2, "run")`` ``"2 runs"``; ``duration_words``
writes milliseconds in the largest units that keep two figures: ``"812 ms"``, ``"4.2 s"``,
``"4 min 14 s"``, ``"2 h 5 min"``, ``"3 d 4 h"``. What a program reads (``ls --json``) keeps
the exact ``duration_ms``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["duration_words", "plural"]

_SECOND: Final = 1000
_MINUTE: Final = 60 * _SECOND
_HOUR: Final = 60 * _MINUTE
_DAY: Final = 24 * _HOUR


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless the count is exactly 1 (``nouns``:
    an irregular plural; default ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def duration_words(ms: int) -> str:
    """``ms`` milliseconds in words: ``"254 ms"`` under a second, ``"4.2 s"`` under a minute,
    then two units, the smaller one whole and cut (not rounded): ``"4 min 14 s"``,
    ``"2 h 5 min"``, ``"3 d 4 h"``."""
    if ms < _SECOND:
        return f"{ms} ms"
    if ms < _MINUTE:
        tenths = ms // 100
        return f"{tenths // 10}.{tenths % 10} s"
    for big, big_name, small, small_name in (
        (_DAY, "d", _HOUR, "h"),
        (_HOUR, "h", _MINUTE, "min"),
        (_MINUTE, "min", _SECOND, "s"),
    ):
        if ms >= big:
            return f"{ms // big} {big_name} {(ms % big) // small} {small_name}"
    raise AssertionError(ms)  # unreachable: ms >= _MINUTE was handled by the last row
