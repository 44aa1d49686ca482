"""``DecisionParserContract`` wired to the prefix parser double from ``_doubles.py``."""

from __future__ import annotations

import pytest
from _doubles import PrefixDecisionParser, ReplySamples

from polyloop.ports import DecisionParser
from polyloop.testing import DecisionParserContract, RecordFactory

pytestmark = pytest.mark.contract


class TestPrefixDecisionParser(DecisionParserContract):
    @pytest.fixture
    def decision_parser(self) -> DecisionParser:
        return PrefixDecisionParser()

    @pytest.fixture
    def reply_samples(self, records: RecordFactory) -> ReplySamples:
        return ReplySamples(
            yields_an_action=records.reply(content="DO count to three"),
            yields_invalid=records.reply(content="Let me think about it first."),
        )
