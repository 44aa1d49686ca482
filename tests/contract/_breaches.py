"""Deliberately broken seam implementations, each wired to its contract base.

Not a test module (the name does not match ``test_*.py``): ``test_suite_rejects_breaches.py``
runs it in a child pytest and checks that every breach turns the contract tests named in
``EXPECTED_FAILURES`` red. That is the proof that the suite is not vacuous: for every
contract method this layer can check, some plausible mistake makes it fail.

Each breach is the good implementation (a shipped store, the public
``polyloop.testing.ScriptedModelClient`` or a double from ``_doubles.py``) with one mistake
added.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from _doubles import (
    PAUSE_SECONDS,
    ActionSamples,
    CollectingEventSink,
    PrefixDecisionParser,
    ReplySamples,
    SuspendingActionExecutor,
)

from polyloop.errors import RunLeaseLostError
from polyloop.parsers import NativeToolCallParser
from polyloop.ports import (
    Action,
    Event,
    FinalAnswer,
    InvalidDecision,
    ModelCall,
    ParsedReply,
    RunLog,
    ToolCall,
    ToolContext,
    ToolProgress,
)
from polyloop.stores import VolatileRunLease, VolatileRunStore
from polyloop.testing import (
    ActionExecutorContract,
    DecisionParserContract,
    EventSinkContract,
    ModelClientContract,
    NativeToolCallModelClientContract,
    NativeToolCallParserContract,
    RecordFactory,
    RunLeaseContract,
    RunStoreContract,
    ScriptedModelClient,
)
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    Intent,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
    Role,
    RunFinished,
    RunStarted,
    Settlement,
    StepCompleted,
)

pytestmark = pytest.mark.contract

# --------------------------------------------------------------------------- stores


class _DelegatingStore:
    """A correct store (``VolatileRunStore``) behind a layer where one mistake can go."""

    def __init__(self) -> None:
        self.inner = VolatileRunStore()

    async def write_run_started(self, record: RunStarted) -> None:
        await self.inner.write_run_started(record)

    async def write_intent(self, record: Intent) -> None:
        await self.inner.write_intent(record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await self.inner.write_model_call_result(record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        await self.inner.write_step_completed(record)

    async def write_run_finished(self, record: RunFinished) -> None:
        await self.inner.write_run_finished(record)

    async def read_log(self, run_id: str) -> RunLog:
        return await self.inner.read_log(run_id)

    def parameters(self) -> Mapping[str, str]:
        return self.inner.parameters()


class _DropsIntents(_DelegatingStore):
    async def write_intent(self, record: Intent) -> None:
        return None


class _RaisesOnUnknownRun(_DelegatingStore):
    async def read_log(self, run_id: str) -> RunLog:
        log = await self.inner.read_log(run_id)
        if log.is_empty:
            raise KeyError(run_id)
        return log


class _HasACurrentRun(_DelegatingStore):
    """Files every record under the first run id it ever saw."""

    current: str | None = None

    def _route(self, record: Any) -> Any:
        if self.current is None:
            self.current = record.run_id
        return dataclasses.replace(record, run_id=self.current)

    async def write_intent(self, record: Intent) -> None:
        await self.inner.write_intent(self._route(record))

    async def read_log(self, run_id: str) -> RunLog:
        return await self.inner.read_log(self.current or run_id)


class _ReversesOrder(_DelegatingStore):
    async def read_log(self, run_id: str) -> RunLog:
        log = await self.inner.read_log(run_id)
        return dataclasses.replace(log, intents=log.intents[::-1], steps=log.steps[::-1])


class _InventsStepsForDanglingActions(_DelegatingStore):
    """ "Repairs" an action intent without a result by inventing its step."""

    async def read_log(self, run_id: str) -> RunLog:
        log = await self.inner.read_log(run_id)
        done = {step.result_id for step in log.steps}
        records = RecordFactory()
        invented = tuple(
            records.step_completed(
                run_id=run_id,
                result_id=intent.result_id,
                action_outcome=records.outcome(),
                step=records.step(step_idx=len(log.steps)),
            )
            for intent in log.intents
            if intent.kind.value == "action" and intent.result_id not in done
        )
        return dataclasses.replace(log, steps=log.steps + invented)


class _DropsOrphanResults(_DelegatingStore):
    async def read_log(self, run_id: str) -> RunLog:
        log = await self.inner.read_log(run_id)
        announced = {intent.result_id for intent in log.intents}
        kept = tuple(r for r in log.model_results if r.result_id in announced)
        return dataclasses.replace(log, model_results=kept)


class _DropsFailedCalls(_DelegatingStore):
    async def write_model_call_result(self, record: ModelCallResult) -> None:
        if record.failure is None:
            await self.inner.write_model_call_result(record)


class _DropsTheOutcome(_DelegatingStore):
    async def write_step_completed(self, record: StepCompleted) -> None:
        await self.inner.write_step_completed(
            dataclasses.replace(record, result_id=None, action_outcome=None)
        )


class _DropsStepsWithoutAnAction(_DelegatingStore):
    async def write_step_completed(self, record: StepCompleted) -> None:
        if record.action_outcome is not None:
            await self.inner.write_step_completed(record)


class _ForgetsTheFinish(_DelegatingStore):
    async def write_run_finished(self, record: RunFinished) -> None:
        return None


class _LosesTheSnapshot(_DelegatingStore):
    async def write_run_started(self, record: RunStarted) -> None:
        await self.inner.write_run_started(dataclasses.replace(record, parameter_snapshot={}))


class _ForgetsTheTreeLinks(_DelegatingStore):
    """Writes a child's start without its parent (a store of 1.8's fields only)."""

    async def write_run_started(self, record: RunStarted) -> None:
        await self.inner.write_run_started(dataclasses.replace(record, parent=None))


class _NumericStoreParameters(_DelegatingStore):
    def parameters(self) -> Mapping[str, Any]:
        return {"kind": "volatile", "format_version": 2}


class _CountsRecordsInParameters(_DelegatingStore):
    writes = 0

    async def write_intent(self, record: Intent) -> None:
        self.writes += 1
        await self.inner.write_intent(record)

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "volatile", "records": str(self.writes)}


class _SettlingStore(_DelegatingStore):
    """A correct store with the ``SettlingRunStore`` capability (``write_settlement`` and
    ``write_approval_request``), where a breach of it can go."""

    async def write_settlement(self, record: Settlement) -> None:
        await self.inner.write_settlement(record)

    async def write_approval_request(self, record: ApprovalRequest) -> None:
        await self.inner.write_approval_request(record)


class _DropsSettlements(_SettlingStore):
    """Has ``write_settlement`` (so it claims the capability) but keeps nothing of it."""

    async def write_settlement(self, record: Settlement) -> None:
        return None


class _ForgetsTheIdempotencyKey(_SettlingStore):
    """Stores settlements, but an intent without the key it was handed (an older format)."""

    async def write_intent(self, record: Intent) -> None:
        await self.inner.write_intent(dataclasses.replace(record, idempotency_key=None))


class _DropsApprovalRequests(_SettlingStore):
    """Has ``write_approval_request`` (so it claims the capability) but keeps nothing of it:
    a run parked for approval reads back as one whose model just replied."""

    async def write_approval_request(self, record: ApprovalRequest) -> None:
        return None


class _ForgetsTheExpiry(_SettlingStore):
    """Stores a request without its ``expires_at`` (a column it never got): the call then
    waits forever instead of being rejected as expired."""

    async def write_approval_request(self, record: ApprovalRequest) -> None:
        await self.inner.write_approval_request(dataclasses.replace(record, expires_at=None))


class _FilesApprovalsLast(_SettlingStore):
    """Keeps every record, but reads requests and decisions back after all the others (the
    records added last kept apart and merged at the end): a decision then seems to come after
    the step it decided on."""

    async def read_log(self, run_id: str) -> RunLog:
        log = await self.inner.read_log(run_id)

        def late(record: object) -> bool:
            decision = isinstance(record, Settlement) and record.is_approval_decision
            return decision or isinstance(record, ApprovalRequest)

        entries = [e for e in log.entries if not late(e.record)]
        entries += [e for e in log.entries if late(e.record)]
        return dataclasses.replace(log, entries=tuple(entries))


class _ForwardsNoLeases(_DelegatingStore):
    """Forwards the ``RunStore`` methods of a leasing store but not ``acquire_lease`` (issue
    20): the wrapper silently runs every run unleased."""


def _store_breach(store_class: type[_DelegatingStore]) -> type[RunStoreContract]:
    class Wiring(RunStoreContract):
        @pytest.fixture
        def store(self) -> Any:
            return store_class()

    return Wiring


TestDropsIntents = _store_breach(_DropsIntents)
TestRaisesOnUnknownRun = _store_breach(_RaisesOnUnknownRun)
TestHasACurrentRun = _store_breach(_HasACurrentRun)
TestReversesOrder = _store_breach(_ReversesOrder)
TestInventsStepsForDanglingActions = _store_breach(_InventsStepsForDanglingActions)
TestDropsOrphanResults = _store_breach(_DropsOrphanResults)
TestDropsFailedCalls = _store_breach(_DropsFailedCalls)
TestDropsTheOutcome = _store_breach(_DropsTheOutcome)
TestDropsStepsWithoutAnAction = _store_breach(_DropsStepsWithoutAnAction)
TestForgetsTheFinish = _store_breach(_ForgetsTheFinish)
TestLosesTheSnapshot = _store_breach(_LosesTheSnapshot)
TestForgetsTheTreeLinks = _store_breach(_ForgetsTheTreeLinks)
TestNumericStoreParameters = _store_breach(_NumericStoreParameters)
TestCountsRecordsInParameters = _store_breach(_CountsRecordsInParameters)
TestForwardsNoLeases = _store_breach(_ForwardsNoLeases)
TestDropsSettlements = _store_breach(_DropsSettlements)
TestForgetsTheIdempotencyKey = _store_breach(_ForgetsTheIdempotencyKey)
TestDropsApprovalRequests = _store_breach(_DropsApprovalRequests)
TestForgetsTheExpiry = _store_breach(_ForgetsTheExpiry)
TestFilesApprovalsLast = _store_breach(_FilesApprovalsLast)


class TestForgotTheStore(RunStoreContract):
    """No ``store`` override: every test that needs one must error with the guidance."""


# --------------------------------------------------------------------------- run leases


class _LeaseView:
    """A correct lease (``VolatileRunLease``) behind a layer where one mistake can go."""

    def __init__(self, store: _LeasingStore, inner: VolatileRunLease) -> None:
        self.store = store
        self.inner = inner

    @property
    def run_id(self) -> str:
        return self.inner.run_id

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    async def write_run_started(self, record: RunStarted) -> None:
        await self.inner.write_run_started(record)

    async def write_intent(self, record: Intent) -> None:
        await self.inner.write_intent(record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await self.inner.write_model_call_result(record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        await self.inner.write_step_completed(record)

    async def write_run_finished(self, record: RunFinished) -> None:
        await self.inner.write_run_finished(record)

    async def release(self) -> None:
        await self.inner.release()


class _LeasingStore(_DelegatingStore):
    """A correct leasing store; ``view`` is the lease layer a breach replaces."""

    view: type[_LeaseView] = _LeaseView

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> _LeaseView:
        return self.view(self, await self.inner.acquire_lease(run_id, wait_seconds=wait_seconds))


class _SaysNoLeasesButHasThem(_LeasingStore):
    offers_leases = False


TestSaysNoLeasesButHasThem = _store_breach(_SaysNoLeasesButHasThem)


class _ExcludesNobody(_LeasingStore):
    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> _LeaseView:
        # Every acquirer gets a lease of its own (from a scratch store nobody else sees).
        return self.view(self, await VolatileRunStore().acquire_lease(run_id))


class _OneLeaseForAllRuns(_LeasingStore):
    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> _LeaseView:
        return self.view(self, await self.inner.acquire_lease("*", wait_seconds=wait_seconds))


class _NeverWaits(_LeasingStore):
    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> _LeaseView:
        return self.view(self, await self.inner.acquire_lease(run_id))


class _ReleaseKeepsTheRunView(_LeaseView):
    async def release(self) -> None:
        return None


class _ConstantEpochView(_LeaseView):
    @property
    def epoch(self) -> int:
        return 1


class _DropsFinishesView(_LeaseView):
    async def write_run_finished(self, record: RunFinished) -> None:
        return None


class _StartIgnoresAnExistingLogView(_LeaseView):
    async def write_run_started(self, record: RunStarted) -> None:
        with contextlib.suppress(FileExistsError):
            await self.inner.write_run_started(record)


class _WritesAnyRunView(_LeaseView):
    async def write_intent(self, record: Intent) -> None:
        if record.run_id != self.run_id:
            await self.store.inner.write_intent(record)
        else:
            await self.inner.write_intent(record)


class _UnfencedView(_LeaseView):
    """Writes through the plain store: the lease is never checked at all."""

    async def write_run_started(self, record: RunStarted) -> None:
        await self.store.inner.write_run_started(record)

    async def write_intent(self, record: Intent) -> None:
        await self.store.inner.write_intent(record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await self.store.inner.write_model_call_result(record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        await self.store.inner.write_step_completed(record)

    async def write_run_finished(self, record: RunFinished) -> None:
        await self.store.inner.write_run_finished(record)


class _ChecksBeforeWritingView(_UnfencedView):
    """The mistake the fencing literature warns about: check the lease, then write, with a
    suspension point in between (here one event-loop turn; in real stores a separate query
    or a thread hop). A release or takeover in that gap goes unnoticed."""

    async def write_intent(self, record: Intent) -> None:
        if self.inner.released:
            raise RunLeaseLostError("released", run_id=self.run_id, epoch=self.epoch)
        await asyncio.sleep(0)
        await self.store.inner.write_intent(record)


class _UnfencedSettlementsView(_LeaseView):
    """Fences the five writes, but writes a settlement through the plain store."""

    async def write_settlement(self, record: Settlement) -> None:
        await self.store.inner.write_settlement(record)


class _UnfencedApprovalRequestsView(_LeaseView):
    """Fences the five writes and settlements, but writes an approval request through the
    plain store (the method added last, copied from the unleased store)."""

    async def write_settlement(self, record: Settlement) -> None:
        await self.inner.write_settlement(record)

    async def write_approval_request(self, record: ApprovalRequest) -> None:
        await self.store.inner.write_approval_request(record)


class _CheckNeverLostView(_LeaseView):
    """Offers ``check_current`` (``CheckedLease``, design 0245) but never finds the lease
    lost: a stale holder of a parent would start children."""

    async def check_current(self) -> None:
        return None


def _lease_breach(
    store_class: type[_LeasingStore], view: type[_LeaseView] = _LeaseView
) -> type[RunLeaseContract]:
    class Wiring(RunLeaseContract):
        @pytest.fixture
        def store(self) -> Any:
            made = store_class()
            made.view = view
            return made

    return Wiring


TestLeaseExcludesNobody = _lease_breach(_ExcludesNobody)
TestOneLeaseForAllRuns = _lease_breach(_OneLeaseForAllRuns)
TestLeaseNeverWaits = _lease_breach(_NeverWaits)
TestReleaseKeepsTheRun = _lease_breach(_LeasingStore, _ReleaseKeepsTheRunView)
TestLeaseEpochNeverGrows = _lease_breach(_LeasingStore, _ConstantEpochView)
TestLeaseDropsFinishes = _lease_breach(_LeasingStore, _DropsFinishesView)
TestLeasedStartIgnoresAnExistingLog = _lease_breach(_LeasingStore, _StartIgnoresAnExistingLogView)
TestLeaseWritesAnyRun = _lease_breach(_LeasingStore, _WritesAnyRunView)
TestReleasedLeaseStillWrites = _lease_breach(_LeasingStore, _UnfencedView)
TestLeaseCheckedBeforeTheWrite = _lease_breach(_LeasingStore, _ChecksBeforeWritingView)
TestUnfencedSettlements = _lease_breach(_LeasingStore, _UnfencedSettlementsView)
TestUnfencedApprovalRequests = _lease_breach(_LeasingStore, _UnfencedApprovalRequestsView)
TestLeaseCheckNeverLost = _lease_breach(_LeasingStore, _CheckNeverLostView)


class TestForgotTheLeasingStore(RunLeaseContract):
    """No ``store`` override."""


# --------------------------------------------------------------------------- executors


class _ReturnsALookAlike(SuspendingActionExecutor):
    async def execute(self, action: Action) -> Any:
        outcome = await super().execute(action)
        return SimpleNamespace(
            **{f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome)}
        )


class _ReportsUnknownCompletion(SuspendingActionExecutor):
    async def execute(self, action: Action) -> Any:
        outcome = await super().execute(action)
        fields = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome)}
        return SimpleNamespace(**{**fields, "env_reported_completion": None})


class _RejectsEverything(SuspendingActionExecutor):
    async def execute(self, action: Action) -> ActionOutcome:
        outcome = await super().execute(action)
        return dataclasses.replace(outcome, status=ActionStatus.NOT_EXECUTED)


class _ActionErrorsBecomeEnvErrors(SuspendingActionExecutor):
    async def execute(self, action: Action) -> ActionOutcome:
        outcome = await super().execute(action)
        if outcome.observation.startswith("error"):
            return dataclasses.replace(outcome, status=ActionStatus.ENV_ERROR)
        return outcome


class _SwallowsCancellation(SuspendingActionExecutor):
    async def execute(self, action: Action) -> ActionOutcome:
        try:
            return await super().execute(action)
        except asyncio.CancelledError:  # the breach under test: a swallowed cancellation
            return await SuspendingActionExecutor.execute(self, action)


class _NumericExecutorParameters(SuspendingActionExecutor):
    def parameters(self) -> Mapping[str, Any]:
        return {"kind": "suspending", "pause_seconds": 0.001}


class _LeasedPortInParameters(SuspendingActionExecutor):
    port = 40000

    async def execute(self, action: Action) -> ActionOutcome:
        self.port += 1
        return await super().execute(action)

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "suspending", "port": str(self.port)}


def _executor_breach(executor_class: type[SuspendingActionExecutor]) -> type:
    class Wiring(ActionExecutorContract):
        @pytest.fixture
        def action_executor(self) -> Any:
            return executor_class()

        @pytest.fixture
        def action_samples(self, records: RecordFactory) -> ActionSamples:
            return ActionSamples(
                executes_cleanly=records.action(text="count to three"),
                executes_but_errors=records.action(text="FAIL divide by zero"),
            )

    return Wiring


TestReturnsALookAlike = _executor_breach(_ReturnsALookAlike)
TestReportsUnknownCompletion = _executor_breach(_ReportsUnknownCompletion)
TestRejectsEverything = _executor_breach(_RejectsEverything)
TestActionErrorsBecomeEnvErrors = _executor_breach(_ActionErrorsBecomeEnvErrors)
TestSwallowsCancellationInExecute = _executor_breach(_SwallowsCancellation)
TestNumericExecutorParameters = _executor_breach(_NumericExecutorParameters)
TestLeasedPortInParameters = _executor_breach(_LeasedPortInParameters)


class TestMintsItsOwnKeys(ActionExecutorContract):
    """Hands its system a key of its own making per call instead of the action's key, so a
    replay of one execution reaches the system under a new key (a second effect)."""

    @pytest.fixture
    def action_executor(self) -> Any:
        keys: list[str] = []
        self.keys = keys

        async def charge(ctx: ToolContext, cents: int) -> str:
            """Charge a card."""
            keys.append(f"{ctx.run_id}:{ctx.step_idx}:{len(keys)}")
            return f"charged {cents}"

        async def refund(ctx: ToolContext, cents: int) -> str:
            """Refund (always fails here)."""
            raise RuntimeError(f"no charge of {cents}")

        return ToolRegistry(
            [ToolSpec.from_function(charge), ToolSpec.from_function(refund)]
        ).executor()

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        context = ToolContext(idempotency_key="polyloop:r:sample:a0", run_id="sample", step_idx=0)
        return ActionSamples(
            executes_cleanly=dataclasses.replace(
                records.action(text="charge", tool_name="charge", arguments={"cents": 5}),
                context=context,
            ),
            executes_but_errors=dataclasses.replace(
                records.action(text="refund", tool_name="refund", arguments={"cents": 5}),
                context=context,
            ),
        )

    @pytest.fixture
    def idempotency_keys_seen(self, action_executor: Any) -> Any:
        return lambda: list(self.keys)


class TestForgotTheExecutorSamples(ActionExecutorContract):
    """Overrides the executor but not ``action_samples``."""

    @pytest.fixture
    def action_executor(self) -> Any:
        return SuspendingActionExecutor()


class TestForgotTheExecutor(ActionExecutorContract):
    """Overrides ``action_samples`` but not the executor."""

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        return ActionSamples(
            executes_cleanly=records.action(text="count to three"),
            executes_but_errors=records.action(text="FAIL divide by zero"),
        )


# --------------------------------------------------------------------------- parsers


class _AsyncParser(PrefixDecisionParser):
    async def parse(self, reply: ModelReply) -> ParsedReply:
        return PrefixDecisionParser.parse(self, reply)


class _ReturnsALookAlikeVerdict(PrefixDecisionParser):
    def parse(self, reply: ModelReply) -> Any:
        parsed = super().parse(reply)
        return SimpleNamespace(history_text=parsed.history_text, decision=parsed.decision)


class _LosesTheHistoryText(PrefixDecisionParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        return dataclasses.replace(super().parse(reply), history_text=None)


class _InterpretsEverything(PrefixDecisionParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        return ParsedReply(history_text=reply.content, decision=Action(text=reply.content))


class _BlankExplanation(PrefixDecisionParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = super().parse(reply)
        if isinstance(parsed.decision, InvalidDecision):
            return dataclasses.replace(parsed, decision=InvalidDecision(explanation="  "))
        return parsed


class _NeverActs(PrefixDecisionParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = super().parse(reply)
        if isinstance(parsed.decision, Action):
            return dataclasses.replace(parsed, decision=FinalAnswer(text=parsed.decision.text))
        return parsed


class _RaisesOnGarbage(PrefixDecisionParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = super().parse(reply)
        if isinstance(parsed.decision, InvalidDecision):
            raise ValueError(parsed.decision.explanation)
        return parsed


class _CountsAttempts(PrefixDecisionParser):
    attempts = 0

    def parse(self, reply: ModelReply) -> ParsedReply:
        self.attempts += 1
        parsed = super().parse(reply)
        return dataclasses.replace(parsed, history_text=f"{parsed.history_text} #{self.attempts}")


class _NumericParserParameters(PrefixDecisionParser):
    def parameters(self) -> Mapping[str, Any]:
        return {"prefix": "DO ", "strict": True}


class _AttemptsInParameters(_CountsAttempts):
    def parse(self, reply: ModelReply) -> ParsedReply:
        self.attempts += 1
        return PrefixDecisionParser.parse(self, reply)

    def parameters(self) -> Mapping[str, str]:
        return {"prefix": "DO ", "attempts": str(self.attempts)}


def _parser_breach(parser_class: type[PrefixDecisionParser]) -> type:
    class Wiring(DecisionParserContract):
        @pytest.fixture
        def decision_parser(self) -> Any:
            return parser_class()

        @pytest.fixture
        def reply_samples(self, records: RecordFactory) -> ReplySamples:
            return ReplySamples(
                yields_an_action=records.reply(content="DO count to three"),
                yields_invalid=records.reply(content="Let me think about it first."),
            )

    return Wiring


TestAsyncParser = _parser_breach(_AsyncParser)
TestReturnsALookAlikeVerdict = _parser_breach(_ReturnsALookAlikeVerdict)
TestLosesTheHistoryText = _parser_breach(_LosesTheHistoryText)
TestInterpretsEverything = _parser_breach(_InterpretsEverything)
TestBlankExplanation = _parser_breach(_BlankExplanation)
TestNeverActs = _parser_breach(_NeverActs)
TestRaisesOnGarbage = _parser_breach(_RaisesOnGarbage)
TestCountsAttempts = _parser_breach(_CountsAttempts)
TestNumericParserParameters = _parser_breach(_NumericParserParameters)
TestAttemptsInParameters = _parser_breach(_AttemptsInParameters)


class TestForgotTheParser(DecisionParserContract):
    @pytest.fixture
    def reply_samples(self, records: RecordFactory) -> ReplySamples:
        return ReplySamples(
            yields_an_action=records.reply(content="DO count to three"),
            yields_invalid=records.reply(content="Let me think about it first."),
        )


class TestForgotTheReplySamples(DecisionParserContract):
    @pytest.fixture
    def decision_parser(self) -> Any:
        return PrefixDecisionParser()


# --------------------------------------------------------------------------- model clients

_SCRIPT = ("DO look around", "I am done.")


class _ReturnsALookAlikeReply(ScriptedModelClient):
    async def call(self, call: ModelCall) -> Any:
        reply = await super().call(call)
        return SimpleNamespace(call_id=reply.call_id, content=reply.content, thinking=None)


class _EmptyCallId(ScriptedModelClient):
    async def call(self, call: ModelCall) -> Any:
        reply = await super().call(call)
        return SimpleNamespace(call_id="", content=reply.content, thinking=reply.thinking)


class _SwallowsFailures(ScriptedModelClient):
    async def call(self, call: ModelCall) -> ModelReply:
        try:
            return await super().call(call)
        except ValueError:  # the breach under test: failure disguised as an empty reply
            return ModelReply(call_id=None, content="")


class _BrokenAfterAFailure(ScriptedModelClient):
    broken = False

    async def call(self, call: ModelCall) -> ModelReply:
        if self.broken:
            raise RuntimeError("the connection was closed by an earlier failure")
        try:
            return await super().call(call)
        except ValueError:
            self.broken = True
            raise


class _SwallowsCancelledCalls(ScriptedModelClient):
    async def call(self, call: ModelCall) -> ModelReply:
        try:
            return await super().call(call)
        except asyncio.CancelledError:  # the breach under test: a swallowed cancellation
            return ModelReply(call_id=None, content="cancelled")


class _RetriesInTheSignature(ScriptedModelClient):
    async def call(self, call: ModelCall, retries: int = 3) -> ModelReply:
        return await super().call(call)


class _NumericClientParameters(ScriptedModelClient):
    def parameters(self) -> Mapping[str, Any]:
        return {"kind": "scripted", "temperature": 0.0}


class _CountsCallsInParameters(ScriptedModelClient):
    made = 0

    async def call(self, call: ModelCall) -> ModelReply:
        self.made += 1
        return await super().call(call)

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "scripted", "calls": str(self.made)}


def _client_breach(client_class: type[ScriptedModelClient]) -> type:
    class Wiring(ModelClientContract):
        @pytest.fixture
        def model_client(self) -> Any:
            return client_class(_SCRIPT, delay=PAUSE_SECONDS)

        @pytest.fixture
        def failing_call(self, records: RecordFactory) -> ModelCall:
            return records.model_call(call_index=0, result_id="m-fails", messages=())

    return Wiring


TestReturnsALookAlikeReply = _client_breach(_ReturnsALookAlikeReply)
TestEmptyCallId = _client_breach(_EmptyCallId)
TestSwallowsFailures = _client_breach(_SwallowsFailures)
TestBrokenAfterAFailure = _client_breach(_BrokenAfterAFailure)
TestSwallowsCancelledCalls = _client_breach(_SwallowsCancelledCalls)
TestRetriesInTheSignature = _client_breach(_RetriesInTheSignature)
TestNumericClientParameters = _client_breach(_NumericClientParameters)
TestCountsCallsInParameters = _client_breach(_CountsCallsInParameters)


class TestForgotTheClient(ModelClientContract):
    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m-fails", messages=())


class TestForgotTheFailingCall(ModelClientContract):
    @pytest.fixture
    def model_client(self) -> Any:
        return ScriptedModelClient(_SCRIPT, delay=PAUSE_SECONDS)


# --------------------------------------------------------------------------- event sinks


class _RefusesEvents(CollectingEventSink):
    async def emit(self, event: Event) -> None:
        raise TypeError(f"cannot serialise {type(event).__name__}")


class _OneShot(CollectingEventSink):
    async def emit(self, event: Event) -> None:
        if self.events:
            raise ConnectionError("the connection was closed after the first send")
        await super().emit(event)


class _ProgressOnlyOnce(CollectingEventSink):
    """Has ``emit_progress`` but delivers one report per connection, as a one-shot push does."""

    def __init__(self) -> None:
        super().__init__()
        self.progress: list[ToolProgress] = []

    async def emit_progress(self, progress: ToolProgress) -> None:
        if self.progress:
            raise ConnectionError("the progress channel was closed after the first report")
        self.progress.append(progress)


class _NumericSinkParameters(CollectingEventSink):
    def parameters(self) -> Mapping[str, Any]:
        return {"kind": "collecting", "batch": 10}


class _CountsEventsInParameters(CollectingEventSink):
    def parameters(self) -> Mapping[str, str]:
        return {"kind": "collecting", "received": str(len(self.events))}


def _sink_breach(sink_class: type[CollectingEventSink]) -> type:
    class Wiring(EventSinkContract):
        @pytest.fixture
        def event_sink(self) -> Any:
            return sink_class()

    return Wiring


TestRefusesEvents = _sink_breach(_RefusesEvents)
TestOneShot = _sink_breach(_OneShot)
TestProgressOnlyOnce = _sink_breach(_ProgressOnlyOnce)
TestNumericSinkParameters = _sink_breach(_NumericSinkParameters)
TestCountsEventsInParameters = _sink_breach(_CountsEventsInParameters)


class TestForgotTheSink(EventSinkContract):
    """No ``event_sink`` override."""


# --------------------------------------------------------------------------- native tool calls


class _DoesNotClaimNativeCalls(NativeToolCallParser):
    native_tool_calls = False


class _RunsTheFirstOfSeveralCalls(NativeToolCallParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        first = dataclasses.replace(reply, tool_calls=reply.tool_calls[:1])
        return NativeToolCallParser.parse(self, first)


class _IgnoresTheLengthCutOff(NativeToolCallParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        return NativeToolCallParser.parse(self, dataclasses.replace(reply, finish_reason="stop"))


class _PassesRawArguments(NativeToolCallParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = NativeToolCallParser.parse(self, reply)
        if len(reply.tool_calls) == 1 and reply.finish_reason != "length":
            (call,) = reply.tool_calls
            action = Action(
                text=call.arguments,
                tool_call=ToolCall(name=call.name, arguments={"raw": call.arguments}),
            )
            return dataclasses.replace(parsed, decision=action)
        return parsed


class _ActsOnText(NativeToolCallParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        parsed = NativeToolCallParser.parse(self, reply)
        if not reply.tool_calls:
            return dataclasses.replace(parsed, decision=Action(text=reply.content))
        return parsed


class _RaisesOnANamelessCall(NativeToolCallParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        if any(not call.name for call in reply.tool_calls):
            raise KeyError("name")
        return NativeToolCallParser.parse(self, reply)


def _native_parser_breach(parser_class: type[NativeToolCallParser]) -> type:
    class Wiring(NativeToolCallParserContract):
        @pytest.fixture
        def decision_parser(self) -> Any:
            return parser_class()

    return Wiring


TestDoesNotClaimNativeCalls = _native_parser_breach(_DoesNotClaimNativeCalls)
TestRunsTheFirstOfSeveralCalls = _native_parser_breach(_RunsTheFirstOfSeveralCalls)
TestIgnoresTheLengthCutOff = _native_parser_breach(_IgnoresTheLengthCutOff)
TestPassesRawArguments = _native_parser_breach(_PassesRawArguments)
TestActsOnText = _native_parser_breach(_ActsOnText)
TestRaisesOnANamelessCall = _native_parser_breach(_RaisesOnANamelessCall)


class _NativeScriptedClient(ScriptedModelClient):
    """The scripted client, answering a call that offers tools with a call of the first one."""

    native_tool_calls = True

    async def call(self, call: ModelCall) -> ModelReply:
        reply = await super().call(call)
        if not call.tools:
            return reply
        name = str(call.tools[0]["name"])
        tool_call = NativeToolCall(id=f"call-{reply.call_id}", name=name, arguments="{}")
        return dataclasses.replace(reply, content="", tool_calls=(tool_call,))


class _DoesNotClaimToSendTools(_NativeScriptedClient):
    native_tool_calls = False


class _DropsTheToolCalls(_NativeScriptedClient):
    async def call(self, call: ModelCall) -> ModelReply:
        return dataclasses.replace(await super().call(call), tool_calls=())


class _RefusesToolTurns(_NativeScriptedClient):
    async def call(self, call: ModelCall) -> ModelReply:
        if any(message.role is Role.TOOL for message in call.messages):
            raise TypeError("this client only knows system, user and assistant messages")
        return await super().call(call)


_LOOKUP = {"name": "lookup", "description": "Look a word up.", "parameters": {"type": "object"}}


def _native_client_breach(client_class: type[_NativeScriptedClient]) -> type:
    class Wiring(NativeToolCallModelClientContract):
        @pytest.fixture
        def model_client(self) -> Any:
            return client_class(_SCRIPT, delay=PAUSE_SECONDS)

        @pytest.fixture
        def failing_call(self, records: RecordFactory) -> ModelCall:
            return records.model_call(call_index=0, result_id="m-fails", messages=())

        @pytest.fixture
        def tool_call_sample(self, records: RecordFactory) -> ModelCall:
            return records.model_call(call_index=0, result_id="m0", tools=[_LOOKUP])

    return Wiring


TestDoesNotClaimToSendTools = _native_client_breach(_DoesNotClaimToSendTools)
TestDropsTheToolCalls = _native_client_breach(_DropsTheToolCalls)
TestRefusesToolTurns = _native_client_breach(_RefusesToolTurns)


class TestForgotTheToolCallSample(NativeToolCallModelClientContract):
    @pytest.fixture
    def model_client(self) -> Any:
        return _NativeScriptedClient(_SCRIPT, delay=PAUSE_SECONDS)

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m-fails", messages=())


# --------------------------------------------------------------------------- expectations

EXPECTED_FAILURES: dict[str, set[str]] = {
    "TestDropsIntents": {"test_written_intent_is_readable"},
    "TestRaisesOnUnknownRun": {"test_log_of_unknown_run_is_empty_not_an_error"},
    "TestHasACurrentRun": {"test_two_runs_do_not_leak_into_each_other"},
    "TestReversesOrder": {"test_records_of_one_kind_come_back_in_write_order"},
    "TestInventsStepsForDanglingActions": {"test_intent_without_result_is_readable_as_such"},
    "TestDropsOrphanResults": {"test_result_without_intent_is_visible_to_the_reader"},
    "TestDropsFailedCalls": {"test_failed_model_call_is_recorded_as_a_result_not_as_nothing"},
    "TestDropsTheOutcome": {"test_action_result_and_step_land_together"},
    "TestDropsStepsWithoutAnAction": {"test_step_without_an_action_is_still_recorded"},
    "TestForgetsTheFinish": {"test_run_finished_is_visible_before_the_result_is_returned"},
    "TestLosesTheSnapshot": {"test_run_started_carries_the_parameter_snapshot"},
    "TestForgetsTheTreeLinks": {"test_tree_links_read_back_both_ways"},
    "TestNumericStoreParameters": {"test_parameters_map_strings_to_strings"},
    "TestCountsRecordsInParameters": {"test_parameters_are_stable_across_calls"},
    "TestForwardsNoLeases": {"test_the_store_offers_leases_or_says_it_has_none"},
    "TestDropsSettlements": {"test_settlements_round_trip_in_write_order"},
    "TestForgetsTheIdempotencyKey": {"test_settlements_round_trip_in_write_order"},
    "TestUnfencedSettlements": {"test_settlements_through_a_lease_are_fenced"},
    "TestDropsApprovalRequests": {"test_approval_requests_and_decisions_round_trip_in_write_order"},
    "TestForgetsTheExpiry": {"test_approval_requests_and_decisions_round_trip_in_write_order"},
    "TestFilesApprovalsLast": {"test_approval_requests_and_decisions_round_trip_in_write_order"},
    "TestUnfencedApprovalRequests": {"test_approval_requests_through_a_lease_are_fenced"},
    "TestLeaseCheckNeverLost": {"test_a_lease_checks_whether_it_is_still_current"},
    "TestSaysNoLeasesButHasThem": {"test_the_store_offers_leases_or_says_it_has_none"},
    "TestLeaseExcludesNobody": {"test_a_held_run_is_refused_to_a_second_acquirer"},
    "TestOneLeaseForAllRuns": {"test_leases_of_different_runs_do_not_exclude_each_other"},
    "TestLeaseNeverWaits": {
        "test_a_waiting_acquirer_gets_the_run_when_the_holder_releases",
        "test_a_waiting_acquirer_gives_up_after_its_wait",
    },
    "TestReleaseKeepsTheRun": {"test_release_frees_the_run_for_the_next_acquirer"},
    "TestLeaseEpochNeverGrows": {"test_every_grant_has_a_larger_epoch"},
    "TestLeaseDropsFinishes": {"test_writes_through_a_lease_read_back_like_plain_writes"},
    "TestLeasedStartIgnoresAnExistingLog": {"test_a_leased_start_is_still_exclusive"},
    "TestLeaseWritesAnyRun": {"test_a_record_of_another_run_is_refused_by_the_lease"},
    "TestReleasedLeaseStillWrites": {"test_a_released_lease_writes_nothing"},
    "TestLeaseCheckedBeforeTheWrite": {
        "test_a_release_racing_a_write_never_lets_it_land_after_the_next_holder"
    },
    "TestReturnsALookAlike": {"test_returns_all_five_fields"},
    "TestReportsUnknownCompletion": {"test_completion_signal_is_a_plain_boolean"},
    "TestRejectsEverything": {
        "test_a_clean_action_is_executed",
        "test_action_error_is_a_normal_observation_not_an_env_error",
    },
    "TestActionErrorsBecomeEnvErrors": {
        "test_action_error_is_a_normal_observation_not_an_env_error"
    },
    "TestSwallowsCancellationInExecute": {"test_cancellation_propagates_and_is_not_swallowed"},
    "TestNumericExecutorParameters": {"test_parameters_map_strings_to_strings"},
    "TestLeasedPortInParameters": {"test_parameters_are_stable_across_calls"},
    "TestMintsItsOwnKeys": {"test_an_executor_passes_the_same_key_on_every_replay"},
    "TestAsyncParser": {"test_parse_is_synchronous"},
    "TestReturnsALookAlikeVerdict": {"test_parse_returns_a_parsed_reply"},
    "TestLosesTheHistoryText": {"test_history_text_is_what_goes_back_into_the_conversation"},
    "TestInterpretsEverything": {
        "test_invalid_decision_explanation_is_what_is_fed_back",
        "test_invalid_decision_explanation_is_not_blank",
        "test_unparseable_output_returns_invalid_decision_rather_than_raising",
    },
    "TestBlankExplanation": {"test_invalid_decision_explanation_is_not_blank"},
    "TestNeverActs": {"test_action_carries_its_trace_form"},
    "TestRaisesOnGarbage": {"test_unparseable_output_returns_invalid_decision_rather_than_raising"},
    "TestCountsAttempts": {"test_parsing_the_same_reply_twice_gives_equal_verdicts"},
    "TestNumericParserParameters": {"test_parameters_map_strings_to_strings"},
    "TestAttemptsInParameters": {"test_parameters_are_stable_across_calls"},
    "TestReturnsALookAlikeReply": {"test_returns_three_fields"},
    "TestEmptyCallId": {"test_call_id_is_never_an_empty_string"},
    "TestSwallowsFailures": {"test_failure_is_expressed_as_an_exception"},
    "TestBrokenAfterAFailure": {"test_the_client_keeps_working_after_a_failed_call"},
    "TestSwallowsCancelledCalls": {"test_cancellation_propagates_and_is_not_swallowed"},
    "TestRetriesInTheSignature": {"test_signature_carries_no_retry_or_rate_limit_parameters"},
    "TestNumericClientParameters": {"test_parameters_map_strings_to_strings"},
    "TestCountsCallsInParameters": {"test_parameters_are_stable_across_calls"},
    "TestDoesNotClaimNativeCalls": {"test_claims_native_tool_calls"},
    "TestRunsTheFirstOfSeveralCalls": {
        "test_every_tool_call_of_the_reply_goes_back_into_history",
        "test_several_tool_calls_in_one_reply_are_refused_naming_each",
    },
    "TestIgnoresTheLengthCutOff": {"test_a_reply_cut_off_at_the_length_limit_is_not_acted_on"},
    "TestPassesRawArguments": {
        "test_one_tool_call_becomes_an_action_with_its_name_and_arguments",
        "test_arguments_that_are_not_json_are_an_invalid_decision",
        "test_arguments_that_are_not_a_json_object_are_an_invalid_decision",
    },
    "TestActsOnText": {"test_text_without_tool_calls_is_never_an_action"},
    "TestRaisesOnANamelessCall": {"test_odd_tool_calls_never_raise"},
    "TestDoesNotClaimToSendTools": {"test_claims_native_tool_calls"},
    "TestDropsTheToolCalls": {
        "test_tool_calls_come_back_with_id_name_and_raw_arguments",
        "test_a_history_with_tool_turns_is_accepted",
    },
    "TestRefusesToolTurns": {"test_a_history_with_tool_turns_is_accepted"},
    "TestRefusesEvents": {"test_emit_accepts_an_event"},
    "TestOneShot": {"test_emit_accepts_one_event_per_step"},
    "TestNumericSinkParameters": {"test_parameters_map_strings_to_strings"},
    "TestProgressOnlyOnce": {"test_emit_progress_accepts_progress_reports"},
    "TestCountsEventsInParameters": {"test_parameters_are_stable_across_calls"},
}
"""Breach wiring -> contract methods it must turn red (others may go red too)."""

FORGOTTEN_FIXTURES: dict[str, str] = {
    "TestForgotTheStore": "store",
    "TestForgotTheLeasingStore": "store",
    "TestForgotTheExecutor": "action_executor",
    "TestForgotTheExecutorSamples": "action_samples",
    "TestForgotTheParser": "decision_parser",
    "TestForgotTheReplySamples": "reply_samples",
    "TestForgotTheClient": "model_client",
    "TestForgotTheFailingCall": "failing_call",
    "TestForgotTheSink": "event_sink",
    "TestForgotTheToolCallSample": "tool_call_sample",
}
"""Wiring that forgets a fixture -> the fixture its errors must name."""
