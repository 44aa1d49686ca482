"""``RunLeaseContract``: what a store's run leases guarantee (``polyloop.ports.RunLease``).

A store that offers leases (a ``LeasingRunStore``) lets ``run()``/``resume()`` keep one
writer per run. The essential promise is fencing: a lease that is no longer the run's current
lease writes nothing, and the check that decides it is atomic with the write. The race test
below releases a lease while one of its writes is in flight; a store that checks the lease
*before* the write, with a suspension point in between, lets that write land after the next
holder's records, and fails it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polyloop.errors import PolyloopValueError, RunLeaseHeldError, RunLeaseLostError
from polyloop.ports import CheckedLease, LeasingRunStore, RunLease
from polyloop.testing._records import RecordFactory
from polyloop.testing._support import ContractBase, unverifiable
from polyloop.types import SettlementVerdict

__all__ = ["RunLeaseContract"]

_PATIENCE = 2.0
"""Seconds a test waits for something that should happen at once (bounds a hanging store)."""


async def _settle(task: asyncio.Future[Any]) -> None:
    """Make sure a task a test started is finished and its outcome retrieved, so that a failing
    test leaves no task behind (an unretrieved task exception is reported at garbage
    collection, in the middle of whatever runs then)."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _writes(
    lease: RunLease, records: RecordFactory, run_id: str
) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
    """One write of each of the five kinds through ``lease``, in a valid log order."""
    return [
        (
            "write_run_started",
            lambda: lease.write_run_started(
                records.run_started(run_id=run_id, parameter_snapshot={"k": "v"})
            ),
        ),
        (
            "write_intent",
            lambda: lease.write_intent(
                records.model_call_intent(run_id=run_id, call_index=0, result_id="m0")
            ),
        ),
        (
            "write_model_call_result",
            lambda: lease.write_model_call_result(
                records.model_call_result(run_id=run_id, result_id="m0", reply=records.reply())
            ),
        ),
        (
            "write_step_completed",
            lambda: lease.write_step_completed(
                records.step_completed(
                    run_id=run_id,
                    result_id=None,
                    action_outcome=None,
                    step=records.step(step_idx=0, parse_ok=False),
                )
            ),
        ),
        (
            "write_run_finished",
            lambda: lease.write_run_finished(records.run_finished(run_id=run_id)),
        ),
    ]


class RunLeaseContract(ContractBase):
    """Contract suite for run leases. Subclass it and override ``store``.

    Name your subclass ``Test...``::

        class TestMyStoreLeases(RunLeaseContract):
            @pytest.fixture
            def store(self, tmp_path):
                return MyStore(tmp_path / "runs.db")

            @pytest.fixture
            def second_store(self, tmp_path):  # optional: another process's view
                return MyStore(tmp_path / "runs.db")

    Every test here also needs the store's plain ``RunStore`` behaviour; certify that with
    ``RunStoreContract`` in a separate subclass.
    """

    @pytest.fixture
    def store(self) -> LeasingRunStore:
        """The store under test. Override it in your subclass.

        Return a new, **empty** store on every call, one that offers leases
        (``acquire_lease``) beside the ``RunStore`` methods.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits RunLeaseContract but does not override the "
            "`store` fixture. Define `@pytest.fixture def store(self, ...)` in your subclass "
            "and return a new, empty instance of your LeasingRunStore on every call (for "
            "example one built on pytest's `tmp_path`)."
        )

    @pytest.fixture
    def second_store(self, store: LeasingRunStore) -> LeasingRunStore:
        """A second handle on the same backend as ``store``, as another process would open it
        (another instance on the same directory or database). Default: ``store`` itself.

        Override it when your store can have several instances on one backend: the exclusion
        tests then also check that leases exclude across instances, not only within one.
        """
        return store

    # ------------------------------------------------------------ exclusion

    async def test_a_held_run_is_refused_to_a_second_acquirer(
        self, store: LeasingRunStore, second_store: LeasingRunStore
    ) -> None:
        """While a lease is held, acquiring the same run fails with ``RunLeaseHeldError``,
        from the same store and from a second handle on its backend.

        This is the whole point of a lease: two processes resuming one run would otherwise
        both continue it, and both could execute the same ``NEVER`` action.
        """
        held = await store.acquire_lease("r1")
        with pytest.raises(RunLeaseHeldError):
            await second_store.acquire_lease("r1")
        with pytest.raises(RunLeaseHeldError):
            await store.acquire_lease("r1")
        await held.release()

    async def test_leases_of_different_runs_do_not_exclude_each_other(
        self, store: LeasingRunStore
    ) -> None:
        """Holding one run's lease does not stop another run from being leased.

        A store that locks one global resource instead of one per run would serialise every
        run of a batch behind the first.
        """
        first = await store.acquire_lease("run-a")
        second = await store.acquire_lease("run-b")
        assert (first.run_id, second.run_id) == ("run-a", "run-b")
        await first.release()
        await second.release()

    async def test_release_frees_the_run_for_the_next_acquirer(
        self, store: LeasingRunStore, second_store: LeasingRunStore
    ) -> None:
        """After ``release()`` the run can be leased again, and releasing twice is harmless.

        ``run()``/``resume()`` release in a ``finally``; a release that did not free the run
        would leave it unreachable until its holder's process exits.
        """
        first = await store.acquire_lease("r1")
        await first.release()
        await first.release()
        again = await second_store.acquire_lease("r1")
        assert again.run_id == "r1"
        await again.release()

    async def test_every_grant_has_a_larger_epoch(
        self, store: LeasingRunStore, second_store: LeasingRunStore
    ) -> None:
        """Each new lease on a run has a larger ``epoch`` than the one before (the fencing
        token only grows).

        The epoch is what makes an old holder recognisable as old; a token that repeats
        would let a stale holder pass for the current one.
        """
        epochs = []
        for handle in (store, second_store, store):
            lease = await handle.acquire_lease("r1")
            epochs.append(lease.epoch)
            await lease.release()
        assert epochs == sorted(epochs)
        assert len(set(epochs)) == len(epochs)

    # ------------------------------------------------------------ writing through a lease

    async def test_writes_through_a_lease_read_back_like_plain_writes(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """All five write methods of a lease store their records in the run's log.

        ``run()`` and ``resume()`` write only through the lease when the store has leases, so
        a lease that dropped a kind of record would lose it from every run.
        """
        lease = await store.acquire_lease("r1")
        for _, write in _writes(lease, records, "r1"):
            await write()
        await lease.release()
        log = await store.read_log("r1")
        assert log.started is not None
        assert len(log.intents) == 1
        assert len(log.model_results) == 1
        assert len(log.steps) == 1
        assert log.finished is not None

    async def test_a_leased_start_is_still_exclusive(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """``write_run_started`` through a lease raises ``FileExistsError`` when the run id
        already has records, as the plain method does (the shipped stores raise
        ``polyloop.errors.RunAlreadyStartedError``, which is one; a plain ``FileExistsError``
        passes too).

        The lease keeps two holders apart in time; the exclusive start is what stops a second
        ``run()`` of a used id after the first holder released it.
        """
        await store.write_intent(
            records.model_call_intent(run_id="r1", call_index=0, result_id="m0")
        )
        lease = await store.acquire_lease("r1")
        with pytest.raises(FileExistsError):
            await lease.write_run_started(
                records.run_started(run_id="r1", parameter_snapshot={"k": "v"})
            )
        await lease.release()
        assert (await store.read_log("r1")).started is None

    async def test_a_record_of_another_run_is_refused_by_the_lease(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """A lease refuses a record of another run id (``PolyloopValueError``), storing
        nothing, so a lease on one run never becomes a way to write another."""
        lease = await store.acquire_lease("r1")
        with pytest.raises(PolyloopValueError):
            await lease.write_intent(
                records.model_call_intent(run_id="r2", call_index=0, result_id="m0")
            )
        await lease.release()
        assert (await store.read_log("r2")).is_empty

    async def test_a_released_lease_writes_nothing(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """Every write method of a released lease raises ``RunLeaseLostError`` and stores
        nothing, even when the run has been leased to someone else meanwhile.

        A holder that lost its lease must stop at its next write; if that write landed,
        two writers would be interleaving records in one log.
        """
        old = await store.acquire_lease("r1")
        await old.release()
        new = await store.acquire_lease("r1")
        for method, write in _writes(old, records, "r1"):
            with pytest.raises(RunLeaseLostError):
                await write()
            assert (await store.read_log("r1")).is_empty, f"{method} stored a record"
        await new.release()

    async def test_a_release_racing_a_write_never_lets_it_land_after_the_next_holder(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """A write in flight while its lease is released lands before ``release()`` returns
        or not at all; this is the check *inside* the write (fencing).

        The test starts a write, lets it run to a varying number of suspension points,
        releases its lease, reads the log, hands the run to a new lease that writes, and
        only then lets the old write finish. A store that checks the lease first and writes
        afterwards, with a suspension point in between (a separate query, a thread hop),
        lets the old write land after the release, after the new holder read the log:
        exactly what a paused holder does after a takeover.
        """
        for yields in range(6):
            run_id = f"race-{yields}"
            old = await store.acquire_lease(run_id)
            mine = records.model_call_intent(run_id=run_id, call_index=0, result_id="m0")
            theirs = records.action_intent(run_id=run_id, call_index=0, result_id="a0")
            in_flight: asyncio.Future[Any] = asyncio.ensure_future(old.write_intent(mine))
            try:
                for _ in range(yields):
                    await asyncio.sleep(0)
                await old.release()
                seen_after_release = (await store.read_log(run_id)).intents
                new = await store.acquire_lease(run_id, wait_seconds=_PATIENCE)
                await new.write_intent(theirs)
                try:
                    await asyncio.wait_for(in_flight, _PATIENCE)
                except RunLeaseLostError:
                    landed = False
                else:
                    landed = True
                await new.release()
            finally:
                await _settle(in_flight)
            intents = (await store.read_log(run_id)).intents
            if landed:
                assert seen_after_release == (mine,), f"landed after release ({yields} yields)"
                assert intents == (mine, theirs), f"after {yields} yields"
            else:
                assert intents == (theirs,), f"after {yields} yields"

    async def test_a_lease_checks_whether_it_is_still_current(
        self, store: LeasingRunStore, second_store: LeasingRunStore
    ) -> None:
        """A lease with ``check_current`` (``polyloop.ports.CheckedLease``) returns while it
        is the run's current lease, and raises ``RunLeaseLostError`` once it was released,
        even after the run was leased to someone else; it writes nothing.

        The session hands it to tools (``ToolContext.check_lease``): a child-run tool checks
        its parent's lease right before it starts or continues a child, so a holder that lost
        the parent starts nothing below it (design 0245). A lease without the capability is
        skipped.
        """
        current = await store.acquire_lease("r1")
        if not isinstance(current, CheckedLease):
            await current.release()
            pytest.skip(
                unverifiable(
                    promise="a lease's check_current raises RunLeaseLostError once the lease "
                    "is released, expired or taken over, and returns while it is current.",
                    why_not_here=f"the lease under test ({type(current).__name__}) has no "
                    "check_current (the optional CheckedLease capability), so a child-run "
                    "tool cannot check its parent's lease through it.",
                    check_it_yourself="give the lease check_current, checked as its writes "
                    "are fenced (the shipped stores' leases have it), and this test runs.",
                )
            )
        await current.check_current()
        await current.release()
        with pytest.raises(RunLeaseLostError):
            await current.check_current()
        successor = await second_store.acquire_lease("r1")
        with pytest.raises(RunLeaseLostError):
            await current.check_current()
        assert isinstance(successor, CheckedLease)
        await successor.check_current()
        await successor.release()
        assert (await store.read_log("r1")).is_empty

    async def test_settlements_through_a_lease_are_fenced(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """A lease with ``write_settlement`` stores a settlement while it is the run's current
        lease, and a released lease's ``write_settlement`` raises ``RunLeaseLostError`` and
        stores nothing, even after the run was leased to someone else.

        A settlement decides what recovery does with an execution in doubt (record it as
        done, or run it); one written by a holder that lost the run would overrule the new
        holder's view of the log. A lease without the capability is skipped.
        """
        current = await store.acquire_lease("r1")
        if not callable(getattr(current, "write_settlement", None)):
            await current.release()
            pytest.skip(
                unverifiable(
                    promise="a lease's write_settlement is fenced like its other writes: it "
                    "stores nothing and raises RunLeaseLostError once the lease is released, "
                    "expired or taken over.",
                    why_not_here=f"the lease under test ({type(current).__name__}) has no "
                    "write_settlement (its store lacks the optional SettlingRunStore "
                    "capability), so there is nothing to fence.",
                    check_it_yourself="give the lease write_settlement, fenced like its "
                    "other writes (the shipped stores' leases have it), and this test runs.",
                )
            )
        mine = records.settlement(
            run_id="r1", result_id="a0", verdict=SettlementVerdict.NOT_EXECUTED
        )
        await current.write_settlement(mine)  # type: ignore[attr-defined]
        await current.release()
        assert (await store.read_log("r1")).settlements == (mine,)
        old = await store.acquire_lease("r2")
        await old.release()
        new = await store.acquire_lease("r2")
        assert callable(getattr(old, "write_settlement", None)), (
            "one lease of the store has write_settlement, another has not"
        )
        with pytest.raises(RunLeaseLostError):
            await old.write_settlement(records.settlement(run_id="r2", result_id="a0"))  # type: ignore[attr-defined]
        await new.release()
        assert (await store.read_log("r2")).is_empty, "a released lease stored a settlement"

    async def test_approval_requests_through_a_lease_are_fenced(
        self, store: LeasingRunStore, records: RecordFactory
    ) -> None:
        """A lease with ``write_approval_request`` stores a request while it is the run's
        current lease, and a released lease's ``write_approval_request`` raises
        ``RunLeaseLostError`` and stores nothing, even after the run was leased to someone
        else.

        A request is what parks a run for a person's decision (design 0210); one written by a
        holder that lost the run would put a call up for approval that the new holder's log
        never asked for, or park a run that has moved on. A lease without the capability is
        skipped.
        """
        current = await store.acquire_lease("r1")
        if not callable(getattr(current, "write_approval_request", None)):
            await current.release()
            pytest.skip(
                unverifiable(
                    promise="a lease's write_approval_request is fenced like its other "
                    "writes: it stores nothing and raises RunLeaseLostError once the lease is "
                    "released, expired or taken over.",
                    why_not_here=f"the lease under test ({type(current).__name__}) has no "
                    "write_approval_request (its store lacks the optional SettlingRunStore "
                    "capability), so there is nothing to fence.",
                    check_it_yourself="give the lease write_approval_request, fenced like its "
                    "other writes (the shipped stores' leases have it), and this test runs.",
                )
            )
        mine = records.approval_request(run_id="r1")
        await current.write_approval_request(mine)  # type: ignore[attr-defined]
        await current.release()
        assert (await store.read_log("r1")).approval_requests == (mine,)
        old = await store.acquire_lease("r2")
        await old.release()
        new = await store.acquire_lease("r2")
        assert callable(getattr(old, "write_approval_request", None)), (
            "one lease of the store has write_approval_request, another not"
        )
        with pytest.raises(RunLeaseLostError):
            await old.write_approval_request(records.approval_request(run_id="r2"))  # type: ignore[attr-defined]
        await new.release()
        assert (await store.read_log("r2")).is_empty, "a released lease stored a request"

    # ------------------------------------------------------------ waiting

    async def test_a_waiting_acquirer_gets_the_run_when_the_holder_releases(
        self, store: LeasingRunStore, second_store: LeasingRunStore
    ) -> None:
        """``acquire_lease(..., wait_seconds=w)`` on a held run waits, and gets the lease
        when the holder releases within ``w``.

        That is what lets a scheduler hand a run to the next worker without a retry loop.
        """
        holder = await store.acquire_lease("r1")
        waiter: asyncio.Future[RunLease] = asyncio.ensure_future(
            second_store.acquire_lease("r1", wait_seconds=_PATIENCE)
        )
        try:
            await asyncio.sleep(0.05)
            assert not waiter.done()
            await holder.release()
            successor = await asyncio.wait_for(waiter, _PATIENCE)
            assert successor.epoch > holder.epoch
            await successor.release()
        finally:
            await _settle(waiter)

    async def test_a_waiting_acquirer_gives_up_after_its_wait(
        self, store: LeasingRunStore, second_store: LeasingRunStore
    ) -> None:
        """A waiting acquire of a run that stays held raises ``RunLeaseHeldError`` once its
        wait is over, not earlier and not never."""
        holder = await store.acquire_lease("r1")
        began = time.monotonic()
        with pytest.raises(RunLeaseHeldError):
            await asyncio.wait_for(
                second_store.acquire_lease("r1", wait_seconds=0.2), 0.2 + _PATIENCE
            )
        assert time.monotonic() - began >= 0.15
        await holder.release()

    # ------------------------------------------------------------ promises this suite cannot check

    async def test_a_dead_holder_frees_the_run_is_not_checkable_here(self) -> None:
        """A holder that dies frees its runs (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="when the process holding a lease dies (killed, crashed), the run "
                "becomes leasable again without anyone releasing it: at once for a lock the "
                "kernel drops, after the lease's expiry for a lease with a time limit; and "
                "a holder paused past its expiry writes nothing after it resumes.",
                why_not_here="the suite runs inside one process and cannot kill or pause the "
                "holder without killing itself.",
                check_it_yourself="start a holder in a child process, kill it with SIGKILL "
                "(or stop it with SIGSTOP past the expiry, take the run over, then SIGCONT "
                "it) and acquire the run from the test; polyloop's own tests do this for "
                "its stores (tests/integration/test_lease_processes.py).",
            )
        )
