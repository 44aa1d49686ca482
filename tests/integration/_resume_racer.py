"""A process that resumes runs on command, for the two-resumers race in test_lease_processes.

``python _resume_racer.py STORE LOCATION LEDGER``: STORE is ``jsonl`` (LOCATION a directory)
or ``postgres`` (LOCATION a libpq string). For each line of run ids read from stdin it resumes
each of those runs once, concurrently, with ``lease_wait_seconds=0``, and prints one line per
run id: ``<run id> advanced`` or ``<run id> held`` (``RunLeaseHeldError``); ``quit`` ends it.
The agent's ``write`` tool is a ``NEVER`` side effect: it appends ``<run id> <text> <pid>`` to
LEDGER (``O_APPEND``) and then waits (at most ``PATIENCE_SECONDS``) until the other racer has
been refused this run (it leaves ``LEDGER.<run id>.held``), so the winner certainly holds the
lease while the loser tries: the race does not depend on timing.

``agent(ledger)`` and ``request(run_id)`` are imported by the test to write the runs' logs.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import time
from collections.abc import Mapping

from _pg_agent import definition

from polyloop.errors import RunLeaseHeldError
from polyloop.ports import RunStore
from polyloop.session import AgentDefinition, RunRequest, resume
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ReplayPolicy,
)

PATIENCE_SECONDS = 10.0
RUN_ID: contextvars.ContextVar[str] = contextvars.ContextVar("RUN_ID", default="?")
SCRIPT = ("write first", "write second", "final")


def _wait_for_file(path: str) -> None:
    """Poll for ``path`` for at most ``PATIENCE_SECONDS`` (in a worker thread)."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def tools(ledger: str) -> ToolRegistry:
    async def write(arguments: Mapping[str, object]) -> str:
        run_id = RUN_ID.get()
        descriptor = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, f"{run_id} {arguments['text']} {os.getpid()}\n".encode())
        finally:
            os.close(descriptor)
        if arguments["text"] == "second":  # the step the racers resume into
            await asyncio.to_thread(_wait_for_file, f"{ledger}.{run_id}.held")
        return "written"

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    spec = ToolSpec(
        name="write", description="a NEVER side effect", parameters=schema, handler=write
    )
    return ToolRegistry([spec])


def agent(store: RunStore) -> AgentDefinition:
    """The PostgreSQL process tests' agent (``_pg_agent``) with the racers' script."""
    model = ScriptedModelClient(SCRIPT, call_id_prefix="c", parameters={"model": "racer"})
    return definition(store, model)


def request(run_id: str, ledger: str) -> RunRequest:
    registry = tools(ledger)
    return RunRequest(
        run_id=run_id,
        budget=Budget(
            max_steps=10, max_actions=10, max_consecutive_parse_failures=2, max_prompt_chars=10**6
        ),
        action_executor=registry.executor(),
        tools=registry,
        context=Context(run_level=(Message.user("race"),), goal_level=()),
        model_replay_policy=ReplayPolicy.NEVER,
    )


async def _resume_once(store: RunStore, run_id: str, ledger: str) -> str:
    RUN_ID.set(run_id)  # this task's context: the tool's ledger line names the run
    try:
        await resume(agent(store), request(run_id, ledger))
    except RunLeaseHeldError:
        os.close(os.open(f"{ledger}.{run_id}.held", os.O_WRONLY | os.O_CREAT, 0o644))
        return f"{run_id} held"
    return f"{run_id} advanced"


async def serve(kind: str, location: str, ledger: str) -> None:
    if kind == "postgres":
        from polyloop.stores import PostgresRunStore

        store: RunStore = await PostgresRunStore.open(location, pool_size=2, lease_seconds=10)
    else:
        from polyloop.stores import JsonlRunStore

        store = JsonlRunStore(directory=location)
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line in {"", "quit"}:
            break
        verdicts = await asyncio.gather(
            *(_resume_once(store, run_id, ledger) for run_id in line.split())
        )
        print("\n".join(verdicts), flush=True)
    if kind == "postgres":
        await store.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3]))
