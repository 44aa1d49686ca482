"""``python -m polyloop approvals``, ``approve`` and ``reject``, and how ``show``, ``ls`` and
``html`` display requests and decisions (issue 22, items 5 and 6; design 0210).

A paused run is staged as in ``test_approvals.py``: a ``from_function`` tool with
``needs_approval=True`` that the scripted model calls, written by a real ``JsonlRunStore``. The
CLI is driven through ``polyloop.inspect.main``; the run is then resumed through the Python API
(``run_or_resume``) with the same tiny agent. Every refusal is one line on stderr naming the
reason and the fix, exit status 2, no traceback, nothing written. ``store_cannot_settle``
cannot be reached from the command line (it opens ``JsonlRunStore``, which records decisions);
the library's refusal is tested in ``test_approvals.py``.
"""

from __future__ import annotations

import asyncio
import io
import json
import shlex
import time
import unicodedata
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.errors import RunLeaseLostError, StoreUnavailableError
from polyloop.inspect import EXIT_BAD_INPUT, EXIT_OK, main
from polyloop.inspect import _approvals as approvals_module
from polyloop.session import run, run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import RunResult, SettlementVerdict, StopReason

pytestmark = pytest.mark.unit

HOSTILE = "\x1b[2J\x1b]0;x\x07\rforged\x9b\u202eevil"
"""Clear screen, an OSC window title, a carriage return, a C1 CSI and a bidi override."""


class Bank:
    def __init__(self) -> None:
        self.refunds: list[tuple[int, str]] = []

    def tool(self) -> ToolSpec:
        async def refund(amount: int, memo: str = "") -> str:
            """Refund money."""
            self.refunds.append((amount, memo))
            return f"refunded {amount}"

        return ToolSpec.from_function(refund, needs_approval=True)


def _script(memo: str) -> list[str]:
    return ["tool:refund " + json.dumps({"amount": 250, "memo": memo}), "final:done"]


def stage(directory: Path, bank: Bank, memo: str = "order 7", **extra: object) -> RunResult:
    spec = bank.tool()
    agent = definition(ScriptedModel(_script(memo)), store=JsonlRunStore(directory=directory))
    result = asyncio.run(run(agent, request("run-1", tools=ToolRegistry([spec]), **extra)))
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    return result


def resume(directory: Path, bank: Bank, memo: str = "order 7", **extra: object) -> RunResult:
    agent = definition(ScriptedModel(_script(memo)), store=JsonlRunStore(directory=directory))
    req = request("run-1", tools=ToolRegistry([bank.tool()]), **extra)
    return asyncio.run(run_or_resume(agent, req))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def refused(log: Path, *argv: str) -> str:
    """Run the command; check it is one line on stderr, exit 2, nothing written; the line."""
    before = log.read_bytes()
    code, out, err = cli(*argv)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert log.read_bytes() == before, "a refused decision writes nothing"
    return err


def raw_controls(text: str) -> list[str]:
    """Every character a terminal or a bidi renderer acts on, but the layout's ``\\n``."""
    return [
        f"U+{ord(c):04X}"
        for c in text
        if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
    ]


def digest_of(result: RunResult) -> str:
    assert result.pending_approval is not None
    return result.pending_approval.digest


# --------------------------------------------------------------------------- listing


def test_approvals_lists_the_pending_call_exactly_as_digested(tmp_path: Path) -> None:
    result = stage(tmp_path, Bank())
    pending = result.pending_approval
    assert pending is not None
    code, out, err = cli("approvals", str(tmp_path))
    assert (code, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert lines[0] == f"run run-1  ({tmp_path / 'run-1.jsonl'})"
    assert "  approval requested for a0 (line 4): tool refund" in lines
    argument_lines = [line for line in lines if "arguments" in line]
    assert argument_lines == [f"    arguments: {pending.arguments}"], "nothing else by that name"
    assert pending.arguments == '{"amount":250,"memo":"order 7"}'
    assert f"    digest: {pending.digest}" in lines
    assert f"    asked at: {pending.requested_at}" in lines
    assert "    expires: no expiry set (it waits until a person decides)" in lines
    log = shlex.quote(str(tmp_path / "run-1.jsonl"))
    assert (
        f"  approve: python -m polyloop approve {log} --digest {pending.digest} --by NAME" in lines
    )
    assert lines[-1] == f"1 call waits for approval in {tmp_path}"
    code, listed, _ = cli("approvals", f"jsonl://{tmp_path}", "--json")
    (record,) = json.loads(listed)
    assert code == EXIT_OK
    assert (record["run_id"], record["tool"], record["arguments"], record["digest"]) == (
        "run-1",
        "refund",
        pending.arguments,
        pending.digest,
    )
    assert (record["requested_at"], record["expires_at"]) == (pending.requested_at, None)


def test_a_postgres_url_is_one_line_without_its_password_when_it_cannot_be_used() -> None:
    """Without ``--run-id`` a decision is refused before any connection (a database holds many
    runs); a server that is not there is one line; neither line shows the password. (Deciding
    on a real server: ``tests/integration/test_postgres_decisions.py``.)"""
    url = "postgres://user:secret@127.0.0.1:1/db"
    code, out, err = cli("approve", url, "--digest", "sha256:x", "--by", "alice")
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err == (
        "polyloop approve: postgres://user@127.0.0.1:1/db: a PostgreSQL store holds many runs; "
        "name the run with --run-id RUN (python -m polyloop ls postgres://user@127.0.0.1:1/db "
        "lists them)\n"
    )
    code, out, err = cli("approvals", url)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.startswith("polyloop approvals: postgres://user@127.0.0.1:1/db: cannot connect")
    assert err.count("\n") == 1
    assert "secret" not in err


def test_ls_and_show_mark_the_run_waiting_for_approval(tmp_path: Path) -> None:
    digest = digest_of(stage(tmp_path, Bank()))
    code, out, _ = cli("ls", str(tmp_path))
    assert code == EXIT_OK
    header, row = out.splitlines()
    assert header.split()[-2:] == ["approval", "log"]
    assert row.split()[-3:] == ["a0", "waits", str(tmp_path / "run-1.jsonl")]
    _, listed, _ = cli("ls", str(tmp_path), "--json")
    assert json.loads(listed)[0]["awaiting_approval"] == digest
    _, shown, _ = cli("show", str(tmp_path / "run-1.jsonl"))
    assert "awaiting approval: step 0's call of tool refund" in shown
    assert f"--digest {digest} --by NAME --reason TEXT" in shown
    assert "unfinished: resume would stop the run as awaiting_approval again" in shown


# --------------------------------------------------------------------------- deciding


def test_approve_then_resume_executes_the_call_once(tmp_path: Path) -> None:
    bank = Bank()
    digest = digest_of(stage(tmp_path, bank))
    log = tmp_path / "run-1.jsonl"
    code, out, err = cli("approve", str(log), "--digest", digest, "--by", "alice", "--note", "ok")
    assert (code, err) == (EXIT_OK, "")
    assert out.count("\n") == 1
    assert out.startswith(f"recorded: run 'run-1', a0 approved (digest {digest}, by alice, at ")
    assert "next: resume the run with its agent (polyloop.session.run_or_resume)" in out
    before = log.read_bytes()
    again = cli("approve", str(log), "--digest", digest, "--by", "alice")
    assert again[0] == EXIT_OK
    assert log.read_bytes() == before, "the same decision twice is written once"
    _, shown, _ = cli("show", str(log))
    assert "decision on a0 (line 5): approved, by person 'alice' at" in shown
    assert "resume would announce step 0's approved call and execute it" in shown
    assert cli("approvals", str(tmp_path))[1].splitlines() == [
        f"0 calls wait for approval in {tmp_path}"
    ]
    done = resume(tmp_path, bank)
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == [(250, "order 7")]
    assert resume(tmp_path, bank).stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == [(250, "order 7")], "executed exactly once"


def test_reject_then_resume_records_the_rejection(tmp_path: Path) -> None:
    bank = Bank()
    digest = digest_of(stage(tmp_path, bank))
    code, out, err = cli(
        "reject", str(tmp_path), "--digest", digest, "--by", "bob", "--reason", "over the limit"
    )
    assert (code, err) == (EXIT_OK, "")
    assert "a0 rejected" in out
    assert "reason 'over the limit'" in out
    # The directory was named; the line names the run's own log, which show reads alone.
    assert out.rstrip().endswith(f"python -m polyloop show {tmp_path / 'run-1.jsonl'} shows it")
    _, shown, _ = cli("show", str(tmp_path / "run-1.jsonl"))
    assert "decision on a0 (line 5): rejected, by person 'bob'" in shown
    assert "reason: over the limit" in shown
    done = resume(tmp_path, bank)
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == []
    assert done.steps[0].action is None
    log = asyncio.run(JsonlRunStore(directory=tmp_path).read_log("run-1"))
    assert [s.verdict for s in log.settlements] == [SettlementVerdict.REJECTED]


def test_html_shows_the_request_the_decision_and_the_commands(tmp_path: Path) -> None:
    digest = digest_of(stage(tmp_path, Bank()))
    page = tmp_path / "page.html"
    assert cli("html", str(tmp_path / "run-1.jsonl"), "-o", str(page))[0] == EXIT_OK
    text = page.read_text()
    assert f'class="approval-request" data-digest="{digest}"' in text
    assert 'class="awaiting-approval"' in text
    assert "python -m polyloop approve" in text
    cli("approve", str(tmp_path / "run-1.jsonl"), "--digest", digest, "--by", "alice")
    cli("html", str(tmp_path / "run-1.jsonl"), "-o", str(page))
    text = page.read_text()
    assert 'data-verdict="approved"' in text
    assert 'class="awaiting-approval"' not in text


# --------------------------------------------------------------------------- refusals


def test_a_wrong_digest_is_refused(tmp_path: Path) -> None:
    digest = digest_of(stage(tmp_path, Bank()))
    log = tmp_path / "run-1.jsonl"
    err = refused(log, "approve", str(log), "--digest", "sha256:00", "--by", "alice")
    assert err.startswith("polyloop approve: refused [wrong_digest]: ")
    assert digest in err
    assert f"python -m polyloop approvals {tmp_path} prints" in err


def test_a_conflicting_decision_is_refused(tmp_path: Path) -> None:
    digest = digest_of(stage(tmp_path, Bank()))
    log = tmp_path / "run-1.jsonl"
    assert cli("approve", str(log), "--digest", digest, "--by", "alice")[0] == EXIT_OK
    err = refused(log, "reject", str(log), "--digest", digest, "--by", "bob", "--reason", "no")
    assert err.startswith("polyloop reject: refused [conflicting_decision]: ")
    assert "already approved by person 'alice'" in err


def test_a_run_not_awaiting_is_refused(tmp_path: Path) -> None:
    bank = Bank()
    digest = digest_of(stage(tmp_path, bank))
    log = tmp_path / "run-1.jsonl"
    cli("approve", str(log), "--digest", digest, "--by", "alice")
    resume(tmp_path, bank)
    err = refused(log, "approve", str(log), "--digest", digest, "--by", "alice")
    assert err.startswith("polyloop approve: refused [not_awaiting]: ")
    assert "python -m polyloop approvals" in err


def test_an_expired_request_is_refused(tmp_path: Path) -> None:
    digest = digest_of(stage(tmp_path, Bank(), approval_expires_seconds=0.001))
    time.sleep(0.01)
    log = tmp_path / "run-1.jsonl"
    err = refused(log, "approve", str(log), "--digest", digest, "--by", "alice")
    assert err.startswith("polyloop approve: refused [expired]: ")
    assert "records it rejected as expired" in err


def test_no_log_a_held_lease_and_a_corrupt_log_are_refused(tmp_path: Path) -> None:
    digest = digest_of(stage(tmp_path, Bank()))
    log = tmp_path / "run-1.jsonl"
    err = refused(
        log, "approve", str(tmp_path), "--run-id", "nope", "--digest", digest, "--by", "a"
    )
    assert "refused [no_log]" in err
    store = JsonlRunStore(directory=tmp_path)
    lease = asyncio.run(store.acquire_lease("run-1"))
    try:
        err = refused(log, "approve", str(log), "--digest", digest, "--by", "alice")
    finally:
        asyncio.run(lease.release())
    assert "refused [lease_held]" in err
    assert "--lease-wait SECONDS" in err
    with log.open("ab") as file:
        file.write(b'{"record": "nonsense"}\n')
    err = refused(log, "reject", str(log), "--digest", digest, "--by", "b", "--reason", "x")
    assert err.startswith("polyloop reject: refused [corrupt_log]: ")
    assert "line 5" in err
    assert "nothing was written" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--by", " "], "--by needs a name"),
        (["--by", "a", "--lease-wait", "-1"], "--lease-wait must be a number"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    digest = digest_of(stage(tmp_path, Bank()))
    log = tmp_path / "run-1.jsonl"
    assert message in refused(log, "approve", str(log), "--digest", digest, *argv)
    assert "--reason needs a text" in refused(
        log, "reject", str(log), "--digest", digest, "--by", "b", "--reason", " "
    )


# --------------------------------------------------------------------------- escapes


def test_hostile_arguments_print_no_raw_control_character(tmp_path: Path) -> None:
    hostile_dir = tmp_path / "hostile"
    hostile_dir.mkdir()
    digest = digest_of(stage(hostile_dir, Bank(), memo=HOSTILE))
    other = tmp_path / "other"
    other.mkdir()
    stage(other, Bank(), memo=HOSTILE)
    log = hostile_dir / "run-1.jsonl"
    outputs = [
        cli("approvals", str(hostile_dir)),
        cli("approvals", str(hostile_dir), "--json"),
        cli("show", str(log)),
        cli("ls", str(hostile_dir)),
        cli("approve", str(log), "--digest", digest, "--by", HOSTILE, "--note", HOSTILE),
        cli("show", str(log)),
        cli("reject", str(other), "--digest", "sha256:00", "--by", HOSTILE, "--reason", HOSTILE),
    ]
    for code, out, err in outputs:
        assert raw_controls(out) == [], out
        assert raw_controls(err) == [], err
        assert "Traceback" not in err
        assert code in (EXIT_OK, EXIT_BAD_INPUT)
    listed = outputs[0][1]
    assert "control chars escaped" in listed, "the reader is told the text holds escapes"
    (record,) = json.loads(outputs[1][1])
    assert json.loads(record["arguments"])["memo"] == HOSTILE, "--json gives the exact text"
    assert outputs[4][1].startswith("recorded: run 'run-1', a0 approved")
    assert "\\x1b[2J" in outputs[4][1], "the hostile name is shown, escaped"


# --------------------------------------------------------------------------- store failures


def _failing_approve(error: BaseException) -> object:
    async def approve(*args: object, **kwargs: object) -> object:
        raise error

    return approve


def test_a_lost_lease_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease can go between its grant and the write (it expired, another process took the
    run over): the store refused the write, so the line says nothing was written."""
    digest = digest_of(stage(tmp_path, Bank()))
    lost = RunLeaseLostError("the lease on run 'run-1' is no longer held", run_id="run-1", epoch=2)
    monkeypatch.setattr(approvals_module, "approve", _failing_approve(lost))
    err = refused(
        tmp_path / "run-1.jsonl",
        "approve",
        str(tmp_path / "run-1.jsonl"),
        "--digest",
        digest,
        "--by",
        "alice",
    )
    assert err.startswith(
        "polyloop approve: refused [lease_lost]: run 'run-1''s lease was lost before the "
        "decision was written"
    )
    assert "nothing was written" in err


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ("lease", "failed before the decision was written (no space); nothing was written"),
        ("log", "failed before the decision was written (no space); nothing was written"),
        ("settlement", "failed while the decision was written (no space); it may have been"),
    ],
)
def test_a_store_failure_says_whether_the_decision_can_have_been_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: str, words: str
) -> None:
    """``StoreUnavailableError.record`` says where the store failed: taking the lease or
    reading the log (nothing sent) or writing the record (it may be there: look)."""
    digest = digest_of(stage(tmp_path, Bank()))
    failure = StoreUnavailableError("no space", store="JsonlRunStore", record=record)
    monkeypatch.setattr(approvals_module, "approve", _failing_approve(failure))
    log = tmp_path / "run-1.jsonl"
    err = refused(log, "approve", str(log), "--digest", digest, "--by", "alice")
    assert err.startswith(f"polyloop approve: {tmp_path}: the store {words}")
    if record == "settlement":
        assert err.rstrip().endswith(f"python -m polyloop show {log} shows whether it was")


def test_a_log_whose_path_has_a_space_is_named_quoted_in_every_fix(tmp_path: Path) -> None:
    """The fixes are commands to paste: a path with a space must stay one argument."""
    directory = tmp_path / "my runs"
    directory.mkdir()
    stage(directory, Bank())
    log = directory / "run-1.jsonl"
    err = refused(log, "approve", str(log), "--digest", "sha256:" + "0" * 64, "--by", "a")
    assert f"python -m polyloop approvals {shlex.quote(str(directory))}" in err
    err = refused(log, "approve", str(directory), "--run-id", "run-2", "--digest", "d", "--by", "a")
    assert "refused [no_log]" in err
