"""The ``resume_stopped`` record (schema 1.9, design 0231): a resume that stops again, waiting,
and writes nothing else leaves its mark on one such record; the record, its codec, its
``check_log`` rule, and a store that cannot take it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_record_table import Store020

from _decided_runs import PROMPT, Decided, decided_agent
from polyloop import Agent, serialization, tool
from polyloop._recovery import check_log, plan_resume
from polyloop.errors import PolyloopValueError
from polyloop.parsers import JsonToolCallParser
from polyloop.stores import JsonlRunStore, assemble_log
from polyloop.testing import ScriptedModelClient
from polyloop.types import RECORDS, ResumeMark, ResumeStopped, StopReason

pytestmark = pytest.mark.unit

MARK = ResumeMark(at="2026-12-02T08:00:00.000+00:00", plan="stop_unknown", step_idx=0, epoch=2)


def test_the_record_carries_a_mark_and_one_of_the_two_open_stops() -> None:
    record = ResumeStopped(
        run_id="r", stop_reason=StopReason.RESUME_STATE_UNKNOWN, result_id="a0", resumed=MARK
    )
    kind = RECORDS.by_class[ResumeStopped]
    assert (kind.tag, kind.barrier, kind.write_method, kind.log_field) == (
        "resume_stopped",
        True,
        None,
        None,
    )
    payload = serialization.encode(record)
    assert payload["schema_version"] == "1.9"
    assert serialization.decode_record(ResumeStopped, payload) == record
    with pytest.raises(PolyloopValueError, match="resumed"):
        ResumeStopped(run_id="r", stop_reason=StopReason.RESUME_STATE_UNKNOWN, result_id="a0")
    with pytest.raises(PolyloopValueError, match="stop_reason"):
        ResumeStopped(run_id="r", stop_reason=StopReason.FINAL_ANSWER, result_id="a0", resumed=MARK)


async def test_a_resume_waiting_again_for_approval_writes_one_and_check_log_pairs_plan_and_stop(
    tmp_path: Path,
) -> None:
    world = Decided()
    first = await decided_agent(world, tmp_path, "w", needs_approval=True).run(PROMPT, run_id="w")
    assert first.pending_approval is not None
    again = await decided_agent(world, tmp_path, "w", needs_approval=True).run(PROMPT, run_id="w")
    assert again.pending_approval == first.pending_approval
    log = await JsonlRunStore(directory=tmp_path).read_log("w")
    (stopped,) = [e.record for e in log.entries if isinstance(e.record, ResumeStopped)]
    assert (stopped.stop_reason, stopped.result_id) == (StopReason.AWAITING_APPROVAL, "a0")
    assert stopped.resumed is not None
    assert stopped.resumed.plan == "awaiting_approval"
    assert check_log(log, "w") is None
    assert plan_resume(log, "w").approval_request == first.pending_approval

    wrong = dataclasses.replace(stopped, resumed=dataclasses.replace(MARK, plan="stop_unknown"))
    entries = [e.record if e.record is not stopped else wrong for e in log.entries]
    breach = check_log(assemble_log(entries), "w")
    assert breach is not None
    assert "reports awaiting_approval but carries a resume mark with plan 'stop_unknown'" in (
        breach.detail
    )

    agent = decided_agent(world, tmp_path, "w", needs_approval=True)
    await agent.approve("w", digest=first.pending_approval.digest, by="alice")
    done = await agent.run(PROMPT, run_id="w")
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert world.refunds == {"w": 1}
    assert check_log(await JsonlRunStore(directory=tmp_path).read_log("w"), "w") is None


@tool
async def send(text: str) -> str:
    """Send a text."""
    raise KeyboardInterrupt  # stands for the process dying inside the tool (never repeated)


def _on(store: Store020) -> Agent[str]:
    model = ScriptedModelClient(['{"tool": "send", "arguments": {"text": "x"}}', "done"])
    return Agent(model, tools=[send], store=store, parser=JsonToolCallParser())


async def test_a_store_without_write_record_keeps_the_18_behaviour() -> None:
    store = Store020()
    with pytest.raises(KeyboardInterrupt):
        await _on(store).run(PROMPT, run_id="s")
    before = await store.read_log("s")
    stuck = await _on(store).run(PROMPT, run_id="s")
    assert stuck.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert stuck.unknown_outcome is not None
    assert (stuck.unknown_outcome.tool, stuck.unknown_outcome.arguments) == ("send", '{"text":"x"}')
    assert await store.read_log("s") == before, "nothing written: it takes no resume_stopped"
