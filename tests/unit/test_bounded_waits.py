"""Bounded waits per model call, action and event (issue 15 design point 9; design 0164)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
from _session_doubles import (
    CodeExecutor,
    RecordingSink,
    ScriptedModel,
    Tally,
    definition,
    request,
    tool_request,
)

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import Event
from polyloop.session import resume, run
from polyloop.stores import VolatileRunStore
from polyloop.types import IntentKind, StopReason

pytestmark = pytest.mark.unit


async def test_a_model_call_that_outlives_its_bound_is_a_failed_call() -> None:
    model = ScriptedModel(["final:never sent"], gate=asyncio.Event())  # never opened
    agent = definition(model)
    result = await run(agent, request(model_call_timeout_seconds=0.05))
    assert result.stop_reason is StopReason.LLM_ERROR
    log = await agent.store.read_log("run-1")
    failure = log.model_results[0].failure
    assert failure is not None
    assert failure.startswith("SeamTimeoutError: the model call did not return within 0.05 s")
    assert "RunRequest.model_call_timeout_seconds" in failure
    assert await resume(agent, request(model_call_timeout_seconds=0.05)) == result


async def test_a_timeout_the_client_raises_itself_stays_its_own_failure() -> None:
    agent = definition(ScriptedModel([TimeoutError("gateway said so")]))
    await run(agent, request(model_call_timeout_seconds=5.0))
    log = await agent.store.read_log("run-1")
    assert log.model_results[0].failure == "TimeoutError: gateway said so"


async def test_an_action_that_outlives_its_bound_stops_the_run_and_is_never_repeated() -> None:
    tally = Tally(gate=asyncio.Event())  # the slow tool waits on it forever
    agent = definition(ScriptedModel(["tool:echo {}", "tool:slow {}", "final:x"]))
    req = tool_request(tally, action_timeout_seconds=0.05)
    result = await run(agent, req)
    assert result.stop_reason is StopReason.ACTION_TIMEOUT
    assert len(result.steps) == 1  # the timed-out step has no record: its outcome is unknown
    assert tally.runs == {"echo": 1, "slow": 1}
    log = await agent.store.read_log("run-1")
    assert [i.kind for i in log.intents][-1] is IntentKind.ACTION
    assert len(log.steps) == 1
    assert log.finished is not None
    assert await resume(agent, req) == result
    assert tally.runs == {"echo": 1, "slow": 1}


async def test_a_timed_out_never_action_whose_finish_was_lost_is_not_replayed() -> None:
    tally = Tally(gate=asyncio.Event())
    agent = definition(ScriptedModel(["tool:slow {}", "final:x"]))
    req = tool_request(tally, action_timeout_seconds=0.05)
    await run(agent, req)
    log = await agent.store.read_log("run-1")
    crashed = VolatileRunStore()  # the same log, as if the process died before the finish
    await crashed.write_run_started(log.started)  # type: ignore[arg-type]
    await crashed.write_intent(log.intents[0])
    await crashed.write_model_call_result(log.model_results[0])
    await crashed.write_intent(log.intents[1])
    again = await resume(dataclasses.replace(agent, store=crashed), req)
    assert again.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert tally.runs == {"slow": 1}


class _HangingSink(RecordingSink):
    async def emit(self, event: Event) -> None:
        self.events.append(event)
        await asyncio.Event().wait()


async def test_an_event_sink_that_hangs_is_a_counted_delivery_failure() -> None:
    sink = _HangingSink()
    agent = definition(ScriptedModel(["code:a", "final:x"]), sink=sink)
    result = await run(agent, request(executor=CodeExecutor(), event_timeout_seconds=0.05))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.event_delivery_failures == 2
    assert len(sink.events) == 2


def test_defaults_never_cut_off_a_model_and_stay_out_of_the_snapshot() -> None:
    req = tool_request(Tally())
    assert req.model_call_timeout_seconds is None
    assert req.action_timeout_seconds is None
    assert req.event_timeout_seconds == 30.0
    assert not any("timeout" in key for key in req.parameter_snapshot())
    bounded = dataclasses.replace(req, model_call_timeout_seconds=600, action_timeout_seconds=60)
    snapshot = bounded.parameter_snapshot()
    assert snapshot["request.model_call_timeout_seconds"] == "600.0"
    assert snapshot["request.action_timeout_seconds"] == "60.0"
    assert not any("event_timeout" in key for key in snapshot)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, PolyloopValueError),
        (-1.0, PolyloopValueError),
        (math.nan, PolyloopValueError),
        (math.inf, PolyloopValueError),
        (True, PolyloopTypeError),
        ("5", PolyloopTypeError),
    ],
)
@pytest.mark.parametrize(
    "name", ["model_call_timeout_seconds", "action_timeout_seconds", "event_timeout_seconds"]
)
def test_bounds_must_be_positive_finite_seconds(name: str, value: object, error: type) -> None:
    with pytest.raises(error, match=f"RunRequest.{name}"):
        tool_request(Tally(), **{name: value})
