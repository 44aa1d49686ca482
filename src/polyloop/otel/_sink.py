"""``OtelEventSink``: run, step, model-call and tool spans from polyloop's events."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from polyloop._common import money_text
from polyloop.ports import Event, StepTiming, ToolContext, ToolProgress
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

    A ``polyloop.ports.TracingSink``: a step that calls a tool gets its step span and its tool
    span when the call starts (``action_scope``), the tool span current while the call runs,
    so a child run's spans (its ``invoke_agent`` span, ``run_scope``, entered by the child-run
    tool) nest under the parent's tool span (design 0245).
    """

    __slots__ = ("_models", "_open", "_traced_ids", "_tracer")

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer: Tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._models: dict[str, str] = {}
        # The spans of a step whose call started and whose event has not come yet: its step
        # span and the tool span of its last attempt (``None`` once that attempt raised).
        self._open: dict[tuple[str, int], tuple[Span, Span | None]] = {}
        self._traced_ids: set[str] = set()

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
        # The errors are recorded here, as a cancellation is not an exception span status.
        with self._agent_span(run_id, model, resumed=resuming, record_errors=False) as span:
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
            _set_result(span, result)
            return result

    @contextlib.contextmanager
    def run_scope(self, run_id: str, model: str | None) -> Iterator[Callable[[RunResult], None]]:
        """An ``invoke_agent`` span for a child run (``TracingSink``), current while the
        child runs: a child of the span current where the child-run tool runs (the parent's
        tool span). It yields what records the child's result on it. A run already inside
        ``run``/``resume`` here gets no second span."""
        if run_id in self._traced_ids:
            yield _ignore
            return
        with self._agent_span(run_id, model, resumed=None, record_errors=True) as span:
            yield lambda result: _set_result(span, result)

    @contextlib.contextmanager
    def _agent_span(
        self, run_id: str, model: str | None, *, resumed: bool | None, record_errors: bool
    ) -> Iterator[Span]:
        """The ``invoke_agent`` span of one run, current while it is open, with the run's
        bookkeeping (its model for the chat spans, its id as traced, its open step spans
        closed at the end). ``resumed`` is the ``polyloop.resumed`` attribute (``None``: left
        out, a child run's span); ``record_errors`` lets the span record an exception itself."""
        attributes: dict[str, str | bool] = {OPERATION: "invoke_agent", "polyloop.run_id": run_id}
        if resumed is not None:
            attributes["polyloop.resumed"] = resumed
        if model:
            attributes[REQUEST_MODEL] = model
            self._models[run_id] = model
        self._traced_ids.add(run_id)
        with self._tracer.start_as_current_span(
            f"invoke_agent {run_id}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=record_errors,
            set_status_on_exception=record_errors,
        ) as span:
            try:
                yield span
            finally:
                self._models.pop(run_id, None)
                self._traced_ids.discard(run_id)
                self._close_open(run_id)

    @contextlib.contextmanager
    def action_scope(self, context: ToolContext, step_started_ns: int) -> Iterator[None]:
        """The step span (from ``step_started_ns``) and a tool span for this attempt of the
        call, the tool span current while the call runs (``TracingSink``); ``emit`` ends both
        with the step's facts. An attempt that raises ends its tool span with the error."""
        key = (context.run_id, context.step_idx)
        opened = self._open.get(key)
        if opened is None:
            step_span = self._tracer.start_span(
                f"polyloop.step {context.step_idx}",
                start_time=step_started_ns,
                attributes={
                    "polyloop.run_id": context.run_id,
                    "polyloop.step_idx": context.step_idx,
                },
            )
        else:
            step_span = opened[0]
            if opened[1] is not None:  # an earlier attempt's span, still open: it ended here
                opened[1].end()
        attributes: dict[str, str | int] = {
            OPERATION: "execute_tool",
            "polyloop.step_idx": context.step_idx,
        }
        if context.tool_name is not None:
            attributes[TOOL_NAME] = context.tool_name
        if context.tool_call_id is not None:
            attributes[TOOL_CALL_ID] = context.tool_call_id
        name = context.tool_name
        tool_span = self._tracer.start_span(
            f"execute_tool {name}" if name else "execute_tool",
            context=trace.set_span_in_context(step_span),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        self._open[key] = (step_span, tool_span)
        returned = False
        try:
            with trace.use_span(
                tool_span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield
            returned = True
        finally:
            if not returned:  # the attempt raised (passing on unchanged): its span ends here
                tool_span.set_status(Status(StatusCode.ERROR, "the call raised"))
                tool_span.end()
                self._open[key] = (step_span, None)

    def _close_open(self, run_id: str) -> None:
        """End the spans of ``run_id``'s steps whose event never came (the run stopped with
        a call open: a child left open, a crash of the call)."""
        for key in [key for key in self._open if key[0] == run_id]:
            step_span, tool_span = self._open.pop(key)
            if tool_span is not None:
                tool_span.end()
            step_span.end()

    # ---------------------------------------------------------------- progress

    async def emit_progress(self, progress: ToolProgress) -> None:
        """Add ``progress`` as a ``polyloop.tool_progress`` event, at its ``reported_ns``, to
        the span current in the reporting task: the call's ``execute_tool`` span
        (``action_scope``; a no-op when no span is recording)."""
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
        step_span, tool_span = self._open.pop((event.run_id, step.step_idx), (None, None))
        if step_span is None:
            step_span = self._tracer.start_span(
                f"polyloop.step {step.step_idx}",
                start_time=start,
                attributes={"polyloop.run_id": event.run_id, "polyloop.step_idx": step.step_idx},
            )
        try:
            step_span.set_attribute("polyloop.prompt_chars", step.prompt_chars)
            step_span.set_attribute("polyloop.parse_ok", step.parse_ok)
            if step.action_status is not None:
                step_span.set_attribute("polyloop.action_status", step.action_status.value)
            parent = trace.set_span_in_context(step_span)
            if timing is not None and timing.model_started_ns is not None:
                self._model_span(event, parent, timing.model_started_ns, timing.model_finished_ns)
            if tool_span is not None:  # opened when the call started (``action_scope``)
                _end_tool_span(event, tool_span, None if timing is None else timing)
            elif timing is not None and timing.action_started_ns is not None:
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
        name = f"execute_tool {event.tool_name}" if event.tool_name else "execute_tool"
        span: Span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes=attributes,
        )
        _step_facts(span, event)
        span.end(end_time=end if end is not None else start)


def _step_facts(span: Span, event: Event) -> None:
    """What the step's record says about its call, on the call's tool span."""
    step = event.step
    if step.action_status is not None:
        span.set_attribute("polyloop.action_status", step.action_status.value)
    if step.child is not None:  # the call ran a child run (design 0245)
        span.set_attribute("polyloop.child_run_id", step.child.run_id)
    if step.action_status is ActionStatus.ENV_ERROR:
        span.set_status(Status(StatusCode.ERROR, "environment error"))


def _end_tool_span(event: Event, span: Span, timing: StepTiming | None) -> None:
    """End the tool span ``action_scope`` opened, with the step's facts, when the call
    returned (its recorded instant, else now)."""
    _step_facts(span, event)
    finished = None if timing is None else timing.action_finished_ns
    span.end(end_time=finished)


def _set_result(span: Span, result: RunResult) -> None:
    span.set_attribute("polyloop.stop_reason", result.stop_reason.value)
    span.set_attribute("polyloop.steps", len(result.steps))
    span.set_attribute("polyloop.event_delivery_failures", result.event_delivery_failures)


def _ignore(result: RunResult) -> None:
    """What ``run_scope`` yields for a run that already has its span: nothing to record."""
