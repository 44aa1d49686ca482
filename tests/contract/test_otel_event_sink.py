"""``EventSinkContract`` wired to ``polyloop.otel.OtelEventSink``, with a working exporter and
with one whose collector is down (exporting is the provider's business, never the run's)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from polyloop.otel import OtelEventSink
from polyloop.ports import EventSink
from polyloop.testing import EventSinkContract

pytestmark = pytest.mark.contract


class _DownExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionRefusedError("collector is down")

    def shutdown(self) -> None:
        return None


def _sink(exporter: SpanExporter) -> OtelEventSink:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelEventSink(tracer_provider=provider)


class TestOtelEventSink(EventSinkContract):
    @pytest.fixture
    def event_sink(self) -> EventSink:
        return _sink(InMemorySpanExporter())


class TestOtelEventSinkWithTheCollectorDown(EventSinkContract):
    @pytest.fixture
    def event_sink(self) -> EventSink:
        return _sink(_DownExporter())
