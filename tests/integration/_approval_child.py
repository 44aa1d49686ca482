"""The worker of the approval property test (issue 22), SIGKILLed at random moments:
``python _approval_child.py SOCKET STORE LOCATION LEDGER``.

Started by its file path, it is first a *zygote*: it imports everything a worker needs, prints
``ZYGOTE``, and then forks one worker per ``spawn`` line it reads on stdin (printing ``PID
<pid>``), so that a worker the test has just SIGKILLed is replaced in milliseconds instead of
a fresh interpreter's import time. The zygote never touches a store or a run.

A worker connects to the Unix socket ``SOCKET`` (the test listens on it), says ``READY
<pid>``, and then executes JSON commands, one per line, each in a task of its own (commands on
different runs overlap; the test sends one command per run at a time). ``STORE`` is
``jsonl`` (``LOCATION`` is the directory) or ``postgres`` (``LOCATION`` is the conninfo).

=========  ==========================================================================
``op``     what the worker does, and the reply's ``ok``
=========  ==========================================================================
``run``    ``run_or_resume`` of the run ``spec`` describes (tool calls, expiry): its
           stop reason, pending request, unknown outcome, steps, and how many model
           calls this command made
``approve``  ``polyloop.session.approve(store, run_id, digest=, by=, note=)``: the decision
``reject``   ``polyloop.session.reject(store, run_id, digest=, by=, reason=)``: the decision
``resolve``  ``polyloop.session.resolve`` of an execution in doubt: the settlement
=========  ==========================================================================

A refusal or failure is replied as ``{"id": N, "error": <class>, "reason": <ResolutionError
reason or null>, "message": ...}``. Every tool execution is appended to ``LEDGER`` (one JSON
line: run, step, tool, canonical arguments, pid; ``O_APPEND`` and ``fsync`` before the tool
returns) so the test can count executions exactly; tools and the model sleep a little, before
and after that write, so that a kill lands anywhere in a step, in-doubt windows included.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _shared_doubles

from _shared_doubles import PausingModel, TinyParser, killed_run
from polyloop.errors import PolyloopError, ResolutionError
from polyloop.ports import ToolContext
from polyloop.session import AgentDefinition, RunRequest, approve, reject, resolve, run_or_resume
from polyloop.stores import JsonlRunStore, PostgresRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy, Settlement

LEASE_SECONDS = 0.2
"""A Postgres lease of a killed worker stays until it expires: short, so runs go on soon."""
LEASE_WAIT_SECONDS = 10.0
"""How long a command waits for the run's lease (a killed worker's, until it is gone)."""
STARTUP_SECONDS = 30.0


# --------------------------------------------------------------------------- the tools


def large_refund(arguments: Mapping[str, object]) -> bool:
    """A refund above 100 waits for a person."""
    amount = arguments["amount"]
    return isinstance(amount, int) and amount > 100


def to_production(arguments: Mapping[str, object]) -> bool:
    """A deployment to production waits for a person."""
    return arguments["env"] == "prod"


def always(arguments: Mapping[str, object]) -> bool:
    return True


def never(arguments: Mapping[str, object]) -> bool:
    return False


TOOLS: dict[str, tuple[ReplayPolicy, Callable[[Mapping[str, object]], bool]]] = {
    "refund": (ReplayPolicy.NEVER, large_refund),
    "delete": (ReplayPolicy.NEVER, always),
    "deploy": (ReplayPolicy.SAFE, to_production),
    "note": (ReplayPolicy.NEVER, never),
    "lookup": (ReplayPolicy.SAFE, never),
}
"""Each tool's replay policy and whether a call with given arguments needs approval (the
test's own copy of the rule, to judge the logs with)."""

REJECTION = "[not executed] {reason}"


def canonical(arguments: Mapping[str, object]) -> str:
    """The arguments as the library canonicalises them for a request (design 0210)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_of(run_id: str, result_id: str, tool: str, arguments: Mapping[str, object]) -> str:
    """The digest a decision on that call names, computed independently of the library: the
    run, the call's result id, the tool and its canonical arguments (so that two identical
    calls of one run have two digests)."""
    text = f"{run_id}\n{result_id}\n{tool}\n{canonical(arguments)}"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def observation_of(tool: str, arguments: Mapping[str, object]) -> str:
    """What a tool returns for a call (and what an operator settles an executed one with)."""
    return f"{tool} done: {canonical(arguments)}"


def needs_approval(tool: str, arguments: Mapping[str, object]) -> bool:
    return TOOLS[tool][1](arguments)


def script_of(calls: list[list[Any]]) -> list[str]:
    return [f"tool:{tool} {json.dumps(arguments)}" for tool, arguments in calls] + ["final:done"]


class _Ledger:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, entry: Mapping[str, object]) -> None:
        line = (json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n").encode()
        assert len(line) < 4096, "one write of less than a page: never torn by a kill"
        os.write(self._fd, line)
        os.fsync(self._fd)


def registry(ledger: _Ledger) -> ToolRegistry:
    async def execute(ctx: ToolContext, tool: str, arguments: dict[str, object]) -> str:
        await asyncio.sleep(random.uniform(0.0, 0.004))
        ledger.append(
            {
                "run": ctx.run_id,
                "step": ctx.step_idx,
                "tool": tool,
                "arguments": canonical(arguments),
                "key": ctx.idempotency_key,
                "pid": os.getpid(),
            }
        )
        # Executed, and the log does not know yet: a kill here leaves the call in doubt.
        await asyncio.sleep(random.uniform(0.0, 0.006))
        return observation_of(tool, arguments)

    async def refund(ctx: ToolContext, n: int, amount: int) -> str:
        """Refund money to a customer."""
        return await execute(ctx, "refund", {"n": n, "amount": amount})

    async def delete(ctx: ToolContext, n: int, target: str) -> str:
        """Delete data."""
        return await execute(ctx, "delete", {"n": n, "target": target})

    async def deploy(ctx: ToolContext, n: int, env: str) -> str:
        """Deploy the service (deploying the same build again changes nothing)."""
        return await execute(ctx, "deploy", {"n": n, "env": env})

    async def note(ctx: ToolContext, n: int, text: str) -> str:
        """Append a note."""
        return await execute(ctx, "note", {"n": n, "text": text})

    async def lookup(ctx: ToolContext, n: int, q: str) -> str:
        """Look something up."""
        return await execute(ctx, "lookup", {"n": n, "q": q})

    rules: dict[str, bool | Callable[[Mapping[str, object]], bool]] = {
        "refund": large_refund,
        "delete": True,
        "deploy": to_production,
        "note": False,
        "lookup": False,
    }
    functions: dict[str, Callable[..., Awaitable[str]]] = {
        "refund": refund,
        "delete": delete,
        "deploy": deploy,
        "note": note,
        "lookup": lookup,
    }
    return ToolRegistry(
        [
            ToolSpec.from_function(
                functions[name], replay_policy=TOOLS[name][0], needs_approval=rules[name]
            )
            for name in TOOLS
        ]
    )


# --------------------------------------------------------------------------- the agent


def build(
    store: Any, tools: ToolRegistry, spec: Mapping[str, Any]
) -> tuple[AgentDefinition, RunRequest, PausingModel]:
    """The agent and request of the run ``spec`` describes: identical in every process."""
    model = PausingModel(script_of(spec["calls"]), kind="approval-property", pause=0.004)
    definition, request = killed_run(
        spec["run_id"],
        model,
        TinyParser("approval-property-parser"),
        store,
        tools,
        steps=len(spec["calls"]) + 2,
        prompt="ask first",
        rejected=REJECTION,
        approval_expires_seconds=spec["expires"],
    )
    return definition, request, model


def settlement_reply(settlement: Settlement) -> dict[str, object]:
    return {
        "result_id": settlement.result_id,
        "verdict": settlement.verdict.value,
        "source": settlement.source.value,
        "by": settlement.by,
        "at": settlement.at,
        "note": settlement.note,
        "digest": settlement.digest,
    }


async def perform(store: Any, tools: ToolRegistry, command: Mapping[str, Any]) -> dict[str, Any]:
    op = command["op"]
    wait = LEASE_WAIT_SECONDS
    if op == "run":
        definition, request, model = build(store, tools, command["spec"])
        result = await run_or_resume(definition, request, lease_wait_seconds=wait)
        pending = result.pending_approval
        return {
            "stop_reason": result.stop_reason.value,
            "final_answer": result.final_answer,
            "unknown_outcome": result.unknown_outcome,
            "steps": len(result.steps),
            "observations": [step.observation for step in result.steps],
            "model_calls": len(model.calls),
            "pending": None
            if pending is None
            else {
                "result_id": pending.result_id,
                "step_idx": pending.step_idx,
                "tool": pending.tool,
                "arguments": pending.arguments,
                "digest": pending.digest,
                "expires_at": pending.expires_at,
            },
        }
    if op == "approve":
        decided = await approve(
            store,
            command["run_id"],
            digest=command["digest"],
            by=command["by"],
            note=command.get("note", ""),
            lease_wait_seconds=wait,
        )
        return settlement_reply(decided)
    if op == "reject":
        decided = await reject(
            store,
            command["run_id"],
            digest=command["digest"],
            by=command["by"],
            reason=command["reason"],
            lease_wait_seconds=wait,
        )
        return settlement_reply(decided)
    if op == "resolve":
        settled = await resolve(
            store,
            command["run_id"],
            result_id=command["result_id"],
            executed=command["executed"],
            observation=command.get("observation"),
            by=command["by"],
            note="looked it up in the ledger",
            lease_wait_seconds=wait,
        )
        return settlement_reply(settled)
    raise ValueError(f"unknown op {op!r}")


async def worker(socket_path: str, kind: str, location: str, ledger_path: str) -> None:
    if kind == "jsonl":
        store: Any = JsonlRunStore(directory=location)
    else:
        store = await PostgresRunStore.open(
            location, pool_size=4, lease_seconds=LEASE_SECONDS, connect_timeout=STARTUP_SECONDS
        )
    tools = registry(_Ledger(Path(ledger_path)))
    reader, writer = await asyncio.open_unix_connection(socket_path)
    writer.write(f"READY {os.getpid()}\n".encode())
    await writer.drain()
    lock = asyncio.Lock()
    tasks: set[asyncio.Task[None]] = set()

    async def handle(command: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"id": command["id"]}
        try:
            reply["ok"] = await perform(store, tools, command)
        except Exception as exc:  # replied: the test judges every error
            reply["error"] = type(exc).__name__
            reply["reason"] = exc.reason if isinstance(exc, ResolutionError) else None
            reply["message"] = (
                str(exc) if isinstance(exc, PolyloopError) else traceback.format_exc()
            )
        async with lock:
            writer.write((json.dumps(reply) + "\n").encode())
            await writer.drain()

    while line := await reader.readline():
        task = asyncio.create_task(handle(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    # The test closed the connection: it is done with this worker.
    for task in list(tasks):
        task.cancel()


def zygote(socket_path: str, kind: str, location: str, ledger_path: str) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    print("ZYGOTE", flush=True)
    for line in sys.stdin:
        if line.strip() != "spawn":
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            code = 0
            try:
                random.seed()  # not the zygote's stream: each worker sleeps its own way
                asyncio.run(worker(socket_path, kind, location, ledger_path))
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        print(f"PID {pid}", flush=True)


if __name__ == "__main__":
    zygote(*sys.argv[1:5])
