"""``Agent``: the short path to a run, built from the explicit parts (design 0208)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

from polyloop._common import check_bound
from polyloop.agent._child import AsTool
from polyloop.agent._model import DEFAULT_READ_TIMEOUT_SECONDS, GatewayPlan, gateway_plan
from polyloop.agent._output import FINAL_RESULT_TOOL, OutputParser
from polyloop.agent._result import AgentResult, call_in_doubt
from polyloop.agent._tool import is_tool, spec_of
from polyloop.errors import (
    EventLoopRunningError,
    OutputValidationError,
    PolyloopTypeError,
    PolyloopValueError,
)
from polyloop.parsers import NativeToolCallParser
from polyloop.ports import DecisionParser, EventSink, ModelCall, ModelClient, RunLog, RunStore
from polyloop.session import (
    AgentDefinition,
    Pricing,
    RunRequest,
    approve,
    reject,
    resolve,
    run_or_resume,
)
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    RunResult,
    Settlement,
    StopReason,
)

if TYPE_CHECKING:
    from polyloop.adapters import GatewayConnection

__all__ = ["DEFAULT_STORE_DIRECTORY", "Agent", "new_run_id"]

_T = TypeVar("_T")
_S = TypeVar("_S")
_P = ParamSpec("_P")

OutputT = TypeVar("OutputT")

DEFAULT_STORE_DIRECTORY = "runs"
"""Where an ``Agent`` without ``store=`` keeps its logs: ``JsonlRunStore(directory="runs")``."""


def new_run_id() -> str:
    """``agent-<UTC time>-<6 hex digits>``: sortable by start, safe as a file name."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"agent-{stamp}-{secrets.token_hex(3)}"


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _tool_specs(tools: object) -> list[ToolSpec]:
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
        raise PolyloopTypeError(
            "Agent(tools=...) is a list of tools (functions decorated with @tool, or ToolSpecs), "
            f"got {type(tools).__name__}"
        )
    specs: list[ToolSpec] = []
    for index, item in enumerate(tools):
        if isinstance(item, ToolSpec):
            specs.append(item)
        elif is_tool(item):
            specs.append(spec_of(item))
        elif callable(item):
            label = getattr(item, "__name__", type(item).__name__)
            raise PolyloopTypeError(
                f"Agent(tools=[...]): tools[{index}] ({label}) is not decorated; write @tool "
                "(replay 'never': never repeated after a crash) or @tool(replay='safe') above "
                f"its `async def`, or pass ToolSpec.from_function({label}, ...)"
            )
        else:
            raise PolyloopTypeError(
                f"Agent(tools=[...]): tools[{index}] is a {type(item).__name__}; a tool is a "
                "function decorated with @tool or a ToolSpec"
            )
    return specs


def _pricing(pricing: object, budget: Budget) -> Pricing | None:
    if pricing is not None and not isinstance(pricing, Pricing):
        raise PolyloopTypeError(
            f"Agent(pricing=...) must be a polyloop.Pricing (Pricing.from_file or "
            f"Pricing.from_mapping), got {type(pricing).__name__}"
        )
    if pricing is None and budget.max_cost is not None:
        raise PolyloopValueError(
            "Agent(budget=Budget(max_cost=...)) needs the model's prices: pass "
            "pricing=Pricing.from_file(...) or Pricing.from_mapping({...})"
        )
    return pricing


def _store(store: object) -> RunStore:
    if store is None or isinstance(store, str | os.PathLike):
        from polyloop.stores import JsonlRunStore

        directory = DEFAULT_STORE_DIRECTORY if store is None else os.fspath(store)
        if not isinstance(directory, str) or not directory.strip():
            raise PolyloopValueError(
                "Agent(store=...) as a path must name a directory, such as 'runs'"
            )
        return JsonlRunStore(directory=directory)
    if not callable(getattr(store, "write_run_started", None)):
        raise PolyloopTypeError(
            f"Agent(store=...) is a RunStore or a directory path for a JsonlRunStore, got "
            f"{type(store).__name__}"
        )
    return cast("RunStore", store)


def _replay(value: object) -> ReplayPolicy:
    if isinstance(value, ReplayPolicy):
        return value
    by_name = {policy.value: policy for policy in ReplayPolicy}
    if isinstance(value, str) and value in by_name:
        return by_name[value]
    raise PolyloopValueError(
        f"Agent(model_replay_policy={value!r}): use 'safe' (the default: a model call whose "
        "reply was lost is made again), 'idempotent' or 'never'"
    )


def _instructions(
    instructions: object,
    parser: DecisionParser,
    output: OutputParser[Any] | None,
    tools: ToolRegistry,
) -> tuple[Message, ...]:
    """The run-level system message: the caller's instructions and, for a text protocol, what
    the parser asks for (its ``instructions(schemas)``) and how to give a structured answer."""
    if instructions is not None and not isinstance(instructions, str):
        raise PolyloopTypeError(
            f"Agent(instructions=...) must be a str, got {type(instructions).__name__}"
        )
    texts = [instructions] if instructions else []
    if not getattr(parser, "native_tool_calls", False):
        render = getattr(parser, "instructions", None)
        if callable(render):
            rendered = render(tools.schema_for_model())
            if not isinstance(rendered, str):
                raise PolyloopTypeError(
                    f"{type(parser).__name__}.instructions() returned "
                    f"{type(rendered).__name__}, not the text of the instructions"
                )
            texts.append(rendered)
        if output is not None:
            texts.append(output.instructions_note())
    return (Message.system("\n\n".join(texts)),) if texts else ()


def _blocking(start: Callable[[], Awaitable[_T]], name: str) -> _T:
    """``asyncio.run`` of what ``start`` returns, refused inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:

        async def main() -> _T:
            return await start()

        return asyncio.run(main())
    raise EventLoopRunningError(
        f"Agent.{name}_sync() was called inside a running event loop (a notebook, an async "
        f"framework); it cannot block that loop: use `await agent.{name}(...)` there"
    )


def _sync_of(
    method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_S, _P], _T]:
    """The blocking spelling of an ``Agent`` coroutine method, for scripts: ``approve_sync``
    is ``asyncio.run(agent.approve(...))``, refused inside a running event loop."""
    name = method.__name__

    def blocking(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return _blocking(lambda: method(self, *args, **kwargs), name)

    blocking.__name__ = f"{name}_sync"
    blocking.__qualname__ = f"Agent.{name}_sync"
    blocking.__doc__ = (
        f"``{name}`` for scripts: ``asyncio.run(agent.{name}(...))`` with the same arguments. "
        "Raises ``EventLoopRunningError`` where an event loop already runs (use "
        f"``await agent.{name}(...)``)."
    )
    return blocking


class Agent(AsTool, Generic[OutputT]):
    """An agent in one line: a model, tools, and a durable log; runs are ``run_or_resume``.

    ``Agent(model, *, tools=(), store=None, instructions=None, output_type=str, budget=None,
    pricing=None, parser=None, base_url=None, api_key=None, sampling=None,
    model_replay_policy="safe", event_sink=None, model_call_timeout_seconds=None,
    action_timeout_seconds=None, approval_expires_seconds=None)``

    * ``model``: a ``ModelClient``, or ``"openai:<model name>"`` for any OpenAI-compatible
      endpoint: ``base_url=``, else ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``;
      the key is ``api_key=``, else ``OPENAI_API_KEY``, else none (a local server needs none;
      OpenAI's endpoint is refused without one). ``sampling=`` (``GatewaySettings.sampling``,
      e.g. ``{"temperature": 0}``) goes with a model string only. The gateway extra (httpx)
      is imported only for a model string.
    * ``tools``: functions decorated with ``@tool``, or ``ToolSpec``s.
    * ``store``: a ``RunStore``, or a directory for a ``JsonlRunStore``; **default
      ``JsonlRunStore(directory="runs")``**, so a first crash is already resumable.
    * ``instructions``: the system message (``Context.run_level``), if any.
    * ``output_type``: ``str`` (the default: the answer is text), a dataclass, a ``TypedDict``,
      a JSON Schema mapping or a pydantic v2 model class; see ``OutputParser``.
    * ``budget``: **default ``Budget()``** (30 steps, 30 actions, 3 unparseable replies in a
      row, 400,000 prompt characters).
    * ``pricing``: a ``Pricing`` (``Pricing.from_file("prices.toml")``), default ``None``: each
      step's cost is recorded at these prices, ``summary()`` shows the total, and
      ``Budget(max_cost=...)`` needs them (``RunRequest.pricing``, design 0236).
    * ``parser``: **default ``NativeToolCallParser()``** (native tool calls); a text parser
      such as ``JsonToolCallParser()`` gets its ``instructions(...)`` into the system message.
    * ``model_replay_policy``: **default ``"safe"``**: a model call whose reply was lost in a
      crash is made again.
    * ``event_sink``: default ``NullEventSink()``.
    * ``model_call_timeout_seconds``, ``action_timeout_seconds``, ``approval_expires_seconds``:
      ``RunRequest``'s bounds of the same names, **default ``None``** as there (no bound, and
      nothing new in the snapshot); each enters the snapshot when set. A timed-out model call
      is a failed call (``LLM_ERROR``), a timed-out action is in doubt and settled by its
      replay policy (design 0227), an expired approval is rejected as "expired" (design 0225).
    * with a model string, the HTTP client waits at most ``model_call_timeout_seconds`` (when
      set), else ``DEFAULT_READ_TIMEOUT_SECONDS`` (600 s), for the next bytes of a reply: a
      server that accepts the connection and never answers fails the call (``LLM_ERROR``)
      instead of hanging the run. Not in the snapshot.
    * with a model string, ``tool_choice`` is ``GatewaySettings``' default ``"auto"``, sent
      with the tools (design 0216); ``instructions`` become the run-level system message,
      which is where llama-cpp-python's function-calling format writes the tools.

    Every default enters the run's parameter snapshot as in the explicit path
    (``decision_parser.kind``, ``request.model_replay_policy``, ``request.max_*``,
    ``store.kind``); the request also records ``request.fingerprint.prompt`` (and
    ``.instructions``), sha256 digests, so resuming a run id with another prompt is refused.

    ``await agent.run(prompt, run_id=None)`` is ``polyloop.session.run_or_resume`` of
    ``definition()`` and ``request(prompt, run_id)`` (a generated id when none is given):
    it starts, resumes or reports the run and returns an ``AgentResult``; ``run_sync`` is
    the same for scripts. Nothing is hidden: ``definition()`` and ``request()`` return the
    ``AgentDefinition`` and ``RunRequest`` it runs, for the explicit API (``resume``,
    ``continue_cancelled``, ``plan_resume``...). With a model string each ``run`` opens and
    closes its own HTTP client; the one behind ``definition()`` is closed by ``aclose()`` (or
    ``async with agent``). ``repr`` and every error leave the API key out.

    ``approve``, ``reject`` and ``resolve`` (and their ``_sync`` forms) decide on a run the
    agent made: a call waiting for approval (``AgentResult.pending_approval``) or one in doubt
    (``AgentResult.unknown_outcome``). They are ``polyloop.session``'s functions of the same
    names on the agent's store, and build no model client; then ``run`` again goes on
    (design 0230).
    """

    __slots__ = (
        "_bounds",
        "_budget",
        "_connection",
        "_fixed",
        "_output",
        "_parser",
        "_plan",
        "_pricing",
        "_replay",
        "_run_level",
        "_seams",
        "_tools",
    )

    @overload
    def __init__(
        self: Agent[str],
        model: ModelClient | str,
        *,
        tools: Iterable[object] = (),
        store: RunStore | str | os.PathLike[str] | None = None,
        instructions: str | None = None,
        budget: Budget | None = None,
        pricing: Pricing | None = None,
        parser: DecisionParser | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        sampling: Mapping[str, object] | None = None,
        model_replay_policy: ReplayPolicy | str = ReplayPolicy.SAFE,
        event_sink: EventSink | None = None,
        model_call_timeout_seconds: float | None = None,
        action_timeout_seconds: float | None = None,
        approval_expires_seconds: float | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: Agent[dict[str, Any]],
        model: ModelClient | str,
        *,
        output_type: Mapping[str, Any],
        tools: Iterable[object] = (),
        store: RunStore | str | os.PathLike[str] | None = None,
        instructions: str | None = None,
        budget: Budget | None = None,
        pricing: Pricing | None = None,
        parser: DecisionParser | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        sampling: Mapping[str, object] | None = None,
        model_replay_policy: ReplayPolicy | str = ReplayPolicy.SAFE,
        event_sink: EventSink | None = None,
        model_call_timeout_seconds: float | None = None,
        action_timeout_seconds: float | None = None,
        approval_expires_seconds: float | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        model: ModelClient | str,
        *,
        output_type: type[OutputT],
        tools: Iterable[object] = (),
        store: RunStore | str | os.PathLike[str] | None = None,
        instructions: str | None = None,
        budget: Budget | None = None,
        pricing: Pricing | None = None,
        parser: DecisionParser | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        sampling: Mapping[str, object] | None = None,
        model_replay_policy: ReplayPolicy | str = ReplayPolicy.SAFE,
        event_sink: EventSink | None = None,
        model_call_timeout_seconds: float | None = None,
        action_timeout_seconds: float | None = None,
        approval_expires_seconds: float | None = None,
    ) -> None: ...

    def __init__(
        self,
        model: ModelClient | str,
        *,
        output_type: object = str,
        tools: Iterable[object] = (),
        store: RunStore | str | os.PathLike[str] | None = None,
        instructions: str | None = None,
        budget: Budget | None = None,
        pricing: Pricing | None = None,
        parser: DecisionParser | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        sampling: Mapping[str, object] | None = None,
        model_replay_policy: ReplayPolicy | str = ReplayPolicy.SAFE,
        event_sink: EventSink | None = None,
        model_call_timeout_seconds: float | None = None,
        action_timeout_seconds: float | None = None,
        approval_expires_seconds: float | None = None,
    ) -> None:
        given = {
            "model_call_timeout_seconds": model_call_timeout_seconds,
            "action_timeout_seconds": action_timeout_seconds,
            "approval_expires_seconds": approval_expires_seconds,
        }
        self._bounds = {k: check_bound(v, named=f"Agent({k}=...)") for k, v in given.items()}
        self._plan: GatewayPlan | None = None
        self._fixed: ModelClient | None = None
        if isinstance(model, str):
            read_bound = self._bounds["model_call_timeout_seconds"]
            self._plan = gateway_plan(
                model,
                base_url=base_url,
                api_key=api_key,
                sampling=sampling,
                read_timeout_seconds=(
                    DEFAULT_READ_TIMEOUT_SECONDS if read_bound is None else read_bound
                ),
            )
        else:
            self._fixed = _model_client(
                model, base_url=base_url, api_key=api_key, sampling=sampling
            )
        inner = NativeToolCallParser() if parser is None else parser
        if not all(callable(getattr(inner, name, None)) for name in ("parse", "parameters")):
            raise PolyloopTypeError(
                "Agent(parser=...) must be a DecisionParser (an object with parse(reply) and "
                f"parameters()), such as JsonToolCallParser(), got {type(inner).__name__}"
            )
        self._output: OutputParser[Any] | None = (
            None if output_type is str else OutputParser(inner, cast("type[Any]", output_type))
        )
        self._parser: DecisionParser = inner if self._output is None else self._output
        specs = _tool_specs(tools)
        if self._output is not None:
            if any(spec.name == FINAL_RESULT_TOOL for spec in specs):
                raise PolyloopValueError(
                    f"Agent(tools=[...]) has a tool named {FINAL_RESULT_TOOL!r}, the name of "
                    "the structured answer's tool; rename yours (@tool(name=...))"
                )
            specs.append(self._output.tool)
        self._tools = ToolRegistry(specs)
        if budget is not None and not isinstance(budget, Budget):
            raise PolyloopTypeError(
                f"Agent(budget=...) must be a Budget, got {type(budget).__name__}"
            )
        self._budget = Budget() if budget is None else budget
        self._pricing = _pricing(pricing, self._budget)
        self._replay = _replay(model_replay_policy)
        self._run_level = _instructions(instructions, inner, self._output, self._tools)
        seams: dict[str, Any] = {"decision_parser": self._parser, "store": _store(store)}
        if event_sink is not None:
            seams["event_sink"] = event_sink
        self._seams: Mapping[str, Any] = seams
        self._connection: GatewayConnection | None = None
        # Every seam is checked now, not at the first run; a model string's client is built
        # per run, so a stand-in with its claim takes its place for the check.
        self._definition_for(_GatewayStandIn() if self._fixed is None else self._fixed)

    # ------------------------------------------------------------------ the explicit objects

    def _definition_for(self, model_client: ModelClient) -> AgentDefinition:
        parser = self._parser if self._output is None else self._output.inner
        reads_native = getattr(parser, "native_tool_calls", False) is True
        if reads_native and getattr(model_client, "native_tool_calls", False) is not True:
            raise PolyloopTypeError(
                f"Agent(model=...): {type(model_client).__name__} does not claim native tool "
                f"calls (native_tool_calls = True), which the parser {type(parser).__name__} "
                "reads (native tool calls are the default); pass parser=JsonToolCallParser() "
                "for a text protocol, or a model client with native tool calls"
            )
        return AgentDefinition(model_client=model_client, **self._seams)

    def definition(self) -> AgentDefinition:
        """The ``AgentDefinition`` the agent runs: model client, parser, store, event sink.

        With a model string its model client runs on an HTTP client the agent keeps until
        ``aclose()``; ``run`` does not use that one (it opens its own per run).
        """
        if self._fixed is not None:
            return self._definition_for(self._fixed)
        assert self._plan is not None
        if self._connection is None or self._connection.is_closed:
            self._connection = self._plan.connect()
        return self._definition_for(self._connection.model_client)

    def request(self, prompt: str, run_id: str) -> RunRequest:
        """The ``RunRequest`` for ``prompt`` under ``run_id``: the prompt as the goal-level user
        message, the instructions as the run-level system message, the tools (and
        ``final_result`` for a structured output type), the budget, the model replay policy,
        and the ``prompt``/``instructions`` fingerprints."""
        if not isinstance(prompt, str):
            raise PolyloopTypeError(
                f"Agent.run(prompt) must be the task as a str, got {type(prompt).__name__}"
            )
        if not prompt.strip():
            raise PolyloopValueError("Agent.run(prompt) must not be empty: it is the task")
        fingerprints = {"prompt": _digest(prompt)}
        if self._run_level:
            texts = "".join(block.text for block in self._run_level[0].content)
            fingerprints["instructions"] = _digest(texts)
        return RunRequest(
            run_id=run_id,
            context=Context(run_level=self._run_level, goal_level=(Message.user(prompt),)),
            model_replay_policy=self._replay,
            budget=self._budget,
            tools=self._tools,
            # A registry without tools still needs its executor: it refuses every call.
            action_executor=self._tools.executor(),
            fingerprints=fingerprints,
            pricing=self._pricing,
            model_call_timeout_seconds=self._bounds["model_call_timeout_seconds"],
            action_timeout_seconds=self._bounds["action_timeout_seconds"],
            approval_expires_seconds=self._bounds["approval_expires_seconds"],
        )

    # ------------------------------------------------------------------ running

    async def run(self, prompt: str, *, run_id: str | None = None) -> AgentResult[OutputT]:
        """Start, resume or report the run ``run_id`` (generated when ``None``) of ``prompt``:
        ``run_or_resume(definition(), request(prompt, run_id))``. Raises what that raises
        (``ParameterDriftError`` when the settings or the prompt changed since the run
        started, an executor's exception, a gateway error on a broken endpoint...).

        The store's log of the run is read before (so the result can say that a run which
        had already finished ran nothing now) and after (for the call waiting or in doubt and
        the decisions on record: ``AgentResult.pending_approval``, ``unknown_outcome``,
        ``settlements``)."""
        request = self.request(prompt, new_run_id() if run_id is None else run_id)
        before = await self._store.read_log(request.run_id)
        if self._plan is None:
            result = await run_or_resume(self.definition(), request)
        else:
            async with self._plan.connect() as connection:
                result = await run_or_resume(self._definition_for(connection.model_client), request)
        finished_before = before.finished is not None
        log = before if finished_before else await self._store.read_log(request.run_id)
        return self._result(result, log, already_finished=finished_before)

    def run_sync(self, prompt: str, *, run_id: str | None = None) -> AgentResult[OutputT]:
        """``asyncio.run(agent.run(prompt, run_id=run_id))``, for scripts. Raises
        ``EventLoopRunningError`` where an event loop already runs (use ``await agent.run``)."""
        return _blocking(lambda: self.run(prompt, run_id=run_id), "run")

    def _result(
        self, result: RunResult, log: RunLog, *, already_finished: bool
    ) -> AgentResult[OutputT]:
        offered = tuple(name for name in self._tools.names() if name != FINAL_RESULT_TOOL)
        parser = self._parser if self._output is None else self._output.inner
        made: AgentResult[OutputT] = AgentResult(
            output=None,
            result=result,
            offered_tools=offered,
            priced=self._pricing is not None,
            already_finished=already_finished,
            unknown_outcome=call_in_doubt(log, result, parser),
            approval_requests=log.approval_requests,
            settlements=log.settlements,
        )
        text = result.final_answer
        if result.stop_reason is not StopReason.FINAL_ANSWER or text is None:
            return made
        if self._output is None:
            return dataclasses.replace(made, output=cast("OutputT", text))
        try:
            output = self._output.read(text)
        except OutputValidationError as exc:
            raise OutputValidationError(
                f"run {result.run_id!r} finished with an answer that does not fit "
                f"{self._output.output_label} ({exc}); it finished under another output type, "
                "so start the task again under a new run id",
                problems=exc.problems,
            ) from exc
        return dataclasses.replace(made, output=cast("OutputT", output))

    # ------------------------------------------------------------------ deciding (design 0230)

    @property
    def _store(self) -> RunStore:
        """The run store itself: deciding and reading need no model client (and so open no
        HTTP client for a model string)."""
        return cast("RunStore", self._seams["store"])

    async def approve(
        self, run_id: str, *, digest: str, by: str, note: str = "", lease_wait_seconds: float = 0.0
    ) -> Settlement:
        """Approve the call the run ``run_id`` waits on: ``polyloop.session.approve`` on this
        agent's store (the same record, refusals and lease; no model client is built).

        ``digest`` is ``result.pending_approval.digest``: the decision binds to exactly that
        call. ``ResolutionError`` (``reason``: ``no_log``, ``not_awaiting``, ``wrong_digest``,
        ``conflicting_decision``, ``expired``...) refuses it, writing nothing. Then
        ``agent.run(prompt, run_id=run_id)`` executes the call under its replay policy and goes
        on. ``approve_sync`` is the same for scripts."""
        return await approve(
            self._store,
            run_id,
            digest=digest,
            by=by,
            note=note,
            lease_wait_seconds=lease_wait_seconds,
        )

    async def reject(
        self, run_id: str, *, digest: str, by: str, reason: str, lease_wait_seconds: float = 0.0
    ) -> Settlement:
        """Reject the call the run ``run_id`` waits on (``polyloop.session.reject``, as
        ``approve``): the call never executes; on ``agent.run`` again the model reads ``reason``
        and the run goes on. ``reject_sync`` is the same for scripts."""
        return await reject(
            self._store,
            run_id,
            digest=digest,
            by=by,
            reason=reason,
            lease_wait_seconds=lease_wait_seconds,
        )

    async def resolve(
        self,
        run_id: str,
        *,
        result_id: str,
        executed: bool,
        observation: str | None = None,
        by: str,
        note: str = "",
        lease_wait_seconds: float = 0.0,
    ) -> Settlement:
        """Settle the call the run ``run_id`` is in doubt about (``polyloop.session.resolve``
        on this agent's store: the same record, refusals and lease).

        ``result_id`` is ``result.unknown_outcome.result_id``; ``executed=True`` with
        ``observation`` (what the tool's system says happened: the step records it and
        nothing runs) or ``executed=False`` (the call runs on ``agent.run`` again, with its
        recorded idempotency key). ``resolve_sync`` is the same for scripts."""
        return await resolve(
            self._store,
            run_id,
            result_id=result_id,
            executed=executed,
            observation=observation,
            by=by,
            note=note,
            lease_wait_seconds=lease_wait_seconds,
        )

    approve_sync = _sync_of(approve)
    reject_sync = _sync_of(reject)
    resolve_sync = _sync_of(resolve)

    # ------------------------------------------------------------------ lifetime and display

    async def aclose(self) -> None:
        """Close the HTTP client behind ``definition()``, if one was opened (idempotent)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.aclose()

    async def __aenter__(self) -> Agent[OutputT]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        if self._plan is not None:
            model = f"{self._plan.model!r}, endpoint={self._plan.settings.base_url!r}"
        else:
            model = type(self._fixed).__name__
        output = "str" if self._output is None else self._output.output_label
        return (
            f"Agent({model}, tools={list(self._tools.names())!r}, output_type={output}, "
            f"store={self._seams['store']!r})"
        )


class _GatewayStandIn:
    """What ``AgentDefinition`` checks of a model client, for the check at construction of an
    agent whose client (a gateway one: native tool calls) is built per run. Never called."""

    native_tool_calls = True

    async def call(self, call: ModelCall) -> ModelReply:
        raise AssertionError("the stand-in model client is never called")

    def parameters(self) -> Mapping[str, str]:
        return {}


def _model_client(
    model: object,
    *,
    base_url: str | None,
    api_key: str | None,
    sampling: Mapping[str, object] | None,
) -> ModelClient:
    given = [
        name
        for name, value in (("base_url", base_url), ("api_key", api_key), ("sampling", sampling))
        if value is not None
    ]
    if given:
        raise PolyloopTypeError(
            f"Agent({', '.join(f'{name}=' for name in given)}...) configures the client a model "
            f"string builds; the {type(model).__name__} passed as model= has its own settings: "
            "drop them, or pass model='openai:<model name>'"
        )
    if not (
        callable(getattr(model, "call", None)) and callable(getattr(model, "parameters", None))
    ):
        raise PolyloopTypeError(
            "Agent(model=...) is 'openai:<model name>' or a ModelClient (an object with "
            f"`async def call(call)` and `parameters()`), got {type(model).__name__}"
        )
    return cast("ModelClient", model)
