"""Ask a person first (issue 22; design 0210): a call that needs approval is a durable pause,
and the decision on it is a record bound to the exact call."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.errors import ParameterDriftError, ResolutionError
from polyloop.session import approve, check_log, plan_resume, reject, resume, run, run_or_resume
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    SettlementSource,
    SettlementVerdict,
    StopReason,
    SyntheticObservations,
)

pytestmark = pytest.mark.unit

SCRIPT = ['tool:refund {"amount": 250}', "final:done"]


class Bank:
    def __init__(self) -> None:
        self.refunds: list[int] = []


def refund_tool(bank: Bank, needs_approval: object = True) -> ToolSpec:
    async def refund(amount: int) -> str:
        """Refund money."""
        bank.refunds.append(amount)
        return f"refunded {amount}"

    return ToolSpec.from_function(refund, needs_approval=needs_approval)  # type: ignore[arg-type]


def refund_request(spec: ToolSpec, run_id: str = "run-1", **extra: object):  # type: ignore[no-untyped-def]
    return request(run_id, tools=ToolRegistry([spec]), **extra)


async def paused(store: object, bank: Bank, **extra: object):  # type: ignore[no-untyped-def]
    spec = refund_tool(bank)
    agent = definition(ScriptedModel(SCRIPT), store=store)
    result = await run(agent, refund_request(spec, **extra))
    return agent, spec, result


async def test_a_call_that_needs_approval_pauses_the_run_executing_nothing() -> None:
    bank = Bank()
    store = VolatileRunStore()
    _, spec, result = await paused(store, bank)
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    pending = result.pending_approval
    assert pending is not None
    assert (pending.tool, pending.arguments, pending.result_id) == (
        "refund",
        '{"amount":250}',
        "a0",
    )
    assert pending.digest.startswith("sha256:")
    assert bank.refunds == []
    log = await store.read_log("run-1")
    assert log.finished is None
    assert [i.kind.value for i in log.intents] == ["model_call"], "no action intent"
    assert check_log(log, "run-1") is None
    model = ScriptedModel(SCRIPT)
    again = await run_or_resume(definition(model, store=store), refund_request(spec))
    assert again.stop_reason is StopReason.AWAITING_APPROVAL
    assert again.pending_approval == pending
    assert model.calls == [], "waiting calls no model"


async def test_an_approved_call_executes_once_and_the_run_goes_on() -> None:
    bank = Bank()
    store = VolatileRunStore()
    _, spec, result = await paused(store, bank)
    assert result.pending_approval is not None
    digest = result.pending_approval.digest
    decision = await approve(store, "run-1", digest=digest, by="alice", note="ok")
    assert decision.verdict is SettlementVerdict.APPROVED
    again = await approve(store, "run-1", digest=digest, by="alice")
    assert again == decision, "the same decision twice is accepted once, then a no-op"
    done = await resume(definition(ScriptedModel(SCRIPT), store=store), refund_request(spec))
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == [250]
    log = await store.read_log("run-1")
    assert check_log(log, "run-1") is None
    assert len(log.settlements) == 1


async def test_a_rejected_call_never_executes_and_the_model_reads_why() -> None:
    bank = Bank()
    store = VolatileRunStore()
    spec = refund_tool(bank)

    def agent(model: ScriptedModel):  # type: ignore[no-untyped-def]
        # The stock texts: their action_rejected has the {reason} placeholder.
        return dataclasses.replace(
            definition(model, store=store), synthetic_observations=SyntheticObservations()
        )

    result = await run(agent(ScriptedModel(SCRIPT)), refund_request(spec))
    assert result.pending_approval is not None
    digest = result.pending_approval.digest
    await reject(store, "run-1", digest=digest, by="bob", reason="over the limit")
    with pytest.raises(ResolutionError) as conflicting:
        await approve(store, "run-1", digest=digest, by="carol")
    assert conflicting.value.reason == "conflicting_decision"
    model = ScriptedModel(SCRIPT)
    done = await resume(agent(model), refund_request(spec))
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == []
    step = done.steps[0]
    assert step.action is None
    assert step.observation == "[not executed] a person rejected this call: over the limit"
    assert "over the limit" in str(model.calls[-1].messages[-1])
    assert check_log(await store.read_log("run-1"), "run-1") is None


async def test_a_decision_binds_to_the_exact_call() -> None:
    bank = Bank()
    store = VolatileRunStore()
    await paused(store, bank)
    with pytest.raises(ResolutionError) as wrong:
        await approve(store, "run-1", digest="sha256:" + "0" * 64, by="alice")
    assert wrong.value.reason == "wrong_digest"
    assert (await store.read_log("run-1")).settlements == ()


async def test_an_expired_request_is_rejected_as_expired_on_resume(tmp_path: object) -> None:
    bank = Bank()
    store = JsonlRunStore(directory=tmp_path)  # type: ignore[arg-type]
    _, spec, result = await paused(store, bank, approval_expires_seconds=0.001)
    assert result.pending_approval is not None
    await asyncio.sleep(0.01)
    with pytest.raises(ResolutionError) as late:
        await approve(store, "run-1", digest=result.pending_approval.digest, by="alice")
    assert late.value.reason == "expired"
    done = await resume(
        definition(ScriptedModel(SCRIPT), store=store),
        refund_request(spec, approval_expires_seconds=0.001),
    )
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == []
    log = await store.read_log("run-1")
    (decision,) = log.settlements
    assert (decision.source, decision.note) == (SettlementSource.EXPIRY, "expired")
    assert check_log(log, "run-1") is None


async def test_a_predicate_decides_per_call_and_a_small_refund_needs_nobody() -> None:
    bank = Bank()

    def large(arguments: Mapping[str, object]) -> bool:
        return int(arguments["amount"]) > 100  # type: ignore[call-overload]

    spec = refund_tool(bank, needs_approval=large)
    store = VolatileRunStore()
    small = ['tool:refund {"amount": 5}', "final:done"]
    result = await run(definition(ScriptedModel(small), store=store), refund_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == [5]
    snapshot = (await store.read_log("run-1")).started.parameter_snapshot  # type: ignore[union-attr]
    assert snapshot["action_executor.tool.refund.needs_approval"].startswith("predicate:")


async def test_changing_the_tool_between_pause_and_resume_is_drift() -> None:
    bank = Bank()
    store = VolatileRunStore()
    await paused(store, bank)
    changed = refund_tool(bank, needs_approval=False)
    with pytest.raises(ParameterDriftError, match="needs_approval"):
        await resume(definition(ScriptedModel(SCRIPT), store=store), refund_request(changed))
    assert plan_resume(await store.read_log("run-1"), "run-1").action.value == "awaiting_approval"


async def test_a_call_with_a_lone_surrogate_in_its_arguments_pauses_and_runs_once_approved(
    tmp_path: object,
) -> None:
    """A model may write ``"\\ud800"`` in its arguments; the log keeps such text (design 0161),
    and so must the digest: the run pauses instead of failing with ``UnicodeEncodeError``."""
    seen: list[str] = []

    async def note(text: str) -> str:
        """Write a note."""
        seen.append(text)
        return "noted"

    spec = ToolSpec.from_function(note, needs_approval=True)
    store = JsonlRunStore(directory=tmp_path)  # type: ignore[arg-type]
    script = ['tool:note {"text": "a\\ud800b"}', "final:done"]
    tools = request("run-1", tools=ToolRegistry([spec]))
    result = await run(definition(ScriptedModel(script), store=store), tools)
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    pending = result.pending_approval
    assert pending is not None
    assert pending.arguments == '{"text":"a\ud800b"}'
    assert (await store.read_log("run-1")).approval_requests == (pending,)
    await approve(store, "run-1", digest=pending.digest, by="alice")
    done = await resume(definition(ScriptedModel(script), store=store), tools)
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert seen == ["a\ud800b"]


async def test_an_approval_of_one_call_never_approves_an_identical_later_call() -> None:
    """A late retry of step 0's approval must not approve step 1's identical call: the digest
    names the run and the call's result id too (found by the property test)."""
    bank = Bank()
    store = VolatileRunStore()
    spec = refund_tool(bank)
    script = ['tool:refund {"amount": 250}', 'tool:refund {"amount": 250}', "final:done"]
    agent = definition(ScriptedModel(script), store=store)
    first = await run(agent, refund_request(spec))
    assert first.pending_approval is not None
    await approve(store, "run-1", digest=first.pending_approval.digest, by="alice")
    second = await resume(definition(ScriptedModel(script), store=store), refund_request(spec))
    assert second.pending_approval is not None
    assert second.pending_approval.digest != first.pending_approval.digest
    with pytest.raises(ResolutionError) as stale:
        await approve(store, "run-1", digest=first.pending_approval.digest, by="alice")
    assert stale.value.reason == "wrong_digest"
    assert bank.refunds == [250]
