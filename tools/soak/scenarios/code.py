"""The code scenario (the AppWorld shape): actions are Python code in a fence, run by workers.

One task is one polyloop run (``run_id = "code-<task_id>"``) on one leased worker process:

* **parser** - ``CodeParser``: the first ```` ```python ```` block whose closing fence stands
  on its own line is the action; the history keeps the reply only up to that fence (anything
  the model invents after its code, such as a made-up "Output:", is dropped). No block, an
  empty block or an unclosed one is an ``InvalidDecision`` whose explanation says how to fix
  it. This scenario has no final answer: a task ends when the code calls ``complete_task``.
* **executor** - ``CodeExecutor`` posts the code to its worker. Errors in the agent's code
  are ``EXECUTED`` with the traceback as the observation; a worker that cannot serve is
  ``ENV_ERROR``; ``complete_task`` makes the environment report completion.
  ``parameters()`` is ``{"kind": "codeworld_session"}`` - no port, no task: the worker's
  address changes per lease and would read as parameter drift on resume.
* **context** - the run level is a fixed few-shot demonstration with the app API (identical
  for every task, so a provider's prefix cache keeps hitting, and usable by a *base* model);
  the goal level is the task's instruction.
* **policy** - the scripted personas (see ``policy``).

Code actions are never replayed (``ReplayPolicy.NEVER`` for the model call too): the world
is stateful and repeating a model call or an execution whose outcome is unknown would guess.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Final

import httpx

from polyloop.ports import Action, InvalidDecision, ParsedReply
from polyloop.session import RunRequest
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    SyntheticObservations,
    TextBlock,
)
from tools.soak.codeworld import tasks as codetasks
from tools.soak.codeworld.client import WorkerError, WorkerSession
from tools.soak.codeworld.pool import WorkerPool
from tools.soak.codeworld.tasks import CodeTask
from tools.soak.codeworld.world import API_DESCRIPTION
from tools.soak.scenarios.base import PolicyReply, PolicyRequest, RunOutcome, RunSpec, ScenarioEnv

__all__ = [
    "BUDGET",
    "COMPLETING_TOOLS",
    "EXEC_TIMEOUT",
    "LEDGER_NAME",
    "NAME",
    "OBSERVATION_TEMPLATE",
    "PHASES",
    "RUN_LEVEL",
    "SYNTHETIC_OBSERVATIONS",
    "CodeExecutor",
    "CodeParser",
    "build_context",
    "build_run_request",
    "build_tasks",
    "ledger_lines",
    "open_environment",
    "policy",
    "run_id_for",
    "run_task",
    "workspace_for",
]

NAME: Final = "code"
PHASES: Final[tuple[str | None, ...]] = (None,)
"""One run per task, without a phase."""
COMPLETING_TOOLS: Final = frozenset[str]()
"""No tools: completion is reported by the environment (``complete_task``)."""
LEDGER_NAME: Final = "ledger.tsv"
EXEC_TIMEOUT: Final = 10.0
"""Seconds one execution may run in a worker."""

BUDGET: Final = Budget(
    max_steps=12, max_actions=12, max_consecutive_parse_failures=3, max_prompt_chars=200_000
)
OBSERVATION_TEMPLATE: Final = "Output:\n```\n{observation}\n```"
SYNTHETIC_OBSERVATIONS: Final = SyntheticObservations(
    action_rejected="[this action was not executed: this environment runs Python code only]",
    env_failed="[the environment failed; this step's code was not executed]",
    model_call_failed="[the model call failed; this step produced nothing]",
)

_FENCE_HELP: Final = (
    "Write this step's code in one block that starts with ```python on its own line and ends "
    "with ``` on its own line."
)


def _user(text: str) -> Message:
    return Message(role=Role.USER, content=(TextBlock(text=text),))


def _assistant(text: str) -> Message:
    return Message(role=Role.ASSISTANT, content=(TextBlock(text=text),))


RUN_LEVEL: Final = (
    _user(
        "You complete my tasks by writing Python code that uses my apps. Each turn, reply "
        "with exactly one ```python block; I run it and show you its output. Variables "
        "persist between turns. Only these modules can be imported: collections, datetime, "
        "decimal, fractions, functools, itertools, json, math, operator, random, re, "
        "statistics, string, textwrap, time. When the task is done, call complete_task(), "
        "passing answer=... if the task asks a question.\n\n"
        f"The apps:\n{API_DESCRIPTION}\n\n"
        "Example task: How many notes do I have? Answer with a number."
    ),
    _assistant(
        "I will list the notes first.\n```python\nnotes = apps.notes.list()\nprint(len(notes))\n```"
    ),
    _user(OBSERVATION_TEMPLATE.format(observation="4\n")),
    _assistant("```python\ncomplete_task(answer=len(notes))\n```"),
    _user(
        OBSERVATION_TEMPLATE.format(observation="Task marked as complete.\n")
        + "\n\nThat was the example. Here is the real task."
    ),
)
"""The run-level context: instructions, the API and one worked example (few-shot)."""
_PREFIX_MESSAGES: Final = len(RUN_LEVEL) + 1


# --------------------------------------------------------------------------- parser

_BLOCK: Final = re.compile(r"^```python[ \t]*\r?\n(.*?)^```[ \t]*\r?$", re.MULTILINE | re.DOTALL)


class CodeParser:
    """First fenced python block -> ``Action(text=code)``; see the module docstring."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        content = reply.content
        match = _BLOCK.search(content)
        if match is None:
            if "```python" in content:
                problem = (
                    "Your ```python block is not closed (or its fences are not on lines of "
                    "their own)."
                )
            else:
                problem = "Your reply has no ```python code block, so nothing was run."
            return ParsedReply(
                history_text=content,
                decision=InvalidDecision(explanation=f"{problem} {_FENCE_HELP}"),
            )
        code = match.group(1).rstrip("\r\n")
        history = content[: match.end()]
        if not code.strip():
            return ParsedReply(
                history_text=history,
                decision=InvalidDecision(
                    explanation=(
                        f"Your first ```python block is empty, so nothing was run. {_FENCE_HELP}"
                    )
                ),
            )
        return ParsedReply(history_text=history, decision=Action(text=code))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "codeworld_python_fence", "multi_block_policy": "first_only"}


# --------------------------------------------------------------------------- executor


class CodeExecutor:
    """Runs code actions on one worker session. One instance per run.

    ``env_executions`` and ``success`` are the worker's own figures (never counted here).
    """

    def __init__(self, *, session: WorkerSession) -> None:
        self._session = session

    @property
    def env_executions(self) -> int:
        return self._session.executions

    @property
    def success(self) -> bool | None:
        return self._session.success

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "codeworld_session"}

    async def execute(self, action: Action) -> ActionOutcome:
        if action.tool_call is not None:
            return ActionOutcome(
                status=ActionStatus.NOT_EXECUTED,
                observation="this environment runs Python code, not tool calls",
                observation_is_synthetic=False,
                env_reported_completion=False,
                observation_truncated_chars=0,
            )
        try:
            result = await self._session.execute(action.text)
        except WorkerError as exc:
            return ActionOutcome(
                status=ActionStatus.ENV_ERROR,
                observation=str(exc),
                observation_is_synthetic=False,
                env_reported_completion=False,
                observation_truncated_chars=0,
            )
        return ActionOutcome(
            status=ActionStatus.EXECUTED,
            observation=result.output,
            observation_is_synthetic=False,
            env_reported_completion=result.completed,
            observation_truncated_chars=result.truncated_chars,
        )


# --------------------------------------------------------------------------- assembly


def build_tasks(*, seed: int, limit: int | None, data_dir: Path) -> list[CodeTask]:
    """The first ``limit`` tasks of ``seed`` (``data_dir`` is unused: worlds are generated)."""
    return codetasks.build_tasks(seed, limit)


def run_id_for(task: CodeTask) -> str:
    return f"code-{task.task_id}"


def build_context(task: CodeTask) -> Context:
    return Context(run_level=RUN_LEVEL, goal_level=(_user(f"Task: {task.instruction}"),))


def build_run_request(
    *, task: CodeTask, executor: CodeExecutor, binding: Mapping[str, str]
) -> RunRequest:
    return RunRequest(
        run_id=run_id_for(task),
        budget=BUDGET,
        action_executor=executor,
        context=build_context(task),
        model_replay_policy=ReplayPolicy.NEVER,
        model_binding=binding,
        fingerprints={"codeworld.task": f"{task.seed}:{task.task_id}"},
        observation_template=OBSERVATION_TEMPLATE,
        cancel_grace_seconds=5.0,
    )


def workspace_for(env: ScenarioEnv, task: CodeTask) -> Path:
    """``<workspace_root>/code/<task_id>``: holds the task's execution ledger."""
    return env.workspace_root / NAME / task.task_id


def ledger_lines(workspace: Path) -> list[str]:
    """The worker-written execution ledger of one task (``[]`` before the first execution)."""
    path = workspace / LEDGER_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return text.splitlines()


@contextlib.asynccontextmanager
async def open_environment(*, workers: int, seed: int) -> AsyncIterator[dict[str, Any]]:
    """Start ``workers`` worker processes and an HTTP client for them."""
    async with (
        WorkerPool(size=workers, exec_timeout=EXEC_TIMEOUT) as pool,
        httpx.AsyncClient(trust_env=False) as http,
    ):
        yield {"code_pool": pool, "code_http": http}


async def run_task(task: CodeTask, env: ScenarioEnv) -> list[RunOutcome]:
    """Lease a worker, reset it to ``task``, run the task as one polyloop run, return it.

    The meta's ``success`` is the worker's ``/evaluate`` after the run (before ``/close``), so
    a run whose agent never executed anything is still graded (it failed its task). Only a
    run that raised or was cancelled, or whose worker broke, stays ungraded (null).
    """
    pool: WorkerPool = env.extra["code_pool"]
    http: httpx.AsyncClient = env.extra["code_http"]
    workspace = workspace_for(env, task)
    workspace.mkdir(parents=True, exist_ok=True)
    async with pool.lease() as handle:
        session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
        await session.reset(task_id=task.task_id, seed=task.seed, ledger=workspace / LEDGER_NAME)
        executor = CodeExecutor(session=session)

        async def evaluate() -> bool | None:
            # A worker that broke during the run (killed, timed out, dropped the connection)
            # cannot be asked; every other run is graded by the environment itself, whether
            # or not its agent executed anything.
            if not handle.alive or handle.dirty:
                return None
            return await session.evaluate()

        spec = RunSpec(
            request=build_run_request(
                task=task, executor=executor, binding=env.binding_for(task.task_id, None)
            ),
            decision_parser=CodeParser(),
            synthetic_observations=SYNTHETIC_OBSERVATIONS,
            task_id=task.task_id,
            phase=None,
            env_executions=lambda: executor.env_executions,
            evaluate=evaluate,
        )
        outcome = await env.execute_run(spec)
        if handle.alive and not handle.dirty:
            await session.close()
    return [outcome]


# --------------------------------------------------------------------------- policy

_PROSE: Final = (
    "Let me think about which app holds this information before writing any code.",
    "I would start by looking at the contacts, then decide what to do next.",
    "```js\nconsole.log(apps.contacts.all())\n```",
    "```python\n```",
    "```python\nprint(apps.notes.list())",
)
_PADDING: Final = (
    "First I restate the task to be sure I understood it.",
    "The apps return plain dictionaries, so I can index them by key.",
    "I should not assume anything the data does not show.",
    "Names are matched case-insensitively, which helps with partial names.",
    "Dates are written as YYYY-MM-DD throughout the calendar.",
    "Prices are integers in cents, so there is no rounding to worry about.",
    "I keep intermediate results in variables because they persist between turns.",
    "After this step I will check the output before deciding on the next one.",
)


def _fence(code: str, lead: str = "") -> str:
    return f"{lead}```python\n{code}\n```"


def _padding(rng: random.Random) -> str:
    count = rng.randint(25, 60)
    return " ".join(rng.choice(_PADDING) for _ in range(count)) + "\n\n"


def policy(request: PolicyRequest) -> str | PolicyReply:
    """The scripted agent for code tasks: a pure function of ``request``.

    It rebuilds the task from ``(seed, task_id)``, counts the turns it already took from the
    messages, and reads the last observation (a ``Traceback`` means its previous code failed):

    * ``competent`` explores, then solves with the variables the exploration left behind;
      after an error it sends one self-contained block. Two steps when all goes well.
    * ``sloppy`` starts with a buggy call (an API that does not exist, wrong arguments),
      then recovers - with the wrong answer or the wrong change in about half the tasks.
    * ``malformed`` opens with a reply the parser rejects (prose, a ```js fence, an empty or
      an unclosed block); a third of its tasks keep doing it until the parse-failure budget
      stops the run.
    * ``stubborn`` explores forever and never calls ``complete_task`` (step budget).
    * ``verbose`` solves like ``competent`` but wraps each block in kilobytes of prose, adds
      a made-up output after the fence (the parser drops it) and sends reasoning text.
    """
    task = codetasks.task_for(request.seed, request.task_id)
    plan = codetasks.solution(task)
    history = list(request.messages[_PREFIX_MESSAGES:])
    turn = len(history) // 2
    last = str(history[-1].get("content", "")) if history else ""
    failed = "Traceback (most recent call last)" in last or "TimeoutError:" in last
    run_rng = random.Random(f"{request.seed}:{request.task_id}:{request.persona}")
    step_rng = random.Random(f"{request.seed}:{request.task_id}:{request.persona}:{turn}")
    persona = request.persona
    if persona == "sloppy":
        if turn == 0:
            return _fence(plan.buggy, "Quick attempt:\n")
        wrong = run_rng.random() < 0.5
        return _fence(plan.wrong_full if wrong else plan.full, "Fixing that:\n")
    if persona == "malformed":
        storm = run_rng.random() < 0.35
        if turn == 0 or (storm and turn < 3):
            return _PROSE[step_rng.randrange(len(_PROSE))]
        turn -= 1
    if persona == "stubborn":
        date = str(task.params.get("date", "2026-12-01"))
        return _fence(
            f"# attempt {turn + 1}\nprint(len(apps.contacts.all()), "
            f"len(apps.calendar.events_on({date!r})), len(apps.notes.list()))",
            "Let me look around a bit more.\n",
        )
    if failed or turn >= 2:
        code = plan.full
    elif turn == 0:
        code = plan.explore
    else:
        code = plan.solve
    if persona == "verbose":
        if turn == 0 and not failed:
            code += "\nprint(apps.contacts.all())"
        text = (
            _padding(step_rng)
            + _fence(code)
            + "\n\nOutput:\n```\n(I expect this to work)\n```\n"
            + _padding(step_rng)
        )
        reasoning = f"Turn {turn + 1}. " + _padding(step_rng)
        return PolicyReply(content=text, reasoning=reasoning)
    return _fence(code, "I will check the data first.\n" if turn == 0 else "")
