"""The soak on Ray: every run of both scenarios placed by ``polyloop.ray.run_on_ray``.

``run_soak --engine ray`` and the fault class ``cluster`` use this module. The driver keeps
what is per batch (the task list, the policy server, the budget, the reports); every *run* is
one task description (``SoakRunDescription``: scenario, task, phase, binding, directories and
the policy server's loopback URL) sent to the cluster, and ``build_soak_run`` builds it on the
worker: the HTTP client and ``GatewayModelClient``, the ``JsonlRunStore`` on the shared runs
directory, the scenario's request (the review scenario's tools over the task's workspace; the
code scenario's executor over a codeworld worker process started for the run) and the event
file sink. On the way out it writes the run's ``.meta.json`` and ``.result.json`` exactly as
``run_soak.execute_run`` does, so the scoreboard judges Ray batches like local ones.

The three phases of a review task must run in order, so ``run_descriptions`` feeds
``run_on_ray`` from an async iterator: a task's next phase is queued when its previous phase's
outcome arrives (``run_on_ray`` reads its input beside the runs in flight, so this never
stalls).

Re-execution is the point: Ray may run a description again after its worker or node died, and
``session.run_or_resume`` continues the run from its log. A run that was already finished when
its description arrived keeps the sidecars its own process wrote. A resumed run gets a new
event file and ``resumed_from_step`` (events and meta describe the process that wrote them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ray import RayActors, RayOutcome, RayTasks, run_on_ray
from polyloop.session import AgentDefinition, RunRequest
from polyloop.stores import JsonlRunStore
from tools.soak._artifacts import (
    EVENTS_SUFFIX,
    EventFileSink,
    Meta,
    artifact_path,
    write_meta,
    write_result,
)
from tools.soak.scenarios.base import RunOutcome, RunSpec

__all__ = [
    "TAKEOVERS_DIR",
    "SoakRunDescription",
    "build_soak_run",
    "run_descriptions",
    "to_run_outcome",
]

TAKEOVERS_DIR = ".takeovers"
"""``<runs_dir>/.takeovers/<run_id>``: one line (the steps already logged) per execution that
found the run started and unfinished - a resume after a fault, however early it came."""

_SAMPLING = {"temperature": 0.0, "max_tokens": 768}


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakRunDescription:
    """One soak run, as it travels to a Ray worker (plain, picklable values only)."""

    scenario: str
    task: Any
    phase: str | None
    binding: dict[str, str]
    runs_dir: str
    workspace_root: str
    base_url: str
    model: str
    fault: str | None = None
    run_prefix: str = ""
    """Put before the scenario's run id (the fault batch's ``cluster-``); review only."""
    sampling: dict[str, Any] | None = None
    """The gateway's sampling fields (``None``: the soak's defaults)."""
    stream: bool = False
    postgres: str | None = None
    """A libpq connection string of the batch's throwaway server: the runs' store is then a
    ``PostgresRunStore`` there (``export_logs`` copies the logs into ``runs_dir`` afterwards,
    for the scoreboard); ``None``: the ``JsonlRunStore`` in ``runs_dir``."""

    @property
    def run_id(self) -> str:
        if self.scenario == "review":
            from tools.soak.scenarios import review

            assert self.phase is not None
            return self.run_prefix + review.make_run_id(self.task.task_id, self.phase)
        from tools.soak.scenarios import code

        if self.run_prefix:
            raise ValueError("a run_prefix is supported for the review scenario only")
        return code.run_id_for(self.task)


class _CountingClient:
    """The gateway client plus a count of call attempts (the meta's ``model_calls``)."""

    def __init__(self, inner: GatewayModelClient) -> None:
        self._inner = inner
        self.calls = 0

    async def call(self, call: Any) -> Any:
        self.calls += 1
        return await self._inner.call(call)

    def parameters(self) -> Mapping[str, str]:
        return self._inner.parameters()


async def _code_spec(
    description: SoakRunDescription, stack: contextlib.AsyncExitStack
) -> tuple[RunSpec, Callable[[], Any]]:
    """The code run's spec over a codeworld worker started for this run (closed by ``stack``)."""
    from tools.soak.codeworld.client import WorkerSession
    from tools.soak.codeworld.pool import WorkerPool
    from tools.soak.scenarios import code

    task = description.task
    workspace = Path(description.workspace_root) / code.NAME / task.task_id
    workspace.mkdir(parents=True, exist_ok=True)
    pool = await stack.enter_async_context(WorkerPool(size=1, exec_timeout=code.EXEC_TIMEOUT))
    http = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
    handle = await stack.enter_async_context(pool.lease())
    session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
    await session.reset(task_id=task.task_id, seed=task.seed, ledger=workspace / code.LEDGER_NAME)
    executor = code.CodeExecutor(session=session)

    async def evaluate() -> bool | None:
        if not handle.alive or handle.dirty:
            return None
        verdict = await session.evaluate()
        await session.close()
        return verdict

    spec = RunSpec(
        request=code.build_run_request(task=task, executor=executor, binding=description.binding),
        decision_parser=code.CodeParser(),
        synthetic_observations=code.SYNTHETIC_OBSERVATIONS,
        task_id=task.task_id,
        phase=None,
        env_executions=lambda: executor.env_executions,
        evaluate=evaluate,
    )
    return spec, evaluate


def _review_spec(description: SoakRunDescription) -> RunSpec:
    from tools.soak.scenarios import review

    assert description.phase is not None
    workspace = Path(description.workspace_root) / review.NAME / description.task.task_id
    spec: RunSpec = review.build_run_spec(
        task=description.task,
        phase=description.phase,
        workspace=workspace,
        model_binding=description.binding,
        run_id=description.run_id,
    )
    return spec


@contextlib.asynccontextmanager
async def build_soak_run(
    description: SoakRunDescription,
) -> AsyncIterator[tuple[AgentDefinition, RunRequest]]:
    """The run factory ``run_on_ray`` calls on a worker (see the module docstring)."""
    runs_dir = Path(description.runs_dir)
    run_id = description.run_id
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(300.0, connect=10.0))
        )
        client = _CountingClient(
            GatewayModelClient(
                client=http,
                settings=GatewaySettings(
                    base_url=description.base_url,
                    model=description.model,
                    sampling=_SAMPLING if description.sampling is None else description.sampling,
                    stream=description.stream,
                ),
            )
        )
        evaluate: Callable[[], Any] | None = None
        if description.scenario == "code":
            spec, evaluate = await _code_spec(description, stack)
        else:
            spec = _review_spec(description)
        store = await _open_store(description, stack)
        log = await store.read_log(run_id)
        finished_before = log.finished is not None
        resumed_from = 0 if log.is_empty or finished_before else len(log.steps)
        if not log.is_empty and not finished_before:
            # The environment's own note that this execution took over an unfinished run (the
            # meta's resumed_from_step is 0 when the takeover happens before the first step).
            takeovers = runs_dir / TAKEOVERS_DIR
            takeovers.mkdir(exist_ok=True)
            with (takeovers / run_id).open("a", encoding="utf-8") as note:
                note.write(f"{len(log.steps)}\n")
        events_path = artifact_path(runs_dir, run_id, EVENTS_SUFFIX)
        if resumed_from:
            events_path.unlink(missing_ok=True)
        sink = EventFileSink(events_path)
        definition = AgentDefinition(
            model_client=client,
            decision_parser=spec.decision_parser,
            store=store,
            event_sink=sink,
            synthetic_observations=spec.synthetic_observations,
        )
        started = time.monotonic()
        try:
            yield definition, spec.request
        finally:
            if not finished_before:
                final = await store.read_log(run_id)
                result = None if final.finished is None else final.finished.result
                graded: bool | None = None
                if result is not None:
                    graded = await evaluate() if evaluate is not None else spec.success()
                write_meta(
                    runs_dir,
                    run_id,
                    Meta(
                        scenario=description.scenario,
                        task_id=spec.task_id,
                        phase=spec.phase,
                        wall_ms=int((time.monotonic() - started) * 1000),
                        model_calls=client.calls,
                        sink_failures=sink.failures,
                        env_executions=spec.env_executions(),
                        fault=description.fault,
                        success=graded,
                        resumed_from_step=resumed_from,
                    ),
                )
                if result is not None:
                    write_result(runs_dir, run_id, result)


async def _open_store(description: SoakRunDescription, stack: contextlib.AsyncExitStack) -> Any:
    if description.postgres is None:
        return JsonlRunStore(directory=Path(description.runs_dir))
    from polyloop.stores import PostgresRunStore

    store = await PostgresRunStore.open(description.postgres, pool_size=2, lease_seconds=5.0)
    stack.push_async_callback(store.close)
    return store


async def export_logs(postgres: str, runs_dir: Path, run_ids: Sequence[str]) -> int:
    """Copy each run's log from the Postgres store into ``runs_dir/<run_id>.jsonl``.

    The records are written, in their stored order, through a ``JsonlRunStore``: both stores
    encode records identically, so the files hold the bytes a JSONL batch would have written
    and the scoreboard reads them as usual. Returns how many logs were copied.
    """
    from polyloop.stores import PostgresRunStore

    target = JsonlRunStore(directory=runs_dir)
    copied = 0
    async with await PostgresRunStore.open(postgres, pool_size=1) as source:
        for run_id in run_ids:
            log = await source.read_log(run_id)
            if log.is_empty:
                continue
            for entry in log.entries:
                await _WRITERS[type(entry.record).__name__](target, entry.record)
            copied += 1
    return copied


_WRITERS: dict[str, Callable[[JsonlRunStore, Any], Any]] = {
    "RunStarted": lambda store, record: store.write_run_started(record),
    "Intent": lambda store, record: store.write_intent(record),
    "ModelCallResult": lambda store, record: store.write_model_call_result(record),
    "StepCompleted": lambda store, record: store.write_step_completed(record),
    "RunFinished": lambda store, record: store.write_run_finished(record),
}


def to_run_outcome(outcome: RayOutcome[SoakRunDescription]) -> RunOutcome:
    """The driver's ``RunOutcome`` of one Ray outcome (``model_calls``: steps, see meta)."""
    description = outcome.task
    result = outcome.result
    return RunOutcome(
        run_id=description.run_id,
        scenario=description.scenario,
        task_id=description.task.task_id,
        phase=description.phase,
        stop_reason=None if result is None else result.stop_reason.value,
        steps=0 if result is None else len(result.steps),
        model_calls=0 if result is None else len(result.steps),
        wall_ms=int(outcome.progress.elapsed_seconds * 1000),
        error=outcome.error,
    )


async def run_descriptions(
    chains: Sequence[Sequence[SoakRunDescription]],
    *,
    max_in_flight: int,
    engine: RayActors | RayTasks | None = None,
    stop_new_chains: Callable[[], bool] = lambda: False,
    on_outcome: Callable[[RayOutcome[SoakRunDescription]], Any] | None = None,
) -> list[RayOutcome[SoakRunDescription]]:
    """Run every chain (a task's runs, in order) on Ray; a chain stops at its first error.

    ``stop_new_chains()`` is asked before a chain's first run is queued (the budget);
    ``on_outcome`` is called (and awaited if it returns an awaitable) with every outcome.
    """
    queue: asyncio.Queue[SoakRunDescription | None] = asyncio.Queue()
    pending_chains = [list(chain) for chain in chains if chain]
    waiting_chains = list(reversed(pending_chains))
    live = 0

    def start_chains() -> None:
        nonlocal live
        # Keep the queue one chain ahead of the runs in flight, not the whole batch.
        while waiting_chains and live < max_in_flight and not stop_new_chains():
            chain = waiting_chains.pop()
            queue.put_nowait(chain[0])
            live += 1

    chain_of: dict[str, list[SoakRunDescription]] = {}
    for chain in pending_chains:
        for description in chain:
            chain_of[description.run_id] = chain
    start_chains()
    if live == 0:
        return []

    async def feed() -> AsyncIterator[SoakRunDescription]:
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    outcomes: list[RayOutcome[SoakRunDescription]] = []
    async for outcome in run_on_ray(
        build_soak_run, feed(), max_in_flight=max_in_flight, engine=engine
    ):
        outcomes.append(outcome)
        if on_outcome is not None:
            maybe = on_outcome(outcome)
            if asyncio.iscoroutine(maybe):
                await maybe
        chain = chain_of[outcome.task.run_id]
        position = chain.index(outcome.task)
        if outcome.error is None and position + 1 < len(chain):
            queue.put_nowait(chain[position + 1])
        else:
            live -= 1
            start_chains()
            if live == 0:
                queue.put_nowait(None)
    return outcomes
