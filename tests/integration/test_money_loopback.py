"""Money on record over loopback HTTP (issue 37's acceptance, design 0236).

The endpoint is the loopback OpenAI-compatible stub reporting usage (prompt, completion and
cached tokens) on every reply; the client is the real ``GatewayModelClient``. The recorded cost
of every call equals its tokens times the prices, exactly, in a run interrupted inside a model
call and resumed as in one that was not; a cost budget refuses a call whose ``max_tokens``
could cross it without sending anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from _openai_stub import OpenAIStub, chat_reply

from _shared_doubles import TEXTS, TinyParser
from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import Action, ModelCall
from polyloop.session import AgentDefinition, Pricing, RunRequest, resume, run
from polyloop.stores import JsonlRunStore
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    StopReason,
)

pytestmark = pytest.mark.integration

BOUND = 30.0
PRICING = Pricing.from_mapping(
    {"stub-model": {"input": "0.15", "cached_input": "0.075", "output": "0.60"}}
)
USAGES = [(1234 + 97 * i, 17 + 5 * i, 512 * (i % 2)) for i in range(6)]
"""(prompt, completion, cached) tokens of each reply."""


class Crash(BaseException):
    """The process dying inside a model call: not an ``Exception``, so it leaves ``run()``
    with the call's intent on record and no result."""


class CrashOnce:
    """The gateway client, except that call ``at`` raises ``Crash`` once before sending."""

    def __init__(self, inner: GatewayModelClient, at: int) -> None:
        self.inner = inner
        self.at: int | None = at

    async def call(self, call: ModelCall) -> ModelReply:
        if call.call_index == self.at:
            self.at = None
            raise Crash
        return await self.inner.call(call)

    def parameters(self) -> Mapping[str, str]:
        return self.inner.parameters()


class Executor:
    async def execute(self, action: Action) -> ActionOutcome:
        return ActionOutcome(
            status=ActionStatus.EXECUTED,
            observation=f"ran {action.text}",
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "loopback-code"}


@pytest.fixture
async def stub() -> AsyncIterator[OpenAIStub]:
    async with OpenAIStub() as server:
        yield server


def _script(stub: OpenAIStub) -> None:
    for prompt, completion, cached in USAGES:
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        stub.enqueue(chat_reply("code:x", usage=usage))


def _expected(index: int) -> Decimal:
    prompt, completion, cached = USAGES[index]
    return (
        Decimal(prompt - cached) * Decimal("0.15")
        + Decimal(cached) * Decimal("0.075")
        + Decimal(completion) * Decimal("0.60")
    ) / Decimal(1_000_000)


def _request(run_id: str, budget: Budget) -> RunRequest:
    return RunRequest(
        run_id=run_id,
        context=Context(goal_level=(Message.user("Do the task."),)),
        model_replay_policy=ReplayPolicy.SAFE,
        budget=budget,
        action_executor=Executor(),
        pricing=PRICING,
    )


def _definition(client: object, directory: Path) -> AgentDefinition:
    return AgentDefinition(
        model_client=client,  # type: ignore[arg-type]
        decision_parser=TinyParser(),
        store=JsonlRunStore(directory=directory),
        synthetic_observations=TEXTS,
    )


def _settings(stub: OpenAIStub, **sampling: object) -> GatewaySettings:
    return GatewaySettings(base_url=stub.base_url, model="stub-model", sampling=sampling)


async def test_every_recorded_cost_is_tokens_times_prices_across_a_resume(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    budget = Budget(max_steps=6, max_actions=6)
    async with httpx.AsyncClient() as http, asyncio.timeout(BOUND):
        gateway = GatewayModelClient(client=http, settings=_settings(stub))
        _script(stub)
        whole = await run(_definition(gateway, tmp_path / "a"), _request("whole", budget))
        _script(stub)
        interrupted = _definition(CrashOnce(gateway, at=3), tmp_path / "b")
        with pytest.raises(Crash):
            await run(interrupted, _request("cut", budget))
        sent_before_resume = len(stub.requests)
        resumed = await resume(_definition(gateway, tmp_path / "b"), _request("cut", budget))

    expected = [_expected(i) for i in range(6)]
    assert whole.stop_reason is resumed.stop_reason is StopReason.STEP_BUDGET
    assert [step.cost for step in whole.steps] == expected
    assert [step.cost for step in resumed.steps] == expected
    assert whole.totals.cost == resumed.totals.cost == sum(expected, Decimal(0))
    assert len(stub.requests) == sent_before_resume + 3  # calls 3, 4 and 5 after the crash
    log = await JsonlRunStore(directory=tmp_path / "b").read_log("cut")
    assert [completed.step.cost for completed in log.steps] == expected


async def test_a_call_whose_max_tokens_could_cross_max_cost_is_not_sent(
    stub: OpenAIStub, tmp_path: Path
) -> None:
    # Each call costs about 0.0002; max_tokens=100_000 could add 0.06 at 0.60 per million:
    # with 0.05 left, no call may go out.
    async with httpx.AsyncClient() as http, asyncio.timeout(BOUND):
        gateway = GatewayModelClient(
            client=http, settings=_settings(stub, max_tokens=100_000, temperature=0)
        )
        assert gateway.max_output_tokens == 100_000
        _script(stub)
        budget = Budget(max_steps=6, max_actions=6, max_cost=Decimal("0.05"))
        result = await run(_definition(gateway, tmp_path), _request("refused", budget))
    assert result.stop_reason is StopReason.COST_BUDGET
    assert result.steps == ()
    assert stub.requests == []
    log = await JsonlRunStore(directory=tmp_path).read_log("refused")
    assert log.intents == ()
    assert log.started is not None
    assert log.started.parameter_snapshot["request.max_cost"] == "0.05"
