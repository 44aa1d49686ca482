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
  The driver pings every actor about once a second and sends new runs only to actors that
  answer; one dead for good (its restarts used up) is replaced by a new actor, and the runs it
  held are sent once more, to a live one (issue 27).
* ``RayTasks()``: one Ray task per run. A task holds a worker process for the whole run, so
  concurrency is bounded by worker processes (``num_cpus`` per task). Ray re-executes a task
  whose worker or node died (``max_retries``).

Application exceptions are never retried by Ray: a run that raises (``ParameterDriftError``,
``LogCorruptError``, an executor breaking its contract) is reported in its outcome's ``error``.
A run whose lease is held by another live holder is waited for on the worker (see
``lease_wait_seconds``). When the cluster has nowhere to run anything - no actor answers, no
alive node has the CPUs a task needs - for ``capacity_wait_seconds``, ``run_on_ray`` raises
``EngineCapacityError`` naming what is missing, instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import ray
import ray.exceptions

from polyloop.errors import (
    EngineCapacityError,
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
    "connect",
    "run_on_ray",
]

TaskT = TypeVar("TaskT")

logger = logging.getLogger("polyloop.ray")

RunFactory = Callable[[TaskT], AbstractAsyncContextManager[tuple[AgentDefinition, RunRequest]]]
"""Builds one run on the worker: ``factory(description)`` is an async context manager that
yields ``(definition, request)`` and closes what it opened (HTTP clients, worker leases)."""

_DEFAULT_LEASE_WAIT: Final = 300.0
_DEFAULT_CAPACITY_WAIT: Final = 120.0


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

    An actor whose restarts are used up is not left in place (it would fail every call at once,
    look least loaded, and take every new run): ``run_on_ray`` replaces it by a new actor, with
    a new ``max_restarts``, and sends the runs it held once more, to a live actor. So
    ``max_restarts`` bounds the deaths of one actor in a row, not of the batch (issue 27).
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


_PROBE_SECONDS: Final = 1.0
"""How often the driver asks each actor whether it is alive (a ``ping`` call), and how often
it checks the cluster's nodes for ``RayTasks``, while it waits."""
_STALE_SECONDS: Final = 5.0
"""An actor whose ping has been unanswered this long (or half ``capacity_wait_seconds``, if
that is shorter) gets no new runs until it answers."""
_RESENDS_AFTER_ACTOR_LOSS: Final = 1
"""How often a run whose actor was lost for good is sent again, to a live actor (then its
outcome carries Ray's error): once, so that a run that kills every process it runs in costs
at most two actors."""


class _Submitter:
    """Sends descriptions to the cluster, knows where there is room, and watches for none."""

    def capacity(self) -> int:
        """How many runs the cluster can hold now (0: nowhere to send one)."""
        raise NotImplementedError

    def check(self, now: float, *, busy: bool) -> str | None:
        """Update what is known of the cluster; why work cannot go on (``busy``: there is
        work to do), once it has been so for longer than the bound, else ``None``."""
        raise NotImplementedError

    def wakeups(self) -> set[asyncio.Future[Any]]:
        """Futures whose completion ``check`` wants to see at once (pings in flight)."""
        return set()

    def submit(self, description: Any) -> tuple[asyncio.Future[Any], Any]:
        raise NotImplementedError

    def settle(self, token: Any, future: asyncio.Future[Any]) -> bool:
        """Account for a finished call; ``True`` when its actor was lost (send the run again)."""
        return False

    def close(self) -> None:
        return None


@dataclass(slots=True, kw_only=True)
class _Shortage:
    """Since when there has been no room at all (``None``: there is room)."""

    wait: float
    since: float | None = None

    def note(self, now: float, *, room: bool, busy: bool) -> bool:
        """Record whether there is room; ``True`` once none has lasted longer than ``wait``."""
        if room or not busy:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since > self.wait


def _alive_node_cpus() -> list[float]:
    """The CPUs of each alive node of the cluster (the GCS's node table)."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [float(n.get("Resources", {}).get("CPU", 0.0)) for n in nodes if n.get("Alive")]


def _cluster_summary() -> str:
    """The cluster's alive nodes and CPUs, in words (for the capacity error)."""
    cpus = _alive_node_cpus()
    resources: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]
    free = float(resources.get("CPU", 0.0))
    return (
        f"the cluster has {len(cpus)} alive node{'s' * (len(cpus) != 1)} with "
        f"{sum(cpus):g} CPUs in all (at most {max(cpus, default=0.0):g} on one node, "
        f"{free:g} free)"
    )


class _TaskSubmitter(_Submitter):
    def __init__(
        self, engine: RayTasks, factory: RunFactory[Any], lease_wait: float, capacity_wait: float
    ) -> None:
        self._engine = engine
        self._remote = ray.remote(_task_body).options(
            num_cpus=engine.num_cpus,
            max_retries=engine.max_retries,
            retry_exceptions=False,
            scheduling_strategy="SPREAD" if engine.spread else "DEFAULT",
        )
        self._factory_ref = ray.put(factory)
        self._lease_wait = lease_wait
        self._refs: set[Any] = set()
        self._shortage = _Shortage(wait=capacity_wait)
        self._feasible = self._some_node_fits()
        self._checked = time.monotonic()

    def _some_node_fits(self) -> bool:
        return any(cpus >= self._engine.num_cpus for cpus in _alive_node_cpus())

    def capacity(self) -> int:
        # Ray queues tasks a node has no free CPUs for yet: only a cluster on which no node
        # could ever run one (none alive with num_cpus CPUs) has no room.
        return _UNBOUNDED if self._feasible else 0

    def check(self, now: float, *, busy: bool) -> str | None:
        if now - self._checked >= _PROBE_SECONDS:
            self._feasible = self._some_node_fits()
            self._checked = now
        if not self._shortage.note(now, room=self._feasible, busy=busy):
            return None
        return (
            f"no alive node offered the {self._engine.num_cpus:g} CPUs one task needs "
            f"(RayTasks(num_cpus=...)) for {self._shortage.wait:g} s: {_cluster_summary()}; "
            "add worker nodes with CPUs or lower num_cpus"
        )

    def submit(self, description: Any) -> tuple[asyncio.Future[Any], Any]:
        ref = self._remote.remote(self._factory_ref, description, self._lease_wait)
        self._refs.add(ref)
        return asyncio.wrap_future(ref.future()), ref

    def settle(self, token: Any, future: asyncio.Future[Any]) -> bool:
        self._refs.discard(token)
        return False

    def close(self) -> None:
        for ref in self._refs:
            ray.cancel(ref, force=True)
        self._refs.clear()


_UNBOUNDED: Final = 1 << 62


@dataclass(slots=True, kw_only=True)
class _Slot:
    """One of ``RayActors``' actors, as the driver knows it."""

    actor: Any
    incarnation: int
    created: float
    load: int = 0
    answered: float | None = None
    """When a ping last came back (``None``: never, the actor may not be placed yet)."""
    suspect: bool = False
    """A call of it failed with an actor error: no new runs until a ping says it lives."""
    ping: asyncio.Future[Any] | None = None
    ping_sent: float = 0.0

    def live(self, now: float, stale: float) -> bool:
        """Answered, not suspect, and its latest ping not outstanding for longer than
        ``stale`` seconds: it takes new runs."""
        if self.answered is None or self.suspect:
            return False
        return self.ping is None or now - self.ping_sent <= stale

    def unanswered_for(self, now: float) -> float:
        """How long the actor has owed an answer (0 when its latest ping came back)."""
        if self.ping is None:
            return 0.0
        return now - (self.ping_sent if self.answered is not None else self.created)


class _ActorSubmitter(_Submitter):
    """``RayActors``: new runs go to the least-loaded *live* actor; a dead one is replaced.

    Each actor is pinged about once a second (``_PROBE_SECONDS``; the actor takes one call more
    than ``runs_per_actor``, so a full actor still answers). An actor whose call failed with
    Ray's actor error (its restarts used up, or killed) is suspect until a ping answers: a ping
    that fails with ``ActorDiedError`` means it is dead for good, and it is replaced by a fresh
    actor (with a fresh ``max_restarts``); one whose creation failed raises that error (a new
    one would fail alike). An actor that holds runs and has not answered for
    ``capacity_wait_seconds`` (it cannot be placed again: its node is gone and no other has
    room) is killed and replaced, so that its runs are sent to live actors. When no actor at
    all has been live for that long, ``check`` says so, naming what is missing.
    """

    def __init__(
        self, engine: RayActors, factory: RunFactory[Any], lease_wait: float, capacity_wait: float
    ) -> None:
        self._engine = engine
        self._class = ray.remote(_RunHost).options(
            num_cpus=engine.num_cpus,
            max_restarts=engine.max_restarts,
            max_task_retries=engine.max_task_retries,
            max_concurrency=engine.runs_per_actor + 1,  # + 1: a ping always finds room
            scheduling_strategy="SPREAD" if engine.spread else "DEFAULT",
        )
        self._arguments = (factory, lease_wait)
        self._shortage = _Shortage(wait=capacity_wait)
        self._stale = min(_STALE_SECONDS, capacity_wait / 2)
        self.replaced = 0
        now = time.monotonic()
        self._slots = [self._new_slot(0, now) for _ in range(engine.actors)]

    def _new_slot(self, incarnation: int, now: float) -> _Slot:
        return _Slot(
            actor=self._class.remote(*self._arguments), incarnation=incarnation, created=now
        )

    def _replace(self, index: int, why: str, now: float) -> None:
        old = self._slots[index]
        if old.ping is not None:
            old.ping.cancel()
        ray.kill(old.actor, no_restart=True)
        self._slots[index] = self._new_slot(old.incarnation + 1, now)
        self.replaced += 1
        logger.warning(
            "run_on_ray: actor %d (incarnation %d) %s; replaced by a new actor (%d replaced "
            "so far), its runs go to live actors",
            index,
            old.incarnation,
            why,
            self.replaced,
        )

    def capacity(self) -> int:
        now = time.monotonic()
        return self._engine.runs_per_actor * sum(
            slot.live(now, self._stale) for slot in self._slots
        )

    def wakeups(self) -> set[asyncio.Future[Any]]:
        return {slot.ping for slot in self._slots if slot.ping is not None}

    def check(self, now: float, *, busy: bool) -> str | None:
        wait = self._shortage.wait
        for index, slot in enumerate(self._slots):
            if slot.ping is not None and slot.ping.done():
                ping, slot.ping = slot.ping, None
                error = None if ping.cancelled() else ping.exception()
                if error is None and not ping.cancelled():
                    slot.answered, slot.suspect = now, False
                elif isinstance(error, ray.exceptions.ActorDiedError):
                    if error.actor_init_failed:
                        raise error  # the actor cannot even be built there: a new one neither
                    self._replace(index, f"is dead ({_describe(error)})", now)
                    continue
                # Any other error (ActorUnavailableError: restarting) is no answer: ask again.
            if slot.load > 0 and slot.unanswered_for(now) > wait:
                self._replace(index, f"held runs and did not answer for {wait:g} s", now)
                continue
            if slot.ping is None and (slot.suspect or now - slot.ping_sent >= _PROBE_SECONDS):
                slot.ping = asyncio.wrap_future(slot.actor.ping.remote().future())
                slot.ping_sent = now
        if not self._shortage.note(now, room=self.capacity() > 0, busy=busy):
            return None
        engine = self._engine
        return (
            f"none of the {engine.actors} actors (RayActors(num_cpus={engine.num_cpus:g}) "
            f"each) answered for {wait:g} s, {self.replaced} replaced so far: "
            f"{_cluster_summary()}; add worker nodes with CPUs or lower num_cpus"
        )

    def submit(self, description: Any) -> tuple[asyncio.Future[Any], Any]:
        now = time.monotonic()
        live = [i for i, slot in enumerate(self._slots) if slot.live(now, self._stale)]
        index = min(live or range(len(self._slots)), key=lambda i: self._slots[i].load)
        slot = self._slots[index]
        slot.load += 1
        ref = slot.actor.execute.remote(description)
        return asyncio.wrap_future(ref.future()), (index, slot.incarnation)

    def settle(self, token: Any, future: asyncio.Future[Any]) -> bool:
        index, incarnation = token
        lost = not future.cancelled() and isinstance(
            future.exception(), ray.exceptions.RayActorError
        )
        slot = self._slots[index]
        if slot.incarnation == incarnation:  # else: that actor was replaced already
            slot.load -= 1
            slot.suspect = slot.suspect or lost
        return lost

    def close(self) -> None:
        for slot in self._slots:
            if slot.ping is not None:
                slot.ping.cancel()
            ray.kill(slot.actor, no_restart=True)
        self._slots.clear()


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


def connect(address: str, *, node_ip_address: str = "127.0.0.1") -> None:
    """``ray.init(address=address, _node_ip_address=node_ip_address)`` unless Ray is connected
    already: for callers that must not import Ray themselves (``python -m polyloop batch run
    --ray ADDRESS``). ``node_ip_address`` is the address this driver advertises (127.0.0.1 on
    a loopback cluster, the default)."""
    if not isinstance(address, str) or not address:
        raise PolyloopTypeError("connect(address) must be a Ray address such as '127.0.0.1:6379'")
    if not ray.is_initialized():
        ray.init(address=address, _node_ip_address=node_ip_address, log_to_driver=False)


async def run_on_ray(
    factory: RunFactory[TaskT],
    tasks: Iterable[TaskT] | AsyncIterable[TaskT],
    *,
    max_in_flight: int = 64,
    engine: RayActors | RayTasks | None = None,
    lease_wait_seconds: float = _DEFAULT_LEASE_WAIT,
    capacity_wait_seconds: float = _DEFAULT_CAPACITY_WAIT,
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
    * New runs go only to actors that answer the driver's ping (about once a second). An actor
      dead for good (its ``max_restarts`` used up, or killed) is replaced by a new one, and
      each run it held is sent once more, to a live actor; a second loss is the outcome's
      ``error``. An actor that holds runs and has not answered for ``capacity_wait_seconds``
      is replaced too (its runs go to the others).
    * ``capacity_wait_seconds`` bounds the wait for somewhere to run: when no actor has
      answered (none could be placed, or every node that held one is gone), or no alive node
      has the CPUs one task needs, for that long while there is work, it raises
      ``EngineCapacityError`` naming the nodes and CPUs the cluster has and what was done so
      far (with ``RayActors`` about half the bound more passes first: an actor counts as gone
      once its ping has been unanswered for half the bound, at most 5 s). Raise it on a
      cluster that adds nodes on demand (an autoscaler can take minutes).
    * A run whose lease another live process holds (a duplicate submission, or the previous
      attempt of a worker Ray thinks is dead) is waited for, up to ``lease_wait_seconds`` per
      attempt to take it (then the outcome's ``error`` is ``RunLeaseHeldError``); a lease lost
      part-way is taken again (see ``_execute``). Stores without leases are not protected:
      two executions of one run may then both continue it (design 0120).
    * Closing the iterator early (``break``, cancellation) kills the actors / cancels the
      tasks still in flight; their runs stop wherever they are and resume on the next call.
    """
    _check_run_options(factory, max_in_flight, lease_wait_seconds, capacity_wait_seconds)
    submitter, max_in_flight = _submitter_for(
        engine, factory, float(lease_wait_seconds), float(capacity_wait_seconds), max_in_flight
    )
    flight = _Flight[TaskT](tally=_Tally(began=time.monotonic()))
    source = _descriptions(tasks)
    pull: asyncio.Future[tuple[bool, TaskT | None]] | None = None
    try:
        while True:
            room = flight.send_ready(submitter, max_in_flight)
            # The next description is awaited beside the runs in flight, never before them:
            # an async source that waits for outcomes (one run's end decides the next) must
            # not stop this loop from yielding those outcomes.
            if pull is None and not flight.exhausted and not flight.ready and room > 0:
                pull = asyncio.ensure_future(_next_description(source))
            if flight.exhausted and not flight.pending and not flight.ready:
                return
            waiting: set[asyncio.Future[Any]] = {*flight.pending, *submitter.wakeups()}
            if pull is not None:
                waiting.add(pull)
            if not waiting:  # nowhere to send anything yet: look at the cluster again soon
                await asyncio.sleep(_PROBE_SECONDS)
                continue
            done, _ = await asyncio.wait(
                waiting, timeout=_PROBE_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            for future in [f for f in done if f in flight.pending]:
                outcome = flight.settle(submitter, future)
                if outcome is not None:
                    yield outcome
            if pull is not None and pull in done:
                more, description = pull.result()
                pull = None
                flight.took(more, description)
    finally:
        if pull is not None:
            pull.cancel()
        for future in flight.pending:
            future.cancel()
        submitter.close()


def _check_run_options(
    factory: object, max_in_flight: object, lease_wait: object, capacity_wait: object
) -> None:
    """``run_on_ray``'s argument checks, then the check that Ray is connected."""
    _check_positive("run_on_ray(max_in_flight=...)", max_in_flight)
    _check_non_negative_number("run_on_ray(lease_wait_seconds=...)", lease_wait)
    _check_non_negative_number("run_on_ray(capacity_wait_seconds=...)", capacity_wait)
    if capacity_wait == 0:
        raise PolyloopValueError("run_on_ray(capacity_wait_seconds=...) must be > 0, got 0")
    if not callable(factory):
        raise PolyloopTypeError(
            f"run_on_ray(factory=...) must be callable, got {type(factory).__name__}"
        )
    if not ray.is_initialized():
        raise EngineNotConnectedError(
            "run_on_ray: Ray is not initialized in this process; connect first with "
            "ray.init(address=..., _node_ip_address=...) naming the address this driver "
            "advertises (127.0.0.1 on a loopback cluster); run_on_ray never starts a cluster"
        )


@dataclass(slots=True, kw_only=True)
class _Sent(Generic[TaskT]):
    """A description on its way: where it was sent, and how often it was sent again."""

    task: TaskT
    token: Any = None
    resends: int = 0


@dataclass(slots=True, kw_only=True)
class _Flight(Generic[TaskT]):
    """``run_on_ray``'s descriptions between the input and their outcomes."""

    tally: _Tally
    pending: dict[asyncio.Future[Any], _Sent[TaskT]] = field(default_factory=dict)
    ready: deque[_Sent[TaskT]] = field(default_factory=deque)
    """Taken from the input (or to be sent again), not sent yet: the cluster had no room."""
    exhausted: bool = False

    @property
    def in_flight(self) -> int:
        return len(self.pending) + len(self.ready)

    def send_ready(self, submitter: _Submitter, bound: int) -> int:
        """Raise if the cluster has had nowhere to run for too long, else send what is ready
        while there is room; the room left."""
        busy = bool(self.pending or self.ready or not self.exhausted)
        problem = submitter.check(time.monotonic(), busy=busy)
        if problem is not None:
            tally = self.tally
            raise EngineCapacityError(
                f"run_on_ray: {problem}. So far {tally.submitted} taken from the input, "
                f"{tally.finished} finished ({tally.failed} failed), {self.in_flight} in "
                "flight; they continue from their logs on the next call"
            )
        room = min(bound, submitter.capacity()) - len(self.pending)
        while self.ready and room > 0:
            sent = self.ready.popleft()
            future, sent.token = submitter.submit(sent.task)
            self.pending[future] = sent
            room -= 1
        return room

    def settle(
        self, submitter: _Submitter, future: asyncio.Future[Any]
    ) -> RayOutcome[TaskT] | None:
        """The outcome of a finished call, or ``None`` when its actor was lost for good and
        the run goes to a live one (once, ``_RESENDS_AFTER_ACTOR_LOSS``)."""
        sent = self.pending.pop(future)
        if submitter.settle(sent.token, future) and sent.resends < _RESENDS_AFTER_ACTOR_LOSS:
            sent.resends += 1
            self.ready.append(sent)
            return None
        return _outcome_of(future, sent.task, self.tally, in_flight=self.in_flight)

    def took(self, more: bool, description: TaskT | None) -> None:
        """Record what the input gave: a description, or its end."""
        if more:
            self.ready.append(_Sent(task=description))  # type: ignore[arg-type]
            self.tally.submitted += 1
        else:
            self.exhausted = True


def _submitter_for(
    engine: RayActors | RayTasks | None,
    factory: RunFactory[Any],
    lease_wait: float,
    capacity_wait: float,
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
        return _ActorSubmitter(chosen, factory, lease_wait, capacity_wait), bound
    if isinstance(chosen, RayTasks):
        return _TaskSubmitter(chosen, factory, lease_wait, capacity_wait), max_in_flight
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
