"""When a run stops: pure functions over budgets, counters and the facts of the last step.

Two checks exist, and nothing else decides a stop:

* ``prompt_exceeds_limit`` runs *before* every model call. A prompt longer than
  ``Budget.max_prompt_chars`` stops the run with ``PROMPT_TOO_LARGE``; no intent and no step are
  written, and history is never cut to make it fit. A prompt of exactly the limit is allowed.
* ``stop_after_step`` runs after every completed step (after its record and its event). When
  several conditions hold at once, the first in this order wins:

  1. ``LLM_ERROR``        the model call raised
  2. ``ENV_ERROR``        the executor returned ``ActionStatus.ENV_ERROR``
  3. ``TASK_COMPLETED``   an ``EXECUTED`` action whose outcome reports completion, or whose
                          tool has ``completes_run=True``
  4. ``FINAL_ANSWER``     the parser returned ``FinalAnswer``
  5. ``PARSE_FAILURES``   the consecutive-parse-failure counter reached its limit
  6. ``STEP_BUDGET``      the step counter reached ``max_steps``
  7. ``ACTION_BUDGET``    the action counter reached ``max_actions``

  Outcomes of the step itself (1-4) come before budgets (5-7): a task completed on the last
  allowed step is reported as completed, the more useful fact. The reasons are recorded in
  ``research-wiki/design/0051-stop-order.md``.

Counters are derived from the trajectory alone (``Counters.after``, applied to every stored
step by ``session`` on resume), so a resumed run counts exactly as the uninterrupted one did.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyloop.types import ActionOutcome, ActionStatus, Budget, StepRecord, StopReason

__all__ = ["Counters", "StepFacts", "prompt_exceeds_limit", "stop_after_step"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """The three budget counters after some number of steps.

    ``steps`` counts every step (each step is one model call, failed or not). ``actions``
    counts steps that handed an action to the executor, whatever its status (a rejected call
    still costs an action, so a model that keeps calling unknown tools is bounded by the action
    budget too). ``consecutive_parse_failures`` counts the trailing run of steps with
    ``parse_ok=False``; any parsed reply resets it.
    """

    steps: int = 0
    actions: int = 0
    consecutive_parse_failures: int = 0

    def after(self, step: StepRecord) -> Counters:
        """The counters once ``step`` is added."""
        return Counters(
            steps=self.steps + 1,
            actions=self.actions + (step.action_status is not None),
            consecutive_parse_failures=(
                0 if step.parse_ok else self.consecutive_parse_failures + 1
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFacts:
    """What happened in one step, as far as stopping is concerned."""

    model_failed: bool
    final_answer: bool
    outcome: ActionOutcome | None
    tool_completes_run: bool


def prompt_exceeds_limit(budget: Budget, prompt_chars: int) -> bool:
    """True when a prompt of ``prompt_chars`` characters must not be sent."""
    return prompt_chars > budget.max_prompt_chars


def stop_after_step(budget: Budget, counters: Counters, facts: StepFacts) -> StopReason | None:
    """The reason to stop after a step, or ``None`` to go on.

    ``counters`` already include the step described by ``facts``.
    """
    if facts.model_failed:
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
    return None
