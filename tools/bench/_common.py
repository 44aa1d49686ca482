"""The shared workload and the measuring helpers of the benchmarks.

The workload: a model that asks for one no-op tool call per step (``NoopModel``), a parser
that turns that reply into an ``Action`` (``NoopParser``), a ``RegistryExecutor`` over one
no-op tool (``noop_registry().executor()``) and the stock sink that drops events
(``polyloop.sinks.NullEventSink``). A run of N steps stops with ``StopReason.STEP_BUDGET``
after exactly N model calls and N actions. The seams are deliberately cheaper than any real
one (the model's reply and the parser's verdict are built once and returned every time), so
the time measured is the library's. That is also why the model is not the public
``polyloop.testing.ScriptedModelClient``: it builds a reply and keeps the ``ModelCall`` of every
call, which the µs/step and peak-RSS figures would measure too.

What a reader would otherwise get wrong:

* ``FsyncMeter`` replaces ``os.fsync`` *in this process* for the duration of a ``with`` block.
  The JSONL store calls ``os.fsync`` from worker threads, so the meter counts under a lock and
  sums the wall time spent inside the real ``fsync``. "µs/step excluding fsync" subtracts that
  sum from the run's wall time: with one run at a time, the event loop is idle exactly while a
  worker thread sits in ``fsync``. It also sums the CPU time of the calling thread inside
  ``fsync`` (``time.thread_time``), so that "CPU µs/step beyond fsync" can subtract it from the
  process's CPU time (``time.process_time``, every thread). The two figures differ by the time
  the process sits idle waiting for a thread to wake (a worker, or the loop after the worker):
  wall time, not CPU.
* ``NoopModel(yield_to_loop=True)`` awaits ``asyncio.sleep(0)`` once per call, the cheapest
  stand-in for a network round trip. Without it a run never suspends (the volatile store does
  not await anything real), so "1000 concurrent runs" would run one after the other.
* Peak RSS is ``ru_maxrss`` of the process, a high-water mark that never goes down: measure
  each size in a fresh process (``many_runs`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from polyloop.ports import (
    Action,
    InvalidDecision,
    ModelCall,
    ParsedReply,
    RunStore,
    ToolCall,
)
from polyloop.session import AgentDefinition, RunRequest
from polyloop.sinks import NullEventSink
from polyloop.tools import RegistryExecutor, ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    SyntheticObservations,
    TextBlock,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench-results"
DEFAULT_DISK_DIR = RESULTS_DIR / "tmp"
SHM_DIR = Path("/dev/shm")

REPLY_TEXT = "call noop"
TOOL_NAME = "noop"
OBSERVATION = "ok"

TEXTS = SyntheticObservations(
    action_rejected="[action rejected]",
    env_failed="[environment failed]",
    model_call_failed="[model call failed]",
)
CONTEXT = Context(
    run_level=(
        Message(
            role=Role.USER,
            content=(TextBlock(text="You are a benchmark agent. Reply 'call noop' each turn."),),
        ),
    ),
    goal_level=(
        Message(role=Role.USER, content=(TextBlock(text="Call noop until the budget ends."),)),
    ),
)


# --------------------------------------------------------------------------- the workload


@dataclass
class NoopModel:
    """A ``ModelClient`` that always asks for the no-op tool.

    ``capture`` keeps every ``ModelCall`` (for the prompt-assembly benchmark); ``on_call`` is
    called with each call before it returns (for sampling counters at given steps).
    """

    yield_to_loop: bool = False
    capture: bool = False
    on_call: Callable[[ModelCall], None] | None = None
    calls: list[ModelCall] = field(default_factory=list)
    _reply: ModelReply = field(
        default_factory=lambda: ModelReply(call_id=None, content=REPLY_TEXT, thinking="")
    )

    async def call(self, call: ModelCall) -> ModelReply:
        if self.yield_to_loop:
            await asyncio.sleep(0)
        if self.capture:
            self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        return self._reply

    def parameters(self) -> Mapping[str, str]:
        return {"model": "bench-noop"}


class NoopParser:
    """A ``DecisionParser`` that knows one reply: ``"call noop"`` is an action, anything else
    is an ``InvalidDecision``. Both verdicts are built once."""

    def __init__(self) -> None:
        call = ToolCall(name=TOOL_NAME, arguments=MappingProxyType({}))
        self._action = ParsedReply(
            history_text=REPLY_TEXT, decision=Action(text=REPLY_TEXT, tool_call=call)
        )
        self._invalid = ParsedReply(
            history_text="", decision=InvalidDecision(explanation="reply 'call noop'")
        )

    def parse(self, reply: ModelReply) -> ParsedReply:
        return self._action if reply.content == REPLY_TEXT else self._invalid

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "bench-noop"}


async def _noop_handler(arguments: Mapping[str, object], /) -> str:
    return OBSERVATION


def noop_registry() -> ToolRegistry:
    """One tool, ``noop``: no arguments, returns ``"ok"``, ``SAFE`` to replay (so resuming
    an interrupted run replays its last action instead of stopping)."""
    return ToolRegistry(
        [
            ToolSpec(
                name=TOOL_NAME,
                description="Does nothing and says ok.",
                parameters={"type": "object", "properties": {}},
                handler=_noop_handler,
                replay_policy=ReplayPolicy.SAFE,
            )
        ]
    )


@dataclass(frozen=True)
class Workload:
    """A registry and its executor, built once and shared by every run of a benchmark."""

    registry: ToolRegistry
    executor: RegistryExecutor

    @classmethod
    def build(cls) -> Workload:
        registry = noop_registry()
        return cls(registry=registry, executor=registry.executor())

    def definition(self, store: RunStore, model: NoopModel | None = None) -> AgentDefinition:
        return AgentDefinition(
            model_client=model if model is not None else NoopModel(),
            decision_parser=NoopParser(),
            store=store,
            event_sink=NullEventSink(),
            synthetic_observations=TEXTS,
        )

    def request(self, run_id: str, steps: int) -> RunRequest:
        """A request whose run stops with ``STEP_BUDGET`` after exactly ``steps`` steps."""
        return RunRequest(
            run_id=run_id,
            budget=Budget(
                max_steps=steps,
                max_actions=steps,
                max_consecutive_parse_failures=3,
                max_prompt_chars=1_000_000_000,
            ),
            action_executor=self.executor,
            tools=self.registry,
            context=CONTEXT,
            model_replay_policy=ReplayPolicy.SAFE,
            observation_template="Observation: {observation}",
        )


# --------------------------------------------------------------------------- measuring


class FsyncMeter:
    """Counts ``os.fsync`` calls and the time spent in them, while installed: every sync of
    the JSONL store on Linux (design 0219). Where the store syncs with ``F_FULLFSYNC``
    (macOS) its syncs are not seen."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self._lock = threading.Lock()
        self._real: Callable[[Any], None] | None = None

    def _fsync(self, descriptor: Any) -> None:
        real = self._real
        assert real is not None
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:
            real(descriptor)
        finally:
            elapsed = time.perf_counter() - started
            elapsed_cpu = time.thread_time() - started_cpu
            with self._lock:
                self.count += 1
                self.seconds += elapsed
                self.cpu_seconds += elapsed_cpu

    def snapshot(self) -> tuple[int, float]:
        with self._lock:
            return self.count, self.seconds

    def cpu_snapshot(self) -> float:
        """CPU seconds spent inside ``fsync`` so far (the calling threads' ``thread_time``)."""
        with self._lock:
            return self.cpu_seconds

    @contextmanager
    def installed(self) -> Iterator[FsyncMeter]:
        self._real = os.fsync
        os.fsync = self._fsync  # type: ignore[assignment]  # same call shape as os.fsync
        try:
            yield self
        finally:
            os.fsync = self._real
            self._real = None


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def peak_rss_kib() -> int:
    """Peak resident set size of this process in KiB (``ru_maxrss`` is KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak // 1024) if sys.platform == "darwin" else int(peak)


def current_rss_kib() -> int:
    """Current resident set size in KiB (Linux ``/proc``; falls back to the peak elsewhere)."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return peak_rss_kib()
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


# --------------------------------------------------------------------------- machine


def filesystem_of(path: Path) -> str:
    """The file system type of the mount holding ``path`` (``/proc/mounts``), or ``unknown``."""
    target = path.resolve()
    best, best_type = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best_type
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        inside = str(target) == mount_point or str(target).startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, best_type = mount_point, parts[2]
    return best_type


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # no /proc: fall back to what platform knows
    return platform.processor() or "unknown"


def machine_info(disk_dir: Path | None = None) -> dict[str, object]:
    info: dict[str, object] = {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }
    if disk_dir is not None:
        info["disk_dir"] = str(disk_dir)
        info["disk_filesystem"] = filesystem_of(disk_dir)
    return info


# --------------------------------------------------------------------------- output


def argument_parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m tools.bench.{name}", description=description)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, a few seconds (keeps the bench working)"
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        default=RESULTS_DIR / f"{name}.json",
        help=f"where to write the JSON results (default: bench-results/{name}.json)",
    )
    return parser


def add_disk_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--disk-dir",
        type=Path,
        default=DEFAULT_DISK_DIR,
        help="directory on the real disk for JSONL logs (default: bench-results/tmp)",
    )


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [
        max(len(header), *(len(row[index]) for row in cells)) if cells else len(header)
        for index, header in enumerate(headers)
    ]
    print(f"\n{title}")
    print("  ".join(header.rjust(width) for header, width in zip(headers, widths, strict=True)))
    print("  ".join("-" * width for width in widths))
    for row in cells:
        print("  ".join(value.rjust(width) for value, width in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def command_line(name: str, argv: Sequence[str]) -> str:
    return " ".join(["python", "-m", f"tools.bench.{name}", *argv])


def results_envelope(
    name: str,
    argv: Sequence[str] | None,
    *,
    quick: bool,
    rows: list[dict[str, Any]],
    disk_dir: Path | None = None,
    **extra: object,
) -> dict[str, Any]:
    """The JSON document every benchmark writes: what ran, how, where, and its rows."""
    return {
        "benchmark": name,
        "command": command_line(name, sys.argv[1:] if argv is None else argv),
        "quick": quick,
        "machine": machine_info(disk_dir),
        **extra,
        "results": rows,
    }
