"""``polyloop.Agent`` with a model string, over loopback HTTP (issue 25's acceptance).

The endpoint is the loopback stub, answering as OpenAI and vLLM do (``tool_calls`` with
``content: null``). The agent is ``Agent("openai:...", base_url=...)``: the real
``GatewayModelClient`` on the HTTP client the agent opens for each run, the stock parsers and a
``JsonlRunStore``. The kill is a real SIGKILL of a child process waiting for the model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _openai_stub import OpenAIStub, chat_reply, tool_call_reply

from _infra import skip_unless_available
from polyloop import Agent, tool
from polyloop.parsers import JsonToolCallParser
from polyloop.types import StopReason

pytestmark = pytest.mark.integration

BOUND = 30.0
KEY = "sk-loopback-test"


@tool(replay="safe")
async def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@dataclass
class Answer:
    value: int
    explanation: str


@pytest.fixture
async def stub() -> AsyncIterator[OpenAIStub]:
    async with OpenAIStub() as server:
        yield server


def _agent(stub: OpenAIStub, tmp_path: Path, **options: Any) -> Agent[Any]:
    return Agent(
        "openai:stub-model",
        base_url=stub.base_url,
        api_key=KEY,
        tools=[add],
        store=tmp_path / "runs",
        **options,
    )


def _final(arguments: dict[str, object], call: str = "call_f") -> Any:
    return tool_call_reply((call, "final_result", json.dumps(arguments)))


async def test_a_dataclass_output_type_returns_an_instance(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    stub.enqueue(
        tool_call_reply(("call_a", "add", '{"a": 2, "b": 3}')),
        _final({"value": 5, "explanation": "2 + 3"}),
    )
    async with asyncio.timeout(BOUND):
        result = await _agent(stub, tmp_path, output_type=Answer).run("2 + 3?", run_id="typed")

    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == Answer(value=5, explanation="2 + 3")
    bodies = [request.json() for request in stub.requests]
    offered = {tool["function"]["name"]: tool["function"] for tool in bodies[0]["tools"]}
    assert set(offered) == {"add", "final_result"}
    assert offered["final_result"]["parameters"]["required"] == ["value", "explanation"]
    assert offered["final_result"]["parameters"]["properties"]["value"] == {"type": "integer"}
    assert stub.requests[0].headers["authorization"] == f"Bearer {KEY}"
    finished = json.loads((tmp_path / "runs" / "typed.jsonl").read_text().splitlines()[-1])
    recorded = finished["result"]["final_answer"]
    assert json.loads(recorded) == {"value": 5, "explanation": "2 + 3"}  # the validated JSON


async def test_a_wrong_field_type_is_told_to_the_model_and_then_corrected(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    stub.enqueue(
        _final({"value": "five", "explanation": "2 + 3"}, call="call_1"),
        _final({"value": 5, "explanation": "2 + 3"}, call="call_2"),
    )
    async with asyncio.timeout(BOUND):
        result = await _agent(stub, tmp_path, output_type=Answer).run("2 + 3?", run_id="fix")

    assert result.output == Answer(value=5, explanation="2 + 3")
    assert len(result.steps) == 2
    assert result.steps[0].parse_error
    told = stub.requests[1].json()["messages"][-2:]
    assert told[0]["role"] == "assistant"
    assert told[0]["tool_calls"][0]["function"]["name"] == "final_result"
    assert told[1]["role"] == "tool"
    assert told[1]["tool_call_id"] == "call_1"  # the answer to the call that misfit
    assert "the field 'value' must be integer, got string \"five\"" in told[1]["content"]


async def test_a_pydantic_model_works(stub: OpenAIStub, tmp_path: Path) -> None:
    skip_unless_available(
        importlib.util.find_spec("pydantic") is not None,
        what="pydantic (the Agent duck-types pydantic models; this test needs one)",
        how_to_install='pip install -e ".[dev]" (make install does it)',
    )
    import pydantic

    class Street(pydantic.BaseModel):
        name: str
        number: int

    class Home(pydantic.BaseModel):
        owner: str
        street: Street

    stub.enqueue(
        _final({"owner": "Ada", "street": {"name": "Main", "number": "three"}}, call="call_1"),
        _final({"owner": "Ada", "street": {"name": "Main", "number": 3}}, call="call_2"),
    )
    async with asyncio.timeout(BOUND):
        result = await _agent(stub, tmp_path, output_type=Home).run("Where?", run_id="home")

    assert isinstance(result.output, Home)
    assert result.output.street.number == 3
    offered = stub.requests[0].json()["tools"]
    schema = next(
        t["function"]["parameters"] for t in offered if t["function"]["name"] == "final_result"
    )
    assert schema["$defs"]["Street"]["properties"]["number"]["type"] == "integer"
    told = stub.requests[1].json()["messages"][-1]
    assert told["role"] == "tool"
    assert "street.number" in told["content"]


async def test_with_the_json_parser_the_schema_goes_into_the_instructions(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    answer = {"tool": "final_result", "arguments": {"value": 4, "explanation": "2 + 2"}}
    stub.enqueue(chat_reply(json.dumps(answer)))
    agent = _agent(stub, tmp_path, output_type=Answer, parser=JsonToolCallParser())
    async with asyncio.timeout(BOUND):
        result = await agent.run("2 + 2?", run_id="text")

    assert result.output == Answer(value=4, explanation="2 + 2")
    body = stub.requests[0].json()
    assert "tools" not in body  # a text protocol: no native tool schemas
    system = body["messages"][0]
    assert system["role"] == "system"
    assert '"name": "final_result"' in system["content"]
    assert '"value"' in system["content"]


async def test_a_keyless_local_server_gets_no_authorization_header(
    stub: OpenAIStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
    stub.enqueue(chat_reply("hello"))
    async with asyncio.timeout(BOUND):
        result = await Agent("openai:local", store=tmp_path).run("Say hello", run_id="keyless")
    assert result.output == "hello"
    assert "authorization" not in stub.requests[0].headers


CHILD = """
import sys
from dataclasses import dataclass
from polyloop import Agent, tool

@tool(replay="safe")
async def add(a: int, b: int) -> str:
    \"\"\"Add two integers.\"\"\"
    return str(a + b)

@dataclass
class Answer:
    value: int
    explanation: str

agent = Agent("openai:stub-model", tools=[add], output_type=Answer)
result = agent.run_sync("What is 2 + 3?", run_id="killed")
print(type(result.output).__name__, repr(result.output), result.stop_reason.value)
"""


async def _child(script: Path, stub: OpenAIStub) -> asyncio.subprocess.Process:
    env = {**os.environ, "OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": KEY}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=script.parent,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_the_output_is_rebuilt_after_a_kill_and_a_resume_in_a_new_process(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    script = tmp_path / "agent_child.py"
    script.write_text(CHILD, encoding="utf-8")
    stub.enqueue(
        tool_call_reply(("call_a", "add", '{"a": 2, "b": 3}')),
        chat_reply("never seen", delay=120),  # the child dies waiting for this one
        _final({"value": 5, "explanation": "2 + 3"}),
    )
    doomed = await _child(script, stub)
    try:
        async with asyncio.timeout(BOUND):
            await stub.wait_for_requests(2)
    finally:
        doomed.kill()
        await doomed.communicate()

    async with asyncio.timeout(BOUND * 2):
        resumed = await _child(script, stub)
        out, err = await resumed.communicate()
    assert resumed.returncode == 0, err.decode()
    assert out.decode().split(" ", 1)[0] == "Answer"
    assert "Answer(value=5, explanation='2 + 3') final_answer" in out.decode()
    assert len(stub.requests) == 3  # the lost call was made again, nothing else

    async with asyncio.timeout(BOUND * 2):
        again = await _child(script, stub)
        out_again, err_again = await again.communicate()
    assert again.returncode == 0, err_again.decode()
    assert out_again == out  # a finished run: the stored answer, rebuilt, and no request
    assert len(stub.requests) == 3


# ---------------------------------------------------------------- a server that never answers


@pytest.fixture
async def silent_base_url() -> AsyncIterator[str]:
    """A loopback server that accepts every connection and never answers (issue 36)."""
    writers: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_answers_ends_the_run_with_llm_error_naming_the_bound(
    silent_base_url: str, tmp_path: Path
) -> None:
    from polyloop.stores import JsonlRunStore

    agent = Agent(
        "openai:stub-model",
        base_url=silent_base_url,
        tools=[add],
        store=tmp_path / "runs",
        model_call_timeout_seconds=0.5,
    )
    async with asyncio.timeout(BOUND):  # a safety net against the hang, not a measurement
        result = await agent.run("What is 2 + 3?", run_id="silent-1")
    assert result.stop_reason is StopReason.LLM_ERROR
    assert result.output is None
    log = await JsonlRunStore(directory=str(tmp_path / "runs")).read_log("silent-1")
    failure = log.model_results[0].failure
    assert failure is not None
    assert "model_call_timeout_seconds" in failure
    assert "0.5 s" in failure


async def test_a_gateway_connection_read_bound_fails_the_call_on_a_silent_server(
    silent_base_url: str,
) -> None:
    from polyloop.adapters import GatewayConnection, GatewaySettings, GatewayTimeoutError
    from polyloop.ports import ModelCall
    from polyloop.types import Message

    settings = GatewaySettings(base_url=silent_base_url, model="stub-model")
    call = ModelCall(
        messages=(Message.user("hello"),), call_index=0, run_id="r", result_id="m0", binding={}
    )
    async with GatewayConnection(settings, read_timeout_seconds=0.5) as connection:
        assert connection.read_timeout_seconds == 0.5
        async with asyncio.timeout(BOUND):  # a safety net against the hang, not a measurement
            with pytest.raises(GatewayTimeoutError) as caught:
                await connection.model_client.call(call)
    assert caught.value.phase == "read"
    assert caught.value.seconds == 0.5
