"""Interrupting is not abandoning (issue 15 design point 8; design 0163).

Cancellation stays exact (a ``CANCELLED`` finish, ``CancelledError`` re-raised, ``resume``
returns the cancelled result forever); the result says which execution the cancellation left
with an unknown outcome; ``continue_cancelled`` continues the run under a new id, by the
recovery rules, so a ``NEVER`` action in flight is never repeated.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from _session_doubles import ScriptedModel, Tally, definition, request, tool_request

from polyloop.errors import PolyloopValueError, RunIdentityError
from polyloop.serialization import decode_run_result, encode
from polyloop.session import AgentDefinition, RunRequest, continue_cancelled, resume, run
from polyloop.types import ReplayPolicy, RunResult, StopReason

pytestmark = pytest.mark.unit


async def _cancel_once_started(started: asyncio.Event, work: object) -> None:
    task = asyncio.ensure_future(work)  # type: ignore[arg-type]
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_never_action_is_named_and_never_repeated_when_continued() -> None:
    tally = Tally(gate=asyncio.Event())  # "slow" (NEVER) waits on it
    agent = definition(ScriptedModel(["tool:echo {}", "tool:slow {}", "final:x"]))
    req = tool_request(tally)
    await _cancel_once_started(tally.started, run(agent, req))

    cancelled = await resume(agent, req)
    assert cancelled.stop_reason is StopReason.CANCELLED
    assert cancelled.unknown_outcome == "a1"  # the result says it, not only the log
    assert len(cancelled.steps) == 1

    tally.gate = asyncio.Event()
    tally.gate.set()
    again = await continue_cancelled(
        agent, dataclasses.replace(req, run_id="run-1b"), cancelled_run_id="run-1"
    )
    assert again.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert again.unknown_outcome == "a1"
    assert again.steps == cancelled.steps
    assert tally.runs == {"echo": 1, "slow": 1}  # slow ran once, before the cancellation
    assert await resume(agent, req) == cancelled  # exact cancellation is kept


async def test_a_run_cancelled_during_a_safe_model_call_continues_to_the_end() -> None:
    gate = asyncio.Event()
    model = ScriptedModel(["tool:echo {}", "final:done"], gate=gate)
    agent = definition(model)
    tally = Tally()
    req = tool_request(tally, model_policy=ReplayPolicy.SAFE)
    gate.set()
    model.started.clear()

    async def gated_second_call() -> RunResult:
        return await run(agent, req)

    # Let the first call through, hold the second one, cancel while it is in flight.
    original_call = model.call
    calls = 0

    async def call(call_: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            model.started.set()
            await asyncio.Event().wait()
        return await original_call(call_)  # type: ignore[arg-type]

    model.call = call  # type: ignore[method-assign]
    await _cancel_once_started(model.started, gated_second_call())
    cancelled = await resume(agent, req)
    assert cancelled.stop_reason is StopReason.CANCELLED
    assert cancelled.unknown_outcome == "m1"

    model.call = original_call
    done = await continue_cancelled(
        agent, dataclasses.replace(req, run_id="run-2"), cancelled_run_id="run-1"
    )
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert done.final_answer == "done"
    assert done.unknown_outcome is None
    assert [s.step_idx for s in done.steps] == [0, 1]
    assert tally.runs == {"echo": 1}


async def test_only_a_cancelled_run_continues_and_only_under_a_new_id() -> None:
    agent = definition(ScriptedModel(["final:x", "final:y"]))
    req = request()
    await run(agent, req)
    with pytest.raises(RunIdentityError, match="finished as final_answer"):
        await continue_cancelled(
            agent, dataclasses.replace(req, run_id="new"), cancelled_run_id="run-1"
        )
    with pytest.raises(PolyloopValueError, match="a cancelled run stays cancelled"):
        await continue_cancelled(agent, req, cancelled_run_id="run-1")
    with pytest.raises(RunIdentityError, match="no log"):
        await continue_cancelled(
            agent, dataclasses.replace(req, run_id="new"), cancelled_run_id="nope"
        )


async def test_the_new_run_id_must_be_unused() -> None:
    tally = Tally(gate=asyncio.Event())
    agent: AgentDefinition = definition(ScriptedModel(["tool:slow {}", "final:x", "final:y"]))
    req: RunRequest = tool_request(tally)
    await _cancel_once_started(tally.started, run(agent, req))
    other = dataclasses.replace(req, run_id="taken")
    tally.gate = None
    await run(dataclasses.replace(agent, model_client=ScriptedModel(["final:z"])), other)
    with pytest.raises(RunIdentityError, match="already has a log"):
        await continue_cancelled(agent, other, cancelled_run_id="run-1")


def test_unknown_outcome_round_trips_and_older_results_read_as_none() -> None:
    result = RunResult(
        run_id="r",
        stop_reason=StopReason.CANCELLED,
        final_answer=None,
        steps=(),
        unknown_outcome="a3",
    )
    payload = encode(result)
    assert decode_run_result(payload) == result
    older = {k: v for k, v in payload.items() if k != "unknown_outcome"}
    assert decode_run_result(older).unknown_outcome is None
