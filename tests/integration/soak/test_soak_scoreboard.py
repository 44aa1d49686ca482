"""The scoreboard: every check breaches on a log that violates it, passes with evidence on a
clean one, says "undetermined" when it cannot judge, and never leaks text into its report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _soak_support import ROOT, edit_json, make_run, read_lines, write_lines
from tools.soak import scoreboard
from tools.soak._verdict import Evidence, Verdict
from tools.soak.scoreboard import CHECK_NAMES, Board, CheckResult, evaluate

pytestmark = pytest.mark.integration

assert ROOT.is_dir()

SENTINEL = "Zq7SentinelXw3"


def _check(board: Board, name: str) -> CheckResult:
    return next(check for check in board.checks if check.name == name)


async def _done(runs: Path, run_id: str = "done") -> None:
    await make_run(runs, run_id, ["look", "finish"])


def _log(runs: Path, run_id: str) -> Path:
    return runs / f"{run_id}.jsonl"


def _edit_record(
    runs: Path, run_id: str, tag: str, nth: int, change: Callable[[dict[str, Any]], None]
) -> None:
    records = read_lines(_log(runs, run_id))
    matching = [r for r in records if r["record"] == tag]
    change(matching[nth])
    write_lines(_log(runs, run_id), records)


# --------------------------------------------------------------------------- clean batch


async def _clean_batch(runs: Path) -> None:
    """Five runs that between them exercise every check."""
    await _done(runs)
    await make_run(runs, "budget", ["a", "b", "c"], max_steps=3)
    await make_run(runs, "answer", ["look", "DONE 42"])
    await make_run(runs, "parse", ["BAD one", "BAD two", "BAD three"])
    await make_run(runs, "llm", ["look", RuntimeError("down")])


async def test_a_clean_batch_passes_every_check_with_evidence(tmp_path: Path) -> None:
    await _clean_batch(tmp_path)
    board = evaluate(tmp_path)
    assert board.verdict is Verdict.PASSED
    assert [c.name for c in board.checks] == list(CHECK_NAMES)
    for check in board.checks:
        assert check.passes, check.name
        assert all(e.describe() for e in check.passes)
    assert _check(board, "completion_has_evidence").not_applicable == 4
    assert (
        "environment reported completion"
        in _check(board, "completion_has_evidence").passes[0].detail
    )
    assert "3 steps = max_steps 3" in _check(board, "step_budget_at_cap").passes[0].detail
    assert {s.stop_reason for s in board.summaries} == {
        "task_completed",
        "step_budget",
        "final_answer",
        "parse_failures",
        "llm_error",
    }


async def test_a_check_that_applies_to_no_run_is_undetermined_not_passed(tmp_path: Path) -> None:
    await _done(tmp_path)
    board = evaluate(tmp_path)
    for name in ("step_budget_at_cap", "final_answer_nonempty"):
        check = _check(board, name)
        assert check.verdict is Verdict.UNDETERMINED, name
        assert check.passes == ()
        assert [(e.run_id, e.detail) for e in check.undetermined] == [
            (None, "not exercised: applies to 0 of the 1 runs")
        ]
        assert check.not_applicable == 1
    assert board.verdict is Verdict.UNDETERMINED  # judged nothing, so not green
    assert _check(board, "completion_has_evidence").verdict is Verdict.PASSED


# --------------------------------------------------------------------------- breaches


def _append_garbage(runs: Path) -> None:
    with _log(runs, "done").open("a") as handle:
        handle.write("{this is not json}\n")


def _renumber_step(runs: Path) -> None:
    _edit_record(runs, "done", "step_completed", 1, lambda r: r["step"].update(step_idx=5))


def _drop_model_result(runs: Path) -> None:
    records = read_lines(_log(runs, "done"))
    first = next(i for i, r in enumerate(records) if r["record"] == "model_call_result")
    write_lines(_log(runs, "done"), records[:first] + records[first + 1 :])


def _drop_intent(runs: Path) -> None:
    records = read_lines(_log(runs, "done"))
    first = next(i for i, r in enumerate(records) if r["record"] == "intent")
    write_lines(_log(runs, "done"), records[:first] + records[first + 1 :])


def _result_differs(runs: Path) -> None:
    edit_json(runs / "done.result.json", stop_reason="step_budget")


def _observation_differs(runs: Path) -> None:
    _edit_record(runs, "done", "step_completed", 0, lambda r: r["step"].update(observation="x"))


def _event_lost(runs: Path) -> None:
    path = runs / "done.events.jsonl"
    write_lines(path, read_lines(path)[:1])


def _sink_count_differs(runs: Path) -> None:
    edit_json(runs / "done.meta.json", sink_failures=1)


def _foreign_record(runs: Path) -> None:
    _edit_record(runs, "done", "intent", 1, lambda r: r.update(run_id="someone-else"))


def _foreign_event(runs: Path) -> None:
    path = runs / "done.events.jsonl"
    events = read_lines(path)
    events[0]["run_id"] = "someone-else"
    write_lines(path, events)


def _completion_without_evidence(runs: Path) -> None:
    _edit_record(
        runs,
        "done",
        "step_completed",
        1,
        lambda r: r["action_outcome"].update(env_reported_completion=False),
    )


def _prompt_shrinks(runs: Path) -> None:
    _edit_record(runs, "done", "step_completed", 1, lambda r: r["step"].update(prompt_chars=1))


@pytest.mark.parametrize(
    ("check", "mutate"),
    [
        ("lines_decode", _append_garbage),
        ("log_consistent", _renumber_step),
        ("log_consistent", _drop_model_result),
        ("log_consistent", _drop_intent),
        ("result_matches_log", _result_differs),
        ("step_outcome_consistent", _observation_differs),
        ("events_match_steps", _event_lost),
        ("sink_failures_match", _sink_count_differs),
        ("log_consistent", _foreign_record),
        ("no_cross_talk", _foreign_event),
        ("completion_has_evidence", _completion_without_evidence),
        ("prompt_chars_monotonic", _prompt_shrinks),
    ],
)
async def test_a_violating_log_is_a_breach_with_evidence(
    tmp_path: Path, check: str, mutate: Callable[[Path], None]
) -> None:
    await _done(tmp_path)
    assert _check(evaluate(tmp_path), check).verdict is Verdict.PASSED
    mutate(tmp_path)
    board = evaluate(tmp_path)
    result = _check(board, check)
    assert result.verdict is Verdict.BREACHED
    assert board.verdict is Verdict.BREACHED
    assert all(e.run_id == "done" and e.detail for e in result.breaches)


async def test_a_step_budget_stop_short_of_the_cap_is_a_breach(tmp_path: Path) -> None:
    await make_run(tmp_path, "budget", ["a", "b", "c"], max_steps=3)
    _edit_record(
        tmp_path,
        "budget",
        "run_started",
        0,
        lambda r: r["parameter_snapshot"].update({"request.max_steps": "4"}),
    )
    breaches = _check(evaluate(tmp_path), "step_budget_at_cap").breaches
    assert [e.detail for e in breaches] == ["stopped on the step budget after 3 steps, max 4"]


async def test_a_blank_final_answer_is_a_breach(tmp_path: Path) -> None:
    await make_run(tmp_path, "answer", ["look", "DONE 42"])
    _edit_record(
        tmp_path, "answer", "run_finished", 0, lambda r: r["result"].update(final_answer="  ")
    )
    assert _check(evaluate(tmp_path), "final_answer_nonempty").verdict is Verdict.BREACHED


async def test_a_completing_tool_counts_as_completion_evidence(tmp_path: Path) -> None:
    await _done(tmp_path)
    _completion_without_evidence(tmp_path)
    _edit_record(
        tmp_path,
        "done",
        "step_completed",
        1,
        lambda r: r["step"].update(action='{"arguments": {}, "tool": "submit_finding"}'),
    )
    assert _check(evaluate(tmp_path), "completion_has_evidence").verdict is Verdict.BREACHED
    board = evaluate(tmp_path, completing_tools={"submit_finding"})
    assert _check(board, "completion_has_evidence").verdict is Verdict.PASSED


# --------------------------------------------------------------------------- undetermined


async def test_what_cannot_be_judged_is_undetermined_never_passed(tmp_path: Path) -> None:
    await make_run(tmp_path, "single", ["finish"])
    board = evaluate(tmp_path)
    prompt = _check(board, "prompt_chars_monotonic")
    assert prompt.verdict is Verdict.UNDETERMINED
    assert "no adjacent pair" in prompt.undetermined[0].detail
    assert board.verdict is Verdict.UNDETERMINED

    await _done(tmp_path)
    (tmp_path / "done.result.json").unlink()
    (tmp_path / "done.meta.json").unlink()
    board = evaluate(tmp_path)
    for name in ("result_matches_log", "sink_failures_match", "events_match_steps"):
        assert any(e.run_id == "done" for e in _check(board, name).undetermined), name


async def test_a_crashed_log_is_judged_by_what_it_holds(tmp_path: Path) -> None:
    await _done(tmp_path)
    records = read_lines(_log(tmp_path, "done"))
    last_intent = max(i for i, r in enumerate(records) if r["record"] == "intent")
    write_lines(_log(tmp_path, "done"), records[: last_intent + 1])
    with _log(tmp_path, "done").open("a") as handle:
        handle.write('{"record": "step_comp')  # a torn write
    board = evaluate(tmp_path)
    assert "unterminated tail of 21 bytes" in _check(board, "lines_decode").passes[0].detail
    assert "is the last record" in _check(board, "log_consistent").passes[0].detail
    assert _check(board, "result_matches_log").verdict is Verdict.UNDETERMINED


async def test_a_process_that_completed_no_step_leaves_the_event_check_undetermined(
    tmp_path: Path,
) -> None:
    await _done(tmp_path)
    edit_json(tmp_path / "done.meta.json", resumed_from_step=2)
    (tmp_path / "done.events.jsonl").unlink()
    check = _check(evaluate(tmp_path), "events_match_steps")
    assert check.verdict is Verdict.UNDETERMINED


@pytest.mark.parametrize(("keep_events", "sink_failures"), [(1, 0), (2, 0), (0, 1)])
async def test_events_from_a_process_that_completed_no_step_are_a_breach(
    tmp_path: Path, keep_events: int, sink_failures: int
) -> None:
    await _done(tmp_path)
    path = tmp_path / "done.events.jsonl"
    write_lines(path, read_lines(path)[:keep_events])
    edit_json(tmp_path / "done.meta.json", resumed_from_step=2, sink_failures=sink_failures)
    check = _check(evaluate(tmp_path), "events_match_steps")
    assert check.verdict is Verdict.BREACHED
    assert [e.run_id for e in check.breaches] == ["done"]
    assert f"{keep_events} events + {sink_failures} failed deliveries" in check.breaches[0].detail
    assert "completed no step" in check.breaches[0].detail


def _unanswered_intent_before_finish(
    runs: Path, run_id: str, *, kind: str, policy: str, stop_reason: str | None = None
) -> None:
    """Insert, right before the finish record, the next step's execution of ``kind`` whose
    intent (with ``policy``) nobody answered, written as the library writes it (an action
    intent comes after its step's model intent and result), and optionally rewrite the
    finish's stop reason (dropping an answer only a final_answer stop carries). A model-call
    policy is set in the snapshot too: check_log holds model intents to it."""
    records = read_lines(_log(runs, run_id))
    finish = records[-1]
    assert finish["record"] == "run_finished"
    step = sum(1 for r in records if r["record"] == "step_completed")
    model_intent = next(r for r in records if r["record"] == "intent" and r["kind"] == "model_call")
    added: list[dict[str, Any]] = []
    if kind == "model_call":
        records[0]["parameter_snapshot"]["request.model_replay_policy"] = policy
        for record in records:
            if record["record"] == "intent" and record["kind"] == "model_call":
                record["replay_policy"] = policy
        added.append({**model_intent, "call_index": step, "result_id": f"m{step}"})
    else:
        action = next(r for r in records if r["record"] == "intent" and r["kind"] == "action")
        result = next(r for r in records if r["record"] == "model_call_result")
        added += [
            {**model_intent, "call_index": step, "result_id": f"m{step}"},
            {**result, "result_id": f"m{step}"},
            {**action, "call_index": step, "result_id": f"a{step}", "replay_policy": policy},
        ]
    if stop_reason is not None:
        finish["result"].update(stop_reason=stop_reason, final_answer=None)
    write_lines(_log(runs, run_id), [*records[:-1], *added, finish])


@pytest.mark.parametrize(
    ("kind", "policy", "stop_reason", "allowed"),
    [
        ("action", "never", None, False),  # final_answer: every execution was answered
        ("model_call", "never", None, False),
        ("action", "never", "step_budget", False),
        ("action", "never", "cancelled", True),
        ("model_call", "safe", "cancelled", True),
        ("action", "never", "resume_state_unknown", True),
        ("model_call", "never", "resume_state_unknown", True),
        ("action", "safe", "resume_state_unknown", False),  # recovery replays a safe intent
        ("model_call", "safe", "resume_state_unknown", False),
    ],
)
async def test_an_unanswered_intent_before_the_finish_needs_a_stop_reason_that_explains_it(
    tmp_path: Path, kind: str, policy: str, stop_reason: str | None, allowed: bool
) -> None:
    await make_run(tmp_path, "answer", ["look", "DONE 42"])
    assert _check(evaluate(tmp_path), "log_consistent").verdict is Verdict.PASSED
    _unanswered_intent_before_finish(
        tmp_path, "answer", kind=kind, policy=policy, stop_reason=stop_reason
    )
    check = _check(evaluate(tmp_path), "log_consistent")
    if allowed:
        assert check.verdict is Verdict.PASSED
        assert "before the finish" in check.passes[0].detail
    else:
        assert check.verdict is Verdict.BREACHED
        (breach,) = check.breaches
        assert breach.run_id == "answer"
        assert breach.where.startswith("line ")
        assert f"unanswered {kind} intent" in breach.detail
        assert policy in breach.detail


# --------------------------------------------------------------------------- reports and exit


async def test_reports_never_contain_foreign_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    await make_run(
        runs,
        "planted",
        [f"{SENTINEL} look", json.dumps({"tool": SENTINEL}), f"BAD {SENTINEL}", f"DONE {SENTINEL}"],
        binding={"note": SENTINEL},
        task_id=SENTINEL,
        phase=SENTINEL,
        scenario=SENTINEL,
        thinking=SENTINEL,
        echo=SENTINEL,
    )
    await make_run(runs, "completed", [json.dumps({"tool": SENTINEL}), "finish"], echo=SENTINEL)
    edit_json(runs / "planted.meta.json", fault=SENTINEL, sink_failures=7)
    edit_json(runs / "planted.result.json", final_answer=SENTINEL * 2)
    write_lines(
        runs / "planted.events.jsonl",
        [{"kind": "step_finished", "run_id": SENTINEL, "step_idx": 0}],
    )
    _edit_record(runs, "planted", "intent", 0, lambda r: r.update(run_id=SENTINEL))
    _edit_record(runs, "planted", "step_completed", 1, lambda r: r["step"].update(prompt_chars=3))
    _edit_record(
        runs,
        "completed",
        "step_completed",
        1,
        lambda r: r["action_outcome"].update(env_reported_completion=False, observation=SENTINEL),
    )
    await make_run(runs, "garbage", ["finish"])
    with _log(runs, "garbage").open("a") as handle:
        handle.write(SENTINEL + "\n")
    report = tmp_path / "report.md"
    code = scoreboard.main(
        ["--runs-dir", str(runs), "--report", str(report), "--completing-tool", SENTINEL]
    )
    printed = capsys.readouterr().out
    assert code == scoreboard.EXIT_BREACHED
    text = report.read_text()
    assert "breach:" in text  # the planted faults were found and described...
    assert SENTINEL not in text  # ...without quoting a byte of what was planted
    assert SENTINEL not in printed
    assert SENTINEL.lower() not in text.lower()


async def test_exit_codes_tell_breach_from_undetermined(tmp_path: Path) -> None:
    def run(path: Path, *extra: str) -> int:
        return scoreboard.main(
            ["--runs-dir", str(path), "--report", str(tmp_path / "r.md"), *extra]
        )

    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(empty) == scoreboard.EXIT_UNDETERMINED  # nothing verified is not green
    assert run(tmp_path / "missing") == scoreboard.EXIT_USAGE
    single = tmp_path / "single"
    await make_run(single, "single", ["finish"])
    assert run(single) == scoreboard.EXIT_UNDETERMINED
    assert run(single, "--allow-undetermined") == scoreboard.EXIT_PASSED
    narrow = tmp_path / "narrow"
    await _done(narrow)  # clean, but never takes the step-budget or final-answer path
    assert run(narrow) == scoreboard.EXIT_UNDETERMINED
    assert run(narrow, "--allow-undetermined") == scoreboard.EXIT_PASSED
    clean = tmp_path / "clean"
    await _clean_batch(clean)
    assert run(clean) == scoreboard.EXIT_PASSED
    _append_garbage(clean)
    assert run(clean, "--allow-undetermined") == scoreboard.EXIT_BREACHED


def test_evidence_and_results_refuse_to_be_empty_or_foreign() -> None:
    with pytest.raises(ValueError, match="length"):
        Evidence(run_id="not a run id!", where="", detail="x")
    with pytest.raises(ValueError, match="empty evidence"):
        Evidence(run_id="r", where="", detail=" ")
    with pytest.raises(ValueError, match="no evidence"):
        CheckResult(name="x", passes=(), breaches=(), undetermined=())


async def test_the_report_links_every_run_to_its_view_in_the_html_viewer(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    await _clean_batch(runs)
    report, page = tmp_path / "out" / "scoreboard.md", tmp_path / "out" / "runs.html"
    code = scoreboard.main(["--runs-dir", str(runs), "--report", str(report), "--html", str(page)])
    assert code == scoreboard.EXIT_PASSED
    html = page.read_text(encoding="utf-8")
    text = report.read_text(encoding="utf-8")
    assert "## Per-run views" in text
    for run_id in ("done", "budget", "answer", "parse", "llm"):
        assert f"| [view](runs.html#run-{run_id}) |" in text
        assert f'id="run-{run_id}"' in html
    assert f"python -m polyloop show {runs}/<run_id>.jsonl" in text
