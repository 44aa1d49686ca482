"""Opt-in streaming in ``GatewayModelClient`` (design 0203), over a real loopback socket.

The stub answers one script in both modes (a streaming request gets the same scripted reply
as an event stream), so every test here compares the two modes on identical input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest
from _openai_stub import OpenAIStub, StubReply, chat_reply, error_reply, raw_reply

from _shared_doubles import TEXTS
from polyloop.adapters import (
    GatewayHTTPError,
    GatewayModelClient,
    GatewayResponseError,
    GatewaySettings,
    GatewayTimeoutError,
)
from polyloop.ports import Action, ModelCall, ParsedReply
from polyloop.session import AgentDefinition, RunRequest, run
from polyloop.sinks import NullEventSink
from polyloop.stores import JsonlRunStore
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    StopReason,
    TextBlock,
)

pytestmark = pytest.mark.integration

BOUND = 10.0
SAMPLING = {"temperature": 0.0, "max_tokens": 64, "stop": ["\nObservation:"]}

SCRIPT: tuple[StubReply, ...] = (
    chat_reply(
        "x = 6 * 7\nprint(x)",
        call_id="c-1",
        usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
    ),
    chat_reply(
        "Zürich – 21°C ✓",
        call_id="c-2",
        reasoning_content="first think, then answer",
        usage={
            "prompt_tokens": 52,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 30},
        },
        finish_reason="length",
    ),
    chat_reply(None, call_id=None, reasoning="only thoughts", usage=None),
    chat_reply("", call_id="c-4"),
)


def settings_for(stub: OpenAIStub, *, stream: bool) -> GatewaySettings:
    return GatewaySettings(
        base_url=stub.base_url, model="stub-model", sampling=SAMPLING, stream=stream
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(5.0, pool=1.0), limits=httpx.Limits(max_connections=1)
    ) as client:
        yield client


def model_call(index: int = 0) -> ModelCall:
    return ModelCall(
        messages=(Message(role=Role.USER, content=(TextBlock(text="go"),)),),
        call_index=index,
        run_id="stream-run",
        result_id=f"m{index}",
        binding={},
    )


async def replies_in_mode(
    http: httpx.AsyncClient, *, stream: bool
) -> tuple[list[ModelReply], list[dict[str, object]]]:
    async with OpenAIStub(chunk_chars=3) as stub:
        stub.enqueue(*SCRIPT)
        gateway = GatewayModelClient(client=http, settings=settings_for(stub, stream=stream))
        async with asyncio.timeout(BOUND):
            replies = [await gateway.call(model_call(i)) for i in range(len(SCRIPT))]
        bodies = [request.json() for request in stub.requests]
        if stream:
            assert stub.chunks_sent > 4 * len(SCRIPT), "the replies really came in pieces"
    return replies, bodies


async def test_a_streamed_reply_equals_the_non_streamed_reply_of_the_same_script(
    http: httpx.AsyncClient,
) -> None:
    plain, plain_bodies = await replies_in_mode(http, stream=False)
    streamed, streamed_bodies = await replies_in_mode(http, stream=True)
    assert streamed == plain
    assert plain[1].usage is not None
    assert plain[1].usage.cached_tokens == 30
    assert plain[1].thinking == "first think, then answer"
    assert plain[2] == ModelReply(
        call_id=None, content="", thinking="only thoughts", finish_reason="stop"
    )
    # stop and max_tokens pass through in both modes; only the streaming fields differ.
    for plain_body, streamed_body in zip(plain_bodies, streamed_bodies, strict=True):
        assert plain_body["max_tokens"] == streamed_body["max_tokens"] == 64
        assert plain_body["stop"] == streamed_body["stop"] == ["\nObservation:"]
        assert "stream" not in plain_body
        assert streamed_body["stream"] is True
        assert streamed_body["stream_options"] == {"include_usage": True}
        rest = {k: v for k, v in streamed_body.items() if k not in ("stream", "stream_options")}
        assert rest == plain_body


class EveryReplyIsAnAction:
    def parse(self, reply: ModelReply) -> ParsedReply:
        return ParsedReply(history_text=reply.content, decision=Action(text=reply.content))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "every_reply_is_an_action"}


class Echo:
    async def execute(self, action: Action) -> ActionOutcome:
        return ActionOutcome(
            status=ActionStatus.EXECUTED,
            observation=f"saw {len(action.text)} characters",
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "echo"}


# The per-line checksum (design 0162) covers the timings too, so it differs with them.
_TIMING = {"duration_ms", "model_ms", "action_ms", "step_wall_ms", "checksum"}


def _without_timing(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in _TIMING}
    if isinstance(value, list):
        return [_without_timing(item) for item in value]
    return value


async def logged_run(
    http: httpx.AsyncClient, stub: OpenAIStub, directory: Path, *, stream: bool
) -> list[object]:
    stub.enqueue(*SCRIPT)
    agent = AgentDefinition(
        model_client=GatewayModelClient(client=http, settings=settings_for(stub, stream=stream)),
        decision_parser=EveryReplyIsAnAction(),
        store=JsonlRunStore(directory=directory),
        event_sink=NullEventSink(),
        synthetic_observations=TEXTS,
    )
    request = RunRequest(
        run_id="same-script",
        budget=Budget(
            max_steps=len(SCRIPT),
            max_actions=10,
            max_consecutive_parse_failures=3,
            max_prompt_chars=10_000,
        ),
        action_executor=Echo(),
        context=Context(goal_level=(Message(role=Role.USER, content=(TextBlock(text="go"),)),)),
        model_replay_policy=ReplayPolicy.SAFE,
    )
    async with asyncio.timeout(BOUND):
        result = await run(agent, request)
    assert result.stop_reason is StopReason.STEP_BUDGET
    lines = (directory / "same-script.jsonl").read_text(encoding="utf-8").splitlines()
    return [_without_timing(json.loads(line)) for line in lines]


async def test_a_streamed_run_records_the_same_log_as_a_non_streamed_run(
    http: httpx.AsyncClient, tmp_path: Path
) -> None:
    async with OpenAIStub(chunk_chars=2) as stub:
        plain = await logged_run(http, stub, tmp_path / "plain", stream=False)
        streamed = await logged_run(http, stub, tmp_path / "streamed", stream=True)
    assert streamed == plain
    assert any(
        isinstance(record, dict) and record.get("record") == "model_call_result" for record in plain
    )
    # The snapshot (part of the log) is the same too: streaming is not model identity.
    assert plain[0] == streamed[0]


async def test_cancelling_a_streaming_call_closes_the_stream_and_the_server_stops(
    http: httpx.AsyncClient,
) -> None:
    long_reply = chat_reply("token " * 200)
    async with OpenAIStub(chunk_delay=0.02, chunk_chars=6) as stub:
        stub.enqueue(long_reply, chat_reply("after the cancel"))
        gateway = GatewayModelClient(client=http, settings=settings_for(stub, stream=True))
        async with asyncio.timeout(BOUND):
            task = asyncio.create_task(gateway.call(model_call()))
            await stub.wait_for_chunks(5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await stub.wait_for_streams_cut(1)
            sent_at_cut = stub.chunks_sent
            # max_connections=1: a leaked connection would make this call time out in the pool.
            reply = await gateway.call(model_call(1))
    assert reply.content == "after the cancel"
    assert stub.streams_cut == 1
    assert sent_at_cut < 50, "the server stopped long before the 200-token reply was done"


async def test_a_read_timeout_mid_stream_closes_the_stream(http: httpx.AsyncClient) -> None:
    async with OpenAIStub(chunk_delay=1.0, chunk_chars=6) as stub:
        stub.enqueue(chat_reply("slow " * 50), chat_reply("next"))
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=0.2)) as client:
            gateway = GatewayModelClient(client=client, settings=settings_for(stub, stream=True))
            async with asyncio.timeout(BOUND):
                with pytest.raises(GatewayTimeoutError) as excinfo:
                    await gateway.call(model_call())
                await stub.wait_for_streams_cut(1)
    message = str(excinfo.value)
    assert "timed out after 0.2 s" in message
    assert "(model 'stub-model')" in message
    assert stub.streams_cut == 1


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'data: {"choices": [{"delta": {"content": "cut"}}]}\n\n', "without 'data: [DONE]'"),
        (b'data: {"error": {"message": "overloaded"}}\n\ndata: [DONE]\n\n', "error object"),
        (b"data: not json\n\n", "not JSON"),
        (b'data: {"choices": {}}\n\ndata: [DONE]\n\n', "'choices' is an object"),
    ],
)
async def test_a_malformed_stream_raises_a_response_error(
    http: httpx.AsyncClient, body: bytes, problem: str
) -> None:
    async with OpenAIStub() as stub:
        stub.enqueue(raw_reply(body, content_type="text/event-stream"))
        gateway = GatewayModelClient(client=http, settings=settings_for(stub, stream=True))
        async with asyncio.timeout(BOUND):
            with pytest.raises(GatewayResponseError) as excinfo:
                await gateway.call(model_call())
        url = f"{stub.base_url}/chat/completions"
    assert problem in str(excinfo.value)
    assert f"POST {url} (model 'stub-model')" in str(excinfo.value)


async def test_an_error_status_in_streaming_mode_is_the_usual_http_error(
    http: httpx.AsyncClient,
) -> None:
    async with OpenAIStub() as stub:
        stub.enqueue(error_reply(503, body="busy"))
        gateway = GatewayModelClient(client=http, settings=settings_for(stub, stream=True))
        async with asyncio.timeout(BOUND):
            with pytest.raises(GatewayHTTPError) as excinfo:
                await gateway.call(model_call())
    assert excinfo.value.status_code == 503


async def test_streaming_is_not_part_of_the_model_identity(http: httpx.AsyncClient) -> None:
    base = GatewaySettings(base_url="http://127.0.0.1:1/v1", model="m", sampling=SAMPLING)
    streamed = dataclasses.replace(base, stream=True)
    assert (
        GatewayModelClient(client=http, settings=base).parameters()
        == GatewayModelClient(client=http, settings=streamed).parameters()
    )
    with pytest.raises(TypeError, match=r"GatewaySettings\.stream must be a bool"):
        GatewaySettings(base_url="http://127.0.0.1:1/v1", model="m", stream="yes")  # type: ignore[arg-type]
