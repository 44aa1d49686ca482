"""Issue 26 item 6 (design 0215): the log keeps the run's context and marks each resume, and the
viewer shows what a person looks for first.

Schema 1.8 adds ``RunStarted.context`` (unless ``RunRequest.record_context=False``) and the
``resumed`` mark on the first intent of a resume; ``check_log`` checks the mark. The ``html``
page puts the final answer or the resume plan on top, then the question and instructions,
then a timeline of the steps, then the cards, folding runs of near-identical steps; an anchor
shows its run alone; a tool-call-only reply has no empty "reply" row. ``show`` prints the
context and the resume marks, and ``ls`` heads its stop-reason column "stop reason".
"""

from __future__ import annotations

import dataclasses
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from _viewer_runs import CRASH_STEP, QUESTION, STEPS, SURVEY_RUN, survey_agent, write_survey_run
from polyloop import serialization
from polyloop._recovery import check_log
from polyloop.errors import PolyloopTypeError
from polyloop.inspect import main
from polyloop.inspect._html import render_html
from polyloop.inspect._load import load_file
from polyloop.inspect._overview import FOLD_MIN, fold_groups
from polyloop.inspect._text import render_show
from polyloop.inspect._view import view_run
from polyloop.parsers import JsonToolCallParser
from polyloop.ports import RunLog
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Context,
    Intent,
    IntentKind,
    Message,
    ModelCallResult,
    ReplayPolicy,
    ResumeMark,
    RunFinished,
    RunStarted,
    StepCompleted,
)

pytestmark = pytest.mark.unit

FIXTURES_17 = Path(__file__).resolve().parents[1] / "fixtures" / "logs-1.7"


@pytest.fixture(scope="module")
def survey(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    directory = tmp_path_factory.mktemp("survey")
    return asyncio.run(write_survey_run(directory))


# --------------------------------------------------------------------------- the records


def _intent(**changes: object) -> Intent:
    fields: dict[str, object] = {
        "run_id": "r1",
        "kind": IntentKind.MODEL_CALL,
        "call_index": 3,
        "result_id": "m3",
        "replay_policy": ReplayPolicy.SAFE,
    }
    fields.update(changes)
    return Intent(**fields)  # type: ignore[arg-type]


def test_the_context_and_the_resume_mark_round_trip_and_old_payloads_read_as_none() -> None:
    context = Context(
        run_level=(Message.system("be brief"),), goal_level=(Message.user("What is 2+3?"),)
    )
    started = RunStarted(run_id="r1", parameter_snapshot={"k": "v"}, context=context)
    payload = serialization.encode(started)
    assert payload["context"] == {
        "run_level": [
            {"role": "system", "content": [{"text": "be brief"}], "tool_calls": [],
             "tool_call_id": None}
        ],
        "goal_level": [
            {"role": "user", "content": [{"text": "What is 2+3?"}], "tool_calls": [],
             "tool_call_id": None}
        ],
    }  # fmt: skip
    assert serialization.decode_run_started(payload) == started
    old = {k: v for k, v in payload.items() if k != "context"} | {"schema_version": "1.7"}
    assert serialization.decode_run_started(old).context is None

    mark = ResumeMark(at="2026-12-01T10:00:00.000+00:00", plan="continue", step_idx=3, epoch=2)
    intent = _intent(resumed=mark)
    encoded = serialization.encode(intent)
    assert encoded["resumed"] == {
        "at": "2026-12-01T10:00:00.000+00:00", "plan": "continue", "step_idx": 3, "epoch": 2
    }  # fmt: skip
    assert serialization.decode_intent(encoded).resumed == mark
    # Every other intent is written exactly as before 1.8 (no per-step bytes added).
    assert "resumed" not in serialization.encode(_intent())
    # The mark is about the process, not the execution: it takes no part in equality.
    assert intent == _intent()


def test_a_bad_resume_mark_or_context_is_a_decode_error_naming_the_field() -> None:
    encoded = serialization.encode(_intent()) | {"resumed": {"at": "t", "plan": "continue"}}
    with pytest.raises(serialization.DecodeError, match=r"^Intent\.resumed\.step_idx: expected"):
        serialization.decode_intent(encoded)
    started = serialization.encode(RunStarted(run_id="r1", parameter_snapshot={}))
    started["context"] = {"run_level": [{"role": "boss", "content": []}], "goal_level": []}
    with pytest.raises(serialization.DecodeError, match=r"RunStarted\.context\.run_level\[0\]"):
        serialization.decode_run_started(started)


def _request(**changes: object) -> RunRequest:
    async def echo(text: str) -> str:
        """Echo the text."""
        return text

    fields: dict[str, object] = {
        "run_id": "ctx-1",
        "context": Context(
            run_level=(Message.system("You echo."),), goal_level=(Message.user("Say hi"),)
        ),
        "tools": ToolRegistry([ToolSpec.from_function(echo, replay_policy=ReplayPolicy.SAFE)]),
        "model_replay_policy": ReplayPolicy.SAFE,
    }
    fields.update(changes)
    return RunRequest(**fields)  # type: ignore[arg-type]


async def _run_once(request: RunRequest) -> RunStarted:
    store = VolatileRunStore()
    agent = AgentDefinition(
        model_client=ScriptedModelClient(['{"final_answer": "hi"}']),
        decision_parser=JsonToolCallParser(),
        store=store,
    )
    await run(agent, request)
    started = (await store.read_log(request.run_id)).started
    assert started is not None
    return started


async def test_a_run_records_its_context_unless_told_not_to_and_the_setting_is_no_drift() -> None:
    kept = await _run_once(_request())
    assert kept.context == _request().context
    withheld = await _run_once(_request(record_context=False))
    assert withheld.context is None
    # The setting changes what the log keeps, not what the run does: not in the snapshot, so
    # a run started with one setting resumes with the other.
    assert kept.parameter_snapshot == withheld.parameter_snapshot
    with pytest.raises(PolyloopTypeError, match="record_context"):
        _request(record_context="no")


@pytest.fixture(scope="module")
def last_call_survey(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The survey run killed during its LAST model call (the final answer's), then resumed."""
    import asyncio

    directory = tmp_path_factory.mktemp("survey-last")
    return asyncio.run(write_survey_run(directory, crash_step=STEPS - 1))


def _marked(log: RunLog) -> list[tuple[int, object]]:
    return [(e.line, e.record) for e in log.entries if getattr(e.record, "resumed", None)]


async def test_a_resume_marks_its_first_record_with_its_plan_step_and_lease_epoch(
    survey: Path,
) -> None:
    log = await JsonlRunStore(directory=survey.parent).read_log(SURVEY_RUN)
    marked = _marked(log)
    assert len(marked) == 1
    ((_, record),) = marked
    # Killed inside step 14's model call: the resume redoes that call under the intent on
    # record (no new intent), so its first record is that call's result; the start held
    # epoch 1.
    assert isinstance(record, ModelCallResult)
    assert record.resumed is not None
    assert (record.result_id, record.resumed.plan, record.resumed.step_idx) == (
        f"m{CRASH_STEP}",
        "redo_model_call",
        CRASH_STEP,
    )
    assert record.resumed.epoch == 2
    assert all(intent.resumed is None for intent in log.intents)
    assert check_log(log, SURVEY_RUN) is None


async def test_a_resume_that_writes_no_intent_still_leaves_its_mark(
    last_call_survey: Path,
) -> None:
    # Killed in the last model call: the resume writes the call's result, the final step and
    # the finish, no intent at all (issue 26's review, defect 1). The mark rides on the result.
    log = await JsonlRunStore(directory=last_call_survey.parent).read_log(SURVEY_RUN)
    marked = _marked(log)
    assert len(marked) == 1
    ((line, record),) = marked
    assert isinstance(record, ModelCallResult)
    assert record.result_id == f"m{STEPS - 1}"
    assert record.resumed is not None
    assert (record.resumed.plan, record.resumed.step_idx) == ("redo_model_call", STEPS - 1)
    assert check_log(log, SURVEY_RUN) is None
    view = load_file(last_call_survey)
    assert [(r.line, r.step_idx, r.carrier) for r in view.resumes] == [
        (line, STEPS - 1, f"model call result m{STEPS - 1}")
    ]
    assert view.steps[-1].resumed is not None
    shown = _cli("show", str(last_call_survey))
    assert re.search(r"^  resumed at \S+ \(lease epoch 2\): redo model call", shown, re.M)
    assert f"mark on model call result m{STEPS - 1}, line {line}" in shown
    assert "1 resume\n" in shown
    page = render_html([load_file(last_call_survey)])
    assert "1 resume " in page
    assert "0 resumes" not in page
    assert len(_outline(page).classed("resume-mark")) >= 1


@pytest.mark.parametrize(
    ("max_steps", "dropped", "carrier", "plan"),
    [
        # the last stored step is the final answer; only the finish is missing
        (40, 1, RunFinished, "continue"),
        # the final answer's reply is stored, its step record and the finish are not
        (40, 2, StepCompleted, "continue"),
        # the step budget ends the run after step 22's action; that action is replayed
        (STEPS - 1, 2, StepCompleted, "replay_last_action"),
    ],
    ids=["only-the-finish", "stored-final-answer", "last-action-replayed"],
)
async def test_a_resume_that_writes_no_intent_marks_the_first_record_it_writes(
    tmp_path: Path, max_steps: int, dropped: int, carrier: type, plan: str
) -> None:
    agent, request = survey_agent(tmp_path, max_steps=max_steps)
    await run(agent, request)
    path = tmp_path / f"{SURVEY_RUN}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-dropped]))  # the kill: the last records never landed
    agent, request = survey_agent(tmp_path, max_steps=max_steps)
    await resume(agent, request)
    log = await JsonlRunStore(directory=tmp_path).read_log(SURVEY_RUN)
    marked = _marked(log)
    assert [type(record) for _, record in marked] == [carrier]
    ((line, record),) = marked
    assert line == len(lines) - dropped + 1  # the first line the resume wrote
    mark = getattr(record, "resumed", None)
    assert isinstance(mark, ResumeMark)
    assert mark.plan.startswith(plan)
    assert check_log(log, SURVEY_RUN) is None
    view = load_file(path)
    assert [r.line for r in view.resumes] == [line]
    shown = _cli("show", str(path))
    assert "1 resume\n" in shown
    # Shown in words, on its step's card or (a resume that only finished) after the steps.
    assert re.search(rf"^  resumed at \S+ \(lease epoch 2\): .*, line {line}\)$", shown, re.M)
    marks = _outline(render_html([view])).classed("resume-mark")
    assert [mark["data-line"] for mark in marks if "data-line" in mark] == [str(line)]


def test_check_log_refuses_a_mark_that_no_resume_could_have_written() -> None:
    from polyloop.ports import LogEntry

    def log_with(mark: ResumeMark) -> RunLog:
        started = RunStarted(run_id="r1", parameter_snapshot={})
        intent = _intent(call_index=0, result_id="m0", resumed=mark)
        return RunLog(
            started=started,
            intents=(intent,),
            entries=(LogEntry(line=1, record=started), LogEntry(line=2, record=intent)),
        )

    at = "2026-12-01T10:00:00.000+00:00"
    breach = check_log(log_with(ResumeMark(at=at, plan="stop_unknown", step_idx=0)), "r1")
    assert breach is not None
    assert "plan 'stop_unknown', which never writes one" in breach.detail
    breach = check_log(log_with(ResumeMark(at=at, plan="continue", step_idx=4)), "r1")
    assert breach is not None
    assert "entered at step 4, after its own step 0" in breach.detail
    assert check_log(log_with(ResumeMark(at=at, plan="continue", step_idx=0)), "r1") is None


# --------------------------------------------------------------------------- the page


class _Outline(HTMLParser):
    """The page's elements as ``(tag, attributes)`` in document order, plus the text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def classed(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if name in a.get("class", "").split()]

    def first(self, name: str) -> int:
        return next(
            i for i, (_, a) in enumerate(self.elements) if name in a.get("class", "").split()
        )


def _outline(page: str) -> _Outline:
    outline = _Outline()
    outline.feed(page)
    return outline


def test_the_page_reads_from_the_top_answer_context_timeline_then_folded_cards(
    survey: Path,
) -> None:
    view = load_file(survey)
    page = render_html([view])
    outline = _outline(page)
    order = [outline.first(c) for c in ("final-answer", "context", "run-timeline", "timeline")]
    assert order == sorted(order), "answer, context, timeline, then the step cards"
    text = "".join(outline.text)
    assert QUESTION in text
    assert [a["data-level"] for a in outline.classed("context-part")] == ["goal", "run"]
    steps = outline.classed("step")
    assert [int(a["data-step"]) for a in steps] == list(range(STEPS)), "each step once, in order"
    assert len({a["id"] for a in steps}) == STEPS
    folds = outline.classed("fold")
    assert folds, "the near-identical lookups are folded"
    assert all(int(f["data-last"]) - int(f["data-first"]) + 2 >= FOLD_MIN for f in folds)
    marks = outline.classed("resume-mark")
    div = [m for m in marks if "data-plan" in m]
    assert [(m["data-plan"], m["data-epoch"]) for m in div] == [("redo_model_call", "2")]
    assert [a["data-step"] for a in outline.classed("resumed")] == [str(CRASH_STEP)]
    columns = outline.classed("step-col")
    assert len(columns) == STEPS
    assert all(c["href"] == f"#run-{SURVEY_RUN}-step-{c['data-step']}" for c in columns)
    assert [c["data-step"] for c in outline.classed("failed")] == ["5"]
    # No step whose reply only called tools shows an empty reply row.
    assert "reply (0 chars)" not in page
    # Still one self-contained file: nothing is referenced outside the page.
    assert not re.search(r"""(src|href)=["'](?!#)""", page)
    assert "http" not in page.lower().replace("http-equiv", "")


def test_a_folded_group_never_hides_a_resume_a_failure_or_the_answer(survey: Path) -> None:
    view = load_file(survey)
    for group in fold_groups(view.steps):
        if len(group) > 1:
            assert len(group) >= FOLD_MIN
            assert all(s.resumed is None and s.kind.value == "action" for s in group)
            assert all(s.action_status == "executed" for s in group)
    steps = [len(g) for g in fold_groups(view.steps)]
    assert sum(steps) == STEPS


def test_a_log_without_context_or_marks_says_so(tmp_path: Path) -> None:
    views = [load_file(path) for path in sorted(FIXTURES_17.glob("*.jsonl"))]
    assert all(v.context is None and v.resumes == () for v in views)
    page = render_html(views)
    outline = _outline(page)
    assert len(outline.classed("absent")) == len(views)
    assert "record_context=False" in page
    assert not outline.classed("resume-mark")
    # An unfinished run's plan comes before its cards, right under its heading.
    unfinished = page.index('<section class="run" id="run-r6-kill-never"')
    assert page.index('class="resume-plan"', unfinished) < page.index(
        'class="timeline"', unfinished
    )


def test_an_anchor_shows_its_run_alone_and_the_script_opens_folds_around_a_step() -> None:
    page = render_html([load_file(path) for path in sorted(FIXTURES_17.glob("*.jsonl"))])
    assert "section.run:not(:target):not(:has(:target))" in page
    assert 'class="all-runs" href="#"' in page
    assert "revealTarget" in page
    assert 'addEventListener("hashchange"' in page


# --------------------------------------------------------------------------- show and ls


def _cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert main(list(argv), out=out, err=err) == 0, err.getvalue()
    return out.getvalue()


def test_show_prints_the_context_and_each_resume_and_ls_heads_the_stop_reason(
    survey: Path,
) -> None:
    shown = _cli("show", str(survey))
    assert f"question [user]: {QUESTION}" in shown
    assert "instructions [system]: You compare prices." in shown
    assert re.search(r"^  resumed at \S+ \(lease epoch 2\): redo model call", shown, re.M)
    assert "1 resume\n" in shown
    assert "    reply: \n" not in shown
    header = _cli("ls", str(survey)).splitlines()[0]
    assert header.split()[:3] == ["run", "stop", "reason"]
    old = _cli("show", str(FIXTURES_17 / "r5-kill-safe.jsonl"))
    assert "context: not on record (record_context=False, or a log older than schema 1.8)" in old


def test_a_resume_view_in_words_names_its_time_epoch_and_plan() -> None:
    from polyloop.inspect._view import ResumeView

    view = ResumeView(line=9, result_id="m3", carrier="intent m3", step_idx=3,
                      plan="replay_last_action",
                      at="2026-12-01T10:00:00.000+00:00", epoch=None)  # fmt: skip
    assert view.words == "resumed at 2026-12-01T10:00:00.000+00:00: replay last action"
    assert "lease epoch 4" in dataclasses.replace(view, epoch=4).words


def test_the_context_and_the_mark_cannot_inject_markup_or_control_characters(
    tmp_path: Path,
) -> None:
    from polyloop.ports import LogEntry

    hostile = "<script>alert(1)</script>\x1b[2J\u202e"
    started = RunStarted(
        run_id="r1",
        parameter_snapshot={},
        context=Context(goal_level=(Message.user(hostile),), run_level=(Message.system(hostile),)),
    )
    mark = ResumeMark(at=hostile, plan="continue", step_idx=0, epoch=None)
    intent = _intent(call_index=0, result_id="m0", resumed=mark)
    view = view_run(
        "r1", "r1.jsonl", [LogEntry(line=1, record=started), LogEntry(line=2, record=intent)]
    )
    page = render_html([view])
    assert "<script>alert" not in page
    assert "\x1b" not in page
    assert "\u202e" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[2J\\u202e" in page
    assert "\x1b" not in render_show(view, full=True, limit=None)
