"""Native tool calls end to end over loopback HTTP (issue 12's first acceptance point).

The loopback server answers the way OpenAI and vLLM do: ``tool_calls`` with ``content: null``
and ``finish_reason: "tool_calls"``. The agent is the real ``GatewayModelClient``, the stock
``NativeToolCallParser``, a registry executor and a ``JsonlRunStore``; the kill is a real
SIGKILL of a child process in the middle of a tool's side effect.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _native_agent import IN_FLIGHT, RUN_ID, definition, ledger_lines, request
from _openai_stub import OpenAIStub, chat_reply, tool_call_reply

from polyloop.session import resume, run
from polyloop.types import ActionStatus, StopReason

pytestmark = pytest.mark.integration

AGENT = Path(__file__).resolve().parent / "_native_agent.py"
BOUND = 30.0
THREE_CALLS = (
    ("call_a1", "search", '{"text": "polyloop"}'),
    ("call_b2", "fetch", '{"text": "https://example.invalid/a"}'),
    ("call_c3", "write_note", '{"text": "three tools, one at a time"}'),
)


@pytest.fixture
async def stub() -> AsyncIterator[OpenAIStub]:
    async with OpenAIStub() as server:
        yield server


def _log(runs_dir: Path, run_id: str) -> list[dict[str, Any]]:
    lines = (runs_dir / f"{run_id}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "event-stream"])
async def test_a_three_tool_run_completes_and_answers_every_call_by_id(
    stub: OpenAIStub, tmp_path: Path, stream: bool
) -> None:
    stub.enqueue(
        *(tool_call_reply(call, call_id=f"chatcmpl-{i}") for i, call in enumerate(THREE_CALLS)),
        chat_reply("All three tools ran.", call_id="chatcmpl-3"),
    )
    ledger = tmp_path / "ledger.jsonl"
    async with httpx.AsyncClient(timeout=10) as http:
        agent = definition(http, stub.base_url, tmp_path, stream=stream)
        async with asyncio.timeout(BOUND):
            result = await run(agent, request(ledger, run_id="three"))

    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.final_answer == "All three tools ran."
    assert [line["tool"] for line in ledger_lines(ledger)] == ["search", "fetch", "write_note"]
    assert [step.action_status for step in result.steps[:3]] == [ActionStatus.EXECUTED] * 3

    bodies = [received.json() for received in stub.requests]
    assert len(bodies) == 4
    for body in bodies:
        assert [tool["function"]["name"] for tool in body["tools"]] == [
            "search",
            "fetch",
            "write_note",
        ]
        assert body["parallel_tool_calls"] is False
        assert body.get("stream", False) is stream
    for k in range(1, 4):
        previous, current = bodies[k - 1]["messages"], bodies[k]["messages"]
        # Prefix stability: each request is the previous one plus the step's two turns.
        assert current[: len(previous)] == previous
        call_id, name, arguments = THREE_CALLS[k - 1]
        assert current[len(previous) :] == [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": f"{name} done with {json.dumps(json.loads(arguments), sort_keys=True)}",
            },
        ]

    records = _log(tmp_path, "three")
    replies = [r["reply"] for r in records if r["record"] == "model_call_result"]
    assert [reply["tool_calls"] for reply in replies[:3]] == [
        [{"id": i, "name": n, "arguments": a}] for i, n, a in THREE_CALLS
    ]
    assert [reply["content"] for reply in replies] == ["", "", "", "All three tools ran."]
    assert [reply["finish_reason"] for reply in replies] == ["tool_calls"] * 3 + ["stop"]
    steps = [r["step"] for r in records if r["record"] == "step_completed"]
    assert [step["tool_calls"] for step in steps] == [
        *([{"id": i, "name": n, "arguments": a}] for i, n, a in THREE_CALLS),
        [],
    ]


async def test_several_calls_in_one_reply_run_nothing_and_the_model_is_told(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    stub.enqueue(
        tool_call_reply(THREE_CALLS[0], THREE_CALLS[2]),
        tool_call_reply(THREE_CALLS[0]),
        chat_reply("done"),
    )
    ledger = tmp_path / "ledger.jsonl"
    async with httpx.AsyncClient(timeout=10) as http:
        async with asyncio.timeout(BOUND):
            result = await run(
                definition(http, stub.base_url, tmp_path), request(ledger, run_id="many")
            )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert [line["tool"] for line in ledger_lines(ledger)] == ["search"]
    second = stub.requests[1].json()["messages"]
    answers = second[-2:]
    assert [m["tool_call_id"] for m in answers] == ["call_a1", "call_c3"]
    assert all("none of them was run" in m["content"] for m in answers)


# --------------------------------------------------------------------------- SIGKILL


async def _run_child_until_in_flight(
    stub: OpenAIStub, tmp_path: Path, stall: str
) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(AGENT),
        "--base-url",
        stub.base_url,
        "--runs-dir",
        str(tmp_path),
        "--ledger",
        str(tmp_path / "ledger.jsonl"),
        "--stall",
        stall,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(BOUND):
            line = (await process.stdout.readline()).decode()
        assert line.startswith(IN_FLIGHT), (line, await _stderr(process))
        process.kill()
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == -9
    return process


async def _stderr(process: asyncio.subprocess.Process) -> str:
    process.kill()
    assert process.stderr is not None
    return (await process.stderr.read()).decode(errors="replace")


async def test_killed_inside_a_never_tool_resume_does_not_run_it_again(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    stub.enqueue(tool_call_reply(THREE_CALLS[2]))
    await _run_child_until_in_flight(stub, tmp_path, "write_note")
    ledger = tmp_path / "ledger.jsonl"
    assert [line["tool"] for line in ledger_lines(ledger)] == ["write_note"]

    async with httpx.AsyncClient(timeout=10) as http:
        async with asyncio.timeout(BOUND):
            result = await resume(definition(http, stub.base_url, tmp_path), request(ledger))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert [line["tool"] for line in ledger_lines(ledger)] == ["write_note"]
    assert len(stub.requests) == 1  # resume made no model call either


async def test_killed_inside_a_safe_tool_resume_replays_it_and_never_repeats_the_never_tool(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    stub.enqueue(
        tool_call_reply(THREE_CALLS[2]),  # step 0: write_note (NEVER) runs in the child
        tool_call_reply(THREE_CALLS[0]),  # step 1: search (SAFE), killed in flight
        chat_reply("done after the kill"),  # step 2: answered to the resumed process
    )
    await _run_child_until_in_flight(stub, tmp_path, "search")
    ledger = tmp_path / "ledger.jsonl"
    assert [line["tool"] for line in ledger_lines(ledger)] == ["write_note", "search"]

    async with httpx.AsyncClient(timeout=10) as http:
        async with asyncio.timeout(BOUND):
            result = await resume(definition(http, stub.base_url, tmp_path), request(ledger))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    tools = [line["tool"] for line in ledger_lines(ledger)]
    assert tools == ["write_note", "search", "search"]  # SAFE replayed, NEVER exactly once
    assert tools.count("write_note") == 1
    # The resumed process's request answers both earlier calls by id, as the protocol demands.
    resumed = stub.requests[2].json()["messages"]
    assert [m.get("tool_call_id") for m in resumed if m["role"] == "tool"] == [
        "call_c3",
        "call_a1",
    ]
    assert [step.action_status for step in result.steps] == [
        ActionStatus.EXECUTED,
        ActionStatus.EXECUTED,
        None,
    ]
    records = _log(tmp_path, RUN_ID)
    assert sum(1 for r in records if r["record"] == "run_finished") == 1
