"""Progress of a running tool call reaches the run's event sink (design 0211, amendment).

``ToolContext.report_progress`` -> the session's reporter -> ``emit_progress`` of a sink that
has it (``ports.ProgressSink``); a sink without it works unchanged; a sink whose
``emit_progress`` raises or hangs never changes the run; ``CancelledError`` passes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from _session_doubles import RecordingSink, ScriptedModel, definition, request

from polyloop.errors import PolyloopTypeError
from polyloop.ports import Event, ProgressSink, ToolContext, ToolProgress
from polyloop.session import run
from polyloop.sinks import LoggingEventSink
from polyloop.stores import VolatileRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import RunResult, StopReason

pytestmark = pytest.mark.unit

SCRIPT = ['tool:copy {"files": 3}', 'tool:copy {"files": 2}', "final:copied"]


async def copy(files: int, ctx: ToolContext) -> str:
    """Copy some files, reporting each."""
    for done in range(1, files + 1):
        await ctx.report_progress(done, files, f"file {done}")
    return f"{files} copied"


def tools() -> ToolRegistry:
    return ToolRegistry([ToolSpec.from_function(copy)])


@dataclass
class ProgressRecorder:
    """A ``ProgressSink``: everything it gets, events and progress, in arrival order."""

    seen: list[Event | ToolProgress] = field(default_factory=list)
    fail: BaseException | None = None
    hang: bool = False
    reported: asyncio.Event = field(default_factory=asyncio.Event)

    async def emit(self, event: Event) -> None:
        self.seen.append(event)

    async def emit_progress(self, progress: ToolProgress) -> None:
        self.seen.append(progress)
        self.reported.set()
        if self.hang:
            await asyncio.Event().wait()
        if self.fail is not None:
            raise self.fail

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "recording"}


async def run_with(sink: object, run_id: str = "run-p", **extra: object) -> RunResult:
    store = VolatileRunStore()
    result = await run(
        definition(ScriptedModel(SCRIPT), store=store, sink=sink),
        request(run_id, tools=tools(), **extra),  # type: ignore[arg-type]
    )
    return result


def timeless(result: RunResult) -> RunResult:
    """``result`` with its measured durations zeroed (two runs never take the same time)."""
    steps = tuple(
        dataclasses.replace(
            s,
            step_wall_ms=0,
            model_ms=None if s.model_ms is None else 0,
            action_ms=None if s.action_ms is None else 0,
        )
        for s in result.steps
    )
    return dataclasses.replace(result, steps=steps)


async def test_a_function_tool_reports_progress_to_the_sink_in_order_before_its_event() -> None:
    sink = ProgressRecorder()
    assert isinstance(sink, ProgressSink)
    result = await run_with(sink)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    shape = [
        ("event", s.step.step_idx)
        if isinstance(s, Event)
        else ("progress", s.step_idx, s.tool_name, s.progress, s.total, s.message)
        for s in sink.seen
    ]
    assert shape == [
        ("progress", 0, "copy", 1.0, 3.0, "file 1"),
        ("progress", 0, "copy", 2.0, 3.0, "file 2"),
        ("progress", 0, "copy", 3.0, 3.0, "file 3"),
        ("event", 0),
        ("progress", 1, "copy", 1.0, 2.0, "file 1"),
        ("progress", 1, "copy", 2.0, 2.0, "file 2"),
        ("event", 1),
        ("event", 2),
    ]
    reports = [s for s in sink.seen if isinstance(s, ToolProgress)]
    assert {(p.run_id, p.origin, p.tool_call_id) for p in reports} == {("run-p", None, None)}
    times = [p.reported_ns for p in reports]
    assert times == sorted(times)


async def test_a_sink_without_emit_progress_gets_its_events_and_the_same_result() -> None:
    plain = RecordingSink()
    assert not isinstance(plain, ProgressSink)
    without = await run_with(plain)
    with_progress = await run_with(ProgressRecorder())
    assert [e.step.step_idx for e in plain.events] == [0, 1, 2]
    assert timeless(without) == timeless(with_progress)
    assert without.event_delivery_failures == 0


@pytest.mark.parametrize("failure", ["raises", "hangs"])
async def test_a_failing_emit_progress_leaves_the_run_result_identical(
    failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = await run_with(ProgressRecorder())
    bad_sink = ProgressRecorder(
        fail=ConnectionError("progress backend down") if failure == "raises" else None,
        hang=failure == "hangs",
    )
    with caplog.at_level(logging.WARNING, logger="polyloop.session"):
        bad = await run_with(bad_sink, event_timeout_seconds=0.05)
    assert timeless(bad) == timeless(good)
    assert bad.event_delivery_failures == 0  # progress is not a step event
    assert [e.step.step_idx for e in bad_sink.seen if isinstance(e, Event)] == [0, 1, 2]
    assert sum(isinstance(s, ToolProgress) for s in bad_sink.seen) == 5  # each one tried
    failed = [r.getMessage() for r in caplog.records if "progress delivery failed" in r.message]
    assert failed == [
        f"run run-p step {step}: progress delivery failed ({n} so far); the call goes on"
        for step, n in ((0, 1), (0, 2), (0, 3), (1, 4), (1, 5))
    ]


async def test_a_cancelled_error_from_emit_progress_is_not_swallowed() -> None:
    sink = ProgressRecorder(fail=asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await run_with(sink)
    assert [type(s).__name__ for s in sink.seen] == ["ToolProgress"]  # the first report


async def test_cancelling_a_run_while_emit_progress_waits_cancels_the_run() -> None:
    sink = ProgressRecorder(hang=True)
    task = asyncio.ensure_future(run_with(sink))
    await asyncio.wait_for(sink.reported.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_report_progress_outside_a_run_does_nothing_and_the_reporter_is_not_compared() -> (
    None
):
    bare = ToolContext(idempotency_key="k", run_id="r", step_idx=0)
    await bare.report_progress(1, 2, "half")  # no reporter: nothing to deliver to
    got: list[ToolProgress] = []

    async def reporter(progress: ToolProgress) -> None:
        got.append(progress)

    wired = dataclasses.replace(bare, tool_name="t", progress_reporter=reporter)
    assert wired == dataclasses.replace(bare, tool_name="t")
    assert "reporter" not in repr(wired)
    await wired.report_progress(1, message="one", origin="mcp:odd")
    assert [(p.tool_name, p.progress, p.total, p.message, p.origin) for p in got] == [
        ("t", 1.0, None, "one", "mcp:odd")
    ]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"progress": "half"}, r"ToolProgress\.progress must be a number.*got str"),
        ({"progress": True}, r"ToolProgress\.progress must be a number.*got bool"),
        ({"total": "3"}, r"ToolProgress\.total must be a number.*got str"),
        ({"message": 3}, r"ToolProgress\.message must be a str or None, got int"),
        ({"step_idx": 1.0}, r"ToolProgress\.step_idx must be an int, got float"),
    ],
)
def test_a_malformed_progress_value_is_refused_naming_the_field(
    changes: dict[str, object], match: str
) -> None:
    fields: dict[str, object] = {
        "run_id": "r",
        "step_idx": 0,
        "tool_name": "t",
        "tool_call_id": None,
        "progress": 1,
    }
    with pytest.raises(PolyloopTypeError, match=match):
        ToolProgress(**{**fields, **changes})  # type: ignore[arg-type]


async def test_the_logging_sink_logs_progress_with_the_value_attached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = LoggingEventSink(max_chars=12)
    assert isinstance(sink, ProgressSink)
    value = ToolProgress(
        run_id="r1",
        step_idx=2,
        tool_name="copy",
        tool_call_id=None,
        progress=3,
        total=10,
        message="copying a great many files",
    )
    with caplog.at_level(logging.INFO, logger="polyloop.events"):
        await sink.emit_progress(value)
        await sink.emit_progress(dataclasses.replace(value, total=None, message=None))
    assert [r.getMessage() for r in caplog.records] == [
        "run r1 step 2: copy progress 3/10: copying a...",
        "run r1 step 2: copy progress 3",
    ]
    assert caplog.records[0].polyloop_progress is value  # type: ignore[attr-defined]
