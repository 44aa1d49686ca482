"""A loopback OpenAI-compatible Chat Completions server that plays the model for the soak.

``POST /v1/chat/completions`` reads the request body's ``user`` field
(``tools.soak.scenarios.base.decode_user``: scenario, task, phase, persona, seed), hands the
messages to ``tools.soak.scenarios.<scenario>.policy`` and answers a normal Chat Completions
body: ``id``, ``choices[0].message.content`` and, when the policy gives one,
``reasoning_content``, and ``usage`` estimated at four characters per token. A request with
``"stream": true`` gets the same reply as a Chat Completions event stream (one content
delta, a finish chunk, a usage chunk, ``data: [DONE]``), so ``run_soak --stream`` works
against it too. ``GET /v1/models`` lists the one model. The soak reaches it through the
real ``polyloop.adapters.GatewayModelClient``, so the adapter is exercised end to end.

Knobs (all deterministic for a seed, none depends on arrival order or concurrency):

* ``latency`` + ``jitter``: every reply waits ``latency + jitter * u`` seconds, ``u`` in [0, 1)
  drawn from a hash of the seed and the request;
* ``failure_rate``: that fraction of requests gets an HTTP 500 or 503 with a JSON error body
  instead of a reply (the adapter raises, the run stops with ``llm_error``). The **first call
  of a run never fails** (the server remembers the shortest conversation it has seen per
  ``user`` value): a run ended by an injected failure then still has two steps, which keeps
  the scoreboard's prompt-growth check decidable;
* ``reply_override`` / ``delay_override``: callables a fault class installs to script one
  task's replies or hold its request open.

While a reply waits, the server watches the connection; a client that goes away (a cancelled
call) is counted in ``abandoned`` and gets nothing. A policy that raises is a harness bug: the
caller gets a 500, the server counts it in ``policy_errors`` and logs the traceback, and
``run_soak`` exits non-zero.

Run it alone with ``python -m tools.soak.policy_server --port 8099`` (Ctrl-C stops it), or in
process::

    async with PolicyServer(seed=7) as server:
        settings = GatewaySettings(base_url=server.base_url, model="soak-policy")
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Final

from tools.soak.scenarios.base import PolicyReply, PolicyRequest, decode_user

__all__ = ["DEFAULT_MODEL", "PolicyServer", "main"]

logger = logging.getLogger("tools.soak.policy_server")

DEFAULT_MODEL: Final = "soak-policy"
_SCENARIO_NAME: Final = re.compile(r"[a-z][a-z0-9_]*")
_HEADER_LIMIT: Final = 64 * 1024
_BODY_LIMIT: Final = 32 * 1024 * 1024

ReplyOverride = Callable[[PolicyRequest], "str | PolicyReply | None"]
DelayOverride = Callable[[PolicyRequest], "float | None"]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class _HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class PolicyServer:
    """The policy server; see the module docstring. Use ``async with`` to run it."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        jitter: float = 0.0,
        failure_rate: float = 0.0,
        seed: int = 0,
        model: str = DEFAULT_MODEL,
    ) -> None:
        if latency < 0 or jitter < 0:
            raise ValueError("PolicyServer latency and jitter must be >= 0 seconds")
        if not 0.0 <= failure_rate <= 1.0:
            raise ValueError(f"PolicyServer failure_rate must be in [0, 1], got {failure_rate}")
        self.host = host
        self._port = port
        self.latency = latency
        self.jitter = jitter
        self.failure_rate = failure_rate
        self.seed = seed
        self.model = model
        self.reply_override: ReplyOverride | None = None
        self.delay_override: DelayOverride | None = None
        self.requests = 0
        self.replies = 0
        self.injected_failures = 0
        self.policy_errors = 0
        self.abandoned = 0
        self.received: list[PolicyRequest] = []
        self._arrival = asyncio.Condition()
        self._shortest: dict[str, int] = {}
        self._modules: dict[str, ModuleType] = {}
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        """The API root to put in ``GatewaySettings.base_url`` (``http://host:port/v1``)."""
        if self._server is None:
            raise RuntimeError("PolicyServer.base_url: the server is not running")
        return f"http://{self.host}:{self._port}/v1"

    async def __aenter__(self) -> PolicyServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop accepting, end every open connection, and wait for the handlers."""
        if self._server is None:
            return
        self._server.close()
        for task in self._handlers:
            task.cancel()
        if self._handlers:
            await asyncio.wait(set(self._handlers))
        await self._server.wait_closed()
        self._server = None

    async def wait_for_request(self, predicate: Callable[[PolicyRequest], bool]) -> PolicyRequest:
        """Wait until a request matching ``predicate`` has arrived (earlier ones count)."""
        async with self._arrival:
            await self._arrival.wait_for(lambda: any(predicate(r) for r in self.received))
            return next(r for r in self.received if predicate(r))

    # ---------------------------------------------------------------- connections

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._connection(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except _BadRequest as exc:
                    await _respond(writer, exc.status, _error_body(str(exc)), keep_alive=False)
                    return
                if request is None:
                    return
                keep_alive = request.headers.get("connection", "").lower() != "close"
                answer = await self._route(request, reader)
                if answer is None:
                    return
                status, body = answer
                if status == 200 and _asks_for_stream(request.body):
                    # An event stream delimited by closing the connection (no length known).
                    await _respond_stream(writer, body)
                    return
                await _respond(writer, status, body, keep_alive=keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # the client went away mid-request; there is nobody left to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _route(
        self, request: _HttpRequest, reader: asyncio.StreamReader
    ) -> tuple[int, dict[str, object]] | None:
        if request.method == "GET" and request.path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if request.path != "/v1/chat/completions":
            return 404, _error_body(f"no such path {request.path!r}")
        if request.method != "POST":
            return 405, _error_body("use POST for /v1/chat/completions")
        try:
            policy_request, user = self._policy_request(request.body)
        except _BadRequest as exc:
            return exc.status, _error_body(str(exc))
        self.requests += 1
        async with self._arrival:
            self.received.append(policy_request)
            self._arrival.notify_all()
        draw = _unit_draws(self.seed, user, policy_request.messages)
        first = self._shortest.setdefault(user, len(policy_request.messages))
        first = min(first, len(policy_request.messages))
        self._shortest[user] = first
        delay = self.latency + self.jitter * draw[1]
        override = None if self.delay_override is None else self.delay_override(policy_request)
        if override is not None:
            delay = override
        if not await _wait_unless_abandoned(reader, delay):
            self.abandoned += 1
            return None
        if len(policy_request.messages) > first and draw[0] < self.failure_rate:
            self.injected_failures += 1
            status = 503 if draw[2] < 0.5 else 500
            return status, _error_body(f"injected failure ({status}) from the soak policy server")
        try:
            reply = self._answer(policy_request)
        except Exception as exc:  # a policy bug becomes a counted, logged 500
            self.policy_errors += 1
            logger.exception("policy for %s raised", policy_request.scenario)
            return 500, _error_body(f"the soak policy raised {type(exc).__name__}")
        self.replies += 1
        return 200, self._completion(reply, policy_request)

    def _policy_request(self, raw: bytes) -> tuple[PolicyRequest, str]:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest(400, f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _BadRequest(400, "the body must be a JSON object")
        user = body.get("user")
        if not isinstance(user, str):
            raise _BadRequest(
                400,
                "the body has no 'user' string; the soak routes calls by it "
                "(model_binding 'gateway.user', see tools.soak.scenarios.base.encode_user)",
            )
        try:
            scenario, task_id, phase, persona, seed = decode_user(user)
        except ValueError as exc:
            raise _BadRequest(400, str(exc)) from exc
        if not _SCENARIO_NAME.fullmatch(scenario) or scenario == "base":
            raise _BadRequest(400, f"unknown scenario {scenario!r}")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise _BadRequest(400, "'messages' must be a list of {role, content} strings")
        request = PolicyRequest(
            scenario=scenario,
            task_id=task_id,
            phase=phase,
            persona=persona,
            seed=seed,
            messages=tuple(messages),
        )
        return request, user

    def _answer(self, request: PolicyRequest) -> PolicyReply:
        reply: str | PolicyReply | None = None
        if self.reply_override is not None:
            reply = self.reply_override(request)
        if reply is None:
            module = self._modules.get(request.scenario)
            if module is None:
                module = importlib.import_module(f"tools.soak.scenarios.{request.scenario}")
                self._modules[request.scenario] = module
            reply = module.policy(request)
        if isinstance(reply, str):
            return PolicyReply(content=reply)
        if not isinstance(reply, PolicyReply):
            raise TypeError(f"a policy must return str or PolicyReply, got {type(reply).__name__}")
        return reply

    def _completion(self, reply: PolicyReply, request: PolicyRequest) -> dict[str, object]:
        message: dict[str, object] = {"role": "assistant", "content": reply.content}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        prompt_chars = sum(len(m["content"]) for m in request.messages)
        completion_chars = len(reply.content) + len(reply.reasoning)
        return {
            "id": f"chatcmpl-soak-{self.replies}",
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_chars // 4,
                "completion_tokens": completion_chars // 4,
                "total_tokens": (prompt_chars + completion_chars) // 4,
            },
        }


# --------------------------------------------------------------------------- HTTP plumbing


def _error_body(message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": "server_error"}}


def _unit_draws(seed: int, user: str, messages: Sequence[object]) -> tuple[float, float, float]:
    """Three numbers in [0, 1) fixed by the seed, the run's routing key and the conversation."""
    digest = hashlib.sha256(
        json.dumps([seed, user, messages], sort_keys=True, ensure_ascii=False).encode("utf-8")
    ).digest()
    return tuple(  # type: ignore[return-value]
        int.from_bytes(digest[i : i + 8], "big") / 2**64 for i in (0, 8, 16)
    )


async def _wait_unless_abandoned(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Sleep ``seconds``; False as soon as the client closes the connection instead."""
    if seconds <= 0:
        return True
    closed = asyncio.ensure_future(reader.read(1))
    sleeper = asyncio.ensure_future(asyncio.sleep(seconds))
    try:
        done, _ = await asyncio.wait({closed, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (closed, sleeper):
            task.cancel()
        await asyncio.wait({closed, sleeper})
    # Any byte (or EOF) while the reply is pending means the client is no longer waiting for
    # this answer: HTTP/1.1 clients like httpx never pipeline.
    return closed not in done


async def _read_request(reader: asyncio.StreamReader) -> _HttpRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError as exc:
        raise _BadRequest(431, "request headers too large") from exc
    if len(head) > _HEADER_LIMIT:
        raise _BadRequest(431, "request headers too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _BadRequest(400, "malformed request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise _BadRequest(411, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError as exc:
        raise _BadRequest(400, "Content-Length is not a number") from exc
    if length < 0 or length > _BODY_LIMIT:
        raise _BadRequest(413, f"a body of {length} bytes is refused")
    body = await reader.readexactly(length) if length else b""
    return _HttpRequest(method=parts[0], path=parts[1], headers=headers, body=body)


def _asks_for_stream(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(payload, dict) and payload.get("stream") is True


async def _respond_stream(writer: asyncio.StreamWriter, completion: dict[str, object]) -> None:
    """``completion`` as a Chat Completions event stream: the message in one delta chunk, a
    finish chunk, a usage chunk, ``[DONE]``; the connection closes after it."""
    choices = completion.get("choices")
    assert isinstance(choices, list)
    choice = choices[0]
    base = {key: completion[key] for key in ("id", "object", "created", "model")}
    base["object"] = "chat.completion.chunk"
    delta = {"role": "assistant", **choice["message"]}
    events = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        {**base, "choices": [], "usage": completion.get("usage")},
    ]
    text = "".join(f"data: {json.dumps(event, ensure_ascii=False)}\n\n" for event in events)
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    writer.write(head.encode("latin-1") + (text + "data: [DONE]\n\n").encode("utf-8"))
    await writer.drain()


async def _respond(
    writer: asyncio.StreamWriter, status: int, payload: dict[str, object], *, keep_alive: bool
) -> None:
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


# --------------------------------------------------------------------------- CLI


async def _serve(args: argparse.Namespace) -> None:
    server = PolicyServer(
        host=args.host,
        port=args.port,
        latency=args.latency,
        jitter=args.jitter,
        failure_rate=args.failure_rate,
        seed=args.seed,
    )
    async with server:
        print(f"soak policy server on {server.base_url} (Ctrl-C stops it)", file=sys.stderr)
        await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak.policy_server",
        description="Loopback OpenAI-compatible server that plays the soak's scripted agents.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=0.005, help="seconds per reply")
    parser.add_argument("--jitter", type=float, default=0.01, help="extra seconds, seeded")
    parser.add_argument("--failure-rate", type=float, default=0.0, help="HTTP 500/503 share")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
