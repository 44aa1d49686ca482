"""Many runs across a Ray cluster: Ray places them and re-executes what a dead worker started.

Needs the ``ray`` extra (``pip install 'polyloop[ray]'``); ``import polyloop`` never imports it.
The design is ``research-wiki/design/0140-ray-engine.md``; the measurements behind the choice of
``RayActors`` as the default are in ``research-wiki/reference/performance.md``; a walk-through
for a real cluster is ``research-wiki/guides/running-on-a-cluster.md``.

::

    import ray
    from polyloop.ray import RayActors, run_on_ray

    # Connect first: run_on_ray never starts a cluster. _node_ip_address is the address this
    # driver advertises; on a one-machine (loopback) cluster it must be 127.0.0.1.
    ray.init(address="auto", _node_ip_address="127.0.0.1")
    async for outcome in run_on_ray(build_run, task_descriptions, max_in_flight=64):
        print(outcome.progress, outcome.run_id, outcome.stop_reason)

What crosses the wire is small: the *factory* (a picklable callable, pickled once) and one
*task description* per run (any picklable value: a dict, a task id). On the worker,
``factory(description)`` returns an async context manager whose ``__aenter__`` yields the run's
``(AgentDefinition, RunRequest)``: model clients, stores and tool registries are built where the
run executes, never pickled, and closed by the context manager's exit. The run itself is
``polyloop.session.run_or_resume``, so Ray may execute a description any number of times - after
a worker or node died, or because it was submitted twice - and each execution starts the run,
resumes it where its log ends, or returns its stored result. The write-ahead log and the
store's run lease, not Ray, are what keep a ``NEVER`` action at most once.

Placement (``engine=``):

* ``RayActors(actors=N, runs_per_actor=M)`` (default): N async actors, each driving up to M runs
  at once on one event loop. A run is I/O-bound (seconds of model latency, milliseconds of CPU),
  so one process can hold many. An actor that dies (its process killed, its node gone) is
  restarted by Ray (``max_restarts``) and the calls it held are re-sent (``max_task_retries``).
* ``RayTasks()``: one Ray task per run. A task holds a worker process for the whole run, so
  concurrency is bounded by worker processes (``num_cpus`` per task). Ray re-executes a task
  whose worker or node died (``max_retries``).

Application exceptions are never retried by Ray: a run that raises (``ParameterDriftError``,
``LogCorruptError``, an executor breaking its contract) is reported in its outcome's ``error``.
A run whose lease is held by another live holder is waited for on the worker (see
``lease_wait_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import ray
import ray.exceptions

from polyloop.errors import (
    EngineNotConnectedError,
    PolyloopTypeError,
    PolyloopValueError,
    RunLeaseLostError,
)
from polyloop.session import AgentDefinition, RunRequest, run_or_resume
from polyloop.types import RunResult, StopReason

__all__ = [
    "Progress",
    "RayActors",
    "RayOutcome",
    "RayTasks",
    "RunFactory",
    "run_on_ray",
]

TaskT = TypeVar("TaskT")

logger = logging.getLogger("polyloop.ray")

RunFactory = Callable[[TaskT], AbstractAsyncContextManager[tuple[AgentDefinition, RunRequest]]]
"""Builds one run on the worker: ``factory(description)`` is an async context manager that
yields ``(definition, request)`` and closes what it opened (HTTP clients, worker leases)."""

_DEFAULT_LEASE_WAIT: Final = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RayActors:
    """Async actors that each hold many runs on one event loop (the default placement).

    ``actors`` actors are created when ``run_on_ray`` starts and killed when it ends; each runs
    up to ``runs_per_actor`` runs at once. ``num_cpus`` is what one actor reserves for
    scheduling: keep it small enough that the survivors' nodes can take a dead node's actors
    (a restarted actor waits until some node has ``num_cpus`` free). ``max_restarts`` and
    ``max_task_retries`` are Ray's own: how often a dead actor is restarted and how often a
    call it held is sent again. ``spread`` asks Ray to place the actors on different nodes
    (``scheduling_strategy="SPREAD"``), so that one node's death takes only its share.
    """

    actors: int = 2
    runs_per_actor: int = 32
    num_cpus: float = 0.25
    max_restarts: int = 4
    max_task_retries: int = 4
    spread: bool = True

    def __post_init__(self) -> None:
        _check_positive("RayActors.actors", self.actors)
        _check_positive("RayActors.runs_per_actor", self.runs_per_actor)
        _check_non_negative_number("RayActors.num_cpus", self.num_cpus)
        _check_non_negative("RayActors.max_restarts", self.max_restarts)
        _check_non_negative("RayActors.max_task_retries", self.max_task_retries)
        _check_bool("RayActors.spread", self.spread)


@dataclass(frozen=True, slots=True, kw_only=True)
class RayTasks:
    """One Ray task per run, in a worker process of its own for the run's whole life.

    ``num_cpus`` per task bounds how many runs a node holds at once (a node with 1 CPU and
    ``num_cpus=0.25`` runs four, in four processes). ``max_retries`` is Ray's: how often a task
    whose worker or node died is executed again. ``spread`` places tasks across nodes
    (``scheduling_strategy="SPREAD"``) instead of filling one node first.
    """

    num_cpus: float = 0.25
    max_retries: int = 4
    spread: bool = True

    def __post_init__(self) -> None:
        _check_non_negative_number("RayTasks.num_cpus", self.num_cpus)
        _check_non_negative("RayTasks.max_retries", self.max_retries)
        _check_bool("RayTasks.spread", self.spread)


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """Counts at the moment an outcome was yielded: ``finished`` includes this outcome,
    ``failed`` counts outcomes with an ``error``, ``in_flight`` runs are submitted and not yet
    finished, ``submitted`` is every description taken from the input so far."""

    submitted: int
    finished: int
    failed: int
    in_flight: int
    elapsed_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RayOutcome(Generic[TaskT]):
    """How one task description ended.

    Exactly one of ``result`` and ``error`` is set. ``result`` is the run's ``RunResult`` (for a
    run that had already finished, its stored result). ``error`` is ``"ExceptionType: message"``
    of what the run raised, or of Ray's error when the retries ran out (the worker or node died
    more often than allowed); the run's log is then whatever the last attempt left, and calling
    again resumes it.
    """

    task: TaskT
    result: RunResult | None
    error: str | None
    progress: Progress = field(compare=False)

    @property
    def run_id(self) -> str | None:
        return None if self.result is None else self.result.run_id

    @property
    def stop_reason(self) -> StopReason | None:
        return None if self.result is None else self.result.stop_reason


# --------------------------------------------------------------------------- worker side


_LEASE_LOST_RETRIES: Final = 3


async def _execute(factory: RunFactory[Any], description: Any, lease_wait: float) -> RunResult:
    """Build the run from its description and run, resume or read it (on the worker).

    A lease lost part-way (``RunLeaseLostError``: another holder took the run over, and nothing
    was written after that) is not the run's failure: the run is built and called again, which
    waits for the new holder and then continues or reads back what it did.
    """
    for _ in range(_LEASE_LOST_RETRIES):
        try:
            return await _execute_once(factory, description, lease_wait)
        except RunLeaseLostError:
            logger.warning("a run's lease was taken over mid-run; building it again", exc_info=True)
    return await _execute_once(factory, description, lease_wait)


async def _execute_once(factory: RunFactory[Any], description: Any, lease_wait: float) -> RunResult:
    context = factory(description)
    if not isinstance(context, AbstractAsyncContextManager):
        raise PolyloopTypeError(
            f"the run factory returned {type(context).__name__}; it must return an async context "
            "manager that yields (AgentDefinition, RunRequest), e.g. a function decorated "
            "with @contextlib.asynccontextmanager"
        )
    async with context as parts:
        definition, request = _checked_parts(parts)
        return await run_or_resume(definition, request, lease_wait_seconds=lease_wait)


def _checked_parts(parts: object) -> tuple[AgentDefinition, RunRequest]:
    if (
        not isinstance(parts, tuple)
        or len(parts) != 2
        or not isinstance(parts[0], AgentDefinition)
        or not isinstance(parts[1], RunRequest)
    ):
        raise PolyloopTypeError(
            f"the run factory's context manager yielded {type(parts).__name__}; it must yield "
            "a (AgentDefinition, RunRequest) tuple"
        )
    return parts[0], parts[1]


def _task_body(factory: RunFactory[Any], description: Any, lease_wait: float) -> RunResult:
    return asyncio.run(_execute(factory, description, lease_wait))


class _RunHost:
    """The actor: many runs at once on its event loop, one factory for all of them."""

    def __init__(self, factory: RunFactory[Any], lease_wait: float) -> None:
        self._factory = factory
        self._lease_wait = lease_wait

    async def execute(self, description: Any) -> RunResult:
        return await _execute(self._factory, description, self._lease_wait)

    async def ping(self) -> bool:
        return True


# --------------------------------------------------------------------------- driver side


class _Submitter:
    """Sends one description to the cluster and returns an awaitable of its ``RunResult``."""

    async def start(self) -> None:
        return None

    def submit(self, description: Any) -> tuple[asyncio.Future[Any], Any]:
        raise NotImplementedError

    def settle(self, token: Any) -> None:
        return None

    def close(self) -> None:
        return None


class _TaskSubmitter(_Submitter):
    def __init__(self, engine: RayTasks, factory: RunFactory[Any], lease_wait: float) -> None:
        self._remote = ray.remote(_task_body).options(
            num_cpus=engine.num_cpus,
            max_retries=engine.max_retries,
            retry_exceptions=False,
            scheduling_strategy="SPREAD" if engine.spread else "DEFAULT",
        )
        self._factory_ref = ray.put(factory)
        self._lease_wait = lease_wait
        self._refs: set[Any] = set()

    def submit(self, description: Any) -> tuple[asyncio.Future[Any], Any]:
        ref = self._remote.remote(self._factory_ref, description, self._lease_wait)
        self._refs.add(ref)
        return asyncio.wrap_future(ref.future()), ref

    def settle(self, token: Any) -> None:
        self._refs.discard(token)

    def close(self) -> None:
        for ref in self._refs:
            ray.cancel(ref, force=True)
        self._refs.clear()


class _ActorSubmitter(_Submitter):
    def __init__(self, engine: RayActors, factory: RunFactory[Any], lease_wait: float) -> None:
        actor_class = ray.remote(_RunHost).options(
            num_cpus=engine.num_cpus,
            max_restarts=engine.max_restarts,
            max_task_retries=engine.max_task_retries,
            max_concurrency=engine.runs_per_actor,
            scheduling_strategy="SPREAD" if engine.spread else "DEFAULT",
        )
        self._actors: list[Any] = [
            actor_class.remote(factory, lease_wait) for _ in range(engine.actors)
        ]
        self._load = [0] * engine.actors

    async def start(self) -> None:
        # Fail early (and in the caller's terms) if the cluster cannot place the actors.
        await asyncio.gather(*(asyncio.wrap_future(a.ping.remote().future()) for a in self._actors))

    def submit(self, description: Any) -> tuple[asyncio.Future[Any], Any]:
        index = min(range(len(self._actors)), key=self._load.__getitem__)
        self._load[index] += 1
        ref = self._actors[index].execute.remote(description)
        return asyncio.wrap_future(ref.future()), index

    def settle(self, token: Any) -> None:
        self._load[token] -= 1

    def close(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors.clear()


async def _descriptions(tasks: Iterable[TaskT] | AsyncIterable[TaskT]) -> AsyncIterator[TaskT]:
    if isinstance(tasks, AsyncIterable):
        async for description in tasks:
            yield description
    else:
        for description in tasks:
            yield description


def _describe(exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
    shown = cause if isinstance(cause, BaseException) else exc
    first_line = str(shown).strip().splitlines()[0] if str(shown).strip() else ""
    return f"{type(shown).__name__}: {first_line}"


async def run_on_ray(
    factory: RunFactory[TaskT],
    tasks: Iterable[TaskT] | AsyncIterable[TaskT],
    *,
    max_in_flight: int = 64,
    engine: RayActors | RayTasks | None = None,
    lease_wait_seconds: float = _DEFAULT_LEASE_WAIT,
) -> AsyncIterator[RayOutcome[TaskT]]:
    """Execute one run per task description on the connected Ray cluster; yield as they finish.

    * ``ray.init(address=..., _node_ip_address=...)`` must have been called (the module
      docstring shows it): ``EngineNotConnectedError`` otherwise (this
      function never starts a cluster of its own, so it never picks an address for you).
    * At most ``max_in_flight`` descriptions are submitted and unfinished at any moment; the
      input (a list, any iterable, or an async iterable) is read only as fast as runs finish.
    * Outcomes come in completion order, each with the ``Progress`` at that moment.
    * A worker or node that dies is Ray's to handle: the run is executed again elsewhere
      (``RayActors.max_task_retries`` / ``RayTasks.max_retries``) and continues from its log.
      An exception raised by the run is not retried; it becomes the outcome's ``error``.
    * A run whose lease another live process holds (a duplicate submission, or the previous
      attempt of a worker Ray thinks is dead) is waited for, up to ``lease_wait_seconds`` per
      attempt to take it (then the outcome's ``error`` is ``RunLeaseHeldError``); a lease lost
      part-way is taken again (see ``_execute``). Stores without leases are not protected:
      two executions of one run may then both continue it (design 0120).
    * Closing the iterator early (``break``, cancellation) kills the actors / cancels the
      tasks still in flight; their runs stop wherever they are and resume on the next call.
    """
    if not ray.is_initialized():
        raise EngineNotConnectedError(
            "run_on_ray: Ray is not initialized in this process; connect first with "
            "ray.init(address=..., _node_ip_address=...) naming the address this driver "
            "advertises (127.0.0.1 on a loopback cluster); run_on_ray never starts a cluster"
        )
    _check_positive("run_on_ray(max_in_flight=...)", max_in_flight)
    _check_non_negative_number("run_on_ray(lease_wait_seconds=...)", lease_wait_seconds)
    if not callable(factory):
        raise PolyloopTypeError(
            f"run_on_ray(factory=...) must be callable, got {type(factory).__name__}"
        )
    submitter, max_in_flight = _submitter_for(
        engine, factory, float(lease_wait_seconds), max_in_flight
    )
    tally = _Tally(began=time.monotonic())
    pending: dict[asyncio.Future[Any], tuple[TaskT, Any]] = {}
    source = _descriptions(tasks)
    pull: asyncio.Future[tuple[bool, TaskT | None]] | None = None
    exhausted = False
    try:
        await submitter.start()
        while True:
            # The next description is awaited beside the runs in flight, never before them:
            # an async source that waits for outcomes (one run's end decides the next) must
            # not stop this loop from yielding those outcomes.
            if pull is None and not exhausted and len(pending) < max_in_flight:
                pull = asyncio.ensure_future(_next_description(source))
            if pull is None and not pending:
                return
            waiting: set[asyncio.Future[Any]] = set(pending)
            if pull is not None:
                waiting.add(pull)
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if pull is not None and pull in done:
                done.discard(pull)
                more, description = pull.result()
                pull = None
                if more:
                    future, token = submitter.submit(description)
                    pending[future] = (description, token)  # type: ignore[assignment]
                    tally.submitted += 1
                else:
                    exhausted = True
            for future in done:
                described, token = pending.pop(future)
                submitter.settle(token)
                yield _outcome_of(future, described, tally, in_flight=len(pending))
    finally:
        if pull is not None:
            pull.cancel()
        for future in pending:
            future.cancel()
        submitter.close()


def _submitter_for(
    engine: RayActors | RayTasks | None,
    factory: RunFactory[Any],
    lease_wait: float,
    max_in_flight: int,
) -> tuple[_Submitter, int]:
    """The submitter for ``engine`` (``None``: ``RayActors()``) and the in-flight bound it allows.

    ``RayActors`` caps ``max_in_flight`` at ``actors * runs_per_actor``, the runs its actors
    hold at once (design 0140), so no description is submitted only to wait in an actor's
    queue. Building an ``_ActorSubmitter`` creates its actors: call this after every check.
    """
    chosen = RayActors() if engine is None else engine
    if isinstance(chosen, RayActors):
        bound = min(max_in_flight, chosen.actors * chosen.runs_per_actor)
        return _ActorSubmitter(chosen, factory, lease_wait), bound
    if isinstance(chosen, RayTasks):
        return _TaskSubmitter(chosen, factory, lease_wait), max_in_flight
    raise PolyloopTypeError(
        f"run_on_ray(engine=...) must be RayActors or RayTasks, got {type(chosen).__name__}"
    )


@dataclass(slots=True, kw_only=True)
class _Tally:
    """The running counts behind every outcome's ``Progress``."""

    began: float
    submitted: int = 0
    finished: int = 0
    failed: int = 0

    def progress(self, *, in_flight: int) -> Progress:
        return Progress(
            submitted=self.submitted,
            finished=self.finished,
            failed=self.failed,
            in_flight=in_flight,
            elapsed_seconds=time.monotonic() - self.began,
        )


def _outcome_of(
    future: asyncio.Future[Any], described: TaskT, tally: _Tally, *, in_flight: int
) -> RayOutcome[TaskT]:
    """The outcome of a finished ``future``, counted in ``tally``.

    Only Ray's errors (``RayError``: a run's own exception arrives wrapped in
    ``RayTaskError``, retries that ran out as a worker or actor error) become the outcome's
    ``error``; anything else, a cancellation included, propagates uncounted.
    """
    result: RunResult | None = None
    error: str | None = None
    try:
        result = future.result()
    except ray.exceptions.RayError as exc:
        error = _describe(exc)
    tally.finished += 1
    tally.failed += error is not None
    return RayOutcome(
        task=described, result=result, error=error, progress=tally.progress(in_flight=in_flight)
    )


async def _next_description(source: AsyncIterator[TaskT]) -> tuple[bool, TaskT | None]:
    try:
        return True, await anext(source)
    except StopAsyncIteration:
        return False, None


# --------------------------------------------------------------------------- checks


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolyloopTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise PolyloopValueError(f"{name} must be >= 1, got {value}")


def _check_non_negative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolyloopTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise PolyloopValueError(f"{name} must be >= 0, got {value}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise PolyloopTypeError(f"{name} must be True or False, got {type(value).__name__}")


def _check_non_negative_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(f"{name} must be a number, got {type(value).__name__}")
    if not value >= 0 or value == float("inf"):
        raise PolyloopValueError(f"{name} must be finite and >= 0, got {value!r}")
