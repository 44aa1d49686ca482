"""``RetryPolicy``: which stops a batch retries, how often, and how long it waits (design 0242)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.types import StopReason

__all__ = ["RETRYABLE", "RetryPolicy"]

RETRYABLE: Final = frozenset(
    {StopReason.LLM_ERROR, StopReason.RETRIES_EXHAUSTED, StopReason.ACTION_TIMEOUT}
)
"""The stops a batch can retry. ``llm_error``: a new run continues the stopped one
(``polyloop.session.continue_run``) and makes the failed model call again.
``retries_exhausted``: the run was left open with a ``safe``/``idempotent`` action whose
outcome stayed unknown (design 0227); the retry resumes the same run, which tries the action
again with the same idempotency key. ``action_timeout`` (logs written before design 0227): a
new run continues it and the action's replay policy decides (a ``never`` one is never
repeated). ``cancelled`` is always continued and costs no attempt. Others are not retryable:
an ``env_error`` step's action ran, a budget or an answer is an end, and an execution in doubt
(``resume_state_unknown``) waits for a person (design 0206)."""


def _reasons(value: object) -> frozenset[StopReason]:
    if isinstance(value, str | StopReason) or not isinstance(value, Iterable):
        raise PolyloopTypeError(
            f"RetryPolicy.on must be a collection of StopReason, got {type(value).__name__}"
        )
    reasons: set[StopReason] = set()
    for each in value:
        reason = StopReason(each) if isinstance(each, str) else each
        if not isinstance(reason, StopReason):
            raise PolyloopTypeError(
                f"RetryPolicy.on holds a {type(each).__name__}; use StopReason members"
            )
        if reason not in RETRYABLE:
            raise PolyloopValueError(
                f"RetryPolicy.on: {reason.value!r} cannot be retried; a retry continues a run "
                f"that stopped as one of {sorted(r.value for r in RETRYABLE)}"
            )
        reasons.add(reason)
    return frozenset(reasons)


def _number(name: str, value: object, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(f"RetryPolicy.{name} must be a number, got {type(value).__name__}")
    if not minimum <= value < float("inf"):
        raise PolyloopValueError(f"RetryPolicy.{name} must be finite and >= {minimum}, got {value}")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a batch retries an item, as soon as the item's attempt stops (not at the batch's end).

    ``on``: the stop reasons retried (default all of ``RETRYABLE``). ``max_attempts``: attempts
    per item in all, the first included (``1``: never retry). Before attempt *n* the batch waits
    ``min(backoff_max_seconds, backoff_seconds * 2 ** (n - 2))``, less a random part of it
    (``jitter``: 0 waits exactly that, 1 anywhere from 0 to it, "full jitter"). A retry keeps
    what the stopped attempt did (see ``RETRYABLE``): nothing recorded is executed again, and
    every attempt stays on record.
    """

    on: frozenset[StopReason] = field(default=RETRYABLE)
    max_attempts: int = 3
    backoff_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", _reasons(self.on))
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise PolyloopTypeError(
                f"RetryPolicy.max_attempts must be an int, got {type(attempts).__name__}"
            )
        if attempts < 1:
            raise PolyloopValueError(f"RetryPolicy.max_attempts must be >= 1, got {attempts}")
        _number("backoff_seconds", self.backoff_seconds, minimum=0.0)
        _number("backoff_max_seconds", self.backoff_max_seconds, minimum=0.0)
        jitter = _number("jitter", self.jitter, minimum=0.0)
        if jitter > 1:
            raise PolyloopValueError(f"RetryPolicy.jitter must be between 0 and 1, got {jitter}")

    def retries(self, reason: StopReason, attempt: int) -> bool:
        """Whether an item whose attempt ``attempt`` stopped with ``reason`` gets another."""
        return reason in self.on and attempt < self.max_attempts

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempt`` (>= 2)."""
        ceiling = min(self.backoff_max_seconds, self.backoff_seconds * 2 ** max(attempt - 2, 0))
        draw: float = (rng or random).random()
        return float(ceiling * (1 - self.jitter * draw))
