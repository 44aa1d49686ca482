"""The stock parts certified by the contract suite (issue 12, item 2; designs 0113-0115).

``JsonToolCallParser`` against ``DecisionParserContract``; ``NullEventSink`` and
``LoggingEventSink`` against ``EventSinkContract``; the executor of a
registry built with ``ToolSpec.from_function`` against ``ActionExecutorContract`` (its
handlers convert typed arguments, so the contract runs through that wrapper too).
"""

from __future__ import annotations

import logging

import pytest
from _doubles import ActionSamples, ReplySamples

from polyloop.parsers import JsonToolCallParser
from polyloop.ports import ActionExecutor, DecisionParser, EventSink
from polyloop.sinks import LoggingEventSink, NullEventSink
from polyloop.testing import (
    ActionExecutorContract,
    DecisionParserContract,
    EventSinkContract,
    RecordFactory,
)
from polyloop.tools import ToolRegistry, ToolSpec

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
