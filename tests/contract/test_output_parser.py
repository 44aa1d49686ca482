"""``polyloop.agent.OutputParser`` certified like any parser (design 0208).

Wrapped around ``NativeToolCallParser`` it must still be a native parser
(``NativeToolCallParserContract``); wrapped around ``JsonToolCallParser`` it must still be a
parser (``DecisionParserContract``). Reading ``final_result`` is what it adds; the unit tests in
``tests/unit/test_structured_output.py`` pin that.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from _doubles import ReplySamples

from polyloop.agent import OutputParser
from polyloop.parsers import JsonToolCallParser, NativeToolCallParser
from polyloop.ports import DecisionParser
from polyloop.testing import DecisionParserContract, NativeToolCallParserContract, RecordFactory

pytestmark = pytest.mark.contract


@dataclass
class Verdict:
    label: str
    score: int


class TestOutputParserAroundTheNativeParser(NativeToolCallParserContract):
    @pytest.fixture
    def decision_parser(self) -> DecisionParser:
        return OutputParser(NativeToolCallParser(), Verdict)


class TestOutputParserAroundTheJsonParser(DecisionParserContract):
    @pytest.fixture
    def decision_parser(self) -> DecisionParser:
        return OutputParser(JsonToolCallParser(), Verdict)

    @pytest.fixture
    def reply_samples(self, records: RecordFactory) -> ReplySamples:
        return ReplySamples(
            yields_an_action=records.reply(content='{"tool": "add", "arguments": {"a": 1}}'),
            yields_invalid=records.reply(
                content='{"tool": "final_result", "arguments": {"label": "ok", "score": "high"}}'
            ),
        )
