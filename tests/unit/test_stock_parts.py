"""Stock parts (issue 12, item 2; designs 0113 and 0114): defaults, message constructors, the
stock sinks, one registry per request, and ``ToolSpec.from_function``."""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Annotated, Any, Literal, Optional, TypedDict

import pytest
from _session_doubles import CONTEXT, ScriptedModel, TinyParser

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import Action, Event, EventKind, ToolCall
from polyloop.session import AgentDefinition, RunRequest, run
from polyloop.sinks import LoggingEventSink, NullEventSink
from polyloop.stores import VolatileRunStore
from polyloop.tools import ToolRegistry, ToolSpec, ToolValidationError
from polyloop.types import (
    ActionStatus,
    Budget,
    Message,
    ReplayPolicy,
    Role,
    StepRecord,
    StopReason,
    SyntheticObservations,
    TextBlock,
)

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- small stock parts


def test_message_constructors_build_one_text_block_per_text() -> None:
    assert Message.user("hi") == Message(role=Role.USER, content=(TextBlock(text="hi"),))
    assert Message.assistant("a", "b").content == (TextBlock(text="a"), TextBlock(text="b"))
    assert Message.system("s").role is Role.SYSTEM
    assert Message.of(Role.USER, "x") == Message.user("x")
    with pytest.raises(PolyloopTypeError, match=r"Message\.of\.texts\[0\] must be a str"):
        Message.user(3)  # type: ignore[arg-type]


def test_the_default_budget_and_texts_are_explicit_values() -> None:
    assert Budget() == Budget(
        max_steps=30, max_actions=30, max_consecutive_parse_failures=3, max_prompt_chars=400_000
    )
    texts = SyntheticObservations()
    assert texts.rejection("tool 'x' does not exist") == "[not executed] tool 'x' does not exist"
    assert (texts.env_failed, texts.model_call_failed) == (
        "[the environment failed]",
        "[the model call failed]",
    )


def _agent(**overrides: Any) -> AgentDefinition:
    parts: dict[str, Any] = {
        "model_client": ScriptedModel(["tool:add {}", "final:5"]),
        "decision_parser": TinyParser(),
        "store": VolatileRunStore(),
    }
    return AgentDefinition(**(parts | overrides))


async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


async def test_one_registry_is_enough_and_the_defaults_fill_the_rest() -> None:
    tools = ToolRegistry([ToolSpec.from_function(add, replay_policy=ReplayPolicy.SAFE)])
    model = ScriptedModel(['tool:add {"a": 2, "b": 3}', "final:5"])
    agent = _agent(model_client=model)
    request = RunRequest(
        run_id="r1", context=CONTEXT, model_replay_policy=ReplayPolicy.SAFE, tools=tools
    )
    assert request.action_executor.registry == tools  # type: ignore[attr-defined]
    assert isinstance(agent.event_sink, NullEventSink)
    assert agent.synthetic_observations == SyntheticObservations()
    assert request.budget == Budget()

    result = await run(agent, request)

    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == "5"
    snapshot = (await agent.store.read_log("r1")).started
    assert snapshot is not None
    assert snapshot.parameter_snapshot["event_sink.kind"] == "null"
    assert snapshot.parameter_snapshot["request.max_steps"] == "30"
    assert snapshot.parameter_snapshot["synthetic_observations.action_rejected"] == (
        "[not executed] {reason}"
    )


def test_a_request_with_neither_tools_nor_an_executor_is_refused() -> None:
    with pytest.raises(PolyloopValueError, match=r"RunRequest needs tools=.* or an action_exec"):
        RunRequest(run_id="r1", context=CONTEXT, model_replay_policy=ReplayPolicy.SAFE)


def _event(step: StepRecord) -> Event:
    return Event(kind=EventKind.STEP_FINISHED, run_id="r9", step=step, model_binding={})


def _step(**overrides: Any) -> StepRecord:
    fields: dict[str, Any] = {
        "step_idx": 2,
        "raw_output": "x",
        "content_chars": 1,
        "thinking_chars": 0,
        "action": 'add({"a": 2})',
        "parse_ok": True,
        "parse_error": None,
        "observation": "5",
        "observation_is_synthetic": False,
        "observation_truncated_chars": 0,
        "prompt_chars": 10,
        "call_id": "c",
        "step_wall_ms": 1,
        "action_status": ActionStatus.EXECUTED,
    }
    return StepRecord(**(fields | overrides))


async def test_the_logging_sink_writes_one_line_per_step_and_cuts_long_texts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = LoggingEventSink("polyloop.tests.sink", max_chars=20)
    with caplog.at_level(logging.INFO, logger="polyloop.tests.sink"):
        await sink.emit(_event(_step()))
        await sink.emit(_event(_step(observation="y" * 50)))
        await sink.emit(
            _event(_step(action=None, action_status=None, parse_ok=False, parse_error="bad"))
        )
        await sink.emit(_event(_step(action=None, action_status=None, observation="")))
        failed = _step(action=None, action_status=None, observation="[no reply]", call_id=None)
        await sink.emit(
            Event(
                kind=EventKind.STEP_FINISHED,
                run_id="r9",
                step=failed,
                model_binding={},
                model_failed=True,
            )
        )
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == 'run r9 step 2: add({"a": 2}) -> executed: 5'
    assert lines[1].endswith(": " + "y" * 17 + "...")
    assert lines[2] == "run r9 step 2: parse failure: 5"
    assert lines[3] == "run r9 step 2: final answer: "
    assert lines[4] == "run r9 step 2: model call failed: [no reply]"
    assert caplog.records[0].polyloop_event.run_id == "r9"  # type: ignore[attr-defined]
    assert sink.parameters() == {"kind": "logging"}


def test_the_logging_sink_refuses_bad_settings_naming_them() -> None:
    with pytest.raises(PolyloopTypeError, match="LoggingEventSink.logger"):
        LoggingEventSink(3)  # type: ignore[arg-type]
    with pytest.raises(PolyloopValueError, match="LoggingEventSink.max_chars"):
        LoggingEventSink(max_chars=3)


# --------------------------------------------------------------------------- from_function


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.0


class Options(TypedDict, total=False):
    verbose: bool


async def everything(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    shape: Literal["circle", "square"],
    color: Color,
    level: Level,
    tags: list[str],
    weights: dict[str, float],
    at: Point,
    options: Options,
    note: Optional[str] = None,  # noqa: UP045 - the typing spelling is part of what is tested
    size: Annotated[int, "size in cm"] = 3,
    label: str | None = None,
) -> str:
    """Take one of everything.

    The whole docstring is the description.
    """
    return repr((name, count, ratio, flag, shape, color, level, tags, weights, at, options, note))


def test_from_function_maps_every_supported_annotation() -> None:
    spec = ToolSpec.from_function(everything)
    assert spec.name == "everything"
    assert spec.description == "Take one of everything.\n\nThe whole docstring is the description."
    schema = ToolRegistry([spec]).schema_for_model()[0]["parameters"]
    assert schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "shape": {"type": "string", "enum": ["circle", "square"]},
            "color": {"type": "string", "enum": ["red", "blue"]},
            "level": {"type": "integer", "enum": [1, 2]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "weights": {"type": "object", "additionalProperties": {"type": "number"}},
            "at": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
                "required": ["x"],
                "additionalProperties": False,
            },
            "options": {
                "type": "object",
                "properties": {"verbose": {"type": "boolean"}},
                "additionalProperties": False,
            },
            "note": {"type": ["string", "null"], "default": None},
            "size": {"type": "integer", "description": "size in cm", "default": 3},
            "label": {"type": ["string", "null"], "default": None},
        },
        "required": [
            "name", "count", "ratio", "flag", "shape", "color", "level", "tags", "weights",
            "at", "options",
        ],
        "additionalProperties": False,
    }  # fmt: skip


async def test_from_function_converts_arguments_to_their_annotated_types() -> None:
    seen: list[tuple[Color, Point, int, float]] = []

    async def place(color: Color, at: Point, count: int, ratio: float) -> str:
        """Place a point."""
        seen.append((color, at, count, ratio))
        return "placed"

    executor = ToolRegistry([ToolSpec.from_function(place)]).executor()
    arguments = {"color": "blue", "at": {"x": 3.0, "y": 1}, "count": 2.0, "ratio": 1}
    outcome = await executor.execute(
        Action(text="place", tool_call=ToolCall(name="place", arguments=arguments))
    )
    assert outcome.status is ActionStatus.EXECUTED
    assert seen == [(Color.BLUE, Point(x=3, y=1.0), 2, 1.0)]
    assert [type(v) for v in (seen[0][1].x, seen[0][1].y, seen[0][2], seen[0][3])] == [
        int,
        float,
        int,
        float,
    ]


@pytest.mark.parametrize(
    ("arguments", "words", "checked"),
    [
        (
            {"color": "green", "at": {"x": 1}},
            "the parameter 'color' must be one of ['red', 'blue']",
            'the parameter \'color\' must be one of "red", "blue", got string "green"',
        ),
        (
            {"color": "red", "at": {"y": 1}},
            "the parameter 'at' is missing the field 'x'",
            "the required parameter 'at.x' is missing",
        ),
        (
            {"color": "red", "at": {"x": 1, "z": 0}},
            "the parameter 'at' has the undeclared field",
            "the parameter 'at.z' is undeclared; the object 'at' accepts only 'x', 'y'",
        ),
        (
            {"color": "red", "at": {"x": "1"}},
            "the parameter 'at'.x must be integer, got string",
            "the parameter 'at.x' has the wrong type: expected integer, got string \"1\"",
        ),
    ],
)
async def test_from_function_refuses_what_does_not_fit_naming_the_parameter(
    arguments: dict[str, object], words: str, checked: str
) -> None:
    """The handler checks each argument against its annotation; inside a registry the
    schema check (deep, design 0223) refuses the same calls first, in its own words."""
    ran: list[str] = []

    async def place(color: Color, at: Point) -> str:
        """Place a point."""
        ran.append("ran")
        return "placed"

    spec = ToolSpec.from_function(place)
    assert spec.handler is not None
    with pytest.raises(ToolValidationError) as refused:
        await spec.handler(arguments)
    assert f"tool 'place': {words}" in str(refused.value)
    executor = ToolRegistry([spec]).executor()
    outcome = await executor.execute(
        Action(text="place", tool_call=ToolCall(name="place", arguments=arguments))
    )
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert f"tool 'place': {checked}" in outcome.observation
    assert ran == []


async def _bytes(data: bytes) -> str:
    """d"""
    return ""


async def _untyped(data) -> str:  # type: ignore[no-untyped-def]
    """d"""
    return ""


async def _union(data: int | str) -> str:
    """d"""
    return ""


async def _nested_set(data: list[set[int]]) -> str:
    """d"""
    return ""


async def _int_keys(data: dict[int, str]) -> str:
    """d"""
    return ""


async def _star(*data: str) -> str:
    """d"""
    return ""


async def _returns_int(data: str) -> int:
    """d"""
    return 1


@pytest.mark.parametrize(
    ("function", "words"),
    [
        (_bytes, "parameter 'data' is annotated bytes, which has no JSON Schema mapping"),
        (_untyped, "parameter 'data' has no type annotation"),
        (_union, "parameter 'data' is annotated int | str, a union other than Optional"),
        (_nested_set, "parameter 'data' (its items) is annotated set[int]"),
        (_int_keys, "parameter 'data' is annotated dict[int, str], but JSON object keys"),
        (_star, "parameter 'data' is variadic positional"),
        (_returns_int, "the return annotation is int"),
    ],
)
def test_from_function_refuses_an_unsupported_signature_naming_the_parameter(
    function: Any, words: str
) -> None:
    with pytest.raises(PolyloopTypeError) as info:
        ToolSpec.from_function(function)
    assert str(info.value).startswith(f"ToolSpec.from_function({function.__qualname__}): ")
    assert words in str(info.value)


def test_from_function_needs_an_async_function_with_a_docstring() -> None:
    def sync(text: str) -> str:
        """d"""
        return text

    async def undocumented(text: str) -> str:
        return text

    with pytest.raises(PolyloopTypeError, match="must be an `async def` function"):
        ToolSpec.from_function(sync)  # type: ignore[arg-type]
    with pytest.raises(PolyloopValueError, match="has no docstring"):
        ToolSpec.from_function(undocumented)
    spec = ToolSpec.from_function(undocumented, name="echo", description="Echo the text.")
    assert (spec.name, spec.description) == ("echo", "Echo the text.")


def test_specs_from_one_function_are_equal_so_one_registry_matches_itself() -> None:
    first = ToolSpec.from_function(add, replay_policy=ReplayPolicy.SAFE, completes_run=True)
    second = ToolSpec.from_function(add, replay_policy=ReplayPolicy.SAFE, completes_run=True)
    assert first == second
    assert (first.replay_policy, first.completes_run) == (ReplayPolicy.SAFE, True)
    assert ToolSpec.from_function(add, name="plus") != first


async def test_a_handler_refusal_is_a_tool_validation_error_with_the_key() -> None:
    spec = ToolSpec.from_function(add)
    assert spec.handler is not None
    with pytest.raises(ToolValidationError) as info:
        await spec.handler({"a": "two", "b": 3})
    assert (info.value.tool, info.value.key) == ("add", "a")
