"""The fault class ``cluster``: review tasks on a Ray cluster that loses a node and a worker.

``python -m tools.soak.faults --only cluster`` (``soak.sh`` runs it when Ray is installed).
A throwaway loopback cluster (a head and two one-CPU worker nodes, ``tools.ray_cluster``)
runs ``TASKS`` review tasks - three phases each, ``NEVER`` write tools, an environment-side
audit ledger per workspace - through ``run_soak``'s Ray engine (``polyloop.ray.run_on_ray``).
After ``REMOVE_AFTER`` runs have finished, the worker node holding the most run-executing
processes is removed (``remove_node(..., allow_graceful=False)``); after ``KILL_AFTER``, one
run-executing worker process on a surviving node is SIGKILLed. Runs ids are prefixed
``cluster-``; every run leaves the four files, so the scoreboard judges them afterwards.

Criteria, judged from the logs on disk and the workspaces' ledgers, never from the engine:

* ``faults_in_flight`` - the node was removed and the process killed while runs were in flight;
* ``every_run_ended`` - every run of every task reached a finish record (no engine error);
* ``some_run_resumed`` - at least one execution found its run started and unfinished (the
  engine's takeover notes, ``<runs_dir>/.takeovers``), otherwise the faults hit no run and
  verified nothing (undetermined);
* ``ledger_no_duplicates`` - no ledger holds a line twice (no ``NEVER`` write ran twice);
* ``ledger_matches_logs`` - per task, the ledger has exactly the executed writes its logs
  record, plus at most one per run that ended ``resume_state_unknown`` (its last write may or
  may not have run: that is what unknown means);
* ``unknown_has_never_intent`` - each ``resume_state_unknown`` run ends with an unanswered
  ``NEVER`` intent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from polyloop.session import stop_reason_of
from polyloop.stores import JsonlRunStore
from polyloop.types import ActionStatus, ReplayPolicy, StopReason

__all__ = ["KILL_AFTER", "REMOVE_AFTER", "TASKS", "WORST_CASE_CALLS", "run_cluster_class"]

TASKS: Final = 6
REMOVE_AFTER: Final = 4
KILL_AFTER: Final = 9
WORST_CASE_CALLS: Final = (TASKS + 2) * 61
"""Every phase of every task at its step cap (61 calls a task), plus two tasks' worth for the
runs a fault interrupts (a resumed run continues from its log; at most one call is redone)."""
_WRITE_TOOLS: Final = frozenset({"write_note", "submit_finding"})


def _tool_of(action_text: str | None) -> str | None:
    if action_text is None:
        return None
    try:
        payload = json.loads(action_text)
    except json.JSONDecodeError:
        return None
    tool = payload.get("tool") if isinstance(payload, dict) else None
    return tool if isinstance(tool, str) else None


async def run_cluster_class(
    judge: Callable[..., None],
    *,
    runs_dir: Path,
    workspace_root: Path,
    data_dir: Path,
    seed: int,
    base_url: str,
    model: str,
    out: Callable[[str], None] = print,
    cluster: Any = None,
) -> None:
    """Run the class and record its criteria through ``judge(name, ok, detail, run_id=None)``.

    ``cluster``: a connected ``LoopbackCluster`` with at least two worker nodes to use (one of
    them is removed); by default a new one is started and shut down.
    """
    # tools.ray_cluster first: it sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray loads.
    from tools.ray_cluster import LoopbackCluster
    from tools.ray_faults import kill_one_run_process, run_processes
    from tools.soak._ray_engine import TAKEOVERS_DIR, run_descriptions
    from tools.soak.review.ledger import duplicate_lines, ledger_lines
    from tools.soak.run_soak import soak_chains
    from tools.soak.scenarios import review

    tasks = review.build_tasks(seed=seed, limit=TASKS, data_dir=data_dir)
    root = workspace_root / "cluster"
    chains = soak_chains(
        {"review": review},
        {"review": tasks},
        seed=seed,
        runs_dir=runs_dir,
        workspace_root=root,
        base_url=base_url,
        model=model,
        fault="cluster",
        run_prefix="cluster-",
    )
    state: dict[str, Any] = {"removed": 0, "killed": 0, "finished": 0}
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(LoopbackCluster(workers=2))

        async def inject(outcome: Any) -> None:
            state["finished"] += 1
            if state["finished"] == REMOVE_AFTER and not state["removed"]:
                nodes = cluster.worker_nodes
                victim = max(nodes, key=lambda node: len(run_processes(cluster, node)))
                state["in_flight_at_removal"] = outcome.progress.in_flight
                await asyncio.to_thread(cluster.remove_worker, victim)
                state["removed"] = 1
            if state["finished"] == KILL_AFTER and not state["killed"]:
                state["in_flight_at_kill"] = outcome.progress.in_flight
                state["killed"] = int(await kill_one_run_process(cluster))

        outcomes = await run_descriptions(chains, max_in_flight=TASKS, on_outcome=inject)
    out(f"[cluster] {len(outcomes)} runs on Ray in {time.monotonic() - began:.1f} s")
    judge(
        "faults_in_flight",
        bool(state["removed"])
        and bool(state["killed"])
        and state.get("in_flight_at_removal", 0) > 0
        and state.get("in_flight_at_kill", 0) > 0,
        f"node removed with {state.get('in_flight_at_removal', 0)} runs in flight, worker "
        f"process killed with {state.get('in_flight_at_kill', 0)} in flight",
    )
    errors = [o for o in outcomes if o.error is not None]
    store = JsonlRunStore(directory=runs_dir)
    unfinished: list[str] = []
    resumed = 0
    unknown = 0
    unknown_without_intent: list[str] = []
    mismatched: list[str] = []
    duplicated: list[str] = []
    expected_runs = 0
    for chain in chains:
        workspace = root / review.NAME / chain[0].task.task_id
        logged_writes = 0
        unknown_here = 0
        for description in chain:
            run_id = description.run_id
            log = await store.read_log(run_id)
            if log.is_empty:
                continue  # a later phase that never started because an earlier one failed
            expected_runs += 1
            reason = stop_reason_of(log, run_id)  # a run in doubt is left open (design 0206)
            if reason is None:
                unfinished.append(run_id)
                continue
            resumed += int((runs_dir / TAKEOVERS_DIR / run_id).exists())
            for completed in log.steps:
                outcome = completed.action_outcome
                if (
                    outcome is not None
                    and outcome.status is ActionStatus.EXECUTED
                    and _tool_of(completed.step.action) in _WRITE_TOOLS
                ):
                    logged_writes += 1
            if reason is StopReason.RESUME_STATE_UNKNOWN:
                unknown += 1
                unknown_here += 1
                answered = {c.result_id for c in log.steps if c.result_id is not None}
                answered |= {r.result_id for r in log.model_results}
                open_never = [
                    i
                    for i in log.intents
                    if i.result_id not in answered and i.replay_policy is ReplayPolicy.NEVER
                ]
                if not open_never:
                    unknown_without_intent.append(run_id)
        lines = ledger_lines(workspace)
        if duplicate_lines(lines):
            duplicated.append(chain[0].task.task_id)
        if not logged_writes <= len(lines) <= logged_writes + unknown_here:
            mismatched.append(
                f"{chain[0].task.task_id}: ledger {len(lines)}, logged writes {logged_writes}, "
                f"unknown runs {unknown_here}"
            )
    judge(
        "every_run_ended",
        not unfinished and not errors and expected_runs > 0,
        f"{expected_runs} runs with a log, {len(unfinished)} without a finish record, "
        f"{len(errors)} engine errors",
    )
    judge(
        "some_run_resumed",
        True if resumed else None,
        f"{resumed} runs taken over unfinished after a fault",
    )
    judge(
        "ledger_no_duplicates",
        not duplicated,
        f"{len(chains)} ledgers, {len(duplicated)} with a repeated line",
    )
    judge(
        "ledger_matches_logs",
        not mismatched,
        "; ".join(mismatched) or f"{len(chains)} ledgers equal their logs' executed writes",
    )
    judge(
        "unknown_has_never_intent",
        not unknown_without_intent,
        f"{unknown} runs ended resume_state_unknown, {len(unknown_without_intent)} of them "
        "without an unanswered NEVER intent",
    )
