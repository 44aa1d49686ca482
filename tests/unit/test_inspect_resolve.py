"""``python -m polyloop resolve`` and the in-doubt display of ``show``, ``ls`` and ``html``
(issue 21, item 4; designs 0180 and 0206).

A run in doubt is staged as in ``test_in_doubt.py``: a ``NEVER`` tool whose handler raises a
``BaseException`` (``Died``) stands for the process dying inside the tool, and a resume then
parks the run at ``resume_state_unknown`` without a finish. The logs are real
``JsonlRunStore`` files; the CLI is driven through ``polyloop.inspect.main`` and the run is
then resumed through the Python API (``run_or_resume``) with the same tiny agent.

Every refusal must be one line on stderr naming the reason and the fix, exit status 2, no
traceback, and nothing written. ``store_cannot_settle`` cannot be reached from the command
line: it only opens ``JsonlRunStore``, which records settlements (the library's refusal is
tested in ``test_in_doubt.py``).
"""

from __future__ import annotations

import asyncio
import html
import io
import json
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.inspect import EXIT_BAD_INPUT, EXIT_OK, main, resolve_commands
from polyloop.ports import RunLog
from polyloop.session import AgentDefinition, RunRequest, run, run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.tools import Reconciler, Reconciliation, ToolContext, ToolRegistry, ToolSpec
from polyloop.types import (
    ReplayPolicy,
    RunResult,
    SettlementSource,
    SettlementVerdict,
    StopReason,
)

pytestmark = pytest.mark.unit

SCRIPT = ['tool:pay {"amount": 5}', "final:paid"]
KEY = "polyloop:r:run-1:a0"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-0.1.0"


class Died(BaseException):
    """Stands for the process dying: no ``except Exception`` in the library catches it."""


@dataclass
class Ledger:
    """The payment tool's own system: one entry per effect, by idempotency key."""

    effects: list[str] = field(default_factory=list)
    keys_seen: list[str] = field(default_factory=list)
    die: str | None = None  # "before" or "after" the effect, once


def _spec(ledger: Ledger, reconcile: Reconciler | None = None) -> ToolSpec:
    async def pay(ctx: ToolContext, amount: int) -> str:
        """Move money."""
        ledger.keys_seen.append(ctx.idempotency_key)
        if ledger.die == "before":
            ledger.die = None
            raise Died
        ledger.effects.append(ctx.idempotency_key)
        if ledger.die == "after":
            ledger.die = None
            raise Died
        return f"paid {amount}"

    return ToolSpec.from_function(pay, replay_policy=ReplayPolicy.NEVER, reconcile=reconcile)


def _agent(directory: Path, script: list[str | BaseException] | None = None) -> AgentDefinition:
    model = ScriptedModel(SCRIPT if script is None else script)
    return definition(model, store=JsonlRunStore(directory=directory))


def _request(ledger: Ledger, reconcile: Reconciler | None = None) -> RunRequest:
    return request("run-1", tools=ToolRegistry([_spec(ledger, reconcile)]))


def stage_in_doubt(
    directory: Path, ledger: Ledger, *, die: str = "after", reconcile: Reconciler | None = None
) -> Path:
    """Run ``run-1`` until its ``pay`` dies, resume it once (parked in doubt); its log."""

    async def go() -> None:
        ledger.die = die
        with pytest.raises(Died):
            await run(_agent(directory), _request(ledger, reconcile))
        parked = await run_or_resume(_agent(directory), _request(ledger, reconcile))
        assert parked.stop_reason is StopReason.RESUME_STATE_UNKNOWN

    asyncio.run(go())
    log = read_log(directory)
    assert log.finished is None, "the run is parked in doubt, unfinished"
    return directory / "run-1.jsonl"


def resume_run(directory: Path, ledger: Ledger, reconcile: Reconciler | None = None) -> RunResult:
    return asyncio.run(run_or_resume(_agent(directory), _request(ledger, reconcile)))


def read_log(directory: Path) -> RunLog:
    return asyncio.run(JsonlRunStore(directory=directory).read_log("run-1"))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def refused(log: Path, *argv: str) -> str:
    """Run the command, check it is one line on stderr, exit 2, nothing written; the line."""
    before = log.read_bytes() if log.is_file() else None
    code, out, err = cli(*argv)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    if before is not None:
        assert log.read_bytes() == before, "a refused resolve writes nothing"
    return err


# --------------------------------------------------------------------------- success


def test_executed_is_recorded_and_the_resumed_run_finishes_without_executing_again(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    log = stage_in_doubt(tmp_path, ledger)
    code, out, err = cli(
        "resolve",
        str(log),
        "--result-id",
        "a0",
        "--executed",
        "--observation",
        "paid 5 (bank ref 77)",
        "--by",
        "alice",
        "--note",
        "checked the bank statement",
    )
    assert (code, err) == (EXIT_OK, "")
    assert out.count("\n") == 1
    assert out.startswith("recorded: run 'run-1', a0 executed (by alice, at ")
    assert "next: resume the run with its agent (polyloop.session.run_or_resume)" in out
    assert "records step 0 with that observation and executes nothing" in out
    (settlement,) = read_log(tmp_path).settlements
    assert settlement.verdict is SettlementVerdict.EXECUTED
    assert settlement.source is SettlementSource.PERSON
    assert (settlement.by, settlement.note) == ("alice", "checked the bank statement")
    assert settlement.observation == "paid 5 (bank ref 77)"

    result = resume_run(tmp_path, ledger)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == "paid 5 (bank ref 77)"
    assert ledger.effects == [KEY], "the payment happened once: resume executed nothing"
    outcome = read_log(tmp_path).steps[0].action_outcome
    assert outcome is not None
    assert outcome.settled_by == "person:alice"


def test_not_executed_is_recorded_and_the_action_runs_once_with_its_key(tmp_path: Path) -> None:
    ledger = Ledger()
    log = stage_in_doubt(tmp_path, ledger, die="before")
    assert ledger.effects == []
    code, out, err = cli("resolve", str(log), "--result-id", "a0", "--not-executed", "--by", "bob")
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith("recorded: run 'run-1', a0 not executed (by bob, at ")
    assert f"it executes step 0's action now, with idempotency key {KEY}" in out
    result = resume_run(tmp_path, ledger)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert ledger.effects == [KEY], "executed exactly once, with the key its intent records"
    assert ledger.keys_seen == [KEY, KEY]


def test_a_directory_target_finds_the_run_by_its_id_or_alone(tmp_path: Path) -> None:
    ledger = Ledger()
    stage_in_doubt(tmp_path, ledger)
    argv = ("--result-id", "a0", "--not-executed", "--by", "bob")
    assert cli("resolve", f"jsonl://{tmp_path}", "--run-id", "run-1", *argv)[0] == EXIT_OK
    other = tmp_path / "alone"
    stage_in_doubt(other, Ledger())
    assert cli("resolve", str(other), *argv)[0] == EXIT_OK
    assert len(read_log(other).settlements) == 1


# --------------------------------------------------------------------------- display


def test_show_names_the_execution_in_doubt_and_the_command_that_settles_it(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    log = stage_in_doubt(tmp_path, ledger, die="before")
    code, out, _ = cli("show", str(log))
    assert code == EXIT_OK
    assert "in doubt: step 0's action a0 (replay policy never) has an intent and no result" in out
    assert f"  idempotency key: {KEY} (look it up in the tool's own system)" in out
    assert 'the reply that asked for it: tool:pay {"amount": 5}' in out
    assert f"(replay policy never, idempotency key {KEY})" in out  # on the action intent
    executed, not_executed = resolve_commands(str(log), "run-1", "a0")
    assert f"    {executed}\n" in out
    assert f"    {not_executed}\n" in out
    assert "resume would stop the run as resume_state_unknown" in out

    # The command show prints is the one to run (NAME filled in).
    argv = [word if word != "NAME" else "carol" for word in shlex.split(not_executed)[3:]]
    assert cli(*argv)[0] == EXIT_OK
    _, after, _ = cli("show", str(log))
    assert "in doubt:" not in after
    # Line 5 is the parked resume's own mark (resume_stopped, schema 1.9, design 0231).
    assert "stopped again as resume_state_unknown" in after
    assert "settlement of a0 (line 6): not executed, by person 'carol' at " in after
    assert "unfinished: resume would announce step 0's action again and execute it" in after


def test_ls_marks_the_runs_in_doubt(tmp_path: Path) -> None:
    stage_in_doubt(tmp_path, Ledger())
    shutil.copy(FIXTURES / "r1-total.jsonl", tmp_path)
    code, out, _ = cli("ls", str(tmp_path))
    assert code == EXIT_OK
    rows = out.splitlines()
    assert rows[0].split()[-4:] == ["in", "doubt", "approval", "log"]
    assert rows[1].split()[0] == "r1-total"
    assert len(rows[1].split()) == 8, "a finished run has nothing in doubt"
    assert rows[2].split() == [
        "run-1", "unfinished", "0", "0", "0", "ms", "1", "a0", str(tmp_path / "run-1.jsonl"),
    ]  # fmt: skip
    _, listed, _ = cli("ls", str(tmp_path), "--unfinished", "--json")
    (record,) = json.loads(listed)
    assert (record["run_id"], record["in_doubt"], record["resume"]) == (
        "run-1",
        "a0",
        "stop_unknown",
    )


def _cannot_tell() -> Reconciler:
    """A reconciler that cannot tell (the ledger is being rebuilt)."""

    async def reconcile(ctx: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        return Reconciliation.unknown("the ledger is being rebuilt")

    return reconcile


def test_show_and_html_list_every_settlement_with_who_and_when(tmp_path: Path) -> None:
    ledger = Ledger()
    reconcile = _cannot_tell()
    log = stage_in_doubt(tmp_path, ledger, reconcile=reconcile)
    (unknown,) = read_log(tmp_path).settlements
    assert unknown.source is SettlementSource.RECONCILER
    _, out, _ = cli("show", str(log))
    assert f"settlement of a0 (line 5): unknown, by reconciler 'pay' at {unknown.at}" in out
    assert "reason: the ledger is being rebuilt" in out
    assert f"  last answer: unknown, by reconciler 'pay' at {unknown.at} (line 5)" in out
    page = tmp_path / "doubt.html"
    assert cli("html", str(log), "-o", str(page))[0] == EXIT_OK
    text = page.read_text(encoding="utf-8")
    assert '<div class="in-doubt" data-result-id="a0">' in text
    assert f"<code>{KEY}</code>" in text
    commands = re.findall(r'<pre class="resolve-command">(.*?)</pre>', text)
    assert [html.unescape(c) for c in commands] == list(resolve_commands(str(log), "run-1", "a0"))
    assert '<span class="badge bad">in doubt</span>' in text

    assert cli(
        "resolve", str(log), "--result-id", "a0", "--executed", "--observation", "paid 5",
        "--by", "alice", "--note", "found it by its key",
    )[0] == EXIT_OK  # fmt: skip
    assert resume_run(tmp_path, ledger, reconcile).stop_reason is StopReason.FINAL_ANSWER
    first, second = read_log(tmp_path).settlements
    _, out, _ = cli("show", str(log))
    assert f"settlement of a0 (line 5): unknown, by reconciler 'pay' at {first.at}" in out
    # Line 6 is the parked resume's mark (resume_stopped: the reconciler's unknown answer,
    # then nothing else written; schema 1.9, design 0231).
    assert f"settlement of a0 (line 7): executed, by person 'alice' at {second.at}" in out
    assert "      note: found it by its key" in out
    assert "      observation: paid 5" in out
    assert "    status: executed, settled by person:alice" in out
    assert "in doubt" not in out
    assert cli("html", str(log), "-o", str(page))[0] == EXIT_OK
    text = page.read_text(encoding="utf-8")
    found = re.findall(
        r'<div class="settlement" data-verdict="(\w+)" data-source="(\w+)" data-line="(\d+)">',
        text,
    )
    assert found == [("unknown", "reconciler", "5"), ("executed", "person", "7")]
    assert html.escape(f"by person 'alice' at {second.at}") in text
    assert "reason: the ledger is being rebuilt" in text
    assert "settled by person:alice" in text
    assert "in-doubt" not in text.split("<body>", 1)[1]


def test_a_renamed_copy_in_doubt_names_the_file_its_store_keeps(tmp_path: Path) -> None:
    # The 0.1.0 fixture is a prefix of run r6-kill-never under another file name, written
    # before idempotency keys existed.
    path = FIXTURES / "u2-dangling-never-action.jsonl"
    _, out, _ = cli("show", str(path))
    assert "in doubt: step 3's action a3 (replay policy never)" in out
    assert "idempotency key: none recorded (an intent written before schema 1.7)" in out
    assert "JsonlRunStore keeps that run in r6-kill-never.jsonl" in out
    expected = resolve_commands(str(path), "r6-kill-never", "a3")
    assert str(FIXTURES / "r6-kill-never.jsonl") in expected[0]
    assert all(command in out for command in expected)
    page = tmp_path / "u2.html"
    assert cli("html", str(path), "-o", str(page))[0] == EXIT_OK
    assert '<div class="in-doubt" data-result-id="a3">' in page.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- refusals


def test_a_result_id_that_is_not_the_one_in_doubt_is_refused(tmp_path: Path) -> None:
    log = stage_in_doubt(tmp_path, Ledger())
    err = refused(log, "resolve", str(log), "--result-id", "a1", "--not-executed", "--by", "b")
    assert err.startswith("polyloop resolve: refused [wrong_result_id]: run 'run-1': ")
    assert "the execution in doubt is 'a0', not 'a1'" in err
    assert "pass the one in doubt as --result-id" in err


def test_a_second_resolution_is_refused_as_nothing_in_doubt(tmp_path: Path) -> None:
    log = stage_in_doubt(tmp_path, Ledger())
    argv = ("resolve", str(log), "--result-id", "a0")
    assert cli(*argv, "--executed", "--observation", "ok", "--by", "alice")[0] == EXIT_OK
    err = refused(log, *argv, "--not-executed", "--by", "bob")
    assert "refused [nothing_in_doubt]: run 'run-1' has no action in doubt" in err
    assert "settled it as executed" in err
    assert "resume the run with its agent" in err


def test_a_finished_run_is_refused(tmp_path: Path) -> None:
    ledger = Ledger()
    assert resume_run(tmp_path, ledger).stop_reason is StopReason.FINAL_ANSWER  # a fresh run
    log = tmp_path / "run-1.jsonl"
    err = refused(log, "resolve", str(log), "--result-id", "a0", "--not-executed", "--by", "b")
    assert "refused [finished]: run 'run-1' is finished" in err
    assert f"python -m polyloop show {log} shows how it ended" in err


def test_a_model_call_in_doubt_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        with pytest.raises(Died):
            await run(_agent(tmp_path, [Died(), "final:x"]), _request(Ledger()))

    asyncio.run(go())
    log = tmp_path / "run-1.jsonl"
    err = refused(log, "resolve", str(log), "--result-id", "m0", "--not-executed", "--by", "b")
    assert "refused [model_call]: " in err
    assert "start the task again under a new run id" in err


def test_a_run_without_a_log_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    stage_in_doubt(tmp_path, Ledger())
    before = sorted(p.name for p in tmp_path.rglob("*"))
    err = refused(
        tmp_path / "nope.jsonl",
        "resolve", str(tmp_path), "--run-id", "nope", "--result-id", "a0", "--not-executed",
        "--by", "b",
    )  # fmt: skip
    assert f"refused [no_log]: {tmp_path} holds no log of run 'nope'" in err
    assert f"python -m polyloop ls {tmp_path} lists the runs there" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_held_lease_is_refused(tmp_path: Path) -> None:
    log = stage_in_doubt(tmp_path, Ledger())
    store = JsonlRunStore(directory=tmp_path)
    lease = asyncio.run(store.acquire_lease("run-1"))
    try:
        err = refused(log, "resolve", str(log), "--result-id", "a0", "--not-executed", "--by", "b")
    finally:
        asyncio.run(lease.release())
    assert "refused [lease_held]: another process holds run 'run-1''s lease" in err
    assert "--lease-wait SECONDS" in err
    assert cli("resolve", str(log), "--result-id", "a0", "--not-executed", "--by", "b")[0] == 0


def test_a_corrupt_log_is_refused(tmp_path: Path) -> None:
    log = stage_in_doubt(tmp_path, Ledger())
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2].replace('\\"amount\\": 5', '\\"amount\\": 500')  # an edited reply
    assert "500" in lines[2]
    log.write_text("".join(lines), encoding="utf-8")
    err = refused(log, "resolve", str(log), "--result-id", "a0", "--not-executed", "--by", "b")
    assert "refused [corrupt_log]: " in err
    assert "line 3" in err
    assert f"python -m polyloop verify {log} names the line" in err


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--executed", "--by", "b"], "--executed needs --observation TEXT"),
        (
            ["--not-executed", "--observation", "x", "--by", "b"],
            "--not-executed takes no --observation",
        ),
        (
            ["--executed", "--not-executed", "--observation", "x", "--by", "b"],
            "argument --not-executed: not allowed with argument --executed",
        ),
        (["--by", "b"], "one of the arguments --executed --not-executed is required"),
        (["--not-executed"], "the following arguments are required: --by"),
        (["--not-executed", "--by", " "], "--by needs a name"),
        (["--not-executed", "--by", "b", "--lease-wait", "-1"], "--lease-wait must be a number"),
        (["--not-executed", "--by", "b", "--lease-wait", "nan"], "--lease-wait must be a number"),
        (["--not-executed", "--by", "b", "--lease-wait", "soon"], "invalid float value"),
        (["--not-executed", "--by", "b", "--run-id", "other"], "is the log of run 'run-1'"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(
    tmp_path: Path, argv: list[str], expected: str
) -> None:
    log = stage_in_doubt(tmp_path, Ledger())
    err = refused(log, "resolve", str(log), "--result-id", "a0", *argv)
    assert expected in err


def test_a_missing_result_id_is_a_usage_error(tmp_path: Path) -> None:
    log = stage_in_doubt(tmp_path, Ledger())
    err = refused(log, "resolve", str(log), "--not-executed", "--by", "b")
    assert "the following arguments are required: --result-id" in err


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("missing.jsonl", "no such file or directory"),
        ("notes.txt", "is not a <run_id>.jsonl log"),
        ("two", "holds 2 run logs; name the run with --run-id RUN"),
        ("empty", "no run logs"),
        ("postgres://user:secret@db/runs", "a PostgreSQL store holds many runs; name the run"),
    ],
)
def test_a_target_that_names_no_single_log_is_one_line(
    tmp_path: Path, target: str, expected: str
) -> None:
    (tmp_path / "notes.txt").write_text("hello\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    (tmp_path / "two").mkdir()
    for name in ("r1-total", "r2-question"):
        shutil.copy(FIXTURES / f"{name}.jsonl", tmp_path / "two")
    where = target if "://" in target else str(tmp_path / target)
    err = refused(
        tmp_path / "none", "resolve", where, "--result-id", "a0", "--not-executed", "--by", "b"
    )
    assert expected in err
    assert "secret" not in err
