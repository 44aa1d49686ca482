"""``EventSinkContract``: what any event sink must do, which is very little.

Known shapes differ in what they need: one writes progress to a database a front end polls
(low latency, may drop), another pushes audit events into a log pipeline (must not drop, may
be slow). The substantive guarantees (a raising sink never breaks a run, failures are never
re-emitted, the audit trail lives in the store) are the library's, and are tested there; the
skips below say where.

Optional, the ``ProgressSink`` capability (``emit_progress``, design 0211 amendment): a sink
that has it must accept progress reports, many per step; a sink without it skips that test
with the "cannot be verified at this layer." reason.
"""

from __future__ import annotations

import pytest

from polyloop.ports import EventSink
from polyloop.testing._records import RecordFactory
from polyloop.testing._support import ContractBase, string_mapping_problems, unverifiable

__all__ = ["EventSinkContract"]


class EventSinkContract(ContractBase):
    """Contract suite for the event seam. Override ``event_sink``::

    class TestMySink(EventSinkContract):
        @pytest.fixture
        def event_sink(self):
            return MySink(queue=InMemoryQueue())
    """

    @pytest.fixture
    def event_sink(self) -> EventSink:
        """The sink under test. Override it and return your instance, connected to a
        backend that is up (a local or in-memory one is fine)."""
        raise NotImplementedError(
            f"{type(self).__name__} inherits EventSinkContract but does not override the "
            "`event_sink` fixture. Define `@pytest.fixture def event_sink(self, ...)` in your "
            "subclass and return an instance of your EventSink implementation, connected to "
            "a working (local or in-memory) backend."
        )

    async def test_emit_accepts_an_event(
        self, event_sink: EventSink, records: RecordFactory
    ) -> None:
        """On the normal path (backend up), ``emit`` accepts an event without raising."""
        await event_sink.emit(records.event())

    async def test_emit_accepts_one_event_per_step(
        self, event_sink: EventSink, records: RecordFactory
    ) -> None:
        """``emit`` keeps accepting events: a run emits one per step, on the same sink.

        A sink that can deliver only once (a connection closed after the first send, a
        one-shot queue) passes a single-event test and loses every later step.
        """
        for step_idx in range(3):
            await event_sink.emit(records.event(step_idx=step_idx))

    async def test_parameters_map_strings_to_strings(self, event_sink: EventSink) -> None:
        """``parameters()`` is a mapping of ``str`` to ``str``; it enters the run's parameter
        snapshot, which is string-to-string, and the library refuses anything else."""
        assert string_mapping_problems(event_sink.parameters()) == []

    async def test_parameters_are_stable_across_calls(
        self, event_sink: EventSink, records: RecordFactory
    ) -> None:
        """``parameters()`` reports configuration, not state: emitting does not change it. An
        event counter in it would make every ``resume`` refuse the run as drifted."""
        before = dict(event_sink.parameters())
        await event_sink.emit(records.event())
        assert dict(event_sink.parameters()) == before

    async def test_emit_progress_accepts_progress_reports(
        self, event_sink: EventSink, records: RecordFactory
    ) -> None:
        """A sink with ``emit_progress`` (``ProgressSink``) accepts a running call's progress
        reports, several per step, then the step's event, without raising on the normal path."""
        emit_progress = getattr(event_sink, "emit_progress", None)
        if not callable(emit_progress):
            pytest.skip(
                unverifiable(
                    promise="a sink with emit_progress accepts the progress reports of "
                    "running tool calls (polyloop.ports.ProgressSink).",
                    why_not_here="this sink has no emit_progress: it gets step events only, "
                    "which is compliant.",
                    check_it_yourself="nothing, unless you want progress: then add `async def "
                    "emit_progress(self, progress: ToolProgress) -> None`.",
                )
            )
        for reported in (1.0, 2.0, 3.0):
            await emit_progress(records.progress(progress=reported))
        await event_sink.emit(records.event())

    # ------------------------------------------------------------ checked by the library

    async def test_a_raising_sink_is_compliant_so_this_layer_asserts_nothing(self) -> None:
        """A sink may raise when its backend is down (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="a sink that raises when its backend is down (say ConnectionError) "
                "is compliant: the library catches the failure, logs it, counts it in "
                "RunResult.event_delivery_failures and goes on with the run.",
                why_not_here="'the library caught it and kept running' only shows after a "
                "whole run.",
                check_it_yourself="nothing to check on your side, and do not add an "
                "'emit never raises' test of your own. The library's tests guard the catch "
                "and the count.",
            )
        )

    async def test_the_no_re_emission_guarantee_is_asserted_in_the_library_not_here(
        self,
    ) -> None:
        """Delivery failures are never emitted as events (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="a delivery failure is never turned into an event and sent through "
                "the same sink; that would feed on itself and recurse until the process "
                "hangs or the stack overflows.",
                why_not_here="a sink cannot count how many times the library called it for "
                "one step.",
                check_it_yourself="nothing to check on your side. The library's tests run a "
                "whole run with an always-raising sink and check that it received exactly "
                "one event per step.",
            )
        )

    async def test_the_audit_trail_is_asserted_against_the_log_not_here(self) -> None:
        """The audit trail lives in the store, not in events (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="both the model's raw reply and the text that went back into history "
                "are on record, in the write-ahead log: the raw reply in the model call "
                "result, the history text in the step record's raw_output. The event stream "
                "may drop events, so it cannot carry that duty.",
                why_not_here="it needs a whole run and a read of its log.",
                check_it_yourself="rely on RunStoreContract for your store, and do not "
                "expect events to carry both texts.",
            )
        )
