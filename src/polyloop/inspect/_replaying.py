"""``fork`` and ``replay``: a new run from a run's first steps, and a recorded run driven
through today's code offline (issue 40, designs 0239 and 0240).

``python -m polyloop fork PLACE --run R --at K --new-run N [--agent module:factory]`` makes
the fork's log in the store that keeps ``R`` (``polyloop.session.fork``: the source's steps
``0 .. K-1`` copied under ``N``'s lease, its origin on record; nothing is called or executed)
and prints one line saying what it wrote and how to continue it: with the agent, by
``polyloop.session.resume`` or ``run_or_resume`` under ``N``. Without ``--agent`` the fork
keeps the source's settings; with it, the factory's settings (another model, prompt, tools,
budget) are the fork's, so a resume under them finds no drift.

``python -m polyloop replay PLACE --agent module:factory`` replays every run at ``PLACE`` (a
log, a directory, a store URL) with ``polyloop.session.replay`` and prints one line per run:
``<run>: same (N steps)``, ``<run>: diverged at step K: <what>: <detail>`` or ``<run>: not
replayed: <why>``; then a count. Exit status 1 when any run diverged or was not replayed, so a
downstream CI can run it over its recorded runs.

The factory is ``module:function`` (the module importable from the current directory): called
with a run's ``RunStarted`` (for a fork: the source's), it returns the ``AgentDefinition`` and
``RunRequest`` to use. For ``replay`` nothing of them is called: the replies and outcomes on
record stand in for the model and the tools. For ``fork`` only their parameter snapshot and
context are taken, with the store that keeps the run and the run id ``N``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import sys
from collections.abc import Callable
from typing import Final, TypeVar

from polyloop.errors import (
    DecodeError,
    ForkError,
    InspectError,
    LogCorruptError,
    PolyloopError,
    RunIdentityError,
)
from polyloop.inspect._locator import RunPlace, open_target
from polyloop.inspect._resolve import check_lease_wait, write_decision
from polyloop.inspect._safe import Writer, visible
from polyloop.inspect._units import plural
from polyloop.ports import RunStore
from polyloop.session import AgentDefinition, RunRequest, fork, replay
from polyloop.stores import assemble_log, decode_lines
from polyloop.types import ForkOrigin, RunStarted

__all__ = ["add_fork_replay_parsers", "cmd_fork", "cmd_replay", "load_factory"]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

Factory = Callable[[RunStarted], tuple[AgentDefinition, RunRequest]]

_FACTORY_ERRORS: Final = (PolyloopError, InspectError, ValueError, LookupError, TypeError)
"""What a factory (the user's code) raises for a run it cannot build (an unknown run id, a
missing setting): that run's line (``replay``) or the command's error (``fork``)."""

_AGENT_HELP: Final = (
    "module:function: called with a run's RunStarted, returns (AgentDefinition, RunRequest) "
    "built as your agent builds them (the module importable from the current directory)"
)


def add_fork_replay_parsers(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Add the ``fork`` and ``replay`` subcommands to ``commands``."""
    fork_cmd = commands.add_parser(
        "fork",
        help="a new run whose first steps are a copy of a run's (writes the fork's log)",
        description="Make a fork: a new run whose steps 0..K-1 are a copy of run R's (nothing "
        "is called or executed for them; R is only read), with its origin on record. Continue "
        "it with its agent: polyloop.session.resume or run_or_resume under the new run id.",
    )
    fork_cmd.add_argument(
        "place", metavar="PLACE", help="a log, a directory of logs or a store URL"
    )
    fork_cmd.add_argument("--run", required=True, metavar="R", help="the run to fork")
    fork_cmd.add_argument(
        "--at",
        required=True,
        type=int,
        metavar="K",
        help="copy steps 0..K-1; the fork goes on at K",
    )
    fork_cmd.add_argument("--new-run", required=True, metavar="N", help="the fork's run id")
    fork_cmd.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="the fork's settings (" + _AGENT_HELP + "); default: the source's",
    )
    fork_cmd.add_argument(
        "--lease-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long to wait for the new run's lease (default 0)",
    )
    replay_cmd = commands.add_parser(
        "replay",
        help="drive recorded runs through today's code offline; where each diverges (exit 1)",
        description="Replay every run at PLACE through the agent's settings: the recorded "
        "replies stand in for the model and the recorded outcomes for the tools, nothing is "
        "sent or executed. One line per run: same, or the first step that differs and what "
        "(prompt, decision, tool, stop_reason).",
    )
    replay_cmd.add_argument(
        "place", metavar="PLACE", help="a log, a directory of logs or a store URL"
    )
    replay_cmd.add_argument("--agent", required=True, metavar="MODULE:FUNCTION", help=_AGENT_HELP)
    replay_cmd.add_argument("--run", metavar="R", help="replay only this run")


def load_factory(spec: str) -> Factory:
    """The function ``module:function`` names (``InspectError`` when it cannot be loaded)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise InspectError(f"--agent must be MODULE:FUNCTION, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the current directory, as python -m does for its own module
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InspectError(
            f"--agent {spec}: module {module_name!r} cannot be imported ({exc})"
        ) from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InspectError(f"--agent {spec}: {module_name} has no function {name!r}")
    return factory  # type: ignore[no-any-return]


def _agent(factory: Factory, started: RunStarted, spec: str) -> tuple[AgentDefinition, RunRequest]:
    built = factory(started)
    if (
        not isinstance(built, tuple)
        or len(built) != 2
        or not isinstance(built[0], AgentDefinition)
        or not isinstance(built[1], RunRequest)
    ):
        raise InspectError(
            f"--agent {spec} must return (AgentDefinition, RunRequest), got {type(built).__name__}"
        )
    return built


# --------------------------------------------------------------------------- fork


async def _fork(store: RunStore, place: RunPlace, args: argparse.Namespace) -> ForkOrigin:
    definition = request = None
    if args.agent is not None:
        factory = load_factory(args.agent)
        source = await store.read_log(place.run_id)
        if source.started is None:
            raise InspectError(f"{place.where}: holds no run {place.run_id!r}")
        try:
            definition, request = _agent(factory, source.started, args.agent)
        except _FACTORY_ERRORS as exc:
            raise InspectError(f"--agent {args.agent}: {' '.join(str(exc).split())}") from exc
        # The fork runs in this store, under its own id: its snapshot says so.
        definition = dataclasses.replace(definition, store=store)
        request = dataclasses.replace(request, run_id=args.new_run)
    try:
        return await fork(
            store,
            place.run_id,
            at=args.at,
            new_run_id=args.new_run,
            definition=definition,
            request=request,
            lease_wait_seconds=args.lease_wait,
        )
    except ForkError as exc:
        raise InspectError(f"refused [{exc.reason}]: {exc}") from exc
    except RunIdentityError as exc:
        raise InspectError(f"refused: {exc}") from exc


def _copied(step_idx: int) -> str:
    return {0: "the start", 1: "step 0"}.get(step_idx, f"steps 0..{step_idx - 1}")


def cmd_fork(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    """``fork``: write the fork's log; say what it holds and how to continue it."""
    del err
    check_lease_wait(args.lease_wait)
    place = open_target(args.place).run(args.run)
    origin = write_decision(place, lambda store: _fork(store, place, args), {})
    settings = "the source's settings" if args.agent is None else f"the settings of {args.agent}"
    print(
        visible(
            f"forked: run {args.new_run!r} now holds {_copied(origin.step_idx)} of run "
            f"{origin.run_id!r} ({origin.records} records, prefix {origin.digest}), under "
            f"{settings}; nothing "
            f"was called or executed. Next: continue it with its agent "
            f"(polyloop.session.resume or run_or_resume, run id {args.new_run!r}): it goes on "
            f"live at step {origin.step_idx}"
        ),
        file=out,
    )
    return 0


# --------------------------------------------------------------------------- replay


async def _replay_one(raw: bytes, run_id: str, factory: Factory, spec: str) -> tuple[str, bool]:
    """The run's line, and whether it replayed the same."""
    try:
        entries = decode_lines(raw, run_id=run_id)
    except (DecodeError, LogCorruptError) as exc:
        detail = " ".join(str(exc).split())
        return f"{run_id}: not replayed: the log does not decode ({detail})", False
    log = assemble_log((e.record for e in entries), lines=(e.line for e in entries))
    if log.started is None:
        return f"{run_id}: not replayed: the log holds no RunStarted", False
    try:
        definition, request = _agent(factory, log.started, spec)
        request = dataclasses.replace(request, run_id=log.started.run_id)
        report = await replay(definition, request, log=log)
    # The factory is the user's code: what it raises for a run it cannot build (an unknown
    # run id, a missing setting) is that run's line, and the other runs are still replayed.
    except _FACTORY_ERRORS as exc:
        return f"{run_id}: not replayed: {' '.join(str(exc).split())}", False
    return report.describe(), report.same


def cmd_replay(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    """``replay``: one line per run, then a count; 1 when any diverged or was not replayed."""
    del err
    factory = load_factory(args.agent)
    place = open_target(args.place)
    logs = place.logs(args.run)
    if args.run is not None:
        logs = [log for log in logs if log.run_id == args.run]
    if not logs:
        raise InspectError(f"{place.shown}: holds no run to replay")
    same = 0
    for stored in logs:
        line, alike = asyncio.run(_replay_one(stored.read(), stored.run_id, factory, args.agent))
        same += alike
        print(visible(line), file=out)
    print(
        f"replayed {plural(len(logs), 'run')}: {same} same, {len(logs) - same} diverged or "
        "not replayed",
        file=out,
    )
    return 0 if same == len(logs) else 1
