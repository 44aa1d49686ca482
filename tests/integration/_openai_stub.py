"""A loopback OpenAI-compatible Chat Completions server for tests.

``OpenAIStub`` is an asyncio HTTP/1.1 server on ``127.0.0.1`` and a free port, run in the
event loop of the test that enters it (``async with OpenAIStub() as stub``). It answers
``POST {stub.base_url}/chat/completions`` with scripted replies, one per request, in the order
they were queued with ``enqueue``; when the queue is empty it uses ``default`` (or answers 500
with ``"stub: no scripted reply left"``, counted in ``unscripted``). Any other path gets a 404.

Knobs:

* **Streaming.** A request whose body has ``"stream": true`` gets a well-formed 200 chat reply
  as a Chat Completions event stream instead (chunked ``text/event-stream``: a role chunk, the
  reasoning and the content in pieces of ``chunk_chars`` characters, a finish chunk, a usage
  chunk when ``stream_options.include_usage`` is true, then ``data: [DONE]``), so one script
  serves both modes. ``chunk_delay`` seconds pass between chunks; if the client closes the
  connection meanwhile, the stream stops, ``streams_cut`` goes up by one and
  ``chunks_sent`` shows how far it got. Error statuses and failures are sent as usual.
* ``latency`` (seconds) is added to every reply's own ``delay``. While a reply is delayed the
  stub watches the connection: if the client closes it (a cancelled or timed-out request),
  the reply is dropped and ``abandoned`` goes up by one. That is how a test proves that a
  cancelled request really released its connection.
* failure injection through the reply: ``error_reply`` (any status and body), ``raw_reply``
  (any bytes, for malformed JSON), ``dropped_reply`` (headers promise a full body, half is
  sent, then the connection is closed) and ``hangup_reply`` (the connection is closed with
  no response at all).

Every request is recorded in ``requests`` (method, path, lower-cased headers, body). Leaving
the ``async with`` block closes every connection and ends every handler, so nothing outlives
the test. The module uses only the standard library and imports nothing from polyloop.

This file is not collected by pytest (its name does not start with ``test_``). Test modules in
``tests/integration/`` import it as ``from _openai_stub import ...`` (pytest puts the test's
directory on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import enum
import http
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any

__all__ = [
    "OpenAIStub",
    "ReceivedRequest",
    "ReplyFailure",
    "StubReply",
    "chat_reply",
    "dropped_reply",
    "error_reply",
    "hangup_reply",
    "raw_reply",
    "tool_call_reply",
]

_HEADER_LIMIT = 64 * 1024
_DEFAULT_USAGE: Mapping[str, object] = MappingProxyType(
    {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
)


class ReplyFailure(enum.Enum):
    """How a scripted reply misbehaves at the transport level."""

    NONE = "none"
    """A complete, well-formed HTTP response."""
    DROP_MID_BODY = "drop_mid_body"
    """Headers with the full Content-Length, half of the body, then the connection closes."""
    HANG_UP = "hang_up"
    """The connection closes before any byte of the response is sent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StubReply:
    """One scripted answer. Build it with the ``*_reply`` helpers rather than by hand."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay: float = 0.0
    failure: ReplyFailure = ReplyFailure.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceivedRequest:
    """One request as the stub read it off the wire."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def chat_reply(
    content: str | None = "ok",
    *,
    call_id: str | None = "chatcmpl-stub",
    reasoning_content: str | None = None,
    reasoning: str | None = None,
    model: str = "stub-model",
    delay: float = 0.0,
    usage: Mapping[str, object] | None = _DEFAULT_USAGE,
    finish_reason: str | None = "stop",
) -> StubReply:
    """A well-formed Chat Completions reply. ``call_id=None`` leaves the ``id`` field out,
    ``usage=None`` the ``usage`` object."""
    message: dict[str, object] = {"role": "assistant", "content": content}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    if reasoning is not None:
        message["reasoning"] = reasoning
    payload: dict[str, object] = {
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        payload["usage"] = dict(usage)
    if call_id is not None:
        payload["id"] = call_id
    return StubReply(body=json.dumps(payload).encode(), delay=delay)


def tool_call_reply(
    *calls: tuple[str, str, str],
    content: str | None = None,
    call_id: str = "chatcmpl-stub",
    finish_reason: str = "tool_calls",
    delay: float = 0.0,
) -> StubReply:
    """A reply carrying native tool calls, each ``(id, name, arguments text)``, the way OpenAI
    and vLLM send them: ``content`` is ``null`` unless given, ``finish_reason`` is
    ``"tool_calls"``."""
    message: dict[str, object] = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": tool_id, "type": "function", "function": {"name": name, "arguments": args}}
            for tool_id, name, args in calls
        ],
    }
    payload: dict[str, object] = {
        "id": call_id,
        "object": "chat.completion",
        "created": 0,
        "model": "stub-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return StubReply(body=json.dumps(payload).encode(), delay=delay)


def error_reply(
    status: int,
    body: str | bytes = b'{"error": {"message": "stub error"}}',
    *,
    content_type: str = "application/json",
    delay: float = 0.0,
) -> StubReply:
    """A complete response with any (error) status and body."""
    data = body.encode() if isinstance(body, str) else body
    return StubReply(status=status, body=data, content_type=content_type, delay=delay)


def raw_reply(
    body: str | bytes,
    *,
    status: int = 200,
    content_type: str = "application/json",
    delay: float = 0.0,
) -> StubReply:
    """A complete response with exactly these body bytes (for malformed JSON and the like)."""
    data = body.encode() if isinstance(body, str) else body
    return StubReply(status=status, body=data, content_type=content_type, delay=delay)


def dropped_reply(*, delay: float = 0.0) -> StubReply:
    """A reply whose connection is closed halfway through the body."""
    full = chat_reply("this body never arrives in full " * 8)
    return StubReply(body=full.body, delay=delay, failure=ReplyFailure.DROP_MID_BODY)


def hangup_reply(*, delay: float = 0.0) -> StubReply:
    """No response at all: the connection is closed after the request was read."""
    return StubReply(delay=delay, failure=ReplyFailure.HANG_UP)


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    task: asyncio.Task[None] | None = None


class OpenAIStub:
    """The server. See the module docstring for the behaviour; all state is public to read."""

    def __init__(
        self,
        *,
        default: StubReply | None = None,
        latency: float = 0.0,
        path_prefix: str = "/v1",
        chunk_delay: float = 0.0,
        chunk_chars: int = 4,
    ) -> None:
        self.default = default
        self.latency = latency
        self.chunk_delay = chunk_delay
        self.chunk_chars = chunk_chars
        self.streams_cut = 0
        self.chunks_sent = 0
        self.path_prefix = path_prefix.rstrip("/")
        self.requests: list[ReceivedRequest] = []
        self.abandoned = 0
        self.unscripted = 0
        self.connections_opened = 0
        self.connection_errors: list[str] = []
        self._queue: deque[StubReply] = deque()
        self._server: asyncio.Server | None = None
        self._connections: list[_Connection] = []
        self._changed: asyncio.Condition | None = None
        self._port = 0
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> OpenAIStub:
        self._changed = asyncio.Condition()
        self._server = await asyncio.start_server(self._serve, host="127.0.0.1", port=0)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        server = self._server
        if server is None:
            return
        self._server = None
        self._closing = True
        server.close()
        # Closing the transports ends every handler through EOF. Cancelling them instead would
        # make Python 3.11's start_server callback log a spurious error for each one.
        for connection in self._connections:
            connection.writer.close()
        tasks = [conn.task for conn in self._connections if conn.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await server.wait_closed()

    @property
    def base_url(self) -> str:
        """The API root to give to ``GatewaySettings.base_url``."""
        if self._server is None:
            raise RuntimeError("OpenAIStub.base_url is only known inside 'async with OpenAIStub()'")
        return f"http://127.0.0.1:{self._port}{self.path_prefix}"

    # ------------------------------------------------------------------ scripting

    def enqueue(self, *replies: StubReply) -> None:
        """Queue replies; each request takes the oldest one."""
        self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """How many queued replies no request has taken yet."""
        return len(self._queue)

    async def wait_for_requests(self, count: int) -> None:
        """Return once ``count`` requests have arrived. Bound it with ``asyncio.timeout``."""
        await self._wait_until(lambda: len(self.requests) >= count)

    async def wait_for_chunks(self, count: int) -> None:
        """Return once ``count`` stream chunks were sent, over all streams (bound it)."""
        await self._wait_until(lambda: self.chunks_sent >= count)

    async def wait_for_streams_cut(self, count: int) -> None:
        """Return once ``count`` streams were closed by their client mid-way (bound it)."""
        await self._wait_until(lambda: self.streams_cut >= count)

    async def wait_for_abandoned(self, count: int) -> None:
        """Return once ``count`` delayed replies were abandoned by their client (bound it)."""
        await self._wait_until(lambda: self.abandoned >= count)

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        assert self._changed is not None, "use the stub inside 'async with OpenAIStub()'"
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(reader=reader, writer=writer, task=asyncio.current_task())
        self._connections.append(connection)
        self.connections_opened += 1
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                self.requests.append(request)
                await self._notify()
                if not await self._answer(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.connection_errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except ConnectionError as exc:
                self.connection_errors.append(f"while closing: {type(exc).__name__}: {exc}")
            finally:
                # Only now: teardown waits for every handler still listed here.
                self._connections.remove(connection)

    async def _read_request(self, reader: asyncio.StreamReader) -> ReceivedRequest | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return None  # the client closed an idle keep-alive connection
            raise
        if len(head) > _HEADER_LIMIT:
            raise ConnectionAbortedError("request head too large")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise ConnectionAbortedError("chunked request bodies are not supported by the stub")
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        return ReceivedRequest(
            method=method, path=target, headers=MappingProxyType(headers), body=body
        )

    def _next_reply(self, request: ReceivedRequest) -> StubReply:
        if request.path != f"{self.path_prefix}/chat/completions":
            return error_reply(404, f'{{"error": {{"message": "stub: no route {request.path}"}}}}')
        if request.method != "POST":
            return error_reply(405, b'{"error": {"message": "stub: use POST"}}')
        if self._queue:
            return self._queue.popleft()
        if self.default is not None:
            return self.default
        self.unscripted += 1
        return error_reply(500, b'{"error": {"message": "stub: no scripted reply left"}}')

    async def _answer(
        self, request: ReceivedRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Send one reply; True when the connection may serve another request."""
        reply = self._next_reply(request)
        delay = reply.delay + self.latency
        if delay > 0 and await self._client_left_during(reader, delay):
            if not self._closing:
                self.abandoned += 1
                await self._notify()
            return False
        if reply.failure is ReplyFailure.HANG_UP:
            return False
        events = _stream_events(request, reply, self.chunk_chars)
        if events is not None:
            return await self._stream(events, reader, writer)
        phrase = _reason_phrase(reply.status)
        head = (
            f"HTTP/1.1 {reply.status} {phrase}\r\n"
            f"Content-Type: {reply.content_type}\r\n"
            f"Content-Length: {len(reply.body)}\r\n"
            "\r\n"
        ).encode("latin-1")
        if reply.failure is ReplyFailure.DROP_MID_BODY:
            writer.write(head + reply.body[: len(reply.body) // 2])
            await writer.drain()
            return False
        writer.write(head + reply.body)
        await writer.drain()
        return True

    async def _stream(
        self,
        events: list[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Send ``events`` as a chunked event stream; False when the client left mid-way."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for index, event in enumerate(events):
            if (
                index
                and self.chunk_delay > 0
                and await self._client_left_during(reader, self.chunk_delay)
            ):
                if not self._closing:
                    self.streams_cut += 1
                    await self._notify()
                return False
            writer.write(f"{len(event):X}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            self.chunks_sent += 1
            await self._notify()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _client_left_during(self, reader: asyncio.StreamReader, delay: float) -> bool:
        """Wait ``delay`` seconds; True as soon as the client closes the connection."""
        try:
            async with asyncio.timeout(delay):
                data = await reader.read(1)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        if data:
            raise ConnectionAbortedError("bytes arrived while a reply was pending (pipelining)")
        return True


def _stream_events(request: ReceivedRequest, reply: StubReply, size: int) -> list[bytes] | None:
    """The event-stream form of ``reply`` when the request asked for a stream, else None."""
    if reply.status != 200 or reply.failure is not ReplyFailure.NONE:
        return None
    try:
        asked = request.json()
        payload = json.loads(reply.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(asked, dict) or asked.get("stream") is not True:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        return None
    choice = payload["choices"][0]
    message = choice["message"]
    options = asked.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True

    def chunk(delta: dict[str, object], finish: object = None) -> bytes:
        body: dict[str, object] = {
            "object": "chat.completion.chunk",
            "created": 0,
            "model": payload.get("model", "stub-model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if "id" in payload:
            body["id"] = payload["id"]
        return f"data: {json.dumps(body)}\n\n".encode()

    events = [chunk({"role": "assistant"})]
    for name in ("reasoning_content", "reasoning"):
        text = message.get(name) or ""
        events += [chunk({name: text[i : i + size]}) for i in range(0, len(text), size)]
    text = message.get("content") or ""
    events += [chunk({"content": text[i : i + size]}) for i in range(0, len(text), size)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        # As OpenAI streams them: id, type and name first, then the arguments in pieces.
        function = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        events.append(chunk({"tool_calls": [{**head, "function": {"name": function["name"]}}]}))
        arguments = function["arguments"]
        events += [
            chunk(
                {
                    "tool_calls": [
                        {"index": index, "function": {"arguments": arguments[i : i + size]}}
                    ]
                }
            )
            for i in range(0, len(arguments), size)
        ]
    events.append(chunk({}, choice.get("finish_reason")))
    if include_usage and "usage" in payload:
        usage_chunk = {"object": "chat.completion.chunk", "choices": [], "usage": payload["usage"]}
        if "id" in payload:
            usage_chunk["id"] = payload["id"]
        events.append(f"data: {json.dumps(usage_chunk)}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return events


def _reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
