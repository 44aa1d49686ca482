"""The five seams, and the shells that exist only for one call round trip.

A seam is a ``typing.Protocol``: implementations satisfy it structurally and never inherit from
it, so one object can serve both this library's narrow view and a project's wider interface.
Each Protocol's docstring is its behavioural contract; ``polyloop.testing`` ships a contract
suite that checks an implementation against it.

Every seam has ``parameters() -> Mapping[str, str]``: the reproducibility-relevant settings of
the implementation, recorded in the run's parameter snapshot and compared on ``resume``. It
describes configuration, never instance state (a store must not report how many runs it
holds; an executor must not report a leased port). Keys and values must be ``str``.

From polyloop this module imports only ``polyloop.types``, the exception root
(``polyloop.errors``) and the shared field checks (``polyloop._common``).
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from polyloop._common import frozen, frozen_str_mapping, require_nonempty_str, require_str
from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.types import (
    RECORDS,
    ActionOutcome,
    ApprovalRequest,
    ChildRun,
    Intent,
    LogRecord,
    Message,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    StepCompleted,
    StepRecord,
    check_idempotency_key,
)

__all__ = [
    "OPTIONAL_WRITES",
    "Action",
    "ActionExecutor",
    "ApprovalRequestWrites",
    "CheckedLease",
    "DecisionParser",
    "Event",
    "EventKind",
    "EventSink",
    "FinalAnswer",
    "InvalidDecision",
    "LeasingRunStore",
    "LogEntry",
    "LogRecord",
    "ModelCall",
    "ModelClient",
    "PairWrites",
    "ParsedReply",
    "ProgressSink",
    "RecordWrites",
    "RunLease",
    "RunLog",
    "RunStore",
    "SettlementWrites",
    "SettlingRunStore",
    "SettlingWrites",
    "StepTiming",
    "ToolCall",
    "ToolContext",
    "ToolProgress",
    "TracingSink",
]


# --------------------------------------------------------------------------- shells


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCall:
    """One model call: the assembled messages plus the coordinates of this call.

    ``binding`` is the request's ``model_binding``, passed through read-only. ``result_id`` is
    the id the ``ModelCallResult`` of this call will carry.

    ``tools`` are the tool schemas the run offers the model at this call, in the form of
    ``ToolRegistry.schema_for_model()`` (``{"name", "description", "parameters"}`` each), for a
    client that sends them through the provider's native function calling. The session fills
    it only when the decision parser claims native tool calls (``native_tool_calls = True``);
    otherwise it is ``()`` and nothing changes for text-protocol agents. Each entry is a
    read-only copy.
    """

    messages: tuple[Message, ...]
    call_index: int
    run_id: str
    result_id: str
    binding: Mapping[str, str]
    tools: tuple[Mapping[str, object], ...] = ()
    idempotency_key: str | None = None
    """The call's idempotency key, recorded on its intent (design 0205); ``None`` only for a
    call built outside a run. A gateway that deduplicates requests can be sent it."""

    def __post_init__(self) -> None:
        if self.idempotency_key is not None:
            check_idempotency_key("ModelCall.idempotency_key", self.idempotency_key)
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(
            self, "binding", frozen_str_mapping("ModelCall", "binding", self.binding)
        )
        object.__setattr__(self, "tools", frozen_tool_schemas(self.tools))


def frozen_tool_schemas(value: object) -> tuple[Mapping[str, object], ...]:
    """``ModelCall.tools`` as ``ModelCall`` keeps them: a tuple of read-only copies of tool
    schemas, each a mapping with a ``str`` ``"name"``; ``PolyloopTypeError`` otherwise."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise PolyloopTypeError(
            "ModelCall.tools must be a sequence of tool schemas (the entries of "
            f"ToolRegistry.schema_for_model()), got {type(value).__name__}"
        )
    schemas: list[Mapping[str, object]] = []
    for index, schema in enumerate(value):
        if not isinstance(schema, Mapping) or not isinstance(schema.get("name"), str):
            raise PolyloopTypeError(
                f"ModelCall.tools[{index}] must be a mapping with a str 'name' (an entry of "
                f"ToolRegistry.schema_for_model()), got {type(schema).__name__}"
            )
        schemas.append(frozen(schema))
    return tuple(schemas)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A request to call one registered tool. Deliberately unvalidated: ``arguments`` is
    whatever the parser extracted, and ``ToolRegistry.validate`` judges it."""

    name: str
    arguments: Mapping[str, object]


def _optional_number(owner: str, name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(
            f"{owner}.{name} must be a number (int or float) or None, got {type(value).__name__}"
        )
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolProgress:
    """How far a running tool call has got: one progress report, delivered while the call
    runs to a sink that has ``emit_progress`` (``ProgressSink``; design 0211, amendment).

    ``run_id``, ``step_idx``, ``tool_name`` and ``tool_call_id`` say whose call it is (those of
    its ``ToolContext``; ``tool_name`` is ``None`` for a code action). ``progress`` is how far
    it is, ``total`` the end if known (both as the tool reports them: units, not a fraction),
    ``message`` a short text for a person. ``origin`` says who reported it: ``None`` for the
    tool's own handler, ``"mcp:<server>"`` for an MCP server's progress notification.
    ``reported_ns`` is when it was reported (``time.time_ns()``).

    Never persisted and never in the parameter snapshot: progress is lossy, the log is the
    record of a run.
    """

    run_id: str
    step_idx: int
    tool_name: str | None
    tool_call_id: str | None
    progress: float
    total: float | None = None
    message: str | None = None
    origin: str | None = None
    reported_ns: int = field(default_factory=time.time_ns)

    def __post_init__(self) -> None:
        require_nonempty_str("ToolProgress", "run_id", self.run_id)
        if isinstance(self.step_idx, bool) or not isinstance(self.step_idx, int):
            raise PolyloopTypeError(
                f"ToolProgress.step_idx must be an int, got {type(self.step_idx).__name__}"
            )
        for name in ("tool_name", "tool_call_id", "message", "origin"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise PolyloopTypeError(
                    f"ToolProgress.{name} must be a str or None, got {type(value).__name__}"
                )
        progress = _optional_number("ToolProgress", "progress", self.progress)
        if progress is None:
            raise PolyloopTypeError(
                "ToolProgress.progress must be a number (how far the call has got), got None"
            )
        object.__setattr__(self, "progress", progress)
        object.__setattr__(self, "total", _optional_number("ToolProgress", "total", self.total))
        if isinstance(self.reported_ns, bool) or not isinstance(self.reported_ns, int):
            raise PolyloopTypeError(
                "ToolProgress.reported_ns must be an int (time.time_ns()), got "
                f"{type(self.reported_ns).__name__}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What the library tells an execution about itself (design 0205).

    ``idempotency_key`` is deterministic from the run id and the execution's result id, at
    most 255 characters of ``[A-Za-z0-9._:-]``, recorded on the execution's intent, and the
    same on every replay of this execution: hand it to the tool's system so that it can
    deduplicate. ``tool_call_id`` is the native tool call's id, ``None`` for text protocols;
    ``tool_name`` the registry tool the action calls, ``None`` for a code action.
    A handler built with ``ToolSpec.from_function`` gets it by declaring a parameter annotated
    ``ToolContext``; a reconciler gets it as its first argument.

    Progress (design 0211, amendment): ``await context.report_progress(3, total=10,
    message="copying")`` sends a ``ToolProgress`` to the run's event sink while the call runs,
    if the sink has ``emit_progress`` (``ProgressSink``); otherwise, and outside a run (no
    ``progress_reporter``), it does nothing. It never raises for a sink's failure (the session
    logs and counts it); ``CancelledError`` passes. ``progress_reporter`` is set by the session
    and takes no part in equality or ``repr``; a reconciler's context has none.
    """

    idempotency_key: str
    run_id: str
    step_idx: int
    tool_call_id: str | None = None
    tool_name: str | None = None
    progress_reporter: Callable[[ToolProgress], Awaitable[None]] | None = field(
        default=None, compare=False, repr=False
    )
    child_reporter: Callable[[ChildRun], None] | None = field(
        default=None, compare=False, repr=False
    )
    """Set by the session: where a tool that ran a child run says so (``report_child``), so
    that the step records the link (design 0245). ``None`` outside a run."""
    lease_check: Callable[[], Awaitable[None]] | None = field(
        default=None, compare=False, repr=False
    )
    """Set by the session when the run holds a lease that can be checked (``CheckedLease``):
    what ``check_lease`` awaits (design 0245). ``None`` outside a run or unleased."""

    def __post_init__(self) -> None:
        check_idempotency_key("ToolContext.idempotency_key", self.idempotency_key)
        require_nonempty_str("ToolContext", "run_id", self.run_id)
        if isinstance(self.step_idx, bool) or not isinstance(self.step_idx, int):
            raise PolyloopTypeError(
                f"ToolContext.step_idx must be an int, got {type(self.step_idx).__name__}"
            )
        if self.tool_call_id is not None and not isinstance(self.tool_call_id, str):
            raise PolyloopTypeError(
                "ToolContext.tool_call_id must be a str or None, got "
                f"{type(self.tool_call_id).__name__}"
            )
        if self.tool_name is not None and not isinstance(self.tool_name, str):
            raise PolyloopTypeError(
                f"ToolContext.tool_name must be a str or None, got {type(self.tool_name).__name__}"
            )
        if self.child_reporter is not None and not callable(self.child_reporter):
            raise PolyloopTypeError(
                "ToolContext.child_reporter must be a callable taking a ChildRun, or None, got "
                f"{type(self.child_reporter).__name__}"
            )
        if self.progress_reporter is not None and not callable(self.progress_reporter):
            raise PolyloopTypeError(
                "ToolContext.progress_reporter must be an async callable taking a "
                f"ToolProgress, or None, got {type(self.progress_reporter).__name__}"
            )
        if self.lease_check is not None and not callable(self.lease_check):
            raise PolyloopTypeError(
                "ToolContext.lease_check must be an async callable taking nothing, or None, "
                f"got {type(self.lease_check).__name__}"
            )

    async def check_lease(self) -> None:
        """Raise ``polyloop.errors.RunLeaseLostError`` when the run's lease is no longer its
        current lease (released, expired, taken over by another holder), so that a stale
        holder starts nothing on the run's behalf: a child-run tool calls it right before it
        starts or continues its child (design 0245). A no-op outside a run, for an unleased
        run, or when the run's lease cannot be checked (not a ``CheckedLease``)."""
        if self.lease_check is not None:
            await self.lease_check()

    async def report_progress(
        self,
        progress: float,
        total: float | None = None,
        message: str | None = None,
        *,
        origin: str | None = None,
    ) -> None:
        """Report how far this execution has got (see the class docstring); a no-op without
        a ``progress_reporter``. A value of the wrong type raises ``PolyloopTypeError``."""
        value = ToolProgress(
            run_id=self.run_id,
            step_idx=self.step_idx,
            tool_name=self.tool_name,
            tool_call_id=self.tool_call_id,
            progress=progress,
            total=total,
            message=message,
            origin=origin,
        )
        if self.progress_reporter is not None:
            await self.progress_reporter(value)

    def report_child(self, child: ChildRun) -> None:
        """Say that this execution ran the child run ``child`` (design 0245): the step's
        record names it (``StepRecord.child``) and the run's budget counts its steps and
        tokens. A no-op outside a run (no ``child_reporter``)."""
        if not isinstance(child, ChildRun):
            raise PolyloopTypeError(
                f"ToolContext.report_child takes a polyloop.types.ChildRun, got "
                f"{type(child).__name__}"
            )
        if self.child_reporter is not None:
            self.child_reporter(child)


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """A decision to act. ``text`` is the trace form (source code, serialised arguments…)
    recorded as ``StepRecord.action``; ``tool_call`` is ``None`` for code-style actions."""

    text: str
    tool_call: ToolCall | None = None
    context: ToolContext | None = None
    """Set by the library on the action it hands the executor (parsers leave it ``None``):
    the run, the step and the execution's idempotency key (design 0205)."""

    @property
    def idempotency_key(self) -> str | None:
        """The execution's key: recorded on its intent, identical on every replay of this
        execution, different for every other execution. Pass it to the tool's system (an
        ``Idempotency-Key`` header) so that a replay is deduplicated. ``None`` outside a run."""
        return None if self.context is None else self.context.idempotency_key

    def __post_init__(self) -> None:
        if self.context is not None and not isinstance(self.context, ToolContext):
            raise PolyloopTypeError(
                f"Action.context must be a ToolContext or None, got {type(self.context).__name__}"
            )
        if not isinstance(self.text, str):
            raise PolyloopTypeError(
                f"Action.text must be the action's trace form as a str, got "
                f"{type(self.text).__name__}"
            )
        if self.tool_call is not None and not isinstance(self.tool_call, ToolCall):
            raise PolyloopTypeError(
                "Action.tool_call must be a ToolCall or None (None: a code action)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class InvalidDecision:
    """The reply could not be turned into a decision. ``explanation`` is non-empty and is the
    observation the model sees next."""

    explanation: str

    def __post_init__(self) -> None:
        require_str("InvalidDecision", "explanation", self.explanation)
        if not self.explanation:
            raise PolyloopValueError(
                "InvalidDecision.explanation must be a non-empty string: it is the "
                "observation the model sees"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalAnswer:
    """The agent declares the run done with this answer (``StopReason.FINAL_ANSWER``)."""

    text: str

    def __post_init__(self) -> None:
        require_nonempty_str("FinalAnswer", "text", self.text)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedReply:
    """A parser's verdict. ``history_text`` is what goes back into the prompt history as the
    assistant's turn; it may differ from the raw reply (shortened or extended).

    ``tool_calls`` are the native tool calls the assistant turn holds in history; a native
    parser passes the reply's ``tool_calls`` through *all of them*, whatever it decided, because
    the protocol wants every call of a turn answered by a ``tool`` message with its id. A text
    parser leaves it empty."""

    history_text: str
    decision: Action | FinalAnswer | InvalidDecision
    tool_calls: tuple[NativeToolCall, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.tool_calls, str | bytes) or not isinstance(self.tool_calls, Iterable):
            raise PolyloopTypeError("ParsedReply.tool_calls must be a sequence of NativeToolCall")
        calls = tuple(self.tool_calls)
        for index, call in enumerate(calls):
            if not isinstance(call, NativeToolCall):
                raise PolyloopTypeError(
                    f"ParsedReply.tool_calls[{index}] must be a polyloop.types.NativeToolCall, "
                    f"got {type(call).__name__}"
                )
        ids = [call.id for call in calls]
        if len(set(ids)) != len(ids):
            twice = next(i for i in ids if ids.count(i) > 1)
            # Refused here, where the parser answers (a parser breach, design 0161): the step
            # record and the history turn built from it would refuse it only after the write.
            raise PolyloopValueError(
                f"ParsedReply.tool_calls has the id {twice!r} twice; every tool call of one "
                "turn needs its own id, because its answer is matched by it"
            )
        object.__setattr__(self, "tool_calls", calls)
        if not isinstance(self.history_text, str):
            raise PolyloopTypeError(
                f"ParsedReply.history_text must be a str, got {type(self.history_text).__name__}"
            )
        if not isinstance(self.decision, Action | FinalAnswer | InvalidDecision):
            raise PolyloopTypeError(
                "ParsedReply.decision must be an Action, a FinalAnswer or an InvalidDecision, "
                f"got {type(self.decision).__name__}"
            )


class EventKind(enum.Enum):
    """Kinds of event. There is one: events report completed steps and nothing else."""

    STEP_FINISHED = "step_finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming:
    """When a step and its two executions happened, as wall-clock nanoseconds since the epoch
    (``time.time_ns()`` of the process that completed the step; design 0182).

    ``started_ns`` is when the step began (before its prompt was assembled), ``finished_ns``
    when its ``StepCompleted`` record was written. The model call's pair is ``None`` when the
    reply was not obtained by this process (a resume that re-used a stored reply); the action's
    pair is ``None`` for a step without an action. Not persisted: the log keeps durations
    (``StepRecord.step_wall_ms``, ``model_ms``, ``action_ms``), events carry the instants that
    tracing needs to place spans.
    """

    started_ns: int
    finished_ns: int
    model_started_ns: int | None = None
    model_finished_ns: int | None = None
    action_started_ns: int | None = None
    action_finished_ns: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Emitted once per completed step, after its ``StepCompleted`` record is written.

    ``timing`` says when the step and its executions ran (``None`` only for events built by
    code other than the session). ``tool_name`` is the registry tool the step's action called
    (``Action.tool_call.name``), ``None`` for code actions and steps without an action;
    ``tool_call_id`` is the model's id for that call when the parser supplied one.
    ``model_failed`` is true when the step's model call raised (its observation is then the
    configured ``model_call_failed`` text).
    """

    kind: EventKind
    run_id: str
    step: StepRecord
    model_binding: Mapping[str, str]
    timing: StepTiming | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    model_failed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "model_binding", frozen_str_mapping("Event", "model_binding", self.model_binding)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEntry:
    """One stored record and its 1-based line (position) in the run's log."""

    line: int
    record: LogRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog:
    """Everything a store holds for one run, each kind in write order. ``RunLog()`` is the log
    of a run id that was never used.

    ``entries`` is every record in write order across kinds, each with its 1-based line (its
    position in the store). It is what lets recovery check the order of records and name the
    line of a contradiction (``polyloop._recovery.check_log``). A store that cannot keep it may
    leave it empty; recovery then checks the per-kind tuples in their canonical order and names
    no line. ``started`` and ``finished`` hold the last record of their kind, so a second one is
    only visible in ``entries``. ``entries`` takes no part in equality.
    """

    started: RunStarted | None = None
    intents: tuple[Intent, ...] = ()
    model_results: tuple[ModelCallResult, ...] = ()
    steps: tuple[StepCompleted, ...] = ()
    finished: RunFinished | None = None
    entries: tuple[LogEntry, ...] = field(default=(), compare=False, repr=False)
    settlements: tuple[Settlement, ...] = ()
    """Verdicts on executions that were in doubt, and decisions on calls that waited for
    approval, in write order (designs 0206, 0210)."""
    approval_requests: tuple[ApprovalRequest, ...] = ()
    """Calls that waited for a person's approval, in write order (design 0210)."""

    @property
    def is_empty(self) -> bool:
        """True when the store holds no record at all for this run id (no field of any record
        kind, ``polyloop.types.RECORDS``, holds one; nor do the entries)."""
        return not self.entries and not any(
            getattr(self, kind.log_field) for kind in RECORDS.kinds if kind.log_field is not None
        )


# --------------------------------------------------------------------------- seams


@runtime_checkable
class ModelClient(Protocol):
    """Calls a model.

    * Return a ``ModelReply``; its ``call_id`` is ``None`` or non-empty, never ``""``.
    * Express failure by **raising** (any exception type). Never return an empty reply for a
      failure: the library must tell "the infrastructure failed" from "the model said ''".
      The library records the exception as a failed call and stops with ``LLM_ERROR``.
      After a failed call the same instance must keep working.
    * Let ``asyncio.CancelledError`` propagate; release in-flight resources in ``finally``.
    * No retries, backoff or rate limiting here: those belong to the gateway in front.

    Native tool calls (design 0100): a client that sends ``ModelCall.tools`` through the
    provider's function calling and maps the calls back into ``ModelReply.tool_calls`` claims
    it with a class attribute ``native_tool_calls = True``; it must also send history turns
    with ``tool_calls`` and ``Role.TOOL`` messages in the provider's form. It is certified by
    ``polyloop.testing.NativeToolCallModelClientContract``.
    """

    async def call(self, call: ModelCall) -> ModelReply: ...

    def parameters(self) -> Mapping[str, str]: ...


@runtime_checkable
class DecisionParser(Protocol):
    """Turns a model reply into a decision. Synchronous and deterministic.

    * Never raise on bad model output: return ``InvalidDecision`` with a non-empty
      explanation (it becomes the observation). An exception that escapes anyway (or a
      return value that is not a ``ParsedReply``) is a contract breach the library contains:
      the reply is already durable, so it records a step whose ``parse_error`` describes the
      breach and stops the run with ``StopReason.PARSER_ERROR`` (design 0161).
    * ``history_text`` is what history shows as the assistant turn.
    * An ``Action``'s ``text`` is its trace form.

    Native tool calls (design 0100): a parser that reads ``ModelReply.tool_calls`` claims it
    with a class attribute ``native_tool_calls = True``. Only then does the session offer the
    run's tool schemas on every ``ModelCall.tools``. Such a parser also puts every tool call of
    the reply into ``ParsedReply.tool_calls`` (so each gets its answer in history), turns a
    reply with several calls, arguments that are not a JSON object, or ``finish_reason
    "length"`` into an ``InvalidDecision``, and is certified by
    ``polyloop.testing.NativeToolCallParserContract``.
    """

    def parse(self, reply: ModelReply) -> ParsedReply: ...

    def parameters(self) -> Mapping[str, str]: ...


@runtime_checkable
class ActionExecutor(Protocol):
    """Executes one action in the environment.

    * Fill all five ``ActionOutcome`` fields.
    * An action that ran and failed is ``EXECUTED`` with the error as the observation.
    * An action that never entered execution is ``NOT_EXECUTED``.
    * A broken environment is **returned** as ``ENV_ERROR``; translating the environment's
      expected exceptions (timeouts, closed sessions) into it is the executor's job.
    * An action whose outcome cannot be told (the request was sent, its answer lost) is
      **raised** as ``polyloop.errors.ToolOutcomeUnknown``: the execution is in doubt, and the
      session settles it by its replay policy in the same run (design 0227).
    * Any other exception raised anyway is not caught: it leaves ``run()``/``resume()``
      unchanged, and the log stops at "action intent, no step", which recovery treats as
      unknown.
    * Let ``asyncio.CancelledError`` propagate; release resources in ``finally``.
    """

    async def execute(self, action: Action) -> ActionOutcome: ...

    def parameters(self) -> Mapping[str, str]: ...


@runtime_checkable
class RunStore(Protocol):
    """The write-ahead log of runs.

    * What is written is read back by ``read_log``; an unknown run id reads as ``RunLog()``
      and never raises.
    * Every record carries its ``run_id``; there is no "current run" and runs never leak.
    * The store neither repairs nor rejects: structurally odd logs (a result without an
      intent) are stored and read back as written; recovery judges them.
    * ``write_step_completed`` is atomic: outcome and step are visible together or not at all.
    * ``write_intent`` and ``write_run_finished`` are durability barriers: when they return,
      the record (and every earlier record of the run) survives a crash. Other records must be
      durable by the next barrier at the latest; a store may make them durable sooner
      (``PostgresRunStore`` makes every write durable on return: a crash or restart of its
      server loses nothing a write returned for; the JSONL store's survive a crash of the
      writing process, and reach the disk with the next barrier).
    * A store whose infrastructure fails (a full disk, a file it cannot write or read, a
      database that is down or restarting) raises ``polyloop.errors.StoreUnavailableError``
      from the shipped stores, from writes, ``read_log`` and lease acquisition alike: a
      ``StoreError`` (and an ``OSError``) naming the store, the run, the record and, for a
      store of files, the file, with the OS's or driver's error as ``__cause__``. ``run()`` and
      ``resume()`` let it through. A write that raised it may or may not have been stored; the
      log stays readable (a line the failure tore is not a record) and the run resumes from
      what is stored once the store works again. A store of your own should raise it too
      rather than its driver's exception, so that ``except StoreError`` sees the failure.
      Refusals keep their own types: ``RunLeaseLostError``, ``RunAlreadyStartedError``,
      ``DecodeError``.
    * ``write_run_started`` of the shipped stores is exclusive: it raises
      ``polyloop.errors.RunAlreadyStartedError`` (a ``PolyloopError`` that is also a
      ``FileExistsError``) if the run id already has records, and writes nothing. That is what
      stops two processes from starting one run id. A store of your own that refuses a taken
      id may raise that or a plain ``FileExistsError``: ``run()`` turns either into
      ``RunIdentityError``, so catch ``FileExistsError`` to handle both.
    * Optional capabilities are declared Protocols (design 0220), each checked with
      ``isinstance`` once per run: ``SettlementWrites``, ``ApprovalRequestWrites`` (together
      ``SettlingWrites``), ``PairWrites`` (``write_pair``, declared by the class) and
      ``RecordWrites`` (``write_record``: a record of any kind of ``polyloop.types.RECORDS``,
      which is where every kind, its tag, barrier and write method is declared).
    * Optional, the ``SettlingRunStore`` capability (designs 0206, 0210): ``write_settlement``
      records the verdict on an execution that was in doubt, or a decision on a call that
      waited for approval, and ``write_approval_request`` that call's request; both are
      durability barriers, and ``read_log`` returns them in ``RunLog.settlements`` and
      ``RunLog.approval_requests`` (and ``entries``). The shipped stores and their leases have
      it. A store without it runs every run as before; only settling (a reconciler's answer,
      ``polyloop.session.resolve``) and a tool with ``needs_approval`` need it.
    * Optional, ``write_pair(first, second)`` (designs 0212, 0214): write two records of one
      run (neither a ``RunStarted``) back to back, in order, as one operation that gives at
      least what the two writes in order give: nothing of ``second`` without ``first``, each
      as durable on return as its own write would be. When a store or lease has it, the
      session hands it a model call's result together with the step's next record (nothing
      runs or is reported between them); otherwise it writes the result on its own.
      ``PostgresRunStore`` and its leases have it (one commit: both or neither, durable on
      return), ``JsonlRunStore`` and its leases (one file write, synced if either is a
      barrier; a crash may leave ``first`` without ``second``, as two writes could), and
      ``VolatileRunStore``'s leases (one synchronous block: both or neither).
    """

    async def write_run_started(self, record: RunStarted) -> None: ...

    async def write_intent(self, record: Intent) -> None: ...

    async def write_model_call_result(self, record: ModelCallResult) -> None: ...

    async def write_step_completed(self, record: StepCompleted) -> None: ...

    async def write_run_finished(self, record: RunFinished) -> None: ...

    async def read_log(self, run_id: str) -> RunLog: ...

    def parameters(self) -> Mapping[str, str]: ...


@runtime_checkable
class SettlementWrites(Protocol):
    """A store or lease that records ``Settlement``s (design 0206): a barrier."""

    async def write_settlement(self, record: Settlement) -> None: ...


@runtime_checkable
class ApprovalRequestWrites(Protocol):
    """A store or lease that records ``ApprovalRequest``s (design 0210): a barrier."""

    async def write_approval_request(self, record: ApprovalRequest) -> None: ...


@runtime_checkable
class SettlingWrites(SettlementWrites, ApprovalRequestWrites, Protocol):
    """The settling capability of a store or a lease (designs 0206, 0210, 0220): it records
    decisions from outside the run, ``Settlement``s, and the ``ApprovalRequest``s they
    answer. The session decides each half once per run, with ``isinstance``."""


@runtime_checkable
class SettlingRunStore(RunStore, SettlingWrites, Protocol):
    """A ``RunStore`` that can record decisions from outside the run: ``Settlement``s (design
    0206) and the ``ApprovalRequest``s they answer (design 0210); its leases can too."""


@runtime_checkable
class PairWrites(Protocol):
    """The ``write_pair`` capability of a store or a lease (designs 0212, 0214; see
    ``RunStore``). It counts only where the class declares the method (the session checks
    ``issubclass(type(writer), PairWrites)``), so a wrapper that forwards unknown attributes
    (``__getattr__``) is not paired past its own write methods."""

    async def write_pair(self, first: LogRecord, second: LogRecord) -> None: ...


@runtime_checkable
class RecordWrites(Protocol):
    """The capability of writing a record of any kind of ``polyloop.types.RECORDS`` through
    one method (design 0220): ``write_record(record)`` stores it with the kind's barrier and
    exclusivity, as the kind's typed write method would. Kinds added after schema 1.8 have no
    typed method and are written only through it; every shipped store and lease has it."""

    async def write_record(self, record: LogRecord) -> None: ...


OPTIONAL_WRITES: Mapping[str, type] = MappingProxyType(
    {
        "write_settlement": SettlementWrites,
        "write_approval_request": ApprovalRequestWrites,
        "write_record": RecordWrites,
    }
)
"""Each optional write method (of a record kind not ``required`` in ``polyloop.types.RECORDS``,
or ``write_record``) and the Protocol that declares it: a store or lease has the method when
it is an instance of that Protocol (design 0220)."""


@runtime_checkable
class RunLease(Protocol):
    """A held claim on one run id: while it is held, only this lease writes to the run.

    Obtained from ``LeasingRunStore.acquire_lease`` (design 0120). It has ``RunStore``'s five
    write methods, with the same records, atomicity, durability and exclusive start, and:

    * **Fencing inside the write.** Each write checks that this lease is still the run's
      current lease *atomically with the write itself* (in the same critical section, the
      same SQL statement...). If it is not (released, expired, taken over), the write raises
      ``polyloop.errors.RunLeaseLostError`` and nothing of it is stored. A check made before
      the write is not enough: a holder paused between its check and its write would write
      after a takeover.
    * A record whose ``run_id`` is not the lease's is refused with
      ``polyloop.errors.PolyloopValueError`` before anything is stored.
    * ``epoch`` is the fencing token: every grant of a run's lease has a larger epoch than
      every earlier grant of that run id in the same store.
    * ``release()`` ends the claim and frees the run for the next acquirer. A write in flight
      when it is called lands before the release takes effect or not at all. After it, every
      write through this lease raises ``RunLeaseLostError``. It is idempotent and does not
      raise for infrastructure failures: a lease that could not be released is freed when its
      holder dies or, for stores whose leases expire, when it expires.
    * A store whose leases expire renews them itself while the lease is held (its holder
      does nothing); a lease that could not be renewed in time is lost.
    """

    @property
    def run_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    async def write_run_started(self, record: RunStarted) -> None: ...

    async def write_intent(self, record: Intent) -> None: ...

    async def write_model_call_result(self, record: ModelCallResult) -> None: ...

    async def write_step_completed(self, record: StepCompleted) -> None: ...

    async def write_run_finished(self, record: RunFinished) -> None: ...

    async def release(self) -> None: ...


@runtime_checkable
class CheckedLease(Protocol):
    """A ``RunLease`` that can say whether it is still the run's current lease without
    writing (an optional capability of a lease; every shipped store's leases have it).

    ``check_current()`` raises ``polyloop.errors.RunLeaseLostError`` when a write through the
    lease now would be refused (released, expired, another lease granted since), and returns
    otherwise, checked the way the lease's writes are fenced (under the run's write lock, by
    the lease row's epoch...). It writes nothing. The session hands it to tools as
    ``ToolContext.check_lease``: a child-run tool checks the parent's lease right before it
    starts or continues a child (design 0245). ``polyloop.testing``'s ``RunLeaseContract``
    certifies it for a lease that offers it.
    """

    async def check_current(self) -> None: ...


@runtime_checkable
class LeasingRunStore(RunStore, Protocol):
    """A ``RunStore`` that can also hand out run leases (an optional capability).

    ``acquire_lease(run_id, wait_seconds=0.0)`` returns a ``RunLease`` when no other lease on
    ``run_id`` is held, in this process or any other process using the same backend. While
    the run is held it waits up to ``wait_seconds`` for the holder to release it (or die, or
    let it expire), then raises ``polyloop.errors.RunLeaseHeldError``. A negative or
    non-finite ``wait_seconds`` is a ``PolyloopValueError``. A holder that dies frees the run
    without doing anything (the kernel drops a file lock; a lease row expires by the
    database's clock). Cancelling a waiting ``acquire_lease`` leaves no lease behind.

    ``run()`` and ``resume()`` take the lease before they read the log and release it when
    they return or raise, and write only through it. The plain write methods are not fenced:
    they serve stores' own tools and the ``RunStoreContract``. ``polyloop.testing``'s
    ``RunLeaseContract`` certifies an implementation.
    """

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> RunLease: ...


@runtime_checkable
class EventSink(Protocol):
    """Receives one ``Event`` per completed step.

    A sink may raise when its backend is down: the library logs the failure, counts it in
    ``RunResult.event_delivery_failures`` and goes on. Failures are never re-emitted as
    events. Events are lossy by design; audit trails belong in the store.

    Optional, the ``ProgressSink`` capability: a sink with ``emit_progress`` also receives the
    progress of running tool calls.
    """

    async def emit(self, event: Event) -> None: ...

    def parameters(self) -> Mapping[str, str]: ...


@runtime_checkable
class ProgressSink(EventSink, Protocol):
    """An ``EventSink`` that also receives ``ToolProgress`` while a tool call runs (design
    0211, amendment). Optional: the session looks for ``emit_progress`` on the run's sink.

    ==========================  =============================================================
    rule                        what the library does
    ==========================  =============================================================
    when                        ``emit_progress`` is awaited in the task of the running
                                call, each time its tool reports (``ToolContext
                                .report_progress``; an MCP server's progress notification);
                                a call's reports arrive in the order they were made, before
                                its step's ``Event``
    a sink without it           gets nothing but its ``Event`` s (an MCP call asks its server
                                for progress only if ``McpToolset(on_progress=)`` is set)
    it raises, or outlives      the failure is logged (``polyloop.session``) with the count
    ``event_timeout_seconds``   so far; the call goes on; it is **not** counted in
                                ``RunResult.event_delivery_failures`` and never changes the
                                run's result, log or snapshot
    ``CancelledError``          passes (the action's bound or the caller cancelled the call)
    lossy                       progress is never persisted, never re-delivered on resume,
                                never in the parameter snapshot
    ==========================  =============================================================

    A slow ``emit_progress`` slows the call that reports: keep it quick, or queue.
    """

    async def emit_progress(self, progress: ToolProgress) -> None: ...


@runtime_checkable
class TracingSink(EventSink, Protocol):
    """An ``EventSink`` that opens a tracing scope around each tool call and around each child
    run (design 0245, amendment). Optional: ``polyloop.otel.OtelEventSink`` has it.

    ==========================  =============================================================
    scope                       when
    ==========================  =============================================================
    ``action_scope(context,     the session enters it right before it hands an action to the
    step_started_ns)``          executor and leaves it when the executor returns or raises,
                                in the task of the call (each attempt of an action in doubt
                                its own); ``context`` is the call's ``ToolContext``,
                                ``step_started_ns`` the step's start (``time.time_ns()``).
                                What the tool runs inside (a child run) runs inside the scope
    ``run_scope(run_id,         a child-run tool (``polyloop.agent.child_tool``) enters it
    model)``                    around the child run it starts or continues, if the child's
                                sink has it; it yields a function the tool calls with the
                                child's ``RunResult`` before it leaves
    ==========================  =============================================================

    A scope must neither raise nor swallow an exception: it is left with the exception of the
    call, which passes on unchanged. Nothing of it is persisted.
    """

    def action_scope(
        self, context: ToolContext, step_started_ns: int
    ) -> contextlib.AbstractContextManager[None]: ...

    def run_scope(
        self, run_id: str, model: str | None
    ) -> contextlib.AbstractContextManager[Callable[[RunResult], None]]: ...
