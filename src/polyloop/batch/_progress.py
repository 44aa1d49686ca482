"""Progress a person can watch, and a callback for programs (design 0242).

On a terminal, one line rewritten in place (at most five times a second); elsewhere (a log
file, CI), the same line every ``every_seconds``; a program passes ``on_progress`` and gets a
``BatchProgress`` each time an item ends. Standard library only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TextIO

from polyloop.batch._report import BatchTotals, ItemReport

__all__ = ["BatchProgress", "Display", "Tally"]

_REDRAW_SECONDS: Final = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchProgress:
    """Where a batch stands. ``total`` is the item count when the input's length is known
    (``None`` otherwise, and then ``eta_seconds`` too); ``done`` counts ended items, ``failed``
    those that ended otherwise than done well (``failed_by`` by stop reason, ``"error"`` for an
    attempt that raised); ``running`` items are in flight; ``rate`` is items per second since
    the start; ``tokens`` the ended items' tokens."""

    total: int | None
    done: int
    running: int
    failed: int
    failed_by: Mapping[str, int]
    retried: int
    tokens: int
    elapsed_seconds: float
    rate: float
    eta_seconds: float | None

    def line(self) -> str:
        """``"412/2000 done, 8 running, 3 failed (llm_error 2, error 1), 14.2/s, ETA 1m52s,
        51,200 tokens"``."""
        of = "" if self.total is None else f"/{self.total}"
        failed = f"{self.failed} failed"
        if self.failed_by:
            failed += " (" + ", ".join(f"{k} {v}" for k, v in sorted(self.failed_by.items())) + ")"
        eta = "" if self.eta_seconds is None else f", ETA {_duration(self.eta_seconds)}"
        return (
            f"{self.done}{of} done, {self.running} running, {failed}, {self.rate:.1f}/s{eta}, "
            f"{self.tokens:,} tokens"
        )


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Tally:
    """The counts behind ``BatchProgress`` and the batch's totals."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.began = time.monotonic()
        self.running = 0
        self.totals = BatchTotals()
        self.failed_by: Counter[str] = Counter()

    def ended(self, row: ItemReport) -> None:
        self.totals.add(row)
        if row.failed:
            self.failed_by["error" if row.error is not None else row.stop_reason or "open"] += 1

    def progress(self) -> BatchProgress:
        elapsed = time.monotonic() - self.began
        done = self.totals.items
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = None
        if self.total is not None and rate > 0:
            eta = max(self.total - done, 0) / rate
        return BatchProgress(
            total=self.total,
            done=done,
            running=self.running,
            failed=self.totals.failed,
            failed_by=MappingProxyType(dict(self.failed_by)),
            retried=self.totals.retried,
            tokens=self.totals.tokens,
            elapsed_seconds=elapsed,
            rate=rate,
            eta_seconds=eta,
        )


class Display:
    """Shows ``BatchProgress`` on ``stream``: rewritten in place on a terminal, else a line
    every ``every_seconds``, and always once at the end (``final``); and hands it to
    ``callback`` on every update but that last one (one call per ended item)."""

    def __init__(
        self,
        stream: TextIO | None,
        *,
        every_seconds: float,
        callback: Callable[[BatchProgress], None] | None,
    ) -> None:
        self._stream = stream
        self._live = stream is not None and stream.isatty()
        self._every = _REDRAW_SECONDS if self._live else every_seconds
        self._callback = callback
        self._shown = 0.0
        self._width = 0

    def update(self, tally: Tally, *, final: bool = False) -> None:
        progress = tally.progress()
        if self._callback is not None and not final:
            self._callback(progress)
        if self._stream is None:
            return
        now = time.monotonic()
        if not final and now - self._shown < self._every:
            return
        self._shown = now
        text = "batch: " + progress.line()
        if self._live:
            self._stream.write("\r" + text.ljust(self._width) + ("\n" if final else ""))
            self._width = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
