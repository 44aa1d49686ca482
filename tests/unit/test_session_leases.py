"""``run()``/``resume()`` hold the run's lease (design 0120): one writer per run at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _session_doubles import (
    CodeExecutor,
    HookedStore,
    ScriptedModel,
    Tally,
    definition,
    request,
    tool_request,
)

from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    RunLeaseHeldError,
    RunLeaseLostError,
)
from polyloop.ports import LeasingRunStore, RunLease
from polyloop.session import ParameterDriftError, RunIdentityError, resume, run, run_or_resume
from polyloop.stores import ForwardingRunStore, JsonlRunStore, VolatileRunStore
from polyloop.types import RunStarted, StopReason

pytestmark = pytest.mark.unit


class KeepsLeases(VolatileRunStore):
    """A volatile store that remembers every lease it granted, so a test can lose one."""

    def __init__(self) -> None:
        super().__init__()
        self.granted: list[RunLease] = []

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0):  # type: ignore[no-untyped-def]
        lease = await super().acquire_lease(run_id, wait_seconds=wait_seconds)
        self.granted.append(lease)
        return lease


@pytest.fixture(params=["volatile", "jsonl"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LeasingRunStore:
    if request.param == "jsonl":
        return JsonlRunStore(directory=tmp_path)
    return VolatileRunStore()


async def _free(store: LeasingRunStore, run_id: str = "run-1") -> bool:
    """Whether nobody holds the run's lease now."""
    try:
        lease = await store.acquire_lease(run_id)
    except RunLeaseHeldError:
        return False
    await lease.release()
    return True


async def test_the_shipped_stores_offer_leases(store: LeasingRunStore) -> None:
    assert isinstance(store, LeasingRunStore)


async def test_run_on_a_held_run_is_refused_before_anything_happens(
    store: LeasingRunStore,
) -> None:
    model = ScriptedModel(["final:a"])
    holder = await store.acquire_lease("run-1")
    with pytest.raises(RunLeaseHeldError, match="run-1") as caught:
        await run(definition(model, store=store), request(executor=CodeExecutor()))
    assert caught.value.run_id == "run-1"
    assert model.calls == []
    assert (await store.read_log("run-1")).is_empty
    await holder.release()


async def test_resume_on_a_held_run_is_refused_and_executes_nothing(
    store: LeasingRunStore,
) -> None:
    tally = Tally()
    agent = definition(ScriptedModel(['tool:write {"text": "x"}', "final:done"]), store=store)
    await run(agent, tool_request(tally))
    log_before = await store.read_log("run-1")
    holder = await store.acquire_lease("run-1")
    with pytest.raises(RunLeaseHeldError):
        await resume(agent, tool_request(tally))
    assert await store.read_log("run-1") == log_before
    assert tally.runs == {"write": 1}
    await holder.release()


async def test_the_lease_is_released_when_run_and_resume_return(store: LeasingRunStore) -> None:
    agent = definition(ScriptedModel(["code:a", "final:done"]), store=store)
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert await _free(store)
    assert (await resume(agent, request(executor=CodeExecutor()))) == result
    assert await _free(store)


async def test_the_lease_is_released_when_the_executor_raises(store: LeasingRunStore) -> None:
    agent = definition(ScriptedModel(["code:crash"]), store=store)
    with pytest.raises(OSError, match="executor bug"):
        await run(agent, request(executor=CodeExecutor()))
    assert await _free(store)


async def test_the_lease_is_released_when_resume_refuses(store: LeasingRunStore) -> None:
    agent = definition(ScriptedModel(["code:crash"]), store=store)
    with pytest.raises(RunIdentityError):
        await resume(agent, request(executor=CodeExecutor()))
    assert await _free(store)
    await store.write_run_started(RunStarted(run_id="run-1", parameter_snapshot={"x": "y"}))
    with pytest.raises(ParameterDriftError):
        await resume(agent, request(executor=CodeExecutor()))
    assert await _free(store)


async def test_the_lease_is_released_after_a_cancellation(store: LeasingRunStore) -> None:
    tally = Tally(gate=asyncio.Event())
    agent = definition(ScriptedModel(["tool:slow"]), store=store)
    task = asyncio.ensure_future(run(agent, tool_request(tally)))
    await asyncio.wait_for(tally.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await store.read_log("run-1")
    assert log.finished is not None
    assert log.finished.result.stop_reason is StopReason.CANCELLED
    assert await _free(store)


async def test_resume_waits_for_the_holder_when_asked_to(store: LeasingRunStore) -> None:
    agent = definition(ScriptedModel(["code:a", "final:done"]), store=store)
    crashing = definition(ScriptedModel(["code:crash"]), store=store)
    with pytest.raises(OSError, match="executor bug"):
        await run(crashing, request(executor=CodeExecutor()))
    holder = await store.acquire_lease("run-1")

    async def release_soon() -> None:
        await asyncio.sleep(0.1)
        await holder.release()

    releaser = asyncio.ensure_future(release_soon())
    # The crashed run's NEVER action is unknown: resume stops, but only after the wait.
    result = await resume(agent, request(executor=CodeExecutor()), lease_wait_seconds=5)
    await releaser
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN


async def test_a_lease_lost_mid_run_stops_the_run_and_writes_nothing_more() -> None:
    store = KeepsLeases()
    tally = Tally(gate=asyncio.Event())
    agent = definition(ScriptedModel(["tool:slow", "final:done"]), store=store)
    task = asyncio.ensure_future(run(agent, tool_request(tally)))
    await asyncio.wait_for(tally.started.wait(), 5)
    # The holder loses its lease while its action runs, and another holder takes over.
    (lease,) = store.granted
    await lease.release()
    successor = await store.acquire_lease("run-1")
    log_at_takeover = await store.read_log("run-1")
    tally.gate.set()  # type: ignore[union-attr]
    with pytest.raises(RunLeaseLostError) as caught:
        await asyncio.wait_for(task, 5)
    assert caught.value.epoch == lease.epoch
    assert await store.read_log("run-1") == log_at_takeover
    await successor.release()


async def test_a_store_without_leases_keeps_working() -> None:
    store = HookedStore()  # a plain RunStore: no acquire_lease
    assert not isinstance(store, LeasingRunStore)
    agent = definition(ScriptedModel(["code:a", "final:done"]), store=store)
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert (await resume(agent, request(executor=CodeExecutor()))) == result


@pytest.mark.parametrize(
    ("wait", "error"),
    [(-1, PolyloopValueError), (float("nan"), PolyloopValueError), ("1", PolyloopTypeError)],
)
async def test_a_bad_lease_wait_is_refused_before_anything_happens(
    wait: object, error: type[Exception]
) -> None:
    model = ScriptedModel(["final:a"])
    agent = definition(model)
    with pytest.raises(error, match="lease_wait_seconds"):
        await run(agent, request(executor=CodeExecutor()), lease_wait_seconds=wait)  # type: ignore[arg-type]
    assert model.calls == []


async def test_duplicate_run_or_resume_calls_run_once_and_agree(store: LeasingRunStore) -> None:
    tally = Tally()
    script = ['tool:write {"text": "a"}', "final:done"]
    calls = [
        run_or_resume(
            definition(ScriptedModel(script), store=store),
            tool_request(tally),
            lease_wait_seconds=5,
        )
        for _ in range(3)
    ]
    results = await asyncio.gather(*calls)
    assert all(result == results[0] for result in results)
    assert tally.runs == {"write": 1}


async def test_a_duplicate_run_or_resume_that_does_not_wait_is_refused(
    store: LeasingRunStore,
) -> None:
    tally = Tally(gate=asyncio.Event())
    first = asyncio.ensure_future(
        run_or_resume(definition(ScriptedModel(["tool:slow"]), store=store), tool_request(tally))
    )
    await asyncio.wait_for(tally.started.wait(), 5)
    with pytest.raises(RunLeaseHeldError):
        await run_or_resume(
            definition(ScriptedModel(["tool:slow"]), store=store), tool_request(tally)
        )
    tally.gate.set()  # type: ignore[union-attr]
    await asyncio.wait_for(first, 5)
    assert tally.runs == {"slow": 1}


async def test_a_writer_that_cannot_be_built_releases_the_lease_it_was_built_on() -> None:
    """Between ``acquire_lease`` and the run's first write the session builds its writer; if
    that raises (here the lease's ``epoch`` does), the lease is let go, not held until it
    expires: the next caller gets it at once."""
    from polyloop.session._leasing import held_lease

    inner = VolatileRunStore()

    class BrokenEpoch:
        def __init__(self, lease: RunLease) -> None:
            self.lease = lease

        def __getattr__(self, name: str) -> object:
            return getattr(self.lease, name)

        @property
        def epoch(self) -> int:
            raise RuntimeError("no epoch")

    class Store(ForwardingRunStore):
        async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> RunLease:
            return BrokenEpoch(await inner.acquire_lease(run_id, wait_seconds=wait_seconds))  # type: ignore[return-value]

    with pytest.raises(RuntimeError, match="no epoch"):
        async with held_lease(Store(inner), "r1", 0.0):
            pass
    again = await inner.acquire_lease("r1", wait_seconds=0.0)
    await again.release()


async def test_an_optional_write_a_wrapper_forwards_by_getattr_is_a_capability() -> None:
    """A user's wrapper that forwards what it does not define with ``__getattr__`` settles
    and asks for approval as the store it wraps does (``isinstance`` on a Protocol stopped
    seeing ``__getattr__`` in Python 3.12; the writer looks for the method itself)."""
    from polyloop.session._leasing import RunWriter
    from polyloop.types import ApprovalRequest, Settlement

    class Wrapper:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    writer = RunWriter(Wrapper(VolatileRunStore()))  # type: ignore[arg-type]
    assert writer.can_write(Settlement)
    assert writer.can_write(ApprovalRequest)
