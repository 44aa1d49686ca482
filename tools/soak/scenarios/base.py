"""The contract between the soak driver and a scenario module.

A scenario module (``tools.soak.scenarios.code``, ``tools.soak.scenarios.review``) provides:

* ``NAME: str`` - the scenario's name on the command line and in ``.meta.json``.
* ``build_tasks(*, seed: int, limit: int | None, data_dir: Path) -> list[<task>]`` - the task
  list, deterministic for a seed; every task has ``task_id: str``.
* ``run_task(task, env: ScenarioEnv) -> Awaitable[list[RunOutcome]]`` - executes the task as one
  or more polyloop runs (the review scenario: three, one per phase) and returns one outcome per
  run. It builds its ``RunRequest`` objects itself and calls ``env.execute_run`` for each.
* ``policy(request: PolicyRequest) -> str`` - the scripted agent: given the chat messages of one
  model call, the text the "model" answers. Runs inside the loopback policy server. Must be a
  pure function of its argument (seeded ``random.Random(request.seed)`` only).

Optional module attributes (the driver and the fault batch use them when present):

* ``COMPLETING_TOOLS: frozenset[str]`` - tool names whose execution completes a run (what the
  scoreboard's ``--completing-tool`` is told); absent means none.
* ``open_environment(*, workers: int, seed: int) -> AbstractAsyncContextManager[Mapping[str,
  Any]]`` - start what the scenario's tasks need for the whole batch (the code scenario's
  worker pool); the yielded mapping is merged into ``ScenarioEnv.extra``.
* ``workspace_for(env: ScenarioEnv, task) -> Path`` and ``ledger_lines(workspace: Path) ->
  list[str]`` - where a task keeps state that survives the process, and the environment's
  own append-only record of executed side effects (one line per execution, no step number,
  no timestamp). The fault classes judge "executed exactly once" on these lines.

``policy`` may return a plain ``str`` (the reply's content) or a ``PolicyReply`` (content plus
reasoning text, sent as ``reasoning_content``).

The driver tells the policy server which scenario, task, phase and persona a call belongs to
through the model binding key ``gateway.user`` (forwarded by ``GatewayModelClient`` as the
request body's ``user`` field): ``"<scenario>|<task_id>|<phase or ->|<persona>|<seed>"``.
``encode_user`` / ``decode_user`` below are the only code that knows this format.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyloop.ports import DecisionParser, ModelClient
from polyloop.session import RunRequest
from polyloop.types import SyntheticObservations

PERSONAS = ("competent", "sloppy", "malformed", "stubborn", "verbose")
"""Agent personas the policies implement: ``competent`` solves the task; ``sloppy`` makes wrong
calls and bad arguments before recovering; ``malformed`` emits unparseable output now and then;
``stubborn`` never finishes (budget exhaustion); ``verbose`` produces long outputs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRequest:
    """One model call as the policy server sees it."""

    scenario: str
    task_id: str
    phase: str | None
    persona: str
    seed: int
    messages: Sequence[Mapping[str, str]]
    """Chat Completions messages: ``{"role": ..., "content": ...}``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyReply:
    """A policy's answer with reasoning: ``content`` is the reply, ``reasoning`` is sent as
    ``choices[0].message.reasoning_content`` (the adapter maps it to ``ModelReply.thinking``)."""

    content: str
    reasoning: str = ""


def encode_user(*, scenario: str, task_id: str, phase: str | None, persona: str, seed: int) -> str:
    """The ``gateway.user`` binding value that routes a run's calls to its policy."""
    for name, value in (("scenario", scenario), ("task_id", task_id), ("persona", persona)):
        if "|" in value or not value:
            raise ValueError(f"{name} {value!r} must be non-empty and must not contain '|'")
    return f"{scenario}|{task_id}|{phase or '-'}|{persona}|{seed}"


def decode_user(value: str) -> tuple[str, str, str | None, str, int]:
    """Inverse of ``encode_user``; ``ValueError`` names the problem."""
    parts = value.split("|")
    if len(parts) != 5:
        raise ValueError(
            f"user field {value!r} is not '<scenario>|<task>|<phase>|<persona>|<seed>'"
        )
    scenario, task_id, phase, persona, seed = parts
    return scenario, task_id, None if phase == "-" else phase, persona, int(seed)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """What the driver learned about one run (``error`` set when the run raised)."""

    run_id: str
    scenario: str
    task_id: str
    phase: str | None
    stop_reason: str | None
    steps: int
    model_calls: int
    wall_ms: int
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """Everything ``ScenarioEnv.execute_run`` needs for one run."""

    request: RunRequest
    decision_parser: DecisionParser
    synthetic_observations: SyntheticObservations
    task_id: str
    phase: str | None
    env_executions: Callable[[], int]
    """The environment's own count of executed actions (read after the run)."""
    success: Callable[[], bool | None] = lambda: None
    """Programmatic success check, read after the run (``None``: no grading). Not consulted
    when ``evaluate`` is given."""
    evaluate: Callable[[], Awaitable[bool | None]] | None = None
    """An asynchronous success check that asks the environment itself (the code scenario's
    ``/evaluate``). Awaited once, after a run that returned a result and before the meta is
    written; its value is the meta's ``success``. A run that raised or was cancelled is not
    graded (``success`` null): it did not end, and the environment may be mid-execution. An
    exception from it is the run's driver error (its result file is still written)."""


@dataclass(slots=True, kw_only=True)
class ScenarioEnv:
    """Handed to ``run_task`` by the driver.

    ``execute_run(spec)`` runs one polyloop run with the driver's model client, a
    ``JsonlRunStore`` in ``runs_dir`` and the sidecar-writing event sink, and returns its
    ``RunOutcome``. ``binding_for(task_id, phase)`` is the ``model_binding`` to put in the
    request (it routes calls to this scenario's policy). ``workspace_root`` is where scenarios
    keep per-task state that must survive the process (the review scenario's workspaces).
    """

    runs_dir: Path
    workspace_root: Path
    model_client: ModelClient
    execute_run: Callable[[RunSpec], Awaitable[RunOutcome]]
    binding_for: Callable[[str, str | None], Mapping[str, str]]
    extra: dict[str, Any] = field(default_factory=dict)
