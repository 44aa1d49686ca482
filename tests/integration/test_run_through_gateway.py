"""A whole run() through the real GatewayModelClient and a loopback OpenAI-compatible server.

This is the library end to end over real HTTP: prompts go out as Chat Completions requests,
replies come back as steps, and the log records what happened.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from _openai_stub import OpenAIStub, chat_reply, error_reply

from _shared_doubles import TEXTS
from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import Action, FinalAnswer, ParsedReply
from polyloop.session import AgentDefinition, RunRequest, run
from polyloop.sinks import NullEventSink
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
    TextBlock,
)

pytestmark = pytest.mark.integration


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


async def run_against(  # type: ignore[no-untyped-def]
    stub: OpenAIStub,
    directory: Path,
    run_id: str,
    binding: Mapping[str, str],
    *,
    budget: Budget | None = None,
):
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
            event_sink=NullEventSink(),
            synthetic_observations=TEXTS,
        )
        request = make_request(run_id, binding)
        if budget is not None:
            request = dataclasses.replace(request, budget=budget)
        result = await run(agent, request)
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


def _usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, object]:
    usage: dict[str, object] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


async def test_usage_and_timing_reach_the_log_and_the_result(tmp_path: Path) -> None:
    async with OpenAIStub() as stub:
        stub.enqueue(
            chat_reply("one", usage=_usage(40, 3), delay=0.03),
            chat_reply("two", usage=_usage(50, 4, cached=40), finish_reason="length"),
            chat_reply("DONE counted", usage=None),
        )
        result, log = await run_against(stub, tmp_path, "http-usage", {})
    assert result.stop_reason is StopReason.FINAL_ANSWER
    replies = [r.reply for r in log.model_results]
    assert [None if r is None else r.finish_reason for r in replies] == ["stop", "length", "stop"]
    assert [s.usage for s in result.steps][2] is None
    first, second = result.steps[0].usage, result.steps[1].usage
    assert first is not None
    assert (first.prompt_tokens, first.completion_tokens) == (40, 3)
    assert first.cached_tokens is None
    assert second is not None
    assert second.cached_tokens == 40
    durations = [r.duration_ms for r in log.model_results]
    assert all(d is not None for d in durations)
    assert durations[0] is not None
    assert durations[0] >= 30
    assert [s.model_ms for s in result.steps] == durations
    assert result.steps[0].action_ms is not None
    assert result.steps[2].action_ms is None
    totals = result.totals
    assert (totals.prompt_tokens, totals.completion_tokens, totals.cached_tokens) == (90, 7, 40)
    assert totals.steps_without_usage == 1
    # What the JSONL file says, read as plain JSON (what an inspector sees).
    lines = (tmp_path / "http-usage.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    finished = records[-1]["result"]["steps"]
    assert finished[1]["usage"] == {
        "prompt_tokens": 50,
        "completion_tokens": 4,
        "cached_tokens": 40,
    }


async def test_a_context_length_refusal_ends_the_run_with_its_own_reason(tmp_path: Path) -> None:
    refusal = (
        '{"error": {"code": 400, "message": "the request exceeds the available context size '
        '(8192 tokens), try increasing it", "type": "exceed_context_size_error"}}'
    )
    async with OpenAIStub() as stub:
        stub.enqueue(chat_reply("one", usage=_usage(40, 3)), error_reply(400, body=refusal))
        result, log = await run_against(stub, tmp_path, "http-ctx", {})
    assert result.stop_reason is StopReason.CONTEXT_LENGTH_EXCEEDED
    last = log.model_results[-1]
    assert last.context_length_exceeded is True
    assert last.failure is not None
    assert last.failure.startswith("GatewayContextLengthError")
    assert "8192" in last.failure


async def test_another_http_400_stays_an_llm_error(tmp_path: Path) -> None:
    async with OpenAIStub() as stub:
        stub.enqueue(error_reply(400, body='{"error": {"message": "unknown field foo"}}'))
        result, log = await run_against(stub, tmp_path, "http-400", {})
    assert result.stop_reason is StopReason.LLM_ERROR
    assert log.model_results[0].context_length_exceeded is False


async def test_the_token_budget_stops_a_run_over_http(tmp_path: Path) -> None:
    budget = Budget(
        max_steps=5,
        max_actions=5,
        max_consecutive_parse_failures=2,
        max_prompt_chars=10_000,
        max_total_tokens=100,
    )
    async with OpenAIStub() as stub:
        stub.enqueue(*(chat_reply(f"n{i}", usage=_usage(40, 10)) for i in range(4)))
        result, _ = await run_against(stub, tmp_path, "http-tokens", {}, budget=budget)
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert len(result.steps) == 2
    assert result.totals.total_tokens == 100


async def test_each_model_call_carries_its_recorded_key_when_the_gateway_asks_for_one(
    tmp_path: Path,
) -> None:
    """Issue 21, item 1: the key of every model call reaches the gateway as a header (when the
    settings name one) and is the very key its intent records (design 0205, 0207)."""
    async with OpenAIStub() as stub:
        stub.enqueue(chat_reply("one", call_id="c-1"), chat_reply("DONE ok", call_id="c-2"))
        async with httpx.AsyncClient(timeout=10) as http:
            client = GatewayModelClient(
                client=http,
                settings=GatewaySettings(
                    base_url=stub.base_url,
                    model="stub-model",
                    idempotency_key_header="Idempotency-Key",
                ),
            )
            agent = AgentDefinition(
                model_client=client,
                decision_parser=LineParser(),
                store=JsonlRunStore(directory=tmp_path),
                synthetic_observations=TEXTS,
            )
            result = await run(agent, make_request("keyed-1", {}))
            log = await agent.store.read_log("keyed-1")
        sent = [request.headers.get("idempotency-key") for request in stub.requests]
    assert result.stop_reason is StopReason.FINAL_ANSWER
    recorded = [i.idempotency_key for i in log.intents if i.result_id.startswith("m")]
    assert sent == recorded
    assert len(set(sent)) == 2
