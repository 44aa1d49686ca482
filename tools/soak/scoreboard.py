"""``python -m tools.soak.scoreboard``: judge a runs directory by structural invariants.

::

    python -m tools.soak.scoreboard --runs-dir PATH --report PATH \\
        [--completing-tool NAME ...] [--allow-undetermined]

**The per-run files** (this docstring is their one definition; the names are in
``tools.soak._artifacts``). The set of runs is the set of logs; a missing sidecar is an
observation ("undetermined"), never a crash and never a pass.

``<run_id>.jsonl``
    The library's log, written only by ``JsonlRunStore``: one JSON record per line, tagged by
    ``"record"`` (``run_started``, ``intent``, ``model_call_result``, ``step_completed``,
    ``run_finished``). It embeds the parameter snapshot and the final result.
``<run_id>.result.json``
    The ``RunResult`` the driving process got back, encoded like the log's (``run_id``,
    ``stop_reason``, ``final_answer``, ``steps``, ``event_delivery_failures``,
    ``schema_version``). Missing when the run raised, was cancelled or its process died.
``<run_id>.events.jsonl``
    One line ``{"kind": "step_finished", "run_id", "step_idx"}`` per event the sink accepted
    in the process that wrote the meta (a resumed run starts it afresh). Missing when that
    process delivered no event.
``<run_id>.meta.json``
    Exactly these keys: ``scenario`` (``"code"``/``"review"``), ``task_id`` (str), ``phase``
    (``"plan"``/``"execute"``/``"summarize"`` or null), ``wall_ms`` (int), ``model_calls``
    (int, attempts in that process), ``sink_failures`` (int, the sink's own count of failed
    deliveries), ``env_executions`` (int, the environment's own count of executed actions),
    ``fault`` (null, or the fault class that produced the run), ``success`` (bool from the
    scenario's programmatic check, or null), ``resumed_from_step`` (int, steps already in
    the log when that process took over; 0 for a run that was not resumed).

**The eleven checks**, each judged per run with three outcomes (see ``_verdict``). The two
structural ones are exactly what ``python -m polyloop verify`` runs, through the same library
functions (``polyloop.stores.decode_line`` and ``polyloop.session.check_log``), so the
scoreboard and ``verify`` give the same verdict on every log (a test binds it on fault runs and
on logs broken on purpose):

1. ``lines_decode`` - every complete (newline-terminated) line of the log decodes to a
   record by the store's own line codec; an unterminated last line is a write that never
   completed and is ignored.
2. ``log_consistent`` - ``check_log``, the check ``resume`` runs before trusting a log: one
   start first, records in write order, step records numbered 0, 1, 2 ..., every result after
   its intent, at most one intent unanswered and only as the last execution (then followed by
   nothing, or by a finish whose stop reason is ``cancelled``, or ``resume_state_unknown`` for
   a ``NEVER`` intent, or ``action_timeout``/``parser_error`` for an action intent), one
   finish listing exactly the logged steps, every record of this run.
3. ``result_matches_log`` - ``.result.json``, read in this process, equals the finish record
   field by field.
4. ``step_outcome_consistent`` - inside each step record the action status, observation,
   synthetic flag and truncation count agree with the action outcome (or, without an
   action, with the parse error, the failed model call or the final answer), using the
   synthetic texts recorded in the run's snapshot.
5. ``events_match_steps`` - delivered events plus failed deliveries equal the steps completed
   by the process that wrote the meta, with the right step numbers. A process that completed
   no step but delivered (or failed to deliver) an event is a breach; no step and no event
   leaves nothing to compare: undetermined.
6. ``sink_failures_match`` - ``meta.sink_failures`` (counted by the sink) equals
   ``result.event_delivery_failures`` (counted by the library).
7. ``no_cross_talk`` - every event and the result file name the run of their files (the log's
   records are ``log_consistent``'s); no event and no result leaves nothing to compare.
8. ``completion_has_evidence`` - a ``task_completed`` run's last step is an executed action
   that the environment reported complete, or a call of a ``--completing-tool``.
9. ``step_budget_at_cap`` - a ``step_budget`` run has exactly ``max_steps`` steps.
10. ``final_answer_nonempty`` - a ``final_answer`` run ends with a parsed step without an
    action and a non-blank answer.
11. ``prompt_chars_monotonic`` - each step's prompt is the previous prompt plus the previous
    step's turn (its output and its rendered observation): never smaller, never cut. Fewer
    than two steps leave nothing to compare: undetermined.

A check that applies to no run (no run stopped on the step budget, say) is **undetermined**
("not exercised: applies to 0 of the N runs"): it judged nothing, so it cannot pass, and a
strict scoreboard over a batch that never took that path is not green. The report also counts
stop reasons and step quantiles per scenario and lists the stop reasons that never occurred -
a path that never ran was never verified.

**The sentinel rule.** Reports hold only counts, enum values, run ids, line and step numbers;
everything else - tool names, model output, observations, task ids, snapshot values - appears
as a length at most. (An invalid tool call stores whatever name the model invented, which
could be a passage of a document.)

**Exit status:** 0 passed; 1 at least one breach; 3 no breach but something undetermined
(0 with ``--allow-undetermined``); 2 for a bad command line. A directory without runs is
undetermined: a batch that verified nothing must not look green.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from polyloop.errors import LogCorruptError
from polyloop.inspect import load_target, render_html
from polyloop.serialization import DecodeError, decode_run_result
from polyloop.session import check_log
from polyloop.stores import assemble_log, decode_line
from polyloop.types import (
    ActionStatus,
    Intent,
    ModelCallResult,
    RunFinished,
    RunResult,
    RunStarted,
    StepCompleted,
    StopReason,
)
from tools.soak._artifacts import (
    CLUSTER_FAULT_CLASSES,
    EVENTS_SUFFIX,
    FAULT_CLASSES,
    KNOWN_SCENARIOS,
    LOG_SUFFIX,
    META_KEYS,
    META_SUFFIX,
    RESULT_SUFFIX,
    run_ids_in,
)
from tools.soak._verdict import Evidence, Verdict, combine

__all__ = [
    "CHECK_NAMES",
    "EXIT_BREACHED",
    "EXIT_PASSED",
    "EXIT_UNDETERMINED",
    "EXIT_USAGE",
    "Board",
    "CheckResult",
    "Evidence",
    "RunSummary",
    "Verdict",
    "evaluate",
    "main",
    "render_report",
]

CHECK_NAMES: Final = (
    "lines_decode",
    "log_consistent",
    "result_matches_log",
    "step_outcome_consistent",
    "events_match_steps",
    "sink_failures_match",
    "no_cross_talk",
    "completion_has_evidence",
    "step_budget_at_cap",
    "final_answer_nonempty",
    "prompt_chars_monotonic",
)
EXIT_PASSED: Final = 0
EXIT_BREACHED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNDETERMINED: Final = 3

Record = RunStarted | Intent | ModelCallResult | StepCompleted | RunFinished
_META_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "scenario": (str,),
    "task_id": (str,),
    "phase": (str, type(None)),
    "wall_ms": (int,),
    "model_calls": (int,),
    "sink_failures": (int,),
    "env_executions": (int,),
    "fault": (str, type(None)),
    "success": (bool, type(None)),
    "resumed_from_step": (int,),
}
_TOOL_CALL_PREFIX: Final = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\(")
_SHOWN_PASSES: Final = 5


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """One check over every run: the evidence for each outcome, and how many runs it did not
    apply to. ``verdict`` is computed from the evidence."""

    name: str
    passes: tuple[Evidence, ...]
    breaches: tuple[Evidence, ...]
    undetermined: tuple[Evidence, ...]
    not_applicable: int = 0

    def __post_init__(self) -> None:
        if not (self.passes or self.breaches or self.undetermined):
            raise ValueError(
                f"CheckResult {self.name!r} has no evidence at all; a check that judged "
                "nothing must say so in an undetermined evidence"
            )

    @property
    def verdict(self) -> Verdict:
        if self.breaches:
            return Verdict.BREACHED
        if self.undetermined:
            return Verdict.UNDETERMINED
        return Verdict.PASSED


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """One run as the report counts it (values already reduced to report-safe forms)."""

    run_id: str
    scenario: str
    stop_reason: str | None
    steps: int
    fault: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Board:
    """Every check's result plus one summary per run."""

    checks: tuple[CheckResult, ...]
    summaries: tuple[RunSummary, ...]

    @property
    def verdict(self) -> Verdict:
        return combine(check.verdict for check in self.checks)

    @property
    def breached(self) -> list[CheckResult]:
        return [c for c in self.checks if c.verdict is Verdict.BREACHED]

    @property
    def undetermined(self) -> list[CheckResult]:
        return [c for c in self.checks if c.verdict is Verdict.UNDETERMINED]


# --------------------------------------------------------------------------- loading


@dataclass(slots=True)
class _Run:
    run_id: str
    records: list[tuple[int, Record]] = field(default_factory=list)
    complete_lines: int = 0
    decode_errors: list[tuple[int, str]] = field(default_factory=list)
    torn_bytes: int = 0
    meta: dict[str, object] | None = None
    meta_problem: str | None = None
    result: RunResult | None = None
    result_problem: str | None = None
    events: list[dict[str, object]] | None = None
    events_problem: tuple[int, str] | None = None

    @property
    def decodes(self) -> bool:
        return not self.decode_errors and self.complete_lines > 0

    def of(self, kind: type[Record]) -> list[tuple[int, Record]]:
        return [(line, record) for line, record in self.records if isinstance(record, kind)]

    @property
    def started(self) -> RunStarted | None:
        found = [record for _, record in self.of(RunStarted)]
        return found[-1] if found else None  # type: ignore[return-value]

    @property
    def finished(self) -> tuple[int, RunFinished] | None:
        found = self.of(RunFinished)
        return found[-1] if found else None  # type: ignore[return-value]

    @property
    def steps(self) -> list[tuple[int, StepCompleted]]:
        return self.of(StepCompleted)  # type: ignore[return-value]

    @property
    def stop_reason(self) -> StopReason | None:
        finished = self.finished
        return None if finished is None else finished[1].result.stop_reason


def _decode_line(line: bytes, *, run_id: str, number: int) -> Record | str:
    """The record of one line, or a fixed description of why it does not decode.

    Decoding is the store's own (``polyloop.stores.decode_line``), so the scoreboard accepts
    exactly the lines ``JsonlRunStore.read_log`` and ``python -m polyloop verify`` accept. The
    description is fixed wording (the sentinel rule): the ``DecodeError`` text quotes the line.
    """
    try:
        return decode_line(line, run_id=run_id, line_number=number)
    except LogCorruptError:
        return "its checksum does not match (LogCorruptError)"
    except DecodeError as exc:
        causes = []
        cause = exc.__cause__
        while cause is not None:
            causes.append(cause)
            cause = cause.__cause__
        if any(isinstance(c, UnicodeDecodeError) for c in causes):
            return "not UTF-8"
        if any(isinstance(c, json.JSONDecodeError) for c in causes):
            return "not JSON"
        return "not a record this library writes (DecodeError)"


def _load_log(run: _Run, raw: bytes) -> None:
    lines = raw.split(b"\n")
    run.torn_bytes = len(lines[-1])
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        run.complete_lines += 1
        decoded = _decode_line(line, run_id=run.run_id, number=number)
        if isinstance(decoded, str):
            run.decode_errors.append((number, decoded))
        else:
            run.records.append((number, decoded))


def _load_meta(run: _Run, path: Path) -> None:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (UnicodeDecodeError, json.JSONDecodeError):
        run.meta_problem = "the .meta.json is not JSON"
        return
    if not isinstance(payload, dict) or set(payload) != set(META_KEYS):
        run.meta_problem = "the .meta.json does not have exactly the meta keys"
        return
    for key, types in _META_TYPES.items():
        value = payload[key]
        wrong = not isinstance(value, types) or (bool not in types and isinstance(value, bool))
        if wrong or (isinstance(value, int) and not isinstance(value, bool) and value < 0):
            run.meta_problem = f"meta field {key} has the wrong type or a negative value"
            return
    run.meta = payload


def _load_result(run: _Run, path: Path) -> None:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (UnicodeDecodeError, json.JSONDecodeError):
        run.result_problem = "the .result.json is not JSON"
        return
    if not isinstance(payload, dict):
        run.result_problem = "the .result.json is not a JSON object"
        return
    try:
        run.result = decode_run_result(payload)
    except DecodeError:
        run.result_problem = "the .result.json does not decode to a RunResult"


def _load_events(run: _Run, path: Path) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except UnicodeDecodeError:
        run.events_problem = (0, "the events file is not UTF-8")
        run.events = []
        return
    events: list[dict[str, object]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            payload = json.loads(line)
        except json.JSONDecodeError:
            run.events_problem = (number, "not JSON")
            break
        if (
            not isinstance(payload, dict)
            or payload.get("kind") != "step_finished"
            or not isinstance(payload.get("run_id"), str)
            or not isinstance(payload.get("step_idx"), int)
            or isinstance(payload.get("step_idx"), bool)
        ):
            run.events_problem = (number, "not a step_finished event")
            break
        events.append(payload)
    run.events = events


def _load(runs_dir: Path, run_id: str) -> _Run:
    run = _Run(run_id=run_id)
    _load_log(run, (runs_dir / f"{run_id}{LOG_SUFFIX}").read_bytes())
    _load_meta(run, runs_dir / f"{run_id}{META_SUFFIX}")
    _load_result(run, runs_dir / f"{run_id}{RESULT_SUFFIX}")
    _load_events(run, runs_dir / f"{run_id}{EVENTS_SUFFIX}")
    return run


# --------------------------------------------------------------------------- judgements


@dataclass(frozen=True, slots=True)
class _Judgement:
    verdict: Verdict | None  # None: the check does not apply to this run
    evidence: tuple[Evidence, ...] = ()


_NOT_APPLICABLE: Final = _Judgement(None)


def _passed(run: _Run, detail: str, where: str = "") -> _Judgement:
    return _Judgement(Verdict.PASSED, (Evidence(run_id=run.run_id, where=where, detail=detail),))


def _breached(run: _Run, *found: tuple[str, str]) -> _Judgement:
    return _Judgement(
        Verdict.BREACHED,
        tuple(Evidence(run_id=run.run_id, where=where, detail=detail) for where, detail in found),
    )


def _undetermined(run: _Run, detail: str, where: str = "") -> _Judgement:
    return _Judgement(
        Verdict.UNDETERMINED, (Evidence(run_id=run.run_id, where=where, detail=detail),)
    )


def _needs_log(run: _Run) -> _Judgement | None:
    if run.decode_errors:
        return _undetermined(run, "the log does not decode (see lines_decode)")
    if run.started is None:
        return _undetermined(run, "the log has no run_started record")
    return None


def _check_lines_decode(run: _Run, _tools: frozenset[str]) -> _Judgement:
    if run.decode_errors:
        return _breached(
            run,
            *(
                (f"line {line}", f"a complete line does not decode ({why})")
                for line, why in run.decode_errors
            ),
        )
    if run.complete_lines == 0:
        return _undetermined(run, "the log holds no complete line")
    torn = (
        f"; an unterminated tail of {run.torn_bytes} bytes is ignored (a write that never "
        "completed)"
        if run.torn_bytes
        else ""
    )
    return _passed(run, f"{run.complete_lines} complete lines decode{torn}")


_QUOTED: Final = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _report_safe(detail: str) -> str:
    """``detail`` with every quoted value (a run id, a result id from the log) replaced by its
    length, so a breach found by ``check_log`` obeys the sentinel rule."""
    return _QUOTED.sub(lambda match: f"<{len(match.group()) - 2} chars>", detail)


def _check_log_consistent(run: _Run, _tools: frozenset[str]) -> _Judgement:
    """``polyloop.session.check_log``: the structural check ``resume`` and ``verify`` share."""
    if run.decode_errors:
        return _undetermined(run, "the log does not decode (see lines_decode)")
    if not run.records:
        return _undetermined(run, "the log holds no record")
    log = assemble_log(
        (record for _, record in run.records), lines=(line for line, _ in run.records)
    )
    breach = check_log(log, run.run_id)
    if breach is not None:
        where = "" if breach.line is None else f"line {breach.line}"
        return _breached(run, (where, f"check_log: {_report_safe(breach.detail)}"))
    answered = {r.result_id for _, r in run.of(ModelCallResult)} | {  # type: ignore[union-attr]
        r.result_id
        for _, r in run.of(StepCompleted)  # type: ignore[union-attr]
    }
    intents = run.of(Intent)
    open_lines = [line for line, i in intents if i.result_id not in answered]  # type: ignore[union-attr]
    steps = len(run.steps)
    if not open_lines:
        state = f"{len(intents)} intents, every one answered"
    else:
        reason = run.stop_reason
        ending = "the last record" if reason is None else f"before the finish ({reason.value})"
        state = (
            f"{len(intents)} intents; the one unanswered intent (line {open_lines[0]}) is {ending}"
        )
    return _passed(
        run,
        f"{len(run.records)} records in write order, {steps} contiguous steps, {state}",
    )


def _check_result_matches_log(run: _Run, _tools: frozenset[str]) -> _Judgement:
    blocked = _needs_log(run)
    if blocked is not None:
        return blocked
    if run.result_problem is not None:
        return _breached(run, ("", run.result_problem))
    finished = run.finished
    if finished is None:
        return _undetermined(run, "the log has no finish record (the run did not end)")
    if run.result is None:
        return _undetermined(run, "no .result.json (the run raised or its process died)")
    logged, read = finished[1].result, run.result
    differing = [
        name
        for name in ("run_id", "stop_reason", "final_answer", "steps", "event_delivery_failures")
        if getattr(logged, name) != getattr(read, name)
    ]
    if differing:
        return _breached(
            run,
            (f"line {finished[0]}", f"the .result.json differs in {', '.join(differing)}"),
        )
    return _passed(
        run,
        f"the .result.json equals the finish record ({len(read.steps)} steps, "
        f"{read.stop_reason.value})",
        f"line {finished[0]}",
    )


def _check_step_outcome_consistent(run: _Run, _tools: frozenset[str]) -> _Judgement:
    blocked = _needs_log(run)
    if blocked is not None:
        return blocked
    started = run.started
    assert started is not None
    snapshot = started.parameter_snapshot
    texts = {
        ActionStatus.NOT_EXECUTED: snapshot.get("synthetic_observations.action_rejected"),
        ActionStatus.ENV_ERROR: snapshot.get("synthetic_observations.env_failed"),
    }
    failed_text = snapshot.get("synthetic_observations.model_call_failed")
    if None in texts.values() or failed_text is None:
        return _undetermined(run, "the snapshot lacks the synthetic observation texts")
    last_model: ModelCallResult | None = None
    found = []
    with_action = 0
    for line, record in run.records:
        if isinstance(record, ModelCallResult):
            last_model = record
            continue
        if not isinstance(record, StepCompleted):
            continue
        step, outcome = record.step, record.action_outcome
        where = f"step {step.step_idx} (line {line})"
        problems = []
        if outcome is not None:
            with_action += 1
            if step.action is None or step.action_status is not outcome.status:
                problems.append("action status")
            if step.observation_truncated_chars != outcome.observation_truncated_chars:
                problems.append("truncation count")
            if outcome.status is ActionStatus.EXECUTED:
                if step.observation != outcome.observation:
                    problems.append("observation")
                if step.observation_is_synthetic != outcome.observation_is_synthetic:
                    problems.append("synthetic flag")
            elif step.observation != texts[outcome.status] or not step.observation_is_synthetic:
                problems.append("synthetic observation")
        elif step.action is not None:
            problems.append("an action without an outcome")
        elif not step.parse_ok:
            if step.observation != step.parse_error or not step.observation_is_synthetic:
                problems.append("parse error and observation")
        elif last_model is not None and last_model.reply is None:
            if (
                step.observation != failed_text
                or not step.observation_is_synthetic
                or step.raw_output
            ):
                problems.append("failed model call and observation")
        elif step.observation or step.observation_is_synthetic:
            problems.append("final answer and observation")
        if problems:
            found.append((where, f"step record and outcome differ in: {', '.join(problems)}"))
    if found:
        return _breached(run, *found)
    total = len(run.steps)
    return _passed(run, f"{total} step records agree with their outcomes ({with_action} actions)")


def _check_events_match_steps(run: _Run, _tools: frozenset[str]) -> _Judgement:
    blocked = _needs_log(run)
    if blocked is not None:
        return blocked
    if run.meta_problem is not None:
        return _breached(run, ("", run.meta_problem))
    if run.meta is None:
        return _undetermined(run, "no .meta.json (the process that ran it did not finish)")
    resumed = run.meta["resumed_from_step"]
    failures = run.meta["sink_failures"]
    assert isinstance(resumed, int)
    assert isinstance(failures, int)
    total = len(run.steps)
    in_process = total - resumed
    if in_process < 0:
        return _breached(
            run, ("", f"meta says the run resumed from step {resumed}, the log has {total}")
        )
    if run.events_problem is not None:
        line, why = run.events_problem
        return _breached(run, (f"event line {line}", f"does not decode ({why})"))
    events = run.events or []
    if in_process == 0:
        if events or failures:
            return _breached(
                run,
                (
                    "",
                    f"{len(events)} events + {failures} failed deliveries, but the process that "
                    f"wrote the meta completed no step (log {total}, resumed from {resumed})",
                ),
            )
        return _undetermined(
            run,
            "no step completed in the process that wrote the meta and no event was delivered: "
            "nothing to compare",
        )
    indices = [int(str(event["step_idx"])) for event in events]
    expected = range(resumed, total)
    found = []
    if len(events) + failures != in_process:
        found.append(
            (
                "",
                f"{len(events)} events + {failures} failed deliveries != {in_process} steps "
                f"completed in this process",
            )
        )
    if indices != sorted(set(indices)) or any(i not in expected for i in indices):
        found.append(
            ("", f"event step numbers are not distinct, ascending steps {resumed}..{total - 1}")
        )
    if found:
        return _breached(run, *found)
    return _passed(
        run,
        f"{len(events)} events + {failures} failed deliveries = {in_process} steps completed "
        f"in this process (from step {resumed})",
    )


def _check_sink_failures_match(run: _Run, _tools: frozenset[str]) -> _Judgement:
    problems = [p for p in (run.meta_problem, run.result_problem) if p is not None]
    if problems:
        return _breached(run, *(("", p) for p in problems))
    if run.meta is None:
        return _undetermined(run, "no .meta.json")
    if run.result is None:
        return _undetermined(run, "no .result.json (the run raised or its process died)")
    sink = run.meta["sink_failures"]
    library = run.result.event_delivery_failures
    if sink != library:
        return _breached(
            run, ("", f"the sink counted {sink} failures, the library counted {library}")
        )
    return _passed(run, f"the sink and the library both counted {library} delivery failures")


def _check_no_cross_talk(run: _Run, _tools: frozenset[str]) -> _Judgement:
    """Events and the result file name the run of their files (the log's own records are
    judged by ``log_consistent``: ``check_log`` refuses a record of another run)."""
    found = []
    for number, event in enumerate(run.events or [], start=1):
        other = event.get("run_id")
        if other != run.run_id:
            found.append((f"event line {number}", "an event of another run"))
    if run.result is not None and run.result.run_id != run.run_id:
        found.append(("", "the .result.json belongs to another run"))
    if found:
        return _breached(run, *found)
    events = len(run.events or [])
    if not events and run.result is None:
        return _undetermined(run, "no event and no .result.json to compare")
    result = "the .result.json" if run.result is not None else "no .result.json"
    return _passed(run, f"{events} events and {result} carry this run's id")


def _tool_name(action_text: str) -> str | None:
    """The tool an action's trace form calls: JSON ``{"tool"|"name": ...}`` or ``name(...)``."""
    try:
        payload = json.loads(action_text)
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, dict):
        for key in ("tool", "name"):
            value = payload.get(key)
            if isinstance(value, str):
                return value
        return None
    match = _TOOL_CALL_PREFIX.match(action_text)
    return None if match is None else match.group(1)


def _check_completion_has_evidence(run: _Run, tools: frozenset[str]) -> _Judgement:
    if run.stop_reason is not StopReason.TASK_COMPLETED:
        return _NOT_APPLICABLE
    steps = run.steps
    if not steps:
        return _breached(run, ("", "stopped as task_completed with no step at all"))
    line, last = steps[-1]
    outcome = last.action_outcome
    where = f"step {last.step.step_idx} (line {line})"
    if outcome is None or outcome.status is not ActionStatus.EXECUTED:
        return _breached(run, (where, "task_completed, but the last step executed no action"))
    if outcome.env_reported_completion:
        return _passed(run, "the environment reported completion", where)
    if last.step.action is not None and _tool_name(last.step.action) in tools:
        return _passed(run, "the last step executed a completing tool", where)
    return _breached(
        run,
        (
            where,
            "task_completed, but the environment reported no completion and the action "
            f"calls none of the {len(tools)} completing tools",
        ),
    )


def _check_step_budget_at_cap(run: _Run, _tools: frozenset[str]) -> _Judgement:
    if run.stop_reason is not StopReason.STEP_BUDGET:
        return _NOT_APPLICABLE
    started = run.started
    text = None if started is None else started.parameter_snapshot.get("request.max_steps")
    if text is None or not text.isdigit():
        return _undetermined(run, "the snapshot has no request.max_steps")
    cap, steps = int(text), len(run.steps)
    if steps != cap:
        return _breached(run, ("", f"stopped on the step budget after {steps} steps, max {cap}"))
    return _passed(run, f"{steps} steps = max_steps {cap}")


def _check_final_answer_nonempty(run: _Run, _tools: frozenset[str]) -> _Judgement:
    if run.stop_reason is not StopReason.FINAL_ANSWER:
        return _NOT_APPLICABLE
    finished = run.finished
    assert finished is not None
    answer = finished[1].result.final_answer or ""
    found = []
    if not answer.strip():
        found.append((f"line {finished[0]}", f"the final answer is blank ({len(answer)} chars)"))
    steps = run.steps
    if not steps:
        found.append(("", "final_answer with no step"))
    else:
        line, last = steps[-1]
        if last.step.action is not None or not last.step.parse_ok:
            found.append(
                (
                    f"step {last.step.step_idx} (line {line})",
                    "the last step is not a parsed reply without action",
                )
            )
    if found:
        return _breached(run, *found)
    return _passed(run, f"a final answer of {len(answer)} chars on step {len(steps) - 1}")


def _check_prompt_chars_monotonic(run: _Run, _tools: frozenset[str]) -> _Judgement:
    blocked = _needs_log(run)
    if blocked is not None:
        return blocked
    steps = [completed.step for _, completed in run.steps]
    if len(steps) < 2:
        return _undetermined(run, f"{len(steps)} step(s): no adjacent pair to compare")
    started = run.started
    assert started is not None
    template = started.parameter_snapshot.get("request.observation_template")
    if template is None:
        return _undetermined(run, "the snapshot has no request.observation_template")
    found = []
    for before, after in itertools.pairwise(steps):
        growth = len(before.raw_output) + len(template.format(observation=before.observation))
        if after.prompt_chars < before.prompt_chars:
            found.append(
                (
                    f"step {after.step_idx}",
                    f"prompt shrank from {before.prompt_chars} to {after.prompt_chars} chars",
                )
            )
        elif after.prompt_chars != before.prompt_chars + growth:
            found.append(
                (
                    f"step {after.step_idx}",
                    f"prompt grew by {after.prompt_chars - before.prompt_chars} chars, the "
                    f"previous turn adds {growth}",
                )
            )
    if found:
        return _breached(run, *found)
    return _passed(
        run,
        f"{len(steps)} steps, prompt {steps[0].prompt_chars} -> {steps[-1].prompt_chars} chars, "
        "each the previous prompt plus its turn",
    )


_CHECKS: Final[Mapping[str, Callable[[_Run, frozenset[str]], _Judgement]]] = {
    "lines_decode": _check_lines_decode,
    "log_consistent": _check_log_consistent,
    "result_matches_log": _check_result_matches_log,
    "step_outcome_consistent": _check_step_outcome_consistent,
    "events_match_steps": _check_events_match_steps,
    "sink_failures_match": _check_sink_failures_match,
    "no_cross_talk": _check_no_cross_talk,
    "completion_has_evidence": _check_completion_has_evidence,
    "step_budget_at_cap": _check_step_budget_at_cap,
    "final_answer_nonempty": _check_final_answer_nonempty,
    "prompt_chars_monotonic": _check_prompt_chars_monotonic,
}
assert tuple(_CHECKS) == CHECK_NAMES


# --------------------------------------------------------------------------- evaluation


def _summary(run: _Run) -> RunSummary:
    meta = run.meta or {}
    scenario = meta.get("scenario")
    fault = meta.get("fault")
    reason = run.stop_reason
    return RunSummary(
        run_id=run.run_id,
        scenario=scenario if isinstance(scenario, str) and scenario in KNOWN_SCENARIOS else "other",
        stop_reason=None if reason is None else reason.value,
        steps=len(run.steps),
        fault=_known_fault(fault),
    )


def _known_fault(fault: object) -> str | None:
    if fault is None:
        return None
    known = (*FAULT_CLASSES, *CLUSTER_FAULT_CLASSES)
    return fault if isinstance(fault, str) and fault in known else "other"


def evaluate(runs_dir: Path, *, completing_tools: Iterable[str] = ()) -> Board:
    """Judge every run in ``runs_dir`` by the eleven checks."""
    tools = frozenset(completing_tools)
    runs = [_load(runs_dir, run_id) for run_id in run_ids_in(runs_dir)]
    checks = []
    for name, check in _CHECKS.items():
        passes: list[Evidence] = []
        breaches: list[Evidence] = []
        undetermined: list[Evidence] = []
        not_applicable = 0
        for run in runs:
            judgement = check(run, tools)
            if judgement.verdict is None:
                not_applicable += 1
            elif judgement.verdict is Verdict.PASSED:
                passes.extend(judgement.evidence)
            elif judgement.verdict is Verdict.BREACHED:
                breaches.extend(judgement.evidence)
            else:
                undetermined.extend(judgement.evidence)
        if not runs:
            undetermined.append(Evidence(run_id=None, where="", detail="no run logs to judge"))
        elif not (passes or breaches or undetermined):
            undetermined.append(
                Evidence(
                    run_id=None,
                    where="",
                    detail=f"not exercised: applies to 0 of the {len(runs)} runs",
                )
            )
        checks.append(
            CheckResult(
                name=name,
                passes=tuple(passes),
                breaches=tuple(breaches),
                undetermined=tuple(undetermined),
                not_applicable=not_applicable,
            )
        )
    return Board(checks=tuple(checks), summaries=tuple(_summary(run) for run in runs))


# --------------------------------------------------------------------------- report


def _quantiles(values: Sequence[int]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{len(ordered)} | {ordered[0]} | {statistics.median(ordered):g} | {p90} | {ordered[-1]}"


def _judged(passes: Sequence[Evidence]) -> int:
    """Runs that passed (only evidence naming a run counts; batch-level evidence is none)."""
    return sum(1 for evidence in passes if evidence.run_id is not None)


def render_report(
    board: Board,
    *,
    title: str = "Scoreboard",
    runs_dir: Path | None = None,
    viewer: Path | None = None,
    report: Path | None = None,
) -> str:
    """The markdown report: counts, enum values, run ids, line and step numbers only.

    With ``viewer`` (the HTML page ``python -m polyloop html`` wrote for ``runs_dir``) and the
    ``report``'s own path, a last section links every run's view in that page (relative to the
    report) and names the ``python -m polyloop show`` command for its log.
    """
    lines = [
        f"# {title}",
        "",
        f"- runs judged: {len(board.summaries)}",
        f"- verdict: **{board.verdict.value}** ({len(board.breached)} checks breached, "
        f"{len(board.undetermined)} undetermined)",
        "",
        "| check | verdict | passed | breached | undetermined | not applicable |",
        "|---|---|---|---|---|---|",
    ]
    for check in board.checks:
        lines.append(
            f"| {check.name} | {check.verdict.value} | {_judged(check.passes)} | "
            f"{len(check.breaches)} | {len(check.undetermined)} | {check.not_applicable} |"
        )
    lines += ["", "## Evidence", ""]
    for check in board.checks:
        lines.append(f"### {check.name}: {check.verdict.value}")
        lines.append("")
        for label, items, limit in (
            ("breach", check.breaches, None),
            ("undetermined", check.undetermined, None),
            ("pass", check.passes, _SHOWN_PASSES),
        ):
            shown = items if limit is None else items[:limit]
            lines += [f"- {label}: {item.describe()}" for item in shown]
            if limit is not None and len(items) > limit:
                lines.append(f"- ... and {len(items) - limit} more passes")
        lines.append("")
    lines += ["## Stop reasons (a comparison, not a verdict)", ""]
    lines += ["| scenario | fault | stop reason | runs |", "|---|---|---|---|"]
    counts = Counter(
        (s.scenario, s.fault or "-", s.stop_reason or "(unfinished)") for s in board.summaries
    )
    for (scenario, fault, reason), count in sorted(counts.items()):
        lines.append(f"| {scenario} | {fault} | {reason} | {count} |")
    seen = {s.stop_reason for s in board.summaries}
    never = [reason.value for reason in StopReason if reason.value not in seen]
    lines += ["", f"Stop reasons that never occurred: {', '.join(never) or 'none'}", ""]
    lines += ["## Steps per run", "", "| scenario | runs | min | median | p90 | max |"]
    lines.append("|---|---|---|---|---|---|")
    for scenario in sorted({s.scenario for s in board.summaries}):
        steps = [s.steps for s in board.summaries if s.scenario == scenario]
        lines.append(f"| {scenario} | {_quantiles(steps)} |")
    if viewer is not None and runs_dir is not None:
        lines += ["", *_per_run_views(board, runs_dir, viewer, report)]
    return "\n".join(lines) + "\n"


def _per_run_views(board: Board, runs_dir: Path, viewer: Path, report: Path | None) -> list[str]:
    """Links into the viewer page: the breached runs first, then every run."""
    base = report.parent if report is not None else Path.cwd()
    try:
        page = viewer.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        page = viewer.resolve().as_uri()
    breached = {
        evidence.run_id
        for check in board.checks
        for evidence in check.breaches
        if evidence.run_id is not None
    }
    lines = [
        "## Per-run views",
        "",
        f"Every run is a section of [{page}]({page}), the page `python -m polyloop html` wrote "
        f"for `{runs_dir}`; `python -m polyloop show {runs_dir}/<run_id>.jsonl` prints one run, "
        f"`python -m polyloop verify {runs_dir}` re-checks every log.",
        "",
        "| run | stop reason | steps | breached | view |",
        "|---|---|---|---|---|",
    ]
    ordered = sorted(board.summaries, key=lambda s: (s.run_id not in breached, s.run_id))
    for summary in ordered:
        mark = "yes" if summary.run_id in breached else ""
        lines.append(
            f"| {summary.run_id} | {summary.stop_reason or '(unfinished)'} | {summary.steps} | "
            f"{mark} | [view]({page}#run-{summary.run_id}) |"
        )
    return lines


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak.scoreboard",
        description="Judge a soak runs directory by the eleven checks.",
    )
    parser.add_argument("--runs-dir", required=True, type=Path)
    parser.add_argument("--report", required=True, type=Path)
    parser.add_argument(
        "--completing-tool",
        action="append",
        default=[],
        metavar="NAME",
        help="a tool whose execution completes a run (repeatable)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the runs' HTML viewer (python -m polyloop html) to PATH and link "
        "every run's view from the report",
    )
    parser.add_argument(
        "--allow-undetermined",
        action="store_true",
        help="exit 0 when nothing is breached even if something is undetermined",
    )
    args = parser.parse_args(argv)
    if not args.runs_dir.is_dir():
        print(f"scoreboard: error: --runs-dir {args.runs_dir} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    board = evaluate(args.runs_dir, completing_tools=args.completing_tool)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    if args.html is not None and board.summaries:
        loaded = load_target(str(args.runs_dir))
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(
            render_html(loaded.runs, unreadable=loaded.unreadable), encoding="utf-8"
        )
    text = render_report(
        board,
        runs_dir=args.runs_dir,
        viewer=args.html if board.summaries else None,
        report=args.report,
    )
    args.report.write_text(text, encoding="utf-8")
    for check in board.checks:
        print(
            f"{check.name:26} {check.verdict.value:12} passed {_judged(check.passes)}, breached "
            f"{len(check.breaches)}, undetermined {len(check.undetermined)}, n/a "
            f"{check.not_applicable}"
        )
    print(f"scoreboard: {len(board.summaries)} runs, verdict {board.verdict.value}")
    if board.verdict is Verdict.BREACHED:
        return EXIT_BREACHED
    if board.verdict is Verdict.UNDETERMINED and not args.allow_undetermined:
        return EXIT_UNDETERMINED
    return EXIT_PASSED


if __name__ == "__main__":
    sys.exit(main())
