"""``python -m polyloop`` (``polyloop.inspect``): show, ls, diff and html on real logs.

The logs are the frozen 0.1.0 fixtures (written by the demo's agent): six finished runs and
three crash prefixes. Every bad-input case must be one line on stderr and exit status 2.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from polyloop.inspect import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK, main, resume_sentence
from polyloop.session import ResumeAction, plan_resume
from polyloop.stores import assemble_log, decode_lines

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-0.1.0"
FINISHED = ("r1-total", "r2-question", "r3-sloppy", "r4-budget", "r5-kill-safe", "r6-kill-never")
UNFINISHED = {
    "u1-dangling-safe-action": ResumeAction.REPLAY_LAST_ACTION,
    "u2-dangling-never-action": ResumeAction.STOP_UNKNOWN,
    "u3-after-model-result": ResumeAction.CONTINUE_AFTER_MODEL_CALL,
}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write_lines(path: Path, payloads: list[dict[str, object]]) -> Path:
    path.write_text(
        "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in payloads), encoding="utf-8"
    )
    return path


def _with_observation(source: Path, target: Path, step_idx: int, text: str) -> Path:
    """A copy of ``source`` whose step ``step_idx`` observed ``text`` (still a valid log)."""
    payloads = _lines(source)
    for payload in payloads:
        if payload["record"] == "step_completed":
            step = payload["step"]
            assert isinstance(step, dict)
            if step["step_idx"] == step_idx:
                step["observation"] = text
                outcome = payload["action_outcome"]
                assert isinstance(outcome, dict)
                outcome["observation"] = text
        if payload["record"] == "run_finished":
            result = payload["result"]
            assert isinstance(result, dict)
            steps = result["steps"]
            assert isinstance(steps, list)
            steps[step_idx]["observation"] = text
    return _write_lines(target, payloads)


def _plan(name: str):  # type: ignore[no-untyped-def]
    raw = (FIXTURES / f"{name}.jsonl").read_bytes()
    records = decode_lines(raw, run_id=name)
    log = assemble_log((r.record for r in records), lines=(r.line for r in records))
    assert log.started is not None
    return plan_resume(log, log.started.run_id)


# --------------------------------------------------------------------------- show


@pytest.mark.parametrize("name", FINISHED)
def test_show_prints_every_step_and_the_stop_reason(name: str) -> None:
    path = FIXTURES / f"{name}.jsonl"
    finish = next(p for p in _lines(path) if p["record"] == "run_finished")
    result = finish["result"]
    assert isinstance(result, dict)
    code, out, err = _run("show", str(path))
    assert (code, err) == (EXIT_OK, "")
    steps = result["steps"]
    assert isinstance(steps, list)
    for step in steps:
        assert f"\nstep {step['step_idx']}  [" in out
    complete = [line for line in out.splitlines() if line.startswith("step ")]
    assert len([line for line in complete if "[incomplete]" not in line]) == len(steps)
    assert f"stop reason: {result['stop_reason']}" in out
    assert "unfinished" not in out


@pytest.mark.parametrize(("name", "action"), UNFINISHED.items())
def test_show_on_an_unfinished_run_says_what_resume_would_do(
    name: str, action: ResumeAction
) -> None:
    plan = _plan(name)
    assert plan.action is action  # the fixture is what its name says
    code, out, _ = _run("show", str(FIXTURES / f"{name}.jsonl"))
    assert code == EXIT_OK
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("unfinished: " + resume_sentence(plan))
    assert "stop reason:" not in out


def test_show_names_the_never_action_that_resume_will_not_repeat() -> None:
    _, out, _ = _run("show", str(FIXTURES / "u2-dangling-never-action.jsonl"))
    assert "resume would stop the run as resume_state_unknown" in out
    assert "step 3  [incomplete]" in out
    assert "the action has an intent (never) but no result" in out


def test_show_cuts_long_texts_unless_full(tmp_path: Path) -> None:
    long_text = "x" * 1000 + "END-OF-OBSERVATION"
    log = _with_observation(FIXTURES / "r1-total.jsonl", tmp_path / "r1-total.jsonl", 1, long_text)
    _, short, _ = _run("show", str(log), "--width", "50")
    assert "END-OF-OBSERVATION" not in short
    assert "[+968 chars; --full shows all]" in short
    _, full, _ = _run("show", str(log), "--full")
    assert long_text in full


def test_show_full_lists_every_snapshot_key() -> None:
    path = FIXTURES / "r1-total.jsonl"
    snapshot = _lines(path)[0]["parameter_snapshot"]
    assert isinstance(snapshot, dict)
    _, brief, _ = _run("show", str(path))
    _, full, _ = _run("show", str(path), "--full")
    assert all(f"  {key} = " in full for key in snapshot)
    assert not all(f"  {key} = " in brief for key in snapshot)
    assert f"snapshot: {len(snapshot)} keys" in brief


def test_show_on_a_directory_needs_a_run_id_and_finds_it_by_file_name() -> None:
    code, _, err = _run("show", str(FIXTURES))
    assert code == EXIT_BAD_INPUT
    assert "holds 9 runs; name one with --run" in err
    code, out, _ = _run("show", str(FIXTURES), "--run", "r2-question")
    assert code == EXIT_OK
    assert out.startswith("run r2-question ")
    code, out, _ = _run("show", f"jsonl://{FIXTURES}", "--run", "u3-after-model-result")
    assert code == EXIT_OK
    assert "unfinished: resume would parse step 1's stored reply" in out


def test_show_notes_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "u3.jsonl"
    log.write_bytes((FIXTURES / "u3-after-model-result.jsonl").read_bytes() + b'{"record": "in')
    code, out, _ = _run("show", str(log))
    assert code == EXIT_OK
    assert "an unterminated last line of 14 bytes is ignored" in out


# --------------------------------------------------------------------------- ls


def test_ls_lists_one_line_per_run_with_its_counts() -> None:
    code, out, err = _run("ls", str(FIXTURES))
    assert (code, err) == (EXIT_OK, "")
    rows = out.splitlines()
    assert rows[0].split() == [
        "run", "stop", "reason", "steps", "actions", "duration", "model", "calls", "in", "doubt",
        "approval", "log",
    ]  # fmt: skip
    assert len(rows) == 1 + len(FINISHED) + len(UNFINISHED)
    r4 = next(row for row in rows if row.startswith("r4-budget "))
    assert r4.split()[:4] == ["r4-budget", "step_budget", "4", "4"]
    u2 = next(row for row in rows if row.startswith("r6-kill-never ") and "unfinished" in row)
    never = [row for row in rows if row.split()[-2] == "a3"]
    assert all(row.split()[-1].startswith(str(FIXTURES)) for row in rows[1:])
    assert never == [u2], "only the run parked at a NEVER action is in doubt"


def test_ls_json_and_filters() -> None:
    code, out, _ = _run("ls", str(FIXTURES), "--json")
    assert code == EXIT_OK
    runs = json.loads(out)
    assert len(runs) == 9
    r2 = next(r for r in runs if r["source"].endswith("r2-question.jsonl"))
    assert r2 | {"duration_ms": 0} == {
        "run_id": "r2-question",
        "status": "final_answer",
        "stop_reason": "final_answer",
        "steps": 2,
        "actions": 1,
        "model_calls": 2,
        "duration_ms": 0,
        "final_answer": "One kiwi costs 0.64.",
        "tokens": {"prompt": 0, "completion": 0, "cached": 0, "steps_without_usage": 2},
        "resume": None,
        "in_doubt": None,
        "awaiting_approval": None,
        "settlements": 0,
        "source": str(FIXTURES / "r2-question.jsonl"),
        "cost": None,  # design 0236: no prices, no cost
    }
    _, out, _ = _run("ls", str(FIXTURES), "--json", "--unfinished")
    unfinished = json.loads(out)
    assert sorted(Path(r["source"]).stem for r in unfinished) == sorted(UNFINISHED)
    assert {r["resume"] for r in unfinished} == {a.value for a in UNFINISHED.values()}
    in_doubt = {Path(r["source"]).stem: r["in_doubt"] for r in unfinished}
    assert in_doubt == {
        "u1-dangling-safe-action": None,
        "u2-dangling-never-action": "a3",
        "u3-after-model-result": None,
    }
    _, out, _ = _run("ls", str(FIXTURES), "--json", "--stop-reason", "task_completed")
    assert sorted(r["run_id"] for r in json.loads(out)) == ["r1-total", "r3-sloppy", "r5-kill-safe"]


def test_ls_lists_the_readable_runs_and_names_the_unreadable_log(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "r1-total.jsonl", tmp_path)
    lines = (FIXTURES / "r2-question.jsonl").read_text(encoding="utf-8").splitlines()
    lines[3] = "{not json"
    (tmp_path / "r2-question.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = _run("ls", str(tmp_path))
    assert code == EXIT_FINDING
    assert "r1-total" in out
    assert "r2-question" not in out
    assert err.count("\n") == 1
    assert "r2-question.jsonl" in err
    assert "line 4" in err


# --------------------------------------------------------------------------- diff


def test_diff_of_a_run_with_itself_finds_nothing() -> None:
    path = str(FIXTURES / "r1-total.jsonl")
    code, out, _ = _run("diff", path, path)
    assert code == EXIT_OK
    assert "the 5 steps agree" in out
    assert "snapshot: identical" in out


def test_diff_names_the_first_diverging_step_and_field(tmp_path: Path) -> None:
    original = FIXTURES / "r1-total.jsonl"
    changed = _with_observation(original, tmp_path / "r1-total.jsonl", 2, "a different world")
    code, out, _ = _run("diff", str(original), str(changed))
    assert code == EXIT_FINDING
    assert "first divergence: step 2, observation" in out
    assert "+: a different world" in out
    assert "snapshot: identical" in out


def test_diff_lists_the_snapshot_keys_that_differ() -> None:
    code, out, _ = _run(
        "diff", str(FIXTURES / "r1-total.jsonl"), str(FIXTURES / "r2-question.jsonl")
    )
    assert code == EXIT_FINDING
    assert "first divergence: step 0, prompt size" in out
    assert "end: task_completed vs final_answer" in out
    assert "changed: request.binding.demo.scenario: 'r1-total' -> 'r2-question'" in out


def test_diff_of_a_prefix_says_where_the_shorter_run_ends() -> None:
    code, out, _ = _run(
        "diff",
        str(FIXTURES / "r5-kill-safe.jsonl"),
        str(FIXTURES / "u1-dangling-safe-action.jsonl"),
    )
    assert code == EXIT_FINDING
    assert "first divergence: step 1, completion" in out
    assert "-: complete (action)" in out
    assert "+: incomplete: the action has an intent (safe) but no result" in out
    assert "end: task_completed vs unfinished" in out


# --------------------------------------------------------------------------- html


def test_html_is_one_self_contained_page_with_every_step(tmp_path: Path) -> None:
    page_path = tmp_path / "runs.html"
    code, out, _ = _run("html", str(FIXTURES), "-o", str(page_path))
    assert code == EXIT_OK
    assert "9 runs" in out
    page = page_path.read_text(encoding="utf-8")
    for needle in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert needle not in page, needle
    for name in FINISHED:
        steps = next(p for p in _lines(FIXTURES / f"{name}.jsonl") if p["record"] == "run_finished")
        result = steps["result"]
        assert isinstance(result, dict)
        section = page.split(f'id="run-{name}"', 1)[1].split("</section>", 1)[0]
        complete = section.count('<li class="step') - section.count('<li class="step incomplete')
        assert complete == len(result["steps"])
        assert f">{result['stop_reason']}</span>" in section
    for name in UNFINISHED:
        section = page.split(f'id="run-{name}"', 1)[1].split("</section>", 1)[0]
        assert '<div class="resume-plan">' in section
        assert resume_sentence(_plan(name)).replace("'", "&#x27;") in section


def test_html_escapes_log_text(tmp_path: Path) -> None:
    hostile = "<script>alert(1)</script><img src=x>"
    log = _with_observation(FIXTURES / "r1-total.jsonl", tmp_path / "r1-total.jsonl", 0, hostile)
    page_path = tmp_path / "page.html"
    assert _run("html", str(log), "-o", str(page_path))[0] == EXIT_OK
    page = page_path.read_text(encoding="utf-8")
    assert hostile not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the page's own script, nothing from the log


# --------------------------------------------------------------------------- bad input


def _bad(*argv: str) -> str:
    code, out, err = _run(*argv)
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", ["show", "ls", "html"])
def test_a_missing_file_is_one_line(command: str, tmp_path: Path) -> None:
    extra = ["-o", str(tmp_path / "x.html")] if command == "html" else []
    err = _bad(command, str(tmp_path / "nope.jsonl"), *extra)
    assert f"{tmp_path / 'nope.jsonl'}: no such file or directory" in err
    assert not (tmp_path / "x.html").exists()


def test_diff_with_a_missing_file_is_one_line(tmp_path: Path) -> None:
    err = _bad("diff", str(FIXTURES / "r1-total.jsonl"), str(tmp_path / "gone.jsonl"))
    assert "gone.jsonl: no such file" in err


def test_a_corrupt_line_is_named(tmp_path: Path) -> None:
    lines = (FIXTURES / "r1-total.jsonl").read_text(encoding="utf-8").splitlines()
    lines[5] = lines[5].replace('"call_index": 1', '"call_index": "one"')
    assert '"one"' in lines[5]
    log = tmp_path / "r1-total.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    err = _bad("show", str(log))
    assert f"{log}: log of run 'r1-total', line 6: Intent.call_index: expected int" in err


def test_a_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    log = tmp_path / "x.jsonl"
    log.write_bytes((FIXTURES / "r2-question.jsonl").read_bytes() + b"\xff\xfe garbage\n")
    err = _bad("show", str(log))
    assert "line 10: not a readable JSON line" in err


@pytest.mark.parametrize("command", ["show", "ls", "html"])
def test_a_directory_without_logs_is_one_line(command: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a log", encoding="utf-8")
    (tmp_path / "x.events.jsonl").write_text("{}\n", encoding="utf-8")
    extra = ["-o", str(tmp_path / "x.html")] if command == "html" else []
    err = _bad(command, str(tmp_path), *extra)
    assert "no run logs (*.jsonl files) in this directory" in err


def test_an_empty_log_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    assert "holds no record" in _bad("show", str(tmp_path / "e.jsonl"))


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("foo://bar", "unknown store URL scheme 'foo'"),
        ("volatile://", "VolatileRunStore keeps its runs in one process's memory"),
        ("jsonl://", "jsonl:// needs a path"),
        ("://x", "has no valid scheme"),
    ],
)
def test_an_unknown_store_url_is_one_line(target: str, expected: str) -> None:
    err = _bad("ls", target)
    assert expected in err
    assert "jsonl://" in err


def test_a_store_url_error_never_echoes_credentials() -> None:
    """A postgres:// URL is read (design 0213); a server that is not there is one line that
    names where it looked, never the password (a port nothing listens on: no network)."""
    err = _bad("ls", "postgresql://alice:s3cret-pw@127.0.0.1:1/runs?password=s3cret-pw")
    assert "s3cret-pw" not in err
    assert "postgresql://alice@127.0.0.1:1/runs: cannot connect" in err or "driver" in err


def test_a_usage_error_is_one_line() -> None:
    err = _bad("ls", str(FIXTURES), "--stop-reason", "bored")
    assert "invalid choice: 'bored'" in err
    err = _bad("show", str(FIXTURES / "r1-total.jsonl"), "--width", "0")
    assert "--width must be a positive number" in err


def test_a_store_url_reads_like_its_path() -> None:
    assert _run("ls", f"jsonl://{FIXTURES}", "--json") == _run("ls", str(FIXTURES), "--json")


# --------------------------------------------------------------------------- verify


def test_verify_passes_the_finished_fixtures() -> None:
    for name in FINISHED:
        code, out, _ = _run("verify", str(FIXTURES / f"{name}.jsonl"))
        assert code == EXIT_OK, out
        assert out.splitlines()[-1] == "verified 1 log: 0 breached"


def test_verify_names_the_file_and_line_of_the_first_breach(tmp_path: Path) -> None:
    lines = (FIXTURES / "r2-question.jsonl").read_text(encoding="utf-8").splitlines()
    log = tmp_path / "r2-question.jsonl"
    log.write_text("\n".join([*lines, lines[-1]]) + "\n", encoding="utf-8")  # two finishes
    code, out, err = _run("verify", str(log))
    assert (code, err) == (EXIT_FINDING, "")
    assert (
        f"BREACH  {log}: line 10: a second RunFinished record (the run finished on line 9)" in out
    )
    assert out.splitlines()[-1] == "verified 1 log: 1 breached"


def test_verify_reports_an_undecodable_line_as_a_breach(tmp_path: Path) -> None:
    lines = (FIXTURES / "r1-total.jsonl").read_text(encoding="utf-8").splitlines()
    lines[5] = "{not json"
    log = tmp_path / "r1-total.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, _ = _run("verify", str(log))
    assert code == EXIT_FINDING
    assert f"BREACH  {log}: line 6: the line does not decode: not a readable JSON line" in out


def test_verify_checks_a_log_as_the_log_of_its_file_name() -> None:
    # The u* fixtures are renamed copies: JsonlRunStore would not find their run under
    # these names, and verify says so on line 1.
    code, out, _ = _run("verify", f"jsonl://{FIXTURES}", "--quiet")
    assert code == EXIT_FINDING
    breaches = [line for line in out.splitlines() if line.startswith("BREACH")]
    assert len(breaches) == len(UNFINISHED)
    assert all(": line 1: a RunStarted record belongs to run " in line for line in breaches)
    assert out.splitlines()[-1] == "verified 9 logs: 3 breached"


def test_verify_accepts_a_crash_prefix_and_an_empty_log(tmp_path: Path) -> None:
    source = (FIXTURES / "r6-kill-never.jsonl").read_bytes().split(b"\n")
    (tmp_path / "r6-kill-never.jsonl").write_bytes(b"\n".join(source[:14]) + b"\n{torn")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    code, out, _ = _run("verify", str(tmp_path))
    assert code == EXIT_OK, out
    assert "(no record: a start that died before its first line)" in out


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("missing.jsonl", "missing.jsonl: no such file or directory"),
        ("foo://x", "unknown store URL scheme 'foo'"),
    ],
)
def test_verify_bad_input_is_one_line(tmp_path: Path, target: str, expected: str) -> None:
    path = target if "://" in target else str(tmp_path / target)
    assert expected in _bad("verify", path)


def test_verify_of_a_directory_without_logs_is_one_line(tmp_path: Path) -> None:
    assert "no run logs" in _bad("verify", str(tmp_path))


# --------------------------------------------------------------------------- newer fields


async def test_show_and_html_render_native_tool_calls_usage_and_timing(tmp_path: Path) -> None:
    from polyloop.stores import JsonlRunStore
    from polyloop.types import (
        ActionOutcome,
        ActionStatus,
        Intent,
        IntentKind,
        ModelCallResult,
        ModelReply,
        NativeToolCall,
        ReplayPolicy,
        RunStarted,
        StepCompleted,
        StepRecord,
        Usage,
    )

    store = JsonlRunStore(directory=tmp_path)
    usage = Usage(prompt_tokens=812, completion_tokens=40, cached_tokens=512)
    call = NativeToolCall(id="call_7", name="lookup", arguments='{"item": "plum"}')
    reply = ModelReply(
        call_id="resp-1", content="", usage=usage, tool_calls=(call,), finish_reason="tool_calls"
    )
    await store.write_run_started(RunStarted(run_id="native", parameter_snapshot={}))
    await store.write_intent(
        Intent(
            run_id="native",
            kind=IntentKind.MODEL_CALL,
            call_index=0,
            result_id="m0",
            replay_policy=ReplayPolicy.SAFE,
        )
    )
    await store.write_model_call_result(
        ModelCallResult(run_id="native", result_id="m0", reply=reply, failure=None, duration_ms=31)
    )
    await store.write_intent(
        Intent(
            run_id="native",
            kind=IntentKind.ACTION,
            call_index=0,
            result_id="a0",
            replay_policy=ReplayPolicy.SAFE,
        )
    )
    outcome = ActionOutcome(
        status=ActionStatus.EXECUTED,
        observation="plum costs 2.42",
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    )
    step = StepRecord(
        step_idx=0,
        raw_output="",
        content_chars=0,
        thinking_chars=0,
        action='lookup {"item": "plum"}',
        parse_ok=True,
        parse_error=None,
        observation="plum costs 2.42",
        observation_is_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=100,
        call_id="resp-1",
        step_wall_ms=40,
        action_status=ActionStatus.EXECUTED,
        usage=usage,
        model_ms=31,
        action_ms=5,
    )
    await store.write_step_completed(
        StepCompleted(run_id="native", result_id="a0", action_outcome=outcome, step=step)
    )
    code, out, _ = _run("show", str(tmp_path / "native.jsonl"))
    assert code == EXIT_OK
    assert 'tool call lookup (id call_7): {"item": "plum"}' in out
    assert "model 31 ms, 812 prompt (512 cached) + 40 completion tokens, finish tool_calls" in out
    assert "action 5 ms" in out
    page = tmp_path / "page.html"
    assert _run("html", str(tmp_path / "native.jsonl"), "-o", str(page))[0] == EXIT_OK
    html = page.read_text(encoding="utf-8")
    assert "native tool call lookup" in html
    assert "id call_7" in html
    assert "812 prompt (512 cached) + 40 completion tokens" in html


def test_show_into_a_closed_pipe_stops_quietly_with_status_141(tmp_path: Path) -> None:
    """``python -m polyloop show RUN.jsonl | head`` whose reader has gone: no traceback, no
    "Exception ignored" line, status 141 (128 + SIGPIPE), as a shell reports it."""
    import os
    import subprocess
    import sys

    log = sorted(FIXTURES.glob("*.jsonl"))[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "polyloop", "show", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert process.stdout is not None
    process.stdout.close()  # the reader goes away before the first line
    _, err = process.communicate(timeout=60)
    assert err.decode() == ""
    assert process.returncode == 141
    whole = subprocess.run(
        [sys.executable, "-m", "polyloop", "show", str(log)],
        capture_output=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert whole.returncode == EXIT_OK
    assert whole.stdout.decode().startswith("run ")
