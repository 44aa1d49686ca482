"""``resolve``: a person's word on the execution a run is in doubt about (issue 21, design 0206).

``python -m polyloop resolve LOG --result-id ID (--executed --observation TEXT |
--not-executed) --by NAME [--note TEXT] [--run-id RUN]`` opens the store that keeps the run
(``locate_run``: the inspector's store locator finds it, a ``JsonlRunStore``'s directory or a
``PostgresRunStore``'s URL; ``polyloop.inspect._locator``), calls
``polyloop.session.resolve`` (which writes one ``Settlement`` record under the
run's lease, fenced like every write, and only for the one action in doubt), and prints one
line: what was recorded and what to do next (resume the run with its agent). It writes
nothing but that record (as ``approve`` and ``reject``, the other two that write, share
``locate_run`` and ``write_decision`` with it).

``LOG`` is the run's ``<run_id>.jsonl`` file, or a directory of logs (or ``jsonl://PATH``)
with ``--run-id`` (optional when the directory holds exactly one log), or a ``postgres://`` URL
with ``--run-id`` (design 0213, amendment; the password from libpq's usual places, never
printed). Every refusal is an ``InspectError``: one line naming the reason
(``ResolutionError.reason`` in brackets, or a held or lost lease, a corrupt log, a bad
argument) and the fix, exit status 2; nothing was written. A store that fails says whether
it failed before the record was sent (nothing written) or while it was being written (it may
have been: ``show`` says).
What it prints (the recorded line, every refusal) is made visible (``polyloop.inspect._safe``):
the run id, the idempotency key, the names and notes come from the log or the command line and
may hold control characters (issue 22, item 6).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
from collections.abc import Callable, Coroutine, Mapping
from typing import Final, TypeVar

from polyloop.errors import (
    DecodeError,
    InspectError,
    LogCorruptError,
    PolyloopTypeError,
    PolyloopValueError,
    ResolutionError,
    RunLeaseHeldError,
    RunLeaseLostError,
    StoreUnavailableError,
)
from polyloop.inspect._locator import RunPlace, open_target
from polyloop.inspect._safe import Writer, visible
from polyloop.inspect._view import step_index
from polyloop.ports import RunStore
from polyloop.session import resolve
from polyloop.types import Settlement, SettlementVerdict

__all__ = [
    "LOG_HELP",
    "RUN_ID_HELP",
    "RunPlace",
    "add_resolve_parser",
    "check_lease_wait",
    "cmd_resolve",
    "locate_run",
    "write_decision",
]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)
_Decided = TypeVar("_Decided")

LOG_HELP: Final = (
    "the run's <run_id>.jsonl log, a directory of logs (or jsonl://PATH) with --run-id, or a "
    "PostgresRunStore's postgresql://user@host:port/dbname with --run-id"
)
RUN_ID_HELP: Final = "the run, when LOG is a directory holding several logs or a postgres:// URL"

_FIXES: Final[dict[str, str]] = {
    "no_log": "check the run id: python -m polyloop ls {where} lists the runs there",
    "finished": "there is nothing to settle; python -m polyloop show {log} shows how it ended",
    "nothing_in_doubt": (
        "python -m polyloop show {log} says what resume will do; resume the run with its agent "
        "(polyloop.session.run_or_resume)"
    ),
    "model_call": (
        "only an action can be settled; the run stays at resume_state_unknown, so start the "
        "task again under a new run id"
    ),
    "wrong_result_id": (
        "pass the one in doubt as --result-id (python -m polyloop show {log} prints the command)"
    ),
    "store_cannot_settle": "use a store that has write_settlement (the shipped ones do)",
}


def add_resolve_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Add the ``resolve`` subcommand to ``commands``."""
    resolve_cmd = commands.add_parser(
        "resolve",
        help="settle the execution a run is in doubt about (a person's word; writes one record)",
        description="Record a person's verdict on the one action a run is in doubt about (its "
        "intent is in the log, its result is not: the process died inside the tool). Look it up "
        "in the tool's own system first (python -m polyloop show LOG names its idempotency "
        "key), then resume the run with its agent (polyloop.session.run_or_resume).",
    )
    resolve_cmd.add_argument(
        "log",
        metavar="LOG",
        help=LOG_HELP,
    )
    resolve_cmd.add_argument(
        "--result-id",
        required=True,
        metavar="ID",
        help="the execution in doubt (a<step>; python -m polyloop show names it)",
    )
    verdict = resolve_cmd.add_mutually_exclusive_group(required=True)
    verdict.add_argument(
        "--executed",
        action="store_true",
        help="it happened: resume records --observation as the step's observation and "
        "executes nothing",
    )
    verdict.add_argument(
        "--not-executed",
        action="store_true",
        help="it did not happen: resume executes the action, with its idempotency key",
    )
    resolve_cmd.add_argument(
        "--observation",
        metavar="TEXT",
        help="with --executed (required there): what the tool's system says happened",
    )
    resolve_cmd.add_argument(
        "--by", required=True, metavar="NAME", help="who decides (recorded with the verdict)"
    )
    resolve_cmd.add_argument("--note", default="", metavar="TEXT", help="why (recorded too)")
    resolve_cmd.add_argument("--run-id", metavar="RUN", help=RUN_ID_HELP)
    resolve_cmd.add_argument(
        "--lease-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long to wait for the run's lease when another process holds it (default 0)",
    )


def locate_run(log: str, run_id: str | None) -> RunPlace:
    """The store and the run id that ``LOG`` (and ``--run-id``) name, as the store locator
    finds them (``Place.run``; ``polyloop.inspect._locator``).

    ``InspectError`` when the target is not a log file, a directory or a store URL, names no
    existing log, a ``--run-id`` contradicts the file's name (``JsonlRunStore`` keeps run R in
    R.jsonl), or a URL comes without ``--run-id`` (a database holds many runs). Whether a
    database holds the run is the session's to say (``ResolutionError``, reason ``no_log``).
    """
    return open_target(log).run(run_id)


def _refusal(exc: ResolutionError, place: RunPlace, fixes: Mapping[str, str]) -> str:
    message = str(exc).removeprefix("resolve: ")
    fix = fixes.get(exc.reason)
    where = shlex.quote(place.where)
    tail = "" if fix is None else "; " + fix.format(log=place.show, where=where)
    return f"refused [{exc.reason}]: {message}{tail}"


async def _on_store(
    place: RunPlace, decide: Callable[[RunStore], Coroutine[object, object, _Decided]]
) -> _Decided:
    async with place.store() as store:
        return await decide(store)


def write_decision(
    place: RunPlace,
    decide: Callable[[RunStore], Coroutine[object, object, _Decided]],
    fixes: Mapping[str, str],
) -> _Decided:
    """Run ``decide`` on the store that keeps ``place``'s run: the one way the commands that
    write (``resolve``, ``approve``, ``reject``) put a decision on record. Every expected
    failure becomes one ``InspectError`` line naming the reason and the fix (``fixes``, by
    ``ResolutionError.reason``, formatted with ``log``, the place's ``show``, and ``where``),
    never a password. Nothing was written, except perhaps where the store failed while the
    record was being written (``StoreUnavailableError`` naming a record: the line says so and
    how to look)."""
    run_id, where = place.run_id, place.where
    try:
        return asyncio.run(_on_store(place, decide))
    except ResolutionError as exc:
        raise InspectError(_refusal(exc, place, fixes)) from exc
    except RunLeaseHeldError as exc:
        raise InspectError(
            f"refused [lease_held]: another process holds run {run_id!r}'s lease (a resume in "
            "progress, or one that has not let go yet); nothing was written: wait for it to "
            "end and try again, or pass --lease-wait SECONDS"
        ) from exc
    except RunLeaseLostError as exc:
        raise InspectError(
            f"refused [lease_lost]: run {run_id!r}'s lease was lost before the decision was "
            "written (it expired, or another process took the run over); nothing was "
            f"written: python -m polyloop show {place.show} says where the run is, then try "
            "again"
        ) from exc
    except (LogCorruptError, DecodeError) as exc:
        raise InspectError(
            f"refused [corrupt_log]: {' '.join(str(exc).split())}; nothing was written "
            f"(python -m polyloop verify {place.target} names the line)"
        ) from exc
    except (PolyloopTypeError, PolyloopValueError) as exc:
        raise InspectError(" ".join(str(exc).split())) from exc
    except StoreUnavailableError as exc:
        raise InspectError(_unavailable(exc, place)) from exc
    except OSError as exc:
        raise InspectError(
            f"{where}: the decision cannot be written "
            f"({exc.strerror or type(exc).__name__}); nothing was recorded"
        ) from exc


_BEFORE_WRITING: Final = frozenset({"", "lease", "log", "schema"})
"""``StoreUnavailableError.record`` values of a failure before the decision was sent: taking
the lease, reading the log, opening the store."""


def _unavailable(exc: StoreUnavailableError, place: RunPlace) -> str:
    """The one line for a store that failed: whether the decision can have been written
    (``exc.record``: a record's tag when the write itself failed), in the store's own words,
    scrubbed of a URL's password (the driver's words may quote it)."""
    words = place.scrub(" ".join(str(exc).split()))
    if exc.record in _BEFORE_WRITING:
        return (
            f"{place.where}: the store failed before the decision was written ({words}); "
            "nothing was written: try again once it works"
        )
    return (
        f"{place.where}: the store failed while the decision was written ({words}); it may "
        f"have been written: python -m polyloop show {place.show} shows whether it was"
    )


def check_lease_wait(seconds: float) -> None:
    """``--lease-wait`` must be a finite number of seconds >= 0."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InspectError(f"--lease-wait must be a number of seconds >= 0, got {seconds}")


async def _resolve(
    store: RunStore, run_id: str, args: argparse.Namespace
) -> tuple[Settlement, str | None]:
    settlement = await resolve(
        store,
        run_id,
        result_id=args.result_id,
        executed=args.executed,
        observation=args.observation,
        by=args.by,
        note=args.note,
        lease_wait_seconds=args.lease_wait,
    )
    log = await store.read_log(run_id)
    key = next(
        (i.idempotency_key for i in log.intents if i.result_id == settlement.result_id), None
    )
    return settlement, key


def cmd_resolve(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    """``resolve``: check the arguments, write the settlement, say what it did and what next."""
    del err
    if args.executed and args.observation is None:
        raise InspectError(
            "--executed needs --observation TEXT: what the tool's system says happened becomes "
            "the step's observation (see python -m polyloop resolve --help)"
        )
    if args.not_executed and args.observation is not None:
        raise InspectError(
            "--not-executed takes no --observation: the action runs again and its own "
            "observation is recorded (see python -m polyloop resolve --help)"
        )
    if not args.by.strip():
        raise InspectError("--by needs a name: who decides is recorded with the verdict")
    check_lease_wait(args.lease_wait)
    place = locate_run(args.log, args.run_id)
    settlement, key = write_decision(
        place, lambda store: _resolve(store, place.run_id, args), _FIXES
    )
    run_id = place.run_id
    step = step_index(settlement.result_id)
    where = f"step {step}" if step is not None else settlement.result_id
    if settlement.verdict is SettlementVerdict.EXECUTED:
        then = f"it records {where} with that observation and executes nothing"
    else:
        with_key = f", with idempotency key {key}" if key is not None else ""
        then = f"it executes {where}'s action now{with_key}"
    print(
        visible(
            f"recorded: run {run_id!r}, {settlement.result_id} "
            f"{settlement.verdict.value.replace('_', ' ')} (by {settlement.by}, at "
            f"{settlement.at}); next: resume the run with its agent "
            f"(polyloop.session.run_or_resume): {then}"
        ),
        file=out,
    )
    return 0
