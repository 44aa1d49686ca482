"""A tiny scripted agent for the PostgreSQL process tests (crash and paused holder).

The model replies from ``script`` by call index (``write <text>``, ``wait``, ``final``); a
``write`` is a ``NEVER`` tool that appends its text to ``executed``; ``wait`` is a ``NEVER``
tool that awaits ``hold`` (an awaitable factory) before it returns. ``gate``, when set, is
awaited by the model before the reply with index ``gate_at``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from polyloop.ports import Action, FinalAnswer, ModelCall, ParsedReply, RunStore, ToolCall
from polyloop.session import AgentDefinition, RunRequest
from polyloop.sinks import NullEventSink
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    SyntheticObservations,
)


class Model(ScriptedModelClient):
    """The script by call index, without call ids; the call with index ``gate_at`` sets
    ``reached`` and waits for ``gate`` (when set) before it is answered."""

    def __init__(
        self, script: Sequence[str], gate: asyncio.Event | None = None, gate_at: int = -1
    ) -> None:
        super().__init__(script, call_id_prefix=None, parameters={"model": "pg-agent"})
        self.gate = gate
        self.gate_at = gate_at
        self.reached = asyncio.Event()

    async def before_reply(self, call: ModelCall) -> None:
        if call.call_index == self.gate_at and self.gate is not None:
            self.reached.set()
            await self.gate.wait()


class Parser:
    def parse(self, reply: ModelReply) -> ParsedReply:
        if reply.content == "final":
            return ParsedReply(history_text="final", decision=FinalAnswer(text="done"))
        name, _, text = reply.content.partition(" ")
        call = ToolCall(name=name, arguments={"text": text})
        return ParsedReply(history_text=reply.content, decision=Action(text=text, tool_call=call))

    def parameters(self) -> Mapping[str, str]:
        return {"parser": "pg-agent"}


def registry(
    executed: list[str], hold: Callable[[], Awaitable[None]] | None = None
) -> ToolRegistry:
    async def write(arguments: Mapping[str, object]) -> str:
        executed.append(str(arguments["text"]))
        return "written"

    async def wait(arguments: Mapping[str, object]) -> str:
        executed.append(f"wait {arguments['text']}")
        if hold is not None:
            await hold()
        return "waited"

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return ToolRegistry(
        [
            ToolSpec(name="write", description="NEVER", parameters=schema, handler=write),
            ToolSpec(name="wait", description="NEVER", parameters=schema, handler=wait),
        ]
    )


def definition(store: RunStore, model: ScriptedModelClient) -> AgentDefinition:
    return AgentDefinition(
        model_client=model,
        decision_parser=Parser(),
        store=store,
        event_sink=NullEventSink(),
        synthetic_observations=SyntheticObservations(
            action_rejected="rejected", env_failed="env failed", model_call_failed="failed"
        ),
    )


def request(run_id: str, tools: ToolRegistry) -> RunRequest:
    return RunRequest(
        run_id=run_id,
        budget=Budget(
            max_steps=20, max_actions=20, max_consecutive_parse_failures=2, max_prompt_chars=10**6
        ),
        action_executor=tools.executor(),
        tools=tools,
        context=Context(run_level=(Message.user("go"),), goal_level=()),
        model_replay_policy=ReplayPolicy.SAFE,
    )
