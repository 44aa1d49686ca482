"""What a person reads cannot be forged (issue 22, item 6; design 0180, amended).

A log whose texts hold terminal escape sequences and control characters, printed by every
command of ``python -m polyloop`` (``show``, ``ls``, ``ls --json``, ``diff``, ``verify``,
``resolve``'s success and refusal lines, ``html``'s page and its line, the error lines), must
reach the terminal with no raw ESC, CR or other C0/C1 control character but the newlines of
the layout, and no bidi or other invisible format character; the texts show as escapes
(``\\x1b[2J``), and a text's own newlines cannot start a line of the layout.

The hostile logs are real ``JsonlRunStore`` files written record by record (so every record
type and text field carries the attack), plus a copy of a 0.1.0 fixture whose run id is
hostile (``JsonlRunStore`` only writes safe run ids, but a hand-made file can claim any), and
a log whose file name is hostile. ``_raw_controls`` is the test's own list of what must not
be printed, written out by range, independent of ``polyloop.inspect._safe``.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from polyloop.inspect import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK, load_target, main
from polyloop.inspect._safe import (
    VisibleStream,
    count_hidden,
    escape,
    is_hidden,
    visible,
    visible_json,
)
from polyloop.inspect._text import diff_runs, ls_json, ls_lines, render_diff, render_show
from polyloop.inspect._verify import verify_target
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
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepCompleted,
    StepRecord,
    StopReason,
    Usage,
)

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-0.1.0"

ATTACK = "\x1b[2J" + "\x1b]0;pwned\x07" + "\r" + "\x00" + "\x9b" + "\u202e" + "\x08"
"""The issue's list: clear screen, OSC window title, carriage return, NUL, CSI (C1), RLO, BS."""
EXTRA = "\x7f\x85\u2028\u2066\u200b\ufeff\U000e0041\ud800\t"
"""DEL, NEL, LINE SEPARATOR, LRI, ZWSP, BOM, a tag character, a lone surrogate, a tab."""
HOSTILE = f"ok{ATTACK}forged{EXTRA}end"
FORGED = ("step 9  [final_answer]  lines 99", "stop reason: step_budget", "unfinished: none")
"""Lines of the layout that a text spells on lines of its own."""
MULTI = HOSTILE + "\n" + "\n".join(FORGED) + "\n\n" + HOSTILE
RUN = "run-1"
IN_A_NAME = ATTACK.replace("\x00", "")
"""The attack as a file name can hold it (no NUL)."""
HOSTILE_FILE = f"x{IN_A_NAME}.jsonl"


def _raw_controls(text: str) -> list[str]:
    """Every character of ``text`` that a terminal or a bidi renderer acts on, but ``\\n``."""
    found = []
    for char in text:
        code = ord(char)
        if char == "\n":
            continue
        if (
            code < 0x20  # C0, tab included
            or 0x7F <= code <= 0x9F  # DEL and C1
            or 0x202A <= code <= 0x202E  # bidi embeddings and overrides
            or 0x2066 <= code <= 0x2069  # bidi isolates
            or code in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029)
            or 0xD800 <= code <= 0xDFFF  # lone surrogates
            or unicodedata.category(char) == "Cf"  # every other format character
        ):
            found.append(f"U+{code:04X}")
    return found


def assert_clean(text: str) -> None:
    assert _raw_controls(text) == [], text


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _clean_run(*argv: str) -> tuple[int, str, str]:
    """Run the command; check that neither stream holds a raw control character."""
    code, out, err = _run(*argv)
    assert_clean(out)
    assert_clean(err)
    assert "Traceback" not in err
    return code, out, err


def assert_not_forged(out: str) -> None:
    """No text's own line starts where a line of the layout does: each forged line shows, but
    indented inside its block."""
    lines = out.split("\n")
    for forged in FORGED:
        assert not any(line.startswith(forged) for line in lines), forged
        assert not any(line.startswith(("  " + forged, "    " + forged)) for line in lines)
    inside = [line for line in lines if line.lstrip().startswith(FORGED[0])]
    assert inside, "the forged line is shown, inside its block"
    assert all(line.startswith(" " * 5) for line in inside)


# --------------------------------------------------------------------------- staging


def _step(idx: int, **fields: object) -> StepRecord:
    values: dict[str, object] = {
        "step_idx": idx,
        "raw_output": MULTI,
        "content_chars": len(MULTI),
        "thinking_chars": len(MULTI),
        "action": None,
        "parse_ok": True,
        "parse_error": None,
        "observation": MULTI,
        "observation_is_synthetic": False,
        "observation_truncated_chars": 0,
        "prompt_chars": 100 + idx,
        "call_id": HOSTILE,
        "step_wall_ms": 7,
        "action_status": None,
        "usage": Usage(prompt_tokens=10, completion_tokens=2),
        "model_ms": 3,
    }
    values.update(fields)
    return StepRecord(**values)  # type: ignore[arg-type]


def _reply() -> ModelReply:
    return ModelReply(
        call_id=HOSTILE,
        content=MULTI,
        thinking=MULTI,
        usage=Usage(prompt_tokens=10, completion_tokens=2),
        tool_calls=(NativeToolCall(id=HOSTILE, name=HOSTILE, arguments=MULTI),),
        finish_reason=HOSTILE,
    )


def _intent(idx: int, kind: IntentKind, policy: ReplayPolicy = ReplayPolicy.SAFE) -> Intent:
    prefix = "m" if kind is IntentKind.MODEL_CALL else "a"
    return Intent(
        run_id=RUN,
        kind=kind,
        call_index=idx,
        result_id=f"{prefix}{idx}",
        replay_policy=policy,
        # An idempotency key is checked to be [A-Za-z0-9._:-] when the record is built.
        idempotency_key=f"polyloop:r:{RUN}:a{idx}" if kind is IntentKind.ACTION else None,
    )


async def _model(store: JsonlRunStore, idx: int, reply: ModelReply | None) -> None:
    await store.write_intent(_intent(idx, IntentKind.MODEL_CALL))
    await store.write_model_call_result(
        ModelCallResult(
            run_id=RUN,
            result_id=f"m{idx}",
            reply=reply,
            failure=None if reply is not None else MULTI,
            duration_ms=3,
        )
    )


async def _stage(directory: Path, *, ending: str, observation: str = MULTI) -> Path:
    """A log of ``run-1`` whose every text is hostile: an action step (that observed
    ``observation``), a parse failure, a failed model call, then a final answer
    (``ending="finished"``) or a ``NEVER`` action in doubt with a reconciler's unknown answer
    (``ending="in_doubt"``)."""
    store = JsonlRunStore(directory=directory)
    snapshot = {HOSTILE: HOSTILE, "request.tools": MULTI, "model_client.model": HOSTILE}
    await store.write_run_started(RunStarted(run_id=RUN, parameter_snapshot=snapshot))
    steps = []

    await _model(store, 0, _reply())
    await store.write_intent(_intent(0, IntentKind.ACTION))
    outcome = ActionOutcome(
        status=ActionStatus.EXECUTED,
        observation=observation,
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    )
    steps.append(
        _step(
            0,
            raw_output=MULTI + "!",
            action=MULTI,
            observation=observation,
            action_status=ActionStatus.EXECUTED,
        )
    )
    await store.write_step_completed(
        StepCompleted(run_id=RUN, result_id="a0", action_outcome=outcome, step=steps[-1])
    )

    await _model(store, 1, ModelReply(call_id=HOSTILE, content=MULTI))
    steps.append(_step(1, parse_ok=False, parse_error=MULTI, observation_is_synthetic=True))
    await store.write_step_completed(
        StepCompleted(run_id=RUN, result_id=None, action_outcome=None, step=steps[-1])
    )

    await _model(store, 2, None)
    steps.append(
        _step(
            2,
            raw_output="",
            call_id=None,
            parse_ok=False,
            parse_error=MULTI,
            observation_is_synthetic=True,
        )
    )
    await store.write_step_completed(
        StepCompleted(run_id=RUN, result_id=None, action_outcome=None, step=steps[-1])
    )

    if ending == "finished":
        await _model(store, 3, ModelReply(call_id=HOSTILE, content=MULTI))
        steps.append(_step(3, observation=""))
        await store.write_step_completed(
            StepCompleted(run_id=RUN, result_id=None, action_outcome=None, step=steps[-1])
        )
        result = RunResult(
            run_id=RUN,
            stop_reason=StopReason.FINAL_ANSWER,
            final_answer=MULTI,
            steps=tuple(steps),
        )
        await store.write_run_finished(RunFinished(run_id=RUN, result=result))
    else:
        await _model(store, 3, _reply())
        await store.write_intent(_intent(3, IntentKind.ACTION, ReplayPolicy.NEVER))
        await store.write_settlement(
            Settlement(
                run_id=RUN,
                result_id="a3",
                verdict=SettlementVerdict.UNKNOWN,
                source=SettlementSource.RECONCILER,
                by=HOSTILE,
                at=HOSTILE,
                note=MULTI,
            )
        )
    return directory / f"{RUN}.jsonl"


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    return asyncio.run(_stage(tmp_path / "finished", ending="finished"))


@pytest.fixture
def in_doubt(tmp_path: Path) -> Path:
    return asyncio.run(_stage(tmp_path / "in-doubt", ending="in_doubt"))


def _renamed(value: object, run_id: str) -> object:
    if isinstance(value, dict):
        return {k: run_id if k == "run_id" else _renamed(v, run_id) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, run_id) for v in value]
    return value


HOSTILE_ID = f"r1{ATTACK}\n{FORGED[0]}"


@pytest.fixture
def hostile_id(tmp_path: Path) -> Path:
    """The 0.1.0 fixture ``r1-total`` whose every record claims the run id ``HOSTILE_ID``."""
    lines = (FIXTURES / "r1-total.jsonl").read_text(encoding="utf-8").splitlines()
    renamed = [json.dumps(_renamed(json.loads(line), HOSTILE_ID)) for line in lines]
    path = tmp_path / "ids" / "r1-total.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(renamed) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def hostile_name(tmp_path: Path) -> Path:
    """A copy of a 0.1.0 fixture under a file name holding the attack."""
    path = tmp_path / "names" / HOSTILE_FILE
    path.parent.mkdir()
    shutil.copy(FIXTURES / "u2-dangling-never-action.jsonl", path)
    return path


# --------------------------------------------------------------------------- show


@pytest.mark.parametrize("flags", [(), ("--full",), ("--width", "30")])
def test_show_of_a_finished_run_prints_no_control_character(
    finished: Path, flags: tuple[str, ...]
) -> None:
    code, out, err = _clean_run("show", str(finished), *flags)
    assert (code, err) == (EXIT_OK, "")
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\r\\x00\\x9b\\u202e\\x08" in out
    lines = out.split("\n")
    assert [line for line in lines if line.startswith("stop reason:")] == [
        "stop reason: final_answer"
    ]
    assert [line for line in lines if line.startswith("step ")] == [
        line for line in lines if re.match(r"step [0-3]  \[", line)
    ]
    assert "control chars escaped]" in out
    if flags != ("--width", "30"):
        assert_not_forged(out)
        for label in ("thinking", "reply", "history", "observation", "action", "final answer"):
            assert re.search(
                rf"^ *{label}( \(synthetic\))? \[\d+ control chars escaped\]: ", out, re.M
            )
        assert "tool call ok\\x1b[2J" in out  # the tool's name
        assert "model call failed [" in out
        assert "parse failure [" in out


def test_show_of_a_run_in_doubt_prints_no_control_character(in_doubt: Path) -> None:
    code, out, err = _clean_run("show", str(in_doubt))
    assert (code, err) == (EXIT_OK, "")
    assert_not_forged(out)
    lines = out.split("\n")
    assert [line for line in lines if line.startswith("unfinished:")] == [lines[-2]]
    assert lines[-2].startswith("unfinished: resume would stop the run as resume_state_unknown")
    assert "in doubt: step 3's action a3" in out
    assert "  idempotency key: polyloop:r:run-1:a3 " in out
    assert "  last answer: unknown, by reconciler 'ok\\x1b[2J" in out
    assert "  asked for: tool ok\\x1b[2J" in out
    assert "    python -m polyloop resolve " in out


def test_show_of_a_hostile_run_id_and_file_name(hostile_id: Path, hostile_name: Path) -> None:
    code, out, _ = _clean_run("show", str(hostile_id))
    assert code == EXIT_OK
    first = out.split("\n")[0]
    assert first.startswith("run r1\\x1b[2J\\x1b]0;pwned\\x07\\r\\x00\\x9b\\u202e\\x08\\nstep 9")
    assert not any(line.startswith("step 9") for line in out.split("\n"))
    code, out, _ = _clean_run("show", str(hostile_name))
    assert code == EXIT_OK
    assert "x\\x1b[2J\\x1b]0;pwned\\x07\\r\\x9b\\u202e\\x08.jsonl" in out
    assert "settle it with one of" in out


def test_a_lone_surrogate_does_not_break_a_strict_utf8_terminal(finished: Path) -> None:
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n")
    assert main(["show", str(finished), "--full"], out=out, err=io.StringIO()) == EXIT_OK
    out.flush()
    printed = raw.getvalue().decode("utf-8")  # strict: nothing unencodable was written
    assert "\\ud800" in printed
    assert_clean(printed)


# --------------------------------------------------------------------------- ls


def test_ls_prints_one_clean_line_per_run(
    tmp_path: Path, finished: Path, in_doubt: Path, hostile_id: Path, hostile_name: Path
) -> None:
    both = tmp_path / "both"
    both.mkdir()
    for number, log in enumerate((finished, in_doubt, hostile_id, hostile_name)):
        shutil.copy(log, both / f"{number}-{log.name}")
    code, out, err = _clean_run("ls", str(both))
    assert (code, err) == (EXIT_OK, "")
    rows = out.rstrip("\n").split("\n")
    assert len(rows) == 1 + 4, "a run id's newline starts no row"
    assert any(row.startswith("r1\\x1b[2J") for row in rows)
    assert sum(row.startswith("run-1 ") for row in rows) == 2


def test_ls_json_is_exact_and_clean(
    tmp_path: Path, finished: Path, hostile_id: Path, hostile_name: Path
) -> None:
    both = tmp_path / "both"
    both.mkdir()
    for log in (finished, hostile_id, hostile_name):
        shutil.copy(log, both / log.name)
    code, out, err = _clean_run("ls", str(both), "--json", "--unfinished")
    assert (code, err) == (EXIT_OK, "")
    runs = json.loads(out)
    assert [Path(r["source"]).name for r in runs] == [HOSTILE_FILE]  # exact, once parsed
    code, out, _ = _clean_run("ls", str(both), "--json")
    runs = json.loads(out)
    assert {r["run_id"] for r in runs} == {RUN, HOSTILE_ID, "r6-kill-never"}
    assert "\\u001b[2J" in out
    assert "\\u202e" in out
    assert "\\u009b" in out


# --------------------------------------------------------------------------- diff


def test_diff_prints_no_control_character(finished: Path, in_doubt: Path, hostile_id: Path) -> None:
    code, out, err = _clean_run("diff", str(finished), str(in_doubt))
    assert (code, err) == (EXIT_FINDING, "")
    assert "first divergence: step 3" in out
    code, out, _ = _clean_run("diff", str(finished), str(hostile_id))
    assert code == EXIT_FINDING
    assert "  only in run-1: ok\\x1b[2J" in out  # a hostile snapshot key
    assert out.startswith("--- run-1  (")
    assert out.split("\n")[1].startswith("+++ r1\\x1b[2J")
    code, out, _ = _clean_run("diff", str(finished), str(finished))
    assert code == EXIT_OK
    code, out, _ = _clean_run("diff", str(FIXTURES / "r1-total.jsonl"), str(hostile_id))
    assert code == EXIT_OK, "the steps agree: only the run ids differ"


@pytest.mark.parametrize("flags", [(), ("--full",)])
def test_diff_shows_two_hostile_texts_as_blocks(
    tmp_path: Path, finished: Path, flags: tuple[str, ...]
) -> None:
    other = asyncio.run(_stage(tmp_path / "other", ending="finished", observation="calm"))
    code, out, _ = _clean_run("diff", str(other), str(finished), *flags)
    assert code == EXIT_FINDING
    assert "first divergence: step 0, observation" in out
    assert "  -: calm\n" in out
    assert re.search(r"^  \+ \[\d+ control chars escaped\]: ok\\x1b\[2J", out, re.M)
    assert_not_forged(out)


# --------------------------------------------------------------------------- verify


def test_verify_prints_no_control_character(
    tmp_path: Path, finished: Path, in_doubt: Path, hostile_id: Path, hostile_name: Path
) -> None:
    for log in (finished, in_doubt):
        code, out, err = _clean_run("verify", str(log))
        assert (code, err) == (EXIT_OK, ""), out
    code, out, _ = _clean_run("verify", str(hostile_id))
    assert code == EXIT_FINDING
    assert "a RunStarted record belongs to run " in out
    assert len(out.rstrip("\n").split("\n")) == 2, "one verdict line and the summary"
    code, out, _ = _clean_run("verify", str(hostile_name.parent))
    assert code == EXIT_FINDING
    assert "x\\x1b[2J" in out
    broken = tmp_path / "broken" / "b.jsonl"
    broken.parent.mkdir()
    broken.write_text('{"record": "\x1b[2J' + "\x9b\u202e" + '"}\n', encoding="utf-8")
    code, out, _ = _clean_run("verify", str(broken))
    assert code == EXIT_FINDING
    assert "BREACH" in out


# --------------------------------------------------------------------------- resolve


def test_resolve_success_prints_a_clean_line_and_show_the_settlement(in_doubt: Path) -> None:
    code, out, err = _clean_run(
        "resolve", str(in_doubt), "--result-id", "a3", "--not-executed",
        "--by", HOSTILE, "--note", MULTI,
    )  # fmt: skip
    assert (code, err) == (EXIT_OK, "")
    assert out.count("\n") == 1
    assert out.startswith("recorded: run 'run-1', a3 not executed (by ok\\x1b[2J")
    assert out.endswith("with idempotency key polyloop:r:run-1:a3\n")
    code, out, _ = _clean_run("show", str(in_doubt))
    assert code == EXIT_OK
    assert "settlement of a3 (line " in out
    assert "by person 'ok\\x1b[2J" in out
    assert_not_forged(out)
    code, out, _ = _clean_run("show", str(in_doubt), "--full")
    assert "note [" in out


def test_resolve_executed_with_a_hostile_observation(in_doubt: Path) -> None:
    code, out, _ = _clean_run(
        "resolve", str(in_doubt), "--result-id", "a3", "--executed",
        "--observation", MULTI, "--by", "alice",
    )  # fmt: skip
    assert code == EXIT_OK
    code, out, _ = _clean_run("show", str(in_doubt), "--full")
    assert code == EXIT_OK
    assert "      observation [" in out
    assert_not_forged(out)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("wrong_result_id", "refused [wrong_result_id]"),
        ("finished", "refused [finished]"),
        ("no_log", "refused [no_log]"),
        ("bad_name", "x\\x1b[2J"),
        ("bad_by", "--by needs a name"),
    ],
)
def test_resolve_refusals_are_one_clean_line(
    case: str, reason: str, tmp_path: Path, finished: Path, in_doubt: Path, hostile_name: Path
) -> None:
    # Logs in directories whose names hold the attack: a refusal's fix names the log.
    logs = {}
    for name, log in (("finished", finished), ("in-doubt", in_doubt)):
        directory = tmp_path / f"{name}{IN_A_NAME}"
        directory.mkdir()
        logs[name] = Path(shutil.copy(log, directory / log.name))
    doubt = logs["in-doubt"]
    argv = {
        "wrong_result_id": [str(doubt), "--result-id", HOSTILE, "--not-executed"],
        "finished": [str(logs["finished"]), "--result-id", "a3", "--not-executed"],
        "no_log": [str(doubt.parent), "--run-id", HOSTILE, "--result-id", "a3",
                   "--not-executed"],
        "bad_name": [str(hostile_name), "--result-id", "a3", "--not-executed"],
        "bad_by": [str(doubt), "--result-id", HOSTILE, "--not-executed"],
    }[case]  # fmt: skip
    by = " \t\r\n" if case == "bad_by" else HOSTILE
    before = {log: log.read_bytes() for log in (*logs.values(), hostile_name)}
    code, out, err = _clean_run("resolve", *argv, "--by", by)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.count("\n") == 1, err
    assert reason in err
    where = {"finished": "finished", "wrong_result_id": "in-doubt", "no_log": "in-doubt"}
    if case in where:  # the fix names the log or its directory, made visible
        assert f"{where[case]}\\x1b[2J\\x1b]0;pwned\\x07\\r\\x9b\\u202e\\x08" in err
    assert {log: log.read_bytes() for log in before} == before, "a refusal writes nothing"


# --------------------------------------------------------------------------- html


def test_html_holds_no_raw_control_character(
    tmp_path: Path, finished: Path, in_doubt: Path, hostile_id: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for number, log in enumerate((finished, in_doubt, hostile_id)):
        shutil.copy(log, runs / f"{number}.jsonl")
    page_path = tmp_path / f"page{IN_A_NAME}.html"
    code, out, err = _clean_run("html", str(runs), "-o", str(page_path))
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith("wrote ")
    assert out.count("\n") == 1
    page = page_path.read_text(encoding="utf-8")  # strict: no lone surrogate was written
    assert [c for c in _raw_controls(page) if c != "U+0009"] == []  # tabs are kept in a page
    assert "\x1b" not in page
    assert "\u202e" not in page
    assert "ok\\x1b[2J\\x1b]0;pwned\\x07\\r\\x00\\x9b\\u202e\\x08forged" in page
    assert page.count("<script>") == 1


# --------------------------------------------------------------------------- errors


def test_error_lines_quote_paths_and_arguments_visibly(tmp_path: Path, finished: Path) -> None:
    code, out, err = _clean_run("show", str(tmp_path / HOSTILE_FILE))
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.count("\n") == 1
    assert "no such file" in err
    assert "x\\x1b[2J" in err
    code, _, err = _clean_run("ls", str(finished.parent), "--stop-reason", HOSTILE)
    assert code == EXIT_BAD_INPUT
    assert "invalid choice: 'ok\\x1b[2J" in err
    code, _, err = _clean_run("show", str(finished), "--run", HOSTILE)
    assert code == EXIT_BAD_INPUT
    assert err.count("\n") == 1


def test_an_unreadable_log_in_a_directory_is_named_visibly(tmp_path: Path, finished: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(finished, runs)
    (runs / HOSTILE_FILE).write_text("{not json\x1b[2J\n", encoding="utf-8")
    code, _out, err = _clean_run("ls", str(runs))
    assert code == EXIT_FINDING
    assert err.count("\n") == 1
    assert "unreadable log" in err
    assert "x\\x1b[2J" in err


# --------------------------------------------------------------------------- renderers


def test_the_renderers_escape_on_their_own(
    tmp_path: Path, finished: Path, in_doubt: Path, hostile_id: Path
) -> None:
    """Without ``main``'s last guard (``VisibleStream``), each renderer's text is clean."""
    views = [load_target(str(p)).runs[0] for p in (finished, in_doubt, hostile_id)]
    for view in views:
        for limit in (None, 30):
            shown = render_show(view, full=limit is None, limit=limit)
            assert_clean(shown)
        assert not any(line.startswith(FORGED) for line in render_show(
            view, full=True, limit=None).split("\n"))  # fmt: skip
    lines = ls_lines(views)
    assert len(lines) == 1 + len(views)
    for line in lines:
        assert_clean(line)
        assert "\n" not in line
    assert_clean(ls_json(views))
    for left in views:
        for right in views:
            assert_clean(render_diff(left, right, diff_runs(left, right), None))
    runs = tmp_path / "copies"
    runs.mkdir()
    for number, log in enumerate((finished, in_doubt, hostile_id)):
        shutil.copy(log, runs / f"{number}{IN_A_NAME}.jsonl")
    for verdict in verify_target(str(runs)):
        line = verdict.describe()
        assert_clean(line)
        assert "\n" not in line


def test_visible_stream_is_the_last_guard() -> None:
    out = io.StringIO()
    stream = VisibleStream(out)
    assert stream.write(f"a{ATTACK}\nb") == len(ATTACK) + 3
    assert out.getvalue() == "a\\x1b[2J\\x1b]0;pwned\\x07\\r\\x00\\x9b\\u202e\\x08\nb"


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("a\rb\x08\x00", "a\\rb\\x08\\x00"),
        ("\t", "\\t"),
        ("\n", "\\n"),
        ("\x7f\x85\x9b\x9d", "\\x7f\\x85\\x9b\\x9d"),
        ("\u202etxt.exe\u202c", "\\u202etxt.exe\\u202c"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),
        ("a\u200bb\u200dc\u2060\ufeff\xad", "a\\u200bb\\u200dc\\u2060\\ufeff\\xad"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\U000e0041\U000e007f", "\\U000e0041\\U000e007f"),
        ("\ud800", "\\ud800"),
        ("plain ASCII, Grüße, Αθήνα, emoji \U0001f600, nbsp\xa0, C:\\tmp\\x1b", None),
    ],
)  # fmt: skip
def test_visible_escapes_controls_and_keeps_the_rest(text: str, shown: str | None) -> None:
    assert visible(text) == (text if shown is None else shown)
    assert count_hidden(text) == (0 if shown is None else shown.count("\\"))


def test_newlines_and_tabs_are_kept_only_when_asked() -> None:
    assert visible("a\nb\tc\r") == "a\\nb\\tc\\r"
    assert visible("a\nb\tc\r", newlines=True) == "a\nb\\tc\\r"
    assert visible("a\nb\tc\r", newlines=True, tabs=True) == "a\nb\tc\\r"
    assert count_hidden("a\nb\tc\r", newlines=True) == 2
    assert escape("\x1b") == "\\x1b"
    assert escape("\u202e") == "\\u202e"


_ANY_TEXT = st.text(
    st.one_of(
        st.characters(exclude_categories=()),  # surrogates included
        st.sampled_from(list(ATTACK + EXTRA + "\n\\xu")),
    ),
    max_size=60,
)
_PRINTABLE = st.text(st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp")))
_ESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|[tnr])")
_NAMED = {"t": "\t", "n": "\n", "r": "\r"}


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: _NAMED.get(m[1]) or chr(int(m[1][1:], 16)), text)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(_ANY_TEXT)
def test_visible_output_never_holds_a_control_or_bidi_character(text: str) -> None:
    for newlines in (False, True):
        shown = visible(text, newlines=newlines)
        assert _raw_controls(shown) == []
        assert not any(is_hidden(c) for c in shown if not (newlines and c == "\n"))
        assert shown.count("\n") == (text.count("\n") if newlines else 0)
        if "\\" not in text:  # reversible, but for a text that spells an escape itself
            assert _unescape(shown) == text
            assert count_hidden(text, newlines=newlines) == len(_ESCAPE.findall(shown))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_PRINTABLE)
def test_visible_leaves_printable_text_unchanged(text: str) -> None:
    assert visible(text) == text
    assert visible(text, newlines=True, tabs=True) == text
    assert count_hidden(text) == 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(_ANY_TEXT, max_size=4))
def test_visible_json_is_exact_and_clean(texts: list[str]) -> None:
    value = {"texts": texts, "run_id": "".join(texts)}
    # A high surrogate followed by a low one reads back from any JSON as the one character
    # the pair spells, whatever wrote it: not a difference of visible_json.
    assume(not re.search("[\ud800-\udbff][\udc00-\udfff]", "".join(texts)))
    dumped = visible_json(value)
    assert json.loads(dumped) == value
    assert _raw_controls(dumped) == []
    assert visible_json(value, indent=None).count("\n") == 0
