"""polyloop.mcp against a server written in the tests with the SDK's own server API
(``_mcp_odd_server.py``): the policy table on a live listing, the idempotency key in
``_meta``, result mapping, progress, a tool that hangs, one that returns ``isError``, a server
that exits mid-call, and a schema that changes between run and resume (design 0211)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _mcp_servers import ODD_SERVER, agent_run, odd_server

from polyloop.errors import (
    McpConnectionError,
    ParameterDriftError,
    PolyloopValueError,
    ToolOutcomeUnknown,
)
from polyloop.mcp import IDEMPOTENCY_META_KEY, McpProgress, McpServer, McpToolset
from polyloop.ports import Action, Event, ToolCall, ToolContext, ToolProgress
from polyloop.session import resume, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.tools import ToolRegistry
from polyloop.types import ActionStatus, IntentKind, ReplayPolicy, StopReason

pytestmark = pytest.mark.integration

BOUND_SECONDS = 30.0  # generous for a loaded machine; a hang would take forever


def ledger_lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def show(log_file: Path) -> list[str]:
    """``python -m polyloop show LOG``'s lines."""
    completed = subprocess.run(
        [sys.executable, "-m", "polyloop", "show", str(log_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return completed.stdout.splitlines()


def call(name: str, arguments: dict[str, object] | None = None, key: str = "k-1") -> Action:
    return Action(
        text=name,
        tool_call=ToolCall(name=name, arguments=arguments or {}),
        context=ToolContext(idempotency_key=key, run_id="r", step_idx=0),
    )


async def test_a_trusted_server_gets_the_policies_of_the_table(tmp_path: Path) -> None:
    async with McpToolset(odd_server(tmp_path / "ledger")) as toolset:
        policies = {spec.name: spec.replay_policy for spec in toolset.specs()}
        parameters = toolset.registry().executor().parameters()
    assert policies["echo"] is ReplayPolicy.SAFE  # readOnlyHint true
    assert policies["put"] is ReplayPolicy.IDEMPOTENT  # idempotentHint true, destructive
    assert policies["append"] is ReplayPolicy.NEVER  # no annotations
    assert policies["die"] is ReplayPolicy.NEVER
    assert parameters["tool.put.replay_policy"] == "idempotent"
    assert parameters["tool.put.replay_policy_reason"].startswith("trusted server: idempotentHint")
    assert parameters["tool.put.mcp.server"] == "odd"
    assert parameters["tool.put.mcp.server_version"] == "1.1.0"
    assert json.loads(parameters["tool.put.mcp.annotations"]) == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
    }


async def test_an_untrusted_server_never_yields_safe_and_an_override_wins(
    tmp_path: Path,
) -> None:
    server = odd_server(tmp_path / "ledger", trusted=False)
    async with McpToolset(server, overrides={"append": ReplayPolicy.IDEMPOTENT}) as toolset:
        policies = {spec.name: spec.replay_policy for spec in toolset.specs()}
        reasons = {row.tool: row.reason for row in toolset.classification()}
    assert policies.pop("append") is ReplayPolicy.IDEMPOTENT
    assert reasons["append"].startswith("override")
    assert set(policies.values()) == {ReplayPolicy.NEVER}
    assert reasons["echo"] == "untrusted server: annotations not used"


async def test_an_override_for_a_tool_no_server_offers_is_refused(tmp_path: Path) -> None:
    toolset = McpToolset(odd_server(tmp_path / "ledger"), overrides={"ech": ReplayPolicy.SAFE})
    with pytest.raises(PolyloopValueError, match="'ech'.*which no server offers"):
        await toolset.__aenter__()


async def test_two_servers_with_one_tool_name_are_refused_naming_both_or_prefixed(
    tmp_path: Path,
) -> None:
    one = McpServer.stdio(sys.executable, [str(ODD_SERVER), str(tmp_path / "a")], name="one")
    two = McpServer.stdio(sys.executable, [str(ODD_SERVER), str(tmp_path / "b")], name="two")
    with pytest.raises(
        McpConnectionError, match="'echo' is offered by MCP servers 'one' and 'two'"
    ):
        async with McpToolset(one, two):
            pass
    async with McpToolset(one, two, prefix=True) as toolset:
        names = {spec.name for spec in toolset.specs()}
        outcome = await toolset.registry().executor().execute(call("two_echo", {"text": "hi"}))
    assert {"one_echo", "two_echo", "one_put", "two_put"} <= names
    assert outcome.observation == "hi"


async def test_results_map_to_observations(tmp_path: Path) -> None:
    seen: list[McpProgress] = []

    async def on_progress(progress: McpProgress) -> None:
        seen.append(progress)

    async with McpToolset(odd_server(tmp_path / "ledger"), on_progress=on_progress) as toolset:
        executor = toolset.registry().executor()
        text = await executor.execute(call("echo", {"text": "hello"}))
        failed = await executor.execute(call("fails", {"why": "the disk is full"}))
        image = await executor.execute(call("picture"))
        structured = await executor.execute(call("measure", {"word": "four"}))
        slow = await executor.execute(call("slow", {"steps": 3}))
    assert (text.status, text.observation) == (ActionStatus.EXECUTED, "hello")
    # isError: an executed action that failed, whose text the model reads
    assert failed.status is ActionStatus.EXECUTED
    assert failed.observation.startswith("McpToolError: ")
    assert failed.observation.endswith("it failed because the disk is full")
    assert image.observation == "[image: image/png, 70 bytes]"
    assert json.loads(structured.observation) == {"length": 4}
    assert slow.observation == "3 steps done"
    assert [(p.tool, p.progress, p.total) for p in seen] == [
        ("slow", 1.0, 3.0),
        ("slow", 2.0, 3.0),
        ("slow", 3.0, 3.0),
    ]


async def test_an_idempotent_tool_call_carries_the_executions_key_in_meta(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    async with McpToolset(odd_server(ledger)) as toolset:
        definition, request = agent_run(
            [
                '{"tool": "put", "arguments": {"key": "colour", "value": "blue"}}',
                '{"final_answer": "set"}',
            ],
            toolset.registry(),
            "run-key",
            JsonlRunStore(directory=tmp_path / "runs"),
        )
        result = await run(definition, request)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    log = await JsonlRunStore(directory=tmp_path / "runs").read_log("run-key")
    keys = [i.idempotency_key for i in log.intents if i.kind is IntentKind.ACTION]
    assert len(keys) == 1
    assert [line["key"] for line in ledger_lines(ledger)] == keys
    assert IDEMPOTENCY_META_KEY == "polyloop/idempotencyKey"


async def test_show_prints_each_tools_policy_its_reason_and_its_server(tmp_path: Path) -> None:
    async with McpToolset(odd_server(tmp_path / "ledger")) as toolset:
        definition, request = agent_run(
            ['{"final_answer": "nothing to do"}'],
            toolset.registry(),
            "run-show",
            JsonlRunStore(directory=tmp_path / "runs"),
        )
        await run(definition, request)
    [log_file] = (tmp_path / "runs").glob("run-show*")
    shown = await asyncio.to_thread(show, log_file)
    assert "tool replay policies:" in shown
    assert (
        "  put: idempotent  [MCP server odd 1.1.0]  (trusted server: idempotentHint true, "
        "not read-only)"
    ) in shown
    assert "  echo: safe  [MCP server odd 1.1.0]  (trusted server: readOnlyHint true)" in shown


async def test_a_server_that_exits_mid_call_is_in_doubt_naming_it_and_comes_back(
    tmp_path: Path,
) -> None:
    """The call's outcome is unknown (design 0227); the next call starts the server again."""
    async with McpToolset(odd_server(tmp_path / "ledger")) as toolset:
        executor = toolset.registry().executor()
        async with asyncio.timeout(BOUND_SECONDS):  # a hang is a failure, not a wait
            with pytest.raises(ToolOutcomeUnknown) as died:
                await executor.execute(call("die"))
            after = await executor.execute(call("echo", {"text": "x"}))
    assert "MCP server 'odd'" in str(died.value)
    assert "tools/call 'die'" in str(died.value)
    assert after.status is ActionStatus.EXECUTED
    assert after.observation == "x"


async def test_a_run_whose_server_dies_in_a_never_call_stops_open_in_doubt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``die`` is ``NEVER`` (no annotations): the run stops ``resume_state_unknown``, open,
    naming the call (design 0227); the reason naming the server is logged."""
    async with McpToolset(odd_server(tmp_path / "ledger")) as toolset:
        definition, request = agent_run(
            ['{"tool": "die", "arguments": {}}', '{"final_answer": "never"}'],
            toolset.registry(),
            "run-die",
            VolatileRunStore(),
        )
        result = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a0"
    assert result.steps == ()
    assert "MCP server 'odd': the connection closed during tools/call 'die'" in caplog.text


async def test_a_tool_that_hangs_is_cut_by_the_action_bound_and_the_toolset_closes(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    async with (
        asyncio.timeout(BOUND_SECONDS),  # a hang is a failure, not a wait
        McpToolset(odd_server(ledger)) as toolset,
    ):
        definition, request = agent_run(
            ['{"tool": "hang", "arguments": {}}', '{"final_answer": "never"}'],
            toolset.registry(),
            "run-hang",
            VolatileRunStore(),
            action_timeout_seconds=1.0,
        )
        result = await run(definition, request)
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN  # NEVER, cut off: in doubt
    assert result.unknown_outcome == "a0"
    assert [line["tool"] for line in ledger_lines(ledger)] == ["hang"]


async def test_a_server_that_cannot_start_is_refused_naming_it(tmp_path: Path) -> None:
    broken = McpServer.stdio(sys.executable, ["-c", "import sys; sys.exit('no such server')"])
    with pytest.raises(McpConnectionError, match="cannot connect to MCP server 'server0'"):
        async with McpToolset(broken):
            pass


class Crash(BaseException):
    """Stands for the process dying: run() lets it through and the log stays resumable."""


async def test_a_resume_against_a_changed_schema_is_refused_naming_the_tool(
    tmp_path: Path,
) -> None:
    """Refused against variant 2 (a changed schema, annotations and version), naming each key;
    then resumed against the very server it started with, whose snapshot is the same."""
    ledger = tmp_path / "ledger"
    store = JsonlRunStore(directory=tmp_path / "runs")
    replies: list[object] = ['{"tool": "echo", "arguments": {"text": "a"}}', Crash()]
    async with McpToolset(odd_server(ledger, variant=1)) as toolset:
        definition, request = agent_run(replies, toolset.registry(), "run-drift", store)  # type: ignore[arg-type]
        with pytest.raises(Crash):
            await run(definition, request)
    async with McpToolset(odd_server(ledger, variant=2)) as changed:
        definition, request = agent_run(replies, changed.registry(), "run-drift", store)  # type: ignore[arg-type]
        with pytest.raises(ParameterDriftError) as drift:
            await resume(definition, request)
    changed_keys = set(drift.value.changed)
    assert "action_executor.tool.echo.schema" in changed_keys
    assert "action_executor.tool.put.mcp.annotations" in changed_keys
    assert "action_executor.tool.put.replay_policy" in changed_keys
    assert "action_executor.tool.echo.mcp.server_version" in changed_keys
    assert "tool.echo.schema" in str(drift.value)
    async with McpToolset(odd_server(ledger, variant=1)) as same:  # the refusal wrote nothing
        definition, request = agent_run(
            [*replies[:1], '{"final_answer": "ok"}'], same.registry(), "run-drift", store
        )
        resumed = await resume(definition, request)
    assert resumed.stop_reason is StopReason.FINAL_ANSWER


@contextlib.contextmanager
def odd_http_server(ledger: Path) -> Iterator[str]:
    """The odd server on streamable HTTP at 127.0.0.1 (loopback only); its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    errors = (ledger.parent / "http-server.stderr").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(ODD_SERVER), str(ledger), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    try:
        deadline = time.monotonic() + BOUND_SECONDS
        while True:
            with socket.socket() as attempt:
                if attempt.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "the HTTP server exited before it listened"
            assert time.monotonic() < deadline, "the HTTP server did not listen in time"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()
        errors.close()


async def test_streamable_http_lists_calls_and_sends_the_key(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with odd_http_server(ledger) as url:
        server = McpServer.http(url, headers={"X-Test": "1"}, trusted=True)
        async with McpToolset(server) as toolset:
            policies = {spec.name: spec.replay_policy for spec in toolset.specs()}
            executor = toolset.registry().executor()
            echoed = await executor.execute(call("echo", {"text": "over http"}))
            put = await executor.execute(call("put", {"key": "k", "value": "v"}, key="h-1"))
    assert policies["echo"] is ReplayPolicy.SAFE
    assert policies["put"] is ReplayPolicy.IDEMPOTENT
    assert echoed.observation == "over http"
    assert put.status is ActionStatus.EXECUTED
    assert [(line["key"], line["x_test"]) for line in ledger_lines(ledger)] == [("h-1", "1")]


async def test_an_http_server_that_exits_mid_call_is_in_doubt(tmp_path: Path) -> None:
    with odd_http_server(tmp_path / "ledger") as url:
        async with McpToolset(McpServer.http(url, name="web")) as toolset:
            executor = toolset.registry().executor()
            with pytest.raises(ToolOutcomeUnknown) as died:
                await asyncio.wait_for(executor.execute(call("die")), BOUND_SECONDS)
    assert "MCP server 'web'" in str(died.value)
    assert "tools/call 'die'" in str(died.value)


def crashing_after_the_call(registry: ToolRegistry, tool: str) -> ToolRegistry:
    """``registry`` whose ``tool`` makes its call, then dies before the result is recorded."""
    spec = registry.spec_for(tool)
    assert spec is not None
    assert spec.handler is not None
    real = spec.handler

    class Dying:
        takes_context = True

        async def __call__(self, arguments: object, context: object = None, /) -> str:
            await real(arguments, context)  # type: ignore[call-arg]
            raise Crash

    specs = [
        dataclasses.replace(s, handler=Dying()) if s.name == tool else s
        for s in map(registry.spec_for, registry.names())
        if s is not None
    ]
    return ToolRegistry(specs)


@pytest.mark.parametrize(
    ("tool", "arguments", "calls_after_resume", "stop"),
    [
        ("put", {"key": "k", "value": "v"}, 2, StopReason.FINAL_ANSWER),  # IDEMPOTENT: again
        ("append", {"item": "x"}, 1, StopReason.RESUME_STATE_UNKNOWN),  # NEVER: not again
    ],
)
async def test_an_execution_in_doubt_is_resumed_by_its_policy(
    tmp_path: Path,
    tool: str,
    arguments: dict[str, object],
    calls_after_resume: int,
    stop: StopReason,
) -> None:
    ledger = tmp_path / "ledger"
    store = JsonlRunStore(directory=tmp_path / "runs")
    replies = [json.dumps({"tool": tool, "arguments": arguments}), '{"final_answer": "done"}']
    async with McpToolset(odd_server(ledger)) as toolset:
        dying = crashing_after_the_call(toolset.registry(), tool)
        definition, request = agent_run(replies, dying, "run-doubt", store)
        with pytest.raises(Crash):
            await run(definition, request)
    async with McpToolset(odd_server(ledger)) as toolset:
        definition, request = agent_run(replies, toolset.registry(), "run-doubt", store)
        result = await resume(definition, request)
    lines = ledger_lines(ledger)
    assert result.stop_reason is stop
    assert len(lines) == calls_after_resume
    log = await store.read_log("run-doubt")
    [intent] = [i for i in log.intents if i.kind is IntentKind.ACTION]
    assert {line["key"] for line in lines} == {intent.idempotency_key}  # the same key each time


async def test_a_servers_progress_reaches_the_runs_sink_in_order_and_on_progress_too(
    tmp_path: Path,
) -> None:
    """The odd server's ``slow`` reports three steps while it runs (design 0211, amendment);
    the sink is slower than the server, and still gets them in order, before the step's
    event."""
    seen: list[Event | ToolProgress] = []
    called_back: list[McpProgress] = []

    class Sink:
        async def emit(self, event: Event) -> None:
            seen.append(event)

        async def emit_progress(self, progress: ToolProgress) -> None:
            seen.append(progress)
            await asyncio.sleep(0.05)  # slower than the server reports: they queue up

        def parameters(self) -> dict[str, str]:
            return {"kind": "progress-test"}

    async def on_progress(progress: McpProgress) -> None:
        called_back.append(progress)

    server = odd_server(tmp_path / "ledger")
    async with McpToolset(server, on_progress=on_progress) as toolset:
        definition, request = agent_run(
            ['{"tool": "slow", "arguments": {"steps": 3}}', '{"final_answer": "done"}'],
            toolset.registry(),
            "run-progress",
            VolatileRunStore(),
        )
        definition = dataclasses.replace(definition, event_sink=Sink())  # type: ignore[type-var]
        result = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == "3 steps done"
    shape = [
        ("event", s.step.step_idx)
        if isinstance(s, Event)
        else (s.run_id, s.step_idx, s.tool_name, s.progress, s.total, s.message, s.origin)
        for s in seen
    ]
    assert shape == [
        ("run-progress", 0, "slow", 1.0, 3.0, "step 1 of 3", "mcp:odd"),
        ("run-progress", 0, "slow", 2.0, 3.0, "step 2 of 3", "mcp:odd"),
        ("run-progress", 0, "slow", 3.0, 3.0, "step 3 of 3", "mcp:odd"),
        ("event", 0),
        ("event", 1),
    ]
    assert [(p.tool, p.progress) for p in called_back] == [
        ("slow", 1.0),
        ("slow", 2.0),
        ("slow", 3.0),
    ]


async def test_a_sink_without_emit_progress_runs_a_progress_tool_unchanged(
    tmp_path: Path,
) -> None:
    events: list[Event] = []

    class Plain:
        async def emit(self, event: Event) -> None:
            events.append(event)

        def parameters(self) -> dict[str, str]:
            return {"kind": "plain"}

    async with McpToolset(odd_server(tmp_path / "ledger")) as toolset:
        definition, request = agent_run(
            ['{"tool": "slow", "arguments": {"steps": 2}}', '{"final_answer": "done"}'],
            toolset.registry(),
            "run-plain",
            VolatileRunStore(),
        )
        definition = dataclasses.replace(definition, event_sink=Plain())  # type: ignore[type-var]
        result = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == "2 steps done"
    assert [e.step.step_idx for e in events] == [0, 1]


async def test_a_hanging_tool_is_cut_by_the_action_bound_while_progress_is_relayed(
    tmp_path: Path,
) -> None:
    """With a sink that takes progress the call runs under the relay; the action bound still
    cancels it (the relay cancels the call and lets the cancellation through)."""

    class Sink:
        async def emit(self, event: Event) -> None:
            pass

        async def emit_progress(self, progress: ToolProgress) -> None:
            pass

        def parameters(self) -> dict[str, str]:
            return {"kind": "progress-test"}

    async with (
        asyncio.timeout(BOUND_SECONDS),  # a hang is a failure, not a wait
        McpToolset(odd_server(tmp_path / "ledger")) as toolset,
    ):
        definition, request = agent_run(
            ['{"tool": "hang", "arguments": {}}', '{"final_answer": "never"}'],
            toolset.registry(),
            "run-hang-relayed",
            VolatileRunStore(),
            action_timeout_seconds=1.0,
        )
        definition = dataclasses.replace(definition, event_sink=Sink())  # type: ignore[type-var]
        result = await run(definition, request)  # type: ignore[arg-type]
        after = await toolset.registry().executor().execute(call("echo", {"text": "still"}))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert after.observation == "still"  # the connection survived the cancelled call


class ProgressSink:
    """An event sink that takes progress (``ports.ProgressSink``): the relayed call path."""

    def __init__(self) -> None:
        self.progress: list[ToolProgress] = []

    async def emit(self, event: Event) -> None:
        pass

    async def emit_progress(self, progress: ToolProgress) -> None:
        self.progress.append(progress)

    def parameters(self) -> dict[str, str]:
        return {"kind": "progress-test"}


async def test_an_http_server_that_dies_after_its_reply_stream_started_is_in_doubt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK resolves the lost answer with its own ``-32000`` "SSE stream ended without a
    response": that is not the server's answer, so the NEVER call is in doubt (the run stops
    open, design 0227), never an executed failure the model could answer by calling it again;
    resume does not repeat it."""
    ledger = tmp_path / "ledger"
    store = JsonlRunStore(directory=tmp_path / "runs")
    replies = ['{"tool": "die_after_progress", "arguments": {}}', '{"final_answer": "never"}']
    sink = ProgressSink()
    with odd_http_server(ledger) as url:
        server = McpServer.http(url, name="web", trusted=True)
        async with McpToolset(server) as toolset:
            assert toolset.registry().spec_for("die_after_progress").replay_policy is (  # type: ignore[union-attr]
                ReplayPolicy.NEVER
            )
            definition, request = agent_run(replies, toolset.registry(), "run-sse", store)
            definition = dataclasses.replace(definition, event_sink=sink)  # type: ignore[type-var]
            result = await asyncio.wait_for(run(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert [p.message for p in sink.progress] == ["half way"]  # the reply stream had started
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a0"
    assert "MCP server 'web'" in caplog.text
    assert "SSE stream ended without a response" in caplog.text
    with odd_http_server(ledger) as url:
        async with McpToolset(McpServer.http(url, name="web", trusted=True)) as toolset:
            definition, request = agent_run(replies, toolset.registry(), "run-sse", store)
            definition = dataclasses.replace(definition, event_sink=sink)  # type: ignore[type-var]
            resumed = await asyncio.wait_for(resume(definition, request), BOUND_SECONDS)  # type: ignore[arg-type]
    assert resumed.stop_reason is StopReason.RESUME_STATE_UNKNOWN  # nothing repeated
    assert [line["tool"] for line in ledger_lines(ledger)] == ["die_after_progress"]


def silent_server(ledger: Path, never: str, *, bound: float) -> McpServer:
    """The server's Python starts in well under ``bound`` even on a loaded machine."""
    return McpServer.stdio(
        sys.executable,
        [str(ODD_SERVER), str(ledger), "--silent", never],
        connect_timeout_seconds=bound,
    )


@pytest.mark.parametrize(
    ("never", "said"),
    [
        ("initialize", "no handshake within 4.0 s (connect_timeout_seconds)"),
        ("tools/list", "did not answer tools/list within 4.0 s (connect_timeout_seconds)"),
    ],
)
async def test_a_server_that_never_answers_the_handshake_or_the_listing_is_refused_in_time(
    tmp_path: Path, never: str, said: str
) -> None:
    # The refusal comes before this guard (a TimeoutError instead): the handshake's bound,
    # for tools/list one more, plus closing (close_timeout_seconds, 5 s); well under the
    # default connect_timeout_seconds (30 s), so a refusal by the default bound fails too.
    guard = 2 * 4.0 + 2 * 5.0
    with pytest.raises(McpConnectionError) as refused:
        await asyncio.wait_for(
            McpToolset(silent_server(tmp_path / "ledger", never, bound=4.0)).__aenter__(),
            guard,
        )
    message = str(refused.value)
    assert said in message
    assert "stdio: " in message  # the command, not only 'server0'
    assert "--silent" in message


async def test_a_call_a_live_server_never_answers_is_cut_by_call_timeout_seconds(
    tmp_path: Path,
) -> None:
    """No ``action_timeout_seconds`` in the run: ``McpServer.call_timeout_seconds`` bounds the
    call, the outcome is unknown (``ToolOutcomeUnknown``: a ``NEVER`` call stops the run open,
    design 0227) and the connection stays usable."""
    ledger = tmp_path / "ledger"
    server = dataclasses.replace(odd_server(ledger), call_timeout_seconds=1.0)
    async with (
        asyncio.timeout(BOUND_SECONDS),  # a hang is a failure, not a wait
        McpToolset(server) as toolset,
    ):
        executor = toolset.registry().executor()
        with pytest.raises(ToolOutcomeUnknown) as hung:
            await executor.execute(call("hang"))
        after = await executor.execute(call("echo", {"text": "still here"}))
        definition, request = agent_run(
            ['{"tool": "hang", "arguments": {}}', '{"final_answer": "never"}'],
            toolset.registry(),
            "run-call-bound",
            VolatileRunStore(),
        )
        result = await run(definition, request)  # type: ignore[arg-type]
    assert "MCP server 'odd' did not answer tools/call 'hang' within 1.0 s" in str(hung.value)
    assert "call_timeout_seconds" in str(hung.value)
    assert after.observation == "still here"
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a0"


async def test_closing_is_bounded_by_close_timeout_seconds(tmp_path: Path) -> None:
    """A call still running when the toolset closes: leaving takes at most about twice
    ``close_timeout_seconds`` (wait, cancel, wait), whatever the server does. The leaving
    ends before a guard of one *default* bound (a ``TimeoutError`` otherwise): a close that
    waited by the default instead of the 0.5 s asked for would wait that long at least."""
    default = odd_server(tmp_path / "ledger")
    server = dataclasses.replace(default, close_timeout_seconds=0.5)
    assert 2 * server.close_timeout_seconds < default.close_timeout_seconds
    toolset = McpToolset(server)
    await toolset.__aenter__()
    hanging = asyncio.ensure_future(toolset.registry().executor().execute(call("hang")))
    await asyncio.sleep(0.5)
    await asyncio.wait_for(toolset.__aexit__(None, None, None), default.close_timeout_seconds)
    with pytest.raises(ToolOutcomeUnknown):  # cut off mid-call: in doubt (design 0227)
        await asyncio.wait_for(hanging, BOUND_SECONDS)
    refused = await toolset.registry().executor().execute(call("echo", {"text": "x"}))
    assert refused.status is ActionStatus.ENV_ERROR  # never revived after the close
    assert "McpToolset was closed" in refused.observation


async def test_a_closed_toolset_says_so_when_entered_again(tmp_path: Path) -> None:
    toolset = McpToolset(odd_server(tmp_path / "ledger"))
    async with toolset:
        pass
    with pytest.raises(PolyloopValueError, match="opened and closed already.*new McpToolset"):
        await toolset.__aenter__()


async def test_a_failed_connection_names_the_url_without_its_credentials() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"http://user:pw-SECRET@127.0.0.1:{port}/mcp?token=q-SECRET"
    server = McpServer.http(url, headers={"Authorization": "Bearer h-SECRET"}, name="web")
    with pytest.raises(McpConnectionError) as refused:
        await asyncio.wait_for(McpToolset(server).__aenter__(), BOUND_SECONDS)
    message = str(refused.value)
    assert f"'web' (http: http://127.0.0.1:{port}/mcp)" in message
    assert "SECRET" not in message


async def test_no_header_or_env_value_reaches_the_log_or_show(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    store = JsonlRunStore(directory=tmp_path / "runs")
    replies = ['{"tool": "echo", "arguments": {"text": "hi"}}', '{"final_answer": "done"}']
    with odd_http_server(ledger) as url:
        server = McpServer.http(url, headers={"Authorization": "Bearer h-SECRET"}, trusted=True)
        async with McpToolset(server) as toolset:
            definition, request = agent_run(replies, toolset.registry(), "run-http", store)
            await run(definition, request)
    stdio = McpServer.stdio(
        sys.executable, [str(ODD_SERVER), str(ledger)], env={"API_TOKEN": "e-SECRET"}
    )
    async with McpToolset(stdio) as toolset:
        definition, request = agent_run(replies, toolset.registry(), "run-stdio", store)
        await run(definition, request)
    for log_file in sorted((tmp_path / "runs").glob("run-*")):
        assert "SECRET" not in log_file.read_text(encoding="utf-8")
        shown = await asyncio.to_thread(show, log_file)
        assert "tool replay policies:" in shown
        assert not [line for line in shown if "SECRET" in line]


@pytest.mark.parametrize(
    ("variant", "tool", "what"), [(3, "extra", "added"), (4, "append", "removed")]
)
async def test_a_resume_against_a_server_that_added_or_removed_a_tool_is_refused(
    tmp_path: Path, variant: int, tool: str, what: str
) -> None:
    ledger = tmp_path / "ledger"
    store = JsonlRunStore(directory=tmp_path / "runs")
    replies: list[object] = ['{"tool": "echo", "arguments": {"text": "a"}}', Crash()]
    async with McpToolset(odd_server(ledger)) as toolset:
        definition, request = agent_run(replies, toolset.registry(), "run-tools", store)  # type: ignore[arg-type]
        with pytest.raises(Crash):
            await run(definition, request)
    async with McpToolset(odd_server(ledger, variant=variant)) as changed:
        definition, request = agent_run(replies, changed.registry(), "run-tools", store)  # type: ignore[arg-type]
        with pytest.raises(ParameterDriftError) as drift:
            await resume(definition, request)
    moved = drift.value.added if what == "added" else drift.value.removed
    assert f"action_executor.tool.{tool}.schema" in moved
    assert f"tool.{tool}" in str(drift.value)


async def test_an_override_names_the_prefixed_tool(tmp_path: Path) -> None:
    one = McpServer.stdio(sys.executable, [str(ODD_SERVER), str(tmp_path / "a")], name="one")
    two = McpServer.stdio(sys.executable, [str(ODD_SERVER), str(tmp_path / "b")], name="two")
    overrides = {"two_append": ReplayPolicy.IDEMPOTENT}
    async with McpToolset(one, two, prefix=True, overrides=overrides) as toolset:
        policies = {spec.name: spec.replay_policy for spec in toolset.specs()}
    assert policies["two_append"] is ReplayPolicy.IDEMPOTENT
    assert policies["one_append"] is ReplayPolicy.NEVER
    with pytest.raises(PolyloopValueError, match="'append'.*which no server offers"):
        await McpToolset(
            one, two, prefix=True, overrides={"append": ReplayPolicy.SAFE}
        ).__aenter__()


async def test_a_server_that_comes_back_changed_is_not_called(tmp_path: Path) -> None:
    """After the server died, the next call connects again only to the same server: one that
    names itself with another version (``--variant 2``) is refused, nothing sent (design
    0227), so a retry never runs against a tool the run did not record."""
    ledger = tmp_path / "ledger"
    async with McpToolset(odd_server(ledger)) as toolset:
        executor = toolset.registry().executor()
        with pytest.raises(ToolOutcomeUnknown):
            await asyncio.wait_for(executor.execute(call("die")), BOUND_SECONDS)
        address = toolset._connections[0]._address  # the command the next start runs
        address.args = (*address.args[:-1], "2")  # now starts ``--variant 2``
        refused = await asyncio.wait_for(
            executor.execute(call("echo", {"text": "x"})), BOUND_SECONDS
        )
    assert refused.status is ActionStatus.ENV_ERROR
    assert "came back changed" in refused.observation
    assert "1.2.0" in refused.observation
    assert [line["tool"] for line in ledger_lines(ledger)] == ["die"]
