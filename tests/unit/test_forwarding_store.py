"""``ForwardingRunStore``: a store wrapper that keeps the wrapped store's leases (issue 20).

The contract suites run over it in ``tests/contract/test_run_stores.py``; this file pins what
they do not see: the lease capability is there exactly when the inner store has it, a wrapper
does lease through the inner store, a subclass keeps its own ``acquire_lease``, and a run
through the wrapper is leased.
"""

from __future__ import annotations

import pathlib

import pytest
from _session_doubles import CodeExecutor, ScriptedModel, definition, request

from _shared_doubles import PlainStore
from polyloop.errors import PolyloopTypeError, RunLeaseHeldError
from polyloop.ports import LeasingRunStore, RunLease, RunLog, RunStore, SettlingRunStore
from polyloop.session import run
from polyloop.stores import ForwardingRunStore, VolatileRunStore
from polyloop.testing import RecordFactory
from polyloop.types import (
    Settlement,
    StopReason,
)

pytestmark = pytest.mark.unit


class SaysItHasNoLeases(PlainStore):
    offers_leases = False


def test_a_wrapper_of_a_leasing_store_is_a_leasing_store() -> None:
    wrapper = ForwardingRunStore(VolatileRunStore())
    assert isinstance(wrapper, RunStore)
    assert isinstance(wrapper, LeasingRunStore)
    assert not hasattr(wrapper, "offers_leases")


def test_a_wrapper_of_a_plain_store_has_no_leases_and_says_what_the_store_says() -> None:
    silent = ForwardingRunStore(PlainStore())
    assert isinstance(silent, RunStore)
    assert not isinstance(silent, LeasingRunStore)
    assert not hasattr(silent, "offers_leases")
    declared = ForwardingRunStore(SaysItHasNoLeases())
    assert not isinstance(declared, LeasingRunStore)
    assert declared.offers_leases is False  # type: ignore[attr-defined]


async def test_the_wrapper_leases_through_the_inner_store() -> None:
    inner = VolatileRunStore()
    wrapper = ForwardingRunStore(inner)
    assert isinstance(wrapper, LeasingRunStore)
    lease = await wrapper.acquire_lease("r1")
    with pytest.raises(RunLeaseHeldError):
        await inner.acquire_lease("r1")
    records = RecordFactory()
    await lease.write_intent(records.model_call_intent(run_id="r1", call_index=0, result_id="m0"))
    await lease.release()
    assert len((await inner.read_log("r1")).intents) == 1
    assert (await inner.acquire_lease("r1")).epoch == lease.epoch + 1


async def test_everything_else_is_forwarded_unchanged() -> None:
    inner = VolatileRunStore()
    wrapper = ForwardingRunStore(inner)
    records = RecordFactory()
    await wrapper.write_run_started(records.run_started(run_id="r1", parameter_snapshot={}))
    await wrapper.write_intent(records.model_call_intent(run_id="r1", call_index=0, result_id="m0"))
    assert await wrapper.read_log("r1") == await inner.read_log("r1")
    assert wrapper.parameters() == inner.parameters()
    assert wrapper.inner is inner
    assert repr(wrapper) == f"ForwardingRunStore({inner!r})"


class OwnLeases(ForwardingRunStore):
    """Leases its own way: here, a volatile store of its own instead of the inner one."""

    def __init__(self, inner: RunStore) -> None:
        super().__init__(inner)
        self.own = VolatileRunStore()

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> RunLease:
        return await self.own.acquire_lease(run_id, wait_seconds=wait_seconds)


async def test_a_subclass_that_leases_its_own_way_keeps_its_acquire_lease() -> None:
    inner = VolatileRunStore()
    wrapper = OwnLeases(inner)
    lease = await wrapper.acquire_lease("r1")
    assert "acquire_lease" not in vars(wrapper)
    assert (await inner.acquire_lease("r1")).run_id == "r1"  # the inner store's run is free
    with pytest.raises(RunLeaseHeldError):
        await wrapper.own.acquire_lease("r1")
    await lease.release()
    assert isinstance(OwnLeases(PlainStore()), LeasingRunStore)


class ProbesTheLease(ForwardingRunStore):
    """Records, whenever the session reads the log, whether the run's lease is held."""

    def __init__(self, inner: VolatileRunStore) -> None:
        super().__init__(inner)
        self.held_while_reading: list[bool] = []

    async def read_log(self, run_id: str) -> RunLog:
        inner = self.inner
        assert isinstance(inner, LeasingRunStore)
        try:
            lease = await inner.acquire_lease(run_id)
        except RunLeaseHeldError:
            self.held_while_reading.append(True)
        else:
            await lease.release()
            self.held_while_reading.append(False)
        return await super().read_log(run_id)


async def test_a_run_through_the_wrapper_holds_the_inner_stores_lease() -> None:
    inner = VolatileRunStore()
    wrapper = ProbesTheLease(inner)
    agent = definition(ScriptedModel(["code:a", "final:done"]), store=wrapper)
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert wrapper.held_while_reading
    assert all(wrapper.held_while_reading)
    assert (await inner.read_log("run-1")).finished is not None
    lease = await inner.acquire_lease("run-1")  # released when the run returned
    await lease.release()


@pytest.mark.parametrize("wrong", [object(), None, "runs/"])
def test_a_wrapper_of_something_else_is_refused_naming_what_it_got(wrong: object) -> None:
    with pytest.raises(PolyloopTypeError) as caught:
        ForwardingRunStore(wrong)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "ForwardingRunStore: inner must be a RunStore (the five write methods, read_log and "
        f"parameters), got {type(wrong).__name__}; pass the store this wrapper stands in front "
        "of"
    )


def test_write_settlement_is_there_exactly_when_the_inner_store_has_it() -> None:
    """Like ``acquire_lease``: a wrapper of a settling store settles, through the inner store;
    a wrapper of a store without the capability does not claim it (design 0206)."""
    assert isinstance(ForwardingRunStore(VolatileRunStore()), SettlingRunStore)
    plain = ForwardingRunStore(PlainStore())
    assert not isinstance(plain, SettlingRunStore)
    assert not hasattr(plain, "write_settlement")


async def test_a_settlement_is_forwarded_to_the_inner_store() -> None:
    inner = VolatileRunStore()
    wrapper = ForwardingRunStore(inner)
    assert isinstance(wrapper, SettlingRunStore)
    record = RecordFactory().settlement(run_id="r1", result_id="a0")
    await wrapper.write_settlement(record)
    assert (await inner.read_log("r1")).settlements == (record,)


class OwnSettlements(ForwardingRunStore):
    """Observes settlements itself (a counting wrapper), then forwards them; unleased on
    purpose, since a leased write would bypass it."""

    offers_leases = False

    def __init__(self, inner: RunStore) -> None:
        super().__init__(inner)
        self.seen: list[Settlement] = []

    async def write_settlement(self, record: Settlement) -> None:
        self.seen.append(record)
        inner = self.inner
        assert isinstance(inner, SettlingRunStore)
        await inner.write_settlement(record)


async def test_a_subclass_that_settles_its_own_way_keeps_its_write_settlement() -> None:
    inner = VolatileRunStore()
    wrapper = OwnSettlements(inner)
    assert "write_settlement" not in vars(wrapper)
    record = RecordFactory().settlement(run_id="r1", result_id="a0")
    await wrapper.write_settlement(record)
    assert wrapper.seen == [record]
    assert (await inner.read_log("r1")).settlements == (record,)


def test_a_wrapper_that_would_never_see_its_leased_writes_is_refused() -> None:
    """Overriding a write of a leasing store without its leases would observe nothing: a run
    writes through the lease (review of issue 20)."""

    class CountsIntents(ForwardingRunStore):
        async def write_intent(self, record):  # type: ignore[no-untyped-def]
            await self.inner.write_intent(record)

    with pytest.raises(PolyloopTypeError, match="overrides write_intent but not acquire_lease"):
        CountsIntents(VolatileRunStore())

    class CountsUnleased(CountsIntents):
        offers_leases = False

    wrapper = CountsUnleased(VolatileRunStore())
    assert not hasattr(wrapper, "acquire_lease")


async def test_a_wrapper_forwards_write_record_exactly_when_the_inner_store_has_it(
    tmp_path: pathlib.Path,
) -> None:
    # Design 0220: a record kind added after schema 1.8 has no typed method and is written
    # only through ``write_record``; a wrapped shipped store must still take it.
    from polyloop.ports import RecordWrites
    from polyloop.stores import JsonlRunStore, VolatileRunStore
    from polyloop.types import RunStarted

    inner = VolatileRunStore()
    wrapper = ForwardingRunStore(inner)
    assert isinstance(wrapper, RecordWrites)
    started = RunStarted(run_id="r1", parameter_snapshot={"k": "v"})
    await wrapper.write_record(started)
    assert (await inner.read_log("r1")).started == started
    assert isinstance(ForwardingRunStore(JsonlRunStore(directory=tmp_path)), RecordWrites)

    class Plain:  # 0.2.0's seam only: no write_record to forward
        async def write_run_started(self, record: object) -> None: ...
        async def write_intent(self, record: object) -> None: ...
        async def write_model_call_result(self, record: object) -> None: ...
        async def write_step_completed(self, record: object) -> None: ...
        async def write_run_finished(self, record: object) -> None: ...
        async def read_log(self, run_id: str) -> object: ...
        def parameters(self) -> dict[str, str]:
            return {}

    assert not isinstance(ForwardingRunStore(Plain()), RecordWrites)  # type: ignore[arg-type]

    class Counting(ForwardingRunStore):  # observes writes: a later kind must not pass it by
        offers_leases = False

        async def write_intent(self, record: object) -> None:
            await super().write_intent(record)  # type: ignore[arg-type]

    assert not isinstance(Counting(VolatileRunStore()), RecordWrites)
