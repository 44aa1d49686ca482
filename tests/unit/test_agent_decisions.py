"""Deciding from the ``Agent`` (issue 36, point 2; design 0230): ``agent.approve/reject/resolve``
on the runs it made, ``AgentResult.pending_approval`` and ``unknown_outcome`` (with the
idempotency key), and ``summary()`` in every state a person must act on. Offline.

"The process died inside the tool" is staged as in ``test_in_doubt.py``: a handler that does its
effect, then raises a ``BaseException`` nothing in the library catches, so the log ends at
"action intent, no step" exactly as after a kill.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyloop import Agent, tool
from polyloop.agent import CallInDoubt
from polyloop.agent._model import GatewayPlan
from polyloop.errors import EventLoopRunningError, PolyloopValueError, ResolutionError
from polyloop.testing import ScriptedModelClient
from polyloop.types import (
    IntentKind,
    ModelReply,
    NativeToolCall,
    ReplayPolicy,
    SettlementVerdict,
    StopReason,
)

pytestmark = pytest.mark.unit

PROMPT = "Refund order 7."


class Died(BaseException):
    """Stands for the process dying inside the tool."""


class Bank:
    def __init__(self) -> None:
        self.refunds: list[int] = []
        self.die = False


def _call(name: str, arguments: dict[str, object], index: int) -> ModelReply:
    call = NativeToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))
    return ModelReply(call_id=f"r{index}", content="", tool_calls=(call,))


def _agent(bank: Bank, store: Path, **flags: object) -> Agent[str]:
    @tool(**flags)  # type: ignore[call-overload]
    async def refund(amount: int) -> str:
        """Refund money."""
        bank.refunds.append(amount)
        if bank.die:
            bank.die = False
            raise Died
        return f"refunded {amount}"

    script = [_call("refund", {"amount": 250}, 0), "done"]
    model = ScriptedModelClient(script, native_tool_calls=True)
    return Agent(model, tools=[refund], store=store)


async def test_approve_through_the_agent_then_run_again_executes_the_call_once(
    tmp_path: Path,
) -> None:
    bank = Bank()
    first = await _agent(bank, tmp_path, needs_approval=True).run(PROMPT, run_id="r1")
    assert first.stop_reason is StopReason.AWAITING_APPROVAL
    pending = first.pending_approval
    assert pending is not None
    assert (pending.tool, pending.arguments, pending.result_id, pending.expires_at) == (
        "refund",
        '{"amount":250}',
        "a0",
        None,
    )
    assert pending.digest.startswith("sha256:")
    assert bank.refunds == []
    summary = first.summary()
    assert summary.splitlines()[0].startswith(
        'awaiting_approval after 0 steps and 1 tool call: refund({"amount":250}) waits for '
        "a person's approval (step 0, asked at "
    )
    assert "does the server show" not in summary
    assert f"agent.approve_sync('r1', digest='{pending.digest}', by=NAME)" in summary
    assert f"agent.reject_sync('r1', digest='{pending.digest}', by=NAME, reason=TEXT)" in summary

    agent = _agent(bank, tmp_path, needs_approval=True)
    with pytest.raises(ResolutionError) as wrong:
        await agent.approve("r1", digest="sha256:0", by="alice")
    assert wrong.value.reason == "wrong_digest"
    decision = await agent.approve("r1", digest=pending.digest, by="alice", note="ok")
    assert decision.verdict is SettlementVerdict.APPROVED
    done = await agent.run(PROMPT, run_id="r1")
    assert (done.stop_reason, done.output) == (StopReason.FINAL_ANSWER, "done")
    assert bank.refunds == [250]
    assert done.pending_approval is None
    assert done.summary() == (
        "final_answer after 2 steps and 1 tool call (refund approved by alice): done"
    )
    again = await _agent(bank, tmp_path, needs_approval=True).run(PROMPT, run_id="r1")
    assert bank.refunds == [250], "a finished run runs nothing"
    assert again.already_finished


def test_reject_through_the_agent_then_run_again_never_executes_it(tmp_path: Path) -> None:
    bank = Bank()
    agent = _agent(bank, tmp_path, needs_approval=True)
    first = agent.run_sync(PROMPT, run_id="r2")
    assert first.pending_approval is not None
    decision = agent.reject_sync(
        "r2", digest=first.pending_approval.digest, by="bob", reason="over the limit"
    )
    assert decision.verdict is SettlementVerdict.REJECTED
    with pytest.raises(ResolutionError) as conflicting:
        agent.approve_sync("r2", digest=first.pending_approval.digest, by="carol")
    assert conflicting.value.reason == "conflicting_decision"
    done = _agent(bank, tmp_path, needs_approval=True).run_sync(PROMPT, run_id="r2")
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == []
    assert done.summary() == (
        "final_answer after 2 steps and 1 tool call (refund rejected by bob: over the limit): done"
    )


async def test_resolve_through_the_agent_then_run_again_runs_the_call_once(
    tmp_path: Path,
) -> None:
    bank = Bank()
    bank.die = True
    with pytest.raises(Died):
        await _agent(bank, tmp_path).run(PROMPT, run_id="r3")
    assert bank.refunds == [250]
    agent = _agent(bank, tmp_path)
    stuck = await agent.run(PROMPT, run_id="r3")
    assert stuck.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert bank.refunds == [250], "a NEVER call in doubt is never repeated"
    doubt = stuck.unknown_outcome
    assert doubt == CallInDoubt(
        run_id="r3",
        result_id="a0",
        step_idx=0,
        kind=IntentKind.ACTION,
        replay_policy=ReplayPolicy.NEVER,
        idempotency_key="polyloop:r:r3:a0",
        tool="refund",
        arguments='{"amount":250}',
        settleable=True,
    )
    lines = stuck.summary().splitlines()
    assert lines[0] == (
        "resume_state_unknown after 0 steps and 1 tool call: the outcome of "
        'refund({"amount":250}) (step 0, replay never) is unknown; look it up by its '
        "idempotency key polyloop:r:r3:a0 in the tool's own system, then settle it:"
    )
    assert lines[1].endswith(
        "agent.resolve_sync('r3', result_id='a0', executed=True, observation=TEXT, by=NAME)"
    )
    assert lines[2].endswith("agent.resolve_sync('r3', result_id='a0', executed=False, by=NAME)")
    with pytest.raises(ResolutionError) as wrong:
        await agent.resolve("r3", result_id="a1", executed=True, observation="x", by="al")
    assert wrong.value.reason == "wrong_result_id"
    await agent.resolve(
        "r3", result_id=doubt.result_id, executed=True, observation="refunded 250", by="al"
    )
    done = await _agent(bank, tmp_path).run(PROMPT, run_id="r3")
    assert (done.stop_reason, done.output) == (StopReason.FINAL_ANSWER, "done")
    assert bank.refunds == [250], "settled as executed: it never runs again"
    assert done.summary() == (
        "final_answer after 2 steps and 1 tool call (a0 settled as executed by person al): done"
    )


def test_resolved_as_not_executed_the_call_runs_once_with_its_key(tmp_path: Path) -> None:
    bank = Bank()
    bank.die = True
    with pytest.raises(Died):
        _agent(bank, tmp_path).run_sync(PROMPT, run_id="r4")
    agent = _agent(bank, tmp_path)
    stuck = agent.run_sync(PROMPT, run_id="r4")
    assert stuck.unknown_outcome is not None
    bank.refunds.clear()  # the tool's system says it did not happen
    agent.resolve_sync("r4", result_id="a0", executed=False, by="al")
    done = agent.run_sync(PROMPT, run_id="r4")
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == [250]


async def test_a_finished_run_started_again_says_nothing_ran(tmp_path: Path) -> None:
    bank = Bank()
    first = await _agent(bank, tmp_path).run(PROMPT, run_id="r5")
    assert not first.already_finished
    assert first.summary() == "final_answer after 2 steps and 1 tool call: done"
    again = await _agent(bank, tmp_path).run(PROMPT, run_id="r5")
    assert again.already_finished
    assert bank.refunds == [250]
    assert again.summary() == (
        "final_answer after 2 steps and 1 tool call (already finished: this is its stored "
        "result and nothing ran now; a new run_id runs the task again): done"
    )


async def test_deciding_with_a_model_string_opens_no_http_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bank = Bank()
    first = await _agent(bank, tmp_path, needs_approval=True).run(PROMPT, run_id="r6")
    assert first.pending_approval is not None
    opened: list[object] = []
    monkeypatch.setattr(GatewayPlan, "connect", lambda self: opened.append(self))
    agent = Agent("openai:m", base_url="http://127.0.0.1:9/v1", store=tmp_path)
    await agent.approve("r6", digest=first.pending_approval.digest, by="alice")
    with pytest.raises(ResolutionError):
        await agent.resolve("r6", result_id="a0", executed=False, by="alice")
    assert opened == []


async def test_the_sync_decisions_refuse_a_running_loop_and_a_call_in_doubt_validates(
    tmp_path: Path,
) -> None:
    agent = _agent(Bank(), tmp_path)
    with pytest.raises(
        EventLoopRunningError, match=r"Agent\.approve_sync\(\).*await agent\.approve"
    ):
        agent.approve_sync("r", digest="sha256:0", by="alice")
    with pytest.raises(PolyloopValueError, match="CallInDoubt.idempotency_key"):
        CallInDoubt(
            run_id="r",
            result_id="a0",
            step_idx=0,
            kind=IntentKind.ACTION,
            replay_policy=ReplayPolicy.NEVER,
            idempotency_key="has spaces",
            tool=None,
            arguments=None,
            settleable=False,
        )
