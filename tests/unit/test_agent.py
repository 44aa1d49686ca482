"""``polyloop.Agent``: the short path is the explicit path, named (issue 25, design 0208).

Offline, with ``ScriptedModelClient``; the model-string path over loopback HTTP is in
``tests/integration/test_agent_loopback.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from polyloop import Agent, tool
from polyloop.agent import AgentResult, OutputParser
from polyloop.errors import (
    EventLoopRunningError,
    FinishedRunDriftWarning,
    OutputValidationError,
    ParameterDriftError,
    PolyloopTypeError,
    PolyloopValueError,
)
from polyloop.parsers import JsonToolCallParser, NativeToolCallParser
from polyloop.session import AgentDefinition, RunRequest
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    NativeToolCall,
    ReplayPolicy,
    Role,
    StopReason,
)

pytestmark = pytest.mark.unit

SECRET = "sk-do-not-print-7f3a9c"


@tool(replay="safe")
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@tool(replay="safe")
async def multiply(a: int, b: int) -> str:
    """Multiply two integers."""
    return str(a * b)


@dataclass
class Answer:
    value: int
    explanation: str


def _call(name: str, arguments: dict[str, object], index: int) -> ModelReply:
    call = NativeToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))
    return ModelReply(call_id=f"r{index}", content="", tool_calls=(call,))


def _model(*replies: str | ModelReply) -> ScriptedModelClient:
    return ScriptedModelClient(replies, native_tool_calls=True)


def _snapshot(definition: AgentDefinition, request: RunRequest) -> dict[str, str]:
    return {**definition.parameter_snapshot(), **request.parameter_snapshot()}


# --------------------------------------------------------------------------- nothing hidden


def test_the_defaults_are_the_named_explicit_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    agent = Agent(_model("done"), tools=[add, multiply])
    definition = agent.definition()
    request = agent.request("What is (2 + 3) * 4?", "agent-1")

    assert isinstance(definition.decision_parser, NativeToolCallParser)
    assert isinstance(definition.store, JsonlRunStore)
    assert repr(definition.store) == "JsonlRunStore(directory='runs')"
    assert request.budget == Budget()
    assert request.model_replay_policy is ReplayPolicy.SAFE
    assert request.context == Context(goal_level=(Message.user("What is (2 + 3) * 4?"),))
    snapshot = _snapshot(definition, request)
    assert snapshot["decision_parser.kind"] == "native_tool_calls"
    assert snapshot["request.model_replay_policy"] == "safe"
    assert snapshot["request.max_steps"] == "30"
    assert snapshot["store.kind"] == "jsonl"
    assert snapshot["request.tools"] == "add,multiply"


def test_the_snapshot_is_the_explicit_forms_plus_the_prompt_fingerprint(tmp_path: Path) -> None:
    """The README's "what the Agent builds": the same parts give the same snapshot."""
    model = _model("done")
    agent = Agent(model, tools=[add, multiply], store=tmp_path)
    explicit_definition = AgentDefinition(
        model_client=model,
        decision_parser=NativeToolCallParser(),
        store=JsonlRunStore(directory=tmp_path),
    )
    tools = ToolRegistry(
        [
            ToolSpec.from_function(add, replay_policy=ReplayPolicy.SAFE),
            ToolSpec.from_function(multiply, replay_policy=ReplayPolicy.SAFE),
        ]
    )
    explicit_request = RunRequest(
        run_id="agent-1",
        tools=tools,
        model_replay_policy=ReplayPolicy.SAFE,
        context=Context(goal_level=[Message.user("What is (2 + 3) * 4?")]),
    )
    facade = _snapshot(agent.definition(), agent.request("What is (2 + 3) * 4?", "agent-1"))
    explicit = _snapshot(explicit_definition, explicit_request)

    assert {k: v for k, v in facade.items() if not k.startswith("request.fingerprint.")} == explicit
    assert set(facade) - set(explicit) == {"request.fingerprint.prompt"}
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", facade["request.fingerprint.prompt"])


def test_instructions_are_the_run_level_system_message_and_are_fingerprinted() -> None:
    agent = Agent(_model("x"), instructions="You are terse.", store=VolatileRunStore())
    request = agent.request("Hi", "r")
    assert request.context.run_level == (Message.system("You are terse."),)
    assert set(request.fingerprints) == {"prompt", "instructions"}


def test_a_text_parser_gets_its_instructions_and_the_answers_form_into_the_system_message() -> None:
    agent = Agent(
        ScriptedModelClient(["x"]),
        tools=[add],
        parser=JsonToolCallParser(),
        output_type=Answer,
        instructions="Be exact.",
        store=VolatileRunStore(),
    )
    (system,) = agent.request("Hi", "r").context.run_level
    assert system.role is Role.SYSTEM
    text = system.content[0].text
    assert text.startswith("Be exact.\n\n")
    assert '"tool": "<tool name>"' in text  # JsonToolCallParser.instructions(...)
    assert '"name": "final_result"' in text  # the answer's schema is listed with the tools
    assert 'calling the tool "final_result"' in text  # and how to give it


def test_a_structured_output_type_wraps_the_parser_and_adds_the_answers_tool() -> None:
    agent = Agent(_model("x"), tools=[add], output_type=Answer, store=VolatileRunStore())
    parser = agent.definition().decision_parser
    assert isinstance(parser, OutputParser)
    assert isinstance(parser.inner, NativeToolCallParser)
    request = agent.request("Hi", "r")
    assert request.tools.names() == ("add", "final_result")
    assert request.parameter_snapshot()["action_executor.tool.final_result.replay_policy"] == "safe"


# --------------------------------------------------------------------------- running


async def test_run_is_run_or_resume_and_a_second_call_only_reports(tmp_path: Path) -> None:
    model = _model(_call("add", {"a": 2, "b": 3}, 0), "5")
    agent = Agent(model, tools=[add], store=tmp_path)

    first = await agent.run("What is 2 + 3?", run_id="sum")
    again = await agent.run("What is 2 + 3?", run_id="sum")

    assert isinstance(first, AgentResult)
    assert (first.stop_reason, first.output, first.run_id) == (StopReason.FINAL_ANSWER, "5", "sum")
    assert [step.action for step in first.steps] == ['add({"a": 2, "b": 3})', None]
    assert again.result == first.result
    assert len(model.calls) == 2  # the second call did nothing but read the log
    assert (tmp_path / "sum.jsonl").is_file()
    assert "run_id='sum'" in repr(first)


async def test_without_a_run_id_one_is_generated_and_returned(tmp_path: Path) -> None:
    agent = Agent(_model("hello"), store=tmp_path)
    result = await agent.run("Say hello")
    assert re.fullmatch(r"agent-\d{8}T\d{6}Z-[0-9a-f]{6}", result.run_id)
    assert (tmp_path / f"{result.run_id}.jsonl").is_file()
    assert result.output == "hello"


async def test_a_structured_answer_is_rebuilt_from_the_record_by_another_agent(
    tmp_path: Path,
) -> None:
    model = _model(_call("final_result", {"value": 20, "explanation": "(2+3)*4"}, 0))
    first = await Agent(model, output_type=Answer, store=tmp_path).run("Q", run_id="typed")
    fresh = Agent(_model(), output_type=Answer, store=tmp_path)  # no script: it must not call
    again = await fresh.run("Q", run_id="typed")

    assert first.output == Answer(value=20, explanation="(2+3)*4")
    assert again.output == first.output
    assert json.loads(again.final_answer or "") == {"value": 20, "explanation": "(2+3)*4"}


async def test_a_misfit_counts_as_a_parse_failure() -> None:
    wrong = _call("final_result", {"value": "twenty", "explanation": "x"}, 0)
    agent = Agent(
        _model(wrong, wrong),
        output_type=Answer,
        budget=Budget(max_consecutive_parse_failures=2),
        store=VolatileRunStore(),
    )
    result = await agent.run("Q", run_id="misfit")
    assert result.stop_reason is StopReason.PARSE_FAILURES
    assert result.output is None
    assert all(step.parse_error for step in result.steps)
    assert "the field 'value' must be integer" in (result.steps[0].observation or "")


async def test_an_answer_recorded_under_another_output_type_is_refused_on_reading(
    tmp_path: Path,
) -> None:
    @dataclass
    class Other:
        count: int

    await Agent(_model("plain"), store=tmp_path).run("Q", run_id="was-text")
    # The finished run's settings differ (its parser, its tools): said first (design 0217).
    with (
        pytest.warns(FinishedRunDriftWarning, match=r"decision_parser\.output\.type"),
        pytest.raises(OutputValidationError, match=r"'was-text'.*new run id"),
    ):
        await Agent(_model(), output_type=Other, store=tmp_path).run("Q", run_id="was-text")


class _Crash(BaseException):
    """A process dying in the middle of a model call."""


async def test_resuming_a_run_id_with_another_prompt_is_refused(tmp_path: Path) -> None:
    with pytest.raises(_Crash):
        await Agent(_model(_Crash()), store=tmp_path).run("First question", run_id="same")
    agent = Agent(_model("answer"), store=tmp_path)
    with pytest.raises(ParameterDriftError, match=r"request\.fingerprint\.prompt"):
        await agent.run("Another question", run_id="same")
    resumed = await agent.run("First question", run_id="same")
    assert resumed.output == "answer"


def test_run_sync_runs_a_script_and_refuses_inside_an_event_loop(tmp_path: Path) -> None:
    agent = Agent(_model("hi"), store=tmp_path)
    assert agent.run_sync("Say hi", run_id="sync").output == "hi"

    async def inside() -> None:
        agent.run_sync("Say hi", run_id="sync")

    with pytest.raises(EventLoopRunningError, match=r"await agent\.run"):
        asyncio.run(inside())


# --------------------------------------------------------------------------- clear errors


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"tools": [lambda: None]}, PolyloopTypeError, r"tools\[0\].*not decorated.*@tool"),
        ({"tools": ["add"]}, PolyloopTypeError, r"tools\[0\] is a str"),
        ({"tools": add}, PolyloopTypeError, r"Agent\(tools=\.\.\.\) is a list"),
        ({"output_type": int}, PolyloopTypeError, r"output_type=int.*dataclass"),
        ({"budget": 30}, PolyloopTypeError, r"Agent\(budget=\.\.\.\) must be a Budget"),
        ({"store": 3}, PolyloopTypeError, r"Agent\(store=\.\.\.\) is a RunStore or a directory"),
        ({"instructions": 3}, PolyloopTypeError, r"Agent\(instructions=\.\.\.\) must be a str"),
        ({"model_replay_policy": "maybe"}, PolyloopValueError, r"'safe'.*'idempotent'.*'never'"),
        ({"base_url": "http://x/v1"}, PolyloopTypeError, r"base_url=.*model string"),
        ({"api_key": SECRET}, PolyloopTypeError, r"api_key=.*model string"),
        (
            {"parser": object()},
            PolyloopTypeError,
            r"Agent\(parser=\.\.\.\) must be a DecisionParser",
        ),
    ],
)
def test_construction_errors_name_the_argument_and_the_fix(
    kwargs: dict[str, object], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern) as caught:
        Agent(_model("x"), store=kwargs.pop("store", VolatileRunStore()), **kwargs)  # type: ignore[call-overload]
    assert SECRET not in str(caught.value)


def test_a_model_string_agent_checks_its_other_seams_at_construction() -> None:
    with pytest.raises(PolyloopTypeError, match="event_sink"):
        Agent(
            "openai:m",
            base_url="http://127.0.0.1:9/v1",
            event_sink=object(),  # type: ignore[arg-type]
            store=VolatileRunStore(),
        )


def test_a_tool_named_like_the_answer_is_refused() -> None:
    @tool(name="final_result")
    async def clash() -> str:
        """Clash."""
        return ""

    with pytest.raises(PolyloopValueError, match="rename yours"):
        Agent(_model("x"), tools=[clash], output_type=Answer, store=VolatileRunStore())


def test_a_client_without_native_tool_calls_needs_a_text_parser() -> None:
    with pytest.raises(PolyloopTypeError, match=r"parser=JsonToolCallParser\(\)"):
        Agent(ScriptedModelClient(["x"]), store=VolatileRunStore())


def test_an_empty_prompt_is_refused() -> None:
    agent = Agent(_model("x"), store=VolatileRunStore())
    with pytest.raises(PolyloopValueError, match="must not be empty"):
        agent.request("  ", "r")
    with pytest.raises(PolyloopTypeError, match="task as a str"):
        agent.request(None, "r")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "pattern"),
    [
        ("gpt-4o-mini", r"'openai:<model name>'"),
        ("anthropic:claude", r"'openai:<model name>'.*ModelClient"),
        ("openai:", r"names no model"),
        (" openai:x", r"'openai:<model name>'"),
        (42, r"'openai:<model name>' or a ModelClient"),
    ],
)
def test_a_model_that_is_neither_a_model_string_nor_a_client_is_refused(
    model: object, pattern: str
) -> None:
    with pytest.raises((PolyloopTypeError, PolyloopValueError), match=pattern):
        Agent(model, store=VolatileRunStore())  # type: ignore[call-overload]


def test_openais_endpoint_without_a_key_is_refused_before_any_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(PolyloopValueError, match=r"OPENAI_API_KEY.*OPENAI_BASE_URL"):
        Agent("openai:gpt-4o-mini", store=VolatileRunStore())


def test_a_local_endpoint_needs_no_key_and_nothing_connects_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    agent = Agent("openai:local-model", store=VolatileRunStore())
    snapshot = agent.definition().parameter_snapshot()
    assert snapshot["model_client.endpoint"] == "http://127.0.0.1:9/v1"
    assert snapshot["model_client.model"] == "local-model"
    asyncio.run(agent.aclose())


@pytest.mark.parametrize("bad_key", [f"{SECRET}\n", f" {SECRET}", f"{SECRET}é", ""])
def test_a_bad_api_key_is_refused_without_being_shown(
    bad_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(PolyloopValueError) as caught:
        Agent("openai:m", api_key=bad_key, base_url="http://127.0.0.1:9/v1")
    assert SECRET not in str(caught.value)
    assert "api_key=" in str(caught.value)

    monkeypatch.setenv("OPENAI_API_KEY", bad_key or " ")
    with pytest.raises(PolyloopValueError) as from_env:
        Agent("openai:m", base_url="http://127.0.0.1:9/v1")
    assert SECRET not in str(from_env.value)
    assert "OPENAI_API_KEY" in str(from_env.value)


def test_the_key_is_never_in_a_repr_or_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    agent = Agent("openai:gpt-4o-mini", api_key=SECRET, store=VolatileRunStore())
    definition = agent.definition()
    shown = [
        repr(agent),
        repr(agent.request("Q", "r")),
        repr(definition),
        json.dumps(_snapshot(definition, agent.request("Q", "r"))),
    ]
    assert all(SECRET not in text for text in shown)
    assert "api.openai.com" in repr(agent)
    asyncio.run(agent.aclose())


def test_a_bad_base_url_is_refused_naming_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://user:hunter2@127.0.0.1/v1")
    with pytest.raises(PolyloopValueError) as caught:
        Agent("openai:m", store=VolatileRunStore())
    assert "OPENAI_BASE_URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_an_agent_around_a_client_loads_no_http_client() -> None:
    code = (
        "import sys\n"
        "from polyloop import Agent\n"
        "from polyloop.stores import VolatileRunStore\n"
        "from polyloop.testing import ScriptedModelClient\n"
        "Agent(ScriptedModelClient(['x'], native_tool_calls=True), store=VolatileRunStore())\n"
        "print('httpx' in sys.modules, 'polyloop.adapters' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "False"]


async def test_a_gateway_connection_owns_its_http_client_and_hides_the_key() -> None:
    from polyloop.adapters import GatewayConnection, GatewaySettings

    settings = GatewaySettings(base_url="http://127.0.0.1:9/v1", model="m")
    connection = GatewayConnection(settings, api_key=SECRET)
    assert SECRET not in repr(connection)
    assert "api_key=set" in repr(connection)
    assert connection.model_client.settings is settings
    assert not connection.is_closed
    await connection.aclose()
    await connection.aclose()  # idempotent
    assert connection.is_closed
    with pytest.raises(PolyloopValueError) as caught:
        GatewayConnection(settings, api_key=f"{SECRET}\n")
    assert SECRET not in str(caught.value)


# ---------------------------------------------------------------- bounds (issue 36, design 0225)


def test_the_bounds_reach_the_request_and_the_snapshot() -> None:
    agent = Agent(
        _model("x"),
        store=VolatileRunStore(),
        model_call_timeout_seconds=5,
        action_timeout_seconds=7.5,
        approval_expires_seconds=3600,
    )
    request = agent.request("task", "r-1")
    assert request.model_call_timeout_seconds == 5.0
    assert request.action_timeout_seconds == 7.5
    assert request.approval_expires_seconds == 3600.0
    snapshot = request.parameter_snapshot()
    assert snapshot["request.model_call_timeout_seconds"] == "5.0"
    assert snapshot["request.action_timeout_seconds"] == "7.5"
    assert snapshot["request.approval_expires_seconds"] == "3600.0"


def test_the_defaults_leave_the_request_as_before_and_the_http_read_bound_is_finite() -> None:
    import math

    from polyloop.agent import DEFAULT_READ_TIMEOUT_SECONDS

    request = Agent(_model("x"), store=VolatileRunStore()).request("task", "r-1")
    # As RunRequest's own defaults: nothing new in the snapshot, so older runs still resume.
    assert request.model_call_timeout_seconds is None
    assert request.action_timeout_seconds is None
    assert request.approval_expires_seconds is None
    assert math.isfinite(DEFAULT_READ_TIMEOUT_SECONDS)
    assert DEFAULT_READ_TIMEOUT_SECONDS > 0


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, PolyloopValueError),
        (-1.0, PolyloopValueError),
        (float("inf"), PolyloopValueError),
        (float("nan"), PolyloopValueError),
        (True, PolyloopTypeError),
        ("5", PolyloopTypeError),
    ],
)
@pytest.mark.parametrize(
    "name", ["model_call_timeout_seconds", "action_timeout_seconds", "approval_expires_seconds"]
)
def test_a_bad_bound_is_refused_naming_the_option(
    name: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=rf"Agent\({name}=\.\.\.\)"):
        Agent(_model("x"), store=VolatileRunStore(), **{name: value})  # type: ignore[call-overload]
