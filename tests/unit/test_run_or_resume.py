"""``polyloop.session.run_or_resume``: start, continue or read back, whatever the log says."""

from __future__ import annotations

import asyncio

import pytest
from _session_doubles import ScriptedModel, Tally, definition, tool_request

from polyloop.errors import RunIdentityError
from polyloop.session import run, run_or_resume
from polyloop.stores import VolatileRunStore
from polyloop.types import StopReason

pytestmark = pytest.mark.unit

SCRIPT = ['tool:write {"text": "a"}', 'tool:echo {"text": "b"}', "final:done"]


async def test_a_new_run_id_is_started() -> None:
    tally = Tally()
    model = ScriptedModel(SCRIPT)
    store = VolatileRunStore()
    result = await run_or_resume(definition(model, store=store), tool_request(tally))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(result.steps) == 3
    assert tally.runs == {"write": 1, "echo": 1}
    log = await store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result == result


async def test_a_finished_run_returns_its_stored_result_and_does_nothing() -> None:
    tally = Tally()
    store = VolatileRunStore()
    first = await run(definition(ScriptedModel(SCRIPT), store=store), tool_request(tally))
    model = ScriptedModel(SCRIPT)
    again = await run_or_resume(definition(model, store=store), tool_request(tally))
    assert again == first
    assert model.calls == []
    assert tally.runs == {"write": 1, "echo": 1}


class _DiesBeforeStep:
    """A store whose ``write_step_completed`` raises while ``dead`` is set (a worker dying
    after its action ran, before the step landed)."""

    offers_leases = False  # unleased on purpose: the writes must reach the hook here

    def __init__(self) -> None:
        self.inner = VolatileRunStore()
        self.dead = True

    def __getattr__(self, name: str) -> object:
        if name == "acquire_lease":
            # A plain RunStore, so the session's writes reach the hook below instead of going
            # through the inner store's lease (design 0120).
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def write_step_completed(self, record: object) -> None:
        if self.dead:
            raise _Died
        await self.inner.write_step_completed(record)  # type: ignore[arg-type]


class _Died(Exception):
    pass


async def test_an_unfinished_run_is_resumed_and_its_never_action_is_not_repeated() -> None:
    tally = Tally()
    store = _DiesBeforeStep()
    with pytest.raises(_Died):
        await run(definition(ScriptedModel(SCRIPT), store=store), tool_request(tally))
    assert tally.runs == {"write": 1}
    store.dead = False
    model = ScriptedModel(SCRIPT)
    result = await run_or_resume(definition(model, store=store), tool_request(tally))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert tally.runs == {"write": 1}, "the NEVER action ran again"
    assert model.calls == []


async def test_an_unfinished_run_whose_last_action_was_safe_continues_to_the_end() -> None:
    tally = Tally()
    store = _DiesBeforeStep()
    script = ['tool:echo {"text": "a"}', 'tool:write {"text": "b"}', "final:done"]
    with pytest.raises(_Died):
        await run(definition(ScriptedModel(script), store=store), tool_request(tally))
    store.dead = False
    result = await run_or_resume(
        definition(ScriptedModel(script), store=store), tool_request(tally)
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert [step.step_idx for step in result.steps] == [0, 1, 2]
    assert tally.runs == {"echo": 2, "write": 1}, "SAFE replayed once, NEVER ran once"


async def test_a_cancelled_run_is_read_back_not_run_again() -> None:
    tally = Tally()
    store = VolatileRunStore()
    gate = asyncio.Event()
    model = ScriptedModel(SCRIPT, gate=gate)
    task = asyncio.ensure_future(run(definition(model, store=store), tool_request(tally)))
    await asyncio.sleep(0.05)
    assert len(model.calls) == 1, "the first model call is held open"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    again = await run_or_resume(definition(ScriptedModel(SCRIPT), store=store), tool_request(tally))
    assert again.stop_reason is StopReason.CANCELLED
    assert tally.runs == {}


async def test_a_start_lost_to_a_concurrent_caller_turns_into_a_resume() -> None:
    # Both callers read an empty log; one start wins, the other gets RunIdentityError from
    # the exclusive start and must resume (here: read back the winner's finished run).
    tally = Tally()
    store = VolatileRunStore()
    winner = definition(ScriptedModel(SCRIPT), store=store)

    class RacingStore:
        """Reports an empty log once, as if read just before the winner's start landed."""

        offers_leases = False  # the race is staged by the store itself

        def __init__(self) -> None:
            self.reads = 0

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        async def read_log(self, run_id: str) -> object:
            self.reads += 1
            if self.reads == 1:
                await run(winner, tool_request(tally))
                return await VolatileRunStore().read_log(run_id)
            return await store.read_log(run_id)

    loser_model = ScriptedModel(SCRIPT)
    result = await run_or_resume(definition(loser_model, store=RacingStore()), tool_request(tally))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert loser_model.calls == []
    assert tally.runs == {"write": 1, "echo": 1}


async def test_a_torn_first_record_is_reported_not_hidden() -> None:
    # An entry the store cannot read as a run (start died half-way) is neither new nor
    # resumable: the caller gets RunIdentityError, nothing is written.
    store = VolatileRunStore()

    class TornStore:
        offers_leases = False  # a plain RunStore: writes must reach the hook below

        def __getattr__(self, name: str) -> object:
            if name == "acquire_lease":  # a plain RunStore: writes must reach the hook below
                raise AttributeError(name)
            return getattr(store, name)

        async def write_run_started(self, record: object) -> None:
            raise FileExistsError("a torn first record")

    with pytest.raises(RunIdentityError):
        await run_or_resume(
            definition(ScriptedModel(SCRIPT), store=TornStore()), tool_request(Tally())
        )
    assert (await store.read_log("run-1")).is_empty
