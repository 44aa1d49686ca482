"""Shared pieces of the soak harness tests (not collected: no ``test_`` prefix).

Importing this module puts the repository root on ``sys.path``, so ``tools.soak`` imports work
however pytest was started. Test modules here import it first.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.soak.run_soak import BudgetGuard, execute_run  # noqa: E402
from tools.soak.scenarios.base import RunOutcome, RunSpec  # noqa: E402

from _shared_doubles import TEXTS  # noqa: E402
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ParsedReply  # noqa: E402
from polyloop.session import RunRequest  # noqa: E402
from polyloop.testing import ScriptedModelClient  # noqa: E402
from polyloop.types import (  # noqa: E402
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    TextBlock,
)


class ScriptedModel(ScriptedModelClient):
    """The public scripted client as the soak tests use it: one client serves a whole batch
    of runs, so the replies go in arrival order and the last one repeats; an ``Exception``
    instance in the list is raised instead."""

    def __init__(self, replies: Sequence[str | Exception], *, thinking: str = "") -> None:
        super().__init__(
            replies,
            index_by="arrival",
            when_exhausted="repeat_last",
            thinking=thinking,
            call_id_prefix="c",
        )


class LineParser:
    """``DONE <answer>`` final answer, ``BAD <why>`` invalid, anything else an action."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        text = reply.content
        if text.startswith("DONE "):
            return ParsedReply(history_text=text, decision=FinalAnswer(text=text[5:]))
        if text.startswith("BAD "):
            return ParsedReply(history_text=text, decision=InvalidDecision(explanation=text[4:]))
        return ParsedReply(history_text=text, decision=Action(text=text))

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "line"}


class EchoExecutor:
    """``finish`` completes the task; ``broken`` is an environment error; other text echoes."""

    def __init__(self, *, echo: str = "ran ") -> None:
        self.executions = 0
        self._echo = echo

    async def execute(self, action: Action) -> ActionOutcome:
        self.executions += 1
        if action.text == "broken":
            status, completed = ActionStatus.ENV_ERROR, False
        else:
            status, completed = ActionStatus.EXECUTED, action.text.endswith("finish")
        return ActionOutcome(
            status=status,
            observation=f"{self._echo}{action.text}",
            observation_is_synthetic=False,
            env_reported_completion=completed,
            observation_truncated_chars=0,
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "echo"}


def budget(max_steps: int = 6, max_actions: int = 6) -> Budget:
    return Budget(
        max_steps=max_steps,
        max_actions=max_actions,
        max_consecutive_parse_failures=3,
        max_prompt_chars=100_000,
    )


async def make_run(
    runs_dir: Path,
    run_id: str,
    replies: Sequence[str | Exception],
    *,
    max_steps: int = 6,
    max_actions: int = 6,
    binding: Mapping[str, str] | None = None,
    task_id: str = "t000",
    phase: str | None = None,
    scenario: str = "code",
    thinking: str = "",
    echo: str = "ran ",
) -> RunOutcome:
    """One real run through ``execute_run`` (all four files), with scripted parts."""
    executor = EchoExecutor(echo=echo)
    guard = BudgetGuard(inner=ScriptedModel(replies, thinking=thinking), limit=1000)
    request = RunRequest(
        run_id=run_id,
        budget=budget(max_steps, max_actions),
        action_executor=executor,
        context=Context(goal_level=(Message(role=Role.USER, content=(TextBlock(text="go"),)),)),
        model_replay_policy=ReplayPolicy.NEVER,
        model_binding=binding or {},
        observation_template="Output: {observation}",
    )
    spec = RunSpec(
        request=request,
        decision_parser=LineParser(),
        synthetic_observations=TEXTS,
        task_id=task_id,
        phase=phase,
        env_executions=lambda: executor.executions,
    )
    return await execute_run(
        spec, runs_dir=runs_dir, model_client=guard, calls_for=guard.calls_for, scenario=scenario
    )


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write records as a log, each line re-sealed with its checksum (design 0162), as if a
    (buggy) writer had produced them: the tests check what the scoreboard says about their
    *content*; a stale checksum would stop every reader at the first edited line."""
    path.write_bytes(b"".join(_sealed(record) for record in records))


def write_line(record: Mapping[str, Any]) -> bytes:
    """One record as a log line (without its newline), re-sealed like ``write_lines``."""
    return _sealed(record)[:-1]


def _sealed(record: Mapping[str, Any]) -> bytes:
    if "checksum" not in record:
        return json.dumps(record, ensure_ascii=False).encode() + b"\n"
    body = json.dumps(
        {k: v for k, v in record.items() if k != "checksum"}, ensure_ascii=False
    ).encode()
    return body[:-1] + b', "checksum": "%08x"}\n' % zlib.crc32(body)


def edit_json(path: Path, **changes: Any) -> None:
    payload = json.loads(path.read_text(encoding="utf-8"))
    payload.update(changes)
    path.write_text(json.dumps(payload), encoding="utf-8")
