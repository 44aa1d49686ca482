"""``python -m polyloop approvals``, ``approve``, ``reject`` and ``resolve`` on a ``postgres://``
URL (design 0213, amendment), on the session's throwaway server (``tools/pg_cluster.py``).

A person decides from the command line on the store a fleet shares as on a directory of logs:
the listing prints the commands with the URL and ``--run-id`` (never a password), the command
writes one decision record under the run's lease, and the agent resumed on the same database
acts on it exactly once. A refusal is one line, exit status 2, and writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_postgres_listing import IN_DOUBT, ROOT, cli, url_of, write_both

from polyloop.inspect import EXIT_BAD_INPUT, EXIT_OK
from polyloop.parsers import JsonToolCallParser
from polyloop.session import AgentDefinition, RunRequest, run_or_resume
from polyloop.stores import PostgresRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolContext, ToolRegistry, ToolSpec
from polyloop.types import (
    Context,
    Message,
    ReplayPolicy,
    RunResult,
    SettlementVerdict,
    StopReason,
)

pytestmark = pytest.mark.integration

RUN = "refund-a17"


class Bank:
    """The refund tool's system: what it paid, with the idempotency key."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, int, str | None]] = []

    def registry(self) -> ToolRegistry:
        async def refund(ctx: ToolContext, order: str, amount: int) -> str:
            """Refund an order; amount in EUR."""
            self.refunds.append((order, amount, ctx.idempotency_key))
            return f"refunded {amount} EUR for order {order}"

        return ToolRegistry([ToolSpec.from_function(refund, needs_approval=True)])


def run_on(conninfo: str, bank: Bank) -> RunResult:
    """``run_or_resume`` of the refund run on the database (its own store, opened and closed)."""

    async def go() -> RunResult:
        store = await PostgresRunStore.open(conninfo, pool_size=2)
        try:
            agent = AgentDefinition(
                model_client=ScriptedModelClient(
                    [
                        '{"tool": "refund", "arguments": {"order": "A-17", "amount": 250}}',
                        '{"final_answer": "refunded"}',
                    ]
                ),
                decision_parser=JsonToolCallParser(),
                store=store,
            )
            request = RunRequest(
                run_id=RUN,
                context=Context(goal_level=(Message.user("Refund order A-17."),)),
                model_replay_policy=ReplayPolicy.SAFE,
                tools=bank.registry(),
            )
            return await run_or_resume(agent, request)
        finally:
            await store.close()

    return asyncio.run(go())


def log_bytes(conninfo: str, run_id: str) -> bytes:
    async def go() -> bytes:
        store = await PostgresRunStore.open(conninfo, pool_size=1)
        try:
            return (await store.read_log_bytes([run_id]))[run_id]
        finally:
            await store.close()

    return asyncio.run(go())


def argv_of(command: str, **words: str) -> list[str]:
    """A printed command line as the arguments after ``python -m polyloop``, its
    placeholders filled in."""
    for placeholder, value in words.items():
        command = command.replace(placeholder, shlex.quote(value))
    head = "python -m polyloop "
    assert command.startswith(head), command
    return shlex.split(command[len(head) :])


def refused(conninfo: str, run_id: str, *argv: str) -> str:
    """Run the command; one line on stderr, exit 2, nothing written; the line."""
    before = log_bytes(conninfo, run_id)
    code, out, err = cli(*argv)
    assert (code, out) == (EXIT_BAD_INPUT, ""), err
    assert err.count("\n") == 1, err
    assert log_bytes(conninfo, run_id) == before, "a refused decision writes nothing"
    return err


def test_approve_from_the_listing_then_resume_executes_the_call_once(
    postgres_database: str,
) -> None:
    bank = Bank()
    paused = run_on(postgres_database, bank)
    assert paused.stop_reason is StopReason.AWAITING_APPROVAL
    assert paused.pending_approval is not None
    digest = paused.pending_approval.digest
    url = url_of(postgres_database)
    code, listing, err = cli("approvals", url)
    assert (code, err) == (EXIT_OK, "")
    lines = listing.splitlines()
    assert lines[0] == f"run {RUN}  ({url}/{RUN})"
    approve_line = next(line for line in lines if line.startswith("  approve: "))
    assert approve_line == (
        f"  approve: python -m polyloop approve {url} --run-id {RUN} --digest {digest} --by NAME"
    )
    assert lines[-1] == f"1 call waits for approval in {url}"
    (listed,) = json.loads(cli("approvals", url, "--json")[1])
    assert (listed["run_id"], listed["digest"], listed["tool"]) == (RUN, digest, "refund")

    command = approve_line.removeprefix("  approve: ")
    code, out, err = cli(*argv_of(command, NAME="alice"), "--note", "checked")
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith(f"recorded: run {RUN!r}, a0 approved (digest {digest}, by alice, at ")
    assert out.rstrip().endswith(f"python -m polyloop show {url} --run {RUN} shows it")
    again = cli(*argv_of(command, NAME="alice"))
    assert again[0] == EXIT_OK, "the same decision twice is accepted and written once"
    _, shown, _ = cli("show", url, "--run", RUN)
    assert "decision on a0 (line 5): approved, by person 'alice' at" in shown
    assert cli("approvals", url)[1].splitlines() == [f"0 calls wait for approval in {url}"]

    done = run_on(postgres_database, bank)
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == [("A-17", 250, f"polyloop:r:{RUN}:a0")]
    assert run_on(postgres_database, bank).stop_reason is StopReason.FINAL_ANSWER
    assert len(bank.refunds) == 1, "executed exactly once"


def test_reject_then_resume_never_executes_the_call(postgres_database: str) -> None:
    bank = Bank()
    paused = run_on(postgres_database, bank)
    assert paused.pending_approval is not None
    url = url_of(postgres_database)
    code, out, err = cli(
        "reject",
        url,
        "--run-id",
        RUN,
        "--digest",
        paused.pending_approval.digest,
        "--by",
        "bob",
        "--reason",
        "over the limit",
    )
    assert (code, err) == (EXIT_OK, "")
    assert "a0 rejected" in out
    assert "reason 'over the limit'" in out
    done = run_on(postgres_database, bank)
    assert done.stop_reason is StopReason.FINAL_ANSWER
    assert bank.refunds == []


def test_refusals_on_the_database_are_one_line_and_write_nothing(postgres_database: str) -> None:
    bank = Bank()
    paused = run_on(postgres_database, bank)
    assert paused.pending_approval is not None
    digest = paused.pending_approval.digest
    url = url_of(postgres_database)
    secret = "s3cr%3Dt-pw"  # the server trusts 127.0.0.1: any password connects
    with_password = url.replace("postgres@", f"postgres:{secret}@", 1)
    wrong = refused(
        postgres_database,
        RUN,
        "approve",
        with_password,
        "--run-id",
        RUN,
        "--digest",
        "sha256:" + "0" * 64,
        "--by",
        "alice",
    )
    assert "refused [wrong_digest]" in wrong
    assert f"python -m polyloop approvals {url}" in wrong
    absent = refused(
        postgres_database,
        RUN,
        "approve",
        with_password,
        "--run-id",
        "no-such-run",
        "--digest",
        digest,
        "--by",
        "alice",
    )
    assert "refused [no_log]" in absent
    assert f"python -m polyloop ls {url} lists the runs there" in absent
    for line in (wrong, absent):
        assert "s3cr" not in line
        assert "cr=t" not in line

    async def held() -> str:
        holder = await PostgresRunStore.open(postgres_database, pool_size=2)
        try:
            lease = await holder.acquire_lease(RUN)
            try:
                return await asyncio.to_thread(
                    refused,
                    postgres_database,
                    RUN,
                    "approve",
                    url,
                    "--run-id",
                    RUN,
                    "--digest",
                    digest,
                    "--by",
                    "alice",
                )
            finally:
                await lease.release()
        finally:
            await holder.close()

    assert "refused [lease_held]" in asyncio.run(held())


def test_resolve_a_run_in_doubt_on_the_database(postgres_database: str, tmp_path: Path) -> None:
    """The in-doubt fixture run, written through the store: ``show`` prints the ``resolve``
    commands with the URL, and the printed one records the person's word once."""
    asyncio.run(write_both(postgres_database, tmp_path))
    url = url_of(postgres_database)
    code, shown, _ = cli("show", url, "--run", IN_DOUBT)
    assert code == EXIT_OK
    executed = next(
        line.strip()
        for line in shown.splitlines()
        if "python -m polyloop resolve" in line and "--executed" in line
    )
    assert executed == (
        f"python -m polyloop resolve {url} --run-id {IN_DOUBT} --result-id a3 --executed "
        "--observation TEXT --by NAME"
    )
    before = log_bytes(postgres_database, IN_DOUBT)
    code, out, err = cli(*argv_of(executed, TEXT="it was paid", NAME="carol"))
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith(f"recorded: run {IN_DOUBT!r}, a3 executed (by carol, at ")
    after = log_bytes(postgres_database, IN_DOUBT)
    assert after.startswith(before)
    (added,) = after[len(before) :].splitlines()
    record = json.loads(added)
    assert (record["record"], record["verdict"], record["by"], record["result_id"]) == (
        "settlement",
        SettlementVerdict.EXECUTED.value,
        "carol",
        "a3",
    )
    again = refused(
        postgres_database, IN_DOUBT, *argv_of(executed, TEXT="it was paid", NAME="carol")
    )
    assert "refused [nothing_in_doubt]" in again  # settled: a second word is refused
    assert f"python -m polyloop show {url} --run {IN_DOUBT} says what resume will do" in again


def _connections(conninfo: str) -> int:
    """Backends connected to the test's database, this query's own excluded."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


CHATTY_APPROVE = """
import logging, sys
from polyloop.inspect import _approvals, main

real = _approvals.approve

async def chatty(*args, **kwargs):
    logging.getLogger("psycopg.pool").warning("pool chatter: discarding a connection")
    logging.getLogger("polyloop.stores.postgres").warning("store chatter: lease release")
    return await real(*args, **kwargs)

_approvals.approve = chatty
sys.exit(main(sys.argv[1:]))
"""


def test_every_command_closes_the_store_and_keeps_the_drivers_log_off_stderr(
    postgres_database: str,
) -> None:
    """After a listing, a refusal or a decision no connection of the command is left open;
    what the pool or the store logs meanwhile never reaches the terminal (the outcome is the
    command's one line): a process as a person runs it, whose approve logs as the store can."""
    paused = run_on(postgres_database, Bank())
    assert paused.pending_approval is not None
    url = url_of(postgres_database)
    decide = ["--run-id", RUN, "--digest", paused.pending_approval.digest, "--by", "alice"]
    assert cli("approvals", url)[0] == EXIT_OK
    wrong = [*decide[:2], "--digest", "sha256:" + "0" * 64, *decide[4:]]
    assert "refused [wrong_digest]" in refused(postgres_database, RUN, "approve", url, *wrong)
    assert _connections(postgres_database) == 0
    done = subprocess.run(
        [sys.executable, "-c", CHATTY_APPROVE, "approve", url, *decide],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert (done.returncode, done.stderr) == (EXIT_OK, ""), done.stderr
    assert done.stdout.startswith(f"recorded: run {RUN!r}, a0 approved")
    assert _connections(postgres_database) == 0
