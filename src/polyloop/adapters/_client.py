"""``GatewayModelClient``: one ``ModelCall`` as one ``POST {base_url}/chat/completions``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, cast

import httpx

from polyloop._common import thawed
from polyloop.adapters._errors import (
    EXCERPT_LIMIT,
    GatewayContextLengthError,
    GatewayHTTPError,
    GatewayResponseError,
    excerpt_of,
    names_context_length,
    translated_transport_error,
)
from polyloop.adapters._forwarding import forwarded_binding
from polyloop.adapters._settings import GatewaySettings
from polyloop.errors import PolyloopTypeError
from polyloop.ports import ModelCall
from polyloop.types import Message, ModelReply, NativeToolCall, Role, TextBlock, Usage

__all__ = ["GatewayModelClient"]

PARAMETERS_KIND = "openai_chat"


class GatewayModelClient:
    """A ``polyloop.ports.ModelClient`` for any OpenAI-compatible Chat Completions endpoint.

    The caller builds and owns the ``httpx.AsyncClient``: authentication (an ``Authorization``
    header or ``auth=``), timeouts, connection limits, proxies and TLS are configured there,
    and the caller closes it. The adapter never builds a client and never retries: a failed
    call raises, the run stops with ``StopReason.LLM_ERROR``, and retries, backoff, rate
    limits and fallbacks belong to a gateway in front of the model (a LiteLLM proxy, for
    example). Pass the ``GatewaySettings`` the endpoint really serves: ``parameters()`` is
    computed from them alone, because the client does not reveal its configuration.

    Each call posts ``{"model", "messages", **settings.sampling, **forwarded binding}`` to
    ``{settings.base_url}/chat/completions`` as one request, non-streaming unless
    ``settings.stream`` is set (then the reply is assembled from the event stream and recorded
    exactly as the non-streaming reply would be). With ``settings.idempotency_key_header`` set,
    the request also carries ``call.idempotency_key`` in that header (nothing when either is
    ``None``; off by default), so a gateway that deduplicates by key answers a replayed call
    with the reply it already gave (design 0207). The model binding
    forwards keys with the reserved ``gateway.`` prefix as top-level body fields::

        model_binding={"book": "b7", "gateway.user": "tenant-7"}  # sends "user": "tenant-7"

    Unprefixed keys are the project's coordinates and are not sent. Which fields may not be
    forwarded is documented on ``call``.

    Cancelling ``call`` propagates ``asyncio.CancelledError``; the in-flight response is closed
    on the way out, so the connection goes back to (or is dropped from) the client's pool and
    the client stays usable. With streaming, closing a half-read stream drops its connection,
    which tells the server to stop generating; a non-streaming request cannot be stopped that
    way (the server finishes the reply nobody reads). The adapter satisfies ``ModelClient``
    structurally; it does not inherit from the Protocol.
    """

    __slots__ = ("_client", "_parameters", "_sampling", "_settings", "_tool_fields", "_url")

    native_tool_calls: ClassVar[bool] = True
    """Sends ``ModelCall.tools`` as ``tools`` and maps ``message.tool_calls`` back (design 0100)."""

    def __init__(self, *, client: httpx.AsyncClient, settings: GatewaySettings) -> None:
        if not isinstance(client, httpx.AsyncClient):
            raise PolyloopTypeError(
                "GatewayModelClient(client=...) must be an httpx.AsyncClient, got "
                f"{type(client).__name__} (a synchronous httpx.Client cannot be awaited)"
            )
        if not isinstance(settings, GatewaySettings):
            raise PolyloopTypeError(
                "GatewayModelClient(settings=...) must be a polyloop.adapters.GatewaySettings, "
                f"got {type(settings).__name__}"
            )
        self._client = client
        self._settings = settings
        self._url = f"{settings.base_url}/chat/completions"
        # Plain JSON data, built once: the snapshot's text and every request body use it.
        self._sampling = cast("dict[str, object]", thawed(settings.sampling))
        parameters = {
            "kind": PARAMETERS_KIND,
            "endpoint": settings.base_url,
            "model": settings.model,
            "sampling": json.dumps(
                self._sampling,
                sort_keys=True,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            ),
        }
        # Sent with calls that carry tools. tool_choice is reported whenever it is sent (the
        # default "auto" included: design 0216), parallel_tool_calls only when not the default
        # False, so runs started before that setting existed resume without drift (0100).
        self._tool_fields: dict[str, object] = {}
        if settings.tool_choice is not None:
            self._tool_fields["tool_choice"] = settings.tool_choice
            parameters["tool_choice"] = settings.tool_choice
        if settings.parallel_tool_calls is not None:
            self._tool_fields["parallel_tool_calls"] = settings.parallel_tool_calls
        if settings.parallel_tool_calls is not False:
            parameters["parallel_tool_calls"] = json.dumps(settings.parallel_tool_calls)
        self._parameters: Mapping[str, str] = MappingProxyType(parameters)

    @property
    def max_output_tokens(self) -> int | None:
        """The most tokens one reply can have: the sampling's ``max_completion_tokens``, else
        its ``max_tokens``; ``None`` when neither is set. A cost budget prices this many
        completion tokens before each call (``Budget.max_cost``, design 0236)."""
        for name in ("max_completion_tokens", "max_tokens"):
            value = self._sampling.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
        return None

    @property
    def settings(self) -> GatewaySettings:
        """The settings this client was built with."""
        return self._settings

    def parameters(self) -> Mapping[str, str]:
        """The model identity: ``kind``, ``endpoint``, ``model`` and ``sampling``.

        ``endpoint`` is the normalised ``base_url``; ``sampling`` is the sampling mapping as
        canonical JSON (sorted keys, no spaces), ``"{}"`` when empty. ``tool_choice`` is
        added unless it is ``None`` (so the default ``"auto"`` is on record; design 0216),
        ``parallel_tool_calls`` (``"true"`` or ``"null"``) when it is not the default
        ``False``. ``stream`` and ``idempotency_key_header`` are not reported: they do not
        change what the model answers (designs 0203, 0207). Changing the
        model, the endpoint or any sampling value changes these values, so ``resume`` refuses
        to continue a run on a different model. Nothing comes from the HTTP client: its headers,
        API key, timeouts and proxies are never reported.
        """
        return self._parameters

    async def call(self, call: ModelCall) -> ModelReply:
        """Send one Chat Completions request and translate the reply.

        Before anything is sent: every message becomes ``{"role", "content"}`` with the role's
        value (``"system"``, ``"user"``, ``"assistant"``, ``"tool"``) and the texts of its
        blocks joined with no separator (``TypeError`` for anything that is not a
        ``TextBlock``); an assistant turn with tool calls also gets ``"tool_calls"`` (each
        ``{"id", "type": "function", "function": {"name", "arguments"}}``), its ``"content"``
        staying the text (``""`` when empty, never ``null``); a tool message gets
        ``"tool_call_id"``. When
        ``call.tools`` is non-empty the body gets ``"tools"`` (each schema as
        ``{"type": "function", "function": schema}``) and, from the settings,
        ``"tool_choice"`` and ``"parallel_tool_calls"``. Then the binding is checked and
        forwarded. A ``gateway.<field>`` key raises ``ValueError``
        when ``<field>`` is empty, is a request-shape field (``messages``, ``model``,
        ``stream``, ``tools``, ``tool_choice``, ``response_format``, ``n``, ...) or a sampling
        field (``SAMPLING_FIELDS``), or when its value is blank. Finally, when
        ``settings.idempotency_key_header`` is set and ``call.idempotency_key`` is not ``None``,
        the key goes in that header, verbatim; it replaces a header of the same name that the
        ``httpx.AsyncClient`` carries.

        The reply maps to ``ModelReply``: ``id`` to ``call_id`` (missing, null or ``""`` gives
        ``None``); ``choices[0].message.content`` to ``content`` (``null`` gives ``""``;
        a missing key is an error); the first non-empty string of
        ``choices[0].message.reasoning_content`` and ``choices[0].message.reasoning`` to
        ``thinking`` (``""`` when neither is); ``usage`` to ``usage`` (see ``usage_from``);
        ``choices[0].finish_reason`` to ``finish_reason`` (a missing or non-string value gives
        ``None``); ``choices[0].message.tool_calls`` (missing or ``null``: none) to
        ``tool_calls``, each with its ``id``, ``function.name`` and the ``function.arguments``
        string verbatim.

        Raises ``GatewayHTTPError`` for a non-2xx status (its subclass
        ``GatewayContextLengthError`` for an HTTP 400 whose body says the prompt exceeds the
        model's context), ``GatewayResponseError`` for a 2xx body (or event stream) that is not
        a Chat Completions reply, and, for an ``httpx.TransportError``,
        ``GatewayTimeoutError`` (an ``httpx.TimeoutException``), ``GatewayConnectError`` (an
        ``httpx.ConnectError``) or ``GatewayTransportError`` (an ``httpx.TransportError``),
        with the original as ``__cause__``. Every message names the URL, the model, the cause
        and what to try (design 0202).
        """
        if not isinstance(call, ModelCall):
            raise PolyloopTypeError(
                f"call must be a polyloop.ports.ModelCall, got {type(call).__name__}"
            )
        messages = [_chat_message(index, message) for index, message in enumerate(call.messages)]
        body: dict[str, object] = {"model": self._settings.model, "messages": messages}
        if call.tools:
            body["tools"] = [
                {"type": "function", "function": thawed(schema)} for schema in call.tools
            ]
            body.update(self._tool_fields)
        body.update(self._sampling)
        body.update(forwarded_binding(call.binding))
        if self._settings.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        headers: dict[str, str] = {}
        header = self._settings.idempotency_key_header
        if header is not None and call.idempotency_key is not None:
            # Per request, so it wins over a header of the same name on the client (design 0207).
            headers[header] = call.idempotency_key
        request = self._client.build_request("POST", self._url, json=body, headers=headers)
        try:
            # The response is closed on every way out of this block (a cancellation and a
            # timeout included); a streamed reply closed early also closes its connection,
            # which is how the server learns to stop generating.
            async with contextlib.aclosing(_Exchange(self._client, request)) as exchange:
                response = await exchange.open()
                if not response.is_success:
                    excerpt, truncated = await _body_excerpt(response)
                    error_class = (
                        GatewayContextLengthError
                        if names_context_length(response.status_code, excerpt)
                        else GatewayHTTPError
                    )
                    raise error_class(
                        url=self._url,
                        model=self._settings.model,
                        request=request,
                        response=response,
                        body_excerpt=excerpt,
                        body_truncated=truncated,
                    )
                if self._settings.stream:
                    return await _reply_from_stream(self._url, self._settings.model, response)
                raw = await response.aread()
        except httpx.TransportError as exc:
            raise translated_transport_error(
                exc, url=self._url, model=self._settings.model, request=request
            ) from exc
        return _reply_from_body(self._url, self._settings.model, raw, response)


class _Exchange:
    """One request and its response, closed by ``aclose`` whatever happened in between."""

    def __init__(self, client: httpx.AsyncClient, request: httpx.Request) -> None:
        self._client = client
        self._request = request
        self._response: httpx.Response | None = None

    async def open(self) -> httpx.Response:
        self._response = await self._client.send(self._request, stream=True)
        return self._response

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()


def _chat_message(index: int, message: object) -> dict[str, object]:
    if not isinstance(message, Message):
        raise PolyloopTypeError(
            f"ModelCall.messages[{index}] must be a polyloop.types.Message, "
            f"got {type(message).__name__}"
        )
    if not isinstance(message.role, Role):
        raise PolyloopTypeError(
            f"ModelCall.messages[{index}].role must be a polyloop.types.Role, got {message.role!r}"
        )
    texts: list[str] = []
    for block_index, block in enumerate(message.content):
        if not isinstance(block, TextBlock):
            raise PolyloopTypeError(
                f"ModelCall.messages[{index}].content[{block_index}] is "
                f"{type(block).__name__}, not TextBlock; GatewayModelClient sends text only"
            )
        texts.append(block.text)
    text = "".join(texts)
    if message.tool_calls:
        return {
            "role": message.role.value,
            # The text as history holds it, "" included: OpenAI, vLLM and llama.cpp accept "",
            # while llama-cpp-python's server refuses null (design 0100).
            "content": text,
            "tool_calls": [
                {
                    "id": tool_call.id,
                    "type": "function",
                    "function": {"name": tool_call.name, "arguments": tool_call.arguments},
                }
                for tool_call in message.tool_calls
            ],
        }
    if message.role is Role.TOOL:
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": text}
    return {"role": message.role.value, "content": text}


async def _body_excerpt(response: httpx.Response) -> tuple[str, bool]:
    """Read just enough of an error body for the excerpt; the rest is never downloaded."""
    chunks: list[str] = []
    size = 0
    texts = response.aiter_text()
    try:
        async for chunk in texts:
            chunks.append(chunk)
            size += len(chunk)
            if size > EXCERPT_LIMIT:
                break
    finally:
        if isinstance(texts, AsyncGenerator):
            await texts.aclose()
    return excerpt_of("".join(chunks))


def _reply_from_body(url: str, model: str, raw: bytes, response: httpx.Response) -> ModelReply:
    def fail(problem: str) -> GatewayResponseError:
        excerpt, truncated = excerpt_of(response.text)
        return GatewayResponseError(
            url=url, model=model, problem=problem, body_excerpt=excerpt, body_truncated=truncated
        )

    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise fail(f"the body is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise fail(f"the body is {_json_kind(data)}, not an object")
    if "choices" not in data:
        raise fail("'choices' is missing")
    choices = data["choices"]
    if not isinstance(choices, list):
        raise fail(f"'choices' is {_json_kind(choices)}, not an array")
    if not choices:
        raise fail("'choices' is an empty array")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise fail(f"choices[0] is {_json_kind(choice)}, not an object")
    if "message" not in choice:
        raise fail("choices[0].message is missing")
    message = choice["message"]
    if not isinstance(message, dict):
        raise fail(f"choices[0].message is {_json_kind(message)}, not an object")
    if "content" not in message and not message.get("tool_calls"):
        raise fail("choices[0].message.content is missing (and there are no tool_calls)")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise fail(f"choices[0].message.content is {_json_kind(content)}, not a string or null")
    thinking = ""
    for name in ("reasoning_content", "reasoning"):
        candidate = message.get(name)
        if candidate is not None and not isinstance(candidate, str):
            raise fail(f"choices[0].message.{name} is {_json_kind(candidate)}, not a string")
        if candidate and not thinking:
            thinking = candidate
    call_id = data.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise fail(f"'id' is {_json_kind(call_id)}, not a string")
    finish_reason = choice.get("finish_reason")
    problem, tool_calls = _tool_calls_of(message.get("tool_calls"))
    if problem is not None:
        raise fail(problem)
    return ModelReply(
        call_id=call_id or None,
        content=content or "",
        thinking=thinking,
        usage=usage_from(data.get("usage")),
        tool_calls=tool_calls,
        finish_reason=finish_reason if isinstance(finish_reason, str) and finish_reason else None,
    )


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def usage_from(value: object) -> Usage | None:
    """The reply's ``usage`` object as a ``Usage``, or ``None`` when it is absent or unusable.

    ``prompt_tokens`` and ``completion_tokens`` must both be non-negative integers;
    ``cached_tokens`` is read from ``prompt_tokens_details.cached_tokens`` (OpenAI, vLLM,
    llama.cpp's own server) and left ``None`` when the endpoint does not say. A malformed usage
    object is ignored rather than failing the call: it is bookkeeping, not the answer.
    """
    if not isinstance(value, dict):
        return None
    prompt = _count(value.get("prompt_tokens"))
    completion = _count(value.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = value.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def _tool_calls_of(raw: object) -> tuple[str | None, tuple[NativeToolCall, ...]]:
    """``(problem, calls)``: the reply's tool calls, or what is wrong with them."""
    where = "choices[0].message.tool_calls"
    if raw is None:
        return None, ()
    if not isinstance(raw, list):
        return f"{where} is {_json_kind(raw)}, not an array", ()
    calls: list[NativeToolCall] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        path = f"{where}[{index}]"
        if not isinstance(item, dict):
            return f"{path} is {_json_kind(item)}, not an object", ()
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            return (
                f"{path}.id is {_json_kind(call_id)}, not a non-empty string (the answer to a "
                "tool call must carry its id)",
                (),
            )
        if call_id in seen:
            return f"{path}.id {call_id!r} repeats an earlier call's id", ()
        seen.add(call_id)
        function = item.get("function")
        if not isinstance(function, dict):
            return f"{path}.function is {_json_kind(function)}, not an object", ()
        name = function.get("name")
        if not isinstance(name, str):
            return f"{path}.function.name is {_json_kind(name)}, not a string", ()
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            return f"{path}.function.arguments is {_json_kind(arguments)}, not a string", ()
        calls.append(NativeToolCall(id=call_id, name=name, arguments=arguments))
    return None, tuple(calls)


def _json_kind(value: object) -> str:
    """``value``'s JSON type with its article, for error messages ("an array", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


async def _reply_from_stream(url: str, model: str, response: httpx.Response) -> ModelReply:
    """Assemble a ``ModelReply`` from a Chat Completions event stream (design 0203).

    Each ``data:`` line holds a chunk: ``choices[0].delta.content`` (and ``reasoning_content``
    or ``reasoning``) pieces are concatenated in order; the first non-empty ``id`` is the call
    id, the last non-null ``choices[0].finish_reason`` and ``usage`` win;
    ``choices[0].delta.tool_calls`` pieces are joined per ``index`` (id and name from the first
    piece, the arguments concatenated) and checked like a non-streaming reply's calls.
    ``data: [DONE]`` ends the stream; a stream that ends without it, an ``{"error": ...}`` chunk
    or a chunk that is not an object of that shape raises ``GatewayResponseError``, like a
    malformed body would.
    """
    seen: list[str] = []

    def fail(problem: str) -> GatewayResponseError:
        excerpt, truncated = excerpt_of("\n".join(seen))
        return GatewayResponseError(
            url=url, model=model, problem=problem, body_excerpt=excerpt, body_truncated=truncated
        )

    reply = _StreamedReply()
    done = False
    async for line in response.aiter_lines():
        if sum(len(item) for item in seen) < EXCERPT_LIMIT:
            seen.append(line)
        if not line.startswith("data:"):
            continue  # blank separators, comments (": keep-alive"), event: and id: fields
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as exc:
            raise fail(f"a stream chunk is not JSON ({exc})") from exc
        problem = reply.add(chunk)
        if problem is not None:
            raise fail(problem)
    if not done:
        raise fail("the stream ended without 'data: [DONE]'")
    problem, tool_calls = _tool_calls_of(reply.joined_tool_calls() or None)
    if problem is not None:
        raise fail(f"assembled from the stream, {problem}")
    return reply.assembled(tool_calls)


class _StreamedReply:
    """The pieces of one streamed reply, folded in chunk by chunk (``add``) by the rules in
    ``_reply_from_stream``'s docstring.

    A malformed chunk is returned as a problem string, not raised: the error must carry the
    excerpt of the stream's lines, which only the caller reads.
    """

    __slots__ = ("_call_id", "_calls", "_content", "_finish_reason", "_reasoning", "_usage")

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: dict[str, list[str]] = {"reasoning_content": [], "reasoning": []}
        self._call_id: str | None = None
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: object) -> str | None:
        """Fold one decoded ``data:`` chunk in; what is wrong with it, or ``None``.

        A chunk with an empty ``choices`` array (the usage chunk) still gives its ``id`` and
        ``usage``.
        """
        if not isinstance(chunk, dict):
            return f"a stream chunk is {_json_kind(chunk)}, not an object"
        if "error" in chunk:
            return "the stream carried an error object"
        chunk_id = chunk.get("id")
        if isinstance(chunk_id, str) and chunk_id and self._call_id is None:
            self._call_id = chunk_id
        self._usage = usage_from(chunk.get("usage")) or self._usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return f"a stream chunk's 'choices' is {_json_kind(choices)}, not an array"
        if not choices:
            return None  # the usage chunk has no choices
        choice = choices[0]
        if not isinstance(choice, dict):
            return f"a stream chunk's choices[0] is {_json_kind(choice)}, not an object"
        problem = self._add_delta(choice.get("delta") or {})
        if problem is not None:
            return problem
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._finish_reason = reason
        return None

    def _add_delta(self, delta: object) -> str | None:
        """Fold one ``choices[0].delta`` in: its text pieces, then its tool-call pieces."""
        if not isinstance(delta, dict):
            return f"choices[0].delta is {_json_kind(delta)}, not an object"
        piece = delta.get("content")
        if piece is not None and not isinstance(piece, str):
            return f"choices[0].delta.content is {_json_kind(piece)}, not a string or null"
        if piece:
            self._content.append(piece)
        for name, pieces in self._reasoning.items():
            candidate = delta.get(name)
            if candidate is not None and not isinstance(candidate, str):
                return f"choices[0].delta.{name} is {_json_kind(candidate)}, not a string"
            if candidate:
                pieces.append(candidate)
        return _add_tool_call_pieces(delta.get("tool_calls"), self._calls)

    def joined_tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls joined so far, by ``index``, in the shape of a non-streaming reply's
        ``message.tool_calls``: so ``_tool_calls_of`` checks both kinds of reply alike."""
        return [
            {
                "id": self._calls[index]["id"],
                "function": {
                    "name": "".join(self._calls[index]["name"]),
                    "arguments": "".join(self._calls[index]["arguments"]),
                },
            }
            for index in sorted(self._calls)
        ]

    def assembled(self, tool_calls: tuple[NativeToolCall, ...]) -> ModelReply:
        """The reply, with ``tool_calls`` as ``_tool_calls_of`` checked them.

        ``thinking`` is the ``reasoning_content`` pieces, or the ``reasoning`` pieces when
        there are none of those: one field, never both joined.
        """
        thinking = "".join(self._reasoning["reasoning_content"]) or "".join(
            self._reasoning["reasoning"]
        )
        return ModelReply(
            call_id=self._call_id,
            content="".join(self._content),
            thinking=thinking,
            usage=self._usage,
            tool_calls=tool_calls,
            finish_reason=self._finish_reason,
        )


def _add_tool_call_pieces(raw: object, calls: dict[int, dict[str, Any]]) -> str | None:
    """Fold one chunk's ``delta.tool_calls`` into ``calls`` (by ``index``); the problem, if any.

    A call's first piece carries its ``id`` and ``function.name``; later pieces of the same
    ``index`` carry more of ``function.arguments``, which are concatenated in order (design
    0100). A piece without ``index`` belongs to call 0.
    """
    if raw is None:
        return None
    where = "choices[0].delta.tool_calls"
    if not isinstance(raw, list):
        return f"{where} is {_json_kind(raw)}, not an array"
    for position, piece in enumerate(raw):
        if not isinstance(piece, dict):
            return f"{where}[{position}] is {_json_kind(piece)}, not an object"
        index = piece.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            return f"{where}[{position}].index is {_json_kind(index)}, not an index"
        entry = calls.setdefault(index, {"id": None, "name": [], "arguments": []})
        piece_id = piece.get("id")
        if isinstance(piece_id, str) and piece_id and entry["id"] is None:
            entry["id"] = piece_id
        function = piece.get("function") or {}
        if not isinstance(function, dict):
            return f"{where}[{position}].function is {_json_kind(function)}, not an object"
        for name in ("name", "arguments"):
            part = function.get(name)
            if part is not None and not isinstance(part, str):
                return f"{where}[{position}].function.{name} is {_json_kind(part)}, not a string"
            if part:
                entry[name].append(part)
    return None
