"""An outcome the executor cannot tell is in doubt, settled by policy in the same run (issue 35,
design 0227): ``ToolOutcomeUnknown`` from a function tool and an action cut by
``action_timeout_seconds``, for ``SAFE``, ``IDEMPOTENT`` and ``NEVER`` (with and without a
reconciler); executed failures are unchanged. The MCP sources are in
``tests/integration/test_mcp_unknown_outcome.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.errors import ToolEnvironmentError, ToolError, ToolOutcomeUnknown
from polyloop.session import check_log, plan_resume, resolve, resume, run
from polyloop.session._step import IN_DOUBT_ATTEMPTS
from polyloop.stores import VolatileRunStore
from polyloop.tools import Reconciliation, ToolContext, ToolRegistry, ToolSpec
from polyloop.types import (
    ActionStatus,
    IntentKind,
    ReplayPolicy,
    SettlementSource,
    SettlementVerdict,
    StopReason,
)

pytestmark = pytest.mark.unit

SCRIPT = ['tool:pay {"amount": 5}', "final:paid"]


class Service:
    """The tool's system. ``lose`` answers are lost after the effect (``ToolOutcomeUnknown``);
    ``hang`` calls never answer (the action bound cuts them); ``raise_next`` raises as-is."""

    def __init__(self, *, lose: int = 0, hang: int = 0) -> None:
        self.lose = lose
        self.hang = hang
        self.keys: list[str] = []
        self.raise_next: BaseException | None = None

    async def call(self, key: str) -> str:
        self.keys.append(key)
        if self.raise_next is not None:
            error, self.raise_next = self.raise_next, None
            raise error
        if self.hang:
            self.hang -= 1
            await asyncio.Event().wait()
        if self.lose:
            self.lose -= 1
            raise ToolOutcomeUnknown("the connection dropped after the request was sent")
        return f"paid with {key}"


def pay_tool(service: Service, policy: ReplayPolicy, reconciler: object = None) -> ToolSpec:
    async def pay(ctx: ToolContext, amount: int) -> str:
        """Move money."""
        assert amount > 0
        return await service.call(ctx.idempotency_key)

    return ToolSpec.from_function(pay, replay_policy=policy, reconcile=reconciler)  # type: ignore[arg-type]


def agent_for(store: VolatileRunStore):  # type: ignore[no-untyped-def]
    return definition(ScriptedModel(SCRIPT), store=store)


def req(spec: ToolSpec, **extra: object):  # type: ignore[no-untyped-def]
    return request("run-1", tools=ToolRegistry([spec]), **extra)


async def executor_settlements(store: VolatileRunStore) -> list[str]:
    log = await store.read_log("run-1")
    assert check_log(log, "run-1") is None, check_log(log, "run-1")
    return [
        s.note
        for s in log.settlements
        if s.source is SettlementSource.EXECUTOR and s.verdict is SettlementVerdict.UNKNOWN
    ]


def test_the_type_lives_in_the_tool_error_family_at_both_addresses() -> None:
    import polyloop.tools

    assert issubclass(ToolOutcomeUnknown, ToolError)
    assert not issubclass(ToolOutcomeUnknown, ToolEnvironmentError)
    assert polyloop.tools.ToolOutcomeUnknown is ToolOutcomeUnknown


@pytest.mark.parametrize("policy", [ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT])
async def test_a_replayable_call_in_doubt_is_tried_again_with_the_same_key(
    policy: ReplayPolicy,
) -> None:
    service, store = Service(lose=1), VolatileRunStore()
    result = await run(agent_for(store), req(pay_tool(service, policy)))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.unknown_outcome is None
    log = await store.read_log("run-1")
    [intent] = [i for i in log.intents if i.kind is IntentKind.ACTION]
    assert service.keys == [intent.idempotency_key] * 2  # one intent, two attempts, one key
    assert log.steps[0].action_outcome.status is ActionStatus.EXECUTED  # type: ignore[union-attr]
    assert log.steps[0].step.observation == f"paid with {intent.idempotency_key}"
    notes = await executor_settlements(store)
    assert notes == ["ToolOutcomeUnknown: the connection dropped after the request was sent"]


async def test_a_call_that_stays_in_doubt_stops_open_and_a_resume_tries_again() -> None:
    service, store = Service(lose=IN_DOUBT_ATTEMPTS), VolatileRunStore()
    agent, request_ = agent_for(store), req(pay_tool(service, ReplayPolicy.SAFE))
    result = await run(agent, request_)
    assert result.stop_reason is StopReason.RETRIES_EXHAUSTED
    assert result.unknown_outcome == "a0"
    assert len(service.keys) == IN_DOUBT_ATTEMPTS
    log = await store.read_log("run-1")
    assert log.finished is None  # left open: resumable
    assert len(await executor_settlements(store)) == IN_DOUBT_ATTEMPTS
    assert plan_resume(log, "run-1").action.value == "replay_last_action"
    resumed = await resume(agent, request_)  # the tool's side is back
    assert resumed.stop_reason is StopReason.FINAL_ANSWER
    assert len(set(service.keys)) == 1
    assert len(service.keys) == IN_DOUBT_ATTEMPTS + 1


async def test_a_retry_that_cannot_reach_the_tool_leaves_the_doubt_standing() -> None:
    service, store = Service(lose=1), VolatileRunStore()

    async def pay(ctx: ToolContext, amount: int) -> str:
        """Move money."""
        if service.keys:
            service.keys.append(ctx.idempotency_key)
            raise ToolEnvironmentError("the payments service is down")
        return await service.call(ctx.idempotency_key)

    spec = ToolSpec.from_function(pay, replay_policy=ReplayPolicy.IDEMPOTENT)
    result = await run(agent_for(store), req(spec))
    assert result.stop_reason is StopReason.RETRIES_EXHAUSTED
    assert result.unknown_outcome == "a0"
    assert len(service.keys) == 2
    assert (await store.read_log("run-1")).finished is None


async def test_a_never_call_in_doubt_stops_open_and_resolve_then_resume_finish_it() -> None:
    service, store = Service(lose=1), VolatileRunStore()
    agent, request_ = agent_for(store), req(pay_tool(service, ReplayPolicy.NEVER))
    result = await run(agent, request_)
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a0"
    assert len(service.keys) == 1
    log = await store.read_log("run-1")
    assert log.finished is None
    assert "the connection dropped" in plan_resume(log, "run-1").detail
    assert await resume(agent, request_) == result  # nothing repeated, nothing settled
    assert len(service.keys) == 1
    await resolve(
        store, "run-1", result_id="a0", executed=True, observation="ledger: paid", by="ops"
    )
    finished = await resume(agent, request_)
    assert finished.stop_reason is StopReason.FINAL_ANSWER
    assert finished.steps[0].observation == "ledger: paid"
    assert len(service.keys) == 1
    assert (await store.read_log("run-1")).steps[0].action_outcome.settled_by == "person:ops"  # type: ignore[union-attr]


async def test_a_never_call_in_doubt_is_settled_by_its_reconciler_in_the_same_run() -> None:
    service, store = Service(lose=1), VolatileRunStore()
    asked: list[str] = []

    async def reconcile(ctx: ToolContext, arguments: object) -> Reconciliation:
        asked.append(ctx.idempotency_key)
        return Reconciliation.executed(f"ledger has {ctx.idempotency_key}")

    result = await run(agent_for(store), req(pay_tool(service, ReplayPolicy.NEVER, reconcile)))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert asked == service.keys  # asked about the very call, by its key
    assert len(service.keys) == 1
    log = await store.read_log("run-1")
    assert log.steps[0].action_outcome.settled_by == "reconciler"  # type: ignore[union-attr]
    assert [s.source for s in log.settlements] == [
        SettlementSource.EXECUTOR,
        SettlementSource.RECONCILER,
    ]
    assert check_log(log, "run-1") is None


async def test_a_never_call_its_reconciler_says_did_not_happen_is_announced_again() -> None:
    service, store = Service(lose=1), VolatileRunStore()

    async def reconcile(ctx: ToolContext, arguments: object) -> Reconciliation:
        return Reconciliation.not_executed()

    result = await run(agent_for(store), req(pay_tool(service, ReplayPolicy.NEVER, reconcile)))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.keys) == 2
    log = await store.read_log("run-1")
    assert [i.result_id for i in log.intents if i.kind is IntentKind.ACTION] == ["a0", "a0"]
    assert check_log(log, "run-1") is None


async def test_a_never_call_its_reconciler_cannot_tell_stays_open() -> None:
    service, store = Service(lose=1), VolatileRunStore()

    async def reconcile(ctx: ToolContext, arguments: object) -> Reconciliation:
        return Reconciliation.unknown("the bank's console is down")

    result = await run(agent_for(store), req(pay_tool(service, ReplayPolicy.NEVER, reconcile)))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a0"
    assert len(service.keys) == 1
    assert (await store.read_log("run-1")).finished is None


async def test_an_action_timeout_on_a_never_tool_leaves_the_run_open_in_doubt() -> None:
    service, store = Service(hang=1), VolatileRunStore()
    agent = agent_for(store)
    request_ = req(pay_tool(service, ReplayPolicy.NEVER), action_timeout_seconds=0.05)
    result = await run(agent, request_)
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome == "a0"
    assert len(service.keys) == 1
    [note] = await executor_settlements(store)
    assert "action_timeout_seconds" in note
    assert (await store.read_log("run-1")).finished is None
    await resolve(store, "run-1", result_id="a0", executed=False, by="ops")
    finished = await resume(agent, request_)
    assert finished.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.keys) == 2


async def test_an_action_timeout_on_a_safe_tool_is_tried_again() -> None:
    service, store = Service(hang=1), VolatileRunStore()
    request_ = req(pay_tool(service, ReplayPolicy.SAFE), action_timeout_seconds=0.05)
    result = await run(agent_for(store), request_)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.keys) == 2
    assert len(set(service.keys)) == 1


@pytest.mark.parametrize("policy", [ReplayPolicy.SAFE, ReplayPolicy.NEVER])
async def test_an_executed_failure_is_still_read_by_the_model_and_never_retried(
    policy: ReplayPolicy,
) -> None:
    service, store = Service(), VolatileRunStore()
    service.raise_next = RuntimeError("card declined")
    result = await run(agent_for(store), req(pay_tool(service, policy)))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.keys) == 1
    assert result.steps[0].action_status is ActionStatus.EXECUTED
    assert result.steps[0].observation == "RuntimeError: card declined"
    assert await executor_settlements(store) == []


async def test_a_broken_environment_still_finishes_the_run_with_env_error() -> None:
    service, store = Service(), VolatileRunStore()
    service.raise_next = ToolEnvironmentError("no network")
    result = await run(agent_for(store), req(pay_tool(service, ReplayPolicy.SAFE)))
    assert result.stop_reason is StopReason.ENV_ERROR
    assert len(service.keys) == 1
    assert (await store.read_log("run-1")).finished is not None


class Died(BaseException):
    """Stands for the process dying inside the tool (nothing in the library catches it)."""


async def test_a_replay_after_a_crash_that_cannot_reach_the_tool_stays_open() -> None:
    """One rule for both sources of doubt: a resume's replay of a crashed ``IDEMPOTENT`` call
    that finds the tool unreachable (``ENV_ERROR``) leaves the run open, not finished."""
    service, store = Service(), VolatileRunStore()
    request_ = req(pay_tool(service, ReplayPolicy.IDEMPOTENT))
    agent = agent_for(store)
    service.raise_next = Died()
    with pytest.raises(Died):
        await run(agent, request_)
    service.raise_next = ToolEnvironmentError("the payments service is down")
    stopped = await resume(agent, request_)
    assert stopped.stop_reason is StopReason.RETRIES_EXHAUSTED
    assert stopped.unknown_outcome == "a0"
    assert (await store.read_log("run-1")).finished is None
    finished = await resume(agent, request_)
    assert finished.stop_reason is StopReason.FINAL_ANSWER
    assert len(set(service.keys)) == 1
    assert len(service.keys) == 3


async def test_a_store_without_settlements_runs_the_same_policy_without_the_record() -> None:
    """A store written against 0.2.0 (no ``write_settlement``): ``SAFE`` is tried again all
    the same; a ``NEVER`` tool's reconciler is not asked (its answer could not be put on
    record first), so the run stops open in doubt."""
    from test_record_table import Store020

    service, store = Service(lose=1), Store020()
    safe = await run(
        definition(ScriptedModel(SCRIPT), store=store), req(pay_tool(service, ReplayPolicy.SAFE))
    )  # type: ignore[arg-type]
    assert safe.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.keys) == 2
    asked: list[str] = []

    async def reconcile(ctx: ToolContext, arguments: object) -> Reconciliation:
        asked.append(ctx.idempotency_key)
        return Reconciliation.executed("paid")

    service, store = Service(lose=1), Store020()
    never = await run(
        definition(ScriptedModel(SCRIPT), store=store),  # type: ignore[arg-type]
        req(pay_tool(service, ReplayPolicy.NEVER, reconcile)),
    )
    assert never.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert asked == []
    assert (await store.read_log("run-1")).finished is None
