"""``OtelEventSink``: run, step, model-call and tool spans from polyloop's events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from polyloop._common import money_text
from polyloop.ports import Event, ToolProgress
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.types import ActionStatus, RunResult

__all__ = ["OtelEventSink"]

TRACER_NAME: Final = "polyloop"

# GenAI semantic-convention attribute names (OpenTelemetry semantic conventions, gen_ai.*).
OPERATION: Final = "gen_ai.operation.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_ID: Final = "gen_ai.response.id"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
COST: Final = "polyloop.usage.cost"
"""The call's recorded cost (``StepRecord.cost``, design 0236) as its exact decimal string,
beside the GenAI usage attributes; absent when the cost is unknown."""
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"


class OtelEventSink:
    """An ``EventSink`` that turns each completed step into spans (see the package docstring).

    ``tracer_provider`` defaults to OpenTelemetry's global provider (a no-op until the
    application installs one). One instance may serve many runs, concurrently too: a step's
    spans are parented by the span current in the task that emits the event, which is the run
    span of the ``run``/``resume`` call driving that step.
    """

    __slots__ = ("_models", "_tracer")

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer: Tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._models: dict[str, str] = {}

    def __repr__(self) -> str:
        return "OtelEventSink()"

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "otel"}``: the destination of spans is deployment, not configuration."""
        return MappingProxyType({"kind": "otel"})

    # ---------------------------------------------------------------- run spans

    async def run(self, definition: AgentDefinition, request: RunRequest) -> RunResult:
        """``polyloop.session.run`` inside an ``invoke_agent`` span (returns its result)."""
        return await self._traced(definition, request, resuming=False)

    async def resume(self, definition: AgentDefinition, request: RunRequest) -> RunResult:
        """``polyloop.session.resume`` inside an ``invoke_agent`` span."""
        return await self._traced(definition, request, resuming=True)

    async def _traced(
        self, definition: AgentDefinition, request: RunRequest, *, resuming: bool
    ) -> RunResult:
        run_id = request.run_id
        model = definition.model_client.parameters().get("model")
        attributes: dict[str, str | bool] = {
            OPERATION: "invoke_agent",
            "polyloop.run_id": run_id,
            "polyloop.resumed": resuming,
        }
        if model:
            attributes[REQUEST_MODEL] = model
            self._models[run_id] = model
        with self._tracer.start_as_current_span(
            f"invoke_agent {run_id}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await (resume if resuming else run)(definition, request)
            except asyncio.CancelledError:
                span.set_attribute("polyloop.stop_reason", "cancelled")
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                raise
            except Exception as exc:  # recorded on the span, then re-raised unchanged
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            finally:
                self._models.pop(run_id, None)
            span.set_attribute("polyloop.stop_reason", result.stop_reason.value)
            span.set_attribute("polyloop.steps", len(result.steps))
            span.set_attribute("polyloop.event_delivery_failures", result.event_delivery_failures)
            return result

    # ---------------------------------------------------------------- progress

    async def emit_progress(self, progress: ToolProgress) -> None:
        """Add ``progress`` as a ``polyloop.tool_progress`` event, at its ``reported_ns``, to
        the span current in the reporting task: the ``invoke_agent`` span when the run goes
        through ``run``/``resume`` here (a no-op when no span is recording)."""
        attributes: dict[str, str | int | float] = {
            "polyloop.run_id": progress.run_id,
            "polyloop.step_idx": progress.step_idx,
            "polyloop.progress": progress.progress,
        }
        if progress.tool_name is not None:
            attributes[TOOL_NAME] = progress.tool_name
        if progress.tool_call_id is not None:
            attributes[TOOL_CALL_ID] = progress.tool_call_id
        if progress.total is not None:
            attributes["polyloop.progress_total"] = progress.total
        if progress.message is not None:
            attributes["polyloop.progress_message"] = progress.message
        if progress.origin is not None:
            attributes["polyloop.progress_origin"] = progress.origin
        trace.get_current_span().add_event(
            "polyloop.tool_progress", attributes=attributes, timestamp=progress.reported_ns
        )

    # ---------------------------------------------------------------- step spans

    async def emit(self, event: Event) -> None:
        """Record the step of ``event`` as a step span with its model-call and tool children."""
        step = event.step
        timing = event.timing
        now = time.time_ns()
        end = timing.finished_ns if timing is not None else now
        start = timing.started_ns if timing is not None else end - step.step_wall_ms * 1_000_000
        step_span = self._tracer.start_span(
            f"polyloop.step {step.step_idx}",
            start_time=start,
            attributes={
                "polyloop.run_id": event.run_id,
                "polyloop.step_idx": step.step_idx,
                "polyloop.prompt_chars": step.prompt_chars,
                "polyloop.parse_ok": step.parse_ok,
            },
        )
        try:
            if step.action_status is not None:
                step_span.set_attribute("polyloop.action_status", step.action_status.value)
            parent = trace.set_span_in_context(step_span)
            if timing is not None and timing.model_started_ns is not None:
                self._model_span(event, parent, timing.model_started_ns, timing.model_finished_ns)
            if timing is not None and timing.action_started_ns is not None:
                self._tool_span(event, parent, timing.action_started_ns, timing.action_finished_ns)
        finally:
            step_span.end(end_time=end)

    def _model_span(self, event: Event, parent: Context, start: int, end: int | None) -> None:
        step = event.step
        model = self._models.get(event.run_id)
        attributes: dict[str, str | int] = {OPERATION: "chat", "polyloop.step_idx": step.step_idx}
        if model:
            attributes[REQUEST_MODEL] = model
        if step.call_id is not None:
            attributes[RESPONSE_ID] = step.call_id
        if step.usage is not None:
            attributes[INPUT_TOKENS] = step.usage.prompt_tokens
            attributes[OUTPUT_TOKENS] = step.usage.completion_tokens
        if step.cost is not None:
            attributes[COST] = money_text(step.cost)
        span: Span = self._tracer.start_span(
            f"chat {model}" if model else "chat",
            context=parent,
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes=attributes,
        )
        if event.model_failed:
            span.set_status(Status(StatusCode.ERROR, "model call failed"))
        span.end(end_time=end if end is not None else start)

    def _tool_span(self, event: Event, parent: Context, start: int, end: int | None) -> None:
        step = event.step
        attributes: dict[str, str | int] = {
            OPERATION: "execute_tool",
            "polyloop.step_idx": step.step_idx,
        }
        if event.tool_name is not None:
            attributes[TOOL_NAME] = event.tool_name
        if event.tool_call_id is not None:
            attributes[TOOL_CALL_ID] = event.tool_call_id
        if step.action_status is not None:
            attributes["polyloop.action_status"] = step.action_status.value
        if step.child is not None:  # the call ran a child run (design 0245)
            attributes["polyloop.child_run_id"] = step.child.run_id
        name = f"execute_tool {event.tool_name}" if event.tool_name else "execute_tool"
        span: Span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes=attributes,
        )
        if step.action_status is ActionStatus.ENV_ERROR:
            span.set_status(Status(StatusCode.ERROR, "environment error"))
        span.end(end_time=end if end is not None else start)
