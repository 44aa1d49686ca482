"""``python -m tools.soak.faults``: nine classes of injected faults, each with its own criteria.

::

    python -m tools.soak.faults --runs-dir PATH --budget-calls N [--seed N] \\
        [--workspace-root PATH] [--data-dir PATH] [--only CLASS ...] [--allow-undetermined]

Every class drives real runs through the real library, the real gateway adapter and the
loopback policy server (always the built-in one: several faults are triggered through its
hooks), writes the same four per-run files as the normal load (``meta.fault`` names the
class; run ids are prefixed with it), and judges its own criteria with the three-valued
verdict. The criteria are separate from the scoreboard's checks, which ``soak.sh`` runs over
the same directory afterwards (with ``--allow-undetermined``: crashed and cancelled runs
naturally lack some sidecars, and no fake file is ever written to make them look complete).

=================  ========  ==============================================================
class              scenario  what is injected, and what must hold
=================  ========  ==============================================================
``crash_a``        review*   a child process exits (``os._exit``) right after a step record
                             landed; resume continues, every pre-crash byte is unchanged,
                             the environment ledger has no duplicate line, and the meta's
                             ``resumed_from_step`` equals the step records that begin before
                             the pre-crash file size (counted from the bytes)
``crash_b``        review*   a child exits after a ``NEVER`` action ran (the ledger grew) but
                             before its step record; resume stops with
                             ``resume_state_unknown``, adds no ledger line and appends no
                             record (the run stays open, in doubt; design 0206)
``cancel_model``   code      the task is cancelled while its model call is in flight;
                             ``CancelledError`` propagates, the finish says ``cancelled``,
                             the call's connection is released, the lease is returned
``cancel_env``     code      cancelled while the worker executes the action; the lease is
                             returned, the interrupted worker is restarted, the pool serves
``step_budget``    code      a goal the agent never completes, ``max_actions`` one above
                             ``max_steps``: stops on the step budget at exactly the cap, and
                             every step was an action
``action_budget``  code      the same with ``max_steps`` one above ``max_actions``: stops on
                             the action budget at its cap, in fewer steps than ``max_steps``
``parse_storm``    code      a parser that rejects everything: ``parse_failures`` after the
                             limit, and the environment never executed anything
``prompt_limit``   review*   ``max_prompt_chars`` computed from the run's own context so the
                             first prompt fits and the second cannot: ``prompt_too_large``,
                             nothing written for the refused step, and step 0 sent the initial
                             context whole (not trimmed to fit the limit)
``env_fault``      code      after one step the worker process is really killed (``SIGKILL``,
                             own pool): ``env_error``, the synthetic ``env_failed``
                             observation, earlier steps untouched, the worker restarted
=================  ========  ==============================================================

``cluster`` (named with ``--only cluster``, needs Ray; ``soak.sh`` runs it when Ray is
installed): review tasks on a loopback Ray cluster of a head and two worker nodes while one
worker node is removed (``allow_graceful=False``) and one run-executing worker process is
SIGKILLed; every run ends, no ledger line repeats, each ledger equals its logs' executed
writes (plus at most one per ``resume_state_unknown`` run), and each such run ends on an
unanswered ``NEVER`` intent. See ``tools/soak/_cluster_fault.py``.

\\* The review scenario has an environment-side ledger that survives the process and a
document read that grows the prompt a lot in one step; the code scenario is used instead when
``tools/soak/scenarios/review.py`` is absent.

A batch in which every class runs to its end judges 60 criteria: ``crash_a`` 8, ``crash_b``
10, ``cancel_model`` 7, ``cancel_env`` 8, ``step_budget``, ``action_budget`` and
``parse_storm`` 5 each, ``prompt_limit`` and ``env_fault`` 6 each. A class that cannot go on
(its crash did not happen, its run raised) stops judging there, with that criterion saying
why.

**Crash mechanism.** Signalling a process from outside almost never lands between a step
record and the next intent (the library writes the intent right after the step, with only
in-memory work between). So the child wraps its store: after (crash A) or before (crash B)
``write_step_completed``, when the condition holds, it calls ``os._exit`` - no ``finally``, no
``atexit``, no flush, the same disk effect as ``SIGKILL``. The condition includes "the
ledger is not empty" (a required argument: no call site can skip it). The wrapper's
``parameters()`` are the inner store's, unchanged: the parent resumes with a plain store, and
an extra key would be a false ``ParameterDriftError``. A child that does not exit within its
timeout is killed from outside and the class is undetermined.

**Budget.** Before each class the remaining ``--budget-calls`` must cover the class's worst
case, or the class is skipped and reported undetermined. Calls are counted from the logs
(model-call intents) after each class. The guard is not a model-client wrapper: raising there
would become a failed model call - an injected fault of its own.

**Verdicts.** A class is breached when any of its criteria is; otherwise it passes only when
every criterion passed, and a class without a single passed criterion (skipped for budget,
say) is undetermined at best: it verified nothing.

Exit status (as the scoreboard's): 0 every class passed; 1 any criterion breached; 3 nothing
breached but some class undetermined (0 with ``--allow-undetermined``, which ``soak.sh`` does
not pass: a fault step that verified nothing must not look green); 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import httpx

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import (
    DecisionParser,
    Event,
    InvalidDecision,
    ParsedReply,
    RunLog,
    RunStore,
)
from polyloop.session import stop_reason_of
from polyloop.stores import JsonlRunStore
from polyloop.types import (
    ActionStatus,
    Budget,
    Intent,
    IntentKind,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    RunFinished,
    RunStarted,
    StepCompleted,
    StopReason,
)
from tools.soak._artifacts import (
    CLUSTER_FAULT_CLASSES,
    FAULT_CLASSES,
    LOG_SUFFIX,
    META_SUFFIX,
    run_ids_in,
)
from tools.soak._config import absolute_path
from tools.soak._verdict import Evidence, Verdict, combine
from tools.soak.codeworld.client import WorkerSession
from tools.soak.codeworld.pool import WorkerPool
from tools.soak.policy_server import DEFAULT_MODEL, PolicyServer
from tools.soak.run_soak import (
    SAMPLING,
    BudgetGuard,
    execute_run,
    initial_prompt_chars,
    load_scenario,
)
from tools.soak.scenarios.base import PolicyRequest, RunOutcome, RunSpec, ScenarioEnv, encode_user

__all__ = [
    "CRASH_EXIT_CODE",
    "EXIT_BREACHED",
    "EXIT_PASSED",
    "EXIT_UNDETERMINED",
    "EXIT_USAGE",
    "FAULT_CLASSES",
    "PROMPT_MARGIN",
    "WORST_CASE_CALLS",
    "ClassReport",
    "CrashingStore",
    "Criterion",
    "main",
]

CRASH_EXIT_CODE: Final = 86
"""The child's exit status when it crashed itself at the intended point."""
EXIT_PASSED: Final = 0
EXIT_BREACHED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNDETERMINED: Final = 3
PROMPT_MARGIN: Final = 16
"""``max_prompt_chars`` = the run's initial prompt + this. The first prompt always fits; any
step adds at least its reply and a rendered observation - for both scenarios far more than 16
characters (a fenced block or a JSON tool call, plus the observation template) - so the second
prompt cannot fit. The criteria verify both halves instead of trusting this arithmetic."""
WORST_CASE_CALLS: Final[Mapping[str, int]] = {
    "crash_a": 2 * 61,
    "crash_b": 2 * 61,
    "cancel_model": 2,
    "cancel_env": 1,
    "step_budget": 4,
    "action_budget": 4,
    "parse_storm": 3,
    "prompt_limit": 1,
    "env_fault": 2,
    "cluster": 8 * 61,  # tools.soak._cluster_fault.WORST_CASE_CALLS (a test keeps them equal)
}
"""Most model calls a class can make (crash classes: both processes, all three phases)."""
_CHILD_TIMEOUT: Final = 120.0
_SKIPPED: Final = "skipped: the fault class ends the task here"
_STEP_BUDGET: Final = Budget(
    max_steps=4, max_actions=5, max_consecutive_parse_failures=3, max_prompt_chars=400_000
)
"""``max_actions`` one above ``max_steps``: the action cap is one action away when the step cap
stops the run, so a step count that ran one over would end on ``action_budget`` instead."""
_ACTION_BUDGET: Final = Budget(
    max_steps=4, max_actions=3, max_consecutive_parse_failures=3, max_prompt_chars=400_000
)
"""``max_steps`` one above ``max_actions``, for the same reason the other way round."""


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True, kw_only=True)
class Criterion:
    """One criterion of one class, with its verdict and the evidence it rests on."""

    name: str
    verdict: Verdict
    evidence: Evidence


@dataclass(slots=True, kw_only=True)
class ClassReport:
    name: str
    scenario: str
    criteria: list[Criterion] = field(default_factory=list)
    calls: int = 0

    @property
    def verdict(self) -> Verdict:
        """Breached if any criterion is; passed only if there are criteria and all passed;
        otherwise undetermined - a class without criteria, or with only undetermined ones,
        passed nothing and so verified nothing (``combine`` of nothing is undetermined)."""
        return combine(c.verdict for c in self.criteria)

    def judge(self, name: str, ok: bool | None, detail: str, run_id: str | None = None) -> None:
        """Record a criterion: ``ok`` True passes, False breaches, None is undetermined."""
        verdict = Verdict.UNDETERMINED if ok is None else Verdict.PASSED if ok else Verdict.BREACHED
        self.criteria.append(
            Criterion(
                name=name,
                verdict=verdict,
                evidence=Evidence(run_id=run_id, where="", detail=detail),
            )
        )


# --------------------------------------------------------------------------- crash store


class CrashingStore:
    """A ``RunStore`` wrapper that ends the process at a chosen write (see the module docs).

    ``mode`` ``"a"``: after a ``StepCompleted`` of an executed, non-completing action that is
    not the last allowed step. ``mode`` ``"b"``: instead of writing the ``StepCompleted`` of
    an action whose intent was ``NEVER`` and during which the ledger grew. Both also require
    ``ledger_count() > 0``.

    Unleased on purpose (``offers_leases = False``): a leased run writes through its lease,
    which would bypass the crash points here; the crash classes start one process per run id
    at a time, so no second resumer can race.
    """

    offers_leases = False

    def __init__(
        self,
        inner: RunStore,
        *,
        mode: str,
        ledger_count: Callable[[], int],
        completing_tools: frozenset[str],
    ) -> None:
        if mode not in ("a", "b"):
            raise ValueError(f"CrashingStore mode must be 'a' or 'b', got {mode!r}")
        self._inner = inner
        self._mode = mode
        self._ledger_count = ledger_count
        self._completing = completing_tools
        self._max_steps: dict[str, int] = {}
        self._last_action: dict[str, tuple[ReplayPolicy, int]] = {}

    def parameters(self) -> Mapping[str, str]:
        return self._inner.parameters()

    async def write_run_started(self, record: RunStarted) -> None:
        self._max_steps[record.run_id] = int(record.parameter_snapshot["request.max_steps"])
        await self._inner.write_run_started(record)

    async def write_intent(self, record: Intent) -> None:
        if record.kind is IntentKind.ACTION:
            self._last_action[record.run_id] = (record.replay_policy, self._ledger_count())
        await self._inner.write_intent(record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await self._inner.write_model_call_result(record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        ledger = self._ledger_count()
        if self._mode == "b" and record.action_outcome is not None:
            policy, ledger_at_intent = self._last_action[record.run_id]
            if policy is ReplayPolicy.NEVER and ledger > ledger_at_intent and ledger > 0:
                os._exit(CRASH_EXIT_CODE)
        await self._inner.write_step_completed(record)
        if self._mode == "a" and ledger > 0 and self._is_point_a(record):
            os._exit(CRASH_EXIT_CODE)

    def _is_point_a(self, record: StepCompleted) -> bool:
        outcome, step = record.action_outcome, record.step
        if outcome is None or outcome.status is not ActionStatus.EXECUTED:
            return False
        if outcome.env_reported_completion or _tool_of(step.action or "") in self._completing:
            return False
        return step.step_idx + 1 < self._max_steps.get(record.run_id, 0)

    async def write_run_finished(self, record: RunFinished) -> None:
        await self._inner.write_run_finished(record)

    async def read_log(self, run_id: str) -> RunLog:
        return await self._inner.read_log(run_id)


def _tool_of(action_text: str) -> str | None:
    try:
        payload = json.loads(action_text)
    except json.JSONDecodeError:
        return None
    tool = payload.get("tool") if isinstance(payload, dict) else None
    return tool if isinstance(tool, str) else None


class _RejectEverything:
    """A parser that turns every reply into an ``InvalidDecision`` (the parse storm)."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        return ParsedReply(
            history_text=reply.content,
            decision=InvalidDecision(
                explanation="[soak fault] this reply was rejected on purpose; try again"
            ),
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "soak_reject_everything"}


# --------------------------------------------------------------------------- run plumbing


@dataclass(slots=True, kw_only=True)
class _Plan:
    """How one class runs a task: persona, overrides, and which runs to execute."""

    fault: str
    scenario: str
    persona: str
    budget: Budget | None = None
    parser: DecisionParser | None = None
    prompt_margin: int | None = None
    first_run_only: bool = False
    resume_run: bool = False
    stop_after_run: str | None = None
    store_factory: Callable[[], RunStore] | None = None
    event_hook: Callable[[Event], Awaitable[None]] | None = None
    executed: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)


class _Target:
    """One task of one scenario, run either whole (``run_task``) or phase by phase."""

    def __init__(self, module: ModuleType, task: Any) -> None:
        self.module = module
        self.task = task
        self.scenario: str = module.NAME

    def workspace(self, env: ScenarioEnv) -> Path:
        path: Path = self.module.workspace_for(env, self.task)
        return path

    def ledger(self, env: ScenarioEnv) -> list[str]:
        lines: list[str] = self.module.ledger_lines(self.workspace(env))
        return lines

    async def run(self, env: ScenarioEnv) -> list[RunOutcome]:
        if self.scenario != "review":
            outcomes: list[RunOutcome] = await self.module.run_task(self.task, env)
            return outcomes
        # Phase by phase rather than run_task: a resumed task's workspace is not empty, and
        # run_task rightly refuses a used workspace.
        workspace = self.workspace(env)
        workspace.mkdir(parents=True, exist_ok=True)
        results = []
        for phase in self.module.PHASES:
            spec = self.module.build_run_spec(
                task=self.task,
                phase=phase,
                workspace=workspace,
                model_binding=env.binding_for(self.task.task_id, phase),
            )
            outcome = await env.execute_run(spec)
            results.append(outcome)
            if outcome.error is not None:
                break
        return results


def _fault_env(
    plan: _Plan,
    *,
    runs_dir: Path,
    workspace_root: Path,
    guard: BudgetGuard,
    seed: int,
    extra: Mapping[str, Any],
) -> ScenarioEnv:
    async def execute(spec: RunSpec) -> RunOutcome:
        request = spec.request
        run_id = f"{plan.fault}-{request.run_id}"
        if (plan.first_run_only and plan.executed) or (
            plan.stop_after_run is not None and plan.stop_after_run in plan.executed
        ):
            return RunOutcome(
                run_id=run_id,
                scenario=plan.scenario,
                task_id=spec.task_id,
                phase=spec.phase,
                stop_reason=None,
                steps=0,
                model_calls=0,
                wall_ms=0,
                error=_SKIPPED,
            )
        budget = request.budget if plan.budget is None else plan.budget
        if plan.prompt_margin is not None:
            limit = initial_prompt_chars(request) + plan.prompt_margin
            plan.limits[run_id] = limit
            budget = dataclasses.replace(budget, max_prompt_chars=limit)
        spec = dataclasses.replace(
            spec,
            request=dataclasses.replace(request, run_id=run_id, budget=budget),
            decision_parser=spec.decision_parser if plan.parser is None else plan.parser,
        )
        plan.executed.append(run_id)
        return await execute_run(
            spec,
            runs_dir=runs_dir,
            model_client=guard,
            calls_for=guard.calls_for,
            scenario=plan.scenario,
            fault=plan.fault,
            store=None if plan.store_factory is None else plan.store_factory(),
            resume_run=plan.resume_run,
            event_hook=plan.event_hook,
        )

    def binding(task_id: str, phase: str | None) -> Mapping[str, str]:
        user = encode_user(
            scenario=plan.scenario, task_id=task_id, phase=phase, persona=plan.persona, seed=seed
        )
        return {"gateway.user": user}

    return ScenarioEnv(
        runs_dir=runs_dir,
        workspace_root=workspace_root / plan.fault,
        model_client=guard,
        execute_run=execute,
        binding_for=binding,
        extra=dict(extra),
    )


@dataclass(slots=True)
class _LogView:
    """A run's log as raw bytes and decoded records (the store's own reader decodes)."""

    raw: bytes
    log: RunLog
    tags: list[str]
    run_id: str

    @property
    def stop_reason(self) -> StopReason | None:
        """How the run stands: its finish, or ``resume_state_unknown`` for a run left open in
        doubt (design 0206), or ``None``."""
        return stop_reason_of(self.log, self.run_id)

    @property
    def complete(self) -> bytes:
        return self.raw[: self.raw.rfind(b"\n") + 1]


async def _view(runs_dir: Path, run_id: str) -> _LogView:
    path = runs_dir / f"{run_id}{LOG_SUFFIX}"
    raw = path.read_bytes() if path.exists() else b""
    tags = [json.loads(line)["record"] for line in raw.split(b"\n")[:-1] if line.strip()]
    return _LogView(
        raw=raw,
        log=await JsonlRunStore(directory=runs_dir).read_log(run_id),
        tags=tags,
        run_id=run_id,
    )


def _meta(runs_dir: Path, run_id: str) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(
            (runs_dir / f"{run_id}{META_SUFFIX}").read_text(encoding="utf-8")
        )
    except FileNotFoundError:
        return None
    return loaded


def _model_intents(runs_dir: Path, prefix: str) -> int:
    total = 0
    for run_id in run_ids_in(runs_dir):
        if run_id.startswith(prefix):
            raw = (runs_dir / f"{run_id}{LOG_SUFFIX}").read_bytes()
            total += raw.count(b'"kind": "model_call"')
    return total


def _step_records_before(raw: bytes, boundary: int) -> int:
    """How many ``step_completed`` lines of ``raw`` begin before byte ``boundary`` (read from
    the bytes and the record tags alone, without the store's reader)."""
    count = 0
    offset = 0
    for line in raw.split(b"\n")[:-1]:
        if offset >= boundary:
            break
        if line.strip() and json.loads(line).get("record") == "step_completed":
            count += 1
        offset += len(line) + 1
    return count


def _dangling_last_intent(log: RunLog) -> Intent | None:
    """The last intent, if nothing answered it (no result and no step with its id)."""
    if not log.intents:
        return None
    last = log.intents[-1]
    answered = {r.result_id for r in log.model_results} | {
        s.result_id for s in log.steps if s.result_id is not None
    }
    return None if last.result_id in answered else last


# --------------------------------------------------------------------------- the harness


class _Harness:
    def __init__(
        self,
        *,
        runs_dir: Path,
        workspace_root: Path,
        data_dir: Path,
        seed: int,
        server: PolicyServer,
        http: httpx.AsyncClient,
        pool: WorkerPool,
        worker_http: httpx.AsyncClient,
    ) -> None:
        self.runs_dir = runs_dir
        self.workspace_root = workspace_root
        self.data_dir = data_dir
        self.seed = seed
        self.server = server
        self.http = http
        self.pool = pool
        self.worker_http = worker_http
        self.code = load_scenario("code")
        try:
            self.review: ModuleType | None = load_scenario("review")
        except LookupError:
            self.review = None
        self._tasks: dict[tuple[str, int], Any] = {}

    # ---------------------------------------------------------------- helpers

    @property
    def ledger_scenario(self) -> ModuleType:
        """The scenario for the crash and prompt-limit classes (review when it exists)."""
        return self.review if self.review is not None else self.code

    def task(self, module: ModuleType, index: int) -> Any:
        """Task ``index`` of ``module`` (a smaller ``limit`` gives a prefix of the task list)."""
        key = (module.NAME, index)
        if key not in self._tasks:
            tasks = module.build_tasks(seed=self.seed, limit=index + 1, data_dir=self.data_dir)
            self._tasks[key] = tasks[index]
        return self._tasks[key]

    def guard(self) -> BudgetGuard:
        gateway = GatewayModelClient(
            client=self.http,
            settings=GatewaySettings(
                base_url=self.server.base_url, model=DEFAULT_MODEL, sampling=SAMPLING
            ),
        )
        return BudgetGuard(inner=gateway, limit=1_000_000)

    def env(self, plan: _Plan, guard: BudgetGuard, **extra: Any) -> ScenarioEnv:
        base = {"code_pool": self.pool, "code_http": self.worker_http}
        base.update(extra)
        return _fault_env(
            plan,
            runs_dir=self.runs_dir,
            workspace_root=self.workspace_root,
            guard=guard,
            seed=self.seed,
            extra=base,
        )

    # ---------------------------------------------------------------- crash A / B

    async def crash(self, report: ClassReport, mode: str) -> None:
        module = self.ledger_scenario
        index = 0 if mode == "a" else 1
        target = _Target(module, self.task(module, index))
        plan = _Plan(fault=report.name, scenario=target.scenario, persona="competent")
        env = self.env(plan, self.guard())
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tools.soak.faults",
            "--child",
            report.name,
            "--child-base-url",
            self.server.base_url,
            "--child-scenario",
            target.scenario,
            "--child-task-index",
            str(index),
            "--runs-dir",
            str(self.runs_dir),
            "--workspace-root",
            str(self.workspace_root),
            "--data-dir",
            str(self.data_dir),
            "--seed",
            str(self.seed),
            "--budget-calls",
            "1",
            stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            code = await asyncio.wait_for(child.wait(), _CHILD_TIMEOUT)
        except TimeoutError:
            child.kill()
            await child.wait()
            report.judge(
                "crashed_at_point", None, f"the child ran over {_CHILD_TIMEOUT:g} s and was killed"
            )
            return
        if code == 0:
            report.judge(
                "crashed_at_point", None, "the child finished without the crash condition holding"
            )
            return
        if code != CRASH_EXIT_CODE:
            report.judge(
                "crashed_at_point", False, f"the child died with exit status {code}, not the crash"
            )
            return
        report.judge(
            "crashed_at_point", True, f"the child exited with status {code} at the crash point"
        )
        unfinished = [
            run_id
            for run_id in run_ids_in(self.runs_dir)
            if run_id.startswith(f"{report.name}-")
            and (await _view(self.runs_dir, run_id)).log.finished is None
        ]
        if len(unfinished) != 1:
            report.judge(
                "one_run_interrupted", False, f"{len(unfinished)} unfinished runs after the crash"
            )
            return
        run_id = unfinished[0]
        before = await _view(self.runs_dir, run_id)
        ledger_before = target.ledger(env)
        steps_at_crash = len(before.log.steps)
        report.judge(
            "ledger_nonempty_at_crash",
            len(ledger_before) > 0,
            f"{len(ledger_before)} ledger lines when the child died",
            run_id,
        )
        if mode == "a":
            shape = (
                before.tags[-1:] == ["step_completed"]
                and bool(before.log.steps)
                and (before.log.steps[-1].action_outcome is not None)
            )
            report.judge(
                "crash_after_step_record",
                shape,
                f"the log ends with {before.tags[-1] if before.tags else 'nothing'} "
                f"after {steps_at_crash} steps",
                run_id,
            )
        else:
            last = before.log.intents[-1] if before.log.intents else None
            shape = (
                before.tags[-1:] == ["intent"]
                and last is not None
                and last.kind is IntentKind.ACTION
                and last.replay_policy is ReplayPolicy.NEVER
            )
            report.judge(
                "crash_on_never_intent",
                shape,
                f"the log ends with {before.tags[-1] if before.tags else 'nothing'} (an action "
                f"intent with policy never expected) after {steps_at_crash} steps",
                run_id,
            )
        plan.resume_run = True
        plan.stop_after_run = run_id
        resumed = await target.run(self.env(plan, self.guard()))
        after = await _view(self.runs_dir, run_id)
        ledger_after = target.ledger(env)
        outcome = next((o for o in resumed if o.run_id == run_id), None)
        reason = after.stop_reason
        report.judge(
            "pre_crash_bytes_unchanged",
            after.raw.startswith(before.complete),
            f"{len(before.complete)} bytes before the crash, {len(after.raw)} after resume",
            run_id,
        )
        report.judge(
            "ledger_append_only",
            ledger_after[: len(ledger_before)] == ledger_before,
            f"{len(ledger_before)} ledger lines at the crash, {len(ledger_after)} after",
            run_id,
        )
        report.judge(
            "no_double_execution",
            len(set(ledger_after)) == len(ledger_after),
            f"{len(ledger_after)} ledger lines, {len(set(ledger_after))} distinct",
            run_id,
        )
        # Re-derived from the bytes, not from what the harness itself counted: the records the
        # resuming process wrote start at the pre-crash size of the file, so the step records
        # that begin before that offset are the ones it took over.
        meta = _meta(self.runs_dir, run_id)
        boundary = len(before.complete)
        taken_over = _step_records_before(after.raw, boundary)
        recorded = None if meta is None else meta["resumed_from_step"]
        report.judge(
            "resumed_from_step_recorded",
            recorded is not None and recorded == taken_over,
            f"meta resumed_from_step {recorded}; {taken_over} step records begin before byte "
            f"{boundary}, where the resuming process's records begin",
            run_id,
        )
        if outcome is None or outcome.error is not None:
            report.judge("resume_completed", False, "the resume raised (see the log above)", run_id)
            return
        if mode == "a":
            new_steps = len(after.log.steps) - steps_at_crash
            report.judge(
                "resume_continued",
                new_steps >= 1 and reason is not StopReason.RESUME_STATE_UNKNOWN,
                f"{new_steps} new steps after the crash, stop reason "
                f"{None if reason is None else reason.value}",
                run_id,
            )
        else:
            report.judge(
                "stopped_state_unknown",
                reason is StopReason.RESUME_STATE_UNKNOWN,
                f"stop reason {None if reason is None else reason.value}",
                run_id,
            )
            report.judge(
                "no_extra_ledger_line",
                ledger_after == ledger_before,
                f"{len(ledger_before)} ledger lines at the crash, {len(ledger_after)} after resume",
                run_id,
            )
            added = after.tags[len(before.tags) :]
            report.judge(
                "nothing_appended",
                added == ["resume_stopped"],
                f"resume appended {len(added)} records ({', '.join(added) or 'none'}); a run "
                "in doubt is left open to be settled (design 0206): nothing but the resume's "
                "own mark, one resume_stopped record (design 0231)",
                run_id,
            )

    # ---------------------------------------------------------------- cancellation

    async def cancel_model(self, report: ClassReport) -> None:
        task = self.task(self.code, 2)
        plan = _Plan(fault=report.name, scenario="code", persona="competent")
        prefix = len(self.code.RUN_LEVEL) + 1

        def held(request: PolicyRequest) -> bool:
            return request.task_id == task.task_id and len(request.messages) > prefix

        self.server.delay_override = lambda r: 600.0 if held(r) else None
        abandoned = self.server.abandoned
        try:
            unit = asyncio.ensure_future(self.code.run_task(task, self.env(plan, self.guard())))
            await asyncio.wait_for(self.server.wait_for_request(held), 30)
            await asyncio.sleep(0.05)
            unit.cancel()
            cancelled = await _cancelled(unit)
        finally:
            self.server.delay_override = None
        run_id = plan.executed[0]
        _judge_cancellation_propagated(report, cancelled, run_id)
        view = await _view(self.runs_dir, run_id)
        self._judge_cancelled_log(report, view, run_id, IntentKind.MODEL_CALL)
        await _eventually(lambda: self.server.abandoned > abandoned, seconds=5.0)
        report.judge(
            "connection_released",
            self.server.abandoned > abandoned,
            f"the server saw {self.server.abandoned - abandoned} abandoned requests",
            run_id,
        )
        await self._judge_pool(report, run_id, restarted=False)

    async def cancel_env(self, report: ClassReport) -> None:
        task = self.task(self.code, 3)
        plan = _Plan(fault=report.name, scenario="code", persona="competent")
        restarts = self.pool.restarts
        slow = "```python\nimport time\nprint('working')\ntime.sleep(600)\n```"
        self.server.reply_override = lambda r: slow if r.task_id == task.task_id else None
        try:
            unit = asyncio.ensure_future(self.code.run_task(task, self.env(plan, self.guard())))
            while not plan.executed or not await _has_action_intent(
                self.runs_dir, plan.executed[0]
            ):
                if unit.done():
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            unit.cancel()
            cancelled = await _cancelled(unit)
        finally:
            self.server.reply_override = None
        run_id = plan.executed[0]
        _judge_cancellation_propagated(report, cancelled, run_id)
        report.judge(
            "lease_returned",
            self.pool.leased == 0,
            f"{self.pool.leased} leases out right after the cancellation",
            run_id,
        )
        view = await _view(self.runs_dir, run_id)
        self._judge_cancelled_log(report, view, run_id, IntentKind.ACTION)
        await self._judge_pool(report, run_id, restarted=True, restarts_before=restarts)

    def _judge_cancelled_log(
        self, report: ClassReport, view: _LogView, run_id: str, kind: IntentKind
    ) -> None:
        reason = view.stop_reason
        report.judge(
            "finished_cancelled",
            reason is StopReason.CANCELLED,
            f"finish record stop reason {None if reason is None else reason.value}",
            run_id,
        )
        dangling = _dangling_last_intent(view.log)
        report.judge(
            f"{kind.value}_in_flight",
            dangling is not None
            and dangling.kind is kind
            and view.tags[-2:] == ["intent", "run_finished"],
            f"the last intent is {'unanswered' if dangling else 'answered'} "
            f"({'-' if dangling is None else dangling.kind.value}) and the log ends "
            f"{', '.join(view.tags[-2:])}",
            run_id,
        )
        meta = _meta(self.runs_dir, run_id)
        report.judge(
            "meta_written",
            meta is not None and meta["fault"] == report.name,
            "the .meta.json exists and names the fault class" if meta else "no .meta.json",
            run_id,
        )

    async def _judge_pool(
        self, report: ClassReport, run_id: str, *, restarted: bool, restarts_before: int = 0
    ) -> None:
        await self.pool.settled()
        ready = self.pool.available == self.pool.size and self.pool.leased == 0
        report.judge(
            "pool_whole",
            ready,
            f"{self.pool.available} of {self.pool.size} workers free, {self.pool.leased} leased",
            run_id,
        )
        if restarted:
            count = self.pool.restarts - restarts_before
            report.judge(
                "worker_restarted",
                count >= 1,
                f"{count} workers restarted after the interrupted execution",
                run_id,
            )
        answer = await _probe(self.pool, self.worker_http)
        report.judge(
            "pool_serves_again",
            answer == "42\n",
            f"a probe execution printed {len(answer)} chars",
            run_id,
        )

    # ---------------------------------------------------------------- budgets and parsing

    async def budget(self, report: ClassReport, which: str) -> None:
        task = self.task(self.code, 4 if which == "step" else 5)
        budget = _STEP_BUDGET if which == "step" else _ACTION_BUDGET
        plan = _Plan(fault=report.name, scenario="code", persona="stubborn", budget=budget)
        env = self.env(plan, self.guard())
        outcomes = await self.code.run_task(task, env)
        run_id = outcomes[0].run_id
        view = await _view(self.runs_dir, run_id)
        reason = view.stop_reason
        steps = len(view.log.steps)
        actions = sum(1 for s in view.log.steps if s.action_outcome is not None)
        ledger = len(self.code.ledger_lines(self.code.workspace_for(env, task)))
        expected = StopReason.STEP_BUDGET if which == "step" else StopReason.ACTION_BUDGET
        report.judge(
            "stop_reason",
            reason is expected,
            f"stop reason {None if reason is None else reason.value}",
            run_id,
        )
        if which == "step":
            report.judge(
                "steps_at_cap",
                steps == budget.max_steps,
                f"{steps} steps, max_steps {budget.max_steps}",
                run_id,
            )
            # Every step acted, so the run spent its whole step budget on actions and the step
            # cap - with the action cap one action away - is what ended it. A parse failure or
            # a failed call on any step breaks this.
            report.judge(
                "every_step_an_action",
                actions == steps,
                f"{actions} actions in {steps} steps, max_actions {budget.max_actions}",
                run_id,
            )
        else:
            report.judge(
                "actions_at_cap",
                actions == budget.max_actions,
                f"{actions} actions, max_actions {budget.max_actions}",
                run_id,
            )
            report.judge(
                "steps_below_cap",
                steps < budget.max_steps,
                f"{steps} steps, max_steps {budget.max_steps}",
                run_id,
            )
        calls = sum(1 for i in view.log.intents if i.kind is IntentKind.MODEL_CALL)
        report.judge(
            "one_call_per_step", calls == steps, f"{calls} model calls for {steps} steps", run_id
        )
        report.judge(
            "environment_agrees",
            ledger == actions,
            f"the environment executed {ledger} actions, the log holds {actions}",
            run_id,
        )

    async def parse_storm(self, report: ClassReport) -> None:
        task = self.task(self.code, 6)
        plan = _Plan(
            fault=report.name, scenario="code", persona="competent", parser=_RejectEverything()
        )
        env = self.env(plan, self.guard())
        outcomes = await self.code.run_task(task, env)
        run_id = outcomes[0].run_id
        view = await _view(self.runs_dir, run_id)
        reason = view.stop_reason
        steps = view.log.steps
        limit = self.code.BUDGET.max_consecutive_parse_failures
        report.judge(
            "stop_reason",
            reason is StopReason.PARSE_FAILURES,
            f"stop reason {None if reason is None else reason.value}",
            run_id,
        )
        report.judge(
            "steps_at_limit", len(steps) == limit, f"{len(steps)} steps, limit {limit}", run_id
        )
        rejected = sum(1 for s in steps if not s.step.parse_ok and s.step.action is None)
        report.judge(
            "every_step_rejected",
            rejected == len(steps),
            f"{rejected} of {len(steps)} steps rejected",
            run_id,
        )
        actions = sum(1 for i in view.log.intents if i.kind is IntentKind.ACTION)
        report.judge(
            "no_action_intent", actions == 0, f"{actions} action intents in the log", run_id
        )
        ledger = len(self.code.ledger_lines(self.code.workspace_for(env, task)))
        meta = _meta(self.runs_dir, run_id)
        executions = None if meta is None else meta["env_executions"]
        report.judge(
            "environment_untouched",
            ledger == 0 and executions == 0,
            f"{ledger} ledger lines, meta env_executions {executions}",
            run_id,
        )

    # ---------------------------------------------------------------- prompt limit

    async def prompt_limit(self, report: ClassReport) -> None:
        module = self.ledger_scenario
        target = _Target(module, self.task(module, 2))
        plan = _Plan(
            fault=report.name,
            scenario=target.scenario,
            persona="competent",
            prompt_margin=PROMPT_MARGIN,
            first_run_only=True,
        )
        env = self.env(plan, self.guard())
        await target.run(env)
        run_id = plan.executed[0]
        limit = plan.limits[run_id]
        view = await _view(self.runs_dir, run_id)
        reason = view.stop_reason
        report.judge(
            "stop_reason",
            reason is StopReason.PROMPT_TOO_LARGE,
            f"stop reason {None if reason is None else reason.value} (limit {limit} chars)",
            run_id,
        )
        steps = [s.step for s in view.log.steps]
        if not steps:
            report.judge(
                "at_least_one_step",
                None,
                "no step: the initial context was already over the limit (the limit was "
                "chosen too small, nothing about growth was verified)",
                run_id,
            )
            return
        report.judge("at_least_one_step", True, f"{len(steps)} steps before the stop", run_id)
        last = steps[-1]
        report.judge(
            "last_prompt_within_limit",
            last.prompt_chars <= limit,
            f"step {last.step_idx} sent {last.prompt_chars} chars, limit {limit}",
            run_id,
        )
        started = view.log.started
        assert started is not None
        template = started.parameter_snapshot["request.observation_template"]
        next_size = (
            last.prompt_chars
            + len(last.raw_output)
            + len(template.format(observation=last.observation))
        )
        report.judge(
            "next_prompt_over_limit",
            next_size > limit,
            f"the next prompt would be {next_size} chars, limit {limit}",
            run_id,
        )
        report.judge(
            "nothing_written_for_refused_step",
            view.tags[-2:] == ["step_completed", "run_finished"],
            f"the log ends {', '.join(view.tags[-2:])}",
            run_id,
        )
        # What this proves, and no more: the library sent the initial context whole on step
        # 0 - it did not trim it to make room under the limit, and added nothing to it. Later
        # prompts are never cut either; that is the scoreboard's prompt_chars_monotonic, which
        # needs two steps (this run has one by design).
        context = limit - PROMPT_MARGIN
        report.judge(
            "initial_context_intact",
            steps[0].prompt_chars == context,
            f"step 0 sent {steps[0].prompt_chars} chars, the initial context has {context}",
            run_id,
        )

    # ---------------------------------------------------------------- environment fault

    async def env_fault(self, report: ClassReport) -> None:
        task = self.task(self.code, 7)
        killed: dict[str, Any] = {}
        async with WorkerPool(size=1, exec_timeout=self.code.EXEC_TIMEOUT) as pool:
            plan = _Plan(fault=report.name, scenario="code", persona="competent")

            async def kill_after_first_step(event: Event) -> None:
                if event.step.step_idx != 0 or killed:
                    return
                pid = pool.pids()[0]
                killed["bytes"] = (self.runs_dir / f"{event.run_id}{LOG_SUFFIX}").read_bytes()
                await pool.kill(pid)
                killed["pid"] = pid
                killed["dead"] = pid not in _living_pids(pool)

            plan.event_hook = kill_after_first_step
            env = self.env(plan, self.guard(), code_pool=pool)
            outcomes = await self.code.run_task(task, env)
            run_id = outcomes[0].run_id
            await pool.settled()
            view = await _view(self.runs_dir, run_id)
            reason = view.stop_reason
            report.judge(
                "worker_killed",
                bool(killed.get("dead")),
                "the worker process was killed with SIGKILL and reaped"
                if killed.get("dead")
                else "the worker was not killed",
                run_id,
            )
            report.judge(
                "stop_reason",
                reason is StopReason.ENV_ERROR,
                f"stop reason {None if reason is None else reason.value}",
                run_id,
            )
            started = view.log.started
            assert started is not None
            env_failed = started.parameter_snapshot["synthetic_observations.env_failed"]
            last = view.log.steps[-1].step if view.log.steps else None
            replaced = (
                last is not None
                and last.action_status is ActionStatus.ENV_ERROR
                and last.observation == env_failed
                and last.observation_is_synthetic
            )
            report.judge(
                "synthetic_observation",
                replaced,
                "the failed step's observation is the configured env_failed text"
                if replaced
                else "the failed step's observation is not the env_failed text",
                run_id,
            )
            before = killed.get("bytes", b"")
            report.judge(
                "earlier_steps_untouched",
                bool(before) and view.raw.startswith(before),
                f"{len(before)} bytes logged before the kill are a prefix of the {len(view.raw)} "
                "bytes after",
                run_id,
            )
            ledger = self.code.ledger_lines(self.code.workspace_for(env, task))
            meta = _meta(self.runs_dir, run_id)
            executions = None if meta is None else meta["env_executions"]
            report.judge(
                "environment_count",
                len(ledger) == 1 and executions == 1,
                f"{len(ledger)} ledger lines, meta env_executions {executions}",
                run_id,
            )
            answer = await _probe(pool, self.worker_http)
            report.judge(
                "worker_restarted",
                pool.restarts >= 1 and answer == "42\n",
                f"{pool.restarts} restarts; a probe on the pool printed {len(answer)} chars",
                run_id,
            )


def _living_pids(pool: WorkerPool) -> set[int]:
    living = set()
    for pid in pool.pids():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        living.add(pid)
    return living


def _judge_cancellation_propagated(report: ClassReport, cancelled: bool, run_id: str) -> None:
    """The criterion both cancel classes share: awaiting the cancelled task raised."""
    report.judge(
        "cancellation_propagated",
        cancelled,
        "awaiting the task raised CancelledError"
        if cancelled
        else "the task did not raise CancelledError",
        run_id,
    )


async def _cancelled(unit: asyncio.Future[Any]) -> bool:
    try:
        await unit
    except asyncio.CancelledError:
        if asyncio.current_task() is not None and asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise  # we are being cancelled ourselves
        return True
    return False


async def _eventually(condition: Callable[[], bool], *, seconds: float) -> bool:
    """Poll ``condition`` until it holds or ``seconds`` pass; its last value."""
    for _ in range(max(1, int(seconds / 0.02))):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


async def _has_action_intent(runs_dir: Path, run_id: str) -> bool:
    path = runs_dir / f"{run_id}{LOG_SUFFIX}"
    return path.exists() and b'"kind": "action"' in path.read_bytes()


async def _probe(pool: WorkerPool, http: httpx.AsyncClient) -> str:
    async with pool.lease() as handle:
        session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
        await session.reset(task_id="t000", seed=0, ledger=None)
        result = await session.execute("print(6 * 7)")
        await session.close()
        return result.output


# --------------------------------------------------------------------------- the batch

_SCENARIO_OF: Final[Mapping[str, str]] = {
    "crash_a": "ledger",
    "crash_b": "ledger",
    "cancel_model": "code",
    "cancel_env": "code",
    "step_budget": "code",
    "action_budget": "code",
    "parse_storm": "code",
    "prompt_limit": "ledger",
    "env_fault": "code",
    "cluster": "review",
}


async def _run_class(harness: _Harness, name: str, report: ClassReport) -> None:
    if name == "cluster":
        from tools.soak._cluster_fault import run_cluster_class

        await run_cluster_class(
            report.judge,
            runs_dir=harness.runs_dir,
            workspace_root=harness.workspace_root,
            data_dir=harness.data_dir,
            seed=harness.seed,
            base_url=harness.server.base_url,
            model=harness.server.model,
        )
    elif name in ("crash_a", "crash_b"):
        await harness.crash(report, "a" if name == "crash_a" else "b")
    elif name == "cancel_model":
        await harness.cancel_model(report)
    elif name == "cancel_env":
        await harness.cancel_env(report)
    elif name in ("step_budget", "action_budget"):
        await harness.budget(report, "step" if name == "step_budget" else "action")
    elif name == "parse_storm":
        await harness.parse_storm(report)
    elif name == "prompt_limit":
        await harness.prompt_limit(report)
    else:
        await harness.env_fault(report)


@contextlib.asynccontextmanager
async def _infrastructure(
    seed: int,
) -> AsyncIterator[tuple[PolicyServer, httpx.AsyncClient, WorkerPool, httpx.AsyncClient]]:
    async with (
        PolicyServer(seed=seed) as server,
        httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(300.0, connect=10.0)) as http,
        WorkerPool(size=2, exec_timeout=10.0) as pool,
        httpx.AsyncClient(trust_env=False) as worker_http,
    ):
        yield server, http, pool, worker_http


async def run_batch(
    *,
    runs_dir: Path,
    workspace_root: Path,
    data_dir: Path,
    seed: int,
    budget_calls: int,
    only: Sequence[str] = (),
    out: Callable[[str], None] = print,
) -> list[ClassReport]:
    """Run the fault classes (all, or ``only``) and return their reports."""
    reports: list[ClassReport] = []
    spent = 0
    async with _infrastructure(seed) as (server, http, pool, worker_http):
        harness = _Harness(
            runs_dir=runs_dir,
            workspace_root=workspace_root,
            data_dir=data_dir,
            seed=seed,
            server=server,
            http=http,
            pool=pool,
            worker_http=worker_http,
        )
        for name in (*FAULT_CLASSES, *CLUSTER_FAULT_CLASSES):
            if (only and name not in only) or (not only and name in CLUSTER_FAULT_CLASSES):
                continue
            kind = _SCENARIO_OF[name]
            scenario = harness.ledger_scenario.NAME if kind == "ledger" else kind
            report = ClassReport(name=name, scenario=scenario)
            worst = WORST_CASE_CALLS[name]
            if budget_calls - spent < worst:
                report.judge(
                    "budget",
                    None,
                    f"skipped: {budget_calls - spent} calls left, the class may need {worst}",
                )
            else:
                began = time.monotonic()
                await _run_class(harness, name, report)
                report.calls = _model_intents(runs_dir, f"{name}-")
                spent += report.calls
                out(f"[{name}] done in {time.monotonic() - began:.1f} s")
            reports.append(report)
            _print_class(report, out)
    return reports


def _print_class(report: ClassReport, out: Callable[[str], None]) -> None:
    counts = {v: sum(1 for c in report.criteria if c.verdict is v) for v in Verdict}
    out(
        f"{report.name} ({report.scenario}): {report.verdict.value} - {len(report.criteria)} "
        f"criteria: {counts[Verdict.PASSED]} passed, {counts[Verdict.BREACHED]} breached, "
        f"{counts[Verdict.UNDETERMINED]} undetermined; {report.calls} model calls"
    )
    for criterion in report.criteria:
        out(f"    {criterion.verdict.value:12} {criterion.name}: {criterion.evidence.describe()}")


# --------------------------------------------------------------------------- child process


async def _child(args: argparse.Namespace) -> int:
    module = load_scenario(args.child_scenario)
    index = args.child_task_index
    tasks = module.build_tasks(seed=args.seed, limit=index + 1, data_dir=args.data_dir)
    target = _Target(module, tasks[index])
    mode = "a" if args.child == "crash_a" else "b"
    plan = _Plan(fault=args.child, scenario=target.scenario, persona="competent")
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(300.0, connect=10.0))
        )
        extra: dict[str, Any] = {}
        opener = getattr(module, "open_environment", None)
        if opener is not None:
            extra = await stack.enter_async_context(opener(workers=1, seed=args.seed))
        gateway = GatewayModelClient(
            client=http,
            settings=GatewaySettings(
                base_url=args.child_base_url, model=DEFAULT_MODEL, sampling=SAMPLING
            ),
        )
        guard = BudgetGuard(inner=gateway, limit=1_000_000)
        env = _fault_env(
            plan,
            runs_dir=args.runs_dir,
            workspace_root=args.workspace_root,
            guard=guard,
            seed=args.seed,
            extra=extra,
        )
        plan.store_factory = lambda: CrashingStore(
            JsonlRunStore(directory=args.runs_dir),
            mode=mode,
            ledger_count=lambda: len(target.ledger(env)),
            completing_tools=frozenset(getattr(module, "COMPLETING_TOOLS", ())),
        )
        await target.run(env)
    return 0


# --------------------------------------------------------------------------- CLI


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak.faults",
        description="Inject the nine fault classes and judge their criteria.",
    )
    parser.add_argument("--runs-dir", required=True, type=absolute_path)
    parser.add_argument("--budget-calls", required=True, type=_positive_int)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--workspace-root", type=absolute_path, help="default: <runs-dir>/../fault-workspaces"
    )
    parser.add_argument("--data-dir", type=absolute_path, help="default: <runs-dir>/../data")
    parser.add_argument(
        "--only",
        action="append",
        choices=(*FAULT_CLASSES, *CLUSTER_FAULT_CLASSES),
        default=[],
        help="run only this class (repeatable); 'cluster' (needs Ray) runs only when named",
    )
    parser.add_argument(
        "--allow-undetermined",
        action="store_true",
        help="exit 0 when nothing is breached even if some class is undetermined",
    )
    parser.add_argument("--child", choices=("crash_a", "crash_b"), help=argparse.SUPPRESS)
    parser.add_argument("--child-base-url", help=argparse.SUPPRESS)
    parser.add_argument("--child-scenario", help=argparse.SUPPRESS)
    parser.add_argument("--child-task-index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workspace_root = args.workspace_root or args.runs_dir.parent / "fault-workspaces"
    args.data_dir = args.data_dir or args.runs_dir.parent / "data"
    if args.child is not None:
        return asyncio.run(_child(args))
    if set(args.only) & set(CLUSTER_FAULT_CLASSES):
        from tools.netns import namespace_refusal

        refusal = namespace_refusal("the fault class cluster")
        if refusal is not None:
            print(f"faults: error: {refusal}", file=sys.stderr)
            return EXIT_USAGE
    if args.runs_dir.exists() and run_ids_in(args.runs_dir):
        print(
            f"faults: error: --runs-dir {args.runs_dir} already holds runs; use a new directory",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.workspace_root.exists() and any(args.workspace_root.iterdir()):
        print(
            f"faults: error: --workspace-root {args.workspace_root} is not empty; use a new one",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    reports = asyncio.run(
        run_batch(
            runs_dir=args.runs_dir,
            workspace_root=args.workspace_root,
            data_dir=args.data_dir,
            seed=args.seed,
            budget_calls=args.budget_calls,
            only=args.only,
        )
    )
    criteria = [c for r in reports for c in r.criteria]
    counts = {v: sum(1 for c in criteria if c.verdict is v) for v in Verdict}
    verdict = combine(r.verdict for r in reports)
    print(
        f"faults: {len(reports)} classes, {len(criteria)} criteria: "
        f"{counts[Verdict.PASSED]} passed, {counts[Verdict.BREACHED]} breached, "
        f"{counts[Verdict.UNDETERMINED]} undetermined; verdict {verdict.value}; "
        f"{sum(r.calls for r in reports)} model calls; {time.monotonic() - began:.1f} s"
    )
    if verdict is Verdict.BREACHED:
        return EXIT_BREACHED
    if verdict is Verdict.UNDETERMINED and not args.allow_undetermined:
        undetermined = [r.name for r in reports if r.verdict is Verdict.UNDETERMINED]
        print(
            f"faults: {len(undetermined)} classes undetermined ({', '.join(undetermined)}): "
            "they verified nothing; exit 3 (pass --allow-undetermined to accept that)",
            file=sys.stderr,
        )
        return EXIT_UNDETERMINED
    return EXIT_PASSED


if __name__ == "__main__":
    sys.exit(main())
