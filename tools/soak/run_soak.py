"""``python -m tools.soak.run_soak``: the normal-load driver (and its dry run).

::

    python -m tools.soak.run_soak --scenario {code,review,both} --budget-calls N \\
        --concurrency N --runs-dir PATH [--report PATH] [--limit N] [--workers N] [--seed N] \\
        [--data-dir PATH] [--workspace-root PATH] [--latency S] [--jitter S] \\
        [--failure-rate F] [--max-tokens N] [--stop TEXT]... [--timeout S] [--stream] \\
        [--chat-template-hint NAME] [--[no-]call-progress] [--dry-run] \\
        [--engine {local,ray}] [--ray-workers N] [--ray-address ADDRESS] [--store {jsonl,postgres}]

It starts the loopback policy server (unless ``SOAK_BASE_URL`` names a real endpoint, see
``tools.soak._config``), the scenarios' environments (the code scenario's worker pool), builds
every scenario's tasks, interleaves them round-robin and dispatches them with at most
``--concurrency`` running at once. Every run leaves the four files the scoreboard judges (see
its docstring). Progress goes to stderr, one line per finished unit; ``--report`` gets a
markdown summary that holds only counts, enum values and run ids (the sentinel rule, see the
scoreboard).

**Budget.** ``--budget-calls`` and ``--concurrency`` have no defaults on purpose: with a real
endpoint they are the only brakes on spending. ``BudgetGuard`` counts model-call *attempts*;
once the count reaches the budget, no new unit is dispatched, but units already running
finish (cutting them would leave logs without an end record, indistinguishable from crashes).
The batch can therefore overshoot by at most ``concurrency`` units' worth of calls.

**Dry run.** ``--dry-run`` builds the tasks, starts the environments, and assembles every run's
request and parameter snapshot (a bad template or a non-string parameter fails here, before
any spending), but calls no model and writes nothing in ``--runs-dir``.

**Real endpoints.** ``--max-tokens`` and ``--stop`` set the sampling (recorded in every
snapshot as the model identity); ``--timeout``, ``--stream`` and ``--chat-template-hint`` are
recorded as the unsent binding coordinates ``soak.*``. ``--call-progress`` (on by default for a
real endpoint) prints one line per model call. The report's "Model calls" section has the
calls, seconds per call, reported tokens and the prefix-cache share where reported, and warns
about empty replies (the usual sign of a wrong chat template).

**Interruption.** SIGINT or SIGTERM cancels the running units (each writes its cancelled finish
record), still writes ``--report`` titled "PARTIAL: interrupted by <signal>", and exits 130
(SIGINT) or 143 (SIGTERM).
**Engines.** ``--engine local`` (the default) runs every unit on this process's event loop.
``--engine ray`` places every *run* on a Ray cluster through ``polyloop.ray.run_on_ray``
(``tools.soak._ray_engine``): by default a throwaway loopback cluster of a head and
``--ray-workers`` one-CPU worker nodes (``tools.ray_cluster``), or the cluster at
``--ray-address``. The policy server stays in this process (the workers reach it over
loopback); the code scenario starts one codeworld worker process per run on the Ray worker;
the review scenario's phases run in order, each queued when the previous one ended. The
budget counts the ``model_calls`` of finished runs' metas, so it may overshoot by the runs in
flight. The files each run leaves are the same, so the scoreboard judges both engines alike.
``--store postgres`` (Ray only) puts the runs in a ``PostgresRunStore`` on a throwaway server
(``tools/pg_cluster.py``, 127.0.0.1) and copies every log into ``--runs-dir`` afterwards (the
two stores encode records identically), so the scoreboard still reads files.

Exit status: 0 when every unit finished without a driver-side error and the policy server saw
no policy error; 1 otherwise; 2 for a bad command line (including a runs directory that
already holds runs: run ids repeat across batches).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import json
import logging
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, TypeVar

import httpx

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import Event, ModelCall, ModelClient, RunStore
from polyloop.session import AgentDefinition, RunRequest, resume, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import ModelReply, RunResult, StopReason
from tools.soak._artifacts import (
    EVENTS_SUFFIX,
    META_SUFFIX,
    EventFileSink,
    Meta,
    artifact_path,
    run_ids_in,
    write_meta,
    write_result,
)
from tools.soak._config import absolute_path, endpoint_from_environment
from tools.soak.policy_server import PolicyServer
from tools.soak.scenarios.base import PERSONAS, RunOutcome, RunSpec, ScenarioEnv, encode_user

__all__ = [
    "SCENARIOS",
    "BudgetGuard",
    "DispatchReport",
    "RunOutcome",
    "Unit",
    "describe_failure",
    "dispatch",
    "execute_run",
    "interleave",
    "load_scenario",
    "main",
    "persona_rotation",
]

logger = logging.getLogger("tools.soak.run_soak")

SCENARIOS: Final = ("code", "review")
_ROTATION: Final = (
    "competent",
    "sloppy",
    "malformed",
    "competent",
    "verbose",
    "stubborn",
    "competent",
    "sloppy",
    "verbose",
    "malformed",
)
"""Persona by position in a scenario's task list (offset by the seed): every persona appears
in any ten consecutive tasks, competent most often."""
SAMPLING: Final = {"temperature": 0.0, "max_tokens": 768}
"""Default sampling fields (part of the model identity in every snapshot); ``--max-tokens`` and
``--stop`` change them for a batch (``sampling_from``)."""
DEFAULT_TIMEOUT: Final = 300.0
"""Seconds the HTTP client waits for a reply (``--timeout``)."""
EMPTY_REPLY_HINT: Final = (
    "an empty reply usually means the server applies the wrong chat template (llama.cpp: start "
    "it with the model's --chat_format, e.g. 'gemma' for Gemma models)"
)

_T = TypeVar("_T")


# --------------------------------------------------------------------------- budget guard


class BudgetGuard:
    """A ``ModelClient`` wrapper that counts every call *attempt* before forwarding it.

    It never refuses a call: a guard that raised inside the model client would be recorded by
    the library as a failed model call and change the run's stop reason. ``dispatch`` reads
    ``exhausted`` before starting each unit instead. ``parameters()`` is the inner client's,
    unchanged, so wrapping never shows up as parameter drift.
    """

    def __init__(self, *, inner: ModelClient, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"BudgetGuard(limit=...) must be >= 1 model call, got {limit}")
        self._inner = inner
        self.limit = limit
        self.total = 0
        self._per_run: Counter[str] = Counter()

    @property
    def exhausted(self) -> bool:
        return self.total >= self.limit

    def calls_for(self, run_id: str) -> int:
        """Attempts made for ``run_id`` through this guard (this process only)."""
        return self._per_run[run_id]

    async def call(self, call: ModelCall) -> ModelReply:
        self.total += 1
        self._per_run[call.run_id] += 1
        return await self._inner.call(call)

    def parameters(self) -> Mapping[str, str]:
        return self._inner.parameters()


class _NoCallClient:
    """The dry run's model client: the real client's identity, and a refusal to be called."""

    def __init__(self, inner: ModelClient) -> None:
        self._inner = inner

    async def call(self, call: ModelCall) -> ModelReply:
        raise RuntimeError("dry run: no model call may be made")

    def parameters(self) -> Mapping[str, str]:
        return self._inner.parameters()


class CallMeter:
    """A ``ModelClient`` wrapper that times every call and keeps the endpoint's usage figures.

    With ``progress`` it prints one line per finished call to stderr while units run (the
    batch's elapsed time, calls so far, the call's tokens and tokens per second), so a slow
    real endpoint shows life between the per-unit lines. ``parameters()`` is the inner
    client's, unchanged.
    """

    def __init__(self, *, inner: ModelClient, progress: bool, began: float) -> None:
        self._inner = inner
        self._progress = progress
        self._began = began
        self.seconds: list[float] = []
        self.failed = 0
        self.empty = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.with_usage = 0
        self.with_cached = 0
        self.tokens_per_second: list[float] = []

    async def call(self, call: ModelCall) -> ModelReply:
        started = time.monotonic()
        try:
            reply = await self._inner.call(call)
        except Exception as exc:  # counted and re-raised: the library records the failure
            seconds = time.monotonic() - started
            self.seconds.append(seconds)
            self.failed += 1
            self._print(call, seconds, f"failed ({type(exc).__name__})")
            raise
        seconds = time.monotonic() - started
        self.seconds.append(seconds)
        if not (reply.content + reply.thinking).strip():
            self.empty += 1
        usage = reply.usage
        if usage is None:
            detail = f"{len(reply.content)} chars, no usage reported"
        else:
            self.with_usage += 1
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
            if usage.cached_tokens is not None:
                self.with_cached += 1
                self.cached_tokens += usage.cached_tokens
            rate = usage.completion_tokens / seconds if seconds > 0 else 0.0
            self.tokens_per_second.append(rate)
            detail = f"{usage.prompt_tokens}+{usage.completion_tokens} tokens, {rate:.1f} tok/s"
        if reply.finish_reason is not None:
            detail += f", finish {reply.finish_reason}"
        self._print(call, seconds, detail)
        return reply

    def _print(self, call: ModelCall, seconds: float, detail: str) -> None:
        if not self._progress:
            return
        elapsed = time.monotonic() - self._began
        print(
            f"  call {len(self.seconds)} ({call.run_id} step {call.call_index}): "
            f"{seconds:.1f} s, {detail}; {elapsed:.0f} s elapsed",
            file=sys.stderr,
            flush=True,
        )

    def parameters(self) -> Mapping[str, str]:
        return self._inner.parameters()


def sampling_from(args: argparse.Namespace) -> dict[str, Any]:
    """The batch's sampling fields: ``SAMPLING`` with ``--max-tokens`` and ``--stop`` applied."""
    sampling: dict[str, Any] = {**SAMPLING, "max_tokens": args.max_tokens}
    if args.stop:
        sampling["stop"] = list(args.stop)
    return sampling


def batch_coordinates(args: argparse.Namespace) -> dict[str, str]:
    """Client settings that are not model identity but are recorded in every run's snapshot
    (as unprefixed binding keys, which the adapter does not send): the HTTP timeout, streaming
    and the chat-template hint."""
    return {
        "soak.timeout_s": f"{args.timeout:g}",
        "soak.stream": "true" if args.stream else "false",
        "soak.chat_template_hint": args.chat_template_hint,
    }


# --------------------------------------------------------------------------- units


@dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """One dispatchable piece of work: a whole task (all of its runs, in order)."""

    label: str
    scenario: str
    run: Callable[[], Awaitable[Sequence[RunOutcome]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchReport:
    """What ``dispatch`` did. ``stopped_at`` is the 1-based index of the first unit not
    dispatched because the budget was exhausted (``None``: every unit was dispatched).
    ``failures`` are ``(label, "ExceptionType: message")`` of units that raised."""

    dispatched: int
    stopped_at: int | None
    outcomes: tuple[RunOutcome, ...]
    failures: tuple[tuple[str, str], ...]


def interleave(groups: Iterable[Sequence[_T]]) -> list[_T]:
    """Round-robin merge: ``[[a0, a1, a2], [b0, b1]] -> [a0, b0, a1, b1, a2]``.

    Scenarios are interleaved rather than concatenated so that a shared budget cannot be
    eaten by the first scenario while the second never runs.
    """
    lists = [list(group) for group in groups]
    merged: list[_T] = []
    for index in range(max((len(items) for items in lists), default=0)):
        merged.extend(items[index] for items in lists if index < len(items))
    return merged


@dataclass(frozen=True, slots=True)
class _Done:
    label: str
    outcomes: tuple[RunOutcome, ...]
    failure: str | None


def describe_failure(exc: BaseException) -> str:
    """``"<Class>: <text>"``, or the class name alone when the exception has no text, so a
    recorded failure is never ``"ReadTimeout: "`` with nothing after it."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _run_unit(unit: Unit) -> _Done:
    try:
        outcomes = await unit.run()
    except Exception as exc:  # error isolation: the failure is recorded, the batch goes on
        logger.exception("unit %s failed", unit.label)
        return _Done(unit.label, (), describe_failure(exc))
    return _Done(unit.label, tuple(outcomes), None)


async def dispatch(
    units: Sequence[Unit],
    *,
    concurrency: int,
    guard: BudgetGuard | None = None,
    on_done: Callable[[str, Sequence[RunOutcome], str | None], None] | None = None,
) -> DispatchReport:
    """Run ``units`` with at most ``concurrency`` alive at once (see the module docstring).

    A unit that raises is recorded in ``failures``; the others go on. Cancelling ``dispatch``
    cancels every running unit, waits for them (their ``finally`` blocks run) and re-raises.
    """
    if concurrency < 1:
        raise ValueError(f"dispatch: the concurrency limit must be >= 1, got {concurrency}")
    running: set[asyncio.Task[_Done]] = set()
    outcomes: list[RunOutcome] = []
    failures: list[tuple[str, str]] = []
    dispatched = 0
    stopped_at: int | None = None

    def collect(done: Iterable[asyncio.Task[_Done]]) -> None:
        for task in done:
            result = task.result()
            outcomes.extend(result.outcomes)
            if result.failure is not None:
                failures.append((result.label, result.failure))
            if on_done is not None:
                on_done(result.label, result.outcomes, result.failure)

    try:
        for index, unit in enumerate(units, start=1):
            while len(running) >= concurrency:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                collect(done)
            if guard is not None and guard.exhausted:
                stopped_at = index
                break
            running.add(asyncio.ensure_future(_run_unit(unit)))
            dispatched += 1
        while running:
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            collect(done)
    except asyncio.CancelledError:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
        raise
    return DispatchReport(
        dispatched=dispatched,
        stopped_at=stopped_at,
        outcomes=tuple(outcomes),
        failures=tuple(failures),
    )


# --------------------------------------------------------------------------- one run


class _HookedSink(EventFileSink):
    """The event file sink plus a hook awaited after each delivered event (fault injection)."""

    def __init__(self, path: Path, hook: Callable[[Event], Awaitable[None]]) -> None:
        super().__init__(path)
        self._hook = hook

    async def emit(self, event: Event) -> None:
        await super().emit(event)
        await self._hook(event)


async def execute_run(
    spec: RunSpec,
    *,
    runs_dir: Path,
    model_client: ModelClient,
    calls_for: Callable[[str], int],
    scenario: str,
    fault: str | None = None,
    store: RunStore | None = None,
    resume_run: bool = False,
    event_hook: Callable[[Event], Awaitable[None]] | None = None,
) -> RunOutcome:
    """Run (or, with ``resume_run``, continue) one polyloop run and write its sidecars.

    The store is a ``JsonlRunStore`` in ``runs_dir`` unless ``store`` is given (the crash
    classes wrap it). ``.meta.json`` is written in every case - also when the run raises or is
    cancelled - and ``.result.json`` whenever a result came back. An exception from the run
    (``RunIdentityError``, an executor breaking its contract) is reported in the outcome's
    ``error``; ``CancelledError`` propagates after the meta is written. ``meta.success`` is
    ``spec.evaluate()``, awaited after a run that returned, when the spec has one, else
    ``spec.success()``.

    With ``resume_run``: a run without a log starts fresh; a finished run is left alone (its
    sidecars are the ones its own process wrote) and reported from its log; an unfinished
    run is resumed, and its event file starts afresh, because the events and the meta
    describe the process that wrote them (``resumed_from_step`` says where it took over).
    """
    request = spec.request
    run_id = request.run_id
    store = JsonlRunStore(directory=runs_dir) if store is None else store
    events_path = artifact_path(runs_dir, run_id, EVENTS_SUFFIX)
    sink = (
        EventFileSink(events_path) if event_hook is None else _HookedSink(events_path, event_hook)
    )
    definition = AgentDefinition(
        model_client=model_client,
        decision_parser=spec.decision_parser,
        store=store,
        event_sink=sink,
        synthetic_observations=spec.synthetic_observations,
    )
    resumed_from = 0
    fresh = True
    if resume_run:
        log = await store.read_log(run_id)
        if log.finished is not None:
            stored = log.finished.result
            return _outcome(spec, scenario, stored, calls_for(run_id), 0, None)
        if not log.is_empty:
            fresh = False
            resumed_from = len(log.steps)
            events_path.unlink(missing_ok=True)
    started = time.monotonic()
    result: RunResult | None = None
    error: str | None = None
    graded: bool | None = None
    try:
        result = await (run(definition, request) if fresh else resume(definition, request))
        if spec.evaluate is not None:
            graded = await spec.evaluate()
    except Exception as exc:  # the run's failure is recorded in its outcome and its meta
        logger.exception("run %s raised", run_id)
        error = describe_failure(exc)
    finally:
        wall_ms = int((time.monotonic() - started) * 1000)
        write_meta(
            runs_dir,
            run_id,
            Meta(
                scenario=scenario,
                task_id=spec.task_id,
                phase=spec.phase,
                wall_ms=wall_ms,
                model_calls=calls_for(run_id),
                sink_failures=sink.failures,
                env_executions=spec.env_executions(),
                fault=fault,
                success=spec.success() if spec.evaluate is None else graded,
                resumed_from_step=resumed_from,
            ),
        )
        if result is not None:
            write_result(runs_dir, run_id, result)
    return _outcome(spec, scenario, result, calls_for(run_id), wall_ms, error)


def _outcome(
    spec: RunSpec,
    scenario: str,
    result: RunResult | None,
    model_calls: int,
    wall_ms: int,
    error: str | None,
) -> RunOutcome:
    return RunOutcome(
        run_id=spec.request.run_id,
        scenario=scenario,
        task_id=spec.task_id,
        phase=spec.phase,
        stop_reason=None if result is None else result.stop_reason.value,
        steps=0 if result is None else len(result.steps),
        model_calls=model_calls,
        wall_ms=wall_ms,
        error=error,
    )


@dataclass(slots=True)
class _DryRecord:
    runs: int = 0
    prompt_chars: list[int] | None = None


async def _dry_execute_run(
    spec: RunSpec, *, scenario: str, model_client: ModelClient, record: _DryRecord
) -> RunOutcome:
    """Assemble everything a real run would, then stop before the first model call."""
    request = spec.request
    definition = AgentDefinition(
        model_client=model_client,
        decision_parser=spec.decision_parser,
        store=VolatileRunStore(),
        event_sink=EventFileSink(Path(tempfile.gettempdir()) / "never-written.events.jsonl"),
        synthetic_observations=spec.synthetic_observations,
    )
    definition.parameter_snapshot()
    request.parameter_snapshot()
    chars = initial_prompt_chars(request)
    if chars > request.budget.max_prompt_chars:
        raise ValueError(
            f"run {request.run_id}: the initial context has {chars} characters, more than "
            f"max_prompt_chars={request.budget.max_prompt_chars}; the run could not make a call"
        )
    record.runs += 1
    if record.prompt_chars is None:
        record.prompt_chars = []
    record.prompt_chars.append(chars)
    return RunOutcome(
        run_id=request.run_id,
        scenario=scenario,
        task_id=spec.task_id,
        phase=spec.phase,
        stop_reason=None,
        steps=0,
        model_calls=0,
        wall_ms=0,
    )


def initial_prompt_chars(request: RunRequest) -> int:
    """Characters of a request's first prompt (run level, injections, goal level), counted
    the way ``Budget.max_prompt_chars`` counts them (the text of every block)."""
    context = request.context
    total = sum(
        len(block.text)
        for message in (*context.run_level, *context.goal_level)
        for block in message.content
    )
    return total + sum(
        len(entry.content) for entries in request.injections.values() for entry in entries
    )


# --------------------------------------------------------------------------- scenarios


def load_scenario(name: str) -> ModuleType:
    """Import ``tools.soak.scenarios.<name>``; ``LookupError`` when it does not exist."""
    if name not in SCENARIOS:
        raise LookupError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    try:
        return importlib.import_module(f"tools.soak.scenarios.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"tools.soak.scenarios.{name}":
            raise
        raise LookupError(
            f"the {name!r} scenario is not available (tools/soak/scenarios/{name}.py is "
            "missing); run with --scenario code"
        ) from exc


def persona_rotation(task_ids: Sequence[str], seed: int) -> dict[str, str]:
    """Each task's persona (see ``_ROTATION``)."""
    assert set(_ROTATION) == set(PERSONAS)
    return {
        task_id: _ROTATION[(index + seed) % len(_ROTATION)]
        for index, task_id in enumerate(task_ids)
    }


def _binding_for(
    scenario: str,
    personas: Mapping[str, str],
    seed: int,
    coordinates: Mapping[str, str] | None = None,
) -> Callable[[str, str | None], Mapping[str, str]]:
    extra = dict(coordinates or {})

    def binding(task_id: str, phase: str | None) -> Mapping[str, str]:
        persona = personas.get(task_id, "competent")
        user = encode_user(
            scenario=scenario, task_id=task_id, phase=phase, persona=persona, seed=seed
        )
        return {"gateway.user": user, **extra}

    return binding


# --------------------------------------------------------------------------- command line


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak.run_soak",
        description="Drive polyloop runs under load against the soak scenarios.",
    )
    parser.add_argument("--scenario", required=True, choices=(*SCENARIOS, "both"))
    parser.add_argument(
        "--budget-calls",
        required=True,
        type=_positive_int,
        help="model-call attempts after which no new task starts",
    )
    parser.add_argument(
        "--concurrency", required=True, type=_positive_int, help="tasks running at the same time"
    )
    parser.add_argument("--runs-dir", required=True, type=absolute_path)
    parser.add_argument("--report", type=Path, help="markdown summary (counts only)")
    parser.add_argument("--limit", type=_non_negative_int, help="tasks per scenario")
    parser.add_argument(
        "--workers",
        type=_positive_int,
        help="code-scenario worker processes (default: --concurrency)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--data-dir", type=absolute_path, help="default: <runs-dir>/../data")
    parser.add_argument(
        "--workspace-root", type=absolute_path, help="default: <runs-dir>/../workspaces"
    )
    parser.add_argument("--latency", type=float, default=0.002, help="policy server, seconds")
    parser.add_argument("--jitter", type=float, default=0.004, help="policy server, seconds")
    parser.add_argument(
        "--failure-rate",
        type=float,
        default=0.03,
        help="policy server: share of calls answered 500/503",
    )
    parser.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=SAMPLING["max_tokens"],
        help="max_tokens of every model call (default %(default)s); part of the snapshot",
    )
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="a stop sequence (repeatable; '\\n' is a newline); part of the snapshot",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT,
        help="seconds the HTTP client waits for a reply (default %(default)s)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="streaming requests: a timeout or an interruption stops the server generating",
    )
    parser.add_argument(
        "--chat-template-hint",
        default="",
        metavar="NAME",
        help="the chat template the server was started with (llama.cpp: --chat_format), "
        "recorded in the snapshot and the report",
    )
    parser.add_argument(
        "--call-progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one stderr line per model call (default: on for a real endpoint)",
    )
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: one event loop (default); ray: every run on a Ray cluster",
    )
    parser.add_argument(
        "--ray-workers",
        type=_positive_int,
        default=2,
        help="--engine ray: worker nodes of the throwaway loopback cluster (default 2)",
    )
    parser.add_argument(
        "--ray-address",
        help="--engine ray: connect to this running cluster instead of starting one",
    )
    parser.add_argument(
        "--store",
        choices=("jsonl", "postgres"),
        default="jsonl",
        help="--engine ray: the runs' store; postgres starts a throwaway PostgreSQL server "
        "(tools/pg_cluster.py) and copies the logs into --runs-dir afterwards",
    )
    return parser


def _usage_error(message: str) -> int:
    print(f"run_soak: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.stop = [text.replace("\\n", "\n") for text in args.stop]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    names = list(SCENARIOS) if args.scenario == "both" else [args.scenario]
    try:
        modules = {name: load_scenario(name) for name in names}
    except LookupError as exc:
        return _usage_error(str(exc))
    runs_dir: Path = args.runs_dir
    data_dir: Path = args.data_dir or runs_dir.parent / "data"
    workspace_root: Path = args.workspace_root or runs_dir.parent / "workspaces"
    if not args.dry_run:
        if runs_dir.exists() and run_ids_in(runs_dir):
            return _usage_error(
                f"--runs-dir {runs_dir} already holds {len(run_ids_in(runs_dir))} run logs; "
                "run ids repeat across batches, so give every batch a new directory"
            )
        if workspace_root.exists() and any(workspace_root.iterdir()):
            return _usage_error(
                f"--workspace-root {workspace_root} is not empty; task workspaces (and their "
                "ledgers) must start empty, so give every batch a new directory"
            )
        runs_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.engine == "ray" and not args.dry_run:
        return _main_ray(
            args, modules, runs_dir=runs_dir, data_dir=data_dir, workspace_root=workspace_root
        )
    return asyncio.run(
        _main_async(
            args, modules, runs_dir=runs_dir, data_dir=data_dir, workspace_root=workspace_root
        )
    )


async def _main_async(
    args: argparse.Namespace,
    modules: Mapping[str, ModuleType],
    *,
    runs_dir: Path,
    data_dir: Path,
    workspace_root: Path,
) -> int:
    began = time.monotonic()
    endpoint = endpoint_from_environment()
    progress = _Progress(total=0)
    interrupted: list[str] = []
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()

    def interrupt(name: str) -> None:
        if not interrupted:
            print(f"run_soak: {name}: stopping; cancelling the running units", file=sys.stderr)
            interrupted.append(name)
            main_task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt, signum.name)
    call_progress = args.call_progress
    if call_progress is None:
        call_progress = endpoint.base_url is not None and not args.dry_run
    meter: CallMeter | None = None
    guard: BudgetGuard | None = None
    server: PolicyServer | None = None
    units: list[Unit] = []
    report: DispatchReport | None = None
    dry_record = _DryRecord()
    try:
        tasks = {
            name: module.build_tasks(seed=args.seed, limit=args.limit, data_dir=data_dir)
            for name, module in modules.items()
        }
        async with contextlib.AsyncExitStack() as stack:
            if args.dry_run:
                scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-dry-"))
                workspace_root = Path(scratch) / "workspaces"
            base_url = endpoint.base_url
            if base_url is None:
                server = await stack.enter_async_context(
                    PolicyServer(
                        latency=args.latency,
                        jitter=args.jitter,
                        failure_rate=args.failure_rate,
                        seed=args.seed,
                        model=endpoint.model,
                    )
                )
                base_url = server.base_url
            host = httpx.URL(base_url).host
            headers = (
                {} if endpoint.api_key is None else {"Authorization": f"Bearer {endpoint.api_key}"}
            )
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    timeout=httpx.Timeout(args.timeout, connect=min(10.0, args.timeout)),
                    trust_env=host not in {"127.0.0.1", "localhost", "::1"},
                    headers=headers,
                    limits=httpx.Limits(max_connections=max(16, 2 * args.concurrency)),
                )
            )
            gateway = GatewayModelClient(
                client=http,
                settings=GatewaySettings(
                    base_url=base_url,
                    model=endpoint.model,
                    sampling=sampling_from(args),
                    stream=args.stream,
                ),
            )
            meter = CallMeter(inner=gateway, progress=call_progress, began=began)
            guard = BudgetGuard(inner=meter, limit=args.budget_calls)
            model_client: ModelClient = _NoCallClient(gateway) if args.dry_run else guard
            coordinates = batch_coordinates(args)
            groups: list[list[Unit]] = []
            for name, module in modules.items():
                if args.dry_run:
                    execute: Callable[[RunSpec], Awaitable[RunOutcome]] = functools.partial(
                        _dry_execute_run,
                        scenario=name,
                        model_client=model_client,
                        record=dry_record,
                    )
                else:
                    execute = functools.partial(
                        execute_run,
                        runs_dir=runs_dir,
                        model_client=guard,
                        calls_for=guard.calls_for,
                        scenario=name,
                    )
                personas = persona_rotation([task.task_id for task in tasks[name]], args.seed)
                env = ScenarioEnv(
                    runs_dir=runs_dir,
                    workspace_root=workspace_root,
                    model_client=model_client,
                    execute_run=execute,
                    binding_for=_binding_for(name, personas, args.seed, coordinates),
                )
                opener = getattr(module, "open_environment", None)
                if opener is not None:
                    workers = args.workers or args.concurrency
                    env.extra.update(
                        await stack.enter_async_context(opener(workers=workers, seed=args.seed))
                    )
                groups.append(
                    [
                        Unit(
                            label=f"{name}/{task.task_id}",
                            scenario=name,
                            run=functools.partial(module.run_task, task, env),
                        )
                        for task in tasks[name]
                    ]
                )
            units = interleave(groups)
            progress.total = len(units)
            report = await dispatch(
                units,
                concurrency=args.concurrency,
                guard=None if args.dry_run else guard,
                on_done=progress,
            )
    except asyncio.CancelledError:
        if not interrupted:
            raise
        main_task.uncancel()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if report is None:  # interrupted: what the finished units reported
        report = DispatchReport(
            dispatched=progress.done,
            stopped_at=None,
            outcomes=tuple(progress.outcomes),
            failures=tuple(progress.failures),
        )
    wall = time.monotonic() - began
    policy_errors = 0 if server is None else server.policy_errors
    calls = 0 if guard is None else guard.total
    summary = (
        f"run_soak: {'dry run: ' if args.dry_run else ''}"
        f"{'INTERRUPTED by ' + interrupted[0] + ': ' if interrupted else ''}"
        f"{report.dispatched}/{len(units)} units, "
        f"{len(report.outcomes)} runs, {calls} model calls, "
        f"{len(report.failures)} unit failures, {policy_errors} policy errors, {wall:.1f} s"
    )
    print(summary, file=sys.stderr)
    if meter is not None and meter.empty:
        print(
            f"run_soak: warning: {meter.empty} of {len(meter.seconds)} model calls returned an "
            f"empty reply; {EMPTY_REPLY_HINT}",
            file=sys.stderr,
        )
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        text = (
            _dry_report(args, units, report, dry_record)
            if args.dry_run
            else _load_report(
                args,
                units,
                report,
                calls,
                server,
                wall,
                meter=meter,
                interrupted=interrupted[0] if interrupted else None,
            )
        )
        args.report.write_text(text, encoding="utf-8")
    if interrupted:
        return 130 if interrupted[0] == "SIGINT" else 143
    errors = sum(1 for outcome in report.outcomes if outcome.error is not None)
    return 1 if report.failures or errors or policy_errors else 0


def _main_ray(
    args: argparse.Namespace,
    modules: Mapping[str, ModuleType],
    *,
    runs_dir: Path,
    data_dir: Path,
    workspace_root: Path,
) -> int:
    """``--engine ray``: connect to (or start) the cluster, then run the batch on it."""
    endpoint = endpoint_from_environment()
    if endpoint.api_key is not None:
        return _usage_error(
            "--engine ray does not send credentials to the cluster's workers; unset "
            "SOAK_API_KEY (the policy server needs none)"
        )
    if args.ray_address is None:
        from tools.netns import namespace_refusal

        refusal = namespace_refusal("run_soak --engine ray (without --ray-address)")
        if refusal is not None:
            return _usage_error(refusal)
    else:
        # tools.ray_cluster first: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray loads.
        from tools.ray_cluster import LOOPBACK  # noqa: I001 - the order is the point
        import ray

        # The driver advertises loopback, never the machine's interface address (scale-out brief).
        ray.init(address=args.ray_address, log_to_driver=False, _node_ip_address=LOOPBACK)
        try:
            return asyncio.run(
                _ray_batch(args, modules, runs_dir, data_dir, workspace_root, endpoint)
            )
        finally:
            ray.shutdown()
    # Imported first: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported.
    from tools.ray_cluster import LoopbackCluster

    with contextlib.ExitStack() as stack:
        if args.store == "postgres":
            args.postgres = stack.enter_context(_throwaway_postgres())
        stack.enter_context(LoopbackCluster(workers=args.ray_workers))
        return asyncio.run(_ray_batch(args, modules, runs_dir, data_dir, workspace_root, endpoint))


@contextlib.contextmanager
def _throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 for one batch (``tools/pg_cluster.py``), destroyed after."""
    from tools.pg_cluster import HOW_TO_INSTALL, PgCluster, binaries_available

    if not binaries_available():
        raise SystemExit(f"run_soak: --store postgres needs PostgreSQL: {HOW_TO_INSTALL}")
    cluster = PgCluster(Path(tempfile.mkdtemp(prefix="soak-pg-")))
    try:
        cluster.init()
        cluster.start()
        yield cluster.conninfo()
    finally:
        cluster.destroy()


def soak_chains(
    modules: Mapping[str, ModuleType],
    tasks: Mapping[str, Sequence[object]],
    *,
    seed: int,
    runs_dir: Path,
    workspace_root: Path,
    base_url: str,
    model: str,
    fault: str | None = None,
    run_prefix: str = "",
    coordinates: Mapping[str, str] | None = None,
    sampling: Mapping[str, Any] | None = None,
    stream: bool = False,
    postgres: str | None = None,
) -> list[list[object]]:
    """Every task as the chain of its runs' descriptions (review: three phases), interleaved
    across scenarios like the local engine's units; review workspaces are created fresh."""
    from tools.soak._ray_engine import SoakRunDescription

    groups: list[list[list[object]]] = []
    for name, module in modules.items():
        personas = persona_rotation([task.task_id for task in tasks[name]], seed)
        binding = _binding_for(name, personas, seed, coordinates)
        chains: list[list[object]] = []
        for task in tasks[name]:
            task_id: str = task.task_id
            if name == "review":
                (workspace_root / name / task_id).mkdir(parents=True, exist_ok=False)
            chains.append(
                [
                    SoakRunDescription(
                        scenario=name,
                        task=task,
                        phase=phase,
                        binding=dict(binding(task_id, phase)),
                        runs_dir=str(runs_dir),
                        workspace_root=str(workspace_root),
                        base_url=base_url,
                        model=model,
                        fault=fault,
                        run_prefix=run_prefix,
                        sampling=dict(SAMPLING if sampling is None else sampling),
                        stream=stream,
                        postgres=postgres,
                    )
                    for phase in module.PHASES
                ]
            )
        groups.append(chains)
    return interleave(groups)


class _MetaCalls:
    """The budget of a Ray batch: model calls read from the metas of finished runs."""

    def __init__(self, runs_dir: Path, limit: int) -> None:
        self.runs_dir = runs_dir
        self.limit = limit
        self.total = 0

    def add(self, run_id: str) -> None:
        path = artifact_path(self.runs_dir, run_id, META_SUFFIX)
        with contextlib.suppress(FileNotFoundError):
            self.total += int(json.loads(path.read_text(encoding="utf-8"))["model_calls"])

    @property
    def exhausted(self) -> bool:
        return self.total >= self.limit


async def _ray_batch(
    args: argparse.Namespace,
    modules: Mapping[str, ModuleType],
    runs_dir: Path,
    data_dir: Path,
    workspace_root: Path,
    endpoint: object,
) -> int:
    from tools.soak._ray_engine import run_descriptions, to_run_outcome

    began = time.monotonic()
    tasks = {
        name: module.build_tasks(seed=args.seed, limit=args.limit, data_dir=data_dir)
        for name, module in modules.items()
    }
    model: str = endpoint.model
    base_url: str | None = endpoint.base_url
    async with contextlib.AsyncExitStack() as stack:
        server: PolicyServer | None = None
        if base_url is None:
            server = await stack.enter_async_context(
                PolicyServer(
                    latency=args.latency,
                    jitter=args.jitter,
                    failure_rate=args.failure_rate,
                    seed=args.seed,
                    model=model,
                )
            )
            base_url = server.base_url
        chains = soak_chains(
            modules,
            tasks,
            seed=args.seed,
            runs_dir=runs_dir,
            workspace_root=workspace_root,
            base_url=base_url,
            model=model,
            coordinates=batch_coordinates(args),
            sampling=sampling_from(args),
            stream=args.stream,
            postgres=getattr(args, "postgres", None),
        )
        budget = _MetaCalls(runs_dir, args.budget_calls)
        units = [
            Unit(
                label=f"{chain[0].scenario}/{chain[0].task.task_id}",
                scenario=chain[0].scenario,
                run=_no_unit,
            )
            for chain in chains
        ]
        progress = _Progress(total=sum(len(chain) for chain in chains))

        def seen(outcome: object) -> None:
            run_outcome = to_run_outcome(outcome)
            budget.add(run_outcome.run_id)
            progress(f"{run_outcome.scenario}/{run_outcome.task_id}", [run_outcome], None)

        outcomes = await run_descriptions(
            chains,
            max_in_flight=args.concurrency,
            stop_new_chains=lambda: budget.exhausted,
            on_outcome=seen,
        )
    run_outcomes = tuple(to_run_outcome(outcome) for outcome in outcomes)
    if getattr(args, "postgres", None) is not None:
        from tools.soak._ray_engine import export_logs

        copied = await export_logs(args.postgres, runs_dir, [o.run_id for o in run_outcomes])
        print(f"run_soak: {copied} logs copied from PostgreSQL into {runs_dir}", file=sys.stderr)
    dispatched = len({(o.scenario, o.task_id) for o in run_outcomes})
    report = DispatchReport(
        dispatched=dispatched,
        stopped_at=None if dispatched == len(chains) else dispatched + 1,
        outcomes=run_outcomes,
        failures=(),
    )
    wall = time.monotonic() - began
    policy_errors = 0 if server is None else server.policy_errors
    print(
        f"run_soak: engine ray: {dispatched}/{len(chains)} units, {len(run_outcomes)} runs, "
        f"{budget.total} model calls, {policy_errors} policy errors, {wall:.1f} s",
        file=sys.stderr,
    )
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(
            _load_report(args, units, report, budget.total, server, wall),
            encoding="utf-8",
        )
    errors = sum(1 for outcome in run_outcomes if outcome.error is not None)
    return 1 if errors or policy_errors else 0


async def _no_unit() -> Sequence[RunOutcome]:
    raise RuntimeError("a Ray batch's units are not run locally")


class _Progress:
    """One stderr line per finished unit; keeps what finished units reported, so an
    interrupted batch can still be reported."""

    def __init__(self, *, total: int) -> None:
        self.total = total
        self.done = 0
        self.outcomes: list[RunOutcome] = []
        self.failures: list[tuple[str, str]] = []

    def __call__(self, label: str, outcomes: Sequence[RunOutcome], failure: str | None) -> None:
        self.done += 1
        self.outcomes.extend(outcomes)
        if failure is not None:
            self.failures.append((label, failure))
        if failure is not None:
            detail = f"FAILED ({failure.split(':', 1)[0]})"
        else:
            detail = ", ".join(
                f"{o.run_id}={o.stop_reason or ('error' if o.error else 'assembled')} "
                f"steps={o.steps} calls={o.model_calls}"
                for o in outcomes
            )
        print(f"[{self.done}/{self.total}] {label}: {detail}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- reports
# Counts, enum values and run ids only (the scoreboard's sentinel rule).


def _quantiles(values: Sequence[int]) -> str:
    if not values:
        return "| 0 | - | - | - | - |"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"| {len(ordered)} | {ordered[0]} | {statistics.median(ordered):g} | {p90} | "
        f"{ordered[-1]} |"
    )


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"mean {statistics.fmean(ordered):.2f}, median {statistics.median(ordered):.2f}, "
        f"p90 {p90:.2f}, max {ordered[-1]:.2f}"
    )


def _calls_section(args: argparse.Namespace, meter: CallMeter) -> list[str]:
    stops = len(args.stop)
    lines = [
        "## Model calls",
        "",
        f"- settings: max_tokens {args.max_tokens}, {stops} stop sequence"
        f"{'' if stops == 1 else 's'}, timeout {args.timeout:g} s, "
        f"stream {'on' if args.stream else 'off'}, chat template hint "
        f"{args.chat_template_hint or '(none)'}",
        f"- calls: {len(meter.seconds)}; failed: {meter.failed}; empty replies: {meter.empty}",
        f"- seconds per call: {_seconds(meter.seconds)}",
    ]
    if meter.with_usage:
        lines += [
            f"- tokens (from {meter.with_usage} calls reporting usage): prompt "
            f"{meter.prompt_tokens}, completion {meter.completion_tokens}; per call: prompt "
            f"{meter.prompt_tokens / meter.with_usage:.0f}, completion "
            f"{meter.completion_tokens / meter.with_usage:.0f}",
            f"- completion tokens per second per call: {_seconds(meter.tokens_per_second)}",
        ]
    else:
        lines.append("- tokens: the endpoint reported no usage")
    if meter.with_cached:
        share = meter.cached_tokens / meter.prompt_tokens if meter.prompt_tokens else 0.0
        lines.append(
            f"- prefix cache: {meter.cached_tokens} of {meter.prompt_tokens} prompt tokens "
            f"served from the cache ({share:.0%}), reported by {meter.with_cached} calls"
        )
    else:
        lines.append("- prefix cache: the endpoint reported no cached-token figures")
    if meter.empty:
        lines.append(f"- WARNING: {meter.empty} empty replies: {EMPTY_REPLY_HINT}")
    return lines


def _load_report(
    args: argparse.Namespace,
    units: Sequence[Unit],
    report: DispatchReport,
    calls: int,
    server: PolicyServer | None,
    wall: float,
    *,
    meter: CallMeter | None = None,
    interrupted: str | None = None,
) -> str:
    outcomes = report.outcomes
    title = "# Soak: normal load"
    if interrupted is not None:
        title += f" (PARTIAL: interrupted by {interrupted})"
    lines = [
        title,
        "",
        f"- scenarios: {', '.join(sorted({u.scenario for u in units}))}",
        f"- seed {args.seed}, concurrency {args.concurrency}, budget {args.budget_calls} calls",
        (
            f"- units finished before the interruption: {report.dispatched} of {len(units)}; "
            "units still running were cancelled (their logs end with a cancelled finish "
            "record, or no finish if the grace period ran out) and are not counted below"
            if interrupted is not None
            else f"- units dispatched: {report.dispatched} of {len(units)}"
            + (
                ""
                if report.stopped_at is None
                else f" (budget stop before unit {report.stopped_at})"
            )
        ),
        f"- runs: {len(outcomes)}; model calls: {calls}; wall time: {wall:.1f} s",
        f"- unit failures: {len(report.failures)}; runs with a driver error: "
        f"{sum(1 for o in outcomes if o.error is not None)}",
        "",
        "## Stop reasons",
        "",
        "| scenario | stop reason | runs |",
        "|---|---|---|",
    ]
    counts = Counter((o.scenario, o.stop_reason or "(driver error)") for o in outcomes)
    for (scenario, reason), count in sorted(counts.items()):
        lines.append(f"| {scenario} | {reason} | {count} |")
    seen = {o.stop_reason for o in outcomes}
    never = [r.value for r in StopReason if r.value not in seen]
    lines += ["", f"Stop reasons that never occurred: {', '.join(never) or 'none'}", ""]
    lines += [
        "## Steps per run",
        "",
        "| scenario | runs | min | median | p90 | max |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in sorted({o.scenario for o in outcomes}):
        steps = [o.steps for o in outcomes if o.scenario == scenario and o.error is None]
        lines.append(f"| {scenario} " + _quantiles(steps))
    lines += [
        "",
        "## Programmatic success",
        "",
        "| scenario | graded runs | succeeded |",
        "|---|---|---|",
    ]
    for scenario, (graded, succeeded) in sorted(_success_counts(args.runs_dir, outcomes).items()):
        lines.append(f"| {scenario} | {graded} | {succeeded} |")
    if meter is not None:
        lines += ["", *_calls_section(args, meter)]
    errored = sorted(o.run_id for o in outcomes if o.error is not None)
    if errored:
        lines += ["", "## Runs with a driver error", ""] + [f"- {run_id}" for run_id in errored]
    if server is not None:
        lines += [
            "",
            "## Policy server",
            "",
            f"- requests {server.requests}, replies {server.replies}, injected failures "
            f"{server.injected_failures}, policy errors {server.policy_errors}, abandoned "
            f"{server.abandoned}",
        ]
    return "\n".join(lines) + "\n"


def _success_counts(runs_dir: Path, outcomes: Sequence[RunOutcome]) -> dict[str, tuple[int, int]]:
    """Per scenario: runs whose meta carries a success verdict, and how many succeeded."""
    counts: dict[str, tuple[int, int]] = {}
    for outcome in outcomes:
        path = artifact_path(runs_dir, outcome.run_id, META_SUFFIX)
        try:
            success = json.loads(path.read_text(encoding="utf-8")).get("success")
        except FileNotFoundError:
            continue
        graded, succeeded = counts.get(outcome.scenario, (0, 0))
        if isinstance(success, bool):
            counts[outcome.scenario] = (graded + 1, succeeded + int(success))
    return counts


def _dry_report(
    args: argparse.Namespace, units: Sequence[Unit], report: DispatchReport, record: _DryRecord
) -> str:
    chars = record.prompt_chars or []
    lines = [
        "# Soak: dry run",
        "",
        f"- scenarios: {', '.join(sorted({u.scenario for u in units}))}; seed {args.seed}",
        f"- units: {len(units)}; runs assembled: {record.runs}; unit failures: "
        f"{len(report.failures)}",
        f"- initial prompt characters: min {min(chars, default=0)}, max {max(chars, default=0)}",
        "- model calls: 0; run files written: 0",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
