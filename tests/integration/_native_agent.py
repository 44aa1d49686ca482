"""A native-tool agent against an OpenAI-compatible endpoint, shared by a test and its victim.

``definition`` and ``request`` build the same agent in the test process and in the child
process the test kills (``python tests/integration/_native_agent.py ...``), so the parameter
snapshot ``resume()`` recomputes matches the one the child recorded. Every tool appends one
line to a ledger file (flushed and fsynced) before it answers: the ledger, written by the tools
and not by polyloop, is the ground truth of how often each side effect happened.

Run as a script, it starts the run and, when the tool named by ``--stall`` is called, records
its side effect, prints ``@@in-flight <tool>`` and waits forever (for the SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.parsers import NativeToolCallParser
from polyloop.session import AgentDefinition, RunRequest, run
from polyloop.sinks import NullEventSink
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ReplayPolicy,
    Role,
    SyntheticObservations,
    TextBlock,
)

IN_FLIGHT = "@@in-flight"
RUN_ID = "native-kill"
TEXTS = SyntheticObservations(
    action_rejected="[rejected: {reason}]",
    env_failed="[env failed]",
    model_call_failed="[model failed]",
)
BUDGET = Budget(
    max_steps=10, max_actions=10, max_consecutive_parse_failures=3, max_prompt_chars=50_000
)
POLICIES = {
    "search": ReplayPolicy.SAFE,
    "fetch": ReplayPolicy.SAFE,
    "write_note": ReplayPolicy.NEVER,
}


def ledger_lines(ledger: Path) -> list[dict[str, object]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]


def registry(ledger: Path, *, stall: str | None = None) -> ToolRegistry:
    def handler(name: str):  # type: ignore[no-untyped-def]
        async def run_tool(arguments: Mapping[str, object]) -> str:
            with ledger.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"tool": name, "arguments": dict(arguments)}) + "\n")
                out.flush()
                os.fsync(out.fileno())
            if name == stall:
                print(f"{IN_FLIGHT} {name}", flush=True)
                await asyncio.Event().wait()  # until SIGKILL
            return f"{name} done with {json.dumps(dict(arguments), sort_keys=True)}"

        return run_tool

    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    return ToolRegistry(
        ToolSpec(
            name=name,
            description=f"The {name} tool.",
            parameters=schema,
            handler=handler(name),
            replay_policy=policy,
        )
        for name, policy in POLICIES.items()
    )


def definition(
    http: httpx.AsyncClient, base_url: str, runs_dir: Path, *, stream: bool = False
) -> AgentDefinition:
    return AgentDefinition(
        model_client=GatewayModelClient(
            client=http,
            settings=GatewaySettings(
                base_url=base_url,
                model="stub-model",
                sampling={"temperature": 0.0},
                stream=stream,
            ),
        ),
        decision_parser=NativeToolCallParser(),
        store=JsonlRunStore(directory=runs_dir),
        event_sink=NullEventSink(),
        synthetic_observations=TEXTS,
    )


def request(ledger: Path, *, run_id: str = RUN_ID, stall: str | None = None) -> RunRequest:
    tools = registry(ledger, stall=stall)
    goal = Message(role=Role.USER, content=(TextBlock(text="Use the tools, then answer."),))
    return RunRequest(
        run_id=run_id,
        budget=BUDGET,
        tools=tools,
        action_executor=tools.executor(),
        context=Context(goal_level=(goal,)),
        model_replay_policy=ReplayPolicy.NEVER,
    )


async def _main(base_url: str, runs_dir: Path, ledger: Path, stall: str) -> int:
    async with httpx.AsyncClient(timeout=30) as http:
        result = await run(definition(http, base_url, runs_dir), request(ledger, stall=stall))
    print(f"@@finished {result.stop_reason.value}", flush=True)
    return 3


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--stall", required=True)
    args = parser.parse_args()
    sys.exit(asyncio.run(_main(args.base_url, args.runs_dir, args.ledger, args.stall)))
