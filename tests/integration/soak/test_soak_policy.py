"""The code scenario's scripted personas, and the loopback policy server behind the real adapter."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
import pytest
from _soak_support import ROOT
from tools.soak.codeworld import tasks as codetasks
from tools.soak.codeworld.sandbox import TaskSession
from tools.soak.policy_server import PolicyServer
from tools.soak.scenarios import code
from tools.soak.scenarios.base import PolicyReply, PolicyRequest, encode_user

from _ordering import Alarm
from polyloop.adapters import GatewayHTTPError, GatewayModelClient, GatewaySettings
from polyloop.ports import Action, InvalidDecision, ModelCall
from polyloop.types import Message, ModelReply, Role, TextBlock

pytestmark = pytest.mark.integration

assert ROOT.is_dir()


# --------------------------------------------------------------------------- personas


def _prompt(task: codetasks.CodeTask) -> list[dict[str, str]]:
    context = code.build_context(task)
    return [
        {"role": m.role.value, "content": "".join(b.text for b in m.content)}
        for m in (*context.run_level, *context.goal_level)
    ]


def _episode(
    task: codetasks.CodeTask, persona: str, seed: int, steps: int = 12
) -> dict[str, object]:
    """Play ``persona`` against an in-process session, the way a run would."""
    session = TaskSession(task, exec_timeout=5, output_limit=4000)
    messages = _prompt(task)
    parser = code.CodeParser()
    invalid_streak = longest_streak = 0
    first_raised = None
    for step in range(steps):
        request = PolicyRequest(
            scenario="code",
            task_id=task.task_id,
            phase=None,
            persona=persona,
            seed=seed,
            messages=tuple(messages),
        )
        reply = code.policy(request)
        content = reply.content if isinstance(reply, PolicyReply) else reply
        parsed = parser.parse(ModelReply(call_id=None, content=content))
        if isinstance(parsed.decision, Action):
            invalid_streak = 0
            report = session.execute(parsed.decision.text)
            observation = report.output
            if first_raised is None:
                first_raised = report.raised
        else:
            assert isinstance(parsed.decision, InvalidDecision)
            invalid_streak += 1
            longest_streak = max(longest_streak, invalid_streak)
            observation = parsed.decision.explanation
        messages += [
            {"role": "assistant", "content": parsed.history_text},
            {"role": "user", "content": code.OBSERVATION_TEMPLATE.format(observation=observation)},
        ]
        if session.completed or invalid_streak >= 3:
            return {
                "steps": step + 1,
                "completed": session.completed,
                "success": session.success,
                "streak": longest_streak,
                "first_raised": first_raised,
            }
    return {
        "steps": steps,
        "completed": session.completed,
        "success": session.success,
        "streak": longest_streak,
        "first_raised": first_raised,
    }


def test_competent_solves_every_task_in_two_steps() -> None:
    for task in codetasks.build_tasks(7):
        result = _episode(task, "competent", 7)
        assert result == {
            "steps": 2,
            "completed": True,
            "success": True,
            "streak": 0,
            "first_raised": False,
        }, task.task_id


def test_sloppy_errs_first_then_finishes_sometimes_wrongly() -> None:
    results = [_episode(task, "sloppy", 7) for task in codetasks.build_tasks(7)]
    assert all(r["first_raised"] and r["completed"] and r["steps"] == 2 for r in results)
    wrong = sum(1 for r in results if not r["success"])
    assert 0 < wrong < len(results)


def test_malformed_opens_with_unparseable_replies_and_sometimes_storms() -> None:
    results = [_episode(task, "malformed", 7) for task in codetasks.build_tasks(7)]
    assert all(r["streak"] >= 1 for r in results)
    storms = [r for r in results if r["streak"] == 3]
    assert storms
    assert all(not r["completed"] for r in storms)
    assert any(r["success"] for r in results)


def test_stubborn_never_completes() -> None:
    for task in codetasks.build_tasks(7)[:10]:
        result = _episode(task, "stubborn", 7)
        assert (result["steps"], result["completed"]) == (12, False)


def test_verbose_pads_its_replies_and_sends_reasoning_but_still_solves() -> None:
    task = codetasks.task_for(7, "t004")
    request = PolicyRequest(
        scenario="code",
        task_id=task.task_id,
        phase=None,
        persona="verbose",
        seed=7,
        messages=tuple(_prompt(task)),
    )
    reply = code.policy(request)
    assert isinstance(reply, PolicyReply)
    assert len(reply.content) > 1000
    assert reply.reasoning
    parsed = code.CodeParser().parse(ModelReply(call_id=None, content=reply.content))
    assert len(parsed.history_text) < len(reply.content)  # the invented output is cut off
    assert _episode(task, "verbose", 7)["success"]


def test_the_policy_is_a_pure_function_of_its_request() -> None:
    for persona in ("competent", "sloppy", "malformed", "stubborn", "verbose"):
        for task in codetasks.build_tasks(5)[:8]:
            request = PolicyRequest(
                scenario="code",
                task_id=task.task_id,
                phase=None,
                persona=persona,
                seed=5,
                messages=tuple(_prompt(task)),
            )
            assert code.policy(request) == code.policy(request)
    outcomes = {
        seed: [_episode(t, "sloppy", seed)["success"] for t in codetasks.build_tasks(seed)[:10]]
        for seed in (1, 2, 3)
    }
    assert len({tuple(v) for v in outcomes.values()}) > 1  # the seed matters


# --------------------------------------------------------------------------- the server


def _call(messages: int, *, user: str | None, run_id: str = "r") -> ModelCall:
    texts = ["go"] + ["step", "obs"] * ((messages - 1) // 2)
    roles = [Role.USER] + [Role.ASSISTANT, Role.USER] * ((messages - 1) // 2)
    binding: Mapping[str, str] = {} if user is None else {"gateway.user": user}
    return ModelCall(
        messages=tuple(
            Message(role=r, content=(TextBlock(text=t),)) for r, t in zip(roles, texts, strict=True)
        ),
        call_index=0,
        run_id=run_id,
        result_id="m0",
        binding=binding,
    )


def _client(http: httpx.AsyncClient, server: PolicyServer) -> GatewayModelClient:
    return GatewayModelClient(
        client=http, settings=GatewaySettings(base_url=server.base_url, model="soak-policy")
    )


def _code_user(task_id: str = "t004", persona: str = "verbose", seed: int = 7) -> str:
    return encode_user(scenario="code", task_id=task_id, phase=None, persona=persona, seed=seed)


async def test_the_server_answers_through_the_gateway_adapter_with_reasoning() -> None:
    task = codetasks.task_for(7, "t004")
    context = code.build_context(task)
    call = ModelCall(
        messages=(*context.run_level, *context.goal_level),
        call_index=0,
        run_id="r",
        result_id="m0",
        binding={"gateway.user": _code_user()},
    )
    async with PolicyServer(seed=7) as server, httpx.AsyncClient(trust_env=False) as http:
        reply = await _client(http, server).call(call)
        assert server.received[0].task_id == "t004"
    expected = code.policy(server.received[0])
    assert isinstance(expected, PolicyReply)
    assert (reply.content, reply.thinking) == (expected.content, expected.reasoning)
    assert reply.call_id


async def test_requests_without_a_routing_user_are_refused_with_400() -> None:
    async with PolicyServer() as server, httpx.AsyncClient(trust_env=False) as http:
        client = _client(http, server)
        for user in (None, "not-five-parts", "Bad Scenario|t|-|competent|1"):
            with pytest.raises(GatewayHTTPError) as caught:
                await client.call(_call(1, user=user))
            assert caught.value.status_code == 400
        assert server.requests == 0


async def test_injected_failures_spare_the_first_call_and_are_deterministic() -> None:
    user = _code_user(persona="competent")
    patterns = []
    for _ in range(2):
        async with (
            PolicyServer(seed=3, failure_rate=1.0) as server,
            httpx.AsyncClient(trust_env=False) as http,
        ):
            client = _client(http, server)
            first = await client.call(_call(1, user=user))
            assert first.content
            with pytest.raises(GatewayHTTPError) as caught:
                await client.call(_call(3, user=user))
            assert caught.value.status_code in (500, 503)
            patterns.append((server.injected_failures, caught.value.status_code))
    assert patterns[0] == patterns[1] == (1, patterns[0][1])


async def test_latency_is_applied_and_a_raising_policy_is_a_counted_500() -> None:
    async with (
        PolicyServer(latency=0.2) as server,
        httpx.AsyncClient(trust_env=False) as http,
    ):
        alarm = Alarm(0.2)  # the reply comes after the latency: after this alarm rang
        with pytest.raises(GatewayHTTPError) as caught:
            await _client(http, server).call(_call(1, user=_code_user(task_id="t999")))
        assert await alarm.rang()
        assert caught.value.status_code == 500
        assert server.policy_errors == 1


async def test_a_cancelled_call_is_seen_as_abandoned() -> None:
    async with PolicyServer() as server, httpx.AsyncClient(trust_env=False) as http:
        server.delay_override = lambda request: 30.0
        pending = asyncio.ensure_future(_client(http, server).call(_call(1, user=_code_user())))
        await server.wait_for_request(lambda request: True)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        for _ in range(100):
            if server.abandoned:
                break
            await asyncio.sleep(0.02)
        assert server.abandoned == 1
        assert server.replies == 0
