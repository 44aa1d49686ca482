"""``polyloop.otel.OtelEventSink``: the span tree of a demo run, in the SDK's in-memory exporter.

The run is the offline demo's ``r1-total`` (five tool-calling steps) with its rule-based model
wrapped to report a model name and token usage, as a real endpoint does. Design 0182.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, definition, request
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from tools.demo._agent import RuleBasedModel
from tools.demo._scenarios import definition_for, request_for, scenario_named
from tools.demo._world import Shop, World

from polyloop.errors import RunIdentityError
from polyloop.otel import OtelEventSink
from polyloop.ports import ModelCall, ToolContext
from polyloop.session import AgentDefinition
from polyloop.stores import VolatileRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import ModelReply, RunResult, StepRecord, Usage

pytestmark = pytest.mark.unit

MODEL = "rule-based-shop-1"
TREE_IDS = {"root", "root.a1", "root.a3", "root.a1.a1", "root.a1.a3", "root.a3.a1", "root.a3.a3"}


class MeteredModel:
    """The demo's model, reporting a model name and usage like an OpenAI-compatible endpoint.

    ``fail_at``: the call index at which it raises instead (a failed model call)."""

    def __init__(self, inner: RuleBasedModel, *, fail_at: int | None = None) -> None:
        self._inner = inner
        self._fail_at = fail_at

    def parameters(self) -> Mapping[str, str]:
        return {**self._inner.parameters(), "model": MODEL}

    async def call(self, call: ModelCall) -> ModelReply:
        if call.call_index == self._fail_at:
            raise ConnectionError("the endpoint went away")
        reply = await self._inner.call(call)
        prompt = sum(len(b.text) for m in call.messages for b in m.content)
        usage = Usage(prompt_tokens=prompt // 4, completion_tokens=len(reply.content) // 4)
        return dataclasses.replace(reply, usage=usage)


class FailingExporter(SpanExporter):
    """An exporter whose collector is down: every export raises."""

    def __init__(self) -> None:
        self.attempts = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.attempts += len(spans)
        raise ConnectionRefusedError("collector at 127.0.0.1:4317 is down")

    def shutdown(self) -> None:
        return None


def _provider(exporter: SpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _definition(sink: OtelEventSink, *, fail_at: int | None = None) -> AgentDefinition:
    scenario = scenario_named("r1-total")
    plain = definition_for(scenario, store=VolatileRunStore(), sink=sink)
    model = MeteredModel(RuleBasedModel(quirk=scenario.quirk), fail_at=fail_at)
    return dataclasses.replace(plain, model_client=model)


async def _demo_run(
    tmp_path: Path, exporter: SpanExporter, *, fail_at: int | None = None
) -> RunResult:
    sink = OtelEventSink(tracer_provider=_provider(exporter))
    world = World(tmp_path / "world", Shop.from_seed(7))
    request = request_for(scenario_named("r1-total"), world)
    return await sink.run(_definition(sink, fail_at=fail_at), request)


def _by_parent(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def _window(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None
    assert span.end_time is not None
    return span.start_time, span.end_time


def _steps_without_timing(steps: Sequence[StepRecord]) -> list[StepRecord]:
    return [
        dataclasses.replace(step, step_wall_ms=0, model_ms=None, action_ms=None) for step in steps
    ]


async def test_a_demo_run_exports_run_step_chat_and_tool_spans(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    result = await _demo_run(tmp_path, exporter)
    spans = exporter.get_finished_spans()
    assert result.stop_reason.value == "task_completed"
    assert len(result.steps) == 5

    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent r1-total"
    assert root.attributes is not None
    assert dict(root.attributes) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.request.model": MODEL,
        "polyloop.run_id": "r1-total",
        "polyloop.resumed": False,
        "polyloop.stop_reason": "task_completed",
        "polyloop.steps": 5,
        "polyloop.event_delivery_failures": 0,
    }

    step_spans = sorted(_by_parent(spans, root), key=lambda s: s.start_time or 0)
    assert [s.name for s in step_spans] == [f"polyloop.step {i}" for i in range(5)]
    assert len(spans) == 1 + 5 * 3  # run + (step, chat, execute_tool) per step
    for record, step_span in zip(result.steps, step_spans, strict=True):
        attributes = dict(step_span.attributes or {})
        assert attributes["polyloop.step_idx"] == record.step_idx
        assert attributes["polyloop.run_id"] == "r1-total"
        assert attributes["polyloop.action_status"] == "executed"
        chat, tool = sorted(_by_parent(spans, step_span), key=lambda s: s.start_time or 0)
        assert chat.name == f"chat {MODEL}"
        assert record.usage is not None
        assert dict(chat.attributes or {}) == {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": MODEL,
            "gen_ai.response.id": record.call_id,
            "gen_ai.usage.input_tokens": record.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": record.usage.completion_tokens,
            "polyloop.step_idx": record.step_idx,
        }
        assert record.action is not None
        tool_name = record.action.split()[0]
        assert tool.name == f"execute_tool {tool_name}"
        tool_attributes = dict(tool.attributes or {})
        assert tool_attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool_attributes["gen_ai.tool.name"] == tool_name
        # Honest placement: children inside their step, the model call before the action.
        step_start, step_end = _window(step_span)
        for child in (chat, tool):
            start, end = _window(child)
            assert step_start <= start <= end <= step_end
        assert _window(chat)[1] <= _window(tool)[0]
    for earlier, later in itertools.pairwise(step_spans):
        assert _window(earlier)[1] <= _window(later)[0]
    run_start, run_end = _window(root)
    assert run_start <= _window(step_spans[0])[0]
    assert _window(step_spans[-1])[1] <= run_end
    # No prompt, reply or observation text travels on spans.
    texts = {str(v) for s in spans for v in (s.attributes or {}).values()}
    assert not any("lookup {" in text or "costs" in text for text in texts)


async def test_an_exporter_that_raises_does_not_change_the_run(tmp_path: Path) -> None:
    working = await _demo_run(tmp_path / "a", InMemorySpanExporter())
    failing_exporter = FailingExporter()
    failing = await _demo_run(tmp_path / "b", failing_exporter)
    assert failing_exporter.attempts == 16  # every span was offered, and every export raised
    assert failing.stop_reason is working.stop_reason
    assert failing.final_answer == working.final_answer
    assert failing.event_delivery_failures == working.event_delivery_failures == 0
    assert _steps_without_timing(failing.steps) == _steps_without_timing(working.steps)


async def test_a_failed_model_call_is_an_error_span_and_the_stop_reason_is_recorded(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    result = await _demo_run(tmp_path, exporter, fail_at=1)
    assert result.stop_reason.value == "llm_error"
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None]
    assert (root.attributes or {})["polyloop.stop_reason"] == "llm_error"
    chats = [s for s in spans if s.name.startswith("chat")]
    assert [c.status.status_code for c in chats] == [StatusCode.UNSET, StatusCode.ERROR]
    assert "gen_ai.response.id" not in (chats[1].attributes or {})
    assert not [s for s in spans if s.name.startswith("execute_tool") and "step 1" in s.name]


async def test_an_exception_out_of_the_run_is_recorded_and_propagates(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    sink = OtelEventSink(tracer_provider=_provider(exporter))
    world = World(tmp_path / "world", Shop.from_seed(7))
    request = request_for(scenario_named("r1-total"), world)
    with pytest.raises(RunIdentityError):
        await sink.resume(_definition(sink), request)  # nothing to resume: a new store
    (root,) = exporter.get_finished_spans()
    assert root.status.status_code is StatusCode.ERROR
    assert [event.name for event in root.events] == ["exception"]
    assert (root.attributes or {})["polyloop.resumed"] is True


async def test_used_as_a_plain_sink_its_step_spans_are_roots(tmp_path: Path) -> None:
    from polyloop.session import run

    exporter = InMemorySpanExporter()
    sink = OtelEventSink(tracer_provider=_provider(exporter))
    world = World(tmp_path / "world", Shop.from_seed(7))
    result = await run(_definition(sink), request_for(scenario_named("r1-total"), world))
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert [s.name for s in roots] == [f"polyloop.step {i}" for i in range(len(result.steps))]
    # Without the run wrapper the sink does not know the model: no model attribute is invented.
    chats = [s for s in spans if s.name.startswith("chat")]
    assert all("gen_ai.request.model" not in (c.attributes or {}) for c in chats)


def test_parameters_report_no_destination() -> None:
    assert dict(OtelEventSink().parameters()) == {"kind": "otel"}


async def test_progress_of_a_running_tool_is_a_span_event_on_its_tool_span() -> None:
    """``emit_progress`` (design 0211 amendment): each report is a ``polyloop.tool_progress``
    event on the span current while the call runs, its tool span (``action_scope``, design
    0245), at the time it was reported, in order."""

    async def copy(files: int, ctx: ToolContext) -> str:
        """Copy files."""
        for done in range(1, files + 1):
            await ctx.report_progress(done, files, f"file {done}")
        return "copied"

    exporter = InMemorySpanExporter()
    sink = OtelEventSink(tracer_provider=_provider(exporter))
    tools = ToolRegistry([ToolSpec.from_function(copy)])
    model = ScriptedModel(['tool:copy {"files": 2}', "final:done"])
    result = await sink.run(definition(model, sink=sink), request("run-o", tools=tools))
    assert result.event_delivery_failures == 0
    [tool_span] = [s for s in exporter.get_finished_spans() if s.name == "execute_tool copy"]
    events = [e for e in tool_span.events if e.name == "polyloop.tool_progress"]
    assert [dict(e.attributes or {}) for e in events] == [
        {
            "polyloop.run_id": "run-o",
            "polyloop.step_idx": 0,
            "polyloop.progress": float(done),
            "gen_ai.tool.name": "copy",
            "polyloop.progress_total": 2.0,
            "polyloop.progress_message": f"file {done}",
        }
        for done in (1, 2)
    ]
    start, end = _window(tool_span)
    assert all(start <= e.timestamp <= end for e in events)


async def test_a_tree_of_runs_is_one_trace_and_the_tool_span_names_the_child(
    tmp_path: Path,
) -> None:
    """Design 0245: the child-run tool's span carries ``polyloop.child_run_id``, and the
    child's spans nest under it: the child's ``invoke_agent`` span is a child of the parent's
    tool span that ran it, and the child's step spans are children of that run span."""
    from _trees import Ledger, Tree, TreeModel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = OtelEventSink(provider)
    tree = Tree(TreeModel(), VolatileRunStore(), Ledger(tmp_path / "l.txt"), steps=40)
    tree.definition = dataclasses.replace(tree.definition, event_sink=sink)
    await sink.run(tree.definition, tree.request("root"))
    spans = exporter.get_finished_spans()
    assert len({span.context.trace_id for span in spans}) == 1
    named = {
        span.attributes.get("polyloop.child_run_id")
        for span in spans
        if span.name.startswith("execute_tool") and span.attributes is not None
    }
    assert {"root.a1", "root.a3", "root.a1.a1", "root.a3.a3"} <= named
    steps = [s for s in spans if s.name.startswith("polyloop.step") and s.attributes]
    assert {s.attributes["polyloop.run_id"] for s in steps if s.attributes} == {
        "root",
        "root.a1",
        "root.a3",
        "root.a1.a1",
        "root.a1.a3",
        "root.a3.a1",
        "root.a3.a3",
    }
    by_id = {span.context.span_id: span for span in spans}
    tools = {
        span.attributes["polyloop.child_run_id"]: span
        for span in spans
        if span.name.startswith("execute_tool")
        and span.attributes
        and "polyloop.child_run_id" in span.attributes
    }
    runs = {
        span.name.removeprefix("invoke_agent "): span
        for span in spans
        if span.name.startswith("invoke_agent")
    }
    assert set(runs) == set(TREE_IDS)
    for child_id, tool_span in tools.items():
        run_span = runs[str(child_id)]
        assert run_span.parent is not None
        assert run_span.parent.span_id == tool_span.context.span_id, child_id
        # the tool span is its step's, in the parent run's span
        step_span = by_id[tool_span.parent.span_id]  # type: ignore[union-attr]
        assert step_span.attributes is not None
        parent_id = str(child_id).rsplit(".", 1)[0]
        assert step_span.attributes["polyloop.run_id"] == parent_id
        assert step_span.parent is not None
        assert step_span.parent.span_id == runs[parent_id].context.span_id
        assert run_span.attributes is not None
        assert run_span.attributes["polyloop.stop_reason"] == "final_answer"
    for step in steps:
        assert step.attributes is not None
        owner = runs[str(step.attributes["polyloop.run_id"])]
        assert step.parent is not None
        assert step.parent.span_id == owner.context.span_id
