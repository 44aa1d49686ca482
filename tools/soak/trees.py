"""Three-level trees of runs for the tree kill storm and the tree tests (design 0245): a root
with two children, each with two children; ``note`` (``NEVER``), ``bump`` (``IDEMPOTENT``) and
``peek`` (``SAFE``) tools at every level, each execution appended (and fsynced) to a ledger.

Every run's script depends on its run id only (its level is the number of ``.a`` parts), so
a resumed run, in any process, gets the very replies an uninterrupted one would, and the
trajectory of an uninterrupted tree is the reference a killed one must end equal to.
"""

from __future__ import annotations

import asyncio
import decimal
import json
import os
import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyloop.agent import child_tool
from polyloop.parsers import JsonToolCallParser
from polyloop.ports import ModelCall, RunStore, ToolContext
from polyloop.session import AgentDefinition, Pricing, RunRequest
from polyloop.sinks import NullEventSink
from polyloop.stores import JsonlRunStore
from polyloop.tools import Reconciliation, ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    SyntheticObservations,
    Usage,
)

PRICING = Pricing.from_mapping({Pricing.ANY_MODEL: {"input": "1000000", "output": "1000000"}})
"""One unit per token: a ``TreeModel`` call (10 + 5 tokens) costs exactly 15."""

LEVELS = 3
"""Root (level 0), its children (1), their children (2)."""

CHILD_TOOL = "delegate"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def level_of(run_id: str) -> int:
    """How deep ``run_id`` sits: a child's id is its parent's plus ``.a<step>``."""
    return run_id.count(".a")


def script_for(run_id: str) -> list[str]:
    """The replies of the run ``run_id``: three plain tools, two delegations above the leaves,
    a final answer naming the run."""
    level = level_of(run_id)

    def call(tool: str, **arguments: object) -> str:
        return json.dumps({"tool": tool, "arguments": arguments})

    replies = [call("note", n=0)]
    if level < LEVELS - 1:
        replies.append(call(CHILD_TOOL, task="first"))
    replies.append(call("bump", n=1))
    if level < LEVELS - 1:
        replies.append(call(CHILD_TOOL, task="second"))
    replies.append(call("peek", n=2))
    replies.append(json.dumps({"final_answer": f"done {run_id}"}))
    return replies


class TreeModel:
    """Answers each run from ``script_for(run_id)`` by call index, with usage (10 + 5 tokens),
    after a random pause of up to ``pause`` seconds; counts calls per run (``calls``)."""

    native_tool_calls = False

    def __init__(self, *, pause: float = 0.0, script: Callable[[str], list[str]] = script_for):
        self.pause = pause
        self.script = script
        self.calls: list[ModelCall] = []

    async def call(self, call: ModelCall) -> ModelReply:
        self.calls.append(call)
        if self.pause:
            await asyncio.sleep(random.uniform(0.0, self.pause))
        replies = self.script(call.run_id)
        return ModelReply(
            call_id=f"c{call.call_index}",
            content=replies[min(call.call_index, len(replies) - 1)],
            usage=Usage(prompt_tokens=10, completion_tokens=5),
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "tree-model"}


class Ledger:
    """An append-only, fsynced record of tool executions: ``<run id> <tool> <n> <key>``."""

    def __init__(self, path: Path, *, pause: float = 0.0) -> None:
        self.path = path
        self.pause = pause

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text("utf-8").splitlines() if line]

    def _append(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def spec(self, tool: str, policy: ReplayPolicy, **options: Any) -> ToolSpec:
        async def handler(arguments: Mapping[str, object], context: ToolContext) -> str:
            if self.pause:
                await asyncio.sleep(random.uniform(0.0, self.pause))
            line = f"{context.run_id} {tool} {arguments.get('n')} {context.idempotency_key}"
            await asyncio.to_thread(self._append, line)
            if self.pause:
                await asyncio.sleep(random.uniform(0.0, self.pause))
            return f"{tool} {arguments.get('n')} ok"

        handler.takes_context = True  # type: ignore[attr-defined]

        async def reconcile(context: ToolContext, arguments: Mapping[str, object]) -> Any:
            keys = {line[3] for line in self.lines() if len(line) == 4}
            if context.idempotency_key in keys:
                return Reconciliation.executed(f"{tool} {arguments.get('n')} ok")
            return Reconciliation.not_executed()

        if policy is ReplayPolicy.NEVER and options.pop("reconciled", True):
            options["reconcile"] = reconcile
        return ToolSpec(
            name=tool,
            description=f"{tool} ({policy.value})",
            parameters=SCHEMA,
            handler=handler,
            replay_policy=policy,
            **options,
        )


def tree_definition(model: TreeModel, store: RunStore) -> AgentDefinition:
    return AgentDefinition(
        model_client=model,
        decision_parser=JsonToolCallParser(),
        store=store,
        event_sink=NullEventSink(),
        synthetic_observations=SyntheticObservations(
            action_rejected="[rejected] {reason}", env_failed="[env]", model_call_failed="[model]"
        ),
    )


class Tree:
    """One tree's agents: the same definition at every level, a request per run whose tools
    are the level's (no child tool at the leaves). ``note_options`` (``needs_approval``...) go
    to the ``note`` tool of level ``note_level`` (every level when ``None``)."""

    def __init__(
        self,
        model: TreeModel,
        store: RunStore,
        ledger: Ledger,
        *,
        steps: int = 12,
        max_depth: int | None = None,
        max_children: int | None = None,
        note_options: Mapping[str, Any] | None = None,
        note_level: int | None = None,
        reconciled: bool = True,
        tokens: int | None = None,
        lease_wait_seconds: float = 60.0,
        cost: decimal.Decimal | None = None,
    ) -> None:
        self.definition = tree_definition(model, store)
        self.ledger = ledger
        self.steps = steps
        self.tokens = tokens
        self.max_depth = max_depth
        self.max_children = max_children
        self.note_options = dict(note_options or {})
        self.note_level = note_level
        self.reconciled = reconciled
        self.lease_wait_seconds = lease_wait_seconds
        self.cost = cost

    def tools(self, level: int) -> ToolRegistry:
        options = self.note_options if self.note_level in (None, level) else {}
        specs = [
            self.ledger.spec("note", ReplayPolicy.NEVER, reconciled=self.reconciled, **options),
            self.ledger.spec("bump", ReplayPolicy.IDEMPOTENT),
            self.ledger.spec("peek", ReplayPolicy.SAFE),
        ]
        if level < LEVELS - 1:
            specs.append(
                child_tool(
                    self.definition,
                    lambda arguments, run_id: self.request(run_id, str(arguments["task"])),
                    name=CHILD_TOOL,
                    description="hand a task to a sub-agent",
                    max_depth=self.max_depth,
                    max_children=self.max_children,
                    lease_wait_seconds=self.lease_wait_seconds,
                )
            )
        return ToolRegistry(specs)

    def request(self, run_id: str, task: str = "the whole job", **options: Any) -> RunRequest:
        return RunRequest(
            run_id=run_id,
            budget=Budget(
                max_steps=self.steps,
                max_actions=self.steps,
                max_total_tokens=self.tokens,
                max_cost=self.cost,
            ),
            pricing=PRICING if self.cost is not None else None,
            tools=self.tools(level_of(run_id)),
            context=Context(goal_level=(Message.user(task),)),
            model_replay_policy=ReplayPolicy.SAFE,
            **options,
        )


@dataclass(frozen=True, slots=True)
class TreeTask:
    """A tree to run on a worker (``build_tree``): its root's run id and a directory for its
    JSONL store and ledger."""

    root: str
    directory: str


@asynccontextmanager
async def build_tree(task: TreeTask) -> AsyncIterator[tuple[AgentDefinition, RunRequest]]:
    """The run factory of ``polyloop.ray.run_on_ray`` for a tree: the root's definition and
    request; its children run inside the root's calls, in the same worker (module level, so
    Ray pickles it by reference)."""
    place = Path(task.directory)
    store = JsonlRunStore(directory=place / "runs")
    tree = Tree(TreeModel(), store, Ledger(place / "ledger.txt"), steps=40)
    yield tree.definition, tree.request(task.root)
