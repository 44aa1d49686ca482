"""The stop decision: every reason, the documented precedence, and the counters."""

from __future__ import annotations

from typing import Any

import pytest

from polyloop._stopping import Counters, StepFacts, prompt_exceeds_limit, stop_after_step
from polyloop.types import ActionOutcome, ActionStatus, Budget, StepRecord, StopReason

pytestmark = pytest.mark.unit

BUDGET = Budget(max_steps=5, max_actions=3, max_consecutive_parse_failures=2, max_prompt_chars=100)


def outcome(status: ActionStatus = ActionStatus.EXECUTED, *, done: bool = False) -> ActionOutcome:
    return ActionOutcome(
        status=status,
        observation="o",
        observation_is_synthetic=False,
        env_reported_completion=done,
        observation_truncated_chars=0,
    )


def facts(**overrides: Any) -> StepFacts:
    values: dict[str, Any] = {
        "model_failed": False,
        "final_answer": False,
        "outcome": None,
        "tool_completes_run": False,
    }
    values.update(overrides)
    return StepFacts(**values)


def record(*, action: bool = True, parse_ok: bool = True) -> StepRecord:
    return StepRecord(
        step_idx=0,
        raw_output="r",
        content_chars=1,
        thinking_chars=0,
        action="a" if action else None,
        parse_ok=parse_ok,
        parse_error=None if parse_ok else "bad",
        observation="o",
        observation_is_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=1,
        call_id=None,
        step_wall_ms=0,
        action_status=ActionStatus.EXECUTED if action else None,
    )


FRESH = Counters(steps=1, actions=1, consecutive_parse_failures=0)


def test_nothing_stops_an_ordinary_step() -> None:
    assert stop_after_step(BUDGET, FRESH, facts(outcome=outcome())) is None


def test_model_failure_stops_with_llm_error() -> None:
    assert stop_after_step(BUDGET, FRESH, facts(model_failed=True)) is StopReason.LLM_ERROR


def test_env_error_stops() -> None:
    verdict = stop_after_step(BUDGET, FRESH, facts(outcome=outcome(ActionStatus.ENV_ERROR)))
    assert verdict is StopReason.ENV_ERROR


@pytest.mark.parametrize(("done", "tool"), [(True, False), (False, True), (True, True)])
def test_either_completion_path_completes_the_task(done: bool, tool: bool) -> None:
    verdict = stop_after_step(
        BUDGET, FRESH, facts(outcome=outcome(done=done), tool_completes_run=tool)
    )
    assert verdict is StopReason.TASK_COMPLETED


@pytest.mark.parametrize("status", [ActionStatus.NOT_EXECUTED, ActionStatus.ENV_ERROR])
def test_completion_needs_an_executed_action(status: ActionStatus) -> None:
    verdict = stop_after_step(
        BUDGET, FRESH, facts(outcome=outcome(status, done=True), tool_completes_run=True)
    )
    assert verdict is not StopReason.TASK_COMPLETED


def test_final_answer_stops() -> None:
    assert stop_after_step(BUDGET, FRESH, facts(final_answer=True)) is StopReason.FINAL_ANSWER


def test_parse_failure_streak_stops_at_the_limit() -> None:
    below = Counters(steps=1, actions=0, consecutive_parse_failures=1)
    at = Counters(steps=2, actions=0, consecutive_parse_failures=2)
    assert stop_after_step(BUDGET, below, facts()) is None
    assert stop_after_step(BUDGET, at, facts()) is StopReason.PARSE_FAILURES


def test_step_budget_stops_at_max_steps() -> None:
    assert stop_after_step(BUDGET, Counters(steps=4), facts()) is None
    assert stop_after_step(BUDGET, Counters(steps=5), facts()) is StopReason.STEP_BUDGET


def test_action_budget_stops_at_max_actions() -> None:
    assert stop_after_step(BUDGET, Counters(steps=2, actions=2), facts()) is None
    verdict = stop_after_step(BUDGET, Counters(steps=3, actions=3), facts())
    assert verdict is StopReason.ACTION_BUDGET


# Precedence: each row holds two conditions at once; the documented winner must win.
EXHAUSTED = Counters(steps=5, actions=3, consecutive_parse_failures=2)


@pytest.mark.parametrize(
    ("step_facts", "winner"),
    [
        (facts(model_failed=True), StopReason.LLM_ERROR),
        (facts(outcome=outcome(ActionStatus.ENV_ERROR, done=True)), StopReason.ENV_ERROR),
        (facts(outcome=outcome(done=True)), StopReason.TASK_COMPLETED),
        (facts(final_answer=True), StopReason.FINAL_ANSWER),
        (facts(), StopReason.PARSE_FAILURES),
    ],
)
def test_outcomes_of_the_step_win_over_budgets(step_facts: StepFacts, winner: StopReason) -> None:
    assert stop_after_step(BUDGET, EXHAUSTED, step_facts) is winner


def test_step_budget_wins_over_action_budget() -> None:
    verdict = stop_after_step(BUDGET, Counters(steps=5, actions=3), facts())
    assert verdict is StopReason.STEP_BUDGET


def test_prompt_limit_is_inclusive() -> None:
    assert not prompt_exceeds_limit(BUDGET, 100)
    assert prompt_exceeds_limit(BUDGET, 101)


def test_counters_count_every_step_and_every_action_and_reset_the_streak() -> None:
    trajectory = [
        record(),
        record(action=False, parse_ok=False),
        record(action=False, parse_ok=False),
        record(action=False),
        record(action=False, parse_ok=False),
    ]

    def counted(steps: list[StepRecord]) -> Counters:
        counters = Counters()
        for step in steps:
            counters = counters.after(step)
        return counters

    counters = counted(trajectory)
    assert (counters.steps, counters.actions, counters.consecutive_parse_failures) == (5, 1, 1)
    assert counted(trajectory[:3]).consecutive_parse_failures == 2
    assert counted([]) == Counters()
