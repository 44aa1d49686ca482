"""The cluster fault batch: runs on Ray while a node is removed and a worker is SIGKILLed.

``run_fault_batch(cluster, root, ..., postgres=None)`` submits ``runs`` runs of
``tools.ray_workload`` (each alternating a ``NEVER`` and a ``SAFE`` tool) through
``polyloop.ray.run_on_ray``, with ``duplicates`` of the run ids submitted a second time right
after their first submission (so both copies are in flight at once). After ``remove_after``
outcomes it removes the worker node holding the most run-executing processes
(``remove_node(..., allow_graceful=False)``), after ``kill_after`` outcomes it SIGKILLs one
run-executing worker process on a surviving node. Then it judges the batch from the
environment's ledger and the logs on disk, never from what ``run_on_ray`` returned:

(the store is the JSONL store in ``root/store``, or the ``PostgresRunStore`` at ``postgres``)

* every run id has a stop reason: a finish record, or ``resume_state_unknown`` for a run left
  open in doubt (design 0206, ``polyloop.session.stop_reason_of``);
* no ``NEVER`` action executed twice (ledger lines per run and step);
* every executed action (ledger) appears exactly once in its run's log: as an executed step,
  or - for a run that ended ``resume_state_unknown`` - as its last, unanswered intent;
* every ``resume_state_unknown`` run has an unanswered ``NEVER`` intent;
* both faults happened while runs were in flight, and some run was executed again.

It also measures how long after the node's removal began its runs started again elsewhere:
for each run that had an attempt in a process of the removed node, the time from the start of
``remove_node`` to the run's first later attempt in another process (``remove_node`` itself
takes a while - ``removal_seconds`` - and the node's processes die during it).
Used by ``tests/integration/test_ray_engine.py`` (the acceptance test), ``tools.soak.faults``
(class ``cluster``) and ``tools.bench.ray_failover``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyloop.ports import RunStore
from polyloop.ray import RayActors, RayTasks, run_on_ray
from polyloop.session import stop_reason_of
from polyloop.types import IntentKind, ReplayPolicy, StopReason
from tools.netns import require_loopback_namespace
from tools.ray_cluster import LoopbackCluster
from tools.ray_workload import NEVER_TOOL, WorkloadTask, build_run, open_store, read_ledger

__all__ = ["FaultBatchReport", "kill_one_run_process", "run_fault_batch", "run_processes"]

RUN_PROCESS_PREFIXES = ("ray::_RunHost", "ray::_task_body")


@dataclass
class FaultBatchReport:
    runs: int
    submissions: int
    wall_s: float = 0.0
    outcome_errors: list[str] = field(default_factory=list)
    stop_reasons: Counter[str] = field(default_factory=Counter)
    unfinished: list[str] = field(default_factory=list)
    never_executed_twice: list[str] = field(default_factory=list)
    executions: int = 0
    not_logged_once: list[str] = field(default_factory=list)
    unknown_runs: list[str] = field(default_factory=list)
    unknown_without_never_intent: list[str] = field(default_factory=list)
    node_removed: bool = False
    in_flight_at_removal: int = 0
    removal_seconds: float = 0.0
    worker_killed: bool = False
    in_flight_at_kill: int = 0
    runs_executed_again: int = 0
    resume_after_node_death_s: list[float] = field(default_factory=list)

    @property
    def breaches(self) -> list[str]:
        """Every violated criterion, in words (empty when the batch passed)."""
        found = []
        if self.outcome_errors:
            found.append(f"{len(self.outcome_errors)} outcomes with an error")
        if self.unfinished:
            found.append(f"runs without a stop reason: {self.unfinished}")
        if self.never_executed_twice:
            found.append(f"NEVER actions executed twice: {self.never_executed_twice}")
        if self.not_logged_once:
            found.append(f"executed actions not in their log exactly once: {self.not_logged_once}")
        if self.unknown_without_never_intent:
            found.append(
                f"resume_state_unknown without an open NEVER intent: "
                f"{self.unknown_without_never_intent}"
            )
        if not self.node_removed or self.in_flight_at_removal == 0:
            found.append("the node was not removed while runs were in flight")
        if not self.worker_killed or self.in_flight_at_kill == 0:
            found.append("no worker process was killed while runs were in flight")
        if self.runs_executed_again == 0:
            found.append("no run was executed a second time: the faults hit nothing")
        return found

    def summary(self) -> str:
        delays = self.resume_after_node_death_s
        resumed = (
            f"{len(delays)} runs resumed after the node's death, median "
            f"{statistics.median(delays):.2f} s, max {max(delays):.2f} s"
            if delays
            else "no run of the removed node needed resuming"
        )
        return (
            f"{self.runs} runs, {self.submissions} submissions, {self.wall_s:.1f} s; stop reasons "
            f"{dict(sorted(self.stop_reasons.items()))}; {self.executions} executions; "
            f"resume_state_unknown {len(self.unknown_runs)}; executed again "
            f"{self.runs_executed_again}; in flight at removal {self.in_flight_at_removal}, at "
            f"kill {self.in_flight_at_kill}; remove_node took {self.removal_seconds:.2f} s; "
            f"{resumed}"
        )


def run_processes(cluster: LoopbackCluster, node: Any) -> list[int]:
    """The processes of ``node`` that execute runs (actors and task workers)."""
    return [
        pid
        for prefix in RUN_PROCESS_PREFIXES
        for pid in cluster.worker_pids(node, name_prefix=prefix)
    ]


async def run_fault_batch(
    cluster: LoopbackCluster,
    root: Path,
    *,
    runs: int = 40,
    duplicates: int = 5,
    engine: RayActors | RayTasks | None = None,
    remove_after: int = 6,
    kill_after: int = 16,
    actions: int = 6,
    model_latency: float = 0.05,
    tool_seconds: float = 0.02,
    max_in_flight: int = 12,
    lease_wait_seconds: float = 60.0,
    postgres: str | None = None,
) -> FaultBatchReport:
    """Run the batch on ``cluster`` (at least two worker nodes) and judge it; see the module.

    Refuses (``NotInLoopbackNamespaceError``) outside a loopback-only network namespace, like
    ``LoopbackCluster`` itself (issue 27).
    """
    require_loopback_namespace("tools.ray_faults.run_fault_batch")
    store_dir, ledger_dir = root / "store", root / "ledger"
    store_dir.mkdir(parents=True, exist_ok=True)
    ledger_dir.mkdir(parents=True, exist_ok=True)
    tasks = [
        WorkloadTask(
            run_id=f"cluster-{index}",
            store_dir=str(store_dir),
            ledger_dir=str(ledger_dir),
            actions=actions,
            model_latency=model_latency,
            tool_seconds=tool_seconds,
            postgres=postgres,
        )
        for index in range(runs)
    ]
    submissions: list[WorkloadTask] = []
    step = max(1, runs // max(1, duplicates))
    for index, task in enumerate(tasks):
        submissions.append(task)
        if index % step == 1 and index // step < duplicates:
            submissions.append(task)  # the same run id again, in flight at the same time
    report = FaultBatchReport(runs=runs, submissions=len(submissions))
    removed_pids: set[int] = set()
    removed_at: float | None = None
    began = time.monotonic()
    async for outcome in run_on_ray(
        build_run,
        submissions,
        max_in_flight=max_in_flight,
        engine=engine or RayActors(actors=2, runs_per_actor=8),
        lease_wait_seconds=lease_wait_seconds,
    ):
        if outcome.error is not None:
            report.outcome_errors.append(f"{outcome.task.run_id}: {outcome.error}")
        finished = outcome.progress.finished
        if finished == remove_after and not report.node_removed:
            victim = max(cluster.worker_nodes, key=lambda node: len(run_processes(cluster, node)))
            removed_pids = set(cluster.worker_pids(victim))
            report.in_flight_at_removal = outcome.progress.in_flight
            removed_at = time.time()
            await asyncio.to_thread(cluster.remove_worker, victim)
            report.removal_seconds = time.time() - removed_at
            report.node_removed = True
        if finished == kill_after and not report.worker_killed:
            report.in_flight_at_kill = outcome.progress.in_flight
            report.worker_killed = await kill_one_run_process(cluster)
    report.wall_s = time.monotonic() - began
    async with open_store(tasks[0]) as store:
        await _judge(report, tasks, store, ledger_dir, removed_pids, removed_at)
    return report


async def kill_one_run_process(cluster: LoopbackCluster) -> bool:
    """SIGKILL one run-executing worker process on a live worker node (waits up to 10 s for
    one to exist: a restarted actor takes a moment); ``False`` if none appeared."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for node in cluster.worker_nodes:
            pids = run_processes(cluster, node)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                return True
        await asyncio.sleep(0.1)
    return False


async def _judge(
    report: FaultBatchReport,
    tasks: list[WorkloadTask],
    store: RunStore,
    ledger_dir: Path,
    removed_pids: set[int],
    removed_at: float | None,
) -> None:
    ledger = read_ledger(ledger_dir)
    executed: dict[tuple[str, int], list[str]] = defaultdict(list)
    attempts: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for line in ledger:
        if line.kind == "exec":
            assert line.step is not None
            executed[(line.run_id, line.step)].append(line.tool)
        else:
            attempts[line.run_id].append((line.time, line.pid))
    report.executions = sum(len(tools) for tools in executed.values())
    for (run_id, step), tools in sorted(executed.items()):
        if tools.count(NEVER_TOOL) > 1:
            report.never_executed_twice.append(f"{run_id} step {step}")
    for task in tasks:
        run_id = task.run_id
        log = await store.read_log(run_id)
        reason = stop_reason_of(log, run_id)  # a run in doubt is left open (design 0206)
        if reason is None:
            report.unfinished.append(run_id)
            continue
        report.stop_reasons[reason.value] += 1
        logged_steps = Counter(c.step.step_idx for c in log.steps if c.action_outcome is not None)
        answered = {c.result_id for c in log.steps if c.result_id is not None}
        open_intents = [
            i for i in log.intents if i.kind is IntentKind.ACTION and i.result_id not in answered
        ]
        if reason is StopReason.RESUME_STATE_UNKNOWN:
            report.unknown_runs.append(run_id)
            if not any(i.replay_policy is ReplayPolicy.NEVER for i in open_intents):
                report.unknown_without_never_intent.append(run_id)
        open_steps = {i.call_index for i in open_intents}
        for (ledger_run, step), _tools in executed.items():
            if ledger_run != run_id:
                continue
            in_steps = logged_steps.get(step, 0)
            as_open_intent = step in open_steps and reason is StopReason.RESUME_STATE_UNKNOWN
            if not ((in_steps == 1 and not as_open_intent) or (in_steps == 0 and as_open_intent)):
                report.not_logged_once.append(f"{run_id} step {step}")
        pids = {pid for _, pid in attempts[run_id]}
        if len(attempts[run_id]) > 1 and len(pids) > 1:
            report.runs_executed_again += 1
        if removed_at is not None:
            on_removed = [t for t, pid in attempts[run_id] if pid in removed_pids]
            if on_removed:
                last = max(on_removed)
                later = [
                    t
                    for t, pid in attempts[run_id]
                    if pid not in removed_pids and t > max(last, removed_at)
                ]
                if later:
                    report.resume_after_node_death_s.append(min(later) - removed_at)
