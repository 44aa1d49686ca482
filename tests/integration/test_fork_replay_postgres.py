"""Fork and replay on ``PostgresRunStore`` (issue 40; designs 0239, 0240; the JSONL and
volatile stores: tests/unit/test_fork.py and test_replay.py).

The fork is written under the new run's fenced lease, copies the source's first steps with
no model call and no tool call for them, passes ``check_log`` and goes on live; the source's
records are unchanged; replaying the source and the fork from the database says "same".
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping

import pytest
from tools.bench.postgres_listing import url_of

from _shared_doubles import TEXTS, TinyParser
from polyloop.inspect import main
from polyloop.ports import ModelCall, RunStore
from polyloop.session import AgentDefinition, RunRequest, check_log, replay, run, run_fork
from polyloop.stores import PostgresRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Context,
    Message,
    ReplayPolicy,
    Role,
    RunStarted,
    StopReason,
    TextBlock,
)

pytestmark = pytest.mark.integration


class _Guarded(ScriptedModelClient):
    def __init__(self, script: list[str], first: int) -> None:
        super().__init__(script)
        self.first = first

    async def before_reply(self, call: ModelCall) -> None:
        assert call.call_index >= self.first, f"model called for copied step {call.call_index}"


def _agent(
    store: RunStore, run_id: str, script: list[str], first: int, ledger: list[int]
) -> tuple[AgentDefinition, RunRequest]:
    async def write(arguments: Mapping[str, object], ctx: object) -> str:
        step = getattr(ctx, "step_idx", -1)
        assert step >= first, f"tool called for copied step {step}"
        ledger.append(step)
        return "written"

    write.takes_context = True  # type: ignore[attr-defined]
    tools = ToolRegistry(
        [ToolSpec(name="write", description="write a note", parameters={}, handler=write)]
    )
    definition = AgentDefinition(
        model_client=_Guarded(script, first),
        decision_parser=TinyParser(),
        store=store,
        synthetic_observations=TEXTS,
    )
    request = RunRequest(
        run_id=run_id,
        context=Context(run_level=(Message(role=Role.USER, content=(TextBlock(text="go"),)),)),
        model_replay_policy=ReplayPolicy.NEVER,
        tools=tools,
    )
    return definition, request


async def test_fork_and_replay_on_postgres(postgres_database: str) -> None:
    store = await PostgresRunStore.open(postgres_database, pool_size=2)
    ledger: list[int] = []
    try:
        script = ["tool:write {}", "tool:write {}", "tool:write {}", "final:old"]
        source_agent, source_req = _agent(store, "src", script, 0, ledger)
        assert (await run(source_agent, source_req)).stop_reason is StopReason.FINAL_ANSWER
        assert ledger == [0, 1, 2]
        before = await store.read_log("src")

        fork_agent, fork_req = _agent(store, "fork", ["x", "x", "final:new"], 2, ledger)
        result = await run_fork(fork_agent, fork_req, source_run_id="src", at=2)

        assert result.final_answer == "new"
        assert ledger == [0, 1, 2]  # the NEVER writes of the prefix were not executed again
        assert await store.read_log("src") == before
        forked = await store.read_log("fork")
        assert check_log(forked, "fork") is None
        assert forked.started is not None
        assert forked.started.fork is not None
        assert (forked.started.fork.run_id, forked.started.fork.step_idx) == ("src", 2)
        assert [c.step for c in forked.steps[:2]] == [c.step for c in before.steps[:2]]

        assert (await replay(source_agent, source_req)).same
        assert (await replay(fork_agent, fork_req)).same
    finally:
        await store.close()


def replay_agent(started: RunStarted) -> tuple[AgentDefinition, RunRequest]:
    """The ``--agent`` factory of the command-line replay below (nothing of it is called)."""
    return _agent(_NO_STORE, started.run_id, [], 0, [])


_NO_STORE = VolatileRunStore()


def test_the_replay_command_reads_a_database(postgres_database: str) -> None:
    async def record() -> None:
        store = await PostgresRunStore.open(postgres_database, pool_size=1)
        try:
            agent, req = _agent(store, "db-run", ["tool:write {}", "final:ok"], 0, [])
            await run(agent, req)
        finally:
            await store.close()

    asyncio.run(record())
    out, err = io.StringIO(), io.StringIO()
    status = main(
        [
            "replay",
            url_of(postgres_database),
            "--agent",
            "test_fork_replay_postgres:replay_agent",
        ],
        out=out,
        err=err,
    )
    assert status == 0, out.getvalue() + err.getvalue()
    assert out.getvalue().splitlines() == [
        "db-run: same (2 steps)",
        "replayed 1 run: 1 same, 0 diverged or not replayed",
    ]
