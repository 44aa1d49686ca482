"""Usage and timing on record, token budgets and the context-length stop (designs 0200, 0201)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

import pytest
from _session_doubles import BUDGET, CodeExecutor, definition, request

from polyloop import serialization
from polyloop.errors import ContextLengthExceededError
from polyloop.ports import ModelCall
from polyloop.session import resume, run
from polyloop.stores import VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.types import (
    Budget,
    ModelCallResult,
    ModelReply,
    RunResult,
    RunTotals,
    StepRecord,
    StopReason,
    Usage,
)

pytestmark = pytest.mark.unit


class TooLong(ContextLengthExceededError):
    """What a client raises when the endpoint refuses the prompt as too long."""


class UsageModel(ScriptedModelClient):
    """The public scripted client answering ``code:x`` and reporting ``prompt_tokens`` =
    prompt characters // 2, 5 completion tokens and 1 cached token; an exception in
    ``raises`` (by call index) is raised instead."""

    def __init__(
        self,
        *,
        delay: float = 0.0,
        raises: Mapping[int, BaseException] | None = None,
        report_usage: bool = True,
    ) -> None:
        failures = dict(raises or {})
        script = [failures.get(index, "code:x") for index in range(max(failures, default=-1) + 2)]
        super().__init__(
            script,
            when_exhausted="repeat_last",
            call_id_prefix="c",
            delay=delay,
            parameters={"model": "usage-model"},
        )
        self.report_usage = report_usage

    async def call(self, call: ModelCall) -> ModelReply:
        reply = await super().call(call)
        chars = sum(len(block.text) for message in call.messages for block in message.content)
        usage = (
            Usage(prompt_tokens=chars // 2, completion_tokens=5, cached_tokens=1)
            if self.report_usage
            else None
        )
        return dataclasses.replace(reply, usage=usage, finish_reason="stop")


def budget(**changes: int | None) -> Budget:
    values: dict[str, int | None] = {
        "max_steps": BUDGET.max_steps,
        "max_actions": BUDGET.max_actions,
        "max_consecutive_parse_failures": BUDGET.max_consecutive_parse_failures,
        "max_prompt_chars": BUDGET.max_prompt_chars,
    }
    values.update(changes)
    return Budget(**values)  # type: ignore[arg-type]


class SlowExecutor(CodeExecutor):
    async def execute(self, action):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.02)
        return await super().execute(action)


# --------------------------------------------------------------------------- usage and timing


async def test_usage_and_durations_are_in_the_log_and_summed_in_the_result() -> None:
    model = UsageModel(delay=0.02)
    agent = definition(model)  # type: ignore[arg-type]
    result = await run(
        agent, request(executor=SlowExecutor(), budget=budget(max_steps=3, max_actions=3))
    )
    assert result.stop_reason is StopReason.STEP_BUDGET
    log = await agent.store.read_log("run-1")
    for model_result, completed in zip(log.model_results, log.steps, strict=True):
        reply = model_result.reply
        assert reply is not None
        assert reply.usage is not None
        assert reply.finish_reason == "stop"
        assert model_result.duration_ms is not None
        assert model_result.duration_ms >= 20
        step = completed.step
        assert step.usage == reply.usage
        assert step.model_ms == model_result.duration_ms
        assert step.action_ms is not None
        assert step.action_ms >= 20
    totals = result.totals
    prompts = [step.usage.prompt_tokens for step in result.steps if step.usage]
    assert totals == RunTotals(
        steps=3,
        prompt_tokens=sum(prompts),
        completion_tokens=15,
        cached_tokens=3,
        steps_without_usage=0,
        model_ms=sum(step.model_ms or 0 for step in result.steps),
        action_ms=sum(step.action_ms or 0 for step in result.steps),
        actions=3,  # every step called a tool (issue 26)
    )
    assert totals.model_ms >= 60
    assert totals.action_ms >= 60
    assert totals.total_tokens == sum(prompts) + 15
    # The finish record holds the same steps, so the same totals.
    assert log.finished is not None
    assert log.finished.result.totals == totals


async def test_a_failed_call_records_its_duration_and_no_usage() -> None:
    model = UsageModel(delay=0.01, raises={0: RuntimeError("endpoint down")})
    agent = definition(model)  # type: ignore[arg-type]
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.LLM_ERROR
    log = await agent.store.read_log("run-1")
    (model_result,) = log.model_results
    assert model_result.failure == "RuntimeError: endpoint down"
    assert model_result.duration_ms is not None
    assert model_result.duration_ms >= 10
    assert model_result.context_length_exceeded is False
    assert result.steps[0].usage is None
    assert result.steps[0].action_ms is None
    assert result.totals.steps_without_usage == 1


async def test_a_failure_with_an_empty_message_is_logged_with_its_class_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = UsageModel(raises={0: TimeoutError()})
    agent = definition(model)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="polyloop.session"):
        await run(agent, request(executor=CodeExecutor()))
    (warning,) = [r.getMessage() for r in caplog.records if "model call failed" in r.message]
    assert warning.endswith("TimeoutError")
    log = await agent.store.read_log("run-1")
    assert log.model_results[0].failure == "TimeoutError"


def test_totals_of_steps_without_usage_count_them() -> None:
    step = StepRecord(
        step_idx=0,
        raw_output="",
        content_chars=0,
        thinking_chars=0,
        action=None,
        parse_ok=True,
        parse_error=None,
        observation="",
        observation_is_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=3,
        call_id=None,
        step_wall_ms=0,
        action_status=None,
    )
    result = RunResult(
        run_id="r", stop_reason=StopReason.CANCELLED, final_answer=None, steps=[step]
    )
    assert result.totals.steps_without_usage == 1
    assert result.totals.total_tokens == 0


def test_new_fields_round_trip_and_old_payloads_read_with_defaults() -> None:
    reply = ModelReply(
        call_id="c",
        content="x",
        usage=Usage(prompt_tokens=3, completion_tokens=4, cached_tokens=None),
        finish_reason="length",
    )
    record = ModelCallResult(run_id="r", result_id="m0", reply=reply, failure=None, duration_ms=7)
    payload = serialization.encode(record)
    assert payload["schema_version"] == serialization.SCHEMA_VERSION
    # the fields arrived in 1.1; later minors keep them
    assert tuple(map(int, serialization.SCHEMA_VERSION.split("."))) >= (1, 1)
    assert serialization.decode_model_call_result(payload) == record
    old = {
        "schema_version": "1.0",
        "run_id": "r",
        "result_id": "m0",
        "reply": {"call_id": "c", "content": "x", "thinking": ""},
        "failure": None,
    }
    decoded = serialization.decode_model_call_result(old)
    assert decoded.duration_ms is None
    assert decoded.reply is not None
    assert decoded.reply.usage is None
    assert decoded.reply.finish_reason is None
    bad = dict(payload, duration_ms="7")
    with pytest.raises(serialization.DecodeError, match=r"ModelCallResult\.duration_ms"):
        serialization.decode_model_call_result(bad)


# --------------------------------------------------------------------------- token budgets


async def test_the_total_token_budget_stops_the_run_after_the_step_that_reaches_it() -> None:
    model = UsageModel()
    agent = definition(model)  # type: ignore[arg-type]
    # Each step costs prompt_chars // 2 + 5 tokens; the first prompt is short.
    first_prompt = await _first_step_tokens()
    result = await run(
        agent, request(executor=CodeExecutor(), budget=budget(max_total_tokens=first_prompt + 1))
    )
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert len(result.steps) == 2
    assert result.totals.total_tokens >= first_prompt + 1


async def _first_step_tokens() -> int:
    agent = definition(UsageModel())  # type: ignore[arg-type]
    result = await run(agent, request(executor=CodeExecutor(), budget=budget(max_steps=1)))
    return result.totals.total_tokens


async def test_budgets_outrank_the_token_budget_on_the_same_step() -> None:
    agent = definition(UsageModel())  # type: ignore[arg-type]
    result = await run(
        agent,
        request(executor=CodeExecutor(), budget=budget(max_steps=1, max_total_tokens=1)),
    )
    assert result.stop_reason is StopReason.STEP_BUDGET


async def test_the_prompt_token_limit_uses_the_estimate_before_any_report() -> None:
    model = UsageModel()
    agent = definition(model)  # type: ignore[arg-type]
    result = await run(agent, request(executor=CodeExecutor(), budget=budget(max_prompt_tokens=1)))
    assert result.stop_reason is StopReason.PROMPT_TOKEN_LIMIT
    assert model.calls == []
    assert result.steps == ()
    log = await agent.store.read_log("run-1")
    assert log.intents == ()


async def test_the_prompt_token_limit_follows_reported_usage() -> None:
    model = UsageModel()
    agent = definition(model)  # type: ignore[arg-type]
    # The model reports chars // 2 tokens: the default estimate (chars / 3) lets the first
    # prompt through, the calibrated one stops once the prompt grows past the limit.
    probe = await _first_step_tokens() - 5  # reported prompt tokens of the first prompt
    result = await run(
        agent,
        request(executor=CodeExecutor(), budget=budget(max_prompt_tokens=probe + 3)),
    )
    assert result.stop_reason is StopReason.PROMPT_TOKEN_LIMIT
    assert len(result.steps) == 1
    assert len(model.calls) == 1
    # Like the character limit, it trips before the call: step 1 has no intent and no step.
    log = await agent.store.read_log("run-1")
    assert [intent for intent in log.intents if intent.call_index == 1] == []
    assert [done.step.step_idx for done in log.steps] == [0]


async def test_a_token_budget_enters_the_snapshot_only_when_set() -> None:
    plain = request().parameter_snapshot()
    assert not any("tokens" in key for key in plain)
    limited = request(budget=budget(max_total_tokens=9, max_prompt_tokens=8)).parameter_snapshot()
    assert limited["request.max_total_tokens"] == "9"
    assert limited["request.max_prompt_tokens"] == "8"


@pytest.mark.parametrize("name", ["max_total_tokens", "max_prompt_tokens"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_token_budgets_must_be_positive_ints(name: str, value: object) -> None:
    with pytest.raises((TypeError, ValueError), match=f"Budget.{name}"):
        budget(**{name: value})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- context length


async def test_a_context_length_refusal_has_its_own_stop_reason_and_survives_resume() -> None:
    store = VolatileRunStore()
    model = UsageModel(raises={1: TooLong("prompt of 9000 tokens exceeds the context of 8192")})
    agent = definition(model, store=store)  # type: ignore[arg-type]
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.CONTEXT_LENGTH_EXCEEDED
    log = await store.read_log("run-1")
    last = log.model_results[-1]
    assert last.context_length_exceeded is True
    assert last.failure is not None
    assert "8192" in last.failure
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.CONTEXT_LENGTH_EXCEEDED
    # Resuming the finished run changes nothing.
    again = await resume(agent, request(executor=CodeExecutor()))
    assert again == result


async def test_a_context_length_result_without_its_step_resumes_to_the_same_reason() -> None:
    store = VolatileRunStore()
    crash = _CrashBeforeStep(store)
    model = UsageModel(raises={0: TooLong("context length exceeded")})
    with pytest.raises(_Crash):
        await run(definition(model, store=crash), request(executor=CodeExecutor()))  # type: ignore[arg-type]
    result = await resume(definition(UsageModel(), store=store), request(executor=CodeExecutor()))  # type: ignore[arg-type]
    assert result.stop_reason is StopReason.CONTEXT_LENGTH_EXCEEDED
    assert len(result.steps) == 1


class _Crash(Exception):
    pass


class _CrashBeforeStep:
    """A store that dies when asked to write the first step (after the model result)."""

    offers_leases = False  # unleased on purpose: the writes must reach the crash here

    def __init__(self, inner: VolatileRunStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "acquire_lease":
            # A plain RunStore: the session's writes must reach write_step_completed here
            # instead of going through the inner store's lease (design 0120).
            raise AttributeError(name)
        return getattr(self._inner, name)

    async def write_step_completed(self, record: object) -> None:
        raise _Crash
