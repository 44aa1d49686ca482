"""The review scenario (the "GovDoc shape"): a phased, tool-calling audit of synthetic tenders.

A task checks one compliance checkpoint against one fictional tender's documents, in three
phases that are three polyloop runs sharing one workspace directory:

=============  ===========================================  ===============================
phase          tools (``PHASE_TOOLS``)                       how it ends
=============  ===========================================  ===============================
``plan``       read_document, grep_document, write_note      final answer
``execute``    read_document, grep_document, write_note      final answer
``summarize``  read_document, submit_finding                 ``submit_finding`` (completes)
=============  ===========================================  ===============================

One run has one tool registry, so narrowing the tools per phase means one run per phase;
state passes through notes on disk (plan.md, evidence.md). The workspace also holds the
environment-side audit ledger (``ledger_lines``): one line per executed write, no volatile
fields, so a double execution shows up as a duplicate line.

The documents come from a deterministic synthetic corpus (``build_tasks`` generates it under
``data_dir``), are pseudonymised in memory, and pass the leak gate twice more at run time: in
``build_context`` and in the executor before any observation is returned. See
``research-wiki/explanation/soak-review-scenario.md``.

This module is the public surface the driver and the fault harness import; the building blocks
live in ``tools.soak.review``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from polyloop.session import RunRequest
from polyloop.types import Budget, ReplayPolicy
from tools.soak.review.corpus import TASK_COUNT
from tools.soak.review.domain import (
    CATEGORIES,
    CHECKPOINTS,
    COMPLETING_TOOLS,
    NAME,
    PHASE_TOOLS,
    PHASES,
    VERDICT_LEVELS,
    Checkpoint,
    ReviewScenarioError,
)
from tools.soak.review.ledger import AUDIT_LOG_NAME, duplicate_lines, ledger_lines
from tools.soak.review.parser import ReviewParser
from tools.soak.review.policy import policy
from tools.soak.review.prompts import (
    OBSERVATION_TEMPLATE,
    PROMPT_FINGERPRINT,
    SYNTHETIC_OBSERVATIONS,
    build_context,
)
from tools.soak.review.redaction import (
    RedactionResidueError,
    Redactor,
    assert_no_residue,
)
from tools.soak.review.tasks import ReviewDocument, ReviewTask, build_tasks
from tools.soak.review.workspace_tools import (
    FINDING_NAME,
    MAX_READ_LINES,
    ReviewExecutor,
    ReviewTools,
)
from tools.soak.scenarios.base import RunOutcome, RunSpec, ScenarioEnv

__all__ = [
    "AUDIT_LOG_NAME",
    "CATEGORIES",
    "CHECKPOINTS",
    "COMPLETING_TOOLS",
    "FINDING_NAME",
    "MAX_READ_LINES",
    "NAME",
    "OBSERVATION_TEMPLATE",
    "PHASES",
    "PHASE_BUDGETS",
    "PHASE_TOOLS",
    "SYNTHETIC_OBSERVATIONS",
    "TASK_COUNT",
    "VERDICT_LEVELS",
    "Checkpoint",
    "RedactionResidueError",
    "Redactor",
    "ReviewDocument",
    "ReviewExecutor",
    "ReviewParser",
    "ReviewScenarioError",
    "ReviewTask",
    "ReviewTools",
    "assert_no_residue",
    "build_context",
    "build_run_request",
    "build_run_spec",
    "build_tasks",
    "duplicate_lines",
    "finding_verdict",
    "ledger_lines",
    "make_run_id",
    "policy",
    "run_task",
    "workspace_for",
]

PHASE_BUDGETS: Final[Mapping[str, Budget]] = MappingProxyType(
    {
        "plan": Budget(
            max_steps=20, max_actions=20, max_consecutive_parse_failures=3, max_prompt_chars=400_000
        ),
        "execute": Budget(
            max_steps=25, max_actions=25, max_consecutive_parse_failures=3, max_prompt_chars=400_000
        ),
        "summarize": Budget(
            max_steps=16, max_actions=16, max_consecutive_parse_failures=3, max_prompt_chars=400_000
        ),
    }
)
"""Per-phase budgets: at most 61 model calls per task."""

_CANCEL_GRACE_SECONDS: Final = 5.0
_SAFE_ID: Final = re.compile(r"[A-Za-z0-9._-]+")


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ReviewScenarioError(f"phase {phase!r} is unknown; use one of {', '.join(PHASES)}")


def make_run_id(task_id: str, phase: str) -> str:
    """``review-<task_id>-<phase>``: the run id of one phase (safe for ``JsonlRunStore``)."""
    _check_phase(phase)
    if not isinstance(task_id, str) or not _SAFE_ID.fullmatch(task_id):
        raise ReviewScenarioError(
            f"task id {task_id!r} must be non-empty and use only letters, digits, '.', '_' "
            "and '-' (it becomes part of a file name)"
        )
    return f"{NAME}-{task_id}-{phase}"


def workspace_for(env: ScenarioEnv, task: ReviewTask) -> Path:
    """The directory the three phases of ``task`` share: ``<workspace_root>/review/<task>``."""
    return Path(env.workspace_root) / NAME / task.task_id


def finding_verdict(workspace: Path) -> str | None:
    """The verdict in the workspace's finding file, or ``None`` when nothing was submitted."""
    try:
        finding = json.loads((Path(workspace) / FINDING_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    verdict = finding.get("verdict") if isinstance(finding, dict) else None
    return verdict if isinstance(verdict, str) else None


def build_run_request(
    *,
    task: ReviewTask,
    phase: str,
    run_id: str,
    workspace: Path,
    model_binding: Mapping[str, str],
    budget: Budget | None = None,
) -> RunRequest:
    """The ``RunRequest`` of one phase of ``task`` working in ``workspace``.

    ``tools`` are the phase's tools (``PHASE_TOOLS[phase]``) and the executor is a
    ``ReviewExecutor`` over exactly that registry. ``budget`` overrides ``PHASE_BUDGETS``
    (the prompt-limit fault class computes its own ``max_prompt_chars``). Model calls are
    never replayed (``ReplayPolicy.NEVER``): a call's cost is real even when the model is a
    local script. Raises ``RedactionResidueError`` when the context fails the leak gate.
    """
    _check_phase(phase)
    tools = ReviewTools(documents=task.document_lines(), workspace=Path(workspace))
    registry = tools.registry().restrict_to(PHASE_TOOLS[phase])
    # One registry for both: what the model is shown is what validation and dispatch use.
    executor = ReviewExecutor(tools=tools, registry=registry, known=task.gate)
    return RunRequest(
        run_id=run_id,
        budget=PHASE_BUDGETS[phase] if budget is None else budget,
        action_executor=executor,
        context=build_context(task=task, phase=phase, tools=registry),
        model_replay_policy=ReplayPolicy.NEVER,
        tools=registry,
        injections={},
        model_binding=model_binding,
        fingerprints={
            "review.corpus": task.corpus_digest,
            "review.prompt": PROMPT_FINGERPRINT,
            "review.task": task.task_id,
        },
        observation_template=OBSERVATION_TEMPLATE,
        cancel_grace_seconds=_CANCEL_GRACE_SECONDS,
    )


def build_run_spec(
    *,
    task: ReviewTask,
    phase: str,
    workspace: Path,
    model_binding: Mapping[str, str],
    run_id: str | None = None,
    budget: Budget | None = None,
) -> RunSpec:
    """The ``RunSpec`` ``run_task`` hands to ``env.execute_run`` for one phase.

    ``env_executions`` counts the ledger lines written after this call returns (so build the
    spec right before the run, and read it right after: lines of a later phase would count
    too); ``success`` is ``None`` for plan and execute and, for summarize, whether the
    submitted verdict equals the task's expected verdict (``False`` when nothing was
    submitted).
    """
    request = build_run_request(
        task=task,
        phase=phase,
        run_id=make_run_id(task.task_id, phase) if run_id is None else run_id,
        workspace=workspace,
        model_binding=model_binding,
        budget=budget,
    )
    baseline = len(ledger_lines(workspace))

    def env_executions() -> int:
        return len(ledger_lines(workspace)) - baseline

    def success() -> bool | None:
        if phase != "summarize":
            return None
        return finding_verdict(workspace) == task.expected_verdict

    return RunSpec(
        request=request,
        decision_parser=ReviewParser(),
        synthetic_observations=SYNTHETIC_OBSERVATIONS,
        task_id=task.task_id,
        phase=phase,
        env_executions=env_executions,
        success=success,
    )


def _fresh_workspace(workspace: Path) -> None:
    if workspace.exists() and any(workspace.iterdir()):
        raise ReviewScenarioError(
            f"workspace {workspace} is not empty (left by an earlier attempt); its ledger would "
            "mix two attempts and break the no-double-execution check. Use a fresh "
            "workspace_root, or delete that directory"
        )
    workspace.mkdir(parents=True, exist_ok=True)


async def run_task(task: ReviewTask, env: ScenarioEnv) -> list[RunOutcome]:
    """Run the three phases of ``task`` in order, in one fresh workspace.

    Each phase is built right before it runs (so the context gate and the ledger baseline
    see the workspace as it is then) and goes through ``env.execute_run``. A phase whose run
    raised (``RunOutcome.error`` set) ends the task: the next phase would start from a
    workspace in an unknown state. A stop reason (a budget, parse failures) is not an error;
    the next phase runs and copes with whatever notes exist.
    """
    workspace = workspace_for(env, task)
    _fresh_workspace(workspace)
    outcomes: list[RunOutcome] = []
    for phase in PHASES:
        spec = build_run_spec(
            task=task,
            phase=phase,
            workspace=workspace,
            model_binding=env.binding_for(task.task_id, phase),
        )
        outcome = await env.execute_run(spec)
        outcomes.append(outcome)
        if outcome.error is not None:
            break
    return outcomes
