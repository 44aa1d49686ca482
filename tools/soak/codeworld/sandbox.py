"""Run one piece of agent code against a world: best effort, and NOT a security boundary.

What ``TaskSession.execute`` does to keep honest-but-clumsy agent code in line:

* a **time limit** per execution (``SIGALRM`` through ``signal.setitimer``; the interrupt is a
  ``BaseException`` so an agent's ``except Exception`` cannot swallow it);
* an **import allowlist** (``ALLOWED_IMPORTS``) through a replaced ``__import__``;
* a **reduced set of builtins** (no ``open``, ``exec``, ``eval``, ``compile``, ``input``,
  ``breakpoint``, ``exit``/``quit``/``help``);
* **captured output**, capped at ``output_limit`` characters (the rest is counted, not kept).

The worker process adds ``resource`` limits (address space, open files, file size, and CPU
seconds re-armed before every execution) and a private temporary working directory (see
``worker``).

None of this stops hostile code: Python's object graph reaches the real builtins from any
literal (``().__class__.__base__.__subclasses__()``); the time limit is a Python signal
handler, so it only fires between bytecodes, and one long call inside C (a huge
``sum(range(...))``, a catastrophically backtracking regular expression) runs on until it
returns or the CPU limit kills the whole worker; and the worker runs with the user's
permissions. It exists so that a scripted or small model's mistakes (an infinite loop, a stray
``import os``, a giant print) fail one step instead of the soak. Never point it at code you
would not run yourself.

Variables persist between executions of one session (the executor is stateful, like a
notebook), so a step can use what an earlier step computed.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import linecache
import signal
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from tools.soak.codeworld.tasks import CodeTask, check, world_for
from tools.soak.codeworld.world import AppError, Apps, World

__all__ = [
    "AGENT_FILENAME",
    "ALLOWED_IMPORTS",
    "ExecutionReport",
    "ExecutionTimeout",
    "TaskSession",
]

AGENT_FILENAME: Final = "<agent>"
ALLOWED_IMPORTS: Final = frozenset(
    {
        "collections",
        "datetime",
        "decimal",
        "fractions",
        "functools",
        "itertools",
        "json",
        "math",
        "operator",
        "random",
        "re",
        "statistics",
        "string",
        "textwrap",
        "time",
    }
)
_REMOVED_BUILTINS: Final = frozenset(
    {"open", "exec", "eval", "compile", "input", "breakpoint", "exit", "quit", "help"}
)


class ExecutionTimeout(BaseException):
    """Raised inside agent code when its time limit is up (a ``BaseException`` on purpose)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionReport:
    """What one execution produced. ``output`` is what the agent sees (stdout, stderr, and the
    traceback of an error), cut to the session's ``output_limit``; ``truncated_chars`` is how
    much was cut."""

    output: str
    truncated_chars: int
    raised: bool


def _guarded_import(
    name: str,
    globals_: Mapping[str, object] | None = None,
    locals_: Mapping[str, object] | None = None,
    fromlist: tuple[str, ...] = (),
    level: int = 0,
) -> Any:
    top = name.split(".", 1)[0]
    if level != 0 or top not in ALLOWED_IMPORTS:
        raise ImportError(
            f"import of {name!r} is not allowed here; allowed modules: "
            f"{', '.join(sorted(ALLOWED_IMPORTS))}"
        )
    return builtins.__import__(name, globals_, locals_, fromlist, level)


def _safe_builtins() -> dict[str, object]:
    table = {k: v for k, v in vars(builtins).items() if k not in _REMOVED_BUILTINS}
    table["__import__"] = _guarded_import
    return table


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise ExecutionTimeout


def _format_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == AGENT_FILENAME]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    text = str(exc)
    lines.append(f"{type(exc).__name__}: {text}\n" if text else f"{type(exc).__name__}\n")
    return "".join(lines)


class TaskSession:
    """One task's world, namespace and completion state inside a worker.

    ``execute`` must run on the main thread (the time limit uses ``SIGALRM``).
    """

    def __init__(self, task: CodeTask, *, exec_timeout: float, output_limit: int) -> None:
        if exec_timeout <= 0:
            raise ValueError(f"exec_timeout must be > 0 seconds, got {exec_timeout}")
        if output_limit < 1:
            raise ValueError(f"output_limit must be >= 1 character, got {output_limit}")
        self.task = task
        self.world: World = world_for(task)
        self.executions = 0
        self.completed = False
        self.answer: object = None
        self._exec_timeout = exec_timeout
        self._output_limit = output_limit
        self._namespace: dict[str, object] = {
            "__builtins__": _safe_builtins(),
            "__name__": "__agent__",
            "apps": Apps(self.world),
            "complete_task": self._complete_task,
        }

    def _complete_task(self, answer: object = None) -> None:
        if self.completed:
            raise AppError("complete_task was already called for this task")
        self.completed = True
        self.answer = answer
        print("Task marked as complete.")

    @property
    def success(self) -> bool:
        """The task's programmatic check on the current world and answer."""
        return check(self.task, self.world, completed=self.completed, answer=self.answer)

    def execute(self, code: str) -> ExecutionReport:
        """Run ``code`` in the session's namespace and report what it printed or raised."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("TaskSession.execute must run on the main thread (SIGALRM)")
        self.executions += 1
        lines = code.splitlines(keepends=True)
        linecache.cache[AGENT_FILENAME] = (len(code), None, lines, AGENT_FILENAME)
        buffer = io.StringIO()
        raised = False
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                try:
                    signal.setitimer(signal.ITIMER_REAL, self._exec_timeout)
                    try:
                        compiled = compile(code, AGENT_FILENAME, "exec")
                        exec(compiled, self._namespace)  # running agent code is the point
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                except ExecutionTimeout:
                    raised = True
                    print(
                        f"TimeoutError: the code ran longer than {self._exec_timeout:g} s "
                        "and was stopped",
                        file=buffer,
                    )
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - agent code may raise anything; its error is the observation
                    raised = True
                    buffer.write(_format_error(exc))
        finally:
            signal.signal(signal.SIGALRM, previous)
        output = buffer.getvalue()
        cut = max(0, len(output) - self._output_limit)
        if cut:
            output = output[: self._output_limit]
        return ExecutionReport(output=output, truncated_chars=cut, raised=raised)
