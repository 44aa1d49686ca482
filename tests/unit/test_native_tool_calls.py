"""Native tool calls through the seams (design 0100), against doubles and a MockTransport.

The same path over a real loopback HTTP server, with a killed subprocess, is in
``tests/integration/test_native_tool_calls_loopback.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from _shared_doubles import TEXTS
from polyloop import serialization
from polyloop._assembly import assemble, history_message_pair, prompt_chars
from polyloop.adapters import GatewayModelClient, GatewayResponseError, GatewaySettings
from polyloop.parsers import NativeToolCallParser
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ModelCall
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.sinks import NullEventSink
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    ActionStatus,
    Budget,
    Context,
    Message,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
    ReplayPolicy,
    Role,
    StepRecord,
    StopReason,
    TextBlock,
)

pytestmark = pytest.mark.unit

BUDGET = Budget(
    max_steps=8, max_actions=8, max_consecutive_parse_failures=3, max_prompt_chars=100_000
)


def call(call_id: str, name: str, arguments: str = "{}") -> NativeToolCall:
    return NativeToolCall(id=call_id, name=name, arguments=arguments)


def reply(*calls: NativeToolCall, content: str = "", finish: str | None = None) -> ModelReply:
    return ModelReply(call_id="chatcmpl-1", content=content, tool_calls=calls, finish_reason=finish)


# --------------------------------------------------------------------------- values


def test_a_tool_message_needs_the_id_of_the_call_it_answers() -> None:
    with pytest.raises(TypeError, match="tool_call_id"):
        Message(role=Role.TOOL, content=(TextBlock(text="x"),))
    with pytest.raises(ValueError, match="tool_call_id"):
        Message(role=Role.TOOL, content=(TextBlock(text="x"),), tool_call_id="")
    with pytest.raises(ValueError, match="only for Role.TOOL"):
        Message(role=Role.USER, content=(), tool_call_id="call_1")


def test_only_assistant_turns_carry_tool_calls() -> None:
    with pytest.raises(ValueError, match="only for Role.ASSISTANT"):
        Message(role=Role.USER, content=(), tool_calls=(call("c1", "t"),))
    turn = Message(role=Role.ASSISTANT, content=(), tool_calls=[call("c1", "t")])
    assert turn.tool_calls == (call("c1", "t"),)


def test_tool_call_ids_are_unique_within_a_turn() -> None:
    with pytest.raises(ValueError, match="'c1' twice"):
        ModelReply(call_id=None, content="", tool_calls=(call("c1", "a"), call("c1", "b")))


def test_a_native_tool_call_needs_an_id_and_keeps_the_raw_arguments() -> None:
    with pytest.raises(ValueError, match="NativeToolCall.id"):
        NativeToolCall(id="", name="t", arguments="{}")
    raw = '{"b": 1,  "a": [1,2]}'
    assert NativeToolCall(id="c", name="t", arguments=raw).arguments == raw


# --------------------------------------------------------------------------- the parser


def test_one_call_is_an_action_whose_trace_form_is_the_raw_call() -> None:
    parsed = NativeToolCallParser().parse(reply(call("c1", "lookup", '{"q": "x"}')))
    assert isinstance(parsed.decision, Action)
    assert parsed.decision.text == 'lookup({"q": "x"})'
    assert parsed.decision.tool_call is not None
    assert parsed.decision.tool_call.arguments == {"q": "x"}
    assert parsed.tool_calls == (call("c1", "lookup", '{"q": "x"}'),)


def test_blank_arguments_read_as_no_arguments() -> None:
    decision = NativeToolCallParser().parse(reply(call("c1", "now", ""))).decision
    assert isinstance(decision, Action)
    assert decision.tool_call is not None
    assert decision.tool_call.arguments == {}


@pytest.mark.parametrize(
    ("the_reply", "words"),
    [
        (reply(call("c1", "lookup", '{"q": '), finish="length"), ["cut off", "'length'"]),
        (reply(call("c1", "a"), call("c2", "b")), ["2 tools", "'a' (id 'c1')", "'b' (id 'c2')"]),
        (reply(call("c1", "lookup", "{oops")), ["'lookup'", "not valid JSON"]),
        (reply(call("c1", "lookup", "[1]")), ["'lookup'", "JSON array, not an object"]),
        (reply(call("c1", " ", "{}")), ["no tool name"]),
        (reply(content="  "), ["neither a tool call nor any text"]),
        (reply(content="The answer", finish="length"), ["cut off", "not taken as your answer"]),
    ],
)
def test_each_refusal_tells_the_model_what_happened(
    the_reply: ModelReply, words: list[str]
) -> None:
    decision = NativeToolCallParser().parse(the_reply).decision
    assert isinstance(decision, InvalidDecision)
    for word in words:
        assert word in decision.explanation


def test_text_without_calls_is_the_final_answer() -> None:
    decision = NativeToolCallParser().parse(reply(content="It is 42.", finish="stop")).decision
    assert decision == FinalAnswer(text="It is 42.")


# --------------------------------------------------------------------------- serialization


def test_replies_and_steps_with_tool_calls_round_trip_exactly() -> None:
    calls = (call("c1", "lookup", '{"q":"é\\u2028"}'), call("c2", "x", "not json"))
    the_reply = reply(*calls, content="", finish="tool_calls")
    result = serialization.decode_model_call_result(_encode_result(the_reply))
    assert result.reply == the_reply
    step = _step(tool_calls=calls)
    assert serialization.decode_step_record(serialization.encode(step)) == step


def _encode_result(the_reply: ModelReply) -> dict[str, object]:
    return serialization.encode(
        ModelCallResult(run_id="r", result_id="m0", reply=the_reply, failure=None)
    )


def test_a_version_1_3_payload_decodes_without_tool_calls() -> None:
    payload = serialization.encode(_step())
    payload["schema_version"] = "1.3"
    del payload["tool_calls"]
    assert serialization.decode_step_record(payload).tool_calls == ()
    encoded = _encode_result(reply(content="hi"))
    encoded["schema_version"] = "1.3"
    nested = encoded["reply"]
    assert isinstance(nested, dict)
    del nested["tool_calls"]
    decoded = serialization.decode_model_call_result(encoded).reply
    assert decoded is not None
    assert decoded.tool_calls == ()


def test_a_malformed_tool_call_is_a_decode_error_naming_its_path() -> None:
    payload = serialization.encode(_step(tool_calls=(call("c1", "t"),)))
    payload["tool_calls"] = [{"id": "c1", "name": "t", "arguments": 3}]
    with pytest.raises(serialization.DecodeError, match=r"tool_calls\[0\]\.arguments"):
        serialization.decode_step_record(payload)


def test_the_schema_version_is_1_4_or_later() -> None:
    # native tool calls arrived in 1.4; later minors keep them
    assert tuple(map(int, serialization.SCHEMA_VERSION.split("."))) >= (1, 4)


# --------------------------------------------------------------------------- history


def _step(
    idx: int = 0, *, tool_calls: Sequence[NativeToolCall] = (), observation: str = "obs"
) -> StepRecord:
    return StepRecord(
        step_idx=idx,
        raw_output="",
        content_chars=0,
        thinking_chars=0,
        action=None if not tool_calls else "a",
        parse_ok=True,
        parse_error=None,
        observation=observation,
        observation_is_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=0,
        call_id=None,
        step_wall_ms=0,
        action_status=None if not tool_calls else ActionStatus.EXECUTED,
        tool_calls=tuple(tool_calls),
    )


def test_each_call_of_a_turn_is_answered_by_a_tool_message_with_its_id() -> None:
    calls = (call("c1", "a", '{"x":1}'), call("c2", "b"))
    messages = history_message_pair(_step(tool_calls=calls, observation="seen"), "<{observation}>")
    assert [m.role for m in messages] == [Role.ASSISTANT, Role.TOOL, Role.TOOL]
    assert messages[0].tool_calls == calls
    assert [m.tool_call_id for m in messages[1:]] == ["c1", "c2"]
    assert [m.content for m in messages[1:]] == [(TextBlock(text="<seen>"),)] * 2


def test_a_step_without_calls_still_contributes_a_user_observation() -> None:
    messages = history_message_pair(_step(), "{observation}")
    assert [m.role for m in messages] == [Role.ASSISTANT, Role.USER]
    assert messages[0].tool_calls == ()


def test_tool_call_names_and_arguments_count_toward_the_prompt_size() -> None:
    messages = history_message_pair(
        _step(tool_calls=(call("id-not-counted", "abc", "12345"),), observation="xy"),
        "{observation}",
    )
    assert prompt_chars(messages) == len("abc") + len("12345") + len("xy")


def test_prefix_stability_holds_with_tool_turns() -> None:
    steps = [
        _step(0, tool_calls=(call("c0", "a"),)),
        _step(1),
        _step(2, tool_calls=(call("c2", "a"), call("c3", "b"))),
    ]
    context = Context(run_level=(Message(role=Role.USER, content=(TextBlock(text="go"),)),))
    for n in range(len(steps)):
        before = assemble(
            context=context, injections={}, steps=steps[:n], observation_template="{observation}"
        )
        after = assemble(
            context=context,
            injections={},
            steps=steps[: n + 1],
            observation_template="{observation}",
        )
        assert after[: len(before)] == before
        assert after[len(before) :] == history_message_pair(steps[n], "{observation}")


# --------------------------------------------------------------------------- the session


class TextParser:
    def parse(self, the_reply: ModelReply) -> Any:
        from polyloop.ports import ParsedReply

        return ParsedReply(history_text=the_reply.content, decision=FinalAnswer(text="x"))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "text"}


def _registry(ledger: list[str]) -> ToolRegistry:
    def handler(name: str) -> Any:
        async def run_it(arguments: Mapping[str, object]) -> str:
            ledger.append(name)
            return f"{name} ok {json.dumps(dict(arguments), sort_keys=True)}"

        return run_it

    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    return ToolRegistry(
        ToolSpec(
            name=name, description=f"the {name} tool", parameters=schema, handler=handler(name)
        )
        for name in ("search", "fetch", "write")
    )


def _definition(model: Any, parser: Any, store: VolatileRunStore) -> AgentDefinition:
    return AgentDefinition(
        model_client=model,
        decision_parser=parser,
        store=store,
        event_sink=NullEventSink(),
        synthetic_observations=TEXTS,
    )


def _request(run_id: str, tools: ToolRegistry) -> RunRequest:
    return RunRequest(
        run_id=run_id,
        budget=BUDGET,
        action_executor=tools.executor(),
        tools=tools,
        context=Context(goal_level=(Message(role=Role.USER, content=(TextBlock(text="go"),)),)),
        model_replay_policy=ReplayPolicy.NEVER,
    )


async def test_a_native_parser_makes_every_call_carry_the_narrowed_registry() -> None:
    ledger: list[str] = []
    tools = _registry(ledger).restrict_to(["search", "write"])
    model = ScriptedModelClient(
        [reply(call("c1", "search", '{"q": "a"}')), reply(content="all done", finish="stop")],
        native_tool_calls=True,
    )
    store = VolatileRunStore()
    result = await run(_definition(model, NativeToolCallParser(), store), _request("n1", tools))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert ledger == ["search"]
    for model_call in model.calls:
        assert [schema["name"] for schema in model_call.tools] == ["search", "write"]
        assert next(dict(s) for s in model_call.tools)["description"] == "the search tool"
    second = model.calls[1].messages
    assert second[-2].tool_calls == (call("c1", "search", '{"q": "a"}'),)
    assert second[-1].role is Role.TOOL
    assert second[-1].tool_call_id == "c1"
    assert second[-1].content == (TextBlock(text='search ok {"q": "a"}'),)
    log = await store.read_log("n1")
    assert log.steps[0].step.tool_calls == (call("c1", "search", '{"q": "a"}'),)


async def test_a_text_parser_sends_no_tool_schemas() -> None:
    model = ScriptedModelClient([reply(content="x")], native_tool_calls=True)
    await run(_definition(model, TextParser(), VolatileRunStore()), _request("t1", _registry([])))
    assert model.calls[0].tools == ()


def test_a_native_parser_with_a_client_that_does_not_claim_native_calls_is_refused() -> None:
    with pytest.raises(TypeError, match="model_client.*native_tool_calls = True"):
        _definition(ScriptedModelClient(["done"]), NativeToolCallParser(), VolatileRunStore())


async def test_several_calls_run_nothing_and_every_call_is_answered() -> None:
    ledger: list[str] = []
    model = ScriptedModelClient(
        [
            reply(call("c1", "search"), call("c2", "fetch")),
            reply(call("c3", "fetch")),
            reply(content="done"),
        ],
        native_tool_calls=True,
    )
    result = await run(
        _definition(model, NativeToolCallParser(), VolatileRunStore()),
        _request("p1", _registry(ledger)),
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert ledger == ["fetch"]
    assert result.steps[0].parse_ok is False
    assert result.steps[0].action is None
    history = model.calls[1].messages
    assert [m.tool_call_id for m in history[-2:]] == ["c1", "c2"]
    assert "none of them was run" in history[-1].content[0].text


async def test_an_unknown_tool_is_a_rejected_action_the_model_hears_about() -> None:
    model = ScriptedModelClient(
        [reply(call("c1", "nope")), reply(content="ok")], native_tool_calls=True
    )
    result = await run(
        _definition(model, NativeToolCallParser(), VolatileRunStore()),
        _request("u1", _registry([])),
    )
    assert result.steps[0].action_status is ActionStatus.NOT_EXECUTED
    answer = model.calls[1].messages[-1]
    assert (answer.role, answer.tool_call_id) == (Role.TOOL, "c1")
    assert answer.content == (TextBlock(text="[rejected]"),)


async def test_resume_rebuilds_the_tool_turns_byte_for_byte(tmp_path: Path) -> None:
    """The prompt a resumed process sends equals, message for message, the one an
    uninterrupted process sent at the same step, tool turns and ids included."""
    script = [
        reply(call("c1", "search", '{"q": "a"}')),
        reply(call("c2", "fetch", '{"q": "b"}'), call("c3", "write")),
        reply(call("c4", "fetch", '{"q": "c"}')),
        reply(content="done"),
    ]
    tools = _registry([])
    first = ScriptedModelClient(script, native_tool_calls=True)
    await run(
        _definition(first, NativeToolCallParser(), JsonlRunStore(directory=tmp_path)),
        _request("rs", tools),
    )
    # Keep the log up to the last step_completed before step 3: a process that died there.
    path = tmp_path / "rs.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    steps = [
        i
        for i, line in enumerate(lines)
        if b'"record": "step_completed"' in line or b'"record":"step_completed"' in line
    ]
    path.write_bytes(b"".join(lines[: steps[2] + 1]))
    second = ScriptedModelClient(script, native_tool_calls=True)
    resumed = await resume(
        _definition(second, NativeToolCallParser(), JsonlRunStore(directory=tmp_path)),
        _request("rs", tools),
    )
    assert resumed.stop_reason is StopReason.FINAL_ANSWER
    assert [c.call_index for c in second.calls] == [3]
    assert second.calls[0].messages == first.calls[3].messages
    assert second.calls[0].tools == first.calls[3].tools
    assert [m.tool_call_id for m in second.calls[0].messages if m.role is Role.TOOL] == [
        "c1",
        "c2",
        "c3",
        "c4",
    ]


# --------------------------------------------------------------------------- the adapter


@dataclass
class Endpoint:
    replies: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, json=self.replies.pop(0))


def completion(message: dict[str, Any], finish_reason: str | None = "tool_calls") -> dict[str, Any]:
    return {
        "id": "chatcmpl-9",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint()


@pytest.fixture
async def http(endpoint: Endpoint) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handle)) as client:
        yield client


SCHEMA = {"name": "search", "description": "d", "parameters": {"type": "object"}}
BASE = "http://gateway.test/v1"


def _call(
    messages: Sequence[Message] = (), tools: Sequence[Mapping[str, object]] = (SCHEMA,)
) -> ModelCall:
    return ModelCall(
        messages=tuple(messages) or (Message(role=Role.USER, content=(TextBlock(text="hi"),)),),
        call_index=0,
        run_id="r",
        result_id="m0",
        binding={},
        tools=tools,
    )


async def test_the_adapter_sends_tools_and_maps_calls_back(
    endpoint: Endpoint, http: httpx.AsyncClient
) -> None:
    endpoint.replies.append(
        completion(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q":"x"}'},
                    }
                ],
            }
        )
    )
    client = GatewayModelClient(client=http, settings=GatewaySettings(base_url=BASE, model="m"))
    got = await client.call(_call())
    assert got == ModelReply(
        call_id="chatcmpl-9",
        content="",
        tool_calls=(call("call_7", "search", '{"q":"x"}'),),
        finish_reason="tool_calls",
    )
    body = endpoint.bodies[0]
    assert body["tools"] == [{"type": "function", "function": SCHEMA}]
    assert body["parallel_tool_calls"] is False
    assert body["tool_choice"] == "auto"  # the default (design 0216)
    assert client.parameters()["tool_choice"] == "auto"  # on record, so a change is drift


async def test_tool_choice_none_sends_nothing_and_records_nothing(
    endpoint: Endpoint, http: httpx.AsyncClient
) -> None:
    """``None`` is the request and the snapshot of 0.1.0's default: such runs resume exactly."""
    endpoint.replies.append(completion({"role": "assistant", "content": "hi"}, "stop"))
    settings = GatewaySettings(base_url=BASE, model="m", tool_choice=None)
    client = GatewayModelClient(client=http, settings=settings)
    await client.call(_call())
    assert "tool_choice" not in endpoint.bodies[0]
    assert "tools" in endpoint.bodies[0]
    assert "tool_choice" not in client.parameters()


async def test_without_tools_no_tool_field_is_sent(
    endpoint: Endpoint, http: httpx.AsyncClient
) -> None:
    endpoint.replies.append(completion({"role": "assistant", "content": "hi"}, "stop"))
    settings = GatewaySettings(base_url=BASE, model="m", tool_choice="required")
    await GatewayModelClient(client=http, settings=settings).call(_call(tools=()))
    assert {"tools", "tool_choice", "parallel_tool_calls"}.isdisjoint(endpoint.bodies[0])


async def test_tool_choice_and_parallel_calls_come_from_the_settings(
    endpoint: Endpoint, http: httpx.AsyncClient
) -> None:
    endpoint.replies.append(completion({"role": "assistant", "content": "hi"}, "stop"))
    settings = GatewaySettings(
        base_url=BASE, model="m", tool_choice="auto", parallel_tool_calls=None
    )
    client = GatewayModelClient(client=http, settings=settings)
    await client.call(_call())
    assert endpoint.bodies[0]["tool_choice"] == "auto"
    assert "parallel_tool_calls" not in endpoint.bodies[0]
    assert client.parameters()["tool_choice"] == "auto"
    assert client.parameters()["parallel_tool_calls"] == "null"


def test_default_tool_settings_add_tool_choice_to_the_model_identity_of_0_1_0(
    http: httpx.AsyncClient,
) -> None:
    """Design 0216: the default sends ``tool_choice: "auto"``, a different request from 0.1.0's
    (which sent none), so it is on record; ``tool_choice=None`` is 0.1.0's identity."""
    client = GatewayModelClient(client=http, settings=GatewaySettings(base_url=BASE, model="m"))
    assert set(client.parameters()) == {"kind", "endpoint", "model", "sampling", "tool_choice"}
    old = GatewaySettings(base_url=BASE, model="m", tool_choice=None)
    client = GatewayModelClient(client=http, settings=old)
    assert set(client.parameters()) == {"kind", "endpoint", "model", "sampling"}


async def test_tool_turns_are_sent_in_the_protocol_form(
    endpoint: Endpoint, http: httpx.AsyncClient
) -> None:
    endpoint.replies.append(completion({"role": "assistant", "content": "ok"}, "stop"))
    messages = [
        Message(role=Role.USER, content=(TextBlock(text="go"),)),
        Message(
            role=Role.ASSISTANT,
            content=(TextBlock(text=""),),
            tool_calls=(call("c1", "search", "{}"),),
        ),
        Message(role=Role.TOOL, content=(TextBlock(text="found"),), tool_call_id="c1"),
    ]
    client = GatewayModelClient(client=http, settings=GatewaySettings(base_url=BASE, model="m"))
    await client.call(_call(messages))
    assert endpoint.bodies[0]["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]


@pytest.mark.parametrize(
    ("tool_calls", "problem"),
    [
        ("x", r"tool_calls is a string, not an array"),
        (
            [{"type": "function", "function": {"name": "a", "arguments": "{}"}}],
            r"\[0\]\.id is null",
        ),
        ([{"id": "c", "function": {"name": "a", "arguments": {}}}], r"arguments is an object"),
        ([{"id": "c", "function": {"arguments": "{}"}}], r"name is null"),
        (
            [
                {"id": "c", "function": {"name": "a", "arguments": "{}"}},
                {"id": "c", "function": {"name": "b", "arguments": "{}"}},
            ],
            r"repeats an earlier call's id",
        ),
    ],
)
async def test_malformed_tool_calls_are_a_response_error(
    endpoint: Endpoint, http: httpx.AsyncClient, tool_calls: object, problem: str
) -> None:
    endpoint.replies.append(
        completion({"role": "assistant", "content": None, "tool_calls": tool_calls})
    )
    client = GatewayModelClient(client=http, settings=GatewaySettings(base_url=BASE, model="m"))
    with pytest.raises(GatewayResponseError, match=problem):
        await client.call(_call())


def test_bad_tool_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="tool_choice 'always'"):
        GatewaySettings(base_url=BASE, model="m", tool_choice="always")
    with pytest.raises(TypeError, match="parallel_tool_calls"):
        GatewaySettings(base_url=BASE, model="m", parallel_tool_calls="no")  # type: ignore[arg-type]


def _sse(*chunks: dict[str, Any]) -> httpx.Response:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content="".join(lines).encode()
    )


def _delta(tool_calls: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s",
        "choices": [{"index": 0, "delta": {"tool_calls": tool_calls}, "finish_reason": finish}],
    }


async def _streamed(response: httpx.Response) -> ModelReply:
    async def handle(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return response

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        settings = GatewaySettings(base_url=BASE, model="m", stream=True)
        return await GatewayModelClient(client=http, settings=settings).call(_call())


async def test_streamed_tool_call_pieces_are_joined_per_index() -> None:
    got = await _streamed(
        _sse(
            _delta([{"index": 0, "id": "c0", "type": "function", "function": {"name": "a"}}]),
            _delta([{"index": 1, "id": "c1", "type": "function", "function": {"name": "b"}}]),
            _delta([{"index": 0, "function": {"arguments": '{"x": '}}]),
            _delta([{"index": 1, "function": {"arguments": "{}"}}]),
            _delta([{"index": 0, "function": {"arguments": "1}"}}], finish="tool_calls"),
        )
    )
    assert got.tool_calls == (call("c0", "a", '{"x": 1}'), call("c1", "b", "{}"))
    assert got.finish_reason == "tool_calls"


async def test_a_streamed_call_without_an_id_is_a_response_error() -> None:
    with pytest.raises(GatewayResponseError, match=r"assembled from the stream.*\[0\]\.id"):
        await _streamed(_sse(_delta([{"index": 0, "function": {"name": "a"}}])))
    with pytest.raises(GatewayResponseError, match=r"function\.arguments is a number"):
        await _streamed(_sse(_delta([{"index": 0, "id": "c", "function": {"arguments": 3}}])))
