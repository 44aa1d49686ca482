"""A scripted agent for the batch tests, the guide and ``tools.bench.batch``: no model server.

``make_agent(store)`` is what ``--agent tests._batch_agents:make_agent`` (``python -m polyloop
batch run``) calls. Each run's model, given the item's prompt ``"<key> [flags]"``:

* call 0: calls the ``record`` tool (replay ``never``), which appends ``<key>`` to the ledger
  named by ``POLYLOOP_BATCH_LEDGER`` (if set): an effect that must never happen twice;
* call 1: answers ``done <key>``; with the flag ``fail-once``, the first attempt's call 1 raises
  instead (the run stops as ``llm_error``) and a retry (run id ending ``--2`` or later) answers.

``POLYLOOP_BATCH_DELAY`` (seconds, default 0) makes each model call wait, so that a kill lands
mid-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping

from polyloop import Agent, tool
from polyloop.parsers import JsonToolCallParser
from polyloop.ports import ModelCall, RunStore
from polyloop.session import AgentDefinition, RunRequest
from polyloop.types import ModelReply

__all__ = ["JsonlItemFactory", "ScriptedBatchModel", "make_agent", "record"]


@tool
async def record(key: str) -> str:
    """Record that the item's effect happened."""
    ledger = os.environ.get("POLYLOOP_BATCH_LEDGER")
    if ledger:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{key}\n".encode())
        finally:
            os.close(fd)
    return f"recorded {key}"


class ScriptedBatchModel:
    """The model of the module docstring (a ``ModelClient`` for the JSON tool-call parser)."""

    native_tool_calls = False

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, call: ModelCall) -> ModelReply:
        self.calls += 1
        delay = float(os.environ.get("POLYLOOP_BATCH_DELAY", "0"))
        if delay:
            await asyncio.sleep(delay)
        prompt = next(m for m in call.messages if m.role.value == "user").content[0].text
        key, *flags = prompt.split()
        if call.call_index == 0:
            text = json.dumps({"tool": "record", "arguments": {"key": key}})
        else:
            first_attempt = not call.run_id.rsplit("--", 1)[-1].isdigit()
            if "fail-once" in flags and first_attempt:
                raise ConnectionError(f"scripted failure of {key}'s first attempt")
            text = json.dumps({"final_answer": f"done {key}"})
        return ModelReply(call_id=f"c-{call.run_id}-{call.call_index}", content=text)

    def parameters(self) -> Mapping[str, str]:
        return {"model": "scripted-batch"}


def make_agent(store: RunStore) -> Agent[str]:
    """The agent over ``store`` (what ``--agent tests._batch_agents:make_agent`` names)."""
    return Agent(ScriptedBatchModel(), tools=[record], parser=JsonToolCallParser(), store=store)


class JsonlItemFactory:
    """An ``ItemFactory`` that pickles (for a batch on Ray): ``make_agent`` over a
    ``JsonlRunStore`` of ``directory``, the tool's ledger at ``ledger`` and the model's
    ``delay`` (set on the worker, in its environment)."""

    def __init__(self, directory: str, ledger: str, *, delay: float = 0.0) -> None:
        self.directory = directory
        self.ledger = ledger
        self.delay = delay

    @contextlib.asynccontextmanager
    async def __call__(
        self, item: str, run_id: str
    ) -> AsyncIterator[tuple[AgentDefinition, RunRequest]]:
        from polyloop.stores import JsonlRunStore

        os.environ["POLYLOOP_BATCH_LEDGER"] = self.ledger
        os.environ["POLYLOOP_BATCH_DELAY"] = str(self.delay)
        agent = make_agent(JsonlRunStore(directory=self.directory))
        yield agent.definition(), agent.request(item, run_id)
