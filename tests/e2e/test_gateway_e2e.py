"""``GatewayModelClient`` against a real OpenAI-compatible endpoint.

Off by default: the suite deselects the ``e2e`` marker, and even with ``-m e2e`` these tests
skip unless ``POLYLOOP_E2E=1``. Configure the endpoint through the environment (``.env.example``
lists the keys):

* ``POLYLOOP_E2E_BASE_URL`` - the API root, e.g. ``http://127.0.0.1:8080/v1`` (required)
* ``POLYLOOP_E2E_MODEL`` - the model name the endpoint serves (required)
* ``POLYLOOP_E2E_API_KEY`` - sent as ``Authorization: Bearer <key>`` when set (optional)

Run: ``POLYLOOP_E2E=1 POLYLOOP_E2E_BASE_URL=... POLYLOOP_E2E_MODEL=... pytest -m e2e``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import Action, Event, ModelCall, ParsedReply
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
    call = ModelCall(
        messages=(
            Message(
                role=Role.USER,
                content=(TextBlock(text="Question: what is 2 + 2?\nAnswer with one number:"),),
            ),
        ),
        call_index=0,
        run_id="e2e-gateway",
        result_id="m0",
        binding={"suite": "e2e"},
    )
    reply = await gateway.call(call)
    assert isinstance(reply, ModelReply)
    assert reply.call_id is None or reply.call_id != ""
    assert (reply.content + reply.thinking).strip(), "a real model should say something"
    api_key = os.environ.get("POLYLOOP_E2E_API_KEY", "").strip()
    if api_key:
        assert not any(api_key in value for value in gateway.parameters().values())


class _EveryReplyIsAnAction:
    """A real small model follows no format reliably, so every reply counts as an action."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        return ParsedReply(history_text=reply.content, decision=Action(text=reply.content))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "every_reply_is_an_action"}


class _Notebook:
    async def execute(self, action: Action) -> ActionOutcome:
        return ActionOutcome(
            status=ActionStatus.EXECUTED,
            observation=f"noted {len(action.text)} characters",
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "notebook"}


class _QuietSink:
    async def emit(self, event: Event) -> None:
        return None

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "quiet"}


async def test_a_real_three_step_run(
    http: httpx.AsyncClient, settings: GatewaySettings, tmp_path: Path
) -> None:
    agent = AgentDefinition(
        model_client=GatewayModelClient(client=http, settings=settings),
        decision_parser=_EveryReplyIsAnAction(),
        store=JsonlRunStore(directory=tmp_path),
        event_sink=_QuietSink(),
        synthetic_observations=SyntheticObservations(
            action_rejected="[rejected]", env_failed="[env failed]", model_call_failed="[failed]"
        ),
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
                    content=(TextBlock(text="Count upwards, one number per reply.\n1\n"),),
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
