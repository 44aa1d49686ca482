"""``NativeToolCallParserContract`` wired to the stock ``polyloop.parsers.NativeToolCallParser``."""

from __future__ import annotations

import pytest

from polyloop.parsers import NativeToolCallParser
from polyloop.ports import DecisionParser
from polyloop.testing import NativeToolCallParserContract

pytestmark = pytest.mark.contract


class TestNativeToolCallParser(NativeToolCallParserContract):
    @pytest.fixture
    def decision_parser(self) -> DecisionParser:
        return NativeToolCallParser()
