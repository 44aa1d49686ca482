"""The per-run files both writers (``run_soak``, ``faults``) produce and the scoreboard reads.

The fields are defined once, in the ``scoreboard`` module docstring; this module holds the
names and the writing code so that writers and reader cannot drift apart:

* ``<run_id>.jsonl``        - the library's log (``JsonlRunStore``); the harness never writes it;
* ``<run_id>.result.json``  - the ``RunResult`` the process got back, encoded with
  ``polyloop.serialization.encode`` (missing when the run raised or the process died);
* ``<run_id>.events.jsonl`` - one line per event the sink accepted *in the process that wrote
  the meta* (a resumed run starts it afresh), ``{"kind", "run_id", "step_idx"}``;
* ``<run_id>.meta.json``    - exactly ``META_KEYS``.

Sidecars are written to a temporary name and renamed into place, so a reader never sees half
a file.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from polyloop.ports import Event
from polyloop.serialization import encode
from polyloop.types import RunResult

__all__ = [
    "CLUSTER_FAULT_CLASSES",
    "EVENTS_SUFFIX",
    "FAULT_CLASSES",
    "KNOWN_PHASES",
    "KNOWN_SCENARIOS",
    "LOG_SUFFIX",
    "META_KEYS",
    "META_SUFFIX",
    "RESULT_SUFFIX",
    "EventFileSink",
    "Meta",
    "artifact_path",
    "run_ids_in",
    "write_json_atomic",
    "write_meta",
    "write_result",
]

LOG_SUFFIX: Final = ".jsonl"
RESULT_SUFFIX: Final = ".result.json"
EVENTS_SUFFIX: Final = ".events.jsonl"
META_SUFFIX: Final = ".meta.json"
META_KEYS: Final = (
    "scenario",
    "task_id",
    "phase",
    "wall_ms",
    "model_calls",
    "sink_failures",
    "env_executions",
    "fault",
    "success",
    "resumed_from_step",
)
KNOWN_SCENARIOS: Final = frozenset({"code", "review"})
"""Values of ``meta.scenario`` a report may print (anything else is reported as "other")."""
KNOWN_PHASES: Final = frozenset({"plan", "execute", "summarize"})
FAULT_CLASSES: Final = (
    "crash_a",
    "crash_b",
    "cancel_model",
    "cancel_env",
    "step_budget",
    "action_budget",
    "parse_storm",
    "prompt_limit",
    "env_fault",
)
"""The nine fault classes of ``tools.soak.faults`` (the values of ``meta.fault``)."""
CLUSTER_FAULT_CLASSES: Final = ("cluster",)
"""Fault classes that need Ray (``tools.soak.faults --only cluster``); not run by default."""


def artifact_path(runs_dir: Path, run_id: str, suffix: str) -> Path:
    return runs_dir / f"{run_id}{suffix}"


def run_ids_in(runs_dir: Path) -> list[str]:
    """Run ids that have a log in ``runs_dir``, sorted (the set of runs is the set of logs)."""
    ids = []
    for path in runs_dir.iterdir():
        name = path.name
        if name.endswith(LOG_SUFFIX) and not name.endswith(EVENTS_SUFFIX) and path.is_file():
            ids.append(name[: -len(LOG_SUFFIX)])
    return sorted(ids)


def write_json_atomic(path: Path, payload: object) -> None:
    """Write ``payload`` as JSON to a temporary sibling, then rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(
        json.dumps(payload, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    os.replace(temporary, path)


@dataclass(frozen=True, slots=True, kw_only=True)
class Meta:
    """The ``.meta.json`` of one run (see the scoreboard docstring for each field)."""

    scenario: str
    task_id: str
    phase: str | None
    wall_ms: int
    model_calls: int
    sink_failures: int
    env_executions: int
    fault: str | None
    success: bool | None
    resumed_from_step: int

    def as_json(self) -> dict[str, object]:
        payload: dict[str, object] = {key: getattr(self, key) for key in META_KEYS}
        return payload


def write_meta(runs_dir: Path, run_id: str, meta: Meta) -> None:
    write_json_atomic(artifact_path(runs_dir, run_id, META_SUFFIX), meta.as_json())


def write_result(runs_dir: Path, run_id: str, result: RunResult) -> None:
    write_json_atomic(artifact_path(runs_dir, run_id, RESULT_SUFFIX), encode(result))


class EventFileSink:
    """An ``EventSink`` that appends one JSON line per event to ``<run_id>.events.jsonl``.

    It counts its own failures (``failures``) in its own ``except`` and re-raises, so the
    library counts them too (``RunResult.event_delivery_failures``); the scoreboard compares
    the two numbers, which are computed by different code. ``parameters()`` leaves the path
    out (moving the runs directory must not be drift).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self.failures = 0
        self.delivered = 0

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "soak_events_file"}

    async def emit(self, event: Event) -> None:
        line = json.dumps(
            {"kind": event.kind.value, "run_id": event.run_id, "step_idx": event.step.step_idx}
        )
        try:
            await asyncio.to_thread(_append_line, self._path, line)
        except OSError:
            self.failures += 1
            raise
        self.delivered += 1


def _append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
