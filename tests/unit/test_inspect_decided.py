"""``show`` and the HTML page on runs a person decided on (issue 36 point 4, design 0231): a
rejected call is shown as rejected with the reason the model read (it was shown as a final
answer), a settlement as a settlement, and a resume that stopped again in doubt is counted and
described (it left no trace before schema 1.9). The runs are written by ``Agent``
(``tests/_decided_runs.py``); the browser test checks the same page in Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _decided_runs import REASON, write_decided_runs
from polyloop._recovery import check_log
from polyloop.inspect._html import render_html
from polyloop.inspect._load import load_file
from polyloop.inspect._text import render_show
from polyloop.inspect._view import StepKind
from polyloop.stores import JsonlRunStore
from polyloop.types import ResumeStopped

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    directory = tmp_path_factory.mktemp("decided")
    world = asyncio.run(write_decided_runs(directory))
    assert world.refunds == {"settled": 1, "doubt": 1}, "rejected: never; settled: once"
    return directory


def _show(runs: Path, run_id: str) -> str:
    return render_show(load_file(runs / f"{run_id}.jsonl"), full=False, limit=None)


def test_a_rejected_call_is_shown_as_rejected_with_the_reason(runs: Path) -> None:
    view = load_file(runs / "rejected.jsonl")
    assert [step.kind for step in view.steps] == [StepKind.REJECTED, StepKind.FINAL_ANSWER]
    rejected = view.steps[0]
    assert rejected.observation is not None
    assert f"a person rejected this call: {REASON}" in rejected.observation
    text = _show(runs, "rejected")
    assert "step 0  [rejected]" in text
    assert "[final_answer]" not in text.split("step 1", 1)[0]
    assert text.count("decision: final answer") == 1  # step 1's, not the rejected call's
    assert "decision: the call was rejected and never executed" in text
    assert f"observation (synthetic): [not executed] a person rejected this call: {REASON}" in text
    page = render_html([view])
    card = re.search(r'<li class="step rejected[^"]*" data-step="0".*?</li>', page, re.DOTALL)
    assert card is not None
    assert '<span class="badge kind">rejected</span>' in card[0]
    assert "class='rejected-call'" in card[0]
    assert f"a person rejected this call: {REASON}" in card[0]
    assert "final answer" not in card[0]
    assert page.count("decision: <b>final answer</b>") == 1


def test_a_settlement_is_shown_as_a_settlement(runs: Path) -> None:
    text = _show(runs, "settled")
    assert re.search(r"settlement of a0 \(line \d+\): executed, by person 'al' at ", text)
    assert "      observation: refunded 250" in text
    assert "    status: executed, settled by person:al" in text
    page = render_html([load_file(runs / "settled.jsonl")])
    assert re.search(r'<div class="settlement" data-verdict="executed" data-source="person"', page)
    assert '<span class="badge settled">settled by person:al</span>' in page


def test_a_resume_that_stopped_again_in_doubt_is_visible(runs: Path) -> None:
    view = load_file(runs / "doubt.jsonl")
    assert view.stop_reason is None
    assert view.in_doubt is not None
    assert [(r.plan, r.stopped, r.step_idx, r.carrier) for r in view.resumes] == [
        ("stop_unknown", "resume_state_unknown", 0, "resume stop record (waiting on a0)")
    ]
    assert view.steps[0].resumed == view.resumes[0]
    text = _show(runs, "doubt")
    assert "1 resume" in text
    assert "stopped again as resume_state_unknown (an action in doubt that nothing settled)" in text
    page = render_html([view])
    assert '<div class="resume-mark" data-plan="stop_unknown"' in page
    assert " 1 resume" in page


async def test_the_resume_stopped_record_is_on_the_log_once_per_resume(runs: Path) -> None:
    log = await JsonlRunStore(directory=runs).read_log("doubt")
    stopped = [e.record for e in log.entries if isinstance(e.record, ResumeStopped)]
    assert len(stopped) == 1
    assert check_log(log, "doubt") is None
    # The settled run's parked resume left one too, before the settlement.
    settled = await JsonlRunStore(directory=runs).read_log("settled")
    kinds = [type(e.record).__name__ for e in settled.entries]
    assert kinds.index("ResumeStopped") < kinds.index("Settlement")
    assert check_log(settled, "settled") is None
