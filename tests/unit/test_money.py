"""Money on record: prices the user states, the cost of every call, budgets in dollars
(issue 37, design 0236)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from _session_doubles import BUDGET, CodeExecutor, definition, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyloop
from polyloop import serialization
from polyloop._stopping import Counters
from polyloop.agent import AgentResult
from polyloop.errors import ParameterDriftError, PolyloopTypeError, PolyloopValueError
from polyloop.ports import ModelCall
from polyloop.session import Pricing, resume, run
from polyloop.stores import VolatileRunStore
from polyloop.testing import RecordFactory
from polyloop.types import (
    Budget,
    ModelPrices,
    ModelReply,
    RunResult,
    StepRecord,
    StopReason,
    Usage,
)

pytestmark = pytest.mark.unit

PRICES = Pricing.from_mapping(
    {"priced-model": {"input": "2.50", "cached_input": "1.25", "output": "10.00"}}
)
MODEL_PRICES = PRICES.for_model("priced-model")


class Crash(BaseException):
    """Stands for the process dying inside a model call (not an ``Exception``: the session
    does not turn it into a failed call, it leaves ``run()`` with the intent unanswered)."""


class UsageScript:
    """A model client answering ``code:x`` at every call, reporting ``usages[call_index]``
    (the last one repeated; ``None``: no usage reported). Counts the calls it answers;
    ``crash_at`` raises ``Crash`` once at that call index."""

    def __init__(
        self,
        usages: Sequence[Usage | None],
        *,
        max_output_tokens: int | None = None,
        model: str = "priced-model",
        crash_at: int | None = None,
    ) -> None:
        self.usages = list(usages)
        self.max_output_tokens = max_output_tokens
        self.model = model
        self.crash_at = crash_at
        self.calls = 0

    async def call(self, call: ModelCall) -> ModelReply:
        if call.call_index == self.crash_at:
            self.crash_at = None
            raise Crash
        self.calls += 1
        usage = self.usages[min(call.call_index, len(self.usages) - 1)]
        return ModelReply(call_id=f"c{call.call_index}", content="code:x", usage=usage)

    def parameters(self) -> Mapping[str, str]:
        return {"model": self.model}


def _budget(**changes: object) -> Budget:
    return dataclasses.replace(BUDGET, **changes)  # type: ignore[arg-type]


def _usage(prompt: int, completion: int, cached: int | None = None) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


# --------------------------------------------------------------------------- prices


def test_a_call_costs_its_tokens_times_the_prices_exactly() -> None:
    usage = _usage(1000, 100, cached=400)
    # 600 uncached at 2.50, 400 cached at 1.25, 100 out at 10.00, per million tokens
    assert MODEL_PRICES.cost(usage) == Decimal("0.003")
    assert MODEL_PRICES.cost(_usage(1, 0)) == Decimal("0.0000025")
    third = ModelPrices(input="0.333333333333333333333333333333", output=0)
    big = _usage(10**12 + 7, 0)
    # 42 significant digits, beyond the default context's 28: never rounded
    exact = Fraction(10**12 + 7) * Fraction(third.input) / 10**6
    assert Fraction(third.cost(big)) == exact


def test_cached_input_defaults_to_the_input_price() -> None:
    prices = ModelPrices(input=3, output=15)
    assert prices.cached_input == Decimal(3)
    assert prices.cost(_usage(1000, 0, cached=1000)) == Decimal("0.003")


def test_pricing_loads_from_a_mapping_a_json_file_and_a_toml_file(tmp_path: Path) -> None:
    data = {"m": {"input": "0.15", "output": "0.60"}, "*": {"input": 1, "output": 2}}
    json_file = tmp_path / "prices.json"
    json_file.write_text('{"m": {"input": 0.15, "output": 0.60}, "*": {"input": 1, "output": 2}}')
    toml_file = tmp_path / "prices.toml"
    toml_file.write_text('[m]\ninput = 0.15\noutput = 0.60\n\n["*"]\ninput = 1\noutput = 2\n')
    loaded = [
        Pricing.from_mapping(data),
        Pricing.from_file(json_file),
        Pricing.from_file(toml_file),
    ]
    for pricing in loaded:
        assert pricing.for_model("m") == ModelPrices(input=Decimal("0.15"), output=Decimal("0.6"))
        assert pricing.for_model("other").output == 2
        assert pricing.for_model(None).input == 1
    assert polyloop.Pricing is Pricing
    assert polyloop.ModelPrices is ModelPrices


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        ({"m": {"input": 2.5, "output": 1}}, PolyloopTypeError, ["['m'].input", "float", "'2.5'"]),
        ({"m": {"input": "x", "output": 1}}, PolyloopValueError, ["['m'].input", "'x'"]),
        ({"m": {"input": "-1", "output": 1}}, PolyloopValueError, ["input", ">= 0"]),
        ({"m": {"input": "1"}}, PolyloopValueError, ["['m']", "'output'"]),
        ({"m": {"input": 1, "output": 1, "outptu": 1}}, PolyloopValueError, ["'outptu'"]),
        ({"m": [1, 2]}, PolyloopTypeError, ["['m']", "list"]),
        ({}, PolyloopValueError, ["empty", "'*'"]),
        ({"m": {"input": True, "output": 1}}, PolyloopTypeError, ["input", "bool"]),
    ],
)
def test_bad_prices_are_refused_naming_the_field_the_type_and_the_fix(
    data: object, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as caught:
        Pricing.from_mapping(data)  # type: ignore[arg-type]
    for word in words:
        assert word in str(caught.value)


def test_a_bad_price_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    wrong = tmp_path / "prices.yaml"
    wrong.write_text("m: 1")
    with pytest.raises(PolyloopValueError, match=r"\.json or \.toml"):
        Pricing.from_file(wrong)
    broken = tmp_path / "prices.json"
    broken.write_text("{")
    with pytest.raises(PolyloopValueError, match="prices.json.*not valid JSON"):
        Pricing.from_file(broken)
    float_toml = tmp_path / "p.toml"
    float_toml.write_text("[m]\ninput = 1\n")
    with pytest.raises(PolyloopValueError, match=r"p\.toml.*'output'"):
        Pricing.from_file(float_toml)


async def test_an_unpriced_model_is_refused_before_anything_is_written() -> None:
    store = VolatileRunStore()
    model = UsageScript([_usage(10, 1)], model="other")
    agent = definition(model, store=store)  # type: ignore[arg-type]
    with pytest.raises(PolyloopValueError, match=r"'other'.*'priced-model'.*'\*'"):
        await run(agent, request(executor=CodeExecutor(), pricing=PRICES))
    assert (await store.read_log("run-1")).is_empty
    assert model.calls == 0


async def test_max_cost_needs_pricing_and_is_never_a_float() -> None:
    with pytest.raises(PolyloopValueError, match="pricing"):
        request(executor=CodeExecutor(), budget=_budget(max_cost=Decimal(1)))
    with pytest.raises(PolyloopTypeError, match="max_cost.*float"):
        Budget(max_cost=0.5)  # type: ignore[arg-type]
    with pytest.raises(PolyloopValueError, match="max_cost.*> 0"):
        Budget(max_cost=0)
    assert Budget(max_cost="0.50").max_cost == Decimal("0.5")


# --------------------------------------------------------------------------- cost on record


async def test_every_step_records_its_cost_and_the_result_sums_them() -> None:
    usages = [_usage(1000, 100, 400), _usage(1200, 50), _usage(1500, 7, 1500)]
    agent = definition(UsageScript(usages))  # type: ignore[arg-type]
    result = await run(
        agent, request(executor=CodeExecutor(), budget=_budget(max_steps=3), pricing=PRICES)
    )
    assert result.stop_reason is StopReason.STEP_BUDGET
    expected = [MODEL_PRICES.cost(usage) for usage in usages]
    assert [step.cost for step in result.steps] == expected
    assert result.totals.cost == sum(expected) == Decimal("0.008445")
    for step in result.steps:  # built without re-validation (design 0214): still valid
        assert dataclasses.replace(step) == step
    log = await agent.store.read_log("run-1")
    assert [completed.step.cost for completed in log.steps] == expected
    payload = serialization.encode(log.steps[0])
    assert payload["step"]["cost"] == "0.003"  # type: ignore[index]
    assert log.started is not None
    assert log.started.parameter_snapshot["request.pricing"] == (
        "model=priced-model input=2.5 cached_input=1.25 output=10"
    )


async def test_a_run_without_pricing_records_no_cost_and_writes_steps_as_before() -> None:
    agent = definition(UsageScript([_usage(10, 1)]))  # type: ignore[arg-type]
    result = await run(agent, request(executor=CodeExecutor(), budget=_budget(max_steps=1)))
    assert result.steps[0].cost is None
    assert result.totals.cost is None
    assert "cost" not in serialization.encode(result.steps[0])
    log = await agent.store.read_log("run-1")
    assert log.started is not None
    assert not any("pric" in key for key in log.started.parameter_snapshot)


def test_a_cost_is_stored_as_a_decimal_string_and_read_back_exactly() -> None:
    step = dataclasses.replace(
        RecordFactory().step(), usage=_usage(3, 1), cost=Decimal("0.00001750")
    )
    payload = serialization.encode(step)
    assert payload["cost"] == "0.0000175"
    assert json.loads(json.dumps(payload)) == payload
    assert serialization.decode_step_record(payload).cost == Decimal("0.0000175")
    for bad in (0.5, "-1", "NaN", " 1"):
        with pytest.raises(serialization.DecodeError, match="StepRecord.cost"):
            serialization.decode_step_record({**payload, "cost": bad})


def test_a_step_written_by_schema_1_8_has_no_cost_until_prices_are_given() -> None:
    """An older log reads with cost unknown; ``RunResult.priced`` computes it on read."""
    old = {
        "schema_version": "1.8",
        "step_idx": 0,
        "raw_output": "x",
        "content_chars": 1,
        "thinking_chars": 0,
        "action": None,
        "parse_ok": True,
        "parse_error": None,
        "observation": "o",
        "observation_is_synthetic": False,
        "observation_truncated_chars": 0,
        "prompt_chars": 3,
        "call_id": None,
        "step_wall_ms": 0,
        "action_status": None,
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 400},
    }
    step = serialization.decode_step_record(old)
    no_usage = serialization.decode_step_record({**old, "usage": None})
    assert step.cost is None
    result = RunResult(
        run_id="old", stop_reason=StopReason.STEP_BUDGET, final_answer=None, steps=(step, no_usage)
    )
    assert result.totals.cost is None
    priced = result.priced(MODEL_PRICES)
    assert [s.cost for s in priced.steps] == [Decimal("0.003"), None]
    assert priced.totals.cost == Decimal("0.003")
    assert priced.totals.steps_without_usage == 1


# --------------------------------------------------------------------------- resume


async def test_a_resumed_run_records_the_same_costs_as_an_uninterrupted_one() -> None:
    usages = [_usage(100 * (i + 1), 10 + i, i * 7) for i in range(5)]
    whole = await run(
        definition(UsageScript(usages)),  # type: ignore[arg-type]
        request(executor=CodeExecutor(), budget=_budget(max_steps=5), pricing=PRICES),
    )
    crashing = UsageScript(usages, crash_at=3)
    agent = definition(crashing)  # type: ignore[arg-type]
    req = request(
        executor=CodeExecutor(),
        budget=_budget(max_steps=5),
        pricing=PRICES,
        model_policy=polyloop.types.ReplayPolicy.SAFE,
    )
    with pytest.raises(Crash):
        await run(agent, req)
    resumed = await resume(agent, req)
    assert [s.cost for s in resumed.steps] == [s.cost for s in whole.steps]
    assert (
        resumed.totals.cost
        == whole.totals.cost
        == sum((MODEL_PRICES.cost(u) for u in usages), Decimal(0))
    )


async def test_changed_prices_on_resume_are_a_drift_naming_pricing() -> None:
    agent = definition(UsageScript([_usage(10, 1)], crash_at=1))  # type: ignore[arg-type]
    req = request(executor=CodeExecutor(), budget=_budget(max_steps=3), pricing=PRICES)
    with pytest.raises(Crash):
        await run(agent, req)
    dearer = Pricing.from_mapping({"priced-model": {"input": "3", "output": "10"}})
    with pytest.raises(ParameterDriftError) as caught:
        await resume(agent, dataclasses.replace(req, pricing=dearer))
    assert "request.pricing" in str(caught.value)
    assert list(caught.value.changed) == ["request.pricing"]


# --------------------------------------------------------------------------- the cost budget


async def test_the_run_stops_after_the_call_that_reaches_max_cost() -> None:
    # 0.003 a call, all of it output: the check before each call prices only the prompt's
    # estimate (the client states no max_output_tokens), far below what is left until call 3
    usage = _usage(0, 300)
    agent = definition(UsageScript([usage]))  # type: ignore[arg-type]
    result = await run(
        agent,
        request(executor=CodeExecutor(), budget=_budget(max_cost="0.009"), pricing=PRICES),
    )
    assert result.stop_reason is StopReason.COST_BUDGET
    assert len(result.steps) == 3
    assert result.totals.cost == Decimal("0.009")


async def test_a_call_that_could_cross_max_cost_is_refused_before_it_is_sent() -> None:
    # Each call reports 400 completion tokens (0.004 at output 10 per million) and no prompt
    # tokens; the client bounds a reply at 400 tokens. Before the third call the cost is
    # 0.008 and the call could add 0.004 (plus its prompt's estimate): over 0.01, refused.
    model = UsageScript([_usage(0, 400)], max_output_tokens=400)
    agent = definition(model)  # type: ignore[arg-type]
    result = await run(
        agent, request(executor=CodeExecutor(), budget=_budget(max_cost="0.01"), pricing=PRICES)
    )
    assert result.stop_reason is StopReason.COST_BUDGET
    assert model.calls == 2
    assert len(result.steps) == 2
    log = await agent.store.read_log("run-1")
    assert len(log.intents) == 4  # two model intents and two action intents: none for call 3
    assert result.totals.cost == Decimal("0.008")
    # Without the client's bound the third call goes out and overshoots by that one call.
    unbounded = UsageScript([_usage(0, 400)])
    result = await run(
        definition(unbounded),  # type: ignore[arg-type]
        request(executor=CodeExecutor(), budget=_budget(max_cost="0.01"), pricing=PRICES),
    )
    assert result.stop_reason is StopReason.COST_BUDGET
    assert unbounded.calls == 3
    assert result.totals.cost == Decimal("0.012")


async def test_with_max_output_tokens_the_first_call_can_be_refused_too() -> None:
    model = UsageScript([_usage(10, 1)], max_output_tokens=100_000)
    agent = definition(model)  # type: ignore[arg-type]
    result = await run(
        agent, request(executor=CodeExecutor(), budget=_budget(max_cost="0.5"), pricing=PRICES)
    )
    assert result.stop_reason is StopReason.COST_BUDGET
    assert model.calls == 0
    assert result.steps == ()
    log = await agent.store.read_log("run-1")
    assert log.intents == ()
    assert log.model_results == ()


async def test_a_call_without_usage_has_unknown_cost_and_counts_at_the_estimate() -> None:
    """Design 0236: the step's cost stays unknown (``None``, never 0); the budget counts it
    at the character estimate, so the run still stops; the result says the cost is partial."""
    model = UsageScript([None])
    agent = definition(model)  # type: ignore[arg-type]
    result = await run(
        agent,
        request(executor=CodeExecutor(), budget=_budget(max_cost="0.0005"), pricing=PRICES),
    )
    assert result.stop_reason is StopReason.COST_BUDGET
    assert all(step.cost is None for step in result.steps)
    assert result.totals.cost is None
    assert result.totals.steps_without_usage == len(result.steps)
    counters = Counters()
    for step in result.steps:
        counters = counters.after(step, MODEL_PRICES)
    # Each step counted at its estimate: prompt characters / 3 at the input price plus the
    # reply's 6 characters / 3 at the output price (never 0), and the run stopped on them.
    first = result.steps[0]
    assert Counters().after(first, MODEL_PRICES).cost == MODEL_PRICES.at_most(
        -(-first.prompt_chars // 3), 2
    )
    assert Decimal(0) < counters.cost
    assert model.calls == len(result.steps) < BUDGET.max_steps
    summary = AgentResult(output=None, result=result, priced=True).summary()
    assert "cost unknown" in summary


def test_summary_states_the_cost_and_what_is_missing() -> None:
    def step(idx: int, cost: str | None, usage: Usage | None) -> StepRecord:
        return dataclasses.replace(
            RecordFactory().step(step_idx=idx),
            usage=usage,
            cost=None if cost is None else Decimal(cost),
        )

    full = RunResult(
        run_id="r",
        stop_reason=StopReason.STEP_BUDGET,
        final_answer=None,
        steps=(step(0, "0.0100", _usage(1, 1)), step(1, "0.0025", _usage(1, 1))),
    )
    part = dataclasses.replace(full, steps=(*full.steps, step(2, None, None)))
    assert ", cost 0.0125" in AgentResult(output=None, result=full, priced=True).summary()
    assert (
        "cost at least 0.0125 (1 step reported no usage"
        in AgentResult(output=None, result=part, priced=True).summary()
    )
    unpriced = dataclasses.replace(full, steps=(step(0, None, _usage(1, 1)),))
    assert "cost" not in AgentResult(output=None, result=unpriced).summary()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    usages=st.lists(
        st.one_of(
            st.none(),
            st.builds(
                _usage,
                st.integers(min_value=0, max_value=50_000),
                st.integers(min_value=0, max_value=4_000),
                st.one_of(st.none(), st.integers(min_value=0, max_value=50_000)),
            ),
        ),
        min_size=1,
        max_size=12,
    ),
    prices=st.builds(
        ModelPrices,
        input=st.decimals(min_value=0, max_value=100, places=3),
        output=st.decimals(min_value=0, max_value=100, places=3),
        cached_input=st.one_of(st.none(), st.decimals(min_value=0, max_value=100, places=3)),
    ),
    max_cost=st.decimals(min_value="0.001", max_value=5, places=4),
    max_output_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=4_000)),
)
async def test_max_cost_is_never_exceeded_by_more_than_one_call(
    usages: list[Usage | None],
    prices: ModelPrices,
    max_cost: Decimal,
    max_output_tokens: int | None,
) -> None:
    """Over random usages (some unreported) and prices: every step but the last was taken
    with the counted cost below ``max_cost``, so the overshoot is at most the last call."""
    pricing = Pricing(models={"priced-model": prices})
    model = UsageScript(usages, max_output_tokens=max_output_tokens)
    result = await run(
        definition(model),  # type: ignore[arg-type]
        request(
            executor=CodeExecutor(),
            budget=_budget(max_steps=15, max_actions=15, max_cost=max_cost),
            pricing=pricing,
        ),
    )
    assert model.calls == len(result.steps)
    counters = Counters()
    for step in result.steps[:-1]:
        counters = counters.after(step, prices)
        assert counters.cost < max_cost
    for step in result.steps:
        if step.usage is None:
            assert step.cost is None
        else:
            assert step.cost == prices.cost(step.usage)
    if result.steps and counters.after(result.steps[-1], prices).cost >= max_cost:
        # The call that reached the budget stopped the run: as cost_budget, unless a reason
        # earlier in the stop order (stop-reasons.md) fired after the same step.
        earlier = {StopReason.STEP_BUDGET, StopReason.ACTION_BUDGET, StopReason.TOKEN_BUDGET}
        assert result.stop_reason in {StopReason.COST_BUDGET, *earlier}


# --------------------------------------------------------------------------- the Agent


async def test_an_agent_with_pricing_records_cost_and_its_summary_states_it() -> None:
    from polyloop import Agent
    from polyloop.parsers import JsonToolCallParser

    model = UsageScript([_usage(1000, 100, 400)])
    agent = Agent(
        model,  # type: ignore[arg-type]
        parser=JsonToolCallParser(),
        store=VolatileRunStore(),
        pricing=PRICES,
        budget=Budget(max_cost="1"),
    )
    result = await agent.run("What is 2 + 3?", run_id="agent-1")
    assert result.stop_reason is StopReason.PARSE_FAILURES  # "code:x" is no JSON tool call
    assert [step.cost for step in result.steps] == [Decimal("0.003")] * 3
    assert ", cost 0.009" in result.summary()
    snapshot = agent.request("What is 2 + 3?", "agent-2").parameter_snapshot()
    assert snapshot["request.max_cost"] == "1"
    with pytest.raises(PolyloopValueError, match=r"max_cost.*pricing="):
        Agent(model, parser=JsonToolCallParser(), budget=Budget(max_cost=1))  # type: ignore[arg-type]
    with pytest.raises(PolyloopTypeError, match=r"Agent\(pricing=\.\.\.\).*dict"):
        Agent(model, parser=JsonToolCallParser(), pricing={"m": {}})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the stop order


def test_cost_budget_is_last_after_a_step_and_third_before_a_call() -> None:
    from polyloop._stopping import StepFacts, stop_after_step, stop_before_call

    budget = Budget(max_steps=5, max_total_tokens=100, max_prompt_tokens=50, max_cost="0.01")
    facts = StepFacts(
        model_failed=False, final_answer=False, outcome=None, tool_completes_run=False
    )
    spent = Counters(steps=1, cost=Decimal("0.01"))
    assert stop_after_step(budget, spent, facts) is StopReason.COST_BUDGET
    assert stop_after_step(budget, Counters(steps=1, cost=Decimal("0.00999")), facts) is None
    both = Counters(steps=5, tokens=100, cost=Decimal("0.02"))
    assert stop_after_step(budget, both, facts) is StopReason.STEP_BUDGET
    tokens = Counters(steps=1, tokens=100, cost=Decimal("0.02"))
    assert stop_after_step(budget, tokens, facts) is StopReason.TOKEN_BUDGET
    answered = StepFacts(
        model_failed=False, final_answer=True, outcome=None, tool_completes_run=False
    )
    assert stop_after_step(budget, spent, answered) is StopReason.FINAL_ANSWER

    prices = ModelPrices(input=1000, output=1000)  # 0.001 a token
    # 30 chars -> 10 estimated prompt tokens -> 0.01: exactly the limit is allowed
    assert stop_before_call(budget, Counters(), 30, prices=prices) is None
    assert stop_before_call(budget, Counters(), 31, prices=prices) is StopReason.COST_BUDGET
    assert (
        stop_before_call(budget, Counters(), 3, prices=prices, max_output_tokens=10)
        is StopReason.COST_BUDGET
    )
    assert stop_before_call(budget, Counters(), 151, prices=prices) is (
        StopReason.PROMPT_TOKEN_LIMIT
    )
    assert stop_before_call(budget, Counters(), 10**6, prices=prices) is (
        StopReason.PROMPT_TOO_LARGE
    )
