"""The stock parts certified by the contract suite (issue 12, item 2; designs 0113-0115).

``JsonToolCallParser`` against ``DecisionParserContract``; ``NullEventSink`` and
``LoggingEventSink`` against ``EventSinkContract``; the executor of a
registry built with ``ToolSpec.from_function`` against ``ActionExecutorContract`` (its
handlers convert typed arguments, so the contract runs through that wrapper too).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest
from _doubles import ActionSamples, ReplySamples

from polyloop.parsers import JsonToolCallParser
from polyloop.ports import ActionExecutor, DecisionParser, EventSink, ToolContext
from polyloop.sinks import LoggingEventSink, NullEventSink
from polyloop.testing import (
    ActionExecutorContract,
    DecisionParserContract,
    EventSinkContract,
    RecordFactory,
)
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy

pytestmark = pytest.mark.contract


class TestJsonToolCallParser(DecisionParserContract):
    @pytest.fixture
    def decision_parser(self) -> DecisionParser:
        return JsonToolCallParser()

    @pytest.fixture
    def reply_samples(self, records: RecordFactory) -> ReplySamples:
        return ReplySamples(
            yields_an_action=records.reply(
                content='I will add.\n```json\n{"tool": "add", "arguments": {"a": 1}}\n```'
            ),
            yields_invalid=records.reply(content='{"x": 1}'),
        )


class TestNullEventSink(EventSinkContract):
    @pytest.fixture
    def event_sink(self) -> EventSink:
        return NullEventSink()


class TestLoggingEventSink(EventSinkContract):
    @pytest.fixture
    def event_sink(self) -> EventSink:
        logger = logging.getLogger("polyloop.tests.stock_sink")
        logger.addHandler(logging.NullHandler())
        return LoggingEventSink(logger, level=logging.DEBUG)


async def shout(text: str, times: int = 1) -> str:
    """Repeat the text in capitals."""
    return " ".join([text.upper()] * times)


async def divide(numerator: float, denominator: float) -> str:
    """Divide two numbers (fails on a zero denominator)."""
    return str(numerator / denominator)


class TestFromFunctionRegistryExecutor(ActionExecutorContract):
    @pytest.fixture
    def action_executor(self) -> ActionExecutor:
        return ToolRegistry(
            [ToolSpec.from_function(shout), ToolSpec.from_function(divide)]
        ).executor()

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        return ActionSamples(
            executes_cleanly=records.action(
                text="shout", tool_name="shout", arguments={"text": "hi", "times": 2.0}
            ),
            executes_but_errors=records.action(
                text="divide", tool_name="divide", arguments={"numerator": 1, "denominator": 0}
            ),
        )


class TestKeyedFromFunctionRegistryExecutor(ActionExecutorContract):
    """A ``from_function`` tool that takes its ``ToolContext`` and hands the key to its
    "system" (a list): certifies that the registry executor passes the key through."""

    keys: list[str]

    @pytest.fixture
    def action_executor(self) -> ActionExecutor:
        keys: list[str] = []
        self.keys = keys

        async def charge(ctx: ToolContext, cents: int) -> str:
            """Charge a card (deduplicated by the key)."""
            keys.append(ctx.idempotency_key)
            return f"charged {cents}"

        async def refund(ctx: ToolContext, cents: int) -> str:
            """Refund (always fails here)."""
            raise RuntimeError(f"no charge of {cents} under {ctx.idempotency_key}")

        return ToolRegistry(
            [
                ToolSpec.from_function(charge, replay_policy=ReplayPolicy.IDEMPOTENT),
                ToolSpec.from_function(refund),
            ]
        ).executor()

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        context = ToolContext(idempotency_key="polyloop:r:sample:a0", run_id="sample", step_idx=0)
        return ActionSamples(
            executes_cleanly=dataclasses.replace(
                records.action(text="charge", tool_name="charge", arguments={"cents": 5}),
                context=context,
            ),
            executes_but_errors=dataclasses.replace(
                records.action(text="refund", tool_name="refund", arguments={"cents": 5}),
                context=context,
            ),
        )

    @pytest.fixture
    def idempotency_keys_seen(self, action_executor: ActionExecutor) -> Callable[[], list[str]]:
        return lambda: list(self.keys)
