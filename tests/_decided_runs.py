"""Three runs a person decided on, written by ``Agent`` (issue 36 points 2-4, design 0230/0231).

``write_decided_runs(directory)`` writes, in one ``JsonlRunStore`` directory:

* ``rejected``: ``refund`` needs approval; the run stops awaiting it, ``bob`` rejects it with
  ``REASON``, and the run, started again, finishes (the model read the rejection);
* ``settled``: the process "dies" inside ``refund`` (a ``BaseException`` after its effect, as
  a kill leaves the log), the run started again stops in doubt, ``al`` settles it as executed,
  and the run, started again, finishes without running the tool again;
* ``doubt``: killed the same way and started again once: it stopped in doubt again and is
  left so (its resume's mark is on a ``resume_stopped`` record, schema 1.9).

Every ``Agent`` is a fresh one, as after a restart. ``Decided.refunds`` counts the tool's real
effects (``settled``: once; ``rejected``: never; ``doubt``: once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from polyloop import Agent, tool
from polyloop.testing import ScriptedModelClient
from polyloop.types import ModelReply, NativeToolCall

__all__ = ["PROMPT", "REASON", "Decided", "Died", "decided_agent", "write_decided_runs"]

PROMPT = "Refund order 7."
REASON = "over the limit"


class Died(BaseException):
    """Stands for the process dying inside the tool: nothing in the library catches it."""


@dataclass
class Decided:
    """The tool's own system: every refund that happened, by run; whether the next dies."""

    refunds: dict[str, int] = field(default_factory=dict)
    die: bool = False


def _call(name: str, arguments: dict[str, object], index: int) -> ModelReply:
    call = NativeToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))
    return ModelReply(call_id=f"r{index}", content="", tool_calls=(call,))


def decided_agent(world: Decided, store: Path, run_id: str, **flags: object) -> Agent[str]:
    """A fresh agent whose ``refund`` tool counts into ``world`` (``flags`` go to ``@tool``)."""

    @tool(**flags)  # type: ignore[call-overload]
    async def refund(amount: int) -> str:
        """Refund money."""
        world.refunds[run_id] = world.refunds.get(run_id, 0) + 1
        if world.die:
            world.die = False
            raise Died
        return f"refunded {amount}"

    script = [_call("refund", {"amount": 250}, 0), "done"]
    return Agent(ScriptedModelClient(script, native_tool_calls=True), tools=[refund], store=store)


async def _killed_in_the_tool(world: Decided, store: Path, run_id: str) -> None:
    world.die = True
    try:
        await decided_agent(world, store, run_id).run(PROMPT, run_id=run_id)
    except Died:
        return
    raise AssertionError("the tool was to die")


async def write_decided_runs(directory: Path) -> Decided:
    """Write the three runs into ``directory`` (see the module docstring)."""
    world = Decided()
    first = await decided_agent(world, directory, "rejected", needs_approval=True).run(
        PROMPT, run_id="rejected"
    )
    assert first.pending_approval is not None
    agent = decided_agent(world, directory, "rejected", needs_approval=True)
    await agent.reject("rejected", digest=first.pending_approval.digest, by="bob", reason=REASON)
    await agent.run(PROMPT, run_id="rejected")

    await _killed_in_the_tool(world, directory, "settled")
    agent = decided_agent(world, directory, "settled")
    stuck = await agent.run(PROMPT, run_id="settled")
    assert stuck.unknown_outcome is not None
    await agent.resolve(
        "settled", result_id="a0", executed=True, observation="refunded 250", by="al"
    )
    await decided_agent(world, directory, "settled").run(PROMPT, run_id="settled")

    await _killed_in_the_tool(world, directory, "doubt")
    await decided_agent(world, directory, "doubt").run(PROMPT, run_id="doubt")
    return world
