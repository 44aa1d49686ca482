"""Approval property test (issue 22 acceptance): random sequences of pause / approve / reject /
kill / resume across processes, on JSONL and on PostgreSQL.

Each sequence is one run of 1 to 4 tool calls and a final answer, its calls drawn from a seed:
``refund`` (``NEVER``; needs approval above 100), ``delete`` (``NEVER``; always needs it),
``deploy`` (``SAFE``; needs it for ``prod``), ``note`` (``NEVER``) and ``lookup`` (``SAFE``),
a few runs with an approval expiry. Every call's arguments carry its index ``n``, so no two
calls of a run are identical (a digest also covers the run id and the call's result id, so a
decision binds to one call of one run even when the model repeats a call; design 0210). The
test drives it through a worker process (``_approval_child.py``, forked from a zygote
started by its file path, one per store) with commands over a socket: ``run_or_resume``,
``approve``, ``reject``, and ``resolve`` for an
execution a kill left in doubt (as an operator would: is it in the ledger?). At each pause the
sequence approves, rejects, resumes while still waiting, names a wrong digest (another call's,
or an earlier step's decision retried late), waits past the expiry, or abandons the run; after a
decision it sometimes repeats it or contradicts it, and after the end retries it. Any
command may be armed to SIGKILL the worker at a random moment before its reply (which
interrupts every command in flight on it); the next worker takes over from the logs alone.
Sequences overlap (``CONCURRENCY`` at a time), so a kill lands in every phase of a step.

Every tool execution is appended, fsynced, to a ledger with its run, step and arguments. The
judge (``_approval_property_support.judge``) compares the ledger with the decisions in the logs:
every execution of a call that needs approval has an ``approved`` decision whose digest is the
call's (computed here: ``sha256`` of the tool, a newline and the canonical arguments); no
execution of a rejected, expired or undecided call; a ``NEVER`` tool at most once per run and
step; every request names the call of its step, every decision its request's digest, and every
person's decision is the one the test's command sent (verdict and digest), an acknowledged one
always on record, a refused or repeated one never; every log passes ``check_log``. The driver
checks on the way that a run still waiting returns the same pending call without calling the
model, and that a wrong digest, a late decision, a conflicting one and one after the end are
refused. Kills,
approvals, rejections and expiries are counted and must all have happened. Seeded
(``POLYLOOP_APPROVAL_SEED`` overrides it); its figures are printed (and recorded in
``research-wiki/reference/reliability.md``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from _approval_child import (
    REJECTION,
    canonical,
    digest_of,
    needs_approval,
    observation_of,
)
from _approval_property_support import Sent, Workers, judge, read_ledger

from polyloop.stores import JsonlRunStore, PostgresRunStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = int(os.environ.get("POLYLOOP_APPROVAL_SEED", "2222"))
SEQUENCES = {"jsonl": 500, "postgres": 500}
assert sum(SEQUENCES.values()) >= 1000, "the issue asks for at least 1,000 sequences"
CONCURRENCY = 8
"""Sequences in flight at once (a kill interrupts every command in flight)."""
P_KILL = 0.04
"""The chance that a command is armed to SIGKILL the worker before its reply."""
MAX_OPS = 30
EXPIRES_SECONDS = 0.3
P_EXPIRING = 0.1
AWAITING = "awaiting_approval"
EXPIRED_TEXT = REJECTION.replace(
    "{reason}", "the request for approval expired before anyone decided"
)


def make_spec(rng: random.Random, run_id: str) -> dict[str, Any]:
    """A run: 1 to 4 calls (most runs short), each a tool and its arguments."""
    calls: list[list[Any]] = []
    for n in range(rng.choice([1, 1, 2, 2, 2, 3, 3, 4])):
        tool = rng.choices(["refund", "delete", "deploy", "note", "lookup"], [5, 2, 2, 1, 1])[0]
        values: dict[str, dict[str, Any]] = {
            "refund": {"amount": rng.choice([40, 100, 101, 250, 900])},
            "delete": {"target": rng.choice(["users", "backups", "logs"])},
            "deploy": {"env": rng.choice(["prod", "prod", "staging"])},
            "note": {"text": rng.choice(["hello", "naïve ✓", "a\nb"])},
            "lookup": {"q": rng.choice(["x", "y"])},
        }
        calls.append([tool, {"n": n, **values[tool]}])
    expires = EXPIRES_SECONDS if rng.random() < P_EXPIRING else None
    return {"run_id": run_id, "calls": calls, "expires": expires}


@dataclasses.dataclass
class Figures:
    sequences: int = 0
    ops: int = 0
    interrupted: int = 0
    killed_sequences: int = 0
    transient: int = 0
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


class Bench:
    """One store's workers, figures, and what every sequence sent."""

    def __init__(self, kind: str, workers: Workers) -> None:
        self.kind = kind
        self.workers = workers
        self.figures = Figures()
        self.specs: dict[str, dict[str, Any]] = {}
        self.sent: dict[str, dict[str, Sent]] = {}
        # How long each kind of command takes here (updated from the unkilled ones), so that
        # an armed kill is drawn within a command's lifetime, whatever the machine's load.
        self.pace: dict[str, float] = collections.defaultdict(lambda: 0.05)

    def observe(self, op: str, seconds: float) -> None:
        self.pace[op] = 0.8 * self.pace[op] + 0.2 * seconds


class Sequence:
    """One random sequence: one run driven to its end (or abandoned while it waits)."""

    def __init__(self, bench: Bench, index: int) -> None:
        self.bench = bench
        self.rng = random.Random(f"{SEED}-{bench.kind}-{index}")
        self.spec = make_spec(self.rng, f"{bench.kind[:2]}{index}")
        self.run_id: str = self.spec["run_id"]
        self.calls: list[list[Any]] = self.spec["calls"]
        self.expiring = self.spec["expires"] is not None
        self.sent: dict[str, Sent] = {}
        bench.specs[self.run_id] = self.spec
        bench.sent[self.run_id] = self.sent
        self.counts = bench.figures.counts
        self.ops = 0
        self.killed = False

    def fail(self, message: str) -> None:
        pytest.fail(f"run {self.run_id} {self.spec}: {message}", pytrace=False)

    # ------------------------------------------------------------------ commands

    async def send(self, command: dict[str, Any]) -> dict[str, Any] | None:
        """The reply (``ok`` or ``error``); None when a kill interrupted the command (or the
        run's lease was still held, or was lost: as good as a kill, nothing more written)."""
        self.ops += 1
        self.bench.figures.ops += 1
        op = command["op"]
        kill_after = None
        if self.rng.random() < P_KILL:
            kill_after = self.rng.uniform(0.0, 1.3 * self.bench.pace[op])
        began = time.monotonic()
        reply = await self.bench.workers.call(command, kill_after)
        if reply is None:
            self.bench.figures.interrupted += 1
            self.killed = True
            return None
        self.bench.observe(op, time.monotonic() - began)
        if reply.get("error") in ("RunLeaseHeldError", "RunLeaseLostError"):
            self.bench.figures.transient += 1
            return None
        return reply

    def ok(self, reply: dict[str, Any], what: str) -> dict[str, Any]:
        if "error" in reply:
            self.fail(f"{what}: {reply['error']} ({reply['reason']}): {reply['message']}")
        result: dict[str, Any] = reply["ok"]
        return result

    def refused(self, reply: dict[str, Any], sent: Sent, reasons: set[str], what: str) -> None:
        if reply.get("error") != "ResolutionError" or reply["reason"] not in reasons:
            self.fail(f"{what}: expected a refusal {sorted(reasons)}, got {reply}")
        sent.refused = True
        self.counts[f"refused: {reply['reason']}"] += 1

    async def decide(
        self, verdict: str, pending: dict[str, Any], *, digest: str | None = None
    ) -> tuple[Sent, dict[str, Any] | None]:
        """Send ``approve`` or ``reject`` (``verdict``) on ``pending``, or on ``digest``."""
        by = f"{self.run_id}/{self.ops}"
        sent = Sent(
            self.run_id,
            by,
            verdict,
            pending["digest"] if digest is None else digest,
            pending["result_id"],
        )
        self.sent[by] = sent
        command: dict[str, Any] = {"run_id": self.run_id, "digest": sent.digest, "by": by}
        if verdict == "rejected":
            command.update(op="reject", reason=f"no, says {by}")
        else:
            command.update(op="approve", note=f"yes, says {by}")
        reply = await self.send(command)
        if reply is not None and "ok" in reply:
            sent.acked = True
        return sent, reply

    def check_pending(self, result: dict[str, Any]) -> dict[str, Any]:
        """The pending call of an ``AWAITING_APPROVAL`` result, checked against the spec."""
        pending: dict[str, Any] | None = result["pending"]
        if pending is None:
            self.fail(f"awaiting approval with no pending call: {result}")
        assert pending is not None
        step = pending["step_idx"]
        if step != result["steps"] or step >= len(self.calls):
            self.fail(f"the pending call {pending} is not the open step's ({result['steps']})")
        tool, arguments = self.calls[step]
        expected = (
            f"a{step}",
            tool,
            canonical(arguments),
            digest_of(self.run_id, f"a{step}", tool, arguments),
        )
        got = (pending["result_id"], pending["tool"], pending["arguments"], pending["digest"])
        if got != expected or not needs_approval(tool, arguments):
            self.fail(f"the pending call {got} is not step {step}'s {expected}")
        if (pending["expires_at"] is not None) != self.expiring:
            self.fail(f"expiry {pending['expires_at']} for a run with {self.spec['expires']}")
        return pending

    # ------------------------------------------------------------------ the sequence

    async def drive(self) -> None:
        pending: dict[str, Any] | None = None  # the call the run waits on, as last reported
        decided: Sent | None = None  # the acknowledged decision on it
        previous: Sent | None = None  # the last acknowledged decision, on any step
        decided_reply: dict[str, Any] = {}
        asked_at = 0.0
        expect: tuple[str, int] | None = None  # what the next result's step must read
        while self.ops < MAX_OPS:
            if pending is not None and decided is None:
                # ---------------------------------------------- the run waits: decide
                roll = self.rng.random()
                if roll < 0.05:
                    self.counts["abandoned while waiting"] += 1
                    return
                if self.expiring and roll < 0.45:
                    # Wait past the expiry: a decision now is refused as late, and the next
                    # resume rejects the call as expired.
                    late = asked_at + EXPIRES_SECONDS + 0.05 - time.monotonic()
                    await asyncio.sleep(max(0.0, late))
                    sent, reply = await self.decide(self.rng.choice(VERDICTS), pending)
                    if reply is not None:
                        self.refused(reply, sent, {"expired"}, "a decision after the expiry")
                        expect = (EXPIRED_TEXT, pending["step_idx"])
                    pending = None
                    continue
                if roll < 0.15:
                    # Resume while it waits: the same pending call, and no model call.
                    reply = await self.send(RUN | {"spec": self.spec})
                    if reply is None:
                        pending = None
                        continue
                    result = self.ok(reply, "resume of a waiting run")
                    if result["stop_reason"] == AWAITING and result["pending"] == pending:
                        if result["model_calls"] != 0:
                            self.fail(f"a waiting run called the model: {result}")
                        self.counts["waiting resumes"] += 1
                        continue
                    if not self.expiring:
                        self.fail(f"resumed while waiting on {pending}: {result}")
                    pending = None  # it expired meanwhile and went on: find out where
                    continue
                if roll < 0.22:
                    # A digest that is not the pending call's: another call's, or an earlier
                    # step's decision retried late. Refused, nothing written.
                    if previous is not None and self.rng.random() < 0.5:
                        verdict, other = previous.verdict, previous.digest
                        self.counts["earlier decisions retried"] += 1
                    else:
                        tool, arguments = self.calls[pending["step_idx"]]
                        other = digest_of(
                            self.run_id,
                            f"a{pending['step_idx']}",
                            tool,
                            {**arguments, "n": arguments["n"] + 100},
                        )
                        verdict = self.rng.choice(VERDICTS)
                    sent, reply = await self.decide(verdict, pending, digest=other)
                    if reply is None:
                        pending = None
                        continue
                    self.refused(reply, sent, {"wrong_digest"}, "a wrong digest")
                    continue
                verdict = "approved" if roll < 0.62 else "rejected"
                sent, reply = await self.decide(verdict, pending)
                if reply is None:
                    pending = None
                    continue
                if "error" in reply and self.expiring:
                    self.refused(reply, sent, {"expired"}, "a decision just before the expiry")
                    pending = None
                    continue
                decision = self.ok(reply, f"{verdict} {pending['digest']}")
                bound = (decision["verdict"], decision["digest"], decision["result_id"])
                if bound != (verdict, pending["digest"], pending["result_id"]):
                    self.fail(f"{verdict} answered {decision}")
                self.counts[verdict] += 1
                decided = previous = sent
                decided_reply = decision
                step = pending["step_idx"]
                tool, arguments = self.calls[step]
                expect = (
                    (
                        observation_of(tool, arguments)
                        if verdict == "approved"
                        else REJECTION.replace(
                            "{reason}", f"a person rejected this call: no, says {sent.by}"
                        )
                    ),
                    step,
                )
                continue

            if decided is not None and pending is not None and self.rng.random() < 0.25:
                # ---------------------------------------------- decided: say it again
                if self.rng.random() < 0.5:
                    # The same decision again: accepted once, then a no-op answering it.
                    sent, reply = await self.decide(decided.verdict, pending)
                    sent.repeat = True
                    if reply is not None:
                        if self.ok(reply, "the same decision again") != decided_reply:
                            self.fail(f"the same decision again answered {reply}")
                        self.counts["repeated decisions"] += 1
                else:
                    other = VERDICTS[1 - VERDICTS.index(decided.verdict)]
                    sent, reply = await self.decide(other, pending)
                    if reply is not None:
                        self.refused(
                            reply, sent, {"conflicting_decision"}, "a conflicting decision"
                        )
                if reply is None:
                    pending = decided = None
                continue

            # -------------------------------------------- decided or not known: go on
            stopped = await self.advance(expect)
            pending = decided = expect = None
            if stopped is None:
                continue
            if stopped["stop_reason"] == "final_answer":
                if previous is not None and self.rng.random() < 0.2:
                    # A decision retried after the run finished: nothing waits, refused.
                    stale = {"digest": previous.digest, "result_id": previous.result_id}
                    sent, reply = await self.decide(previous.verdict, stale)
                    if reply is not None:
                        self.refused(reply, sent, {"not_awaiting"}, "a decision after the end")
                return
            pending = self.check_pending(stopped)
            asked_at = time.monotonic()
        self.counts["out of ops"] += 1

    async def advance(self, expect: tuple[str, int] | None) -> dict[str, Any] | None:
        """``run_or_resume``, settling what a kill left in doubt, until the run pauses or
        finishes: its last result (None when a kill interrupted it). ``expect``: the text the
        first result's step must read (the decided call's observation)."""
        while self.ops < MAX_OPS:
            reply = await self.send(RUN | {"spec": self.spec})
            if reply is None:
                return None
            result = self.ok(reply, "run_or_resume")
            if expect is not None:
                text, step = expect
                observations = result["observations"]
                if len(observations) <= step or observations[step] != text:
                    self.fail(f"step {step} reads {observations[step:]}, not {text!r}")
                self.counts["decided steps read back"] += 1
                expect = None
            reason = result["stop_reason"]
            if reason == "final_answer":
                if result["final_answer"] != "done" or result["steps"] != len(self.calls) + 1:
                    self.fail(f"finished as {result}")
                self.counts["finished"] += 1
                return result
            if reason == AWAITING:
                return result
            if reason != "resume_state_unknown":
                self.fail(f"stopped with {reason}: {result}")
            # A kill left an execution in doubt: settle it as an operator would (is it in the
            # ledger?), then go on.
            result_id = result["unknown_outcome"]
            step = int(result_id[1:])
            entries = [
                e
                for e in read_ledger(self.bench.workers.ledger, strict=False)
                if e["run"] == self.run_id and e["step"] == step
            ]
            tool, arguments = self.calls[step]
            if needs_approval(tool, arguments):
                self.counts["approved calls in doubt"] += 1
            reply = await self.send(
                {
                    "op": "resolve",
                    "run_id": self.run_id,
                    "result_id": result_id,
                    "executed": bool(entries),
                    "observation": observation_of(tool, arguments) if entries else None,
                    "by": f"{self.run_id}/{self.ops}-operator",
                }
            )
            if reply is None:
                return None
            self.ok(reply, "resolve")
            self.counts[f"in doubt, settled as {'executed' if entries else 'not executed'}"] += 1
        return None


RUN: dict[str, Any] = {"op": "run"}
VERDICTS = ["approved", "rejected"]


async def open_store(kind: str, location: str) -> Any:
    if kind == "jsonl":
        return JsonlRunStore(directory=location)
    return await PostgresRunStore.open(location, pool_size=2)


@pytest.mark.parametrize("kind", ["jsonl", "postgres"])
async def test_random_approval_sequences_with_kills_never_run_an_undecided_call(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "postgres":
        location = request.getfixturevalue("postgres_database")
    else:
        runs = tmp_path / "runs"
        runs.mkdir()
        location = str(runs)
    started = time.monotonic()
    ledger = tmp_path / "ledger.jsonl"
    async with Workers(tmp_path, kind, location, ledger) as workers:
        bench = Bench(kind, workers)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(index: int) -> None:
            async with gate:
                sequence = Sequence(bench, index)
                await sequence.drive()
                bench.figures.sequences += 1
                bench.figures.killed_sequences += sequence.killed

        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the rest
                for index in range(SEQUENCES[kind]):
                    group.create_task(one(index))
        except BaseExceptionGroup as failed:  # report the first failure as itself
            raise failed.exceptions[0] from None
        kills = workers.kills
    driven = time.monotonic() - started

    # The judge: the ledger against the decisions in every log.
    entries = read_ledger(ledger, strict=True)
    per_run: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for entry in entries:
        per_run[entry["run"]].append(entry)
    assert set(per_run) <= set(bench.specs), f"executions of unknown runs: {set(per_run)}"
    store = await open_store(kind, location)
    totals = collections.Counter[str]()
    try:
        for run_id, spec in bench.specs.items():
            log = await store.read_log(run_id)
            figures = judge(log, spec, per_run[run_id], bench.sent[run_id])
            for field in dataclasses.fields(figures):
                value = getattr(figures, field.name)
                if isinstance(value, collections.Counter):
                    totals.update({f"decisions {k}": v for k, v in value.items()})
                else:
                    totals[field.name] += value
    finally:
        if kind == "postgres":
            await store.close()
    f = bench.figures
    elapsed = time.monotonic() - started
    print(
        f"\napproval property test [{kind}]: seed {SEED}, {f.sequences} sequences, {f.ops} "
        f"commands, {kills} SIGKILLs interrupting {f.interrupted} commands in "
        f"{f.killed_sequences} sequences, {totals['decisions approved']} approvals, "
        f"{totals['decisions rejected']} rejections, {totals['decisions expired']} expiries, "
        f"{totals['executions']} executions ({totals['approved_executions']} approved, "
        f"{totals['never_executions']} NEVER), 0 unapproved, 0 rejected executed, 0 NEVER "
        f"doubles, {totals['finished']} finished, {totals['waiting']} left waiting, "
        f"{totals['in_doubt']} left in doubt, {f.transient} lease retries, "
        f"{elapsed:.1f} s ({driven:.1f} s driving)"
    )
    print(f"approval property test [{kind}] counts: {dict(sorted(f.counts.items()))}")

    assert f.sequences == SEQUENCES[kind]
    assert kills >= 0.05 * f.sequences, f"only {kills} SIGKILLs: the test proves too little"
    assert f.killed_sequences >= 0.1 * f.sequences, f"only {f.killed_sequences} sequences killed"
    assert totals["decisions approved"] >= 0.1 * f.sequences
    assert totals["decisions rejected"] >= 0.1 * f.sequences
    assert totals["decisions expired"] >= 1, "no request expired"
    assert totals["approved_executions"] >= 0.1 * f.sequences
    for promise in (
        "waiting resumes",
        "refused: wrong_digest",
        "refused: expired",
        "refused: conflicting_decision",
        "repeated decisions",
        "decided steps read back",
        "approved calls in doubt",
        "earlier decisions retried",
        "refused: not_awaiting",
    ):
        assert f.counts[promise] >= 1, f"never checked: {promise}"
