"""``GatewayModelClient`` over a real socket, against the loopback stub in ``_openai_stub``.

What a mock transport cannot show: real timeouts, a connection dropped mid-body, a server
that hangs up, and what cancellation does to the connection pool. Each test is bounded by
``asyncio.timeout`` and the stub is shut down (every connection closed) in teardown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import re
import warnings
from collections.abc import AsyncIterator

import httpx
import pytest
from _openai_stub import (
    OpenAIStub,
    chat_reply,
    dropped_reply,
    error_reply,
    hangup_reply,
    raw_reply,
)

from polyloop.adapters import (
    GatewayConnectError,
    GatewayHTTPError,
    GatewayModelClient,
    GatewayResponseError,
    GatewaySettings,
    GatewayTimeoutError,
    GatewayTransportError,
)
from polyloop.ports import ModelCall
from polyloop.types import Message, ModelReply, Role, TextBlock, Usage

pytestmark = pytest.mark.integration

BOUND = 10.0  # seconds any one test may take


@pytest.fixture
async def stub() -> AsyncIterator[OpenAIStub]:
    async with OpenAIStub() as server:
        yield server


def settings_for(stub: OpenAIStub) -> GatewaySettings:
    return GatewaySettings(
        base_url=stub.base_url, model="stub-model", sampling={"temperature": 0.2, "seed": 3}
    )


def http_client(*, read_timeout: float = 5.0) -> httpx.AsyncClient:
    # One connection and a short pool timeout: a request that leaked its connection would
    # make the next request fail with httpx.PoolTimeout instead of succeeding.
    return httpx.AsyncClient(
        headers={"Authorization": "Bearer sk-loopback-secret"},
        timeout=httpx.Timeout(5.0, read=read_timeout, pool=1.0),
        limits=httpx.Limits(max_connections=1),
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with http_client() as client:
        yield client


@pytest.fixture
def gateway(stub: OpenAIStub, http: httpx.AsyncClient) -> GatewayModelClient:
    return GatewayModelClient(client=http, settings=settings_for(stub))


def assert_names_where_and_what(error: BaseException, stub: OpenAIStub, cause: str) -> None:
    """The message names the URL, the model, the cause and a fix, and no credential."""
    message = str(error)
    assert message, "an adapter error never has an empty message"
    assert f"POST {stub.base_url}/chat/completions (model 'stub-model')" in message
    assert cause in message
    assert "; try: " in message
    assert "sk-loopback-secret" not in message


def model_call(
    text: str = "ping",
    binding: dict[str, str] | None = None,
    *,
    idempotency_key: str | None = None,
) -> ModelCall:
    return ModelCall(
        messages=(
            Message(role=Role.SYSTEM, content=(TextBlock(text="You answer briefly."),)),
            Message(role=Role.USER, content=(TextBlock(text=text), TextBlock(text="!"))),
        ),
        call_index=0,
        run_id="run-1",
        result_id="m0",
        binding=binding or {},
        idempotency_key=idempotency_key,
    )


async def test_a_call_round_trips_over_http(stub: OpenAIStub, gateway: GatewayModelClient) -> None:
    stub.enqueue(chat_reply("pong", call_id="chatcmpl-42", reasoning_content="easy"))
    async with asyncio.timeout(BOUND):
        reply = await gateway.call(model_call(binding={"book": "b7", "gateway.user": "u-1"}))
    assert reply == ModelReply(
        call_id="chatcmpl-42",
        content="pong",
        thinking="easy",
        usage=Usage(prompt_tokens=1, completion_tokens=1),
        finish_reason="stop",
    )
    [request] = stub.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer sk-loopback-secret"
    assert request.json() == {
        "model": "stub-model",
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "ping!"},
        ],
        "seed": 3,
        "temperature": 0.2,
        "user": "u-1",
    }
    assert "sk-loopback-secret" not in str(dict(gateway.parameters()))


async def test_a_slow_reply_within_the_client_timeout_succeeds(
    stub: OpenAIStub, gateway: GatewayModelClient
) -> None:
    stub.latency = 0.3
    stub.enqueue(chat_reply("late but fine"))
    async with asyncio.timeout(BOUND):
        reply = await gateway.call(model_call())
    assert reply.content == "late but fine"


async def test_a_reply_slower_than_the_read_timeout_raises_the_transport_timeout(
    stub: OpenAIStub,
) -> None:
    stub.enqueue(chat_reply("too late", delay=30.0), chat_reply("next"))
    async with http_client(read_timeout=0.3) as client, asyncio.timeout(BOUND):
        gateway = GatewayModelClient(client=client, settings=settings_for(stub))
        with pytest.raises(GatewayTimeoutError) as excinfo:
            await gateway.call(model_call())
        assert isinstance(excinfo.value, httpx.TimeoutException)
        assert isinstance(excinfo.value.__cause__, httpx.ReadTimeout)
        assert_names_where_and_what(excinfo.value, stub, "timed out after 0.3 s")
        await stub.wait_for_abandoned(1)
        assert (await gateway.call(model_call())).content == "next"


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 502, 503])
async def test_an_error_status_raises_with_status_and_excerpt_and_the_client_recovers(
    stub: OpenAIStub, gateway: GatewayModelClient, status: int
) -> None:
    body = f'{{"error": {{"message": "injected failure {status}"}}}}'
    stub.enqueue(error_reply(status, body), chat_reply("recovered"))
    async with asyncio.timeout(BOUND):
        with pytest.raises(GatewayHTTPError) as excinfo:
            await gateway.call(model_call())
        assert excinfo.value.status_code == status
        assert excinfo.value.body_excerpt == body
        assert_names_where_and_what(excinfo.value, stub, f"injected failure {status}")
        assert (await gateway.call(model_call())).content == "recovered"


async def test_a_huge_error_body_gives_a_bounded_excerpt_and_the_client_recovers(
    stub: OpenAIStub, gateway: GatewayModelClient
) -> None:
    stub.enqueue(
        error_reply(500, b"E" * 5_000_000, content_type="text/plain"), chat_reply("recovered")
    )
    async with asyncio.timeout(BOUND):
        with pytest.raises(GatewayHTTPError) as excinfo:
            await gateway.call(model_call())
        assert excinfo.value.body_excerpt == "E" * 500
        assert excinfo.value.body_truncated
        assert (await gateway.call(model_call())).content == "recovered"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"choices": [{"message": {"content": "cut', "not JSON"),
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b'{"object": "chat.completion"}', "'choices' is missing"),
        (b'{"choices": [{"finish_reason": "stop"}]}', "choices[0].message is missing"),
    ],
)
async def test_a_malformed_body_raises_a_response_error_and_the_client_recovers(
    stub: OpenAIStub, gateway: GatewayModelClient, body: bytes, problem: str
) -> None:
    stub.enqueue(raw_reply(body), chat_reply("recovered"))
    async with asyncio.timeout(BOUND):
        with pytest.raises(GatewayResponseError, match=re.escape(problem)) as excinfo:
            await gateway.call(model_call())
        assert_names_where_and_what(excinfo.value, stub, problem)
        assert (await gateway.call(model_call())).content == "recovered"


async def test_a_connection_dropped_mid_body_raises_a_transport_error(
    stub: OpenAIStub, gateway: GatewayModelClient
) -> None:
    stub.enqueue(dropped_reply(), chat_reply("recovered"))
    async with asyncio.timeout(BOUND):
        with pytest.raises(GatewayTransportError) as excinfo:
            await gateway.call(model_call())
        assert isinstance(excinfo.value, httpx.TransportError)
        assert isinstance(excinfo.value.__cause__, httpx.RemoteProtocolError)
        assert_names_where_and_what(excinfo.value, stub, "connection failed mid-request")
        assert (await gateway.call(model_call())).content == "recovered"


async def test_a_server_that_hangs_up_without_answering_raises_a_transport_error(
    stub: OpenAIStub, gateway: GatewayModelClient
) -> None:
    stub.enqueue(hangup_reply(), chat_reply("recovered"))
    async with asyncio.timeout(BOUND):
        with pytest.raises(GatewayTransportError) as excinfo:
            await gateway.call(model_call())
        assert_names_where_and_what(excinfo.value, stub, "RemoteProtocolError")
        assert (await gateway.call(model_call())).content == "recovered"


async def test_a_refused_connection_raises_connect_error() -> None:
    async with OpenAIStub() as gone:
        settings = settings_for(gone)  # the port is free again once the stub has stopped
    async with http_client() as client, asyncio.timeout(BOUND):
        with pytest.raises(GatewayConnectError) as excinfo:
            await GatewayModelClient(client=client, settings=settings).call(model_call())
    assert isinstance(excinfo.value, httpx.ConnectError)
    message = str(excinfo.value)
    assert f"POST {settings.base_url}/chat/completions (model 'stub-model')" in message
    assert "could not connect" in message
    assert "server is running" in message
    assert "sk-loopback-secret" not in message


async def test_cancelling_mid_request_releases_the_connection_and_the_client_stays_usable(
    stub: OpenAIStub, gateway: GatewayModelClient
) -> None:
    stub.enqueue(chat_reply("never delivered", delay=30.0), chat_reply("after the cancel"))
    async with asyncio.timeout(BOUND):
        task = asyncio.create_task(gateway.call(model_call()))
        await stub.wait_for_requests(1)
        assert task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The stub sees the cancelled request's connection close: nothing is left checked out.
        await stub.wait_for_abandoned(1)
        # With max_connections=1 and a 1 s pool timeout, a leaked connection would make this
        # call fail with httpx.PoolTimeout.
        reply = await gateway.call(model_call())
    assert reply.content == "after the cancel"
    assert len(stub.requests) == 2


async def test_a_client_closed_after_a_cancelled_call_leaves_no_unclosed_resource(
    stub: OpenAIStub,
) -> None:
    stub.enqueue(chat_reply("never delivered", delay=30.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with asyncio.timeout(BOUND):
            async with http_client() as client:
                gateway = GatewayModelClient(client=client, settings=settings_for(stub))
                task = asyncio.create_task(gateway.call(model_call()))
                await stub.wait_for_requests(1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await stub.wait_for_abandoned(1)
        del client, gateway, task
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_concurrent_calls_on_one_client_each_get_their_reply(stub: OpenAIStub) -> None:
    stub.default = chat_reply("shared", delay=0.2)
    async with (
        httpx.AsyncClient(limits=httpx.Limits(max_connections=4)) as client,
        asyncio.timeout(BOUND),
    ):
        gateway = GatewayModelClient(client=client, settings=settings_for(stub))
        replies = await asyncio.gather(*(gateway.call(model_call(str(i))) for i in range(4)))
    assert [reply.content for reply in replies] == ["shared"] * 4
    assert sorted(r.json()["messages"][1]["content"] for r in stub.requests) == [
        "0!",
        "1!",
        "2!",
        "3!",
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
async def test_the_idempotency_key_travels_in_the_configured_header_over_http(
    stub: OpenAIStub, http: httpx.AsyncClient, stream: bool
) -> None:
    key = "polyloop:h:" + "0123456789abcdef" * 2 + ":m0." + "k" * 200
    keyed = dataclasses.replace(
        settings_for(stub), stream=stream, idempotency_key_header="Idempotency-Key"
    )
    stub.enqueue(chat_reply("first"), chat_reply("again"), chat_reply("unkeyed"))
    async with asyncio.timeout(BOUND):
        gateway = GatewayModelClient(client=http, settings=keyed)
        assert (await gateway.call(model_call(idempotency_key=key))).content == "first"
        assert (await gateway.call(model_call(idempotency_key=key))).content == "again"
        plain = GatewayModelClient(client=http, settings=settings_for(stub))
        assert (await plain.call(model_call(idempotency_key=key))).content == "unkeyed"
    first, replay, unkeyed = stub.requests
    assert first.headers["idempotency-key"] == replay.headers["idempotency-key"] == key
    assert first.headers["authorization"] == "Bearer sk-loopback-secret"
    assert first.json().get("stream", False) is stream
    assert "idempotency-key" not in unkeyed.headers
    assert key.encode() not in unkeyed.body
