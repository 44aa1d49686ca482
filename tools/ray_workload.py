"""A picklable run factory for the Ray tests and benchmarks, with an environment-side ledger.

``build_run(task)`` is what ``polyloop.ray.run_on_ray`` calls on a worker: it builds, from a
small ``WorkloadTask``, a run whose scripted model takes a fixed ``model_latency`` per call
and asks, step after step, for ``never_write`` (``ReplayPolicy.NEVER``) and ``safe_read``
(``ReplayPolicy.SAFE``) alternately, then gives a final answer. The store is a
``JsonlRunStore`` on a directory every node can reach (one machine here: a temporary
directory), or a ``PostgresRunStore`` when the task names a server (``open_store``).
Nothing in the task is a client or a store: they are built where the run executes.

The ledger is the environment's own record, never the library's: each tool execution appends
``exec<TAB>run_id<TAB>tool<TAB>step<TAB>pid<TAB>time`` to ``<ledger_dir>/<run_id>.ledger``
*before* it returns (``O_APPEND``, one ``write``), and each execution attempt of the whole run
appends ``attempt<TAB>run_id<TAB>-<TAB>-<TAB>pid<TAB>time`` when the factory is entered. A test
judges "a ``NEVER`` action executed at most once" and "every executed action is in the log
once" from these files and the logs, not from what ``run_on_ray`` returned.

``read_ledger`` parses a ledger directory back.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from polyloop.ports import (
    Action,
    FinalAnswer,
    InvalidDecision,
    ModelCall,
    ParsedReply,
    RunStore,
    ToolCall,
)
from polyloop.session import AgentDefinition, RunRequest
from polyloop.sinks import NullEventSink
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    SyntheticObservations,
    TextBlock,
)

__all__ = ["LedgerLine", "WorkloadTask", "build_run", "read_ledger"]

NEVER_TOOL: Final = "never_write"
SAFE_TOOL: Final = "safe_read"
TEXTS: Final = SyntheticObservations(
    action_rejected="[action rejected]",
    env_failed="[environment failed]",
    model_call_failed="[model call failed]",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadTask:
    """One run, described in a few picklable fields (this is what crosses the wire).

    The run takes ``actions`` tool steps and one final-answer step. ``tool_seconds`` is how
    long each tool sleeps *after* writing its ledger line: the window in which a killed worker
    leaves "executed, not recorded" behind.
    """

    run_id: str
    store_dir: str
    ledger_dir: str
    actions: int = 6
    model_latency: float = 0.05
    tool_seconds: float = 0.0
    postgres: str | None = None
    """A libpq connection string: use a ``PostgresRunStore`` there instead of the JSONL store
    in ``store_dir`` (a test's throwaway server; never put real credentials in a task)."""
    lease_seconds: float = 2.0
    """The Postgres store's lease expiry (short: a dead holder frees its run quickly)."""


class _ScriptedModel:
    """Step i < actions: a tool call (even: ``never_write``, odd: ``safe_read``); then done."""

    def __init__(self, actions: int, latency: float) -> None:
        self._actions = actions
        self._latency = latency

    async def call(self, call: ModelCall) -> ModelReply:
        await asyncio.sleep(self._latency)
        index = call.call_index
        if index >= self._actions:
            content = "final done"
        else:
            tool = NEVER_TOOL if index % 2 == 0 else SAFE_TOOL
            content = f"call {tool} {index}"
        return ModelReply(call_id=f"{call.run_id}-{index}", content=content, thinking="")

    def parameters(self) -> Mapping[str, str]:
        return {"model": "scripted", "actions": str(self._actions)}


class _Parser:
    def parse(self, reply: ModelReply) -> ParsedReply:
        words = reply.content.split()
        if words[:1] == ["final"]:
            return ParsedReply(history_text=reply.content, decision=FinalAnswer(text="done"))
        if len(words) == 3 and words[0] == "call" and words[2].isdigit():
            arguments = MappingProxyType({"step": int(words[2])})
            call = ToolCall(name=words[1], arguments=arguments)
            return ParsedReply(
                history_text=reply.content, decision=Action(text=reply.content, tool_call=call)
            )
        return ParsedReply(history_text="", decision=InvalidDecision(explanation="unreadable"))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "ray-workload"}


def _append(path: Path, fields: tuple[object, ...]) -> None:
    line = ("\t".join(str(f) for f in fields) + "\n").encode("utf-8")
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


def _registry(task: WorkloadTask, ledger: Path) -> ToolRegistry:
    def handler(tool: str) -> Callable[[Mapping[str, object]], Awaitable[str]]:
        async def run_tool(arguments: Mapping[str, object], /) -> str:
            _append(
                ledger, ("exec", task.run_id, tool, arguments["step"], os.getpid(), time.time())
            )
            if task.tool_seconds:
                await asyncio.sleep(task.tool_seconds)
            return f"{tool} ok"

        return run_tool

    schema = {
        "type": "object",
        "properties": {"step": {"type": "integer"}},
        "required": ["step"],
    }
    return ToolRegistry(
        [
            ToolSpec(
                name=NEVER_TOOL,
                description="Writes something that must never be written twice.",
                parameters=schema,
                handler=handler(NEVER_TOOL),
                replay_policy=ReplayPolicy.NEVER,
            ),
            ToolSpec(
                name=SAFE_TOOL,
                description="Reads something; repeating it is harmless.",
                parameters=schema,
                handler=handler(SAFE_TOOL),
                replay_policy=ReplayPolicy.SAFE,
            ),
        ]
    )


_CONTEXT: Final = Context(
    run_level=(Message(role=Role.USER, content=(TextBlock(text="You are a test agent."),)),),
    goal_level=(Message(role=Role.USER, content=(TextBlock(text="Write, read, repeat."),)),),
)


@asynccontextmanager
async def open_store(task: WorkloadTask) -> AsyncIterator[RunStore]:
    """The task's store: Postgres when it names a server (closed on exit), else JSONL."""
    if task.postgres is None:
        yield JsonlRunStore(directory=task.store_dir)
        return
    from polyloop.stores import PostgresRunStore

    async with await PostgresRunStore.open(
        task.postgres, pool_size=2, lease_seconds=task.lease_seconds
    ) as store:
        yield store


@asynccontextmanager
async def build_run(task: WorkloadTask) -> AsyncIterator[tuple[AgentDefinition, RunRequest]]:
    """The run factory (module level, so Ray pickles it by reference)."""
    ledger = Path(task.ledger_dir) / f"{task.run_id}.ledger"
    _append(ledger, ("attempt", task.run_id, "-", "-", os.getpid(), time.time()))
    async with open_store(task) as store:
        yield _definition(task, store), _request(task, ledger)


def _definition(task: WorkloadTask, store: RunStore) -> AgentDefinition:
    return AgentDefinition(
        model_client=_ScriptedModel(task.actions, task.model_latency),
        decision_parser=_Parser(),
        store=store,
        event_sink=NullEventSink(),
        synthetic_observations=TEXTS,
    )


def _request(task: WorkloadTask, ledger: Path) -> RunRequest:
    registry = _registry(task, ledger)
    return RunRequest(
        run_id=task.run_id,
        budget=Budget(
            max_steps=task.actions + 2,
            max_actions=task.actions + 1,
            max_consecutive_parse_failures=2,
            max_prompt_chars=1_000_000,
        ),
        action_executor=registry.executor(),
        tools=registry,
        context=_CONTEXT,
        model_replay_policy=ReplayPolicy.SAFE,
    )


@dataclass(frozen=True, slots=True)
class LedgerLine:
    kind: str  # "exec" or "attempt"
    run_id: str
    tool: str
    step: int | None
    pid: int
    time: float


def read_ledger(ledger_dir: Path | str) -> list[LedgerLine]:
    """Every line of every ledger file in ``ledger_dir`` (a torn last line is dropped)."""
    lines = []
    for path in sorted(Path(ledger_dir).glob("*.ledger")):
        for raw in path.read_text(encoding="utf-8").split("\n")[:-1]:
            kind, run_id, tool, step, pid, stamp = raw.split("\t")
            lines.append(
                LedgerLine(
                    kind=kind,
                    run_id=run_id,
                    tool=tool,
                    step=None if step == "-" else int(step),
                    pid=int(pid),
                    time=float(stamp),
                )
            )
    return lines


def describe(task: WorkloadTask) -> str:
    """A one-line JSON description of a task (for reports)."""
    return json.dumps({"run_id": task.run_id, "actions": task.actions})
