"""One event per completed step, delivered best-effort (the ``EventSink`` contract), and the
progress of running tool calls to a sink that has ``emit_progress`` (``ProgressSink``).

A sink that raises, or outlives ``RunRequest.event_timeout_seconds``, is a delivery failure:
logged, never re-emitted, never fatal. A step event's failure is counted in
``RunResult.event_delivery_failures``; a progress report's is counted only in its log line
(so far in this ``run``/``resume`` call), so that lossy progress never changes a run's result
(design 0211, amendment).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from polyloop._common import trusted_builder
from polyloop.ports import Event, EventKind, EventSink, StepTiming, ToolCall, ToolProgress
from polyloop.session._waits import bounded
from polyloop.types import StepRecord

__all__ = ["StepClock", "deliver_step_event", "progress_reporter", "step_timing"]

# Built without ``__post_init__`` (``polyloop._common.trusted``; design 0214).
_new_event = trusted_builder(Event)


logger = logging.getLogger("polyloop.session")


class StepClock(Protocol):
    """Wall-clock instants of one step for its event's ``StepTiming`` (``time.time_ns()``):
    the session's ``StepWork`` carries them itself (one object fewer a step, design
    0214); ``None`` for an instant the step has not reached."""

    @property
    def started_ns(self) -> int: ...
    @property
    def model_started_ns(self) -> int | None: ...
    @property
    def model_finished_ns(self) -> int | None: ...
    @property
    def action_started_ns(self) -> int | None: ...
    @property
    def action_finished_ns(self) -> int | None: ...


def step_timing(clock: StepClock, *, acted: bool) -> StepTiming:
    """The step's timing now that it is finished; action instants only if it acted."""
    return StepTiming(
        started_ns=clock.started_ns,
        finished_ns=time.time_ns(),
        model_started_ns=clock.model_started_ns,
        model_finished_ns=clock.model_finished_ns,
        action_started_ns=clock.action_started_ns if acted else None,
        action_finished_ns=clock.action_finished_ns if acted else None,
    )


def _tool_identity(tool_call: ToolCall | None, acted: bool) -> tuple[str | None, str | None]:
    """The event's tool name and tool-call id (native tool calls carry an id)."""
    if tool_call is None or not acted:
        return None, None
    call_id = getattr(tool_call, "id", None)
    return tool_call.name, call_id if isinstance(call_id, str) and call_id else None


async def deliver_step_event(
    sink: EventSink,
    event_timeout_seconds: float | None,
    *,
    run_id: str,
    record: StepRecord,
    model_binding: Mapping[str, str],
    clock: StepClock,
    tool_call: ToolCall | None,
    model_failed: bool,
    failures_before: int,
) -> bool:
    """Emit the ``STEP_FINISHED`` event of ``record``; ``False`` when delivery failed."""
    acted = record.action is not None
    tool_name, tool_call_id = _tool_identity(tool_call, acted)
    # ``model_binding`` is the validated request's read-only copy: passed on as it is.
    event = _new_event(
        kind=EventKind.STEP_FINISHED,
        run_id=run_id,
        step=record,
        model_binding=model_binding,
        timing=step_timing(clock, acted=acted),
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        model_failed=model_failed,
    )
    return await _delivered(
        sink.emit(event),
        event_timeout_seconds,
        "the event sink",
        "run %s step %d: event delivery failed (%d so far); the run goes on",
        (run_id, record.step_idx, failures_before + 1),
    )


async def _delivered(
    delivery: Awaitable[None],
    timeout_seconds: float | None,
    what: str,
    failed: str,
    args: tuple[object, ...],
) -> bool:
    """Await one delivery to the sink (bounded); ``False``, logged as ``failed % args``, when
    it failed. ``CancelledError`` passes."""
    try:
        await bounded(delivery, timeout_seconds, what, "event_timeout_seconds")
    except Exception:  # the EventSink contract: delivery failures are counted, never fatal
        logger.warning(failed, *args, exc_info=True)
        return False
    return True


def progress_reporter(
    sink: EventSink, event_timeout_seconds: float | None
) -> Callable[[ToolProgress], Awaitable[None]] | None:
    """The ``ToolContext.progress_reporter`` of a run's executions: delivers each
    ``ToolProgress`` to ``sink.emit_progress``, bounded like an event, and counts the failed
    deliveries for its log lines; ``None`` when the sink has no ``emit_progress``."""
    emit_progress = getattr(sink, "emit_progress", None)
    if not callable(emit_progress):
        return None
    failures = 0

    async def report(progress: ToolProgress) -> None:
        nonlocal failures
        if not await _delivered(
            emit_progress(progress),
            event_timeout_seconds,
            "the event sink's emit_progress",
            "run %s step %d: progress delivery failed (%d so far); the call goes on",
            (progress.run_id, progress.step_idx, failures + 1),
        ):
            failures += 1

    return report
