"""What a run knows about itself while it runs: its steps, counters, prompt and open execution.

One ``RunState`` per ``run``/``resume`` call. Resume rebuilds it from the stored steps
(``add_step`` per step, in order), so the next prompt is byte-identical to the one an
uninterrupted run would send. Nothing here writes; the step and the driver write, then
tell the state.
"""

from __future__ import annotations

import dataclasses
from typing import Final, TypeVar

from polyloop import _assembly
from polyloop._stopping import Counters
from polyloop.session._config import RunRequest
from polyloop.types import (
    OPEN_STOP_REASONS,
    ApprovalRequest,
    Intent,
    Message,
    ModelCallResult,
    ModelPrices,
    ResumeMark,
    RunFinished,
    RunResult,
    StepCompleted,
    StepRecord,
    StopReason,
)

_Markable = TypeVar(
    "_Markable", Intent, ModelCallResult, StepCompleted, ApprovalRequest, RunFinished
)

__all__ = ["LEAVES_UNKNOWN", "LEFT_OPEN", "RunState"]

LEAVES_UNKNOWN: Final = frozenset(
    {
        StopReason.CANCELLED,
        StopReason.ACTION_TIMEOUT,
        StopReason.RESUME_STATE_UNKNOWN,
        StopReason.RETRIES_EXHAUSTED,
    }
)
"""Stop reasons that can end a run while an execution's outcome is unknown (design 0163)."""

LEFT_OPEN: Final = OPEN_STOP_REASONS
"""Stop reasons returned without a ``RunFinished`` (``polyloop.types.OPEN_STOP_REASONS``)."""


class RunState:
    """The run's memory: what the log says so far, plus what this process has in flight."""

    def __init__(self, request: RunRequest, prices: ModelPrices | None = None) -> None:
        self.run_id = request.run_id
        self.prices = prices
        """The prices of the run's model (``RunRequest.pricing``), ``None`` without pricing."""
        self._observation_template = request.observation_template
        self.steps: list[StepRecord] = []
        self.counters = Counters()
        self.event_failures = 0
        self.final_answer: str | None = None
        self.pending_approval: ApprovalRequest | None = None
        """The call the run waits on when it stops with ``AWAITING_APPROVAL``."""
        self.in_flight: str | None = None
        """The result id of the execution whose intent is durable but whose result is not
        yet: what a stop at this moment leaves unknown (``RunResult.unknown_outcome``)."""
        self.resume_mark: ResumeMark | None = None
        self.stop_detail: str | None = None
        """Which limit and which call stopped a ``TREE_LIMIT`` run (design 0245)."""
        """Set by a resume; the next record written carries it, once (design 0215)."""
        self.prompt: list[Message] = list(
            _assembly.assemble(
                context=request.context,
                injections=request.injections,
                steps=(),
                observation_template=request.observation_template,
            )
        )
        self.prompt_chars = _assembly.prompt_chars(self.prompt)

    @property
    def next_step_idx(self) -> int:
        """The index the next step gets: steps are contiguous from 0."""
        return len(self.steps)

    def add_step(self, record: StepRecord) -> None:
        """Take in a durable step: count it and extend the prompt by its history pair."""
        self.steps.append(record)
        self.counters = self.counters.after(record, self.prices)
        pair, chars = _assembly.own_history_pair(record, self._observation_template)
        self.prompt.extend(pair)
        self.prompt_chars += chars

    def marked(self, record: _Markable) -> _Markable:
        """``record`` as written: the first record a resume writes, whatever its kind, carries
        the resume mark (design 0215); every other record is returned as it is."""
        mark = self.resume_mark
        if mark is None:
            return record
        self.resume_mark = None
        return dataclasses.replace(record, resumed=mark)

    def result(self, reason: StopReason) -> RunResult:
        """The run's result if it stopped now for ``reason``."""
        return RunResult(
            run_id=self.run_id,
            stop_reason=reason,
            final_answer=self.final_answer if reason is StopReason.FINAL_ANSWER else None,
            steps=tuple(self.steps),
            event_delivery_failures=self.event_failures,
            unknown_outcome=self.in_flight if reason in LEAVES_UNKNOWN else None,
            pending_approval=(
                self.pending_approval if reason is StopReason.AWAITING_APPROVAL else None
            ),
            stop_detail=self.stop_detail if reason is StopReason.TREE_LIMIT else None,
        )
