"""Helpers of the approval property test (issue 22): the SIGKILLable worker, the ledger, and
the judge that compares the ledger with the decisions in the logs.

``Workers`` starts ``_approval_child.py`` by its file path as a zygote and keeps one forked
worker alive at a time; ``call`` sends a command and, when told, SIGKILLs the worker a given
time after it was sent if the reply has not come, then forks the next worker. A kill
interrupts every command in flight on that worker (their reply is ``None``).

``judge`` checks one run's log against its spec, the ledger and the decisions the test sent;
it returns the run's figures and raises ``AssertionError`` naming the run on a breach.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _approval_child import (
    REJECTION,
    STARTUP_SECONDS,
    TOOLS,
    canonical,
    digest_of,
    needs_approval,
    observation_of,
)

from polyloop.ports import RunLog
from polyloop.session import check_log, stop_reason_of
from polyloop.types import (
    ReplayPolicy,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StopReason,
)

CHILD = Path(__file__).with_name("_approval_child.py")
REPLY_SECONDS = 60.0
"""An unkilled command that takes longer than this is a hang: the test fails."""


@dataclass
class Sent:
    """A decision command the test sent (``by`` is unique per command): ``acked`` when its
    reply came back (it is durable), ``refused`` when the reply was a refusal and ``repeat``
    when it repeated a decision already acked (either way it must have written nothing)."""

    run_id: str
    by: str
    verdict: str
    digest: str
    result_id: str
    acked: bool = False
    refused: bool = False
    repeat: bool = False


class WorkerDied(AssertionError):
    pass


class Workers:
    """The zygote and its current worker for one store."""

    def __init__(self, tmp: Path, kind: str, location: str, ledger: Path) -> None:
        self.tmp = tmp
        self.kind = kind
        self.location = location
        self.ledger = ledger
        # A Unix socket's path has at most 107 bytes: a short directory of its own, not tmp.
        self._socket_dir = tempfile.mkdtemp(prefix="polyloop-approvals-", dir="/tmp")
        self.socket_path = os.path.join(self._socket_dir, "worker.sock")
        self.kills = 0
        self.generation = 0
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, asyncio.Future[dict[str, Any] | None]]] = {}
        self._connections: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )
        self._ready = asyncio.Event()
        self._killing = False
        self._pid = 0
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._stderr = (tmp / f"{kind}-worker.stderr").open("wb")
        self._zygote: asyncio.subprocess.Process | None = None
        self._server: asyncio.Server | None = None
        self.fatal: str | None = None

    def stderr_text(self) -> str:
        self._stderr.flush()
        return (self.tmp / f"{self.kind}-worker.stderr").read_text("utf-8", errors="replace")

    async def __aenter__(self) -> Workers:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._server = await asyncio.start_unix_server(self._accepted, path=self.socket_path)
        self._zygote = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CHILD),
            self.socket_path,
            self.kind,
            self.location,
            str(self.ledger),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        assert self._zygote.stdout is not None
        line = await asyncio.wait_for(self._zygote.stdout.readline(), STARTUP_SECONDS)
        assert line == b"ZYGOTE\n", f"{line!r}\n{self.stderr_text()}"
        await self._spawn()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._reader_task, 10)
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
        if self._zygote is not None:
            assert self._zygote.stdin is not None
            self._zygote.stdin.close()
            try:
                await asyncio.wait_for(self._zygote.wait(), 10)
            except TimeoutError:
                self._zygote.kill()
                await self._zygote.wait()
        if self._server is not None:
            self._server.close()
        self._stderr.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._connections.put((reader, writer))

    async def _spawn(self) -> None:
        assert self._zygote is not None
        assert self._zygote.stdin is not None
        assert self._zygote.stdout is not None
        self._zygote.stdin.write(b"spawn\n")
        await self._zygote.stdin.drain()
        line = await asyncio.wait_for(self._zygote.stdout.readline(), STARTUP_SECONDS)
        assert line.startswith(b"PID "), f"{line!r}\n{self.stderr_text()}"
        pid = int(line.split()[1])
        try:
            reader, writer = await asyncio.wait_for(self._connections.get(), STARTUP_SECONDS)
            ready = await asyncio.wait_for(reader.readline(), STARTUP_SECONDS)
        except TimeoutError:
            raise WorkerDied(f"worker {pid} did not start\n{self.stderr_text()}") from None
        assert ready == f"READY {pid}\n".encode(), f"{ready!r}\n{self.stderr_text()}"
        self._pid = pid
        self._writer = writer
        self.generation += 1
        self._reader_task = asyncio.create_task(self._read(reader, self.generation))
        self._ready.set()

    async def _read(self, reader: asyncio.StreamReader, generation: int) -> None:
        # A killed worker's socket is reset when it still had commands unread.
        with contextlib.suppress(ConnectionResetError):
            while line := await reader.readline():
                if not line.endswith(b"\n"):
                    break  # the worker died in the middle of a reply: it never came
                reply = json.loads(line)
                entry = self._pending.pop(reply["id"], None)
                if entry is not None and not entry[1].done():
                    entry[1].set_result(reply)
        # EOF: the worker is gone. Every command still in flight on it was interrupted by the
        # kill; a death nobody asked for fails them instead (and every later call).
        closing = self._writer is not None and self._writer.is_closing()
        if not self._killing and not closing:
            self.fatal = f"worker {self._pid} died unkilled\n{self.stderr_text()}"
        for number, (gen, future) in list(self._pending.items()):
            if gen == generation:
                del self._pending[number]
                if future.done():
                    continue
                if self.fatal:
                    future.set_exception(WorkerDied(self.fatal))
                else:
                    future.set_result(None)

    async def call(
        self, command: Mapping[str, Any], kill_after: float | None = None
    ) -> dict[str, Any] | None:
        """Send ``command``; its reply, or ``None`` when the worker was killed before it came
        (by this call's ``kill_after`` or by another command's)."""
        if self.fatal:
            raise WorkerDied(self.fatal)
        await self._ready.wait()
        number = next(self._ids)
        generation = self.generation
        future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._pending[number] = (generation, future)
        assert self._writer is not None
        self._writer.write((json.dumps({**command, "id": number}) + "\n").encode())
        timeout = REPLY_SECONDS if kill_after is None else kill_after
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            if kill_after is None:
                raise WorkerDied(f"no reply to {command} in {REPLY_SECONDS} s") from None
        await self.kill(generation)
        return await asyncio.wait_for(future, REPLY_SECONDS)

    async def kill(self, generation: int) -> None:
        """SIGKILL the worker of ``generation`` (if it is still the current one), wait until it
        is gone, and fork the next."""
        if generation != self.generation or not self._ready.is_set():
            return
        self._ready.clear()
        self._killing = True
        os.kill(self._pid, signal.SIGKILL)
        self.kills += 1
        assert self._reader_task is not None
        await asyncio.wait_for(self._reader_task, REPLY_SECONDS)
        assert self._writer is not None
        self._writer.close()
        self._killing = False
        await self._spawn()


def read_ledger(path: Path, *, strict: bool) -> list[dict[str, Any]]:
    """The ledger's entries; while workers still append, a last line without its newline is
    one being written (``strict`` at the end: every line is whole)."""
    if not path.exists():
        return []
    text = path.read_text("utf-8")
    lines = text.split("\n")
    if lines[-1] and not strict:
        lines = lines[:-1]
    assert not lines[-1] or not strict, f"the ledger ends in a torn line {lines[-1]!r}"
    return [json.loads(line) for line in lines if line]


@dataclass
class RunFigures:
    executions: int = 0
    approved_executions: int = 0
    never_executions: int = 0
    requests: int = 0
    decisions: collections.Counter[str] = field(default_factory=collections.Counter)
    finished: int = 0
    waiting: int = 0
    in_doubt: int = 0


def judge(
    log: RunLog,
    spec: Mapping[str, Any],
    ledger: list[dict[str, Any]],
    sent: Mapping[str, Sent],
) -> RunFigures:
    """Assert the issue's promises for one run; its figures.

    ``ledger`` holds the run's executions, ``sent`` the decision commands the test sent on
    this run, by their ``by`` (unique per command).
    """
    run_id: str = spec["run_id"]
    calls: list[tuple[str, dict[str, Any]]] = [(t, a) for t, a in spec["calls"]]
    where = f"run {run_id} ({spec['calls']}, expires {spec['expires']})"
    figures = RunFigures()
    breach = check_log(log, run_id)
    assert breach is None, f"{where}: check_log: {breach}"

    # Requests: one per call that needs approval and got that far, naming exactly that call.
    requests = {r.result_id: r for r in log.approval_requests}
    assert len(requests) == len(log.approval_requests), f"{where}: two requests for one call"
    for request in log.approval_requests:
        step = request.step_idx
        assert request.result_id == f"a{step}", f"{where}: {request}"
        assert step < len(calls), f"{where}: a request for the final answer: {request}"
        tool, arguments = calls[step]
        assert needs_approval(tool, arguments), f"{where}: a request nobody asked for: {request}"
        assert request.tool == tool, f"{where}: {request}"
        assert request.arguments == canonical(arguments), f"{where}: {request}"
        assert request.digest == digest_of(run_id, request.result_id, tool, arguments), where
        assert (request.expires_at is not None) == (spec["expires"] is not None), where
        figures.requests += 1

    # Decisions: each bound to its request's call; a person's traced to the command that sent
    # it, with that command's verdict and digest; an expiry only where requests expire.
    decisions: dict[str, Settlement] = {}
    for settlement in log.settlements:
        if not settlement.is_approval_decision:
            continue
        assert settlement.result_id not in decisions, f"{where}: two decisions {settlement}"
        decisions[settlement.result_id] = settlement
        asked = requests.get(settlement.result_id)
        assert asked is not None, f"{where}: a decision without a request: {settlement}"
        assert settlement.digest == asked.digest, f"{where}: {settlement} vs {asked}"
        tool, arguments = calls[asked.step_idx]
        assert settlement.digest == digest_of(run_id, settlement.result_id, tool, arguments), (
            f"{where}: {settlement}"
        )
        if settlement.source is SettlementSource.EXPIRY:
            assert spec["expires"] is not None, f"{where}: expired, with no expiry: {settlement}"
            assert settlement.verdict is SettlementVerdict.REJECTED
            assert settlement.note == "expired"
            figures.decisions["expired"] += 1
            continue
        assert settlement.source is SettlementSource.PERSON, f"{where}: {settlement}"
        command = sent.get(settlement.by)
        assert command is not None, f"{where}: a decision no command sent: {settlement}"
        assert not command.repeat, f"{where}: a repeated decision was written: {settlement}"
        assert not command.refused, f"{where}: a refused decision was written: {settlement}"
        assert (command.verdict, command.digest, command.result_id) == (
            settlement.verdict.value,
            settlement.digest,
            settlement.result_id,
        ), f"{where}: {settlement} is not what {command} sent"
        figures.decisions[settlement.verdict.value] += 1
    for by, command in sent.items():
        if command.acked and not command.repeat:
            decision = decisions.get(command.result_id)
            on_record = None if decision is None else decision.by
            assert on_record == by, f"{where}: the acknowledged {command} is not on record"

    # Executions: only of approved calls, never of a rejected or undecided one, each exactly
    # the call the log's request (and decision) names, a NEVER tool at most once per step.
    per_step = collections.Counter(entry["step"] for entry in ledger)
    for entry in ledger:
        step = entry["step"]
        assert entry["run"] == run_id
        assert step < len(calls), f"{where}: executed at step {step}: {entry}"
        tool, arguments = calls[step]
        assert (entry["tool"], entry["arguments"]) == (tool, canonical(arguments)), (
            f"{where}: step {step} executed {entry}, its call is {tool} {arguments}"
        )
        policy = TOOLS[tool][0]
        if policy is ReplayPolicy.NEVER:
            assert per_step[step] == 1, f"{where}: NEVER tool {tool} ran {per_step[step]} times"
        figures.executions += 1
        figures.never_executions += policy is ReplayPolicy.NEVER
        if needs_approval(tool, arguments):
            decision = decisions.get(f"a{step}")
            assert decision is not None, f"{where}: {entry} executed without a decision"
            assert decision.verdict is SettlementVerdict.APPROVED, (
                f"{where}: {entry} executed, but the call was {decision.verdict.value}"
                f" ({decision.source.value} {decision.by!r}: {decision.note})"
            )
            assert decision.digest == digest_of(
                run_id, f"a{step}", entry["tool"], json.loads(entry["arguments"])
            )
            figures.approved_executions += 1
        else:
            assert f"a{step}" not in requests, f"{where}: {entry}"

    # The steps on record: a call that needs approval has its request; a rejected call's step
    # has no action and the rejection as its observation; an executed call's, the tool's.
    for completed in log.steps:
        idx = completed.step.step_idx
        if idx >= len(calls):
            continue
        tool, arguments = calls[idx]
        decision = decisions.get(f"a{idx}")
        if needs_approval(tool, arguments):
            assert f"a{idx}" in requests, f"{where}: step {idx} ran with no request"
            assert decision is not None, f"{where}: step {idx} done without a decision"
        if decision is not None and decision.verdict is SettlementVerdict.REJECTED:
            reason = (
                "the request for approval expired before anyone decided"
                if decision.source is SettlementSource.EXPIRY
                else f"a person rejected this call: {decision.note}"
            )
            assert completed.step.action is None, f"{where}: step {idx} of a rejected call"
            assert completed.action_outcome is None, f"{where}: step {idx} has an outcome"
            assert completed.step.observation == REJECTION.replace("{reason}", reason), (
                f"{where}: step {idx}: {completed.step.observation!r}"
            )
            assert per_step[idx] == 0
        else:
            assert completed.step.observation == observation_of(tool, arguments), (
                f"{where}: step {idx}: {completed.step.observation!r}"
            )
            assert per_step[idx] >= 1, f"{where}: step {idx} recorded, never executed"

    if log.finished is not None:
        result = log.finished.result
        assert result.stop_reason is StopReason.FINAL_ANSWER, f"{where}: {result.stop_reason}"
        assert result.final_answer == "done"
        assert len(result.steps) == len(calls) + 1, where
        figures.finished += 1
    else:
        stopped = stop_reason_of(log, run_id)
        figures.waiting += stopped is StopReason.AWAITING_APPROVAL
        figures.in_doubt += stopped is StopReason.RESUME_STATE_UNKNOWN
    return figures
