"""``GatewayModelClient`` against a real OpenAI-compatible endpoint.

Off by default: the suite deselects the ``e2e`` marker, and even with ``-m e2e`` these tests
skip unless ``POLYLOOP_E2E=1``. Configure the endpoint through the environment (``.env.example``
lists the keys):

* ``POLYLOOP_E2E_BASE_URL`` - the API root, e.g. ``http://127.0.0.1:8080/v1`` (required)
* ``POLYLOOP_E2E_MODEL`` - the model name the endpoint serves (required)
* ``POLYLOOP_E2E_API_KEY`` - sent as ``Authorization: Bearer <key>`` when set (optional)

Run: ``POLYLOOP_E2E=1 POLYLOOP_E2E_BASE_URL=... POLYLOOP_E2E_MODEL=... pytest -m e2e``.
For the local llama.cpp server of ``research-wiki/explanation/soak-harness.md`` (started with
``--chat_format gemma``)::

    POLYLOOP_E2E=1 POLYLOOP_E2E_BASE_URL=http://127.0.0.1:8080/v1 \
    POLYLOOP_E2E_MODEL=gemma-3-270m .venv/bin/python -m pytest -m e2e tests/e2e

A reply that is empty or repeats the prompt fails with the likely cause (the server's chat
template; ``_reply_judge``), and the multi-step run must show the model's replies changing
from step to step and the endpoint's usage figures in the log.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest
from _reply_judge import judge_reply

from _shared_doubles import TEXTS
from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import Action, ModelCall, ParsedReply
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

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("POLYLOOP_E2E") != "1",
        reason="needs a real model endpoint: set POLYLOOP_E2E=1, POLYLOOP_E2E_BASE_URL and "
        "POLYLOOP_E2E_MODEL (optionally POLYLOOP_E2E_API_KEY) and run with -m e2e",
    ),
]


def _required(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(f"POLYLOOP_E2E=1 but {name} is not set; see .env.example for the keys")
    return value


@pytest.fixture
def settings() -> GatewaySettings:
    return GatewaySettings(
        base_url=_required("POLYLOOP_E2E_BASE_URL"),
        model=_required("POLYLOOP_E2E_MODEL"),
        sampling={"temperature": 0.0, "max_tokens": 32},
    )


def _where(settings: GatewaySettings) -> str:
    return f"model {settings.model!r} at {settings.base_url}"


QUESTION = "Question: what is 2 + 2?\nAnswer with one number:"


def _question_call() -> ModelCall:
    return ModelCall(
        messages=(Message(role=Role.USER, content=(TextBlock(text=QUESTION),)),),
        call_index=0,
        run_id="e2e-gateway",
        result_id="m0",
        binding={"suite": "e2e"},
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    api_key = os.environ.get("POLYLOOP_E2E_API_KEY", "").strip()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(120.0)) as client:
        yield client


async def test_one_real_call_returns_a_reply(
    http: httpx.AsyncClient, settings: GatewaySettings
) -> None:
    gateway = GatewayModelClient(client=http, settings=settings)
    reply = await gateway.call(_question_call())
    assert isinstance(reply, ModelReply)
    assert reply.call_id is None or reply.call_id != ""
    verdict = judge_reply(
        prompt=QUESTION, content=reply.content, thinking=reply.thinking, where=_where(settings)
    )
    assert verdict is None, verdict
    assert reply.usage is not None, f"{_where(settings)} reported no usage"
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens > 0
    assert reply.finish_reason is not None
    api_key = os.environ.get("POLYLOOP_E2E_API_KEY", "").strip()
    if api_key:
        assert not any(api_key in value for value in gateway.parameters().values())


async def test_streaming_records_the_same_reply_as_a_plain_call(
    http: httpx.AsyncClient, settings: GatewaySettings
) -> None:
    plain = await GatewayModelClient(client=http, settings=settings).call(_question_call())
    streamed_settings = dataclasses.replace(settings, stream=True)
    streamed = await GatewayModelClient(client=http, settings=streamed_settings).call(
        _question_call()
    )
    # Temperature 0: the same tokens either way. Ids differ per call; usage only where the
    # server honours stream_options.include_usage.
    assert (streamed.content, streamed.thinking) == (plain.content, plain.thinking)
    assert streamed.finish_reason == plain.finish_reason
    if streamed.usage is not None and plain.usage is not None:
        assert streamed.usage.completion_tokens == plain.usage.completion_tokens


class _EveryReplyIsAnAction:
    """A real small model follows no format reliably, so every reply counts as an action."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        return ParsedReply(history_text=reply.content, decision=Action(text=reply.content))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "every_reply_is_an_action"}


class _Notebook:
    """Each observation asks a new question, so a model that reads its history answers
    differently at every step (a real small model repeats itself when the input stays alike)."""

    _ITEMS = ("apple", "river", "violin", "mountain", "candle")

    def __init__(self) -> None:
        self._step = 0

    async def execute(self, action: Action) -> ActionOutcome:
        self._step += 1
        item = self._ITEMS[self._step % len(self._ITEMS)]
        return ActionOutcome(
            status=ActionStatus.EXECUTED,
            observation=f"Noted. Question {self._step + 1}: what colour is a {item}?",
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "notebook"}


async def test_a_real_three_step_run(
    http: httpx.AsyncClient, settings: GatewaySettings, tmp_path: Path
) -> None:
    agent = AgentDefinition(
        model_client=GatewayModelClient(client=http, settings=settings),
        decision_parser=_EveryReplyIsAnAction(),
        store=JsonlRunStore(directory=tmp_path),
        event_sink=NullEventSink(),
        synthetic_observations=TEXTS,
    )
    request = RunRequest(
        run_id="e2e-three-steps",
        budget=Budget(
            max_steps=3, max_actions=3, max_consecutive_parse_failures=3, max_prompt_chars=50_000
        ),
        action_executor=_Notebook(),
        context=Context(
            goal_level=(
                Message(
                    role=Role.USER,
                    content=(TextBlock(text="Question 1: what colour is the sky?"),),
                ),
            )
        ),
        model_replay_policy=ReplayPolicy.SAFE,
        observation_template="({observation})\n",
    )
    result = await run(agent, request)
    assert result.stop_reason is StopReason.STEP_BUDGET
    assert len(result.steps) == 3
    assert all(step.action_status is ActionStatus.EXECUTED for step in result.steps)
    log = await agent.store.read_log("e2e-three-steps")
    assert [r.failure for r in log.model_results] == [None, None, None]
    assert log.finished is not None
    replies = [r.reply for r in log.model_results]
    contents = [reply.content for reply in replies if reply is not None]
    for index, reply in enumerate(replies):
        assert reply is not None
        prompt = "".join(
            block.text for message in request.context.goal_level for block in message.content
        )
        verdict = judge_reply(
            prompt=prompt, content=reply.content, thinking=reply.thinking, where=_where(settings)
        )
        assert verdict is None, f"step {index}: {verdict}"
    for index in range(1, len(contents)):
        assert contents[index] != contents[index - 1], (
            f"steps {index - 1} and {index} got the same reply {contents[index]!r}: the model "
            "does not see its growing history (check the chat template) or is stuck repeating"
        )
    # The endpoint's own figures are on record, step by step and summed.
    for step, model_result in zip(result.steps, log.model_results, strict=True):
        assert step.usage is not None, f"step {step.step_idx}: the endpoint reported no usage"
        assert step.usage.prompt_tokens > 0
        assert step.usage.completion_tokens > 0
        assert step.model_ms is not None
        assert step.model_ms == model_result.duration_ms
        assert step.action_ms is not None
    prompts = [step.usage.prompt_tokens for step in result.steps if step.usage is not None]
    assert prompts == sorted(prompts), "the prompt grows each step"
    assert prompts[0] < prompts[-1], "the prompt grows each step"
    totals = result.totals
    assert totals.steps_without_usage == 0
    assert totals.prompt_tokens == sum(prompts)
    assert totals.model_ms > 0
