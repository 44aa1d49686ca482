"""A child run as a tool: trees of runs with the promise of one run (design 0245).

``child_tool(definition, request, name=..., description=...)`` is a ``ToolSpec`` whose call
runs a child run: ``request(arguments, child_run_id)`` builds its ``RunRequest`` and
``run_or_resume`` brings it to its end. ``Agent.as_tool`` is the same for an ``Agent``.

==========================  ==================================================================
what                        how
==========================  ==================================================================
the child's run id          ``child_run_id(key)``: from the call's idempotency key, itself
                            derived from the parent's run id and the call's result id, so a
                            replayed call (the same key) re-attaches to the same child; a
                            log under that id whose start names another call (or no parent)
                            is never adopted: ``ToolEnvironmentError``, the parent stops
                            ``env_error``
replay policy               ``IDEMPOTENT``: replaying the call is ``run_or_resume`` of the same
                            id: a finished child is never run again (its stored result is
                            returned, no model call), an unfinished one continues from its
                            log, a cancelled one is continued (``continue_cancelled``) under
                            ``<id>-c``
the link, both ways         the child's ``RunStarted.parent`` (``ParentLink``: run id, step,
                            key, depth); the parent's ``StepRecord.child`` (``ChildRun``: run
                            id, stop reason, the subtree's steps and tokens)
limits                      ``max_depth`` (inherited down the tree), ``max_children`` (per
                            parent run): a call past either starts nothing and finishes the
                            parent ``tree_limit`` (``TreeLimitError``), its ``stop_detail``
                            naming the limit and the call; the child's budget is at most
                            what its parent has left (steps, tokens), and the parent's
                            budget counts the
                            child's subtree (``polyloop._stopping.Counters.after``)
the observation             the child's final answer; for any other stop, a line naming the
                            child, its stop reason and its steps
left open below             a child that stops left open (``awaiting_approval``, in doubt:
                            ``resume_state_unknown``, ``retries_exhausted``)
                            raises ``ChildRunOpenError``: the parent stops the same way, left
                            open; resuming the parent re-attaches
cancellation                the child runs inside the parent's call: cancelling the parent
                            cancels it, and each run writes its own ``cancelled`` finish
fencing                     right before the child is started or continued, the parent's
                            lease is checked (``ToolContext.check_lease``): a holder whose
                            lease on the parent was lost raises ``RunLeaseLostError`` out of
                            the parent's ``run``, the call left open, nothing of the child run
==========================  ==================================================================

Every run of a tree is stored in the child's store, which must be the parent's too: the tool
reads the parent's log there (its depth, its children so far, what its budget has left).
"""

from __future__ import annotations

import dataclasses
import decimal
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from polyloop import _recovery
from polyloop._common import check_seconds
from polyloop._recovery import child_run_id
from polyloop._stopping import Counters
from polyloop.errors import (
    ChildRunOpenError,
    PolyloopTypeError,
    PolyloopValueError,
    ToolEnvironmentError,
    ToolValidationError,
    TreeLimitError,
)
from polyloop.ports import RunLog, ToolContext, TracingSink
from polyloop.session import AgentDefinition, RunRequest, continue_cancelled, run_or_resume
from polyloop.tools import ToolSpec
from polyloop.types import (
    OPEN_STOP_REASONS,
    Budget,
    ChildRun,
    ModelPrices,
    ParentLink,
    ReplayPolicy,
    RunResult,
    StepRecord,
    StopReason,
    Usage,
)

__all__ = [
    "CHILD_TASK_PARAMETERS",
    "DEFAULT_CHILD_LEASE_WAIT",
    "AsTool",
    "ChildDefinition",
    "ChildRequest",
    "child_run_id",
    "child_tool",
    "tree_totals",
]

ChildRequest = Callable[[Mapping[str, object], str], RunRequest]
"""Builds a child's ``RunRequest`` from the call's arguments and the child's run id."""

ChildDefinition = Callable[[], Awaitable[AgentDefinition]]
"""Gives the ``AgentDefinition`` a child runs under, per call (an ``Agent`` with a model
string opens its HTTP client per run)."""

CHILD_TASK_PARAMETERS: Final[Mapping[str, object]] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "the task for the sub-agent"}},
    "required": ["task"],
    "additionalProperties": False,
}
"""The parameters of ``Agent.as_tool``'s tool: one string, the child's task (its prompt)."""

_MAX_ID: Final = 200

DEFAULT_CHILD_LEASE_WAIT: Final = 60.0
"""Seconds a child-run call waits for a child whose lease another holder has."""


def tree_totals(steps: tuple[StepRecord, ...]) -> Counters:
    """The budget counters of a run with ``steps``: its own steps and tokens plus those of the
    child runs its steps ran, recursively (``Counters.after``)."""
    counters = Counters()
    for step in steps:
        counters = counters.after(step)
    return counters


@dataclasses.dataclass(frozen=True, slots=True)
class _Limits:
    name: str
    max_depth: int | None
    max_children: int | None
    lease_wait: float


@dataclasses.dataclass(frozen=True, slots=True)
class _Position:
    """Where the call stands in its tree, read from the parent's log."""

    depth: int
    max_depth: int | None
    budget: Budget


def _position(
    log: RunLog, context: ToolContext, limits: _Limits, own: Budget, *, priced: bool
) -> _Position:
    """The child's depth, inherited depth bound and budget. ``TreeLimitError`` (nothing runs,
    the parent finishes ``tree_limit``) past ``max_depth`` or ``max_children``;
    ``ToolValidationError`` (the call is refused, ``not_executed``) when the parent's budget
    has nothing left for a child."""
    started = log.started
    assert started is not None
    link = started.parent
    depth = 1 if link is None else link.depth + 1
    bounds = [b for b in (limits.max_depth, None if link is None else link.max_depth) if b]
    max_depth = min(bounds) if bounds else None
    if max_depth is not None and depth > max_depth:
        raise TreeLimitError(
            f"tool {limits.name!r}: max_depth {max_depth} reached: a child of run "
            f"{context.run_id!r} would be at depth {depth}",
            limit="max_depth",
            tool=limits.name,
        )
    done = [c.step for c in log.steps if c.step.step_idx < context.step_idx]
    children = sum(1 for step in done if step.child is not None)
    if limits.max_children is not None and children >= limits.max_children:
        raise TreeLimitError(
            f"tool {limits.name!r}: max_children {limits.max_children} reached: run "
            f"{context.run_id!r} has started {children} child runs",
            limit="max_children",
            tool=limits.name,
        )
    return _Position(depth=depth, max_depth=max_depth, budget=_child_budget(log, done, own, priced))


def _child_budget(log: RunLog, done: list[StepRecord], own: Budget, priced: bool) -> Budget:
    """``own``, cut to what the parent has left: its ``max_steps`` less the steps (and child
    subtrees) before this call and this step's own model call, likewise its tokens and its
    cost (``priced``: the child's request has pricing, which a cost budget needs)."""
    snapshot = log.started.parameter_snapshot if log.started is not None else {}
    used = tree_totals(tuple(done))
    steps_left = int(snapshot.get("request.max_steps", own.max_steps)) - used.steps - 1
    if steps_left < 1:
        raise ToolValidationError(
            "the parent run's step budget has no step left for a child run", tool=None
        )
    budget = dataclasses.replace(own, max_steps=min(own.max_steps, steps_left))
    usage = _call_usage(log, len(done))
    parent_tokens = snapshot.get("request.max_total_tokens")
    if parent_tokens is not None:
        tokens_left = (
            int(parent_tokens) - used.tokens - (0 if usage is None else usage.total_tokens)
        )
        if tokens_left < 1:
            raise ToolValidationError(
                "the parent run's token budget has no token left for a child run", tool=None
            )
        mine = own.max_total_tokens
        budget = dataclasses.replace(
            budget, max_total_tokens=tokens_left if mine is None else min(mine, tokens_left)
        )
    parent_cost = snapshot.get("request.max_cost")
    if parent_cost is not None:
        left = _cost_left(snapshot, decimal.Decimal(parent_cost) - used.cost, usage)
        if not priced:
            raise ToolValidationError(
                "the parent run has a cost budget (max_cost), so a child run needs pricing to "
                "be counted: give the child's RunRequest (or Agent) the model's prices",
                tool=None,
            )
        mine_cost = own.max_cost
        budget = dataclasses.replace(
            budget, max_cost=left if mine_cost is None else min(mine_cost, left)
        )
    return budget


def _call_usage(log: RunLog, step_idx: int) -> Usage | None:
    """The usage the step's model call reported (its result is durable before the action)."""
    wanted = _recovery.model_result_id(step_idx)
    result = next((r for r in log.model_results if r.result_id == wanted), None)
    return None if result is None or result.reply is None else result.reply.usage


def _cost_left(
    snapshot: Mapping[str, str], left: decimal.Decimal, usage: Usage | None
) -> decimal.Decimal:
    """``left`` less what this step's model call cost at the parent's prices (its snapshot's
    ``request.pricing``; a call without usage counts nothing here, its step counts it after)."""
    text = snapshot.get("request.pricing", "")
    prices = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if usage is not None and {"input", "output"} <= set(prices):
        cached = prices.get("cached_input")
        left -= ModelPrices(
            input=decimal.Decimal(prices["input"]),
            output=decimal.Decimal(prices["output"]),
            cached_input=None if cached is None else decimal.Decimal(cached),
        ).cost(usage)
    if left <= 0:
        raise ToolValidationError(
            "the parent run's cost budget has nothing left for a child run", tool=None
        )
    return left


def _observation(result: RunResult) -> str:
    if result.stop_reason is StopReason.FINAL_ANSWER and result.final_answer is not None:
        return result.final_answer
    steps = len(result.steps)
    text = (
        f"[the child run {result.run_id} stopped: {result.stop_reason.value} after "
        f"{steps} step{'' if steps == 1 else 's'}]"
    )
    if result.stop_reason is StopReason.TASK_COMPLETED and result.steps:
        text += f" {result.steps[-1].observation}"
    return text


def _check_owner(log: RunLog, run_id: str, request: RunRequest) -> None:
    """Refuse a log under the child's id that is not this call's child: a run started by
    someone else (a top-level run named ``root.a1`` in the tree's store, a parent of another
    tree) is never adopted as the child, resumed or continued (``ToolEnvironmentError``: the
    parent stops ``env_error``, nothing of a child run)."""
    started = log.started
    if started is None:
        return  # no log (start it), or a torn first record (run_or_resume refuses it)
    link, wanted = started.parent, request.parent
    assert wanted is not None
    if link is None or link.idempotency_key != wanted.idempotency_key:
        owner = "no parent" if link is None else f"the parent {link.run_id!r}'s call"
        raise ToolEnvironmentError(
            f"run {wanted.run_id!r}: its call's child run id {run_id!r} (call key "
            f"{wanted.idempotency_key!r}) is taken in the store by a run of {owner}; rename "
            "that run or give this tree a store of its own (a child run id is "
            "'<parent run id>.<call>')"
        )


async def _attach(
    definition: AgentDefinition, request: RunRequest, child_id: str, lease_wait: float
) -> RunResult:
    """``run_or_resume`` of the child; a child cancelled with its parent is continued under
    ``<id>-c`` (then ``<id>-c-c``...), since the parent now goes on. A child whose lease is
    held elsewhere is waited for up to ``lease_wait`` seconds, then ``RunLeaseHeldError``."""
    store = definition.store
    run_id = child_id
    while True:
        log = await store.read_log(run_id)
        _check_owner(log, run_id, request)
        finished = log.finished
        if finished is None or finished.result.stop_reason is not StopReason.CANCELLED:
            break
        previous, run_id = run_id, f"{run_id}-c"
        if len(run_id) > _MAX_ID:
            run_id = "child-" + hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:40]
        if (await store.read_log(run_id)).is_empty:
            renamed = dataclasses.replace(request, run_id=run_id)
            return await continue_cancelled(
                definition, renamed, cancelled_run_id=previous, lease_wait_seconds=lease_wait
            )
    return await run_or_resume(
        definition, dataclasses.replace(request, run_id=run_id), lease_wait_seconds=lease_wait
    )


class _ChildHandler:
    """The handler of a child-run tool (the module docstring says what a call does)."""

    takes_context = True

    def __init__(self, definition: ChildDefinition, request: ChildRequest, limits: _Limits):
        self._definition = definition
        self._request = request
        self._limits = limits

    async def __call__(
        self, arguments: Mapping[str, object], context: ToolContext | None = None, /
    ) -> str:
        if context is None:
            raise ToolEnvironmentError(
                f"tool {self._limits.name!r} runs a child run, which needs the call's "
                "ToolContext (its idempotency key): call it inside a run"
            )
        definition = await self._definition()
        store = definition.store
        parent_log = await store.read_log(context.run_id)
        if parent_log.started is None:
            raise ToolEnvironmentError(
                f"tool {self._limits.name!r}: the parent run {context.run_id!r} has no log in "
                "the child's store; a tree's runs share one store: give the child agent the "
                "parent's store"
            )
        child_id = child_run_id(context.idempotency_key)
        request = self._request(arguments, child_id)
        if not isinstance(request, RunRequest):
            raise PolyloopTypeError(
                f"tool {self._limits.name!r}: the request factory returned "
                f"{type(request).__name__}, not a RunRequest"
            )
        position = _position(
            parent_log, context, self._limits, request.budget, priced=request.pricing is not None
        )
        request = dataclasses.replace(
            request,
            run_id=child_id,
            budget=position.budget,
            parent=ParentLink(
                run_id=context.run_id,
                step_idx=context.step_idx,
                idempotency_key=context.idempotency_key,
                depth=position.depth,
                max_depth=position.max_depth,
            ),
        )
        # Fenced: a holder whose lease on the parent was lost starts (or continues) no child;
        # RunLeaseLostError passes out of the parent's run, the call open on record (0245).
        await context.check_lease()
        sink = definition.event_sink
        if isinstance(sink, TracingSink):  # the child's spans under the call's (0245)
            model = definition.model_client.parameters().get("model")
            with sink.run_scope(child_id, model or None) as record:
                result = await _attach(definition, request, child_id, self._limits.lease_wait)
                record(result)
        else:
            result = await _attach(definition, request, child_id, self._limits.lease_wait)
        if result.stop_reason in OPEN_STOP_REASONS:  # the log says whether it was left open
            child_log = await store.read_log(result.run_id)
            if child_log.finished is None:
                raise ChildRunOpenError(
                    f"the child run {result.run_id} stopped with {result.stop_reason.value}, "
                    "left open",
                    stop_reason=result.stop_reason.value,
                    result=result,
                )
        totals = tree_totals(result.steps)
        priced = any(
            s.cost is not None or (s.child is not None and s.child.cost is not None)
            for s in result.steps
        )
        context.report_child(
            ChildRun(
                run_id=result.run_id,
                stop_reason=result.stop_reason,
                steps=totals.steps,
                tokens=totals.tokens,
                cost=totals.cost if priced else None,
            )
        )
        return _observation(result)


def child_tool(
    definition: AgentDefinition | ChildDefinition,
    request: ChildRequest,
    *,
    name: str,
    description: str,
    parameters: Mapping[str, object] = CHILD_TASK_PARAMETERS,
    max_depth: int | None = None,
    max_children: int | None = None,
    lease_wait_seconds: float = DEFAULT_CHILD_LEASE_WAIT,
) -> ToolSpec:
    """A tool whose call runs a child run (the module docstring is the table of what it does).

    * ``definition``: the child's ``AgentDefinition`` (its store must hold the parent's log:
      one store for the tree), or an async callable returning one per call.
    * ``request(arguments, child_run_id)``: the child's ``RunRequest`` for the call's
      (validated) arguments; its run id is replaced by ``child_run_id``, its budget cut to
      what the parent has left, its ``parent`` set.
    * ``parameters``: the tool's JSON Schema (default: one required string, ``task``).
    * ``max_depth``: the deepest a child may be (the root is at 0); the smallest bound on the
      way down holds. ``max_children``: how many child runs one run may start. ``None``: no
      bound. A call past either starts nothing and finishes the calling run with
      ``StopReason.TREE_LIMIT``, its ``RunResult.stop_detail`` naming the limit and the call.
    * ``lease_wait_seconds``: how long a call waits for a child run whose lease another holder
      has (a parent taken over while its old holder still runs the child); then the call
      raises ``RunLeaseHeldError`` out of the parent's ``run``, its log keeping the call open
      (a later attempt re-attaches). Default ``DEFAULT_CHILD_LEASE_WAIT``.

    The tool's replay policy is ``IDEMPOTENT``: a replay re-attaches to the same child.
    """
    for label, bound in (("max_depth", max_depth), ("max_children", max_children)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise PolyloopTypeError(
                f"child_tool({label}=...) must be an int or None, got {type(bound).__name__}"
            )
        if bound is not None and bound < 1:
            raise PolyloopValueError(f"child_tool({label}={bound}) must be at least 1 (or None)")
    if not callable(request):
        raise PolyloopTypeError(
            "child_tool(request=...) is a function (arguments, child_run_id) -> RunRequest, got "
            f"{type(request).__name__}"
        )
    if isinstance(definition, AgentDefinition):
        fixed = definition

        async def give() -> AgentDefinition:
            return fixed

        source: ChildDefinition = give
    elif callable(definition):
        source = definition
    else:
        raise PolyloopTypeError(
            "child_tool(definition=...) is an AgentDefinition or an async callable returning "
            f"one, got {type(definition).__name__}"
        )
    limits = _Limits(
        name=name,
        max_depth=max_depth,
        max_children=max_children,
        lease_wait=check_seconds(
            lease_wait_seconds,
            where="child_tool",
            field="lease_wait_seconds",
            zero_means="to refuse a held child run at once",
        ),
    )
    return ToolSpec(
        name=name,
        description=description,
        parameters=parameters,
        handler=_ChildHandler(source, request, limits),
        replay_policy=ReplayPolicy.IDEMPOTENT,
        origin={
            "runs": "child",
            "max_depth": str(max_depth),
            "max_children": str(max_children),
        },
    )


class AsTool:
    """What makes an agent a tool of another (design 0245): ``as_tool`` over the agent's
    ``definition()`` and ``request(prompt, run_id)``, which ``Agent`` defines. A base of
    ``polyloop.agent.Agent`` (its own room: the tree, not the agent's course)."""

    __slots__ = ()

    def definition(self) -> AgentDefinition:
        """The ``AgentDefinition`` a child runs under (``Agent.definition``)."""
        raise NotImplementedError

    def request(self, prompt: str, run_id: str) -> RunRequest:
        """The child's ``RunRequest`` for its task (``Agent.request``)."""
        raise NotImplementedError

    def as_tool(
        self,
        name: str,
        description: str,
        *,
        max_depth: int | None = None,
        max_children: int | None = None,
    ) -> ToolSpec:
        """This agent as a tool of another agent: a call runs a child run (design 0245).

        The tool takes one string, ``task``, the child's prompt; the child run is
        ``run_or_resume(definition(), request(task, child_run_id))`` under the id derived from
        the call's idempotency key (``polyloop.agent.child_run_id``), so a replayed call
        re-attaches and a finished child never runs again. The parent's observation is the
        child's final answer (for a structured output type, its JSON), or a line naming the
        child's stop reason. A child left open (awaiting approval, in doubt) stops the parent
        the same way. ``max_depth``, ``max_children``: ``polyloop.agent.child_tool``.

        The child's log goes to this agent's store, which must hold the parent's log too (one
        store for the tree). With a model string the child uses the HTTP client behind
        ``definition()``: close it with ``aclose()``.
        """
        definition, prompt_request = self.definition, self.request

        async def give() -> AgentDefinition:
            return definition()

        def request(arguments: Mapping[str, object], child_run_id: str) -> RunRequest:
            return prompt_request(str(arguments["task"]), child_run_id)

        return child_tool(
            give,
            request,
            name=name,
            description=description,
            max_depth=max_depth,
            max_children=max_children,
        )
