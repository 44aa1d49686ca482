"""Stock event sinks: optional ready-made implementations of ``ports.EventSink``.

* ``NullEventSink`` accepts every event and does nothing (the ``AgentDefinition`` default).
* ``LoggingEventSink`` writes one record per completed step to a standard ``logging`` logger,
  and one per progress report of a running tool call (it is a ``ports.ProgressSink``).

Nothing here is required: any object with ``async emit(event)`` and ``parameters()`` is a
sink. Both sinks are certified by ``polyloop.testing.EventSinkContract``
(``tests/contract/test_stock_parts_contracts.py``). Events are lossy by design; the audit
trail is the run's log in its store, never the event stream.

This module imports only ``polyloop.ports``, ``polyloop.errors`` and the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import Event, ToolProgress

__all__ = ["LoggingEventSink", "NullEventSink"]

_NULL_PARAMETERS: Final[Mapping[str, str]] = MappingProxyType({"kind": "null"})
_LOGGING_PARAMETERS: Final[Mapping[str, str]] = MappingProxyType({"kind": "logging"})


class NullEventSink:
    """Drops every event. ``parameters()`` is ``{"kind": "null"}``."""

    __slots__ = ()

    async def emit(self, event: Event) -> None:
        """Accept ``event`` and do nothing with it."""

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "null"}``."""
        return _NULL_PARAMETERS

    def __repr__(self) -> str:
        return "NullEventSink()"


class LoggingEventSink:
    """Logs one line per completed step through the standard ``logging`` module.

    The record goes to ``logger`` (default: the ``polyloop.events`` logger) at ``level``
    (default ``logging.INFO``) and reads, for example::

        run r1 step 2: add({"a": 2, "b": 3}) -> executed: 5

    A step without an action shows ``parse failure``, ``final answer`` or ``model call
    failed`` instead of the action. A step with a recorded cost (``RunRequest.pricing``,
    design 0236) adds it after the status: ``-> executed [cost 0.003]: 5``. The action and
    the observation are cut to ``max_chars`` characters each (default 200, ``...`` marks a
    cut), so one huge observation cannot flood the log; the step record in the store keeps
    them whole. The event itself is attached to
    the record as ``record.polyloop_event`` for handlers that want structured data.

    It has ``emit_progress`` too: a running tool call's progress (``ToolProgress``) is logged
    at the same level as, for example::

        run r1 step 2: copy progress 3/10: copying files

    (the message cut like an observation), with the value as ``record.polyloop_progress``.

    Logging is synchronous: a slow handler slows the run; put a ``QueueHandler`` in front of
    it if that matters. ``parameters()`` is ``{"kind": "logging"}``: where events go does not
    change the run, so moving them to another logger is not drift.
    """

    __slots__ = ("_level", "_logger", "_max_chars")

    def __init__(
        self,
        logger: logging.Logger | str = "polyloop.events",
        *,
        level: int = logging.INFO,
        max_chars: int = 200,
    ) -> None:
        if isinstance(logger, str):
            logger = logging.getLogger(logger)
        if not isinstance(logger, logging.Logger):
            raise PolyloopTypeError(
                "LoggingEventSink.logger must be a logging.Logger or a logger name, got "
                f"{type(logger).__name__}"
            )
        if isinstance(level, bool) or not isinstance(level, int):
            raise PolyloopTypeError(
                f"LoggingEventSink.level must be a logging level such as logging.INFO, got "
                f"{type(level).__name__}"
            )
        if isinstance(max_chars, bool) or not isinstance(max_chars, int):
            raise PolyloopTypeError(
                f"LoggingEventSink.max_chars must be an int, got {type(max_chars).__name__}"
            )
        if max_chars < 10:
            raise PolyloopValueError(
                f"LoggingEventSink.max_chars must be >= 10, got {max_chars}: shorter excerpts "
                "say nothing"
            )
        self._logger = logger
        self._level = level
        self._max_chars = max_chars

    async def emit(self, event: Event) -> None:
        """Log one line for ``event`` (see the class docstring)."""
        step = event.step
        if step.action is not None and step.action_status is not None:
            what = f"{self._cut(step.action)} -> {step.action_status.value}"
        elif not step.parse_ok:
            what = "parse failure"
        elif event.model_failed or step.observation_is_synthetic:
            # Without an action, only a failed model call's step has a synthetic observation
            # (``model_failed`` says so directly when the session built the event).
            what = "model call failed"
        else:
            what = "final answer"
        if step.cost is not None:  # design 0236: the step's recorded cost, exact
            what += f" [cost {format(step.cost.normalize(), 'f')}]"
        self._logger.log(
            self._level,
            "run %s step %d: %s: %s",
            event.run_id,
            step.step_idx,
            what,
            self._cut(step.observation),
            extra={"polyloop_event": event},
        )

    async def emit_progress(self, progress: ToolProgress) -> None:
        """Log one line for ``progress`` (see the class docstring)."""
        done = f"{progress.progress:g}"
        if progress.total is not None:
            done += f"/{progress.total:g}"
        self._logger.log(
            self._level,
            "run %s step %d: %s progress %s%s",
            progress.run_id,
            progress.step_idx,
            progress.tool_name or "action",
            done,
            "" if progress.message is None else f": {self._cut(progress.message)}",
            extra={"polyloop_progress": progress},
        )

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "logging"}``."""
        return _LOGGING_PARAMETERS

    def _cut(self, text: str) -> str:
        if len(text) <= self._max_chars:
            return text
        return text[: self._max_chars - 3] + "..."

    def __repr__(self) -> str:
        return f"LoggingEventSink(logger={self._logger.name!r}, level={self._level})"
