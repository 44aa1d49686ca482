"""A run that the kill test SIGKILLs at random moments: ``python _kill_child.py DIR RUN_ID``.

It starts the run if its log does not exist, resumes it otherwise, and prints ``DONE
<stop_reason> <steps>`` when the run returns. Every tool execution is appended (and fsynced) to
``DIR/ledger.txt`` before the tool returns, so the parent can count executions exactly. The
model and the tools sleep a little so that a kill can land anywhere in a step.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _shared_doubles

from _shared_doubles import PausingModel, TinyParser, killed_run
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy

STEPS = 8


def script_for(run_id: str) -> list[str]:
    """Deterministic per run: bump (SAFE) and note (NEVER) calls, then a final answer."""
    rng = random.Random(run_id)
    replies = []
    for n in range(STEPS - 1):
        tool = rng.choice(["bump", "note"])
        replies.append(f"tool:{tool} " + json.dumps({"n": n}))
    replies.append("final:done")
    return replies


def registry(directory: Path, run_id: str) -> ToolRegistry:
    ledger = directory / "ledger.txt"

    def record(tool: str, arguments: Mapping[str, object]) -> None:
        with ledger.open("a", encoding="utf-8") as handle:
            handle.write(f"{run_id} {tool} {arguments.get('n')}\n")
            handle.flush()
            os.fsync(handle.fileno())

    def handler(tool: str):  # type: ignore[no-untyped-def]
        async def execute(arguments: Mapping[str, object]) -> str:
            await asyncio.sleep(random.uniform(0.0, 0.02))
            await asyncio.to_thread(record, tool, arguments)
            await asyncio.sleep(random.uniform(0.0, 0.02))
            return f"{tool} {arguments.get('n')} ok"

        return execute

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    return ToolRegistry(
        [
            ToolSpec(
                name="bump",
                description="idempotent",
                parameters=schema,
                handler=handler("bump"),
                replay_policy=ReplayPolicy.SAFE,
            ),
            ToolSpec(
                name="note",
                description="not idempotent",
                parameters=schema,
                handler=handler("note"),
                replay_policy=ReplayPolicy.NEVER,
            ),
        ]
    )


def build(directory: Path, run_id: str) -> tuple[AgentDefinition, RunRequest]:
    model = PausingModel(script_for(run_id), kind="kill-test-script", pause=0.03)
    tools = registry(directory, run_id)
    return killed_run(
        run_id,
        model,
        TinyParser("kill-test-parser"),
        JsonlRunStore(directory=directory),
        tools,
        steps=STEPS + 2,
        prompt="kill test",
    )


async def main(directory: Path, run_id: str) -> None:
    definition, request = build(directory, run_id)
    log = directory / f"{run_id}.jsonl"
    # A kill during the start leaves no log at all (the start is atomic, design 0020), so
    # "no file" reliably means "not started": nothing here cleans up after a half-way start.
    if log.exists():
        result = await resume(definition, request)
    else:
        result = await run(definition, request)
    print(f"DONE {result.stop_reason.value} {len(result.steps)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
