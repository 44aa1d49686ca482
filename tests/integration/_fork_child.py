"""A fork that the fork kill test SIGKILLs inside its own first tool call:
``python _fork_child.py DIR``.

It makes and drives the fork ``fork`` of the run ``src`` at step ``AT`` (``run_fork``; when
the fork's log exists, ``run_fork`` resumes it). Every tool execution is appended (and
fsynced) to ``DIR/ledger.txt`` as ``<run> <tool> <n>`` before the tool returns. The first
execution of the fork's step ``AT`` prints ``STALLED`` and waits forever, so the parent kills
the process there, with that execution in the ledger and its result nowhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _shared_doubles

from _shared_doubles import PausingModel, TinyParser, killed_run
from polyloop.session import AgentDefinition, RunRequest, run_fork
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy

AT = 3
SOURCE_SCRIPT = [
    *(f"tool:{tool} " + json.dumps({"n": n}) for n, tool in enumerate(["bump", "note"] * 2)),
    "final:source",
]
FORK_SCRIPT = [
    *(["unused"] * AT),
    "tool:bump " + json.dumps({"n": AT}),
    "tool:note " + json.dumps({"n": AT + 1}),
    "final:forked",
]


def _tools(directory: Path, run_id: str) -> ToolRegistry:
    ledger = directory / "ledger.txt"
    stall = directory / "stalled"

    def record(tool: str, arguments: Mapping[str, object]) -> None:
        with ledger.open("a", encoding="utf-8") as handle:
            handle.write(f"{run_id} {tool} {arguments.get('n')}\n")
            handle.flush()
            os.fsync(handle.fileno())

    def handler(tool: str):  # type: ignore[no-untyped-def]
        async def execute(arguments: Mapping[str, object]) -> str:
            await asyncio.to_thread(record, tool, arguments)
            if run_id == "fork" and arguments.get("n") == AT and not stall.exists():
                stall.write_text("once", encoding="utf-8")
                print("STALLED", flush=True)
                await asyncio.Event().wait()
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
    script = SOURCE_SCRIPT if run_id == "src" else FORK_SCRIPT
    return killed_run(
        run_id,
        PausingModel(script, kind="fork-kill-script", pause=0.0),
        TinyParser("fork-kill-parser"),
        JsonlRunStore(directory=directory),
        _tools(directory, run_id),
        steps=10,
        prompt="fork kill test",
    )


async def main(directory: Path) -> None:
    definition, request = build(directory, "fork")
    result = await run_fork(definition, request, source_run_id="src", at=AT)
    print(f"DONE {result.stop_reason.value} {len(result.steps)} {result.final_answer}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
