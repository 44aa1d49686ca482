"""The child process the demo kills: ``python -m tools.demo._victim --runs-dir D --seed S --run R``.

It starts run ``R`` exactly as the parent would, except that one tool handler is wrapped: on the
call named by the scenario's ``Kill`` the real handler runs (its side effect lands in the world
files), then the child prints ``IN_FLIGHT_MARKER`` and waits forever. By then polyloop has made
the action's intent durable and has not seen a result. The parent kills this process with
``SIGKILL``, so nothing after that point (no step record, no ``RunFinished``) is ever written.

Not meant to be run by hand; ``python -m tools.demo`` drives it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from polyloop.session import run
from polyloop.stores import JsonlRunStore
from tools.demo._agent import ConsoleSink
from tools.demo._scenarios import Kill, definition_for, request_for, scenario_named
from tools.demo._world import Handler, Shop, World

__all__ = ["IN_FLIGHT_MARKER", "main"]

IN_FLIGHT_MARKER: Final = "@@in-flight"
"""Printed (alone on a line) when the stalled call is in flight; followed by the tool name."""

FINISHED_MARKER: Final = "@@finished"
"""Printed if the run ended without reaching the stall: a bug in the scenario."""


def _stall_wrapper(kill: Kill) -> Callable[[str, Handler], Handler]:
    calls = 0

    def wrap(name: str, handler: Handler) -> Handler:
        if name != kill.tool:
            return handler

        async def stalled(arguments: Mapping[str, object]) -> str:
            nonlocal calls
            calls += 1
            result = await handler(arguments)
            if calls == kill.call_number:
                print(f"{IN_FLIGHT_MARKER} {name}", flush=True)
                await asyncio.Event().wait()  # until SIGKILL
            return result

        return stalled

    return wrap


async def _run_until_killed(runs_dir: Path, seed: int, run_id: str) -> int:
    scenario = scenario_named(run_id)
    if scenario.kill is None:
        raise ValueError(f"scenario {run_id!r} has no Kill; only killed scenarios run here")
    world = World(runs_dir / "world", Shop.from_seed(seed))
    definition = definition_for(
        scenario, store=JsonlRunStore(directory=runs_dir), sink=ConsoleSink(indent="")
    )
    wrap = _stall_wrapper(scenario.kill)
    request = request_for(scenario, world, wrap=wrap)
    result = await run(definition, request)
    print(f"{FINISHED_MARKER} {result.stop_reason.value}", flush=True)
    return 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo._victim")
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--run", required=True)
    args = parser.parse_args(argv)
    return asyncio.run(_run_until_killed(args.runs_dir, args.seed, args.run))


if __name__ == "__main__":
    sys.exit(main())
