"""``EventSinkContract`` wired to the collecting sink double from ``_doubles.py``."""

from __future__ import annotations

import pytest
from _doubles import CollectingEventSink

from polyloop.ports import EventSink
from polyloop.testing import EventSinkContract

pytestmark = pytest.mark.contract


class TestCollectingEventSink(EventSinkContract):
    @pytest.fixture
    def event_sink(self) -> EventSink:
        return CollectingEventSink()
