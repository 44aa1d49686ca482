"""When a run stops: pure functions over budgets, counters and the facts of the last step.

Two checks exist, and nothing else decides a stop:

* ``stop_before_call`` runs *before* every model call. A prompt longer than
  ``Budget.max_prompt_chars`` stops the run with ``PROMPT_TOO_LARGE``; then, when
  ``Budget.max_prompt_tokens`` is set, a prompt whose estimated tokens exceed it stops the run
  with ``PROMPT_TOKEN_LIMIT`` (``prompt_tokens_estimate`` says how the estimate is made); then,
  when ``Budget.max_cost`` is set, a call whose most possible cost (``call_cost_bound``) would
  take the cost counter past it stops the run with ``COST_BUDGET``. In all three cases no
  intent and no step are written, and history is never cut to make it fit. A prompt (or a
  bound) of exactly a limit is allowed.
* ``stop_after_step`` runs after every completed step (after its record and its event). When
  several conditions hold at once, the first in this order wins:

  1. ``CONTEXT_LENGTH_EXCEEDED`` the model call raised ``ContextLengthExceededError``
  2. ``LLM_ERROR``        the model call raised anything else
  3. ``ENV_ERROR``        the executor returned ``ActionStatus.ENV_ERROR``
  4. ``TASK_COMPLETED``   an ``EXECUTED`` action whose outcome reports completion, or whose
                          tool has ``completes_run=True``
  5. ``FINAL_ANSWER``     the parser returned ``FinalAnswer``
  6. ``PARSE_FAILURES``   the consecutive-parse-failure counter reached its limit
  7. ``STEP_BUDGET``      the step counter reached ``max_steps``
  8. ``ACTION_BUDGET``    the action counter reached ``max_actions``
  9. ``TOKEN_BUDGET``     the token counter reached ``max_total_tokens``
  10. ``COST_BUDGET``     the cost counter reached ``max_cost``

  Outcomes of the step itself (1-5) come before budgets (6-9): a task completed on the last
  allowed step is reported as completed, the more useful fact. The reasons are recorded in
  ``research-wiki/design/0051-stop-order.md`` and, for the token reasons,
  ``research-wiki/design/0201-token-budgets-and-context-length.md`` and, for the cost reason,
  ``research-wiki/design/0236-money-on-record.md``.

Counters are derived from the trajectory alone (``Counters.after``, applied to every stored
step by ``session`` on resume), so a resumed run counts exactly as the uninterrupted one did.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass
from typing import Final

from polyloop._common import EXACT_MONEY
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    ModelPrices,
    StepRecord,
    StopReason,
)

__all__ = [
    "ESTIMATE_CHARS_PER_TOKEN",
    "Counters",
    "StepFacts",
    "call_cost_bound",
    "counted_cost",
    "prompt_exceeds_limit",
    "prompt_tokens_estimate",
    "step_tokens",
    "stop_after_step",
    "stop_before_call",
]

ESTIMATE_CHARS_PER_TOKEN: Final = 3
"""Characters per token assumed before an endpoint has reported any usage.

Deliberately low (English prose runs at about 4 characters per token, code and other
languages lower), so the estimate errs
towards too many tokens: a token limit then stops a run early rather than letting an
over-long prompt through."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """The three budget counters after some number of steps.

    ``steps`` counts every step (each step is one model call, failed or not), and the steps of
    the child runs the steps' actions ran (design 0245). ``actions``
    counts steps that handed an action to the executor, whatever its status (a rejected call
    still costs an action, so a model that keeps calling unknown tools is bounded by the action
    budget too). ``consecutive_parse_failures`` counts the trailing run of steps with
    ``parse_ok=False``; any parsed reply resets it.
    """

    steps: int = 0
    actions: int = 0
    consecutive_parse_failures: int = 0
    tokens: int = 0
    """Tokens of all steps so far (``step_tokens``): the ``TOKEN_BUDGET`` counter."""
    reported_prompt_tokens: int | None = None
    """The last step's reported ``prompt_tokens`` that calibrates the next estimate."""
    reported_prompt_chars: int = 0
    """The ``prompt_chars`` of the step that reported ``reported_prompt_tokens``."""
    cost: decimal.Decimal = decimal.Decimal(0)
    """The cost of all steps so far (``counted_cost``): the ``COST_BUDGET`` counter."""

    def after(self, step: StepRecord, prices: ModelPrices | None = None) -> Counters:
        """The counters once ``step`` is added; ``prices`` are the run's (``None``: no
        pricing, the cost counter stays as it is).

        A step whose action ran a child run (``step.child``, design 0245) also counts the
        child's subtree: its steps into ``steps``, its tokens into ``tokens`` and its recorded
        cost into ``cost``, so that a run's ``max_steps``, ``max_total_tokens`` and
        ``max_cost`` bound the whole tree below it."""
        usage = step.usage
        child = step.child
        return Counters(
            cost=EXACT_MONEY.add(
                self.cost,
                counted_cost(self, step, prices)
                if child is None or child.cost is None
                else EXACT_MONEY.add(counted_cost(self, step, prices), child.cost),
            ),
            steps=self.steps + 1 + (0 if child is None else child.steps),
            actions=self.actions + (step.action_status is not None),
            consecutive_parse_failures=(
                0 if step.parse_ok else self.consecutive_parse_failures + 1
            ),
            tokens=self.tokens + step_tokens(step) + (0 if child is None else child.tokens),
            reported_prompt_tokens=(
                self.reported_prompt_tokens if usage is None else usage.prompt_tokens
            ),
            reported_prompt_chars=(
                self.reported_prompt_chars if usage is None else step.prompt_chars
            ),
        )


def _chars_to_tokens(chars: int) -> int:
    return math.ceil(chars / ESTIMATE_CHARS_PER_TOKEN)


def counted_cost(before: Counters, step: StepRecord, prices: ModelPrices | None) -> decimal.Decimal:
    """What ``step`` counts against ``Budget.max_cost`` (``before``: the counters without it).

    Its recorded ``cost`` when there is one; else, with ``prices``, the cost of its reported
    usage (a step from a log that predates cost records) or, when the endpoint reported no
    usage, the estimate: the prompt's estimated tokens (``prompt_tokens_estimate``) and the
    reply's characters at ``ESTIMATE_CHARS_PER_TOKEN``, priced by ``ModelPrices.at_most``.
    The recorded cost of such a step stays unknown (``None``); only the budget counts the
    estimate (design 0236). Without prices: 0 (no cost budget can be set without pricing).
    """
    if step.cost is not None:
        return step.cost
    if prices is None:
        return decimal.Decimal(0)
    if step.usage is not None:
        return prices.cost(step.usage)
    return prices.at_most(
        prompt_tokens_estimate(before, step.prompt_chars),
        _chars_to_tokens(step.content_chars + step.thinking_chars),
    )


def call_cost_bound(
    counters: Counters, prompt_chars: int, prices: ModelPrices, max_output_tokens: int | None
) -> decimal.Decimal:
    """The most the next call can cost: the prompt's estimated tokens
    (``prompt_tokens_estimate``) at the higher of the input prices plus ``max_output_tokens``
    (the model client's bound on a reply; ``None``: unknown, counted as 0) at the output
    price."""
    return prices.at_most(prompt_tokens_estimate(counters, prompt_chars), max_output_tokens or 0)


def step_tokens(step: StepRecord) -> int:
    """The tokens a step counts against ``Budget.max_total_tokens``.

    The reported ``prompt_tokens + completion_tokens`` when the endpoint reported usage;
    otherwise the estimate of the prompt, content and thinking characters at
    ``ESTIMATE_CHARS_PER_TOKEN``.
    """
    if step.usage is not None:
        return step.usage.total_tokens
    return _chars_to_tokens(step.prompt_chars + step.content_chars + step.thinking_chars)


def prompt_tokens_estimate(counters: Counters, prompt_chars: int) -> int:
    """The estimated tokens of a prompt of ``prompt_chars`` characters.

    After a step that reported usage: that step's ``prompt_tokens`` plus the characters added
    since, at the characters-per-token ratio that step showed (a prompt only ever grows, so
    this is exact up to the new characters). Before any report: ``prompt_chars`` at
    ``ESTIMATE_CHARS_PER_TOKEN``, rounded up.
    """
    reported = counters.reported_prompt_tokens
    base_chars = counters.reported_prompt_chars
    if reported is None or base_chars <= 0 or reported <= 0:
        return _chars_to_tokens(prompt_chars)
    added = max(prompt_chars - base_chars, 0)
    return reported + math.ceil(added * reported / base_chars)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFacts:
    """What happened in one step, as far as stopping is concerned."""

    model_failed: bool
    final_answer: bool
    outcome: ActionOutcome | None
    tool_completes_run: bool
    context_length_exceeded: bool = False


def prompt_exceeds_limit(budget: Budget, prompt_chars: int) -> bool:
    """True when a prompt of ``prompt_chars`` characters must not be sent."""
    return prompt_chars > budget.max_prompt_chars


def stop_before_call(
    budget: Budget,
    counters: Counters,
    prompt_chars: int,
    *,
    prices: ModelPrices | None = None,
    max_output_tokens: int | None = None,
) -> StopReason | None:
    """The reason not to send a prompt of ``prompt_chars`` characters, or ``None``.

    ``PROMPT_TOO_LARGE`` first (characters are exact), then ``PROMPT_TOKEN_LIMIT`` when
    ``max_prompt_tokens`` is set and ``prompt_tokens_estimate`` exceeds it, then
    ``COST_BUDGET`` when ``max_cost`` is set and the cost so far plus ``call_cost_bound``
    exceeds it.
    """
    if prompt_exceeds_limit(budget, prompt_chars):
        return StopReason.PROMPT_TOO_LARGE
    limit = budget.max_prompt_tokens
    if limit is not None and prompt_tokens_estimate(counters, prompt_chars) > limit:
        return StopReason.PROMPT_TOKEN_LIMIT
    max_cost = budget.max_cost
    if max_cost is not None and prices is not None:
        bound = call_cost_bound(counters, prompt_chars, prices, max_output_tokens)
        if EXACT_MONEY.add(counters.cost, bound) > max_cost:
            return StopReason.COST_BUDGET
    return None


def stop_after_step(budget: Budget, counters: Counters, facts: StepFacts) -> StopReason | None:
    """The reason to stop after a step, or ``None`` to go on.

    ``counters`` already include the step described by ``facts``.
    """
    if facts.model_failed:
        if facts.context_length_exceeded:
            return StopReason.CONTEXT_LENGTH_EXCEEDED
        return StopReason.LLM_ERROR
    outcome = facts.outcome
    if outcome is not None:
        if outcome.status is ActionStatus.ENV_ERROR:
            return StopReason.ENV_ERROR
        if outcome.status is ActionStatus.EXECUTED and (
            outcome.env_reported_completion or facts.tool_completes_run
        ):
            return StopReason.TASK_COMPLETED
    if facts.final_answer:
        return StopReason.FINAL_ANSWER
    if counters.consecutive_parse_failures >= budget.max_consecutive_parse_failures:
        return StopReason.PARSE_FAILURES
    if counters.steps >= budget.max_steps:
        return StopReason.STEP_BUDGET
    if counters.actions >= budget.max_actions:
        return StopReason.ACTION_BUDGET
    if budget.max_total_tokens is not None and counters.tokens >= budget.max_total_tokens:
        return StopReason.TOKEN_BUDGET
    if budget.max_cost is not None and counters.cost >= budget.max_cost:
        return StopReason.COST_BUDGET
    return None
