"""Bounded waits per model call, action and event (issue 15 design point 9; design 0164)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

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

from polyloop.errors import PolyloopTypeError, PolyloopValueError, SeamTimeoutError
from polyloop.ports import Event
from polyloop.session import resume, run
from polyloop.session._waits import bounded
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


async def test_a_never_action_that_outlives_its_bound_is_in_doubt_and_never_repeated() -> None:
    """Design 0227: the cut-off action's outcome is unknown, so the run stops open with
    ``RESUME_STATE_UNKNOWN`` (``slow`` is ``NEVER``) for a reconciler or a person."""
    tally = Tally(gate=asyncio.Event())  # the slow tool waits on it forever
    agent = definition(ScriptedModel(["tool:echo {}", "tool:slow {}", "final:x"]))
    req = tool_request(tally, action_timeout_seconds=0.05)
    result = await run(agent, req)
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a1"
    assert len(result.steps) == 1  # the timed-out step has no record: its outcome is unknown
    assert tally.runs == {"echo": 1, "slow": 1}
    log = await agent.store.read_log("run-1")
    assert [i.kind for i in log.intents][-1] is IntentKind.ACTION
    assert len(log.steps) == 1
    assert log.finished is None  # open: it can be settled
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


# --- the bound itself (``session._waits.bounded``; design 0214, second pass: no timer is armed
# for a call that returns before it first suspends, and the deadline counts from the start) ---


async def test_a_call_that_returns_at_once_is_not_cut_off_and_arms_no_timer() -> None:
    async def at_once() -> str:
        return "done"

    loop = asyncio.get_running_loop()
    armed: list[float] = []
    real_call_at = loop.call_at

    def call_at(when: float, *args: object, **kwargs: object) -> asyncio.TimerHandle:
        armed.append(when)
        return real_call_at(when, *args, **kwargs)  # type: ignore[arg-type]

    loop.call_at = call_at  # type: ignore[method-assign]
    try:
        assert await bounded(at_once(), 1e-9, "the probe", "probe_seconds") == "done"
    finally:
        del loop.call_at
    assert armed == []


async def test_the_bound_counts_from_the_call_not_from_its_first_suspension() -> None:
    async def busy_then_wait() -> str:
        time.sleep(0.06)  # noqa: ASYNC251 - synchronous work before the first await uses up the bound
        await asyncio.sleep(0.01)
        return "late"

    with pytest.raises(SeamTimeoutError, match=r"the probe did not return within 0\.05 s"):
        await bounded(busy_then_wait(), 0.05, "the probe", "probe_seconds")


async def test_a_suspended_call_is_cancelled_at_the_deadline_and_sees_the_cancellation() -> None:
    seen: list[str] = []

    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(SeamTimeoutError, match=r"RunRequest\.probe_seconds"):
        await bounded(hangs(), 0.02, "the probe", "probe_seconds")
    assert seen == ["cancelled"]


async def test_a_suspended_call_gets_its_results_and_raises_its_own_errors() -> None:
    async def waits_and_answers() -> int:
        await asyncio.sleep(0)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, 41)
        return await future + 1

    async def waits_and_times_out_itself() -> None:
        await asyncio.sleep(0)
        raise TimeoutError("the gateway said so")

    async def times_out_itself_at_once() -> None:
        raise TimeoutError("at once")

    assert await bounded(waits_and_answers(), 5.0, "the probe", "probe_seconds") == 42
    with pytest.raises(TimeoutError, match="the gateway said so") as raised:
        await bounded(waits_and_times_out_itself(), 5.0, "the probe", "probe_seconds")
    assert not isinstance(raised.value, SeamTimeoutError)
    with pytest.raises(TimeoutError, match="at once") as raised:
        await bounded(times_out_itself_at_once(), 5.0, "the probe", "probe_seconds")
    assert not isinstance(raised.value, SeamTimeoutError)


async def test_a_cancellation_from_outside_reaches_a_bounded_call_and_passes() -> None:
    started, seen = asyncio.Event(), []

    async def hangs() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = asyncio.ensure_future(bounded(hangs(), 60.0, "the probe", "probe_seconds"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]
