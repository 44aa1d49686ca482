"""A whole run() through the real GatewayModelClient and a loopback OpenAI-compatible server.

This is the library end to end over real HTTP: prompts go out as Chat Completions requests,
replies come back as steps, and the log records what happened.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from _openai_stub import OpenAIStub, chat_reply, error_reply

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import Action, Event, FinalAnswer, ParsedReply
from polyloop.session import AgentDefinition, RunRequest, run
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
    SyntheticObservations,
    TextBlock,
)

pytestmark = pytest.mark.integration

TEXTS = SyntheticObservations(
    action_rejected="[rejected]", env_failed="[env failed]", model_call_failed="[model failed]"
)


class LineParser:
    """``DONE <answer>`` is a final answer; anything else is a code action."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        if reply.content.startswith("DONE "):
            return ParsedReply(
                history_text=reply.content, decision=FinalAnswer(text=reply.content[5:])
            )
        return ParsedReply(history_text=reply.content, decision=Action(text=reply.content))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "line"}


class EchoExecutor:
    async def execute(self, action: Action) -> ActionOutcome:
        return ActionOutcome(
            status=ActionStatus.EXECUTED,
            observation=f"ran {action.text}",
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "echo"}


class NullSink:
    async def emit(self, event: Event) -> None:
        return None

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "null"}


def make_request(run_id: str, binding: Mapping[str, str]) -> RunRequest:
    return RunRequest(
        run_id=run_id,
        budget=Budget(
            max_steps=5, max_actions=5, max_consecutive_parse_failures=2, max_prompt_chars=10_000
        ),
        action_executor=EchoExecutor(),
        context=Context(
            goal_level=(Message(role=Role.USER, content=(TextBlock(text="Count to two."),)),)
        ),
        model_replay_policy=ReplayPolicy.SAFE,
        model_binding=binding,
        observation_template="-> {observation}",
    )


async def run_against(stub: OpenAIStub, directory: Path, run_id: str, binding: Mapping[str, str]):  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(timeout=10) as http:
        client = GatewayModelClient(
            client=http,
            settings=GatewaySettings(
                base_url=stub.base_url, model="stub-model", sampling={"temperature": 0.0}
            ),
        )
        agent = AgentDefinition(
            model_client=client,
            decision_parser=LineParser(),
            store=JsonlRunStore(directory=directory),
            event_sink=NullSink(),
            synthetic_observations=TEXTS,
        )
        result = await run(agent, make_request(run_id, binding))
        log = await agent.store.read_log(run_id)
    return result, log


async def test_a_three_step_run_over_http(tmp_path: Path) -> None:
    async with OpenAIStub() as stub:
        stub.enqueue(
            chat_reply("one", call_id="c-1", reasoning_content="thinking about one"),
            chat_reply("two", call_id="c-2"),
            chat_reply("DONE counted", call_id=""),
        )
        result, log = await run_against(
            stub, tmp_path, "http-1", {"task": "t1", "gateway.user": "alice"}
        )
        bodies = [request.json() for request in stub.requests]

    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.final_answer == "counted"
    assert [s.call_id for s in result.steps] == ["c-1", "c-2", None]
    assert result.steps[0].thinking_chars == len("thinking about one")
    assert [b["model"] for b in bodies] == ["stub-model"] * 3
    assert all(b["temperature"] == 0.0 and b["user"] == "alice" for b in bodies)
    assert all("task" not in b for b in bodies), "plain binding keys are coordinates, not sent"
    messages = [b["messages"] for b in bodies]
    assert messages[1][: len(messages[0])] == messages[0]
    assert messages[2][: len(messages[1])] == messages[1]
    assert messages[2][-2:] == [
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "-> ran two"},
    ]
    assert log.started is not None
    snapshot = log.started.parameter_snapshot
    assert snapshot["model_client.model"] == "stub-model"
    assert snapshot["request.binding.gateway.user"] == "alice"
    assert json.loads(snapshot["model_client.sampling"]) == {"temperature": 0.0}


async def test_an_http_error_ends_the_run_with_llm_error_and_keeps_the_status(
    tmp_path: Path,
) -> None:
    async with OpenAIStub() as stub:
        stub.enqueue(chat_reply("one"), error_reply(503, body="upstream overloaded"))
        result, log = await run_against(stub, tmp_path, "http-2", {})
    assert result.stop_reason is StopReason.LLM_ERROR
    assert len(result.steps) == 2
    failure = log.model_results[1].failure
    assert failure is not None
    assert "503" in failure
    assert "upstream overloaded" in failure


async def test_a_refused_binding_fails_at_step_zero_before_anything_is_sent(tmp_path: Path) -> None:
    async with OpenAIStub() as stub:
        result, log = await run_against(stub, tmp_path, "http-3", {"gateway.model": "other"})
        assert stub.requests == []
    assert result.stop_reason is StopReason.LLM_ERROR
    assert len(result.steps) == 1
    failure = log.model_results[0].failure
    assert failure is not None
    assert failure.startswith("PolyloopValueError")
    assert "gateway.model" in failure
