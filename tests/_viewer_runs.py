"""A long run that a person would open the viewer for (issue 26 item 6), written by the library.

``write_survey_run(directory)`` runs a 24-step agent against a scripted model that answers
with native tool calls only (empty reply text, token usage, a few milliseconds per call), whose
tool takes a few milliseconds too; one reply at step 5 names no tool the parser accepts (a
parse failure). The process "dies" inside the model call of step 14 (a ``BaseException``
raised from the model, as a kill would leave the log: the intent and no result), and the run
is resumed in the same store with an identical agent: the resume redoes that model call under
the intent on record and marks the first record it writes, that call's result (schema 1.8,
design 0215). ``crash_step=STEPS - 1`` kills the run in its last model call instead: the resume
then writes only that call's result, the final step and the finish. It ends with a final answer
at step 23. The log therefore has the context, one resume, a failure and two long runs of
near-identical ``lookup`` steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from polyloop.parsers import NativeToolCallParser
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.stores import JsonlRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    NativeToolCall,
    ReplayPolicy,
    Usage,
)

__all__ = [
    "CRASH_STEP",
    "QUESTION",
    "STEPS",
    "SURVEY_RUN",
    "survey_agent",
    "write_survey_run",
]

SURVEY_RUN = "survey-24"
STEPS = 24
CRASH_STEP = 14
PARSE_FAILURE_STEP = 5
QUESTION = "Which of the 22 stores has the lowest price for oat milk?"
INSTRUCTIONS = "You compare prices. Look every store up with the lookup tool, then answer."


class _Killed(BaseException):
    """What a kill looks like from inside the process: not an ``Exception``, so the session
    neither records it as a failed call nor writes a finish."""


async def lookup(store: int) -> str:
    """Look up a store's price for oat milk."""
    await asyncio.sleep(0.004)
    return f"store {store}: oat milk {1.5 + (store * 7 % 11) / 10:.2f}"


def _reply(step: int) -> ModelReply:
    usage = Usage(prompt_tokens=400 + 60 * step, completion_tokens=18)
    if step == STEPS - 1:
        return ModelReply(
            call_id=f"c{step}", content="Store 11 has the lowest price (1.50).", usage=usage
        )
    if step == PARSE_FAILURE_STEP:
        call = NativeToolCall(id=f"t{step}", name="lookup_store", arguments='{"store": 5}')
    else:
        store = step if step < PARSE_FAILURE_STEP else step - 1
        call = NativeToolCall(id=f"t{step}", name="lookup", arguments=f'{{"store": {store}}}')
    return ModelReply(call_id=f"c{step}", content="", usage=usage, tool_calls=(call,))


def _agent(directory: Path, *, crash: int | None) -> tuple[AgentDefinition, RunRequest]:
    replies: list[ModelReply | BaseException] = [_reply(step) for step in range(STEPS)]
    if crash is not None:
        replies[crash] = _Killed()
    model = ScriptedModelClient(replies, delay=0.012, native_tool_calls=True)
    agent = AgentDefinition(
        model_client=model,
        decision_parser=NativeToolCallParser(),
        store=JsonlRunStore(directory=directory),
    )
    request = RunRequest(
        run_id=SURVEY_RUN,
        context=Context(
            run_level=(Message.system(INSTRUCTIONS),), goal_level=(Message.user(QUESTION),)
        ),
        tools=ToolRegistry([ToolSpec.from_function(lookup, replay_policy=ReplayPolicy.SAFE)]),
        model_replay_policy=ReplayPolicy.SAFE,
        budget=Budget(max_steps=40, max_actions=40),
    )
    return agent, request


def survey_agent(directory: Path, *, max_steps: int = 40) -> tuple[AgentDefinition, RunRequest]:
    """The survey agent and request, uninterrupted, with a step budget of ``max_steps``."""
    agent, request = _agent(directory, crash=None)
    return agent, dataclasses.replace(request, budget=Budget(max_steps=max_steps, max_actions=40))


async def write_survey_run(directory: Path, *, crash_step: int = CRASH_STEP) -> Path:
    """Write the survey run's log into ``directory`` (killed in ``crash_step``'s model call,
    resumed)."""
    agent, request = _agent(directory, crash=crash_step)
    try:
        await run(agent, request)
    except _Killed:
        pass  # the "kill": the log ends with step crash_step's model intent
    else:
        raise AssertionError("the scripted kill did not happen")
    agent, request = _agent(directory, crash=None)
    await resume(agent, request)
    return directory / f"{SURVEY_RUN}.jsonl"
