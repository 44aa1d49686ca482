"""``postgres://`` targets of ``python -m polyloop`` without a server (design 0213): a bad URL,
a missing driver and a refused command are one line and exit status 2, and nothing printed
holds the password. (``tests/integration/test_postgres_listing.py`` reads a real server.)"""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path

import pytest

from polyloop.inspect import EXIT_BAD_INPUT, main
from polyloop.inspect._load import load_file
from polyloop.inspect._postgres import command_url, display_url, is_postgres_url, store_url_view
from polyloop.inspect._view import ApprovalView, Awaiting

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-0.1.0"
SECRET = "pa55-w0rd"


def _bad(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert main(list(argv), out=out, err=err) == EXIT_BAD_INPUT
    assert out.getvalue() == ""
    assert len(err.getvalue().splitlines()) == 1, err.getvalue()
    assert SECRET not in err.getvalue()
    return err.getvalue()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"postgres://me:{SECRET}@db.example:notaport/runs", "the port 'notaport' is not"),
        (f"postgres://me:{SECRET}@db.example:70000/runs", "the port '70000' is not"),
        (f"postgresql://me:{SECRET}%zz@db.example/runs", "'%' that starts no %XX escape"),
        (f"postgres://me@db.example/runs?password={SECRET}&x", "query is not key=value"),
        ("postgres://me@db.example/runs?connect_timeout=soon", "connect_timeout must be"),
        (f"postgres://me:{SECRET}@db.example/runs#frag", "has no '#' part"),
    ],
)
def test_a_bad_url_is_one_line_naming_the_part(url: str, words: str) -> None:
    for command in (["ls"], ["verify"], ["show"]):
        assert words in _bad(*command, url)


def test_without_the_driver_a_postgres_url_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    line = _bad("ls", f"postgres://me:{SECRET}@127.0.0.1:1/runs")
    assert "pip install 'polyloop[postgres]'" in line


@pytest.mark.parametrize("command", ["resolve", "approve", "reject"])
def test_the_commands_that_write_need_the_run_id_and_a_good_url_before_connecting(
    command: str,
) -> None:
    """A database holds many runs: without ``--run-id`` the command names the flag and the
    listing; a bad URL is refused as ``ls`` refuses it. Neither tries a connection (the host
    does not exist) and neither shows the password."""
    extra = {
        "resolve": ["--result-id", "a1", "--not-executed"],
        "approve": ["--digest", "d"],
        "reject": ["--digest", "d", "--reason", "no"],
    }[command]
    line = _bad(command, f"postgres://me:{SECRET}@nowhere.invalid/db", *extra, "--by", "me")
    assert line == (
        f"polyloop {command}: postgres://me@nowhere.invalid/db: a PostgreSQL store holds many "
        "runs; name the run with --run-id RUN (python -m polyloop ls "
        "postgres://me@nowhere.invalid/db lists them)\n"
    )
    bad_port = f"postgres://me:{SECRET}@nowhere.invalid:70000/db"
    line = _bad(command, bad_port, *extra, "--by", "me", "--run-id", "r1")
    assert "the port '70000' is not" in line


def test_display_url_keeps_where_and_drops_every_secret() -> None:
    assert display_url(f"PostgreSQL://me:{SECRET}@h1:5432,h2/db?password={SECRET}&sslmode=x") == (
        "postgresql://me@h1:5432,h2/db"
    )
    assert display_url("postgres://") == "postgres://"
    assert display_url("postgres:///db") == "postgres:///db"
    assert is_postgres_url("POSTGRES://h")
    assert not is_postgres_url("runs/postgres.jsonl")


def _request() -> ApprovalView:
    return ApprovalView(
        line=3,
        step_idx=1,
        result_id="a1",
        tool="refund",
        tool_call_id=None,
        arguments="{}",
        digest="sha256:abc",
        requested_at="2026-01-01T00:00:00Z",
        expires_at=None,
    )


def test_a_run_awaiting_approval_in_the_database_names_the_commands_with_the_url() -> None:
    view = load_file(FIXTURES / "r1-total.jsonl")
    waiting = dataclasses.replace(
        view, awaiting=Awaiting(request=_request(), commands=("approve x", "reject x"))
    )
    shown = store_url_view(waiting, "postgresql://me@h/db")
    assert shown.awaiting is not None
    assert shown.awaiting.commands == (
        "python -m polyloop approve postgresql://me@h/db --run-id r1-total --digest sha256:abc "
        "--by NAME",
        "python -m polyloop reject postgresql://me@h/db --run-id r1-total --digest sha256:abc "
        "--by NAME --reason TEXT",
    )
    assert shown.awaiting.note == ""
    assert store_url_view(view, "postgresql://me@h/db") is view  # nothing to decide: as it was


def test_every_written_password_is_scrubbed_from_an_error_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's words may quote the connection string: no password form survives."""
    from polyloop.inspect._postgres import scrub

    monkeypatch.setenv("PGPASSWORD", "env-secret")
    url = "postgres://me:p%40ss-1@h/db?password=q%3Dss-2&sslmode=require"
    said = "bad: p%40ss-1 p@ss-1 q%3Dss-2 q=ss-2 password=q%3Dss-2 env-secret"
    scrubbed = scrub(said, url)
    for secret in ("ss-1", "ss-2", "env-secret"):
        assert secret not in scrubbed
    assert scrubbed.startswith("bad: ***")


def test_a_printed_command_keeps_the_query_but_its_secrets() -> None:
    """``host``, ``port``, ``sslmode`` decide which server a command reaches and how: the
    printed commands keep them (as written), never ``password`` or ``sslpassword``."""
    url = (
        f"postgresql://me:{SECRET}@/runs?host=db.internal&password={SECRET}&port=6432"
        f"&sslpassword={SECRET}&sslmode=require"
    )
    assert command_url(url) == "postgresql://me@/runs?host=db.internal&port=6432&sslmode=require"
    assert command_url(f"postgres://me:{SECRET}@h/db") == "postgres://me@h/db"
    line = _bad("approve", url, "--digest", "d", "--by", "me")
    shown = "postgresql://me@/runs?host=db.internal&port=6432&sslmode=require"
    assert f"python -m polyloop ls '{shown}' lists them" in line  # quoted: '&' and '?'
    view = dataclasses.replace(
        load_file(FIXTURES / "r1-total.jsonl"),
        awaiting=Awaiting(request=_request(), commands=("approve x", "reject x")),
    )
    awaiting = store_url_view(view, command_url(url)).awaiting
    assert awaiting is not None
    assert awaiting.commands[0] == (
        f"python -m polyloop approve '{shown}' --run-id r1-total --digest sha256:abc --by NAME"
    )


def test_an_environment_password_blanks_only_the_drivers_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PGPASSWORD`` may equal a user name (``postgres``): the URL the line names stays
    readable; only what the driver said is scrubbed."""
    monkeypatch.setenv("PGPASSWORD", "me")
    line = _bad("approvals", "postgres://me@127.0.0.1:1/db")
    assert line.startswith("polyloop approvals: postgres://me@127.0.0.1:1/db: cannot connect")
