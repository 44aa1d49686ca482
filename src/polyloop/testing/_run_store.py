"""``RunStoreContract``: what a run's write-ahead log guarantees, whatever stores it.

The known shapes differ a lot (one appends lines to a local file, another inserts rows into a
relational database), so every test states behaviour observable through the ``RunStore``
Protocol and nothing about layout.

Two promises of the port cannot be checked from inside one process against an assembled
store; they are unconditional skips, not ``xfail``. An ``xfail(strict=True)`` would turn into
a failure (XPASS) for an implementation that happens to do better, and a subclass cannot
switch off a marker inherited from the function. "This layer cannot check it" is what a skip
says, and ``pytest -rs`` prints every reason on every run.
"""

from __future__ import annotations

import dataclasses

import pytest

from polyloop.ports import LeasingRunStore, RunLog, RunStore, SettlingRunStore
from polyloop.testing._records import RecordFactory
from polyloop.testing._support import ContractBase, string_mapping_problems, unverifiable
from polyloop.types import (
    RECORDS,
    ApprovalRequest,
    ChildRun,
    Intent,
    ModelCallResult,
    ParentLink,
    ReplayPolicy,
    Settlement,
    SettlementVerdict,
    StepCompleted,
    StopReason,
)

__all__ = ["RunStoreContract"]


class _TreeLinkChecks:
    """The contract's checks of the tree links (schema 1.9, design 0245), kept apart so that
    each part of the suite stays readable; ``RunStoreContract`` inherits them."""

    async def test_tree_links_read_back_both_ways(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """A child run's start names its parent (``RunStarted.parent``) and a parent's step
        names its child (``StepRecord.child``); both read back as written (schema 1.9,
        design 0245).

        Resuming a tree re-attaches a parent to its children by these links and budgets a
        tree by the children's totals; a store that drops them would let a resumed tree
        overspend and leave ``verify`` unable to check it.
        """
        started = dataclasses.replace(
            records.run_started(run_id="r1.a1", parameter_snapshot={"model": "m-1"}),
            parent=ParentLink(run_id="r1", step_idx=1, idempotency_key="polyloop:r:r1:a1", depth=1),
        )
        child = ChildRun(run_id="r1.a1", stop_reason=StopReason.FINAL_ANSWER, steps=4, tokens=60)
        step = records.step_completed(
            run_id="r1",
            result_id="a1",
            action_outcome=records.outcome(),
            step=dataclasses.replace(records.step(step_idx=1), child=child),
        )
        await store.write_run_started(started)
        await store.write_step_completed(step)
        assert (await store.read_log("r1.a1")).started == started
        assert (await store.read_log("r1")).steps == (step,)


class RunStoreContract(_TreeLinkChecks, ContractBase):
    """Contract suite for the storage seam. Subclass it and override ``store``.

    Name your subclass ``Test...`` so pytest collects it::

        class TestMyStore(RunStoreContract):
            @pytest.fixture
            def store(self, tmp_path):
                return MyStore(tmp_path / "runs.db")

    A store is expected to offer run leases (``acquire_lease``, certified by
    ``RunLeaseContract``): without them nothing stops two processes from resuming one run
    and both executing its next ``NEVER`` action. A store that truly has none says so, and
    ``test_the_store_offers_leases_or_says_it_has_none`` then passes:

    ======================================  ================================================
    where ``offers_leases = False`` is set  effect
    ======================================  ================================================
    on the contract subclass                this suite accepts the store without leases
    on the store (class attribute)          the same, and ``run()``/``resume()`` do not warn
                                            (``UnleasedStoreWarning``) about it either
    nowhere                                 the store must have ``acquire_lease``
    ======================================  ================================================

    ``offers_leases = False`` on a store that does have ``acquire_lease`` fails the test: the
    library uses the leases whatever the attribute says, so the claim would be false.
    """

    @pytest.fixture
    def store(self) -> RunStore:
        """The store under test. Override it in your subclass.

        Return a new, **empty** store on every call: each test assumes a clean log. A store
        shared between tests makes their order matter, and the failure then shows up in
        whichever test happens to run after the one that left records behind.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits RunStoreContract but does not override the "
            "`store` fixture. Define `@pytest.fixture def store(self, ...)` in your subclass "
            "and return an instance of your RunStore implementation; every call must return "
            "a new, empty store (for example one built on pytest's `tmp_path`)."
        )

    # ------------------------------------------------------------ what is written reads back

    async def test_written_intent_is_readable(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """An intent that was written is in the log read back.

        A write-ahead log exists to outlive the process; everything recovery does rests on
        reading back what was written before the crash.
        """
        intent = records.model_call_intent(run_id="r1", call_index=0, result_id="m0")
        await store.write_intent(intent)
        log = await store.read_log("r1")
        assert intent in log.intents

    async def test_log_of_unknown_run_is_empty_not_an_error(self, store: RunStore) -> None:
        """Reading a run id that was never written gives the empty ``RunLog()``, not an error.

        ``run()`` asks "does this id already have a log?" this way. If the answer came as an
        exception, the caller would have to catch it for control flow, and the same ``except``
        would hide a real storage fault.
        """
        log = await store.read_log("never-written")
        assert log == RunLog()

    async def test_two_runs_do_not_leak_into_each_other(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """Two run ids each read back only their own records.

        This is the observable form of "the port holds no current run". A store with a
        hidden current run would file run A's intent under run B as soon as two runs
        interleave, which single-run tests never show.
        """
        a = records.model_call_intent(run_id="run-a", call_index=0, result_id="m0")
        b = records.model_call_intent(run_id="run-b", call_index=0, result_id="m0")
        await store.write_intent(a)
        await store.write_intent(b)
        assert (await store.read_log("run-a")).intents == (a,)
        assert (await store.read_log("run-b")).intents == (b,)

    async def test_records_of_one_kind_come_back_in_write_order(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """Each kind of record reads back in the order it was written.

        ``RunLog`` promises write order per kind, and recovery walks intents, results and
        steps in that order to rebuild the conversation; a store that sorts by anything else
        (a hash, a key) replays history in the wrong order.
        """
        intents = (
            records.model_call_intent(run_id="r1", call_index=0, result_id="m0"),
            records.action_intent(run_id="r1", call_index=0, result_id="a0"),
            records.model_call_intent(run_id="r1", call_index=1, result_id="m1"),
        )
        results = (
            records.model_call_result(run_id="r1", result_id="m0", reply=records.reply()),
            records.model_call_result(run_id="r1", result_id="m1", failure="TimeoutError: x"),
        )
        steps = (
            records.step_completed(
                run_id="r1",
                result_id="a0",
                action_outcome=records.outcome(),
                step=records.step(step_idx=0),
            ),
            records.step_completed(
                run_id="r1",
                result_id=None,
                action_outcome=None,
                step=records.step(step_idx=1, parse_ok=False),
            ),
        )
        await store.write_intent(intents[0])
        await store.write_model_call_result(results[0])
        await store.write_intent(intents[1])
        await store.write_step_completed(steps[0])
        await store.write_intent(intents[2])
        await store.write_model_call_result(results[1])
        await store.write_step_completed(steps[1])
        log = await store.read_log("r1")
        assert log.intents == intents
        assert log.model_results == results
        assert log.steps == steps

    # ------------------------------------------------------------ the four recovery states

    async def test_intent_without_result_is_readable_as_such(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """An intent with no result reads back so that "no result for this id" is answerable.

        That is the "unknown" row of the recovery table. The store does not judge it, but
        recovery must be able to ask about the exact pre-allocated result id.
        """
        intent = records.action_intent(run_id="r1", call_index=0, result_id="a0")
        await store.write_intent(intent)
        log = await store.read_log("r1")
        assert intent in log.intents
        assert all(step.result_id != "a0" for step in log.steps)

    async def test_result_without_intent_is_visible_to_the_reader(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """A result with no intent is stored and read back as written: neither repaired nor
        rejected.

        A result without an intent means the log is corrupt, and recovery refuses to resume
        it. That judgement belongs to recovery; a store that quietly adds an intent or drops
        the result makes the corruption invisible.
        """
        result = records.model_call_result(run_id="r1", result_id="orphan", reply=records.reply())
        await store.write_model_call_result(result)
        log = await store.read_log("r1")
        assert log.model_results == (result,)
        assert log.intents == ()

    async def test_failed_model_call_is_recorded_as_a_result_not_as_nothing(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """A failed model call is a result with ``reply=None`` and the failure text.

        Without it, recovery would see "intent, no result" and consult the replay policy for
        a call whose outcome is perfectly known: it failed.
        """
        result = records.model_call_result(
            run_id="r1", result_id="m0", reply=None, failure="TimeoutError: connection timed out"
        )
        await store.write_model_call_result(result)
        (read_back,) = (await store.read_log("r1")).model_results
        assert read_back.reply is None
        assert read_back.failure == "TimeoutError: connection timed out"

    # ------------------------------------------------------------ atomic step write

    async def test_action_result_and_step_land_together(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """The action outcome and its step record come back together, as one record.

        This can only show "visible together"; "invisible together after a crash" is the
        skip at the end of this class.
        """
        step = records.step_completed(
            run_id="r1",
            result_id="a0",
            action_outcome=records.outcome(),
            step=records.step(step_idx=0),
        )
        await store.write_step_completed(step)
        log = await store.read_log("r1")
        assert log.steps == (step,)
        assert log.steps[0].action_outcome is not None

    async def test_step_without_an_action_is_still_recorded(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """A step without an action (parse failure, failed model call, final answer) is
        stored with ``result_id`` and ``action_outcome`` both ``None``.

        Such steps still consume a model call and count against the step budget; dropping
        them would also drop what the model said when things went wrong.
        """
        step = records.step_completed(
            run_id="r1",
            result_id=None,
            action_outcome=None,
            step=records.step(step_idx=0, parse_ok=False),
        )
        await store.write_step_completed(step)
        log = await store.read_log("r1")
        assert log.steps == (step,)
        assert log.steps[0].result_id is None
        assert log.steps[0].action_outcome is None

    # ------------------------------------------------------------ start and finish of a run

    async def test_run_finished_is_visible_before_the_result_is_returned(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """Once ``write_run_finished`` returns, the finish record is in the log.

        The library writes it before handing the result to the caller, so "finished" never
        lives in two places that a crash could split.
        """
        finished = records.run_finished(
            run_id="r1", result=records.result(run_id="r1", stop_reason=StopReason.STEP_BUDGET)
        )
        await store.write_run_finished(finished)
        assert (await store.read_log("r1")).finished == finished

    async def test_run_started_carries_the_parameter_snapshot(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """The start record reads back with its parameter snapshot intact.

        ``resume`` compares that snapshot with the current configuration; losing it would let
        a run continue under different settings with no error at all.
        """
        started = records.run_started(run_id="r1", parameter_snapshot={"model": "m-1"})
        await store.write_run_started(started)
        read_back = (await store.read_log("r1")).started
        assert read_back is not None
        assert read_back.parameter_snapshot == {"model": "m-1"}

    # ------------------------------------------------------------ parameters()

    async def test_parameters_map_strings_to_strings(self, store: RunStore) -> None:
        """``parameters()`` is a mapping of ``str`` to ``str``.

        It is recorded in the run's parameter snapshot, which is string-to-string; the
        library refuses a run whose seam reports anything else.
        """
        assert string_mapping_problems(store.parameters()) == []

    async def test_parameters_are_stable_across_calls(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """``parameters()`` reports configuration, not state: writing a run does not change it.

        ``resume`` recomputes the snapshot and refuses on any difference, so a store that
        reported, say, how many runs it holds would make every resume fail as drift.
        """
        before = dict(store.parameters())
        await store.write_intent(
            records.model_call_intent(run_id="r1", call_index=0, result_id="m0")
        )
        assert dict(store.parameters()) == before

    # ------------------------------------------------------------ leases

    async def test_the_store_offers_leases_or_says_it_has_none(self, store: RunStore) -> None:
        """The store has ``acquire_lease``, or says ``offers_leases = False`` (on the store or
        on this contract subclass; see the class docstring).

        ``run()``/``resume()`` take a run's lease only from a store that has
        ``acquire_lease``. A wrapper that forwards the ``RunStore`` methods but not
        ``acquire_lease`` turns the wrapped store's leases off without a word, and then two
        resumers of one run id can both execute its next ``NEVER`` action (in 49 of 80
        trials, the time a test's own wrapper did it).
        """
        claims = [
            (type(owner).__name__, getattr(owner, "offers_leases", None)) for owner in (self, store)
        ]
        for where, claim in claims:
            assert claim is None or isinstance(claim, bool), (
                f"{where}.offers_leases must be a bool (False: the store has no leases), got "
                f"{type(claim).__name__}"
            )
        says_none = any(claim is False for _, claim in claims)
        has_leases = isinstance(store, LeasingRunStore)
        assert has_leases or says_none, (
            f"the store under test ({type(store).__name__}) offers no leases (it has no "
            "acquire_lease), so two resumers can both run a NEVER action; if it wraps a "
            "leasing store, forward acquire_lease (polyloop.stores.ForwardingRunStore does); "
            f"set offers_leases = False (on {type(self).__name__} or on the store's class) if "
            "it truly has none"
        )
        assert not (has_leases and says_none), (
            f"offers_leases = False is set, but the store under test ({type(store).__name__}) "
            "has acquire_lease, and run()/resume() use it whatever the attribute says; remove "
            "offers_leases = False and certify the leases with RunLeaseContract"
        )

    # ------------------------------------------------------------ settlements (optional)

    async def test_settlements_round_trip_in_write_order(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """A store with ``write_settlement`` (``SettlingRunStore``) reads its settlements back
        in ``RunLog.settlements`` in write order, among the other records in ``entries``, and
        keeps an intent's idempotency key and an outcome's ``settled_by``.

        A settlement is the verdict on an execution in doubt (its intent durable, its result
        lost): recovery acts on the last one, so a store that lost one, or reordered two,
        would execute an action someone said had already happened, or record one that had
        not. A store without the capability is skipped (it runs every run, but nothing can
        be settled on it).
        """
        if not isinstance(store, SettlingRunStore):
            pytest.skip(
                unverifiable(
                    promise="write_settlement stores a Settlement and read_log returns it in "
                    "RunLog.settlements and RunLog.entries, in write order.",
                    why_not_here=f"the store under test ({type(store).__name__}) has no "
                    "write_settlement (the optional SettlingRunStore capability), so there is "
                    "nothing to write; runs on it work, but an execution in doubt on it stays "
                    "in doubt (resume stops with resume_state_unknown).",
                    check_it_yourself="add write_settlement (the shipped stores and "
                    "polyloop.stores.ForwardingRunStore have it) and this test runs; see "
                    "polyloop.ports.SettlingRunStore.",
                )
            )
        intent = records.action_intent(
            run_id="r1",
            call_index=0,
            result_id="a0",
            replay_policy=ReplayPolicy.NEVER,
            idempotency_key="polyloop:r:r1:a0",
        )
        asked = records.settlement(
            run_id="r1", result_id="a0", verdict=SettlementVerdict.UNKNOWN, by="transfer"
        )
        retried = records.settlement(
            run_id="r1", result_id="a0", verdict=SettlementVerdict.NOT_EXECUTED, note="retry"
        )
        done = records.settlement(
            run_id="r1", result_id="a0", observation="transfer 17 went through", note="bank"
        )
        step = records.step_completed(
            run_id="r1",
            result_id="a0",
            action_outcome=records.outcome(
                observation="transfer 17 went through", settled_by="person:ops@example.com"
            ),
            step=records.step(step_idx=0),
        )
        await store.write_intent(intent)
        await store.write_settlement(asked)
        await store.write_settlement(retried)
        await store.write_settlement(done)
        await store.write_step_completed(step)
        log = await store.read_log("r1")
        assert log.settlements == (asked, retried, done)
        assert log.intents == (intent,)
        assert log.intents[0].idempotency_key == "polyloop:r:r1:a0"
        assert log.steps == (step,)
        assert log.steps[0].action_outcome is not None
        assert log.steps[0].action_outcome.settled_by == "person:ops@example.com"
        if log.entries:  # a store may keep no entries (RunLog's docstring)
            assert [entry.record for entry in log.entries] == [
                intent,
                asked,
                retried,
                done,
                step,
            ]
        assert (await store.read_log("r2")).settlements == ()

    async def test_approval_requests_and_decisions_round_trip_in_write_order(
        self, store: RunStore, records: RecordFactory
    ) -> None:
        """A store with the ``SettlingRunStore`` capability reads its ``ApprovalRequest``s back
        in ``RunLog.approval_requests`` and the decisions on them (settlements with verdict
        ``approved`` or ``rejected`` and the call's ``digest``) in ``RunLog.settlements``, in
        write order, every field kept, among the other records in ``entries``.

        A run that waits for a person's approval is nothing but its request on record (design
        0210): a store that lost it would resume the run as if the model had just replied,
        and run the call unasked; one that lost a decision's digest, or reordered a decision
        before its request, would let a decision stand for a call nobody decided on. A store
        without the capability is skipped (a tool that needs approval cannot run on it).
        """
        if not isinstance(store, SettlingRunStore):
            pytest.skip(
                unverifiable(
                    promise="write_approval_request stores an ApprovalRequest and read_log "
                    "returns it in RunLog.approval_requests and RunLog.entries, in write "
                    "order, with the decisions on it (write_settlement) in RunLog.settlements.",
                    why_not_here=f"the store under test ({type(store).__name__}) lacks the "
                    "optional SettlingRunStore capability (write_settlement and "
                    "write_approval_request), so there is nothing to write; runs on it work, "
                    "but a call of a tool with needs_approval on it is refused.",
                    check_it_yourself="add write_settlement and write_approval_request (the "
                    "shipped stores and polyloop.stores.ForwardingRunStore have them) and "
                    "this test runs; see polyloop.ports.SettlingRunStore.",
                )
            )
        asked = records.approval_request(
            run_id="r1", step_idx=0, expires_at="2026-01-02T00:00:00.000+00:00"
        )
        approved = records.approval_decision(asked, note="within the refund policy")
        again = records.approval_request(
            run_id="r1",
            step_idx=1,
            tool_call_id=None,
            arguments='{"amount":9000,"to":"acct-17"}',
        )
        expired = records.approval_decision(again, approved=False, expired=True)
        written: list[_Written] = [
            records.model_call_intent(run_id="r1", call_index=0, result_id="m0"),
            records.model_call_result(run_id="r1", result_id="m0"),
            asked,
            approved,
            records.action_intent(run_id="r1", call_index=0, result_id="a0"),
            records.step_completed(
                run_id="r1",
                result_id="a0",
                action_outcome=records.outcome(),
                step=records.step(step_idx=0),
            ),
            records.model_call_intent(run_id="r1", call_index=1, result_id="m1"),
            records.model_call_result(run_id="r1", result_id="m1"),
            again,
            expired,
        ]
        for record in written:
            await _write(store, record)
        log = await store.read_log("r1")
        assert log.approval_requests == (asked, again)
        assert log.settlements == (approved, expired)
        assert [s.digest for s in log.settlements] == [asked.digest, again.digest]
        if log.entries:  # a store may keep no entries (RunLog's docstring)
            assert [entry.record for entry in log.entries] == written
        other = await store.read_log("r2")
        assert (other.approval_requests, other.settlements) == ((), ())

    # ------------------------------------------------------------ promises this suite cannot check

    async def test_atomicity_under_crash_is_not_checkable_here(self) -> None:
        """The "invisible together" half of the atomic step write (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="write_step_completed is atomic: after a crash in the middle of it, "
                "neither the action outcome nor the step record is visible.",
                why_not_here="the suite runs in one process against an assembled store and "
                "has no point at which to inject a crash; a 'fail here' hook would make a "
                "test device part of the public API.",
                check_it_yourself="inject faults at your store's internal write points in "
                "your own unit tests (for example a connection that dies between two "
                "statements) and read the log back, or review that the outcome and the step "
                "are one row or one transaction.",
            )
        )

    async def test_prefix_durability_is_not_checkable_here(self) -> None:
        """Prefix durability of the log (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="when write k (an intent or a run finish) is confirmed durable, "
                "writes 1..k-1 of that run are durable too.",
                why_not_here="durability only shows after power loss; reading a record back "
                "in the same process does not prove it reached the disk.",
                check_it_yourself="this constrains the shape of your implementation: appends "
                "to one file with fsync on the barrier writes, or transactions committed in "
                "order on one connection, satisfy it. Review that your store has that shape.",
            )
        )


_Written = Intent | ModelCallResult | StepCompleted | Settlement | ApprovalRequest


async def _write(store: SettlingRunStore, record: _Written) -> None:
    """Write ``record`` through the method its kind declares (``polyloop.types.RECORDS``)."""
    method = RECORDS.by_class[type(record)].write_method
    assert method is not None, f"{type(record).__name__} has no typed write method"
    await getattr(store, method)(record)
