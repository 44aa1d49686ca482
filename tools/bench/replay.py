"""Replay cost: CPU time of ``polyloop.session.replay`` over a recorded run of N steps.

``python -m tools.bench.replay [--quick] [--steps N] [--repeats R] [--json-out PATH]``

A run of N steps (each an action of a ``SAFE`` no-op tool, then a final answer at the last
step) is recorded once in a ``VolatileRunStore`` and read back as its ``RunLog``. Then the
replay of that log, through the same settings, is timed ``repeats`` times with
``time.process_time`` (CPU of this process; the machine is shared, so CPU, not wall time):
no model is called, no tool executed, nothing written. Prints the median and the largest
CPU time; the issue's bound is 1 s for 1,000 steps (``tests/unit/test_replay.py`` keeps a
CPU-bounded check of it).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from polyloop.parsers import JsonToolCallParser
from polyloop.ports import RunLog
from polyloop.session import AgentDefinition, RunRequest, replay, run
from polyloop.stores import VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ReplayPolicy,
    Role,
    StopReason,
    TextBlock,
)
from tools.bench._common import argument_parser, results_envelope, write_json

__all__ = ["agent", "main", "record_run", "replay_cpu_seconds"]

NAME = "replay"
STEPS = 1000
REPEATS = 5


async def _noop(arguments: Mapping[str, object]) -> str:
    return f"looked up {arguments.get('key', '')}"


def agent(
    steps: int, *, template: str = "Observation: {observation}"
) -> tuple[AgentDefinition, RunRequest]:
    """The recorded run's agent: a scripted model that looks up keys ``steps - 1`` times,
    then answers; a JSON tool-call parser; one ``SAFE`` tool."""
    script = [
        f'{{"tool": "lookup", "arguments": {{"key": "k{index}"}}}}' for index in range(steps - 1)
    ]
    script.append('{"final_answer": "done"}')
    tools = ToolRegistry(
        [
            ToolSpec(
                name="lookup",
                description="look a key up",
                parameters={"type": "object", "properties": {"key": {"type": "string"}}},
                handler=_noop,
                replay_policy=ReplayPolicy.SAFE,
            )
        ]
    )
    definition = AgentDefinition(
        model_client=ScriptedModelClient(script),
        decision_parser=JsonToolCallParser(),
        store=VolatileRunStore(),
    )
    request = RunRequest(
        run_id=f"bench-replay-{steps}",
        context=Context(
            run_level=(Message(role=Role.USER, content=(TextBlock(text="Look keys up."),)),)
        ),
        model_replay_policy=ReplayPolicy.SAFE,
        tools=tools,
        budget=Budget(
            max_steps=steps,
            max_actions=steps,
            max_consecutive_parse_failures=3,
            max_prompt_chars=100_000_000,
        ),
        observation_template=template,
    )
    return definition, request


async def record_run(steps: int) -> tuple[AgentDefinition, RunRequest, RunLog]:
    """Record a run of ``steps`` steps; its agent, request and log."""
    definition, request = agent(steps)
    result = await run(definition, request)
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.stop_reason
    log = await definition.store.read_log(request.run_id)
    return definition, request, log


def replay_cpu_seconds(definition: AgentDefinition, request: RunRequest, log: RunLog) -> float:
    """CPU seconds of one replay of ``log`` (asserting it is the same)."""
    gc.collect()
    started = time.process_time()
    report = asyncio.run(replay(definition, request, log=log))
    spent = time.process_time() - started
    assert report.same, report.describe()
    return spent


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "CPU time of replaying a recorded run of N steps.")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 50, 1
    definition, request, log = asyncio.run(record_run(args.steps))
    times = [replay_cpu_seconds(definition, request, log) for _ in range(args.repeats)]
    figures: dict[str, Any] = {
        "steps": float(args.steps),
        "median_cpu_s": statistics.median(times),
        "max_cpu_s": max(times),
        "median_cpu_us_per_step": statistics.median(times) / args.steps * 1e6,
    }
    write_json(args.json_out, results_envelope(NAME, argv, quick=args.quick, rows=[figures]))
    print(
        f"replay of a {args.steps}-step log: median {figures['median_cpu_s'] * 1000:.1f} ms CPU "
        f"({figures['median_cpu_us_per_step']:.1f} us/step), max "
        f"{figures['max_cpu_s'] * 1000:.1f} ms, {args.repeats} repeats"
    )
    return figures


if __name__ == "__main__":
    main()
