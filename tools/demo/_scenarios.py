"""The six runs of the demo and how each one is assembled.

``definition_for`` and ``request_for`` are the only places where the demo builds polyloop
objects. The parent process and the child process that gets killed both call them, so the
parameter snapshot recomputed by ``resume()`` matches the one the child recorded.
"""

from __future__ import annotations

import dataclasses
import io
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from polyloop.ports import EventSink, RunStore
from polyloop.session import AgentDefinition, RunRequest
from polyloop.stores import VolatileRunStore
from polyloop.types import Budget, ReplayPolicy, RunStarted, StopReason
from tools.demo._agent import (
    OBSERVATION_TEMPLATE,
    SYNTHETIC_OBSERVATIONS,
    ConsoleSink,
    FencedJsonParser,
    Goal,
    RuleBasedModel,
    build_context,
)
from tools.demo._world import ITEMS, Handler, Shop, World

__all__ = [
    "SCENARIOS",
    "Kill",
    "Scenario",
    "agent_for",
    "definition_for",
    "request_for",
    "scenario_named",
]

BUDGET: Final = Budget(
    max_steps=12, max_actions=12, max_consecutive_parse_failures=2, max_prompt_chars=20_000
)
TIGHT_BUDGET: Final = Budget(
    max_steps=4, max_actions=12, max_consecutive_parse_failures=2, max_prompt_chars=20_000
)


@dataclass(frozen=True, slots=True)
class Kill:
    """Kill the run's process while the ``call_number``-th call of ``tool`` is in flight.

    The tool's side effect has happened (it is in the ledger); its result never reaches the
    log. The log therefore ends with the action's intent and no result.
    """

    tool: str
    call_number: int


@dataclass(frozen=True, slots=True)
class Scenario:
    run_id: str
    story: str
    goal_kind: str
    expected: StopReason
    note: bool = False
    budget: Budget = BUDGET
    quirk: str | None = None
    kill: Kill | None = None

    def goal(self, world: World) -> Goal:
        salt = int(self.run_id[1])  # r1 ... r6: each run gets its own items
        if self.goal_kind == "price":
            return Goal(kind="price", items=(world.shop.pick_one(salt),))
        if self.goal_kind == "cheapest":
            return Goal(kind="cheapest", items=ITEMS)
        return Goal(kind="total", items=world.shop.pick_two(salt), note=self.note)


SCENARIOS: Final = (
    Scenario(
        run_id="r1-total",
        story="look up two prices, add them, write a note, submit",
        goal_kind="total",
        note=True,
        expected=StopReason.TASK_COMPLETED,
    ),
    Scenario(
        run_id="r2-question",
        story="look up one price, answer in words",
        goal_kind="price",
        expected=StopReason.FINAL_ANSWER,
    ),
    Scenario(
        run_id="r3-sloppy",
        story="the model forgets the JSON fence once, is told so, and recovers",
        goal_kind="total",
        quirk="unfenced-first-reply",
        expected=StopReason.TASK_COMPLETED,
    ),
    Scenario(
        run_id="r4-budget",
        story="compare all six prices with a budget of four steps",
        goal_kind="cheapest",
        budget=TIGHT_BUDGET,
        expected=StopReason.STEP_BUDGET,
    ),
    Scenario(
        run_id="r5-kill-safe",
        story="killed during the second lookup (SAFE), then resumed",
        goal_kind="total",
        kill=Kill(tool="lookup", call_number=2),
        expected=StopReason.TASK_COMPLETED,
    ),
    Scenario(
        run_id="r6-kill-never",
        story="killed during write_note (NEVER), then resumed",
        goal_kind="total",
        note=True,
        kill=Kill(tool="write_note", call_number=1),
        expected=StopReason.RESUME_STATE_UNKNOWN,
    ),
)


def scenario_named(run_id: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.run_id == run_id:
            return scenario
    known = ", ".join(s.run_id for s in SCENARIOS)
    raise ValueError(f"no demo scenario {run_id!r}; the scenarios are {known}")


def definition_for(scenario: Scenario, *, store: RunStore, sink: EventSink) -> AgentDefinition:
    return AgentDefinition(
        model_client=RuleBasedModel(quirk=scenario.quirk),
        decision_parser=FencedJsonParser(),
        store=store,
        event_sink=sink,
        synthetic_observations=SYNTHETIC_OBSERVATIONS,
    )


def request_for(
    scenario: Scenario,
    world: World,
    *,
    wrap: Callable[[str, Handler], Handler] | None = None,
) -> RunRequest:
    tools = world.registry(scenario.run_id, wrap=wrap)
    return RunRequest(
        run_id=scenario.run_id,
        budget=scenario.budget,
        tools=tools,
        action_executor=tools.executor(),  # derived from the same registry, as required
        context=build_context(scenario.goal(world), tools),
        # The rule-based model is free and deterministic, so repeating a call whose outcome was
        # lost is harmless. A paid or sampling model would usually say NEVER here.
        model_replay_policy=ReplayPolicy.SAFE,
        observation_template=OBSERVATION_TEMPLATE,
        # Recorded in the parameter snapshot: resuming with another --seed is refused as drift.
        fingerprints={"shop.seed": str(world.shop.seed)},
        model_binding={"demo.scenario": scenario.run_id},
    )


def agent_for(started: RunStarted) -> tuple[AgentDefinition, RunRequest]:
    """The demo's agent and request for a recorded demo run: the ``--agent`` factory of
    ``python -m polyloop replay`` (``tools.demo._scenarios:agent_for``) and ``fork``.

    The scenario comes from the run id (a fork's: its first source's), the shop from the seed
    the run recorded
    (``request.fingerprint.shop.seed``). The world's directory is never touched: replay
    executes nothing, and a fork's own actions run only when it is resumed, with an agent of
    the caller's making."""
    seed = int(started.parameter_snapshot.get("request.fingerprint.shop.seed", "7"))
    world = World(Path(tempfile.gettempdir()) / "polyloop-demo-world", Shop.from_seed(seed))
    # A fork (or a fork of a fork) of a demo run is that run's scenario: its root's.
    root = started.run_id if started.fork is None else started.fork.lineage[-1].run_id
    scenario = scenario_named(root)
    definition = definition_for(
        scenario, store=VolatileRunStore(), sink=ConsoleSink(out=io.StringIO())
    )
    return definition, dataclasses.replace(request_for(scenario, world), run_id=started.run_id)
