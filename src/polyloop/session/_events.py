"""One event per completed step, delivered best-effort (the ``EventSink`` contract).

A sink that raises, or outlives ``RunRequest.event_timeout_seconds``, is a delivery failure:
logged, counted in ``RunResult.event_delivery_failures``, never re-emitted, never fatal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from polyloop.ports import Event, EventKind, EventSink, StepTiming, ToolCall
from polyloop.session._waits import bounded
from polyloop.types import StepRecord

__all__ = ["StepClock", "deliver_step_event"]

logger = logging.getLogger("polyloop.session")


class StepClock:
    """Wall-clock instants of one step for its event's ``StepTiming`` (``time.time_ns()``)."""

    __slots__ = (
        "action_finished_ns",
        "action_started_ns",
        "model_finished_ns",
        "model_started_ns",
        "started_ns",
    )

    def __init__(self) -> None:
        self.started_ns = time.time_ns()
        self.model_started_ns: int | None = None
        self.model_finished_ns: int | None = None
        self.action_started_ns: int | None = None
        self.action_finished_ns: int | None = None

    def timing(self, *, acted: bool) -> StepTiming:
        """The step's timing now that it is finished; action instants only if it acted."""
        return StepTiming(
            started_ns=self.started_ns,
            finished_ns=time.time_ns(),
            model_started_ns=self.model_started_ns,
            model_finished_ns=self.model_finished_ns,
            action_started_ns=self.action_started_ns if acted else None,
            action_finished_ns=self.action_finished_ns if acted else None,
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
    event = Event(
        kind=EventKind.STEP_FINISHED,
        run_id=run_id,
        step=record,
        model_binding=model_binding,
        timing=clock.timing(acted=acted),
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        model_failed=model_failed,
    )
    try:
        await bounded(
            sink.emit(event), event_timeout_seconds, "the event sink", "event_timeout_seconds"
        )
    except Exception:  # the EventSink contract: delivery failures are counted, never fatal
        logger.warning(
            "run %s step %d: event delivery failed (%d so far); the run goes on",
            run_id,
            record.step_idx,
            failures_before + 1,
            exc_info=True,
        )
        return False
    return True
