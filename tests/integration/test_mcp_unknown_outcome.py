"""A real MCP server killed in the middle of a ``tools/call`` (issue 35, design 0227).

``@modelcontextprotocol/server-everything`` (npm, nobody here wrote it) runs its
``trigger-long-running-operation``, which reports progress every tenth of a second; at its
first report of the first attempt the test SIGKILLs the server (over stdio: the process the
toolset started; over streamable HTTP: the server process, started again on the same port at
once). The call's outcome is unknown, and its replay policy settles it within the run:

* ``SAFE`` (the tool is read-only, the server trusted): tried again once the server is back
  (the toolset connects again), the run finishes;
* ``IDEMPOTENT`` (an override): tried again with the same idempotency key in ``_meta``;
* ``NEVER`` with a reconciler: settled by it, nothing called again;
* ``NEVER`` without: the run stops ``resume_state_unknown``, open, ``unknown_outcome`` naming
  the call; ``resolve`` says it did not happen and ``resume`` runs it (same key) and finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from _mcp_servers import agent_run, everything_command

from polyloop.mcp import IDEMPOTENCY_META_KEY, McpProgress, McpServer, McpToolset
from polyloop.session import resolve, resume, run
from polyloop.stores import JsonlRunStore
from polyloop.tools import Reconciliation, ToolContext, ToolRegistry
from polyloop.types import ReplayPolicy, SettlementSource, StopReason

pytestmark = pytest.mark.integration

BOUND_SECONDS = 60.0  # generous for a loaded machine; a hang would take forever
TOOL = "trigger-long-running-operation"
REPLIES = [
    json.dumps({"tool": TOOL, "arguments": {"duration": 0.5, "steps": 5}}),
    '{"final_answer": "done"}',
]
DONE = "Long running operation completed. Duration: 0.5 seconds, Steps: 5."


class Killer:
    """Kills the server at the first progress report of the first ``kills`` attempts."""

    def __init__(self, kill: Callable[[], None], kills: int = 1) -> None:
        self._kill = kill
        self.kills = kills
        self._killing = False

    async def __call__(self, progress: McpProgress) -> None:
        if self.kills and not self._killing:
            self._killing = True
            self.kills -= 1
            self._kill()


@contextlib.contextmanager
def stdio_everything(tmp_path: Path) -> Iterator[tuple[McpServer, Callable[[], None]]]:
    """The server over stdio, started by ``sh`` that writes its pid and ``exec``s node."""
    pids = tmp_path / "pids"
    line = " ".join(f"'{part}'" for part in [*everything_command(), "stdio"])
    server = McpServer.stdio(
        "/bin/sh", ["-c", f"echo $$ >> '{pids}'; exec {line}"], trusted=True, name="everything"
    )

    def kill() -> None:
        os.kill(int(pids.read_text(encoding="utf-8").split()[-1]), signal.SIGKILL)

    yield server, kill


class HttpServer:
    """The server process over streamable HTTP on one port: ``kill`` SIGKILLs it (and starts
    it again on the same port unless ``back=False``), ``start`` starts it."""

    def __init__(self, start: Callable[[], subprocess.Popen[bytes]], port: int) -> None:
        self._start = start
        self._port = port
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.processes.append(self._start())

    def wait_listening(self) -> None:
        deadline = time.monotonic() + BOUND_SECONDS
        while True:
            with socket.socket() as attempt:
                if attempt.connect_ex(("127.0.0.1", self._port)) == 0:
                    return
            assert self.processes[-1].poll() is None, "the HTTP server exited before it listened"
            assert time.monotonic() < deadline, "the HTTP server did not listen in time"
            time.sleep(0.05)

    def kill(self, *, back: bool = True) -> None:
        self.processes[-1].kill()
        self.processes[-1].wait()
        if back:
            self.start()


@contextlib.contextmanager
def http_process(tmp_path: Path, **server: object) -> Iterator[tuple[McpServer, HttpServer]]:
    """The server over streamable HTTP on 127.0.0.1, and its process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    errors = (tmp_path / "http-server.stderr").open("ab")
    command = [*everything_command(), "streamableHttp"]
    env = {**os.environ, "PORT": str(port)}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)

    process = HttpServer(start, port)
    process.start()
    process.wait_listening()
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        yield McpServer.http(url, trusted=True, name="everything", **server), process  # type: ignore[arg-type]
    finally:
        for started in process.processes:
            started.kill()
            started.wait()
        errors.close()


@contextlib.contextmanager
def http_everything(tmp_path: Path) -> Iterator[tuple[McpServer, Callable[[], None]]]:
    """The server over streamable HTTP; ``kill`` SIGKILLs it and starts it again on the same
    port at once (the toolset's next call finds it back)."""
    with http_process(tmp_path) as (server, process):
        yield server, process.kill


SERVERS = {"stdio": stdio_everything, "http": http_everything}


@pytest.fixture(autouse=True)
def quick_sse_reconnection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's HTTP client waits 1 s, twice, to reconnect a reply stream that broke before
    it gives the call up as lost ("SSE stream ended and reconnection attempts were
    exhausted"); 0.1 s keeps these tests short and changes nothing else."""
    monkeypatch.setattr("mcp.client.streamable_http.DEFAULT_RECONNECTION_DELAY_MS", 100)


@pytest.fixture
def sent_keys(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The idempotency key in ``_meta`` of every ``tools/call`` the SDK's client sends."""
    from mcp import Client

    keys: list[str] = []
    real = Client.call_tool

    def spy(self: Client, *args: object, **kwargs: object) -> Awaitable[object]:
        meta = kwargs.get("meta")
        keys.append(meta.get(IDEMPOTENCY_META_KEY) if isinstance(meta, dict) else None)  # type: ignore[arg-type]
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Client, "call_tool", spy)
    return keys


async def _action_key(store: JsonlRunStore, run_id: str) -> str | None:
    log = await store.read_log(run_id)
    [intent] = {i.result_id: i for i in log.intents if i.result_id.startswith("a")}.values()
    return intent.idempotency_key


@pytest.mark.parametrize("transport", sorted(SERVERS))
@pytest.mark.parametrize("policy", [ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT])
async def test_a_replayable_call_is_tried_again_once_the_server_is_back(
    tmp_path: Path, transport: str, policy: ReplayPolicy, sent_keys: list[str]
) -> None:
    store = JsonlRunStore(directory=tmp_path / "runs")
    overrides = {} if policy is ReplayPolicy.SAFE else {TOOL: policy}
    with SERVERS[transport](tmp_path) as (server, kill):
        killer = Killer(kill)
        async with McpToolset(server, overrides=overrides, on_progress=killer) as toolset:
            assert toolset.registry().spec_for(TOOL).replay_policy is policy  # type: ignore[union-attr]
            definition, request = agent_run(REPLIES, toolset.registry(), "run-1", store)
            result = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert killer.kills == 0  # the first attempt was killed mid-call
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == DONE
    key = await _action_key(store, "run-1")
    assert sent_keys == [key, key]  # two attempts, one key in _meta
    log = await store.read_log("run-1")
    [doubt] = log.settlements
    assert doubt.source is SettlementSource.EXECUTOR
    assert "MCP server 'everything'" in doubt.note


@pytest.mark.parametrize("transport", sorted(SERVERS))
async def test_a_never_call_is_settled_by_its_reconciler(
    tmp_path: Path, transport: str, sent_keys: list[str]
) -> None:
    store = JsonlRunStore(directory=tmp_path / "runs")
    asked: list[str] = []

    async def reconcile(ctx: ToolContext, arguments: object) -> Reconciliation:
        asked.append(ctx.idempotency_key)
        return Reconciliation.executed("the operation's own record: completed")

    with SERVERS[transport](tmp_path) as (server, kill):
        async with McpToolset(
            server, overrides={TOOL: ReplayPolicy.NEVER}, on_progress=Killer(kill)
        ) as toolset:
            specs = [
                dataclasses.replace(spec, reconcile=reconcile) if spec.name == TOOL else spec
                for spec in toolset.specs()
            ]
            definition, request = agent_run(REPLIES, ToolRegistry(specs), "run-1", store)
            result = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == "the operation's own record: completed"
    key = await _action_key(store, "run-1")
    assert sent_keys == [key]  # never called again
    assert asked == [key]
    log = await store.read_log("run-1")
    assert log.steps[0].action_outcome.settled_by == "reconciler"  # type: ignore[union-attr]


@pytest.mark.parametrize("transport", sorted(SERVERS))
async def test_a_never_call_without_a_reconciler_stays_open_until_resolved(
    tmp_path: Path, transport: str, sent_keys: list[str]
) -> None:
    store = JsonlRunStore(directory=tmp_path / "runs")
    with SERVERS[transport](tmp_path) as (server, kill):
        async with McpToolset(
            server, overrides={TOOL: ReplayPolicy.NEVER}, on_progress=Killer(kill)
        ) as toolset:
            definition, request = agent_run(REPLIES, toolset.registry(), "run-1", store)
            stopped = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
            assert stopped.stop_reason is StopReason.RESUME_STATE_UNKNOWN
            assert stopped.unknown_outcome == "a0"
            assert (await store.read_log("run-1")).finished is None
            assert len(sent_keys) == 1
            await resolve(store, "run-1", result_id="a0", executed=False, by="ops")
            finished = await asyncio.wait_for(resume(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert finished.stop_reason is StopReason.FINAL_ANSWER
    assert finished.steps[0].observation == DONE
    key = await _action_key(store, "run-1")
    assert sent_keys == [key, key]  # the retry the person licensed, with the same key


async def test_a_safe_call_whose_server_stays_down_stops_resumable(
    tmp_path: Path, sent_keys: list[str]
) -> None:
    """The server is killed and not started again: the retry cannot reach it (nothing sent,
    within ``connect_timeout_seconds``), so the doubt stands and the run stops
    ``retries_exhausted``, open; once the server is back, a resume finishes it."""
    store = JsonlRunStore(directory=tmp_path / "runs")
    with http_process(tmp_path, connect_timeout_seconds=1.0) as (server, process):
        killer = Killer(lambda: process.kill(back=False))
        async with McpToolset(server, on_progress=killer) as toolset:
            definition, request = agent_run(REPLIES, toolset.registry(), "run-1", store)
            stopped = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
            assert stopped.stop_reason is StopReason.RETRIES_EXHAUSTED
            assert stopped.unknown_outcome == "a0"
            assert (await store.read_log("run-1")).finished is None
            process.start()
            process.wait_listening()
            finished = await asyncio.wait_for(resume(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert finished.stop_reason is StopReason.FINAL_ANSWER
    assert finished.steps[0].observation == DONE
    key = await _action_key(store, "run-1")
    assert sent_keys == [key, key]  # the killed call and the resumed one; the retry sent nothing
