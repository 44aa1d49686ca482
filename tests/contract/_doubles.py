"""Minimal seam implementations that exist only so every contract test runs in this repo.

The library ships no default parser or model client (a default would choose an action language
or a protocol for everybody; the stock parsers and sinks of ``polyloop.parsers`` and
``polyloop.sinks`` are optional and certified in ``test_stock_parts_contracts.py``), and its one
executor never suspends. These doubles fill the gaps. They live under ``tests/``, outside the
wheel, where no downstream can pick them up as a default. Each satisfies its Protocol
structurally (no inheritance) and does the least that is compliant: anything more (retries,
filtering, counting) would have the suite testing the double instead of the contract.

The model-client double is public, a test double users may take too:
``polyloop.testing.ScriptedModelClient``, certified in ``test_model_client_double.py`` (with
``delay=PAUSE_SECONDS`` for the suspending wiring).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from polyloop.ports import Action, Event, InvalidDecision, ParsedReply
from polyloop.types import ActionOutcome, ActionStatus, ModelReply

PAUSE_SECONDS = 0.001
"""How long the suspending doubles wait inside every call.

A real timer rather than ``asyncio.sleep(0)``: a bare yield would make the contract's
"cancel after one tick" race depend on the order of the ready queue, which asyncio does not
promise. A pending timer guarantees that ``task.cancel()`` finds the call suspended.
"""


def _executed(observation: str) -> ActionOutcome:
    return ActionOutcome(
        status=ActionStatus.EXECUTED,
        observation=observation,
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    )


# --------------------------------------------------------------------------- executors

FAILS_PREFIX = "FAIL "
"""An action whose text starts with this fails on its own (and is still ``EXECUTED``)."""


class SuspendingActionExecutor:
    """Executes text actions after a real wait, so cancellation has something to interrupt.

    ``"FAIL <rest>"`` is an action that ran and failed; anything else ran and succeeded. No
    ``try``/``finally``: there is nothing to release, and nothing may catch a cancellation.
    """

    async def execute(self, action: Action) -> ActionOutcome:
        await asyncio.sleep(PAUSE_SECONDS)
        if action.text.startswith(FAILS_PREFIX):
            return _executed(f"error: {action.text.removeprefix(FAILS_PREFIX)}")
        return _executed(f"output of: {action.text}")

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "suspending", "pause_seconds": str(PAUSE_SECONDS)}


class QuickActionExecutor:
    """Like ``SuspendingActionExecutor`` but without any await point: every execution ends
    within one event-loop tick, which is the case the cancellation test must skip."""

    async def execute(self, action: Action) -> ActionOutcome:
        if action.text.startswith(FAILS_PREFIX):
            return _executed(f"error: {action.text.removeprefix(FAILS_PREFIX)}")
        return _executed(f"output of: {action.text}")

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "quick"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionSamples:
    """The shape ``ActionExecutorContract.action_samples`` asks for."""

    executes_cleanly: Action
    executes_but_errors: Action


# --------------------------------------------------------------------------- parser

ACTION_PREFIX = "DO "
"""The whole action language of ``PrefixDecisionParser``: ``"DO <action text>"``."""


class PrefixDecisionParser:
    """A reply starting with ``"DO "`` is an action (the rest is its text); anything else is
    an invalid decision. History keeps the reply verbatim. Both branches are reachable."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        if reply.content.startswith(ACTION_PREFIX):
            return ParsedReply(
                history_text=reply.content,
                decision=Action(text=reply.content.removeprefix(ACTION_PREFIX)),
            )
        return ParsedReply(
            history_text=reply.content,
            decision=InvalidDecision(
                explanation=f"the reply does not start with {ACTION_PREFIX!r}, so it holds "
                "no action; start the reply with it, followed by the action"
            ),
        )

    def parameters(self) -> Mapping[str, str]:
        return {"prefix": ACTION_PREFIX}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplySamples:
    """The shape ``DecisionParserContract.reply_samples`` asks for."""

    yields_an_action: ModelReply
    yields_invalid: ModelReply


# --------------------------------------------------------------------------- event sink


class CollectingEventSink:
    """Keeps every event it is given, in order, and does nothing else."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "collecting"}
