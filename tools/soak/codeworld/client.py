"""The driver's side of the worker protocol (see ``worker`` for the endpoints).

``WorkerSession`` talks to one leased worker. Every way the worker can fail to serve - refused
or dropped connection, timeout, non-2xx status, a body that is not the expected JSON - becomes
a ``WorkerError`` (and marks the worker ``dirty`` so the pool restarts it). Errors *in the agent's
code* are not failures here: they come back as ordinary output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from tools.soak.codeworld.pool import WorkerHandle

__all__ = ["ExecutionResult", "WorkerError", "WorkerSession"]


class WorkerError(Exception):
    """The worker could not serve a request (the environment is broken, not the agent)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionResult:
    """One ``/execute`` answer."""

    output: str
    truncated_chars: int
    completed: bool
    executions: int
    success: bool


class WorkerSession:
    """One task on one leased worker. ``executions`` and ``success`` are the worker's own
    figures from its latest answer (``None`` for ``success`` until the first execution)."""

    def __init__(
        self, *, http: httpx.AsyncClient, handle: WorkerHandle, exec_timeout: float
    ) -> None:
        self._http = http
        self._handle = handle
        self._timeout = exec_timeout + 10.0
        self.executions = 0
        self.success: bool | None = None

    async def reset(self, *, task_id: str, seed: int, ledger: Path | None) -> str:
        """Start ``task_id`` on the worker; returns the task's instruction."""
        body = {"task_id": task_id, "seed": seed, "ledger": None if ledger is None else str(ledger)}
        payload = await self._post("/reset", body)
        instruction = payload.get("instruction")
        if not isinstance(instruction, str):
            raise self._broken("/reset", "the answer has no 'instruction' string")
        self.executions = 0
        self.success = None
        return instruction

    async def execute(self, code: str) -> ExecutionResult:
        payload = await self._post("/execute", {"code": code})
        output, cut = payload.get("output"), payload.get("truncated_chars")
        completed, executions = payload.get("completed"), payload.get("executions")
        success = payload.get("success")
        if (
            not isinstance(output, str)
            or not _is_int(cut)
            or not isinstance(completed, bool)
            or not _is_int(executions)
            or not isinstance(success, bool)
        ):
            raise self._broken("/execute", "the answer is not {output, truncated_chars, ...}")
        assert isinstance(cut, int)
        assert isinstance(executions, int)
        self.executions = executions
        self.success = success
        return ExecutionResult(
            output=output,
            truncated_chars=cut,
            completed=completed,
            executions=executions,
            success=success,
        )

    async def evaluate(self) -> bool:
        payload = await self._post("/evaluate", {})
        success = payload.get("success")
        if not isinstance(success, bool):
            raise self._broken("/evaluate", "the answer has no boolean 'success'")
        self.success = success
        return success

    async def close(self) -> None:
        await self._post("/close", {})

    async def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        url = self._handle.url + path
        try:
            response = await self._http.post(url, json=body, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise self._broken(path, f"{type(exc).__name__}: {exc}") from exc
        if response.is_error:
            raise self._broken(path, f"status {response.status_code}: {response.text[:500]}")
        try:
            payload = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self._broken(path, f"the body is not JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise self._broken(path, "the body is not a JSON object")
        return payload

    def _broken(self, path: str, problem: str) -> WorkerError:
        self._handle.dirty = True
        return WorkerError(f"environment worker {self._handle.index} failed on {path}: {problem}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
