"""Run and resume one agent run: the only module that weaves the logic layer together.

``run(definition, request)`` starts a run under a new run id; ``resume(definition, request)``
continues one after a crash or a kill. Both return a ``RunResult`` whose ``RunFinished`` record
is durable before they return.

One step, in order (the write-ahead discipline; every arrow is awaited before the next):

1. assemble the prompt; if it is longer than ``Budget.max_prompt_chars`` stop with
   ``PROMPT_TOO_LARGE``, if its estimated tokens exceed ``Budget.max_prompt_tokens`` stop with
   ``PROMPT_TOKEN_LIMIT`` (no intent, no step, nothing truncated);
2. write the model-call ``Intent`` (durable), call the model, write its ``ModelCallResult``
   with the call's duration (a raised exception becomes a failed result, a step and
   ``LLM_ERROR``, or ``CONTEXT_LENGTH_EXCEEDED`` for a ``ContextLengthExceededError``);
3. parse the reply; an ``InvalidDecision`` or a ``FinalAnswer`` never reaches the executor; a
   parser that raises is contained: a step naming the breach, then ``PARSER_ERROR``;
4. for an ``Action``: write the action ``Intent`` (durable, with the tool's replay policy,
   ``NEVER`` for code actions), then execute it. An exception from the executor is not caught:
   it leaves ``run()`` as is and the log ends at "action intent, no step";
5. write ``StepCompleted`` (the outcome and the step record in one record);
6. emit one ``Event``; a sink failure is logged and counted, never fatal, never re-emitted;
7. check the stop conditions (``polyloop._stopping``).

Native tool calls (design 0100): when the decision parser claims ``native_tool_calls = True``,
every ``ModelCall`` carries ``RunRequest.tools.schema_for_model()`` in ``tools``, and each step's
``StepRecord.tool_calls`` (the parser's ``ParsedReply.tool_calls``) puts the calls on the
assistant turn of history and answers each with a ``Role.TOOL`` message.

Cancellation: a ``CancelledError`` is re-raised unchanged after a ``RunFinished`` with
``StopReason.CANCELLED`` is written, waiting at most ``cancel_grace_seconds`` for that write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

from polyloop import _assembly, _recovery, _stopping
from polyloop._common import (
    describe_exception,
    frozen,
    frozen_str_mapping,
    is_async_callable,
    is_plain_function,
    require_nonempty_str,
)
from polyloop._recovery import LogBreach, ResumeAction, ResumePlan
from polyloop._stopping import Counters, StepFacts
from polyloop.errors import (
    AssemblyError,
    ContextLengthExceededError,
    LogCorruptError,
    ParameterDriftError,
    PolyloopTypeError,
    PolyloopValueError,
    RunIdentityError,
    RunLeaseHeldError,
    RunLeaseLostError,
    SeamTimeoutError,
)
from polyloop.ports import (
    Action,
    ActionExecutor,
    DecisionParser,
    Event,
    EventKind,
    EventSink,
    FinalAnswer,
    InvalidDecision,
    LeasingRunStore,
    ModelCall,
    ModelClient,
    ParsedReply,
    RunLease,
    RunLog,
    RunStore,
    StepTiming,
    ToolCall,
)
from polyloop.sinks import NullEventSink
from polyloop.tools import RegistryExecutor, ToolRegistry
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    Injection,
    Intent,
    IntentKind,
    Message,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    RunFinished,
    RunResult,
    RunStarted,
    StepCompleted,
    StepRecord,
    StopReason,
    SyntheticObservations,
)

__all__ = [
    "AgentDefinition",
    "AssemblyError",
    "LogBreach",
    "LogCorruptError",
    "ParameterDriftError",
    "ResumeAction",
    "ResumePlan",
    "RunIdentityError",
    "RunLeaseHeldError",
    "RunLeaseLostError",
    "RunRequest",
    "check_log",
    "continue_cancelled",
    "plan_resume",
    "resume",
    "run",
    "run_or_resume",
]

logger = logging.getLogger("polyloop.session")

_T = TypeVar("_T")

_LEAVES_UNKNOWN: Final = frozenset(
    {StopReason.CANCELLED, StopReason.ACTION_TIMEOUT, StopReason.RESUME_STATE_UNKNOWN}
)
"""Stop reasons that can end a run while an execution's outcome is unknown (design 0163)."""

_SEAM_PREFIXES: Final = ("model_client", "decision_parser", "store", "event_sink")

_SYNC: Final = "sync"
_ASYNC: Final = "async"
_SEAM_METHODS: Final[Mapping[str, tuple[str, tuple[tuple[str, str], ...]]]] = {
    "model_client": ("ModelClient", (("call", _ASYNC), ("parameters", _SYNC))),
    "decision_parser": ("DecisionParser", (("parse", _SYNC), ("parameters", _SYNC))),
    "store": (
        "RunStore",
        (
            ("write_run_started", _ASYNC),
            ("write_intent", _ASYNC),
            ("write_model_call_result", _ASYNC),
            ("write_step_completed", _ASYNC),
            ("write_run_finished", _ASYNC),
            ("read_log", _ASYNC),
            ("parameters", _SYNC),
        ),
    ),
    "event_sink": ("EventSink", (("emit", _ASYNC), ("parameters", _SYNC))),
    "action_executor": ("ActionExecutor", (("execute", _ASYNC), ("parameters", _SYNC))),
}
"""Per seam field: the Protocol's name and its methods, each ``async`` or ``sync``."""

_SEAM_OWNERS: Final = {"action_executor": "RunRequest"}


def _seams_satisfied_by(value: object) -> list[str]:
    return [
        f"{protocol} (the `{field}` field)"
        for field, (protocol, methods) in _SEAM_METHODS.items()
        if all(callable(getattr(value, name, None)) for name, _ in methods)
    ]


def _check_seam(field: str, value: object) -> None:
    """Refuse, at construction, an object that cannot serve as the seam ``field``.

    A missing or non-callable method is a ``PolyloopTypeError`` naming the field, the method
    and, when the object fits another seam, that seam (a parser passed as the model client).
    A method written with plain ``def`` where the seam awaits it (or ``async def`` where the
    seam calls it synchronously) is refused too. Callables whose kind cannot be read from
    their definition (mocks, builtins) are accepted as they are.
    """
    protocol, methods = _SEAM_METHODS[field]
    owner = f"{_SEAM_OWNERS.get(field, 'AgentDefinition')}.{field}"
    shape = ", ".join(f"{'async ' if kind == _ASYNC else ''}{name}()" for name, kind in methods)
    for name, kind in methods:
        method = getattr(value, name, None)
        if not callable(method):
            fits = _seams_satisfied_by(value)
            hint = f"; it looks like a {' or a '.join(fits)}" if fits else ""
            raise PolyloopTypeError(
                f"{owner} must be a {protocol} (methods: {shape}); the "
                f"{type(value).__name__} given has no method {name}(){hint}"
            )
        if kind == _ASYNC and is_plain_function(method):
            raise PolyloopTypeError(
                f"{owner}: {type(value).__name__}.{name} must be declared `async def`: the "
                f"library awaits it (a plain def would run and then fail at the await)"
            )
        if kind == _SYNC and is_async_callable(method):
            raise PolyloopTypeError(
                f"{owner}: {type(value).__name__}.{name} must be a plain `def`, not "
                "`async def`: the library calls it synchronously"
            )


# --------------------------------------------------------------------------- definition


def _claims_native_tool_calls(seam: object) -> bool:
    """Whether a seam object declares ``native_tool_calls = True`` (design 0100)."""
    return getattr(seam, "native_tool_calls", False) is True


def _seam_snapshot(
    seam: ModelClient | DecisionParser | RunStore | EventSink | ActionExecutor, prefix: str
) -> dict[str, str]:
    parameters = seam.parameters()
    checked = frozen_str_mapping(prefix, "parameters()", parameters)
    return {f"{prefix}.{key}": value for key, value in checked.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentDefinition:
    """The half of a run that stays the same across runs; safe to share between concurrent runs.

    There is no default store: a run without recovery is an explicit ``VolatileRunStore()``.
    ``event_sink`` defaults to ``polyloop.sinks.NullEventSink()`` and ``synthetic_observations``
    to the stock ``SyntheticObservations()`` (design 0113); both enter the snapshot as usual.
    Construction checks that every seam object has the seam's methods, async where the library
    awaits them and synchronous where it calls them (``PolyloopTypeError`` naming the field
    otherwise: a parser passed as the model client fails here, before any run id is used). It
    does not call them; ``parameter_snapshot()`` does, every time it is
    called, so the snapshot is what the seams report, not what someone declared.
    """

    model_client: ModelClient
    decision_parser: DecisionParser
    store: RunStore
    event_sink: EventSink = field(default_factory=NullEventSink)
    synthetic_observations: SyntheticObservations = field(default_factory=SyntheticObservations)

    def __post_init__(self) -> None:
        for field_name in _SEAM_PREFIXES:
            _check_seam(field_name, getattr(self, field_name))
        if not isinstance(self.synthetic_observations, SyntheticObservations):
            raise PolyloopTypeError(
                "AgentDefinition.synthetic_observations must be SyntheticObservations"
            )
        if _claims_native_tool_calls(self.decision_parser) and not _claims_native_tool_calls(
            self.model_client
        ):
            raise PolyloopTypeError(
                f"AgentDefinition.decision_parser ({type(self.decision_parser).__name__}) reads "
                "native tool calls, but AgentDefinition.model_client "
                f"({type(self.model_client).__name__}) does not claim to send tool schemas or "
                "return tool calls (no `native_tool_calls = True`); the model would never be "
                "offered a tool. Use a client with native tool calls (GatewayModelClient), or "
                "a text parser"
            )

    def parameter_snapshot(self) -> dict[str, str]:
        """``<seam>.<key>`` for every seam's ``parameters()``, plus the synthetic texts.

        Raises ``PolyloopTypeError`` (a ``TypeError``) naming the seam when one reports a
        non-``str`` key or value.
        """
        snapshot: dict[str, str] = {}
        for prefix in _SEAM_PREFIXES:
            snapshot.update(_seam_snapshot(getattr(self, prefix), prefix))
        texts = self.synthetic_observations
        snapshot["synthetic_observations.action_rejected"] = texts.action_rejected
        snapshot["synthetic_observations.env_failed"] = texts.env_failed
        snapshot["synthetic_observations.model_call_failed"] = texts.model_call_failed
        return snapshot


# --------------------------------------------------------------------------- request


def _frozen_injections(value: object) -> Mapping[str, tuple[Injection, ...]]:
    if not isinstance(value, Mapping):
        raise PolyloopTypeError(
            "RunRequest.injections must map channel names to sequences of Injection, got "
            f"{type(value).__name__}"
        )
    checked: dict[str, tuple[Injection, ...]] = {}
    for channel, entries in value.items():
        if not isinstance(channel, str):
            raise PolyloopTypeError(
                f"RunRequest.injections: channel names must be str, got {channel!r} "
                f"({type(channel).__name__})"
            )
        if not channel:
            raise PolyloopValueError("RunRequest.injections: a channel name must not be empty")
        if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
            raise PolyloopTypeError(
                f"RunRequest.injections[{channel!r}] must be a sequence of Injection "
                f"(use () for a declared empty channel), got {type(entries).__name__}"
            )
        for index, entry in enumerate(entries):
            if not isinstance(entry, Injection):
                raise PolyloopTypeError(
                    f"RunRequest.injections[{channel!r}][{index}] must be an Injection, "
                    f"got {type(entry).__name__}"
                )
        checked[channel] = tuple(entries)
    frozen_injections: Mapping[str, tuple[Injection, ...]] = frozen(checked)
    return frozen_injections


def _check_bound(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(
            f"RunRequest.{name} must be a number of seconds or None (no bound), got "
            f"{type(value).__name__}"
        )
    if not math.isfinite(value) or value <= 0:
        raise PolyloopValueError(
            f"RunRequest.{name} must be finite and > 0, or None for no bound; got {value!r}"
        )


async def _bounded(awaitable: Awaitable[_T], seconds: float | None, what: str, field: str) -> _T:
    """Await ``awaitable``, at most ``seconds`` (``None``: no bound).

    On expiry the awaited call is cancelled and ``SeamTimeoutError`` is raised; a
    ``TimeoutError`` the call raises itself, and a cancellation from outside, pass unchanged.
    """
    if seconds is None:
        return await awaitable
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise SeamTimeoutError(
            f"{what} did not return within {seconds:g} s (RunRequest.{field})", seconds=seconds
        ) from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """Everything that is specific to one run.

    ``tools`` is the registry the model sees (its schema is the caller's to render into the
    context, or, with a parser that claims native tool calls, it goes out on every
    ``ModelCall.tools``, design 0100); when ``action_executor`` was derived from a registry
    (``tools.executor()``) that registry must equal ``tools``, or the model would see one tool
    set while dispatch used another. One registry is enough: leave ``action_executor`` out and it is
    ``tools.executor()`` (a request with neither is refused: nothing could ever act). Pass
    ``action_executor`` for actions that are not tool calls (code, commands). ``budget``
    defaults to ``Budget()`` (design 0113). ``model_binding`` is passed to every model call
    and recorded in the snapshot; ``fingerprints`` (versions of materials such as a
    prompt-template hash) are recorded only.
    ``model_replay_policy`` has no default: only the caller knows whether repeating a model
    call whose outcome is unknown is acceptable.

    Construction is cheap (no I/O). Mappings are copied and frozen, so editing the caller's
    dicts afterwards changes nothing.
    """

    run_id: str
    context: Context
    model_replay_policy: ReplayPolicy
    budget: Budget = field(default_factory=Budget)
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    action_executor: ActionExecutor = field(default=cast("ActionExecutor", None))
    """``None`` (the default) means ``tools.executor()``; after construction it is never
    ``None``."""
    injections: Mapping[str, tuple[Injection, ...]] = field(default_factory=dict)
    model_binding: Mapping[str, str] = field(default_factory=dict)
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    observation_template: str = "{observation}"
    cancel_grace_seconds: float = 5.0
    model_call_timeout_seconds: float | None = None
    """Bound on one model call; ``None`` (the default) waits as long as the model takes, so a
    working model is never cut off. On expiry the call is cancelled and recorded as a failed
    call (``LLM_ERROR``). In the snapshot when set. Design 0164."""
    action_timeout_seconds: float | None = None
    """Bound on one ``execute``; ``None`` (the default) waits. On expiry the action is
    cancelled and the run stops with ``ACTION_TIMEOUT``: the outcome is unknown, so the
    action is never repeated. In the snapshot when set. Design 0164."""
    event_timeout_seconds: float | None = 30.0
    """Bound on one ``emit``; a sink that outlives it counts as a delivery failure and the run
    goes on. ``None`` waits forever. Not in the snapshot (events never change a run)."""

    def __post_init__(self) -> None:
        require_nonempty_str("RunRequest", "run_id", self.run_id)
        if not isinstance(self.budget, Budget):
            raise PolyloopTypeError("RunRequest.budget must be a Budget")
        if not isinstance(self.context, Context):
            raise PolyloopTypeError("RunRequest.context must be a Context")
        if not isinstance(self.model_replay_policy, ReplayPolicy):
            raise PolyloopTypeError(
                "RunRequest.model_replay_policy must be ReplayPolicy.SAFE or ReplayPolicy.NEVER"
            )
        if not isinstance(self.tools, ToolRegistry):
            raise PolyloopTypeError(
                "RunRequest.tools must be a ToolRegistry (ToolRegistry() for none)"
            )
        if self.action_executor is None:
            if not self.tools.names():
                raise PolyloopValueError(
                    "RunRequest needs tools=ToolRegistry([...]) (their executor is derived "
                    "from them) or an action_executor; with neither, no action could ever run"
                )
            object.__setattr__(self, "action_executor", self.tools.executor())
        _check_seam("action_executor", self.action_executor)
        _assembly.check_observation_template(self.observation_template)
        binding = frozen_str_mapping("RunRequest", "model_binding", self.model_binding)
        fingerprints = frozen_str_mapping("RunRequest", "fingerprints", self.fingerprints)
        object.__setattr__(self, "model_binding", binding)
        object.__setattr__(self, "fingerprints", fingerprints)
        object.__setattr__(self, "injections", _frozen_injections(self.injections))
        grace = self.cancel_grace_seconds
        if isinstance(grace, bool) or not isinstance(grace, int | float):
            raise PolyloopTypeError("RunRequest.cancel_grace_seconds must be a number of seconds")
        if not math.isfinite(grace) or grace < 0:
            raise PolyloopValueError(
                f"RunRequest.cancel_grace_seconds must be finite and >= 0, got {grace!r}"
            )
        for name in (
            "model_call_timeout_seconds",
            "action_timeout_seconds",
            "event_timeout_seconds",
        ):
            _check_bound(name, getattr(self, name))
        executor = self.action_executor
        if isinstance(executor, RegistryExecutor) and executor.registry != self.tools:
            raise PolyloopValueError(
                "RunRequest.action_executor was derived from a different registry than "
                "RunRequest.tools; build both from one registry: tools=reg, "
                "action_executor=reg.executor()"
            )

    def parameter_snapshot(self) -> dict[str, str]:
        """The request's half of the snapshot (keys listed in the snapshot reference page).

        Raises ``PolyloopTypeError`` (a ``TypeError``) when the executor's ``parameters()``
        reports a non-``str``.
        """
        budget = self.budget
        snapshot = {
            "request.max_steps": str(budget.max_steps),
            "request.max_actions": str(budget.max_actions),
            "request.max_consecutive_parse_failures": str(budget.max_consecutive_parse_failures),
            "request.max_prompt_chars": str(budget.max_prompt_chars),
            "request.model_replay_policy": self.model_replay_policy.value,
            "request.observation_template": self.observation_template,
            "request.cancel_grace_seconds": repr(float(self.cancel_grace_seconds)),
            "request.tools": ",".join(self.tools.names()),
        }
        # The token budgets enter the snapshot only when set, so runs started before they
        # existed (and runs that do not use them) keep the snapshot they had.
        if budget.max_total_tokens is not None:
            snapshot["request.max_total_tokens"] = str(budget.max_total_tokens)
        # Likewise the seam bounds (design 0164): only when set.
        for name in ("model_call_timeout_seconds", "action_timeout_seconds"):
            bound = getattr(self, name)
            if bound is not None:
                snapshot[f"request.{name}"] = repr(float(bound))
        if budget.max_prompt_tokens is not None:
            snapshot["request.max_prompt_tokens"] = str(budget.max_prompt_tokens)
        for channel, ids in _assembly.injected_entry_ids(self.injections).items():
            snapshot[f"request.injected_entry_ids.{channel}"] = ",".join(ids)
        for key, value in self.model_binding.items():
            snapshot[f"request.binding.{key}"] = value
        for name, value in self.fingerprints.items():
            snapshot[f"request.fingerprint.{name}"] = value
        snapshot.update(_seam_snapshot(self.action_executor, "action_executor"))
        return snapshot


def _full_snapshot(definition: AgentDefinition, request: RunRequest) -> dict[str, str]:
    snapshot = definition.parameter_snapshot()
    snapshot.update(request.parameter_snapshot())
    return dict(sorted(snapshot.items()))


# --------------------------------------------------------------------------- driver


@dataclass(slots=True)
class _Step:
    """What the loop learned while working on one step."""

    idx: int
    prompt_chars: int
    started: float
    reply: ModelReply | None = None
    parsed: ParsedReply | None = None
    model_ms: int | None = None
    action_ms: int | None = None
    # Wall-clock instants for the step's event (StepTiming); monotonic ``started`` measures.
    started_ns: int = field(default_factory=time.time_ns)
    model_started_ns: int | None = None
    model_finished_ns: int | None = None
    action_started_ns: int | None = None
    action_finished_ns: int | None = None
    tool_call: ToolCall | None = None
    model_failed: bool = False


class _Driver:
    """The loop for one run id. Not reusable; one instance per ``run``/``resume`` call."""

    def __init__(
        self, definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float
    ) -> None:
        self._definition = definition
        self._request = request
        self._store = definition.store
        self._lease_wait_seconds = _checked_lease_wait(lease_wait_seconds)
        self._lease: RunLease | None = None
        # Every write of the run goes through the lease when the store offers one.
        self._writer: RunStore | RunLease = definition.store
        self._run_id = request.run_id
        self._steps: list[StepRecord] = []
        self._counters = Counters()
        self._event_failures = 0
        self._final_answer: str | None = None
        self._finish_task: asyncio.Task[None] | None = None
        self._current: _Step | None = None
        # The result id of the execution whose intent is durable but whose result is not yet:
        # what a stop at this moment leaves unknown (RunResult.unknown_outcome, design 0163).
        self._in_flight: str | None = None
        self._prompt: list[Message] = list(
            _assembly.assemble(
                context=request.context,
                injections=request.injections,
                steps=(),
                observation_template=request.observation_template,
            )
        )
        self._prompt_chars = _assembly.prompt_chars(self._prompt)
        # Offered on every model call when the parser reads native tool calls (design 0100);
        # the run's registry (narrowed or not) is the one source, as for validation.
        self._model_tools: tuple[Mapping[str, object], ...] = (
            tuple(request.tools.schema_for_model())
            if _claims_native_tool_calls(definition.decision_parser)
            else ()
        )

    # ---------------------------------------------------------------- entry points

    async def start(self) -> RunResult:
        await self._acquire_lease()
        try:
            return await self._start()
        finally:
            await self._release_lease()

    async def resume(self) -> RunResult:
        await self._acquire_lease()
        try:
            return await self._resume()
        finally:
            await self._release_lease()

    async def continue_cancelled(self, cancelled_run_id: str) -> RunResult:
        await self._acquire_lease()
        try:
            await self._copy_cancelled(cancelled_run_id)
            return await self._resume()
        finally:
            await self._release_lease()

    async def _copy_cancelled(self, source_id: str) -> None:
        """Write every record of the cancelled run ``source_id`` but its finish, under this
        driver's (new, unused) run id: the new run's log is the old one's, uncancelled."""
        if source_id == self._run_id:
            raise PolyloopValueError(
                f"continue_cancelled: request.run_id {source_id!r} is the cancelled run itself; "
                "a cancelled run stays cancelled, so continue it under a new run id"
            )
        source = await self._store.read_log(source_id)
        plan = _recovery.plan_resume(source, source_id)
        if plan.action is ResumeAction.FRESH:
            raise RunIdentityError(f"run id {source_id!r} has no log in this store to continue")
        if plan.action is ResumeAction.CORRUPT:
            raise LogCorruptError(
                f"run {source_id!r}: {plan.detail}; continue_cancelled refused",
                line=None if plan.breach is None else plan.breach.line,
            )
        finished = source.finished
        if finished is None or finished.result.stop_reason is not StopReason.CANCELLED:
            state = (
                "is unfinished"
                if finished is None
                else (f"finished as {finished.result.stop_reason.value}")
            )
            raise RunIdentityError(
                f"run {source_id!r} {state}; only a cancelled run can be continued this way "
                "(resume() an unfinished run; a run that finished otherwise is done)"
            )
        if not source.entries:
            raise PolyloopValueError(
                f"continue_cancelled: the store returned no write order for run {source_id!r} "
                "(RunLog.entries is empty), so its records cannot be copied in order"
            )
        target = await self._store.read_log(self._run_id)
        if not target.is_empty:
            raise RunIdentityError(
                f"run id {self._run_id!r} already has a log; continue the cancelled run under "
                "a new run id"
            )
        writer = self._writer
        for entry in source.entries:
            if isinstance(entry.record, RunFinished):
                continue  # the CANCELLED finish is the one record not copied
            record = dataclasses.replace(entry.record, run_id=self._run_id)
            if isinstance(record, RunStarted):
                try:
                    await writer.write_run_started(record)
                except FileExistsError as exc:
                    raise RunIdentityError(
                        f"run id {self._run_id!r} was claimed while the cancelled run was being "
                        "copied to it; choose another new run id"
                    ) from exc
            elif isinstance(record, Intent):
                await writer.write_intent(record)
            elif isinstance(record, ModelCallResult):
                await writer.write_model_call_result(record)
            elif isinstance(record, StepCompleted):
                await writer.write_step_completed(record)

    async def _acquire_lease(self) -> None:
        """Take the run's lease before anything reads its log (stores that offer leases)."""
        store = self._store
        if isinstance(store, LeasingRunStore):
            self._lease = await store.acquire_lease(
                self._run_id, wait_seconds=self._lease_wait_seconds
            )
            self._writer = self._lease

    async def _release_lease(self) -> None:
        """Release the lease, also on errors and cancellation (``release`` never raises for
        infrastructure failures; shielded so that a second cancellation cannot stop it)."""
        if self._lease is not None:
            await asyncio.shield(self._lease.release())

    async def _start(self) -> RunResult:
        log = await self._store.read_log(self._run_id)
        if not log.is_empty:
            raise RunIdentityError(
                f"run id {self._run_id!r} already has a log; call resume() to continue it, "
                "or choose a new run id"
            )
        snapshot = _full_snapshot(self._definition, self._request)
        start_write = asyncio.ensure_future(
            self._writer.write_run_started(
                RunStarted(run_id=self._run_id, parameter_snapshot=snapshot)
            )
        )
        try:
            # Shielded: a store may finish the write even if we stop waiting (the JSONL store
            # writes in a thread). If it lands, the run exists and must get its marker.
            await asyncio.shield(start_write)
        except asyncio.CancelledError:
            if await self._settled_within_grace(start_write, "the RunStarted record"):
                await self._finish_after_cancel()
            raise
        except FileExistsError as exc:
            raise RunIdentityError(
                f"run id {self._run_id!r} was claimed by another start between our check and "
                "our first write (two processes racing on one id), or an earlier start died "
                "before its first record was complete; only one of them may own the id. "
                "Choose a new run id, or inspect the store's entry for this id"
            ) from exc
        return await self._guarded(self._loop(first=None))

    async def _resume(self) -> RunResult:
        log = await self._store.read_log(self._run_id)
        plan = plan_resume(log, self._run_id)
        if plan.action is ResumeAction.FRESH:
            raise RunIdentityError(
                f"run id {self._run_id!r} has no log in this store, so there is nothing to "
                "resume; call run() to start it (and check that the store points at the "
                "right place)"
            )
        self._refuse_if_corrupt(plan)
        if plan.action is ResumeAction.ALREADY_FINISHED:
            assert log.finished is not None
            return log.finished.result
        assert log.started is not None
        self._check_drift(log.started.parameter_snapshot)
        stop = self._check_pending_action_policy(log, plan)
        for completed in log.steps:
            self._add_step(completed.step)
        if stop is not None:
            return await self._guarded(self._finish(stop))
        return await self._guarded(self._resume_from(plan, log))

    # ---------------------------------------------------------------- cancellation

    async def _guarded(self, body: Coroutine[Any, Any, RunResult]) -> RunResult:
        """Run the loop; on cancellation write the CANCELLED finish, then re-raise."""
        try:
            result = await body
        except asyncio.CancelledError:
            await self._finish_after_cancel()
            raise
        return result

    async def _finish_after_cancel(self) -> None:
        """Write the ``CANCELLED`` finish (unless a finish is already being written) and wait
        for it within the grace period. Never raises: the caller re-raises the cancellation."""
        if self._finish_task is None:
            self._finish_task = asyncio.ensure_future(
                self._writer.write_run_finished(
                    RunFinished(run_id=self._run_id, result=self._result(StopReason.CANCELLED))
                )
            )
        # If a normal finish was already being written, waiting for it is all there is to do:
        # a run gets exactly one RunFinished record.
        await self._settled_within_grace(self._finish_task, "the cancelled-run marker")

    async def _settled_within_grace(self, write: asyncio.Future[None], what: str) -> bool:
        """Wait for a store write after a cancellation, at most ``cancel_grace_seconds``.

        True when the write completed. A write that times out or fails is logged and reported
        as False; its exception must not replace the ``CancelledError`` the caller re-raises.
        """
        grace = self._request.cancel_grace_seconds
        try:
            await asyncio.wait_for(asyncio.shield(write), grace)
        except TimeoutError:
            logger.error(  # noqa: TRY400 - a timeout has no useful traceback
                "run %s: %s was not durable within %.1f s of the cancellation; the run will "
                "look interrupted (resumable) rather than cancelled",
                self._run_id,
                what,
                grace,
            )
            return False
        except Exception:  # the store failed; the cancellation still wins and is re-raised
            logger.exception(
                "run %s: writing %s failed after the cancellation; the run will look "
                "interrupted (resumable) rather than cancelled",
                self._run_id,
                what,
            )
            return False
        return True

    # ---------------------------------------------------------------- the loop

    async def _resume_from(self, plan: ResumePlan, log: RunLog) -> RunResult:
        if self._steps:
            reason = self._stop_for_stored_step(log, plan)
            if reason is not None:
                return await self._finish(reason)
        if plan.action is ResumeAction.STOP_UNKNOWN:
            idx = plan.next_step_idx
            pending = plan.pending_model_result
            self._in_flight = (
                _recovery.model_result_id(idx)
                if pending is None
                else _recovery.action_result_id(idx)
            )
            return await self._finish(StopReason.RESUME_STATE_UNKNOWN)
        if plan.action is ResumeAction.CONTINUE:
            return await self._loop(first=None)
        step = self._begin_step()
        if plan.action is ResumeAction.REDO_MODEL_CALL:
            # The intent is already in the log: a second one would make the log corrupt.
            return await self._loop(first=await self._call_model(step, intent_written=True))
        pending = plan.pending_model_result
        assert pending is not None
        step.model_ms = pending.duration_ms
        if pending.reply is None:
            # The model call failed and the process died before its step was written.
            return await self._loop(
                first=await self._record_model_failure(
                    step, context_length_exceeded=pending.context_length_exceeded
                )
            )
        step.reply = pending.reply
        replay = plan.action is ResumeAction.REPLAY_LAST_ACTION
        return await self._loop(first=await self._after_reply(step, intent_written=replay))

    async def _loop(self, first: StopReason | None) -> RunResult:
        """Step until a stop reason appears; ``first`` is the verdict of a step already done."""
        reason = first
        while reason is None:
            reason = _stopping.stop_before_call(
                self._request.budget, self._counters, self._prompt_chars
            )
            if reason is not None:
                break
            reason = await self._call_model(self._begin_step())
        return await self._finish(reason)

    def _begin_step(self) -> _Step:
        self._current = _Step(
            idx=len(self._steps), prompt_chars=self._prompt_chars, started=time.monotonic()
        )
        return self._current

    async def _call_model(self, step: _Step, *, intent_written: bool = False) -> StopReason | None:
        result_id = _recovery.model_result_id(step.idx)
        if not intent_written:
            await self._writer.write_intent(
                Intent(
                    run_id=self._run_id,
                    kind=IntentKind.MODEL_CALL,
                    call_index=step.idx,
                    result_id=result_id,
                    replay_policy=self._request.model_replay_policy,
                )
            )
        self._in_flight = result_id
        call = ModelCall(
            messages=tuple(self._prompt),
            call_index=step.idx,
            run_id=self._run_id,
            result_id=result_id,
            binding=self._request.model_binding,
            tools=self._model_tools,
        )
        started = time.monotonic()
        step.model_started_ns = time.time_ns()
        try:
            reply = await _bounded(
                self._definition.model_client.call(call),
                self._request.model_call_timeout_seconds,
                "the model call",
                "model_call_timeout_seconds",
            )
        except Exception as exc:  # noqa: BLE001 - the ModelClient contract: any raise is a failed call
            step.model_finished_ns = time.time_ns()
            step.model_ms = _elapsed_ms(started)
            failure = describe_exception(exc)
            too_long = isinstance(exc, ContextLengthExceededError)
            logger.warning(
                "run %s step %d: model call failed after %d ms: %s",
                self._run_id,
                step.idx,
                step.model_ms,
                failure,
            )
            await self._writer.write_model_call_result(
                ModelCallResult(
                    run_id=self._run_id,
                    result_id=result_id,
                    reply=None,
                    failure=failure,
                    duration_ms=step.model_ms,
                    context_length_exceeded=too_long,
                )
            )
            self._in_flight = None
            return await self._record_model_failure(step, context_length_exceeded=too_long)
        step.model_finished_ns = time.time_ns()
        step.model_ms = _elapsed_ms(started)
        if not isinstance(reply, ModelReply):
            raise PolyloopTypeError(
                f"{type(self._definition.model_client).__name__}.call returned "
                f"{type(reply).__name__}; a ModelClient must return a ModelReply"
            )
        await self._writer.write_model_call_result(
            ModelCallResult(
                run_id=self._run_id,
                result_id=result_id,
                reply=reply,
                failure=None,
                duration_ms=step.model_ms,
            )
        )
        self._in_flight = None
        step.reply = reply
        return await self._after_reply(step, intent_written=False)

    async def _record_model_failure(
        self, step: _Step, *, context_length_exceeded: bool
    ) -> StopReason | None:
        step.model_failed = True
        record = self._step_record(
            step,
            action=None,
            observation=self._definition.synthetic_observations.model_call_failed,
            observation_is_synthetic=True,
        )
        facts = StepFacts(
            model_failed=True,
            final_answer=False,
            outcome=None,
            tool_completes_run=False,
            context_length_exceeded=context_length_exceeded,
        )
        return await self._complete_step(record, None, None, facts)

    def _parse(self, reply: ModelReply, step_idx: int) -> ParsedReply | str:
        """The parser's verdict on ``reply``, or the description of its contract breach.

        A parser must never raise, but the reply it chokes on is already durable, so a raise
        that escaped would be raised again by every ``resume``: the run could neither finish
        nor be abandoned. The breach is contained instead (design 0161).
        """
        parser = self._definition.decision_parser
        try:
            parsed = parser.parse(reply)
        except Exception as exc:  # DecisionParser contract breach: contained (design 0161)
            description = f"{type(parser).__name__}.parse raised {describe_exception(exc)}"
            logger.error(  # noqa: TRY400 - the traceback is attached through exc_info
                "run %s step %d: %s; the run stops with parser_error",
                self._run_id,
                step_idx,
                description,
                exc_info=exc,
            )
            return description
        if not isinstance(parsed, ParsedReply):
            return (
                f"{type(parser).__name__}.parse returned {type(parsed).__name__}; a "
                "DecisionParser must return a ParsedReply"
            )
        return parsed

    async def _after_reply(self, step: _Step, *, intent_written: bool) -> StopReason | None:
        assert step.reply is not None
        parsed = self._parse(step.reply, step.idx)
        if isinstance(parsed, str):
            record = self._step_record(
                step,
                action=None,
                parse_error=parsed,
                observation=parsed,
                observation_is_synthetic=True,
            )
            facts = StepFacts(
                model_failed=False, final_answer=False, outcome=None, tool_completes_run=False
            )
            await self._complete_step(record, None, None, facts)
            return StopReason.PARSER_ERROR
        step.parsed = parsed
        decision = parsed.decision
        if isinstance(decision, InvalidDecision):
            record = self._step_record(
                step,
                action=None,
                parse_error=decision.explanation,
                observation=decision.explanation,
                observation_is_synthetic=True,
            )
            facts = StepFacts(
                model_failed=False, final_answer=False, outcome=None, tool_completes_run=False
            )
            return await self._complete_step(record, None, None, facts)
        if isinstance(decision, FinalAnswer):
            record = self._step_record(
                step, action=None, observation="", observation_is_synthetic=False
            )
            facts = StepFacts(
                model_failed=False, final_answer=True, outcome=None, tool_completes_run=False
            )
            self._final_answer = decision.text
            return await self._complete_step(record, None, None, facts)
        return await self._act(step, decision, intent_written=intent_written)

    def _tool_spec_flags(self, action: Action) -> tuple[ReplayPolicy, bool]:
        call = action.tool_call
        # A ToolCall is unvalidated parser output: a non-str name names no tool (and an
        # unhashable one must not raise here, between the stored reply and its step).
        spec = (
            None
            if call is None or not isinstance(call.name, str)
            else (self._request.tools.spec_for(call.name))
        )
        if spec is None:
            return ReplayPolicy.NEVER, False
        return spec.replay_policy, spec.completes_run

    async def _act(self, step: _Step, action: Action, *, intent_written: bool) -> StopReason | None:
        result_id = _recovery.action_result_id(step.idx)
        policy, completes_run = self._tool_spec_flags(action)
        if not intent_written:
            await self._writer.write_intent(
                Intent(
                    run_id=self._run_id,
                    kind=IntentKind.ACTION,
                    call_index=step.idx,
                    result_id=result_id,
                    replay_policy=policy,
                )
            )
        self._in_flight = result_id
        # No try: an executor that raises breaks its contract, and the log must show exactly
        # that ("action intent, no step") so recovery treats the outcome as unknown.
        started = time.monotonic()
        step.action_started_ns, step.tool_call = time.time_ns(), action.tool_call
        try:
            outcome = await _bounded(
                self._request.action_executor.execute(action),
                self._request.action_timeout_seconds,
                "the action",
                "action_timeout_seconds",
            )
        except SeamTimeoutError as exc:
            # The executor was cancelled mid-action: whether it acted is unknown, so the intent
            # stays unanswered and nothing repeats it (design 0164).
            logger.error(  # noqa: TRY400 - a timeout has no useful traceback
                "run %s step %d: %s; the run stops with action_timeout", self._run_id, step.idx, exc
            )
            return StopReason.ACTION_TIMEOUT
        step.action_finished_ns = time.time_ns()
        step.action_ms = _elapsed_ms(started)
        if not isinstance(outcome, ActionOutcome):
            raise PolyloopTypeError(
                f"{type(self._request.action_executor).__name__}.execute returned "
                f"{type(outcome).__name__}; an ActionExecutor must return an ActionOutcome"
            )
        texts = self._definition.synthetic_observations
        if outcome.status is ActionStatus.NOT_EXECUTED:
            observation, synthetic = texts.rejection(outcome.observation), True
        elif outcome.status is ActionStatus.ENV_ERROR:
            observation, synthetic = texts.env_failed, True
        else:
            observation, synthetic = outcome.observation, outcome.observation_is_synthetic
        record = self._step_record(
            step,
            action=action.text,
            action_status=outcome.status,
            observation=observation,
            observation_is_synthetic=synthetic,
            observation_truncated_chars=outcome.observation_truncated_chars,
        )
        facts = StepFacts(
            model_failed=False,
            final_answer=False,
            outcome=outcome,
            tool_completes_run=completes_run,
        )
        return await self._complete_step(record, result_id, outcome, facts)

    def _step_record(
        self,
        step: _Step,
        *,
        action: str | None,
        observation: str,
        observation_is_synthetic: bool,
        parse_error: str | None = None,
        action_status: ActionStatus | None = None,
        observation_truncated_chars: int = 0,
    ) -> StepRecord:
        reply = step.reply
        return StepRecord(
            step_idx=step.idx,
            # A failed model call has nothing parsed, so its history turn is empty.
            raw_output="" if step.parsed is None else step.parsed.history_text,
            content_chars=0 if reply is None else len(reply.content),
            thinking_chars=0 if reply is None else len(reply.thinking),
            action=action,
            parse_ok=parse_error is None,
            parse_error=parse_error,
            observation=observation,
            observation_is_synthetic=observation_is_synthetic,
            observation_truncated_chars=observation_truncated_chars,
            prompt_chars=step.prompt_chars,
            call_id=None if reply is None else reply.call_id,
            step_wall_ms=_elapsed_ms(step.started),
            action_status=action_status,
            usage=None if reply is None else reply.usage,
            model_ms=step.model_ms,
            action_ms=step.action_ms if action_status is not None else None,
            tool_calls=() if step.parsed is None else step.parsed.tool_calls,
        )

    async def _complete_step(
        self,
        record: StepRecord,
        result_id: str | None,
        outcome: ActionOutcome | None,
        facts: StepFacts,
    ) -> StopReason | None:
        await self._writer.write_step_completed(
            StepCompleted(
                run_id=self._run_id, result_id=result_id, action_outcome=outcome, step=record
            )
        )
        self._in_flight = None
        self._add_step(record)
        await self._emit(record)
        return _stopping.stop_after_step(self._request.budget, self._counters, facts)

    def _add_step(self, record: StepRecord) -> None:
        self._steps.append(record)
        self._counters = self._counters.after(record)
        pair = _assembly.history_message_pair(record, self._request.observation_template)
        self._prompt.extend(pair)
        self._prompt_chars += _assembly.prompt_chars(pair)

    async def _emit(self, record: StepRecord) -> None:
        step = self._current
        timing = tool_name = tool_call_id = None
        model_failed = False
        if step is not None and step.idx == record.step_idx:
            model_failed = step.model_failed
            timing = StepTiming(
                started_ns=step.started_ns,
                finished_ns=time.time_ns(),
                model_started_ns=step.model_started_ns,
                model_finished_ns=step.model_finished_ns,
                action_started_ns=step.action_started_ns if record.action is not None else None,
                action_finished_ns=step.action_finished_ns if record.action is not None else None,
            )
            if step.tool_call is not None and record.action is not None:
                tool_name = step.tool_call.name
                call_id = getattr(step.tool_call, "id", None)  # native tool calls carry one
                tool_call_id = call_id if isinstance(call_id, str) and call_id else None
        event = Event(
            kind=EventKind.STEP_FINISHED,
            run_id=self._run_id,
            step=record,
            model_binding=self._request.model_binding,
            timing=timing,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            model_failed=model_failed,
        )
        try:
            await _bounded(
                self._definition.event_sink.emit(event),
                self._request.event_timeout_seconds,
                "the event sink",
                "event_timeout_seconds",
            )
        except Exception:  # the EventSink contract: delivery failures are counted, never fatal
            self._event_failures += 1
            logger.warning(
                "run %s step %d: event delivery failed (%d so far); the run goes on",
                self._run_id,
                record.step_idx,
                self._event_failures,
                exc_info=True,
            )

    # ---------------------------------------------------------------- resume helpers

    def _check_drift(self, stored: Mapping[str, str]) -> None:
        current = _full_snapshot(self._definition, self._request)
        added = sorted(current.keys() - stored.keys())
        removed = sorted(stored.keys() - current.keys())
        changed = {
            key: (stored[key], current[key])
            for key in sorted(stored.keys() & current.keys())
            if stored[key] != current[key]
        }
        if added or removed or changed:
            raise ParameterDriftError(self._run_id, added=added, removed=removed, changed=changed)

    def _refuse_if_corrupt(self, plan: ResumePlan) -> None:
        if plan.action is not ResumeAction.CORRUPT:
            return
        line = None if plan.breach is None else plan.breach.line
        raise LogCorruptError(
            f"run {self._run_id!r}: {plan.detail}; resume refused (the log contradicts itself, "
            "so nothing in it can be trusted to decide what is safe to repeat)",
            line=line,
        )

    def _check_pending_action_policy(self, log: RunLog, plan: ResumePlan) -> StopReason | None:
        """Refuse a dangling action intent whose replay policy is not the one its action gets.

        The intent's policy decides whether the action is repeated, so it must not be trusted
        on its own: re-parsing the stored reply (parsers are deterministic, and the drift check
        has just confirmed the settings) gives the action, and the settings give its policy.
        Returns ``PARSER_ERROR`` when the parser now breaks its contract on a reply whose action
        would be replayed (nothing is executed then); ``None`` otherwise.
        """
        pending = plan.pending_model_result
        pending_action = plan.action is ResumeAction.REPLAY_LAST_ACTION or (
            plan.action is ResumeAction.STOP_UNKNOWN and pending is not None
        )
        if not pending_action or pending is None or pending.reply is None:
            return None
        parsed = self._parse(pending.reply, plan.next_step_idx)
        if isinstance(parsed, str):
            replay = plan.action is ResumeAction.REPLAY_LAST_ACTION
            return StopReason.PARSER_ERROR if replay else None
        decision = parsed.decision
        if not isinstance(decision, Action):
            line = next(
                (
                    entry.line
                    for entry in log.entries
                    if isinstance(entry.record, Intent)
                    and entry.record.result_id == _recovery.action_result_id(plan.next_step_idx)
                ),
                None,
            )
            where = "" if line is None else f"line {line}: "
            raise LogCorruptError(
                f"run {self._run_id!r}: {where}step {plan.next_step_idx} has an action intent, "
                "but its stored reply parses to no action; resume refused",
                line=line,
            )
        policy = self._tool_spec_flags(decision)[0]
        self._refuse_if_corrupt(
            _recovery.plan_resume(log, self._run_id, action_policies={plan.next_step_idx: policy})
        )
        return None

    def _stop_for_stored_step(self, log: RunLog, plan: ResumePlan) -> StopReason | None:
        """Whether the last stored step should already have stopped the run.

        That happens when the process died between a step's record and the ``RunFinished``.
        The facts are rebuilt from the log: the model result says whether the call failed,
        re-parsing the stored reply (parsers are deterministic) says whether it was a final
        answer and which tool ran.
        """
        completed = log.steps[-1]
        model_result = plan.last_model_result
        assert model_result is not None
        completes_run = False
        if model_result.reply is not None:
            parsed = self._parse(model_result.reply, completed.step.step_idx)
            if isinstance(parsed, str):
                return StopReason.PARSER_ERROR
            decision = parsed.decision
            if isinstance(decision, FinalAnswer):
                self._final_answer = decision.text
            elif isinstance(decision, Action):
                completes_run = self._tool_spec_flags(decision)[1]
        facts = StepFacts(
            model_failed=model_result.reply is None,
            final_answer=self._final_answer is not None,
            outcome=completed.action_outcome,
            tool_completes_run=completes_run,
            context_length_exceeded=model_result.context_length_exceeded,
        )
        return _stopping.stop_after_step(self._request.budget, self._counters, facts)

    # ---------------------------------------------------------------- finishing

    def _result(self, reason: StopReason) -> RunResult:
        return RunResult(
            run_id=self._run_id,
            stop_reason=reason,
            final_answer=self._final_answer if reason is StopReason.FINAL_ANSWER else None,
            steps=tuple(self._steps),
            event_delivery_failures=self._event_failures,
            unknown_outcome=self._in_flight if reason in _LEAVES_UNKNOWN else None,
        )

    async def _finish(self, reason: StopReason) -> RunResult:
        result = self._result(reason)
        self._finish_task = asyncio.ensure_future(
            self._writer.write_run_finished(RunFinished(run_id=self._run_id, result=result))
        )
        # Shielded: a cancellation arriving now must not tear the one finish record; the
        # cancel path waits for this same task instead of writing a second record.
        await asyncio.shield(self._finish_task)
        return result


def _elapsed_ms(started: float) -> int:
    """Whole milliseconds since ``started`` (a ``time.monotonic()`` reading)."""
    return int((time.monotonic() - started) * 1000)


def _checked_lease_wait(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(
            f"lease_wait_seconds must be a number of seconds (0 to refuse a held run at once), "
            f"got {type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0:
        raise PolyloopValueError(
            f"lease_wait_seconds must be finite and >= 0 (0 to refuse a held run at once), "
            f"got {value!r}"
        )
    return float(value)


async def run(
    definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float = 0.0
) -> RunResult:
    """Start the run ``request.run_id`` and drive it until it stops.

    Raises ``RunIdentityError`` if the run id already has a log (use ``resume``), and
    ``PolyloopTypeError`` (a ``TypeError``) before any model call if a seam's
    ``parameters()`` reports a non-``str``.
    Exceptions from the executor propagate unchanged; a parser that raises stops the run with
    ``StopReason.PARSER_ERROR`` instead (design 0161). ``CancelledError`` is
    re-raised after the ``CANCELLED`` finish record is written.

    When the store is a ``LeasingRunStore`` the run's lease is taken first (before the log
    is read) and released when this returns or raises; every record is written through it.
    A run leased by someone else raises ``RunLeaseHeldError`` after waiting up to
    ``lease_wait_seconds`` (default: refuse at once), having read and written nothing. A
    lease lost mid-run (expired, taken over) raises ``RunLeaseLostError`` from the write
    that found it lost, and nothing more is written. See design 0120.
    """
    driver = _Driver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.start()


def check_log(log: RunLog, run_id: str) -> LogBreach | None:
    """The first record of ``log`` (the stored log of ``run_id``) that the library could not
    have written, with its line, or ``None``: the structural check ``resume`` runs before it
    trusts any record (``polyloop._recovery.check_log``; design 0160).

    Public here for tools that judge logs without resuming them: ``python -m polyloop verify``
    and the soak scoreboard both call it, so they cannot disagree about a log's structure.
    ``resume`` may additionally pin a dangling action intent to the policy of the action its
    stored reply asks for, which needs the agent's parser; this function does not.
    """
    return _recovery.check_log(log, run_id)


def plan_resume(log: RunLog, run_id: str) -> ResumePlan:
    """What ``resume`` would do with ``log``, the stored log of ``run_id``, decided by the very
    planning code ``resume`` calls first (pure: no store, model or environment is touched).

    The plan is the whole verdict for ``FRESH`` (``resume`` raises ``RunIdentityError``),
    ``CORRUPT`` (``LogCorruptError``), ``ALREADY_FINISHED`` (the stored result is returned),
    ``STOP_UNKNOWN`` (``RESUME_STATE_UNKNOWN``), ``REDO_MODEL_CALL`` and ``REPLAY_LAST_ACTION``.
    Two things ``resume`` adds need the agent's definition and are not in the plan: the drift
    guard (``ParameterDriftError``), and, when steps exist, re-checking whether the last stored
    step should already have stopped the run (a final answer or a completing tool found by
    re-parsing its stored reply, a budget reached) before the plan is followed. Used by
    ``python -m polyloop show`` to say what resume would do.
    """
    return _recovery.plan_resume(log, run_id)


async def resume(
    definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float = 0.0
) -> RunResult:
    """Continue the run ``request.run_id`` from its log.

    A finished run returns its stored result and does nothing else. Otherwise the parameter
    snapshot is recomputed (``ParameterDriftError`` lists every drifted key), the history is
    rebuilt from the stored steps (so the next prompt is byte-identical to the one an
    uninterrupted run would send), and the unsettled execution, if any, is handled by its
    recorded replay policy. ``RunResult.steps`` holds the whole trajectory, earlier processes
    included; ``event_delivery_failures`` counts this process's failures only.

    Raises ``RunIdentityError`` when the run id has no log, ``LogCorruptError`` (naming the
    line) when the log breaks a rule of ``polyloop._recovery.check_log``, finished runs
    included, or when a dangling action intent's replay policy is not the one the library gives
    the action its stored reply asks for (design 0160). Nothing is written then.

    One resumer at a time: with a ``LeasingRunStore`` (all shipped stores) the run's lease is
    taken before the log is read and released when this returns or raises, exactly as in
    ``run()`` (``RunLeaseHeldError`` after ``lease_wait_seconds``; ``RunLeaseLostError`` when
    the lease is lost mid-run, with nothing written after the loss). With a store that offers
    no leases, keeping to one resumer per run id stays the caller's duty (design 0052, 0120).
    """
    driver = _Driver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.resume()


async def continue_cancelled(
    definition: AgentDefinition,
    request: RunRequest,
    *,
    cancelled_run_id: str,
    lease_wait_seconds: float = 0.0,
) -> RunResult:
    """Continue a run that was cancelled by mistake (Ctrl-C), under the new id ``request.run_id``.

    Cancellation stays exact: the run ``cancelled_run_id`` keeps its ``CANCELLED`` finish and
    ``resume`` of it keeps returning that result. This copies every record of it except the
    finish to the new run id (whose log must be empty) and resumes the new run from there,
    exactly as after a crash at that point: the history is rebuilt, the parameter snapshot must
    not have drifted (``ParameterDriftError``), and an execution the cancellation left in flight
    (``RunResult.unknown_outcome`` of the cancelled run) is handled by its recorded replay
    policy, so a ``NEVER`` action is never repeated (the new run stops with
    ``RESUME_STATE_UNKNOWN``). Design 0163.

    Raises ``RunIdentityError`` when ``cancelled_run_id`` has no log, is unfinished (use
    ``resume``) or finished for another reason, or when ``request.run_id`` is already used;
    ``LogCorruptError`` when the cancelled run's log fails ``check_log``. If this call is itself
    interrupted while copying, the new run id holds a valid prefix: ``resume`` it.
    """
    driver = _Driver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.continue_cancelled(cancelled_run_id)


async def run_or_resume(
    definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float = 0.0
) -> RunResult:
    """Bring the run ``request.run_id`` to an end, whatever state it is in; idempotent.

    * no log: start it (``run``);
    * an unfinished log: continue it (``resume``, with its drift guard and recovery table);
    * a finished log: return the stored result, doing nothing else.

    This is the entry point for anything that may execute the same run more than once without
    knowing how far an earlier attempt got: a distributed engine re-executing the task of a
    dead worker, a duplicate submission, a retry loop. If another caller starts the run between
    this call's read and its start (``run`` raises ``RunIdentityError`` for the exclusive
    start), the call resumes instead. See ``research-wiki/design/0141-run-or-resume.md``.

    With a ``LeasingRunStore``, ``run``/``resume`` hold the run's lease (design 0120): a
    concurrent duplicate gets ``RunLeaseHeldError`` after ``lease_wait_seconds``.

    Raises what ``run`` and ``resume`` raise (``ParameterDriftError``, ``LogCorruptError``,
    an executor's exception); ``RunIdentityError`` only when the id's first record was torn by a
    crash (the store holds an entry that is neither empty nor readable as a run).
    """
    log = await definition.store.read_log(request.run_id)
    if log.is_empty:
        try:
            return await run(definition, request, lease_wait_seconds=lease_wait_seconds)
        except RunIdentityError:
            logger.info(
                "run %s: started by another caller between our read and our start; resuming",
                request.run_id,
            )
    return await resume(definition, request, lease_wait_seconds=lease_wait_seconds)
