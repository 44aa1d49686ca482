"""Where the features of schema 1.9 meet (designs 0227, 0230, 0231, 0234, 0236, 0239, 0240): a
tool call whose outcome the executor cannot tell (``ToolOutcomeUnknown``) seen from a resume's
mark (``resume_stopped`` for ``retries_exhausted``), from ``AgentResult.summary()``, from a fork
of its run (copy, ``check_log``, replay, a fork's first run is no resume, a refusal's advice),
the cost note of a priced fork of an unpriced run, and ``show``/the page (step times in words,
the panels' ``agent.run``). Written by ``Agent`` into a ``JsonlRunStore`` directory, offline.
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from pathlib import Path

import pytest

from polyloop import Agent, tool
from polyloop._recovery import check_log
from polyloop.agent import AgentResult
from polyloop.errors import ForkError, ResolutionError
from polyloop.inspect._html import render_html
from polyloop.inspect._load import load_file
from polyloop.inspect._text import render_show
from polyloop.session import fork, replay, run_fork
from polyloop.stores import JsonlRunStore
from polyloop.testing import RecordFactory, ScriptedModelClient
from polyloop.tools import ToolOutcomeUnknown
from polyloop.types import (
    ModelReply,
    NativeToolCall,
    ReplayPolicy,
    ResumeStopped,
    RunResult,
    SettlementSource,
    StepRecord,
    StopReason,
    Usage,
)

pytestmark = pytest.mark.unit

PROMPT = "Refund order 7."


class Payments:
    """The tool's system: ``lose`` answers are lost (``ToolOutcomeUnknown``); ``calls`` counts
    every call that reached it."""

    def __init__(self, lose: int) -> None:
        self.lose = lose
        self.calls = 0


def _call(index: int) -> ModelReply:
    call = NativeToolCall(id=f"call_{index}", name="refund", arguments=json.dumps({"amount": 5}))
    return ModelReply(call_id=f"r{index}", content="", tool_calls=(call,))


def _agent(payments: Payments, store: Path, policy: ReplayPolicy) -> Agent[str]:
    """A fresh agent (as after a restart) whose ``refund`` loses answers as ``payments`` says."""

    @tool(replay=policy)
    async def refund(amount: int) -> str:
        """Refund money."""
        payments.calls += 1
        if payments.lose:
            payments.lose -= 1
            raise ToolOutcomeUnknown("the connection dropped after the request was sent")
        return f"refunded {amount}"

    model = ScriptedModelClient([_call(0), "done"], native_tool_calls=True)  # by call index
    return Agent(model, tools=[refund], store=store)


async def test_a_resume_that_stops_retries_exhausted_again_is_on_record_and_counted(
    tmp_path: Path,
) -> None:
    payments = Payments(lose=100)
    first = await _agent(payments, tmp_path, ReplayPolicy.SAFE).run(PROMPT, run_id="r")
    assert first.stop_reason is StopReason.RETRIES_EXHAUSTED
    again = await _agent(payments, tmp_path, ReplayPolicy.SAFE).run(PROMPT, run_id="r")
    assert again.stop_reason is StopReason.RETRIES_EXHAUSTED
    log = await JsonlRunStore(directory=tmp_path).read_log("r")
    assert check_log(log, "r") is None
    (stopped,) = [e.record for e in log.entries if isinstance(e.record, ResumeStopped)]
    assert (stopped.stop_reason, stopped.result_id) == (StopReason.RETRIES_EXHAUSTED, "a0")
    assert stopped.resumed is not None
    assert stopped.resumed.plan == "replay_last_action"
    assert isinstance(log.entries[-1].record, ResumeStopped), "after the attempts' settlements"

    text = render_show(load_file(tmp_path / "r.jsonl"), full=False, limit=None)
    assert "1 resume" in text
    assert "stopped again as retries_exhausted" in text
    assert "the action was tried again" in text

    payments.lose = 0  # the tool's side is back: the next run finishes, its mark on the step
    done = await _agent(payments, tmp_path, ReplayPolicy.SAFE).run(PROMPT, run_id="r")
    assert done.stop_reason is StopReason.FINAL_ANSWER
    log = await JsonlRunStore(directory=tmp_path).read_log("r")
    assert check_log(log, "r") is None
    assert sum(isinstance(e.record, ResumeStopped) for e in log.entries) == 1
    text = render_show(load_file(tmp_path / "r.jsonl"), full=False, limit=None)
    assert "2 resumes" in text


async def test_summary_of_retries_exhausted_says_running_again_tries_the_call_again(
    tmp_path: Path,
) -> None:
    payments = Payments(lose=100)
    agent = _agent(payments, tmp_path, ReplayPolicy.IDEMPOTENT)
    result = await agent.run(PROMPT, run_id="r")
    assert result.stop_reason is StopReason.RETRIES_EXHAUSTED
    doubt = result.unknown_outcome
    assert doubt is not None
    assert not doubt.settleable
    text = result.summary()
    assert "finished" not in text, text  # the run is open
    assert doubt.idempotency_key in text
    assert "agent.run_sync(prompt, run_id='r')" in text
    assert "tries the call again with the same idempotency key" in text
    payments.lose = 0
    calls = payments.calls
    done = await _agent(payments, tmp_path, ReplayPolicy.IDEMPOTENT).run(PROMPT, run_id="r")
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert payments.calls == calls + 1


async def test_an_executor_doubt_on_a_never_call_is_in_the_summary_and_resolve_finishes_it(
    tmp_path: Path,
) -> None:
    payments = Payments(lose=1)
    result = await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="r")
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert result.unknown_outcome is not None
    assert result.unknown_outcome.settleable
    assert [s.source for s in result.settlements] == [SettlementSource.EXECUTOR]
    text = result.summary()
    assert "agent.resolve_sync('r', result_id='a0', executed=True" in text
    agent = _agent(payments, tmp_path, ReplayPolicy.NEVER)
    await agent.resolve("r", result_id="a0", executed=True, observation="refunded 5", by="al")
    done = await agent.run(PROMPT, run_id="r")
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert payments.calls == 1, "settled as executed: never called again"


async def test_a_fork_of_a_run_with_a_resume_stop_record_copies_it_out(tmp_path: Path) -> None:
    payments = Payments(lose=1)
    await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="src")
    again = await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="src")
    assert again.stop_reason is StopReason.RESUME_STATE_UNKNOWN  # a resume_stopped record
    agent = _agent(payments, tmp_path, ReplayPolicy.NEVER)
    await agent.resolve("src", result_id="a0", executed=True, observation="refunded 5", by="al")
    assert (await agent.run(PROMPT, run_id="src")).stop_reason is StopReason.FINAL_ANSWER

    store = JsonlRunStore(directory=tmp_path)
    source = await store.read_log("src")
    assert any(isinstance(e.record, ResumeStopped) for e in source.entries)
    origin = await fork(store, "src", at=1, new_run_id="f")
    copy = await store.read_log("f")
    assert check_log(copy, "f") is None
    assert not any(isinstance(e.record, ResumeStopped) for e in copy.entries)
    assert origin.records == len(copy.entries)  # what it says it copied, its start included
    assert [s.source for s in copy.settlements] == [s.source for s in source.settlements]
    assert copy.steps[0].step == source.steps[0].step
    forked = await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="f")
    assert forked.stop_reason is StopReason.FINAL_ANSWER
    assert payments.calls == 1, "the copied step's call is never made again"
    for run_id in ("src", "f"):  # the settled call in doubt and its copy replay the same
        replayed = await replay(agent.definition(), agent.request(PROMPT, run_id))
        assert replayed.same, replayed.describe()

    # A copy cut short (a crash after three lines) is completed from the same prefix.
    await fork(store, "src", at=1, new_run_id="g")
    path = tmp_path / "g.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    cut = await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="g")
    assert cut.stop_reason is StopReason.FINAL_ANSWER
    completed = await store.read_log("g")
    assert check_log(completed, "g") is None
    assert completed.steps[0].step == source.steps[0].step
    assert payments.calls == 1


async def test_show_and_the_page_write_step_times_in_words_and_name_agent_run(
    tmp_path: Path,
) -> None:
    payments = Payments(lose=1)
    await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="r")
    view = load_file(tmp_path / "r.jsonl")
    assert view.in_doubt is not None
    (step,) = view.steps
    slow = dataclasses.replace(step, wall_ms=254_000, model_ms=4_200, action_ms=1_500)
    view = dataclasses.replace(view, steps=(slow,))
    text = render_show(view, full=False, limit=None)
    assert "4 min 14 s" in text
    assert "model 4.2 s" in text
    assert "action 1.5 s" in text
    assert "254000 ms" not in text
    assert "agent.run with the same run_id for a polyloop.Agent" in text
    page = render_html([view])
    assert "4 min 14 s" in page
    assert "model 4.2 s" in page
    assert "action 1.5 s" in page  # the card, the timeline's tooltip and legend
    for raw in ("254000 ms", "4200 ms", "1500 ms"):
        assert raw not in page
    assert "<code>agent.run</code> with the same run id" in page


async def test_a_fork_refused_at_an_idempotent_call_in_doubt_says_to_resume_not_resolve(
    tmp_path: Path,
) -> None:
    payments = Payments(lose=100)
    agent = _agent(payments, tmp_path, ReplayPolicy.IDEMPOTENT)
    assert (await agent.run(PROMPT, run_id="src")).stop_reason is StopReason.RETRIES_EXHAUSTED
    with pytest.raises(ResolutionError) as refused:  # nothing a person can settle
        await agent.resolve("src", result_id="a0", executed=False, by="al")
    assert refused.value.reason == "nothing_in_doubt"
    store = JsonlRunStore(directory=tmp_path)
    with pytest.raises(ForkError) as error:
        await fork(store, "src", at=0, new_run_id="f")
    assert error.value.reason == "in_doubt"
    assert "Resume the source run first" in str(error.value)
    assert "resolve" not in str(error.value)


async def test_a_forks_first_run_is_no_resume_and_a_later_one_is(tmp_path: Path) -> None:
    payments = Payments(lose=0)
    agent = _agent(payments, tmp_path, ReplayPolicy.SAFE)
    await agent.run(PROMPT, run_id="src")
    forked = await run_fork(
        agent.definition(), agent.request(PROMPT, "f"), source_run_id="src", at=1
    )
    assert forked.stop_reason is StopReason.FINAL_ANSWER
    log = await JsonlRunStore(directory=tmp_path).read_log("f")
    assert check_log(log, "f") is None
    assert not any(getattr(e.record, "resumed", None) for e in log.entries)
    view = load_file(tmp_path / "f.jsonl")
    assert view.resumes == ()
    assert "resume" not in render_show(view, full=False, limit=None).split("forked from", 1)[1]

    # Made by `python -m polyloop fork` (the copy alone), its first run is no resume either;
    # one after a process of its own stopped open is.
    never = _agent(payments, tmp_path, ReplayPolicy.NEVER)
    store = JsonlRunStore(directory=tmp_path)
    await fork(
        store,
        "src",
        at=0,
        new_run_id="g",
        definition=never.definition(),
        request=never.request(PROMPT, "g"),
    )
    payments.lose = 1
    first = await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="g")
    assert first.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert load_file(tmp_path / "g.jsonl").resumes == ()
    await _agent(payments, tmp_path, ReplayPolicy.NEVER).run(PROMPT, run_id="g")
    (stopped,) = load_file(tmp_path / "g.jsonl").resumes
    assert stopped.stopped == "resume_state_unknown"
    assert check_log(await store.read_log("g"), "g") is None


def test_summary_of_a_priced_fork_of_an_unpriced_run_says_at_least() -> None:
    def step(idx: int, cost: str | None) -> StepRecord:
        return dataclasses.replace(
            RecordFactory().step(step_idx=idx),
            usage=Usage(prompt_tokens=1, completion_tokens=1),
            cost=None if cost is None else Decimal(cost),
        )

    # Step 0 copied from a run without prices (usage, no cost), step 1 the fork's own.
    result = RunResult(
        run_id="f",
        stop_reason=StopReason.STEP_BUDGET,
        final_answer=None,
        steps=(step(0, None), step(1, "0.0025")),
    )
    text = AgentResult(output=None, result=result, priced=True).summary()
    assert "cost at least 0.0025 (1 step with no cost on record: cost unknown)" in text
    copied_only = dataclasses.replace(result, steps=result.steps[:1])
    text = AgentResult(output=None, result=copied_only, priced=True).summary()
    assert "cost unknown (no step has a cost on record)" in text
