"""Scripted doubles for driving ``polyloop.session`` in unit tests.

The model speaks the tiny language of ``_shared_doubles.TinyParser`` (shared with the child
processes of the kill tests):

* ``tool:<name> <json arguments>``  -> an ``Action`` with a ``ToolCall``
* ``code:<source>``                 -> a code ``Action`` (no tool call)
* ``final:<answer>``                -> ``FinalAnswer``
* anything else                     -> ``InvalidDecision``
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from _shared_doubles import TEXTS, TinyParser
from polyloop.ports import (
    Action,
    Event,
    ModelCall,
)
from polyloop.session import AgentDefinition, RunRequest
from polyloop.stores import VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolEnvironmentError, ToolRegistry, ToolSpec
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    TextBlock,
)


class ModelBoom(RuntimeError):
    """Raised by the scripted model when its script says so."""


class ScriptedModel(ScriptedModelClient):
    """The public scripted client as the session tests use it: entry ``call_index`` answers
    (so a resumed run gets the same reply for the same step; an exception instance in the
    script is raised), with ``thinking="hmm"`` and ``parameters()`` ``{"model": identity}``.
    ``started`` is set when a call arrives; ``gate`` (if set) is awaited before every reply,
    to hold a call in flight."""

    def __init__(
        self,
        script: Sequence[str | BaseException],
        *,
        gate: asyncio.Event | None = None,
        identity: str = "scripted-v1",
    ) -> None:
        super().__init__(script, thinking="hmm", parameters={"model": identity})
        self.gate = gate
        self.started = asyncio.Event()

    @property
    def script(self) -> Sequence[str | ModelReply | BaseException]:
        return self.replies

    async def before_reply(self, call: ModelCall) -> None:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()


@dataclass
class RecordingSink:
    events: list[Event] = field(default_factory=list)
    fail: bool = False

    async def emit(self, event: Event) -> None:
        self.events.append(event)
        if self.fail:
            raise ConnectionError("event backend down")

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "recording"}


@dataclass
class Tally:
    """How many times each tool ran (the side effects a resume must never repeat)."""

    runs: dict[str, int] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def hit(self, name: str) -> None:
        self.runs[name] = self.runs.get(name, 0) + 1


def make_tools(tally: Tally) -> ToolRegistry:
    """echo (SAFE), write (NEVER), finish (completes the run), boom (raises), broken (env),
    slow (waits on the tally's gate)."""

    def handler(name: str, body: Callable[[Mapping[str, object]], str]):  # type: ignore[no-untyped-def]
        async def run(arguments: Mapping[str, object]) -> str:
            tally.hit(name)
            return body(arguments)

        return run

    def boom(arguments: Mapping[str, object]) -> str:
        raise ValueError("tool exploded")

    def broken(arguments: Mapping[str, object]) -> str:
        raise ToolEnvironmentError("sandbox gone")

    async def slow(arguments: Mapping[str, object]) -> str:
        tally.hit("slow")
        tally.started.set()
        assert tally.gate is not None
        await tally.gate.wait()
        return "slow done"

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return ToolRegistry(
        [
            ToolSpec(
                name="echo",
                description="echo text",
                parameters=schema,
                handler=handler("echo", lambda a: f"echo {a.get('text', '')}"),
                replay_policy=ReplayPolicy.SAFE,
            ),
            ToolSpec(
                name="write",
                description="write a note",
                parameters=schema,
                handler=handler("write", lambda a: "written"),
            ),
            ToolSpec(
                name="finish",
                description="submit",
                parameters={},
                handler=handler("finish", lambda a: "submitted"),
                completes_run=True,
            ),
            ToolSpec(
                name="boom", description="fails", parameters={}, handler=handler("boom", boom)
            ),
            ToolSpec(
                name="broken", description="env", parameters={}, handler=handler("broken", broken)
            ),
            ToolSpec(name="slow", description="slow", parameters={}, handler=slow),
        ]
    )


@dataclass
class CodeExecutor:
    """A code-style executor (no tools): ``done`` completes, ``crash`` raises, ``envfail``
    returns ENV_ERROR, anything else runs."""

    executed: list[str] = field(default_factory=list)

    async def execute(self, action: Action) -> ActionOutcome:
        self.executed.append(action.text)
        if action.text == "crash":
            raise OSError("executor bug")
        status = ActionStatus.ENV_ERROR if action.text == "envfail" else ActionStatus.EXECUTED
        return ActionOutcome(
            status=status,
            observation=f"ran {action.text}",
            observation_is_synthetic=False,
            env_reported_completion=action.text == "done",
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "code"}


BUDGET = Budget(
    max_steps=10, max_actions=10, max_consecutive_parse_failures=3, max_prompt_chars=100_000
)
CONTEXT = Context(
    run_level=(Message(role=Role.USER, content=(TextBlock(text="You are a test agent."),)),),
    goal_level=(Message(role=Role.USER, content=(TextBlock(text="Do the task."),)),),
)


def definition(
    model: ScriptedModelClient, *, store: object | None = None, sink: object | None = None
) -> AgentDefinition:
    return AgentDefinition(
        model_client=model,
        decision_parser=TinyParser(),
        store=store if store is not None else VolatileRunStore(),  # type: ignore[arg-type]
        event_sink=sink if sink is not None else RecordingSink(),  # type: ignore[arg-type]
        synthetic_observations=TEXTS,
    )


def request(
    run_id: str = "run-1",
    *,
    tools: ToolRegistry | None = None,
    executor: object | None = None,
    budget: Budget = BUDGET,
    model_policy: ReplayPolicy = ReplayPolicy.NEVER,
    **extra: object,
) -> RunRequest:
    registry = tools if tools is not None else ToolRegistry()
    extra.setdefault("observation_template", "Observation: {observation}")
    return RunRequest(
        run_id=run_id,
        budget=budget,
        action_executor=executor if executor is not None else registry.executor(),  # type: ignore[arg-type]
        tools=registry,
        context=CONTEXT,
        model_replay_policy=model_policy,
        **extra,  # type: ignore[arg-type]
    )


def tool_request(tally: Tally, run_id: str = "run-1", **extra: object) -> RunRequest:
    return request(run_id, tools=make_tools(tally), **extra)  # type: ignore[arg-type]


def texts_of(messages: Iterable[Message]) -> list[tuple[str, str]]:
    return [(m.role.value, "".join(b.text for b in m.content)) for m in messages]


class HookedStore:
    """A ``VolatileRunStore`` whose ``write_run_finished`` can be replaced by a test."""

    offers_leases = False  # unleased on purpose: the writes must reach the hooks here

    def __init__(self) -> None:
        self.inner = VolatileRunStore()
        self.finish_hook: Callable[[object], object] | None = None
        self.finishes: list[object] = []

    def __getattr__(self, name: str) -> object:
        if name == "acquire_lease":
            # A plain RunStore (no lease capability): the session's writes must reach the
            # hooks here instead of going through the inner store's lease.
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def write_run_finished(self, record: object) -> None:
        self.finishes.append(record)
        if self.finish_hook is not None:
            await self.finish_hook(record)  # type: ignore[misc]
        await self.inner.write_run_finished(record)  # type: ignore[arg-type]
