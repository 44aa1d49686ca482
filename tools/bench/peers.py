"""Optional: the per-step workload on polyloop and two peers, in one process, one sitting.

Not part of ``run_all``, CI or any dependency list. The peers live in a throwaway virtualenv::

    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install langgraph pydantic-ai-slim
    /tmp/peers-venv/bin/python -m tools.bench.peers [--quick] [--json-out PATH]

(run from the repository root; polyloop is imported from ``src/``, it has no dependencies).

The same loop everywhere: the model asks for one call of a no-op tool per step, N steps, on
in-memory state, nothing else costs anything.

* **polyloop**: ``run()`` with ``VolatileRunStore`` (the ``per_step`` workload);
* **LangGraph**: a ``StateGraph`` over ``MessagesState`` (model node -> ``ToolNode`` -> back)
  compiled with the in-memory checkpointer ``InMemorySaver``; the model node is a plain function
  returning an ``AIMessage`` with one tool call;
* **Pydantic AI**: an ``Agent`` on a ``FunctionModel`` that returns one ``ToolCallPart`` per
  request and a text answer after N tool calls (N+1 model requests; divided by N).

Graphs and agents are built outside the timed region; each timed run starts from fresh state.
Ratios measured in one process on one machine are the figures to quote; absolute times vary
between sittings on a shared virtual machine.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

_SRC = Path(__file__).resolve().parents[2] / "src"
if str(_SRC) not in sys.path:  # the peers' virtualenv does not have polyloop installed
    sys.path.insert(0, str(_SRC))

from polyloop.session import run  # noqa: E402 - after the sys.path line above
from polyloop.stores import VolatileRunStore  # noqa: E402
from tools.bench._common import (  # noqa: E402
    Workload,
    argument_parser,
    median,
    print_table,
    results_envelope,
    write_json,
)

NAME = "peers"
SIZES = (10, 50, 200)
QUICK_SIZES = (5,)
REPEATS = 5
QUICK_REPEATS = 1

Runner = Callable[[int, int], Awaitable[None]]
"""``runner(steps, attempt)``: one complete run of ``steps`` steps from fresh state."""


def polyloop_runner() -> Runner:
    workload = Workload.build()

    async def one(steps: int, attempt: int) -> None:
        definition = workload.definition(VolatileRunStore())
        result = await run(definition, workload.request(f"r{steps}-{attempt}", steps))
        assert len(result.steps) == steps

    return one


def langgraph_runner() -> Runner:
    # The peers are imported only here: this module must import without them.
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool
    def noop() -> str:
        """Does nothing and says ok."""
        return "ok"

    graphs: dict[int, Any] = {}

    def graph_for(steps: int) -> Any:
        def model(state: Any) -> Any:  # peers evaluate hints in module globals: keep them Any
            index = (len(state["messages"]) - 1) // 2
            call = {"name": "noop", "args": {}, "id": f"call-{index}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}

        def route(state: Any) -> Any:
            return END if (len(state["messages"]) - 1) // 2 >= steps else "model"

        builder = StateGraph(MessagesState)
        builder.add_node("model", model)
        builder.add_node("tools", ToolNode([noop]))
        builder.add_edge(START, "model")
        builder.add_edge("model", "tools")
        builder.add_conditional_edges("tools", route, ["model", END])
        return builder

    async def one(steps: int, attempt: int) -> None:
        if steps not in graphs:
            graphs[steps] = graph_for(steps)
        graph = graphs[steps].compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": f"t{attempt}"}, "recursion_limit": 2 * steps + 10}
        started = time.perf_counter()
        state = await graph.ainvoke({"messages": [("user", "go")]}, config)
        one.last_seconds = time.perf_counter() - started  # type: ignore[attr-defined]
        assert len(state["messages"]) == 1 + 2 * steps

    return _self_timed(one)


def pydantic_ai_runner() -> Runner:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import UsageLimits

    agents: dict[int, Any] = {}

    def agent_for(steps: int) -> Any:
        def reply(messages: Any, info: Any) -> Any:
            done = (len(messages) - 1) // 2
            if done < steps:
                part = ToolCallPart(tool_name="noop", args={}, tool_call_id=f"call-{done}")
                return ModelResponse(parts=[part])
            return ModelResponse(parts=[TextPart(content="done")])

        agent = Agent(FunctionModel(reply))

        @agent.tool_plain
        def noop() -> str:
            """Does nothing and says ok."""
            return "ok"

        return agent

    async def one(steps: int, attempt: int) -> None:
        if steps not in agents:
            agents[steps] = agent_for(steps)
        limits = UsageLimits(request_limit=steps + 5, tool_calls_limit=steps + 5)
        result = await agents[steps].run("go", usage_limits=limits)
        assert result.output == "done"

    return one


def _self_timed(runner: Runner) -> Runner:
    """Mark a runner that times itself (compilation stays outside the timed region)."""
    runner.self_timed = True  # type: ignore[attr-defined]
    return runner


async def time_runner(runner: Runner, steps: int, repeats: int) -> float:
    """Median milliseconds per step over ``repeats`` runs, after one warm-up run."""
    await runner(steps, -1)
    samples = []
    for attempt in range(repeats):
        started = time.perf_counter()
        await runner(steps, attempt)
        elapsed = time.perf_counter() - started
        if getattr(runner, "self_timed", False):
            elapsed = runner.last_seconds  # type: ignore[attr-defined]
        samples.append(elapsed / steps * 1e3)
    return median(samples)


async def measure(sizes: Sequence[int], repeats: int) -> list[dict[str, object]]:
    runners = {
        "polyloop": polyloop_runner(),
        "langgraph": langgraph_runner(),
        "pydantic_ai": pydantic_ai_runner(),
    }
    rows = []
    for steps in sizes:
        row: dict[str, object] = {"steps": steps}
        for name, runner in runners.items():
            row[f"{name}_ms_per_step"] = await time_runner(runner, steps, repeats)
        base = float(row["polyloop_ms_per_step"])  # type: ignore[arg-type]
        for name in ("langgraph", "pydantic_ai"):
            row[f"{name}_ratio"] = float(row[f"{name}_ms_per_step"]) / base  # type: ignore[arg-type]
        rows.append(row)
    return rows


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("langgraph", "langchain-core", "pydantic-ai-slim")}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "polyloop and two peers on the same loop, one process.")
    args = parser.parse_args(argv)
    rows = asyncio.run(
        measure(QUICK_SIZES if args.quick else SIZES, QUICK_REPEATS if args.quick else REPEATS)
    )
    results = results_envelope(NAME, argv, quick=args.quick, rows=rows, peer_versions=versions())
    print_table(
        "ms per step, same process (median of repeats); ratio = peer / polyloop",
        ["N", "polyloop", "LangGraph", "ratio", "Pydantic AI", "ratio"],
        [
            [
                row["steps"],
                row["polyloop_ms_per_step"],
                row["langgraph_ms_per_step"],
                row["langgraph_ratio"],
                row["pydantic_ai_ms_per_step"],
                row["pydantic_ai_ratio"],
            ]
            for row in rows
        ],
    )
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
