"""``polyloop.adapters``: settings, identity, request translation, forwarding, reply mapping.

Everything here runs against ``httpx.MockTransport``; the same behaviour over a real socket
(timeouts, dropped connections, cancellation and the connection pool) is in
``tests/integration/test_gateway_loopback.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyloop.adapters import (
    REQUEST_SHAPE_FIELDS,
    RESERVED_HEADERS,
    SAMPLING_FIELDS,
    GatewayConnectError,
    GatewayContextLengthError,
    GatewayHTTPError,
    GatewayModelClient,
    GatewayResponseError,
    GatewaySettings,
    GatewayTimeoutError,
    GatewayTransportError,
)
from polyloop.errors import ContextLengthExceededError, PolyloopError
from polyloop.ports import ModelCall, ModelClient
from polyloop.types import Message, ModelReply, Role, TextBlock, Usage

pytestmark = pytest.mark.unit

BASE_URL = "http://gateway.test/v1"
SETTINGS = GatewaySettings(
    base_url=BASE_URL, model="test-model", sampling={"temperature": 0.0, "seed": 7}
)

# The fields issue 7 names explicitly; pinned here so that shrinking the constants fails.
NAMED_REFUSALS = (
    "messages",
    "model",
    "stream",
    "tools",
    "tool_choice",
    "response_format",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "min_p",
    "repetition_penalty",
)
ALL_REFUSALS = sorted(set(NAMED_REFUSALS) | REQUEST_SHAPE_FIELDS | SAMPLING_FIELDS)


def completion(
    content: object = "hello",
    *,
    call_id: object = "chatcmpl-1",
    **message_fields: object,
) -> dict[str, Any]:
    return {
        "id": call_id,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message_fields},
                "finish_reason": "stop",
            }
        ],
    }


Reply = httpx.Response | Exception | Callable[[httpx.Request], Any]


@dataclass
class Endpoint:
    """A scripted MockTransport handler: one queued reply per request, then a default."""

    replies: list[Reply] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.replies.pop(0) if self.replies else httpx.Response(200, json=completion())
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):
            return reply
        result = reply(request)
        if inspect.isawaitable(result):
            result = await result
        assert isinstance(result, httpx.Response)
        return result

    def body(self, index: int = -1) -> dict[str, Any]:
        loaded = json.loads(self.requests[index].content)
        assert isinstance(loaded, dict)
        return loaded


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint()


@pytest.fixture
async def http(endpoint: Endpoint) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handle)) as client:
        yield client


@pytest.fixture
def gateway(http: httpx.AsyncClient) -> GatewayModelClient:
    return GatewayModelClient(client=http, settings=SETTINGS)


def user(*texts: str) -> Message:
    return Message(role=Role.USER, content=tuple(TextBlock(text=t) for t in texts))


def model_call(
    binding: Mapping[str, str] | None = None,
    messages: tuple[Any, ...] | None = None,
    *,
    idempotency_key: str | None = None,
) -> ModelCall:
    return ModelCall(
        messages=(user("hi"),) if messages is None else messages,
        call_index=0,
        run_id="run-1",
        result_id="m0",
        binding={} if binding is None else binding,
        idempotency_key=idempotency_key,
    )


def base_body(messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "model": "test-model",
        "messages": [{"role": "user", "content": "hi"}] if messages is None else messages,
        "seed": 7,
        "temperature": 0.0,
    }


# --------------------------------------------------------------------------- settings


def test_settings_keep_an_api_root_without_trailing_slashes() -> None:
    assert GatewaySettings(base_url="http://h:8000/v1/", model="m").base_url == "http://h:8000/v1"
    assert GatewaySettings(base_url="https://h/v1", model="m").base_url == "https://h/v1"


@pytest.mark.parametrize(
    ("base_url", "error", "fragment"),
    [
        ("", ValueError, "non-empty URL"),
        ("   ", ValueError, "non-empty URL"),
        (" http://h/v1", ValueError, "whitespace"),
        ("127.0.0.1:8000/v1", ValueError, "'http://' or 'https://'"),
        ("ftp://h/v1", ValueError, "'http://' or 'https://'"),
        ("http:///v1", ValueError, "no host"),
        ("http://h:99999/v1", ValueError, "not a valid URL"),
        ("http://user:secret@h/v1", ValueError, "httpx.AsyncClient"),
        ("http://h/v1?api_key=secret", ValueError, "query string"),
        ("http://h/v1#top", ValueError, "query string or a fragment"),
        ("http://h/v1/chat/completions", ValueError, "API root 'http://h/v1'"),
        (None, TypeError, "must be a str"),
    ],
)
def test_settings_refuse_a_bad_base_url_and_say_what_to_pass(
    base_url: Any, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=r"GatewaySettings\.base_url") as excinfo:
        GatewaySettings(base_url=base_url, model="m")
    assert fragment in str(excinfo.value)
    if base_url and "secret" in base_url:
        assert "secret" not in str(excinfo.value), "the error must not echo a credential"


@pytest.mark.parametrize(
    ("model", "error"), [("", ValueError), ("  ", ValueError), (" m", ValueError), (3, TypeError)]
)
def test_settings_refuse_a_bad_model(model: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"GatewaySettings\.model"):
        GatewaySettings(base_url=BASE_URL, model=model)


@pytest.mark.parametrize("name", sorted(SAMPLING_FIELDS))
def test_settings_accept_every_allowlisted_sampling_field(name: str) -> None:
    assert dict(GatewaySettings(base_url=BASE_URL, model="m", sampling={name: 1}).sampling) == {
        name: 1
    }


@pytest.mark.parametrize(
    ("sampling", "error", "fragment"),
    [
        ({"user": "u"}, ValueError, "'gateway.<field>'"),
        ({"stream": True}, ValueError, "not a sampling field"),
        ({1: 0.5}, TypeError, "keys must be str"),
        ({"temperature": float("nan")}, ValueError, "finite"),
        ({"temperature": float("inf")}, ValueError, "finite"),
        ({"stop": {"a", "b"}}, TypeError, "JSON value"),
        ({"seed": object()}, TypeError, "JSON value"),
        ({"logit_bias": {50256: -100}}, TypeError, "keys must be str"),
        ({"stop": ["ok", b"bytes"]}, TypeError, "sampling['stop'][1]"),
        ([("temperature", 0.0)], TypeError, "must be a mapping"),
    ],
)
def test_settings_refuse_bad_sampling_and_name_the_entry(
    sampling: Any, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=r"GatewaySettings\.sampling") as excinfo:
        GatewaySettings(base_url=BASE_URL, model="m", sampling=sampling)
    assert fragment in str(excinfo.value)


def test_settings_are_deep_frozen_copies() -> None:
    stop = ["</answer>"]
    bias = {"50256": -100}
    sampling: dict[str, Any] = {"stop": stop, "logit_bias": bias}
    frozen = GatewaySettings(base_url=BASE_URL, model="m", sampling=sampling)
    stop.append("later")
    bias["1"] = 5
    sampling["temperature"] = 1.0
    assert frozen.sampling == {"logit_bias": {"50256": -100}, "stop": ("</answer>",)}
    with pytest.raises(TypeError):
        frozen.sampling["temperature"] = 1.0  # type: ignore[index]
    nested = frozen.sampling["logit_bias"]
    assert isinstance(nested, Mapping)
    with pytest.raises(TypeError):
        nested["2"] = 1  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.model = "other"  # type: ignore[misc]


def test_settings_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        GatewaySettings(BASE_URL, "m")  # type: ignore[call-arg]


def test_settings_with_the_same_sampling_in_another_order_are_equal() -> None:
    first = GatewaySettings(base_url=BASE_URL, model="m", sampling={"seed": 1, "top_p": 0.9})
    second = GatewaySettings(base_url=BASE_URL, model="m", sampling={"top_p": 0.9, "seed": 1})
    assert first == second
    assert list(second.sampling) == ["seed", "top_p"]


# --------------------------------------------------------------------------- construction


async def test_the_adapter_satisfies_the_model_client_protocol(
    gateway: GatewayModelClient,
) -> None:
    assert isinstance(gateway, ModelClient)
    assert gateway.settings is SETTINGS


async def test_the_adapter_needs_an_async_httpx_client_and_gateway_settings(
    http: httpx.AsyncClient,
) -> None:
    with pytest.raises(TypeError, match=r"httpx\.AsyncClient"):
        GatewayModelClient(client=object(), settings=SETTINGS)  # type: ignore[arg-type]
    with httpx.Client() as sync_client, pytest.raises(TypeError, match="cannot be awaited"):
        GatewayModelClient(client=sync_client, settings=SETTINGS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GatewaySettings"):
        GatewayModelClient(client=http, settings={"base_url": BASE_URL})  # type: ignore[arg-type]


async def test_call_has_no_retry_timeout_or_rate_limit_parameters(
    gateway: GatewayModelClient,
) -> None:
    forbidden = {"retries", "max_retries", "backoff", "timeout", "rate_limit"}
    assert set(inspect.signature(gateway.call).parameters).isdisjoint(forbidden)
    assert set(inspect.signature(GatewayModelClient).parameters) == {"client", "settings"}


# --------------------------------------------------------------------------- parameters


async def test_parameters_report_the_model_identity(gateway: GatewayModelClient) -> None:
    assert dict(gateway.parameters()) == {
        "kind": "openai_chat",
        "endpoint": BASE_URL,
        "model": "test-model",
        "sampling": '{"seed":7,"temperature":0.0}',
        "tool_choice": "auto",  # the default, sent with tools, so on record (design 0216)
    }
    with pytest.raises(TypeError):
        gateway.parameters()["model"] = "other"  # type: ignore[index]


async def test_parameters_with_no_sampling_say_so(http: httpx.AsyncClient) -> None:
    plain = GatewayModelClient(client=http, settings=GatewaySettings(base_url=BASE_URL, model="m"))
    assert plain.parameters()["sampling"] == "{}"


@pytest.mark.parametrize(
    "changed",
    [
        {"model": "other-model"},
        {"base_url": "http://gateway.test/v2"},
        {"sampling": {"temperature": 1.0, "seed": 7}},
        {"sampling": {"temperature": 0.0}},
        {"sampling": {"temperature": 0, "seed": 7}},
    ],
)
async def test_changing_the_model_endpoint_or_any_sampling_value_changes_parameters(
    http: httpx.AsyncClient, gateway: GatewayModelClient, changed: dict[str, Any]
) -> None:
    other = GatewayModelClient(client=http, settings=dataclasses.replace(SETTINGS, **changed))
    assert other.parameters() != gateway.parameters()


async def test_parameters_never_contain_the_client_credentials(endpoint: Endpoint) -> None:
    secret = "sk-test-0123456789"
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(endpoint.handle),
        headers={"Authorization": f"Bearer {secret}", "X-Api-Key": secret},
        auth=("user", secret),
    ) as client:
        adapter = GatewayModelClient(client=client, settings=SETTINGS)
        await adapter.call(model_call())
    assert endpoint.requests[0].headers["x-api-key"] == secret, "the client's headers are sent"
    reported = adapter.parameters()
    assert set(reported) == {"kind", "endpoint", "model", "sampling", "tool_choice"}
    assert not any(secret in key or secret in value for key, value in reported.items())
    assert not any("authorization" in value.lower() for value in reported.values())


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sampling=st.dictionaries(st.sampled_from(sorted(SAMPLING_FIELDS)), json_values))
async def test_reported_sampling_is_the_canonical_json_of_the_settings(
    sampling: dict[str, Any],
) -> None:
    reordered = dict(reversed(list(sampling.items())))
    async with httpx.AsyncClient() as client:
        adapter = GatewayModelClient(
            client=client, settings=GatewaySettings(base_url=BASE_URL, model="m", sampling=sampling)
        )
        twin = GatewayModelClient(
            client=client,
            settings=GatewaySettings(base_url=BASE_URL, model="m", sampling=reordered),
        )
    reported = adapter.parameters()["sampling"]
    assert json.loads(reported) == sampling
    assert reported == json.dumps(
        sampling, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert twin.parameters() == adapter.parameters()


# --------------------------------------------------------------------------- request


async def test_a_call_is_one_post_to_chat_completions_with_model_messages_and_sampling(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    await gateway.call(model_call())
    assert len(endpoint.requests) == 1
    request = endpoint.requests[0]
    assert request.method == "POST"
    assert str(request.url) == f"{BASE_URL}/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert endpoint.body() == base_body()


async def test_roles_and_order_are_kept_and_blocks_are_joined_without_a_separator(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    messages = (
        Message(role=Role.SYSTEM, content=(TextBlock(text="be brief"),)),
        user("first line\n", "second ", "part"),
        Message(role=Role.ASSISTANT, content=()),
        user(""),
    )
    await gateway.call(model_call(messages=messages))
    assert endpoint.body()["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first line\nsecond part"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": ""},
    ]


@dataclass(frozen=True)
class ImageBlock:
    url: str


async def test_an_unsupported_block_raises_before_anything_is_sent(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    message = user("look at this")
    object.__setattr__(message, "content", (TextBlock(text="a"), ImageBlock(url="x.png")))
    with pytest.raises(
        TypeError, match=r"messages\[1\]\.content\[1\] is ImageBlock, not TextBlock"
    ):
        await gateway.call(model_call(messages=(user("fine"), message)))
    assert endpoint.requests == []


async def test_something_that_is_not_a_message_raises_before_anything_is_sent(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    with pytest.raises(TypeError, match=r"messages\[0\] must be a polyloop\.types\.Message"):
        await gateway.call(model_call(messages=({"role": "user", "content": "hi"},)))
    with pytest.raises(TypeError, match="ModelCall"):
        await gateway.call({"messages": []})  # type: ignore[arg-type]
    assert endpoint.requests == []


# --------------------------------------------------------------------------- forwarding


async def test_prefixed_binding_keys_become_body_fields_and_plain_keys_stay_home(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    binding = {
        "book": "b7",
        "task": "t3",
        "gateway.user": "tenant-7",
        "gateway.prompt_cache_key": "acme:v1:tenant:x7",
    }
    await gateway.call(model_call(binding=binding))
    assert endpoint.body() == {
        **base_body(),
        "user": "tenant-7",
        "prompt_cache_key": "acme:v1:tenant:x7",
    }


@pytest.mark.parametrize("key", ["book", "gateway", "gatewayuser", "Gateway.user", "x.gateway.y"])
async def test_a_key_without_the_exact_prefix_is_neither_sent_nor_refused(
    gateway: GatewayModelClient, endpoint: Endpoint, key: str
) -> None:
    await gateway.call(model_call(binding={key: "v"}))
    assert endpoint.body() == base_body()


async def test_nothing_after_the_prefix_is_parsed_and_values_are_sent_verbatim(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    binding = {"gateway.metadata.trace": "  spaced value ", "gateway.safety_identifier": "a=b"}
    await gateway.call(model_call(binding=binding))
    assert endpoint.body() == {
        **base_body(),
        "metadata.trace": "  spaced value ",
        "safety_identifier": "a=b",
    }


@pytest.mark.parametrize("field_name", ALL_REFUSALS)
async def test_a_field_the_adapter_owns_is_refused_before_anything_is_sent(
    gateway: GatewayModelClient, endpoint: Endpoint, field_name: str
) -> None:
    key = f"gateway.{field_name}"
    with pytest.raises(ValueError, match=re.escape(f"{key!r}")) as excinfo:
        await gateway.call(model_call(binding={"book": "b7", key: "v"}))
    assert "remove the key" in str(excinfo.value)
    assert endpoint.requests == []


@pytest.mark.parametrize(
    ("field_name", "fix"),
    [
        ("temperature", "GatewaySettings.sampling"),
        ("model", "GatewaySettings.model"),
        ("messages", "context and history"),
        ("stream", "shape of the request or the reply"),
    ],
)
async def test_a_refusal_says_where_the_value_belongs(
    gateway: GatewayModelClient, field_name: str, fix: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(fix)):
        await gateway.call(model_call(binding={f"gateway.{field_name}": "1"}))


@pytest.mark.parametrize("value", ["", " ", "\t", "\n \t"])
async def test_a_blank_forwarded_value_is_refused_before_anything_is_sent(
    gateway: GatewayModelClient, endpoint: Endpoint, value: str
) -> None:
    with pytest.raises(ValueError, match=re.escape("'gateway.prompt_cache_key'")) as excinfo:
        await gateway.call(model_call(binding={"gateway.prompt_cache_key": value}))
    assert "blank value" in str(excinfo.value)
    assert endpoint.requests == []


async def test_a_blank_plain_coordinate_is_not_the_adapters_business(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    await gateway.call(model_call(binding={"book": ""}))
    assert endpoint.body() == base_body()


async def test_the_bare_prefix_is_refused_before_anything_is_sent(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    with pytest.raises(ValueError, match=re.escape("'gateway.' has nothing after")):
        await gateway.call(model_call(binding={"gateway.": "v"}))
    assert endpoint.requests == []


async def test_with_several_bad_keys_the_first_in_sorted_order_is_reported(
    gateway: GatewayModelClient,
) -> None:
    bad = {"gateway.user": " ", "gateway.seed": "1", "gateway.model": "x", "gateway.zz": ""}
    messages = set()
    for binding in (bad, dict(reversed(list(bad.items())))):
        with pytest.raises(ValueError) as excinfo:
            await gateway.call(model_call(binding=binding))
        messages.add(str(excinfo.value))
    assert len(messages) == 1
    assert "'gateway.model'" in messages.pop()


field_names = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz_.-0123456789"), min_size=1, max_size=12
).filter(lambda name: name not in REQUEST_SHAPE_FIELDS and name not in SAMPLING_FIELDS)
plain_keys = st.text(max_size=12).filter(lambda key: not key.startswith("gateway."))
values = st.text(max_size=12).filter(lambda value: value.strip() != "")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    forwarded=st.dictionaries(field_names, values, max_size=4),
    coordinates=st.dictionaries(plain_keys, st.text(max_size=8), max_size=4),
)
async def test_exactly_the_prefixed_keys_are_sent_with_the_prefix_stripped(
    forwarded: dict[str, str], coordinates: dict[str, str]
) -> None:
    endpoint = Endpoint()
    binding = {**coordinates, **{f"gateway.{name}": value for name, value in forwarded.items()}}
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handle)) as client:
        await GatewayModelClient(client=client, settings=SETTINGS).call(model_call(binding))
    assert endpoint.body() == {**base_body(), **forwarded}


# --------------------------------------------------------------------------- reply mapping


async def test_a_reply_maps_id_content_and_reasoning(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    endpoint.replies.append(
        httpx.Response(
            200, json=completion("answer", call_id="chatcmpl-42", reasoning_content="because")
        )
    )
    reply = await gateway.call(model_call())
    assert reply == ModelReply(
        call_id="chatcmpl-42", content="answer", thinking="because", finish_reason="stop"
    )


@pytest.mark.parametrize("body_id", ["", None, "missing"])
async def test_an_empty_or_absent_id_becomes_no_call_id(
    gateway: GatewayModelClient, endpoint: Endpoint, body_id: str | None
) -> None:
    payload = completion("x", call_id=body_id)
    if body_id == "missing":
        del payload["id"]
    endpoint.replies.append(httpx.Response(200, json=payload))
    assert (await gateway.call(model_call())).call_id is None


async def test_null_content_is_an_empty_answer_not_a_failure(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    endpoint.replies.append(httpx.Response(200, json=completion(None, reasoning_content="hmm")))
    assert await gateway.call(model_call()) == ModelReply(
        call_id="chatcmpl-1", content="", thinking="hmm", finish_reason="stop"
    )


@pytest.mark.parametrize(
    ("fields", "thinking"),
    [
        ({}, ""),
        ({"reasoning_content": "rc"}, "rc"),
        ({"reasoning": "r"}, "r"),
        ({"reasoning_content": "rc", "reasoning": "r"}, "rc"),
        ({"reasoning_content": "", "reasoning": "r"}, "r"),
        ({"reasoning_content": None, "reasoning": "r"}, "r"),
        ({"reasoning_content": None, "reasoning": None}, ""),
    ],
)
async def test_thinking_comes_from_reasoning_content_or_reasoning(
    gateway: GatewayModelClient,
    endpoint: Endpoint,
    fields: dict[str, str | None],
    thinking: str,
) -> None:
    endpoint.replies.append(httpx.Response(200, json=completion("c", **fields)))
    assert (await gateway.call(model_call())).thinking == thinking


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"<html>Bad Gateway</html>", "the body is not JSON"),
        (b"", "the body is not JSON"),
        (b"[]", "the body is an array, not an object"),
        (b'{"error": {"message": "quota exceeded"}}', "'choices' is missing"),
        (b'{"choices": {}}', "'choices' is an object, not an array"),
        (b'{"choices": []}', "'choices' is an empty array"),
        (b'{"choices": [1]}', "choices[0] is a number, not an object"),
        (b'{"choices": [{"text": "legacy"}]}', "choices[0].message is missing"),
        (b'{"choices": [{"message": "hi"}]}', "choices[0].message is a string, not an object"),
        (b'{"choices": [{"message": {"role": "assistant"}}]}', "content is missing"),
        (
            b'{"choices": [{"message": {"content": [{"type": "text", "text": "hi"}]}}]}',
            "choices[0].message.content is an array, not a string or null",
        ),
        (
            b'{"choices": [{"message": {"content": "x", "reasoning_content": 3}}]}',
            "choices[0].message.reasoning_content is a number, not a string",
        ),
        (
            b'{"id": 12, "choices": [{"message": {"content": "x"}}]}',
            "'id' is a number, not a string",
        ),
    ],
)
async def test_a_body_that_is_not_a_chat_completion_names_what_is_wrong(
    gateway: GatewayModelClient, endpoint: Endpoint, body: bytes, problem: str
) -> None:
    endpoint.replies.append(httpx.Response(200, content=body))
    with pytest.raises(GatewayResponseError) as excinfo:
        await gateway.call(model_call())
    assert isinstance(excinfo.value, ValueError)
    assert problem in excinfo.value.problem
    assert problem in str(excinfo.value)
    assert excinfo.value.body_excerpt == body.decode()


async def test_the_excerpt_of_a_long_malformed_body_is_bounded(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    endpoint.replies.append(httpx.Response(200, content=b"x" * 5000))
    with pytest.raises(GatewayResponseError) as excinfo:
        await gateway.call(model_call())
    assert excinfo.value.body_excerpt == "x" * 500
    assert excinfo.value.body_truncated
    assert len(str(excinfo.value)) < 1000


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("status", [400, 401, 404, 422, 429, 500, 502, 503])
async def test_an_error_status_raises_with_the_status_and_the_body(
    gateway: GatewayModelClient, endpoint: Endpoint, status: int
) -> None:
    body = '{"error": {"message": "model \'test-model\' is not loaded"}}'
    endpoint.replies.append(httpx.Response(status, text=body))
    with pytest.raises(GatewayHTTPError) as excinfo:
        await gateway.call(model_call())
    error = excinfo.value
    assert isinstance(error, httpx.HTTPStatusError)
    assert error.status_code == status
    assert error.response.status_code == status
    assert error.body_excerpt == body
    assert not error.body_truncated
    assert f"HTTP {status}" in str(error)
    assert "is not loaded" in str(error)
    assert f"{BASE_URL}/chat/completions" in str(error)


async def test_an_error_message_leaves_out_query_parameters_the_client_adds(
    endpoint: Endpoint,
) -> None:
    endpoint.replies.append(httpx.Response(401, text="bad key"))
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(endpoint.handle), params={"api-key": "sk-query-secret"}
    ) as client:
        with pytest.raises(GatewayHTTPError) as excinfo:
            await GatewayModelClient(client=client, settings=SETTINGS).call(model_call())
    assert endpoint.requests[0].url.params["api-key"] == "sk-query-secret"
    assert "sk-query-secret" not in str(excinfo.value)


async def test_a_redirect_is_an_error_too(gateway: GatewayModelClient, endpoint: Endpoint) -> None:
    endpoint.replies.append(httpx.Response(307, headers={"Location": "http://elsewhere/v1"}))
    with pytest.raises(GatewayHTTPError) as excinfo:
        await gateway.call(model_call())
    assert excinfo.value.status_code == 307


async def test_the_excerpt_of_a_long_error_body_is_bounded(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    body = "é" * 300 + "z" * 100_000
    endpoint.replies.append(httpx.Response(500, text=body))
    with pytest.raises(GatewayHTTPError) as excinfo:
        await gateway.call(model_call())
    assert excinfo.value.body_excerpt == body[:500]
    assert excinfo.value.body_truncated
    assert "first 500 characters" in str(excinfo.value)
    assert len(str(excinfo.value)) < 1000


async def test_an_error_body_is_not_read_beyond_the_excerpt(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    async def endless_body() -> AsyncIterator[bytes]:
        yield b"E" * 1000
        await asyncio.Event().wait()  # the rest of the body never arrives
        yield b"unreachable"

    endpoint.replies.append(httpx.Response(502, content=endless_body()))
    async with asyncio.timeout(5):
        with pytest.raises(GatewayHTTPError) as excinfo:
            await gateway.call(model_call())
    assert excinfo.value.body_excerpt == "E" * 500


@pytest.mark.parametrize(
    ("error", "expected", "cause"),
    [
        (httpx.ConnectError("connection refused"), GatewayConnectError, "connection refused"),
        (httpx.ConnectError(""), GatewayConnectError, "could not connect (ConnectError)"),
        (httpx.ReadTimeout("timed out"), GatewayTimeoutError, "timed out after"),
        (httpx.ConnectTimeout(""), GatewayTimeoutError, "timed out after"),
        (httpx.PoolTimeout(""), GatewayTimeoutError, "free connection"),
        (httpx.WriteTimeout(""), GatewayTimeoutError, "sending the request"),
        (
            httpx.RemoteProtocolError("peer closed connection"),
            GatewayTransportError,
            "peer closed connection",
        ),
        (httpx.ReadError(""), GatewayTransportError, "mid-request (ReadError)"),
    ],
)
async def test_transport_errors_name_the_url_the_model_the_cause_and_a_fix(
    gateway: GatewayModelClient,
    endpoint: Endpoint,
    error: httpx.TransportError,
    expected: type[httpx.TransportError],
    cause: str,
) -> None:
    endpoint.replies.append(error)
    with pytest.raises(expected) as excinfo:
        await gateway.call(model_call())
    raised = excinfo.value
    message = str(raised)
    # Still the httpx family a caller may already catch.
    family = httpx.TimeoutException if isinstance(error, httpx.TimeoutException) else type(error)
    if expected is GatewayTransportError:
        family = httpx.TransportError
    assert isinstance(raised, family)
    assert isinstance(raised, PolyloopError)
    assert raised.__cause__ is error
    assert f"POST {BASE_URL}/chat/completions" in message
    assert f"(model {SETTINGS.model!r})" in message
    assert cause in message
    assert "; try: " in message


async def test_a_timeout_says_how_many_seconds_the_client_allowed(endpoint: Endpoint) -> None:
    endpoint.replies.append(httpx.ReadTimeout(""))
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(endpoint.handle), timeout=httpx.Timeout(2.5, connect=1.0)
    ) as client:
        with pytest.raises(GatewayTimeoutError) as excinfo:
            await GatewayModelClient(client=client, settings=SETTINGS).call(model_call())
    assert excinfo.value.phase == "read"
    assert excinfo.value.seconds == 2.5
    assert "timed out after 2.5 s waiting for the reply" in str(excinfo.value)
    assert "stream=True" in str(excinfo.value)


@pytest.mark.parametrize(
    ("status", "fix"),
    [
        (401, "credentials"),
        (404, "base_url"),
        (429, "concurrency"),
        (500, "check its log"),
        (307, "redirects"),
        (418, "explanation"),
    ],
)
async def test_an_http_error_names_the_model_and_what_to_try(
    gateway: GatewayModelClient, endpoint: Endpoint, status: int, fix: str
) -> None:
    endpoint.replies.append(httpx.Response(status, text="nope"))
    with pytest.raises(GatewayHTTPError) as excinfo:
        await gateway.call(model_call())
    message = str(excinfo.value)
    assert f"POST {BASE_URL}/chat/completions (model {SETTINGS.model!r})" in message
    assert f"HTTP {status}" in message
    assert "'nope'" in message
    assert fix in message.split("; try: ", 1)[1]
    assert excinfo.value.model == SETTINGS.model


async def test_a_response_error_names_the_url_the_model_and_what_to_try(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    endpoint.replies.append(httpx.Response(200, text="<html>login</html>"))
    with pytest.raises(GatewayResponseError) as excinfo:
        await gateway.call(model_call())
    message = str(excinfo.value)
    assert f"POST {BASE_URL}/chat/completions (model {SETTINGS.model!r})" in message
    assert "not JSON" in message
    assert "<html>login</html>" in message
    assert "; try: " in message


async def test_a_context_length_error_says_what_to_try(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    endpoint.replies.append(httpx.Response(400, text="maximum context length is 8192 tokens"))
    with pytest.raises(GatewayContextLengthError) as excinfo:
        await gateway.call(model_call())
    message = str(excinfo.value)
    assert f"(model {SETTINGS.model!r})" in message
    assert "8192" in message
    assert "max_prompt_tokens" in message


async def test_the_same_instance_keeps_working_after_a_failed_call(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    endpoint.replies += [
        httpx.Response(503, text="overloaded"),
        httpx.ConnectError("refused"),
        httpx.Response(200, content=b"not json"),
        httpx.Response(200, json=completion("recovered")),
    ]
    for expected in (GatewayHTTPError, GatewayConnectError, GatewayResponseError):
        with pytest.raises(expected):
            await gateway.call(model_call())
    assert (await gateway.call(model_call())).content == "recovered"


async def test_cancelling_a_call_propagates_and_the_client_stays_usable(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    arrived = asyncio.Event()

    async def never_answers(_request: httpx.Request) -> httpx.Response:
        arrived.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    endpoint.replies.append(never_answers)
    async with asyncio.timeout(5):
        task = asyncio.create_task(gateway.call(model_call()))
        await arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await gateway.call(model_call())).content == "hello"
    assert len(endpoint.requests) == 2


@pytest.mark.parametrize(
    "url",
    [
        " http://u:SECRET@h/v1",
        "http://u:SECRET@h:abc/v1",
        "ftp://u:SECRET@h/v1",
        "http://u:SECRET@h/v1/chat/completions",
        "http://h/v1?key=SECRET",
    ],
)
def test_a_refused_base_url_never_echoes_its_credentials(url: str) -> None:
    with pytest.raises(ValueError, match="base_url") as caught:
        GatewaySettings(base_url=url, model="m")
    assert "SECRET" not in str(caught.value)


# --------------------------------------------------------------------------- usage (design 0200)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (
            {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            Usage(prompt_tokens=12, completion_tokens=3),
        ),
        (
            {
                "prompt_tokens": 12,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
            Usage(prompt_tokens=12, completion_tokens=3, cached_tokens=8),
        ),
        (
            {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": None},
            Usage(prompt_tokens=12, completion_tokens=3),
        ),
        (None, None),
        ("12", None),
        ({"prompt_tokens": 12}, None),
        ({"prompt_tokens": -1, "completion_tokens": 3}, None),
        ({"prompt_tokens": True, "completion_tokens": 3}, None),
    ],
)
async def test_reported_usage_is_mapped_and_a_malformed_one_ignored(
    gateway: GatewayModelClient, endpoint: Endpoint, usage: object, expected: Usage | None
) -> None:
    body = completion("hi")
    if usage is not None:
        body["usage"] = usage
    endpoint.replies.append(httpx.Response(200, json=body))
    reply = await gateway.call(model_call())
    assert reply.usage == expected
    assert reply.content == "hi"


@pytest.mark.parametrize(
    ("value", "expected"), [("length", "length"), (None, None), ("", None), (3, None)]
)
async def test_the_finish_reason_is_recorded_when_it_is_a_string(
    gateway: GatewayModelClient, endpoint: Endpoint, value: object, expected: str | None
) -> None:
    body = completion("hi")
    body["choices"][0]["finish_reason"] = value
    endpoint.replies.append(httpx.Response(200, json=body))
    assert (await gateway.call(model_call())).finish_reason == expected


@pytest.mark.parametrize(
    "body",
    [
        '{"error": {"message": "This model\'s maximum context length is 8192 tokens. However, '
        'you requested 9000 tokens"}}',
        '{"error": {"code": 400, "message": "the request exceeds the available context size"}}',
        '{"detail": "Requested tokens (9000) exceed context window of 8192"}',
        "prompt is too long: n_ctx 8192",
    ],
)
async def test_a_400_that_names_the_context_length_is_its_own_error(
    gateway: GatewayModelClient, endpoint: Endpoint, body: str
) -> None:
    endpoint.replies.append(httpx.Response(400, text=body))
    with pytest.raises(GatewayContextLengthError) as excinfo:
        await gateway.call(model_call())
    assert isinstance(excinfo.value, ContextLengthExceededError)
    assert isinstance(excinfo.value, GatewayHTTPError)
    assert excinfo.value.status_code == 400


@pytest.mark.parametrize("status", [413, 500])
async def test_other_statuses_naming_the_context_stay_plain_http_errors(
    gateway: GatewayModelClient, endpoint: Endpoint, status: int
) -> None:
    endpoint.replies.append(httpx.Response(status, text="maximum context length exceeded"))
    with pytest.raises(GatewayHTTPError) as excinfo:
        await gateway.call(model_call())
    assert not isinstance(excinfo.value, ContextLengthExceededError)


# --------------------------------------------------------------------------- idempotency header

KEY = "polyloop:r:run-1:m0"
KEYED = dataclasses.replace(SETTINGS, idempotency_key_header="Idempotency-Key")


def test_the_idempotency_key_header_is_off_by_default_and_kept_as_given() -> None:
    assert SETTINGS.idempotency_key_header is None
    assert KEYED.idempotency_key_header == "Idempotency-Key"
    odd = GatewaySettings(base_url=BASE_URL, model="m", idempotency_key_header="x-request_id.v2")
    assert odd.idempotency_key_header == "x-request_id.v2"


@pytest.mark.parametrize(
    ("header", "error", "fragment"),
    [
        ("", ValueError, "not an HTTP header name"),
        ("Idempotency Key", ValueError, "not an HTTP header name"),
        ("Idempotency-Key:", ValueError, "not an HTTP header name"),
        (" Idempotency-Key", ValueError, "not an HTTP header name"),
        ("Idempotency-Key\r\nX-Injected: 1", ValueError, "not an HTTP header name"),
        ("Idempotenz-Schl\u00fcssel", ValueError, "not an HTTP header name"),
        ("Authorization", ValueError, "already use"),
        ("authorization", ValueError, "already use"),
        ("Content-Type", ValueError, "already use"),
        ("ACCEPT", ValueError, "already use"),
        ("Content-Length", ValueError, "already use"),
        ("Host", ValueError, "already use"),
        ("Cookie", ValueError, "already use"),
        (b"Idempotency-Key", TypeError, "must be a header name"),
        (True, TypeError, "must be a header name"),
    ],
)
def test_settings_refuse_a_bad_idempotency_key_header_and_say_what_to_pass(
    header: Any, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as excinfo:
        GatewaySettings(base_url=BASE_URL, model="m", idempotency_key_header=header)
    message = str(excinfo.value)
    assert isinstance(excinfo.value, PolyloopError)
    assert "GatewaySettings.idempotency_key_header" in message
    assert fragment in message
    assert "'Idempotency-Key'" in message, "the error names a name that works"
    assert "None to send no key" in message


async def test_no_header_the_adapter_or_httpx_sets_may_carry_the_key(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    await gateway.call(model_call())
    sent = {name.lower() for name in endpoint.requests[0].headers}
    assert sent <= RESERVED_HEADERS, f"headers sent but not reserved: {sent - RESERVED_HEADERS}"
    assert {"authorization", "content-type", "accept"} <= RESERVED_HEADERS
    for name in sorted(sent | RESERVED_HEADERS):
        with pytest.raises(ValueError, match="already use"):
            GatewaySettings(base_url=BASE_URL, model="m", idempotency_key_header=name.title())


async def test_the_key_is_sent_in_the_configured_header_and_nothing_else_changes(
    http: httpx.AsyncClient, endpoint: Endpoint
) -> None:
    keyed = GatewayModelClient(client=http, settings=KEYED)
    await keyed.call(model_call(idempotency_key=KEY))
    await GatewayModelClient(client=http, settings=SETTINGS).call(model_call(idempotency_key=KEY))
    with_header, without = endpoint.requests
    assert with_header.headers.get_list("Idempotency-Key") == [KEY]
    assert endpoint.body(0) == endpoint.body(1) == base_body(), "the key is never in the body"
    assert {k: v for k, v in with_header.headers.items() if k != "idempotency-key"} == dict(
        without.headers.items()
    )


async def test_by_default_a_call_with_a_key_sends_no_key_header(
    gateway: GatewayModelClient, endpoint: Endpoint
) -> None:
    await gateway.call(model_call(idempotency_key=KEY))
    request = endpoint.requests[0]
    assert "idempotency-key" not in request.headers
    assert not any(KEY in value for value in request.headers.values())
    assert KEY.encode() not in request.content


async def test_a_call_without_a_key_sends_no_header_even_when_configured(
    http: httpx.AsyncClient, endpoint: Endpoint
) -> None:
    keyed = GatewayModelClient(client=http, settings=KEYED)
    await keyed.call(model_call())
    await GatewayModelClient(client=http, settings=SETTINGS).call(model_call())
    configured, default = endpoint.requests
    assert "idempotency-key" not in configured.headers
    assert dict(configured.headers.items()) == dict(default.headers.items())


async def test_each_call_sends_its_own_key_and_a_replay_the_same_one(
    http: httpx.AsyncClient, endpoint: Endpoint
) -> None:
    keyed = GatewayModelClient(client=http, settings=KEYED)
    for key in ("polyloop:r:run-1:m0", "polyloop:r:run-1:m1", "polyloop:r:run-1:m0"):
        await keyed.call(model_call(idempotency_key=key))
    assert [r.headers["idempotency-key"] for r in endpoint.requests] == [
        "polyloop:r:run-1:m0",
        "polyloop:r:run-1:m1",
        "polyloop:r:run-1:m0",
    ]


async def test_the_key_replaces_a_header_of_the_same_name_on_the_client(
    endpoint: Endpoint,
) -> None:
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(endpoint.handle), headers={"idempotency-key": "static"}
    ) as client:
        keyed = GatewayModelClient(client=client, settings=KEYED)
        await keyed.call(model_call(idempotency_key=KEY))
        await keyed.call(model_call())
    assert endpoint.requests[0].headers.get_list("Idempotency-Key") == [KEY]
    assert endpoint.requests[1].headers.get_list("Idempotency-Key") == ["static"], (
        "without a key of its own, the call leaves the client's headers alone"
    )


async def test_the_key_is_sent_in_the_header_name_the_settings_give(
    http: httpx.AsyncClient, endpoint: Endpoint
) -> None:
    settings = dataclasses.replace(SETTINGS, idempotency_key_header="X-Request-Key")
    await GatewayModelClient(client=http, settings=settings).call(model_call(idempotency_key=KEY))
    request = endpoint.requests[0]
    assert request.headers["x-request-key"] == KEY
    assert "idempotency-key" not in request.headers


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.from_regex(r"[A-Za-z0-9._:-]{1,255}", fullmatch=True))
async def test_any_well_formed_key_is_sent_verbatim(key: str) -> None:
    endpoint = Endpoint()
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handle)) as client:
        await GatewayModelClient(client=client, settings=KEYED).call(
            model_call(idempotency_key=key)
        )
    [request] = endpoint.requests
    assert request.headers.get_list("Idempotency-Key") == [key]
    assert (b"Idempotency-Key", key.encode("ascii")) in request.headers.raw


async def test_the_idempotency_key_header_is_not_part_of_the_model_identity(
    http: httpx.AsyncClient, gateway: GatewayModelClient
) -> None:
    keyed = GatewayModelClient(client=http, settings=KEYED)
    assert keyed.parameters() == gateway.parameters()
    assert not any(
        "idempotency" in k.lower() or "idempotency" in v.lower()
        for k, v in keyed.parameters().items()
    )
