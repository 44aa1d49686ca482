"""``python -m tools.soak.codeworld.worker``: one environment worker process.

An HTTP/1.0 JSON server on a loopback port (``--port 0`` picks a free one), serving **one task
at a time**, the way one container served one task in the original harness. On start it prints
``READY <port>`` on stdout and nothing else afterwards; the pool reads that line.

Endpoints (all ``POST`` with a JSON body, all answering JSON; errors are ``{"error": ...}``
with status 400 for a bad request, 404 for an unknown path, 409 for ``/execute`` or
``/evaluate`` without a task):

* ``/reset {"task_id", "seed", "ledger"?}`` - drop the current task, build the named task's
  world, give it a fresh private temporary directory (the process's working directory) and,
  when ``ledger`` is a path, append to that file one line per execution. Answers
  ``{"task_id", "instruction"}``.
* ``/execute {"code"}`` - run the code in the task's stateful namespace (see ``sandbox``).
  Answers ``{"output", "truncated_chars", "completed", "executions", "success"}``:
  ``completed`` once the code has called ``complete_task``; ``executions`` is the worker's own
  count for this task; ``success`` is the task's check on the world right now.
* ``/evaluate {}`` - ``{"success", "completed", "executions"}``.
* ``/close {}`` - drop the task and remove its temporary directory.
* ``GET /health`` - ``{"ok": true, "task_id": <current or null>}``.

The ledger line is ``execute<TAB><task_id><TAB><sha256 of the code, 16 hex digits>``, written
and fsynced *before* the code runs: it is the environment's own record that an action was
executed, independent of anything polyloop logs, and it has no step number or timestamp so
that a replayed execution produces an identical, detectable line.

Process hygiene: ``resource`` limits are lowered at start (address space 2 GiB, 256 open
files, 64 MiB file size) and a watchdog thread exits the process when its parent dies, so a
crashed driver never leaves workers behind. None of this is a security boundary.

**CPU limit, per execution.** ``RLIMIT_CPU`` counts the CPU seconds of the whole process
lifetime, and a worker serves task after task. A fixed limit would therefore be a budget for
the worker's life: after enough honest executions (say, sixty that each ran into a ten-second
time limit) the kernel would kill it with ``SIGXCPU`` in the middle of an unrelated task - a
false ``env_error``. So at every ``/reset`` and every ``/execute`` the worker moves the soft
limit to the CPU time it has used so far (``getrusage(RUSAGE_SELF)``) plus ``--cpu-margin``
seconds (rounded up to whole seconds, never above the hard limit). The margin is the CPU one
execution may burn; it only matters for code the ``SIGALRM`` time limit cannot interrupt (a
single long call inside C), because everything else stops at ``--exec-timeout``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Final

from tools.soak.codeworld.sandbox import TaskSession
from tools.soak.codeworld.tasks import task_for

__all__ = ["DEFAULT_CPU_MARGIN", "LEDGER_PREFIX", "arm_cpu_limit", "main"]

LEDGER_PREFIX: Final = "execute"
_MAX_BODY: Final = 1 << 20
_LIMITS: Final = (
    (resource.RLIMIT_AS, 2 << 30),
    (resource.RLIMIT_NOFILE, 256),
    (resource.RLIMIT_FSIZE, 64 << 20),
)
DEFAULT_CPU_MARGIN: Final = 60.0
"""CPU seconds one execution (or one reset) may use on top of what the worker used before."""


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def ledger_line(task_id: str, code: str) -> str:
    """The ledger line of one execution (without the newline)."""
    digest = hashlib.sha256(code.encode("utf-8")).hexdigest()[:16]
    return f"{LEDGER_PREFIX}\t{task_id}\t{digest}"


def arm_cpu_limit(margin: float) -> int:
    """Set the soft ``RLIMIT_CPU`` to the CPU seconds used so far plus ``margin`` (rounded up,
    capped by the hard limit) and return it. Lowering or raising a soft limit up to the hard
    one needs no privilege."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    wanted = math.ceil(usage.ru_utime + usage.ru_stime + margin)
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (wanted, hard))
    return wanted


class _State:
    def __init__(self, *, exec_timeout: float, output_limit: int, cpu_margin: float) -> None:
        self.exec_timeout = exec_timeout
        self.output_limit = output_limit
        self.cpu_margin = cpu_margin
        self.session: TaskSession | None = None
        self.ledger: Path | None = None
        self.workdir: str | None = None
        self.home = os.getcwd()

    def close(self) -> None:
        self.session = None
        self.ledger = None
        if self.workdir is not None:
            os.chdir(self.home)
            shutil.rmtree(self.workdir)
            self.workdir = None

    def reset(self, body: dict[str, object]) -> dict[str, object]:
        task_id, seed, ledger = body.get("task_id"), body.get("seed"), body.get("ledger")
        if not isinstance(task_id, str):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "reset: 'task_id' must be a string")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "reset: 'seed' must be an integer")
        if ledger is not None and not isinstance(ledger, str):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "reset: 'ledger' must be a path or null")
        if ledger is not None and not os.path.isabs(ledger):
            raise _BadRequest(
                HTTPStatus.BAD_REQUEST,
                "reset: 'ledger' must be an absolute path (the worker runs each task in its own "
                "temporary working directory, so a relative path would point elsewhere)",
            )
        try:
            task = task_for(seed, task_id)
        except ValueError as exc:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"reset: {exc}") from exc
        self.close()
        arm_cpu_limit(self.cpu_margin)
        self.session = TaskSession(
            task, exec_timeout=self.exec_timeout, output_limit=self.output_limit
        )
        self.ledger = None if ledger is None else Path(ledger)
        self.workdir = tempfile.mkdtemp(prefix="codeworld-")
        os.chdir(self.workdir)
        return {"task_id": task.task_id, "instruction": task.instruction}

    def execute(self, body: dict[str, object]) -> dict[str, object]:
        session = self._session("execute")
        code = body.get("code")
        if not isinstance(code, str):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "execute: 'code' must be a string")
        if self.ledger is not None:
            with open(self.ledger, "a", encoding="utf-8") as handle:
                handle.write(ledger_line(session.task.task_id, code) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        arm_cpu_limit(self.cpu_margin)  # a fresh CPU allowance for this execution
        report = session.execute(code)
        return {
            "output": report.output,
            "truncated_chars": report.truncated_chars,
            "completed": session.completed,
            "executions": session.executions,
            "success": session.success,
        }

    def evaluate(self) -> dict[str, object]:
        session = self._session("evaluate")
        return {
            "success": session.success,
            "completed": session.completed,
            "executions": session.executions,
        }

    def _session(self, what: str) -> TaskSession:
        if self.session is None:
            raise _BadRequest(HTTPStatus.CONFLICT, f"{what}: no task; call /reset first")
        return self.session


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: _WorkerServer

    def log_message(self, format: str, *args: object) -> None:
        """Silence the per-request access log (it would flood the soak's stderr)."""

    def _reply(self, status: HTTPStatus, payload: dict[str, object]) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != "/health":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path!r}"})
            return
        session = self.server.state.session
        task_id = None if session is None else session.task.task_id
        self._reply(HTTPStatus.OK, {"ok": True, "task_id": task_id})

    def do_POST(self) -> None:
        try:
            payload = self._dispatch()
        except _BadRequest as exc:
            self._reply(exc.status, {"error": str(exc)})
            return
        self._reply(HTTPStatus.OK, payload)

    def _dispatch(self) -> dict[str, object]:
        state = self.server.state
        body = self._body()
        if self.path == "/reset":
            return state.reset(body)
        if self.path == "/execute":
            return state.execute(body)
        if self.path == "/evaluate":
            return state.evaluate()
        if self.path == "/close":
            state.close()
            return {"closed": True}
        raise _BadRequest(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}")

    def _body(self) -> dict[str, object]:
        length_text = self.headers.get("Content-Length", "0")
        try:
            length = int(length_text)
        except ValueError as exc:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "Content-Length is not a number") from exc
        if length < 0 or length > _MAX_BODY:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body of {length} bytes refused")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return body


class _WorkerServer(HTTPServer):
    def __init__(self, address: tuple[str, int], state: _State) -> None:
        super().__init__(address, _Handler)
        self.state = state


def _lower_limits() -> None:
    for which, wanted in _LIMITS:
        soft, hard = resource.getrlimit(which)
        cap = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft == resource.RLIM_INFINITY or soft > cap:
            resource.setrlimit(which, (cap, hard))


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.soak.codeworld.worker")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--exec-timeout", type=float, default=10.0)
    parser.add_argument("--output-limit", type=int, default=4000)
    parser.add_argument(
        "--cpu-margin",
        type=float,
        default=DEFAULT_CPU_MARGIN,
        help="CPU seconds each reset or execution may use (the soft RLIMIT_CPU is moved to "
        "the CPU used so far plus this before each)",
    )
    args = parser.parse_args(argv)
    if args.cpu_margin <= 0:
        parser.error(f"--cpu-margin must be > 0 seconds, got {args.cpu_margin}")
    _lower_limits()
    arm_cpu_limit(args.cpu_margin)
    threading.Thread(
        target=_exit_with_parent, args=(os.getppid(),), daemon=True, name="parent-watch"
    ).start()
    state = _State(
        exec_timeout=args.exec_timeout,
        output_limit=args.output_limit,
        cpu_margin=args.cpu_margin,
    )
    server = _WorkerServer((args.host, args.port), state)
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        state.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
