"""A JSONL store on a disk that really fills up (issue 24): a tiny tmpfs mounted by the test.

The run writes until the file system has no room left. ``run()`` must fail with
``StoreUnavailableError`` (a ``PolyloopError``) naming the store, the run, the record and the
file, with the OS's ``ENOSPC`` as its cause; the log must still decode and pass ``check_log``
on the full disk; and once the file system is given room (``mount -o remount,size=...``) the
run resumes to its final answer, each ``NEVER`` action executed exactly once (one in doubt is
settled by its reconciler from the ledger). Mounting needs root, which CI has (it installs its
packages with ``apt-get``); elsewhere the test skips.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from _pg_agent import Model, Parser

from _infra import tmpfs
from polyloop.errors import PolyloopError, StoreUnavailableError
from polyloop.ports import ToolContext
from polyloop.session import AgentDefinition, RunRequest, check_log, run, run_or_resume
from polyloop.sinks import NullEventSink
from polyloop.stores import JsonlRunStore
from polyloop.tools import Reconciliation, ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ReplayPolicy,
    StopReason,
    SyntheticObservations,
)

pytestmark = pytest.mark.integration

STEPS = 150  # far more than 48 KiB holds (a step is about 1.5 KB of records)


@pytest.fixture
def tiny_disk() -> Iterator[Path]:
    with tmpfs("48k", mode="0700") as base:
        yield base


def tools(ledger: dict[str, int]) -> ToolRegistry:
    async def write(arguments: Mapping[str, object]) -> str:
        ledger[str(arguments["text"])] = ledger.get(str(arguments["text"]), 0) + 1
        return "written"

    async def reconcile(context: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        if ledger.get(str(arguments["text"])):
            return Reconciliation.executed("written")
        return Reconciliation.not_executed()

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return ToolRegistry(
        [
            ToolSpec(
                name="write", description="w", parameters=schema, handler=write, reconcile=reconcile
            )
        ]
    )


def agent(store: JsonlRunStore, script: list[str]) -> AgentDefinition:
    return AgentDefinition(
        model_client=Model(script),
        decision_parser=Parser(),
        store=store,
        event_sink=NullEventSink(),
        synthetic_observations=SyntheticObservations(
            action_rejected="rejected", env_failed="env failed", model_call_failed="failed"
        ),
    )


def request(registry: ToolRegistry) -> RunRequest:
    return RunRequest(
        run_id="full",
        budget=Budget(
            max_steps=STEPS + 1,
            max_actions=STEPS + 1,
            max_consecutive_parse_failures=2,
            max_prompt_chars=10**8,
        ),
        action_executor=registry.executor(),
        tools=registry,
        context=Context(run_level=(Message.user("go"),), goal_level=()),
        model_replay_policy=ReplayPolicy.SAFE,
    )


def remount(target: Path, size: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,size={size}", str(target)],
        check=True,
        capture_output=True,
        timeout=30,
    )


async def test_a_full_disk_stops_the_run_with_a_typed_error_and_it_resumes_once_there_is_room(
    tiny_disk: Path,
) -> None:
    script = [*(f"write s{i}" for i in range(STEPS)), "final"]
    ledger: dict[str, int] = {}
    registry = tools(ledger)
    store = JsonlRunStore(directory=tiny_disk / "logs")
    log_path = str(tiny_disk / "logs" / "full.jsonl")
    with pytest.raises(PolyloopError) as caught:
        await run(agent(store, script), request(registry))
    failure = caught.value
    assert isinstance(failure, StoreUnavailableError), repr(failure)
    assert failure.errno == errno.ENOSPC
    assert isinstance(failure.__cause__, OSError)
    assert failure.__cause__.errno == errno.ENOSPC
    assert failure.store == "JsonlRunStore"
    assert failure.run_id == "full"
    assert failure.record in {"intent", "model_call_result", "step_completed"}
    assert failure.path == log_path
    text = str(failure)
    assert f"could not write the {failure.record} record of run 'full' ({log_path})" in text
    assert "No space left on device" in text
    assert "free some space" in text

    log = await store.read_log("full")  # on the full disk still
    assert check_log(log, "full") is None
    written = len(log.steps)
    assert 0 < written < STEPS

    remount(tiny_disk, "16m")
    result = await run_or_resume(agent(store, script), request(registry))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(result.steps) == STEPS + 1
    assert ledger == {f"s{i}": 1 for i in range(STEPS)}, "a NEVER action ran twice or never"
    final = await store.read_log("full")
    assert check_log(final, "full") is None
    print(
        f"\ndisk full after {written} steps, at a {failure.record} record; resumed to the end "
        f"({len(final.settlements)} action in doubt settled)"
    )
