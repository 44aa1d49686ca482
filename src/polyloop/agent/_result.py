"""What ``Agent.run`` returns, and how it reads to a person (designs 0208, 0230).

``AgentResult`` carries the typed output and the whole ``RunResult``, plus what the run's log
says that a ``RunResult`` does not: whether this call returned the stored result of a run
that had already finished (``already_finished``: nothing ran), the call in doubt with its
idempotency key (``unknown_outcome``, a ``CallInDoubt``), and the requests for approval and
the decisions on record (``approval_requests``, ``settlements``). ``summary()`` tells the run's
state in those words, with the exact ``Agent`` call that decides a waiting or doubtful call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from polyloop import _recovery
from polyloop._common import (
    money_text,
    require_bool,
    require_enum,
    require_int,
    require_nonempty_str,
    require_str,
)
from polyloop.ports import Action, DecisionParser, ParsedReply, RunLog
from polyloop.types import (
    ApprovalRequest,
    IntentKind,
    ReplayPolicy,
    RunResult,
    RunTotals,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepRecord,
    StopReason,
    check_idempotency_key,
)

__all__ = ["AgentResult", "CallInDoubt", "call_in_doubt"]

OutputT = TypeVar("OutputT")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallInDoubt:
    """The execution whose outcome is unknown (``RunResult.unknown_outcome``), as the log has it.

    ``result_id`` is its id (``"a3"``: step 3's action; ``"m3"``: its model call), ``kind``
    which of the two, ``replay_policy`` the policy its intent records, ``idempotency_key`` the
    key it was handed (look the call up by it in the tool's own system), ``tool`` and
    ``arguments`` (canonical JSON) the call its step's stored reply asks for (``None`` for a
    model call, or when the reply asks for no tool call). ``settleable`` is true when a person
    can settle it now (``Agent.resolve``): an action of a run left open in doubt
    (``RESUME_STATE_UNKNOWN``); a finished run's (``CANCELLED``, ``ACTION_TIMEOUT``) and a model
    call's outcome can only be looked up. A run left open ``RETRIES_EXHAUSTED`` is not settled
    either: running it again tries the call again with the same key (design 0227).
    """

    run_id: str
    result_id: str
    step_idx: int
    kind: IntentKind
    replay_policy: ReplayPolicy
    idempotency_key: str
    tool: str | None
    arguments: str | None
    settleable: bool

    def __post_init__(self) -> None:
        owner = "CallInDoubt"
        for name in ("run_id", "result_id"):
            require_nonempty_str(owner, name, getattr(self, name))
        require_int(owner, "step_idx", self.step_idx, minimum=0)
        require_enum(owner, "kind", self.kind, IntentKind)
        require_enum(owner, "replay_policy", self.replay_policy, ReplayPolicy)
        check_idempotency_key("CallInDoubt.idempotency_key", self.idempotency_key)
        for name in ("tool", "arguments"):
            if getattr(self, name) is not None:
                require_str(owner, name, getattr(self, name))
        require_bool(owner, "settleable", self.settleable)

    @property
    def call(self) -> str:
        """The call in words: ``'write_note({"text":"x"})'``, or ``"step 3's model call"``."""
        if self.tool is None:
            what = "model call" if self.kind is IntentKind.MODEL_CALL else "action"
            return f"step {self.step_idx}'s {what}"
        return f"{self.tool}({self.arguments})"


def _canonical(arguments: Mapping[str, object]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _asked_call(log: RunLog, step_idx: int, parser: DecisionParser) -> tuple[str, str] | None:
    """The tool call step ``step_idx``'s stored reply asks for, read by the run's parser."""
    result_id = _recovery.model_result_id(step_idx)
    stored = next((r for r in reversed(log.model_results) if r.result_id == result_id), None)
    if stored is None or stored.reply is None:
        return None
    parsed = parser.parse(stored.reply)
    decision = parsed.decision if isinstance(parsed, ParsedReply) else None
    call = decision.tool_call if isinstance(decision, Action) else None
    if call is None or not isinstance(call.name, str) or not isinstance(call.arguments, Mapping):
        return None
    return call.name, _canonical(call.arguments)


def call_in_doubt(log: RunLog, result: RunResult, parser: DecisionParser) -> CallInDoubt | None:
    """The ``CallInDoubt`` for ``result.unknown_outcome`` from the run's ``log``, or ``None``.

    The intent gives the policy and the key (a key absent from an intent older than schema 1.7
    is the one the library derives, as resume does); the step's stored reply, parsed again by
    ``parser`` (deterministic, as resume relies on), gives the tool and its arguments.
    """
    result_id = result.unknown_outcome
    if result_id is None:
        return None
    intent = next((i for i in reversed(log.intents) if i.result_id == result_id), None)
    if intent is None:
        return None
    asked = None
    if intent.kind is IntentKind.ACTION:
        asked = _asked_call(log, intent.call_index, parser)
    return CallInDoubt(
        run_id=result.run_id,
        result_id=result_id,
        step_idx=intent.call_index,
        kind=intent.kind,
        replay_policy=intent.replay_policy,
        idempotency_key=intent.idempotency_key
        or _recovery.idempotency_key(result.run_id, result_id),
        tool=None if asked is None else asked[0],
        arguments=None if asked is None else asked[1],
        settleable=(
            intent.kind is IntentKind.ACTION
            and result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
            and log.finished is None
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentResult(Generic[OutputT]):
    """What ``Agent.run`` returns: the typed ``output``, the whole ``RunResult``, and what the
    run's log says about waiting, doubtful and decided calls.

    ``output`` is the final answer as the agent's output type (the text for ``str``), rebuilt
    from the answer on record, so a run finished by another process reads the same; ``None``
    when the run stopped for any other reason than a final answer (look at ``stop_reason``).
    ``offered_tools`` are the names of the agent's own tools (``final_result`` left out), so
    ``summary()`` can say when none of them was ever called.

    ``already_finished`` is true when the run had finished before this call: the stored result
    came back and nothing ran (a new ``run_id`` runs the task again). ``pending_approval`` is
    the call an ``AWAITING_APPROVAL`` run waits on (tool, canonical arguments, ``digest``,
    ``expires_at``): decide it with ``Agent.approve``/``Agent.reject``. ``unknown_outcome`` is
    the call whose outcome is unknown, with its idempotency key (``CallInDoubt``): settle it
    with ``Agent.resolve`` when ``settleable``. ``approval_requests`` and ``settlements`` are
    the log's records of those kinds (designs 0206, 0210), in write order.
    """

    output: OutputT | None
    result: RunResult
    offered_tools: tuple[str, ...] = ()
    priced: bool = False
    """Whether the run had prices (``Agent(pricing=...)``): ``summary()`` then states the cost,
    or that it is unknown."""
    already_finished: bool = False
    unknown_outcome: CallInDoubt | None = None
    approval_requests: tuple[ApprovalRequest, ...] = ()
    settlements: tuple[Settlement, ...] = ()

    @property
    def run_id(self) -> str:
        """The run's id (generated when ``run`` was given none): pass it again to resume."""
        return self.result.run_id

    @property
    def stop_reason(self) -> StopReason:
        """Why the run ended (or stopped, waiting for a decision)."""
        return self.result.stop_reason

    @property
    def final_answer(self) -> str | None:
        """The answer as recorded (for a structured output type, its JSON)."""
        return self.result.final_answer

    @property
    def pending_approval(self) -> ApprovalRequest | None:
        """The call the run waits on (``AWAITING_APPROVAL``), else ``None``."""
        return self.result.pending_approval

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        """Every step of the run, across every process that worked on it."""
        return self.result.steps

    @property
    def totals(self) -> RunTotals:
        """Tokens and time summed over the steps."""
        return self.result.totals

    def summary(self) -> str:
        """The run's state for a person: one line, and when a person must act, the calls that
        decide, one per line.

        ``"final_answer after 3 steps and 2 tool calls: (2 + 3) * 4 = 20"``. It says which call
        waits for approval and how to approve or reject it, which call was rejected and why,
        which call is in doubt and the exact ``Agent.resolve`` that settles it, and when the
        run had already finished, that nothing ran. A run that offered tools and never had one
        called says so (issue 26, design 0216). Design 0230.
        """
        return _summary(self)

    def __repr__(self) -> str:
        return (
            f"AgentResult(run_id={self.run_id!r}, stop_reason={self.stop_reason.value!r}, "
            f"steps={len(self.steps)}, output={self.output!r})"
        )


def _cost_note(result: AgentResult[Any]) -> str:
    """``", cost 0.0042"``; ``"at least"`` and the count when some steps have no cost on
    record (their endpoint reported no usage, or a fork copied them from a run without prices;
    designs 0236, 0239); ``""`` for a run without prices."""
    totals = result.totals
    cost = totals.cost
    unknown = sum(1 for step in result.steps if step.cost is None)
    usage_only = unknown == totals.steps_without_usage  # every unknown cost: no usage
    if cost is None:
        if not (result.priced and totals.steps):
            return ""
        why = "no step reported usage" if usage_only else "no step has a cost on record"
        return f", cost unknown ({why})"
    if unknown:
        why = "reported no usage" if usage_only else "with no cost on record"
        return (
            f", cost at least {money_text(cost)} ({_counted(unknown, 'step')} {why}: cost unknown)"
        )
    return f", cost {money_text(cost)}"


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _decision_words(result: AgentResult[Any]) -> list[str]:
    """Each decision on record in words: ``"refund rejected by bob: over the limit"``."""
    tools = {request.result_id: request.tool for request in result.approval_requests}
    words = []
    for decision in result.settlements:
        tool = tools.get(decision.result_id, decision.result_id)
        if decision.verdict is SettlementVerdict.REJECTED:
            if decision.source is SettlementSource.EXPIRY:
                words.append(f"{tool} rejected: its request for approval expired")
            else:
                words.append(f"{tool} rejected by {decision.by}: {decision.note}")
        elif decision.verdict is SettlementVerdict.APPROVED:
            words.append(f"{tool} approved by {decision.by}")
        elif decision.verdict is not SettlementVerdict.UNKNOWN:
            verdict = decision.verdict.value.replace("_", " ")
            words.append(
                f"{decision.result_id} settled as {verdict} by {decision.source.value} "
                f"{decision.by}"
            )
    return words


def _head(result: AgentResult[Any]) -> str:
    """``"<stop reason> after N steps and M tool calls (notes)"``."""
    rejected = {s.result_id for s in result.settlements if s.verdict is SettlementVerdict.REJECTED}
    recorded = {_recovery.action_result_id(step.step_idx) for step in result.steps}
    # The calls the model asked for: the recorded actions, the rejected ones (their step has
    # no action) and the one waiting or in doubt (its step is not recorded yet).
    open_call = result.pending_approval is not None or (
        result.unknown_outcome is not None and result.unknown_outcome.kind is IntentKind.ACTION
    )
    calls = result.totals.actions + len(rejected & recorded) + open_call
    notes = _decision_words(result)
    if result.already_finished:
        notes.insert(
            0,
            "already finished: this is its stored result and nothing ran now; a new run_id "
            "runs the task again",
        )
    if calls == 0 and result.offered_tools:
        notes.append(
            f"none of the offered tools {', '.join(result.offered_tools)} was called: does "
            "the server show the model its tools?"
        )
    text = (
        f"{result.stop_reason.value} after {_counted(result.totals.steps, 'step')} and "
        f"{_counted(calls, 'tool call')}"
    )
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _waiting(result: AgentResult[Any], request: ApprovalRequest) -> str:
    run, digest = repr(result.run_id), repr(request.digest)
    expires = "never" if request.expires_at is None else request.expires_at
    return (
        f": {request.tool}({request.arguments}) waits for a person's approval (step "
        f"{request.step_idx}, asked at {request.requested_at}, expires {expires})\n"
        f"  approve: agent.approve_sync({run}, digest={digest}, by=NAME)\n"
        f"  reject:  agent.reject_sync({run}, digest={digest}, by=NAME, reason=TEXT)\n"
        f"  then run it again (agent.run_sync(prompt, run_id={run})) to go on"
    )


def _doubt(result: AgentResult[Any], doubt: CallInDoubt) -> str:
    run, rid = repr(result.run_id), repr(doubt.result_id)
    head = (
        f": the outcome of {doubt.call} (step {doubt.step_idx}, replay {doubt.replay_policy.value})"
        f" is unknown; look it up by its idempotency key {doubt.idempotency_key}"
    )
    if not doubt.settleable:
        if result.stop_reason is StopReason.RETRIES_EXHAUSTED:
            # Open, not finished (design 0227): the next run tries the call again.
            return (
                f"{head}; the run is open: running it again (agent.run_sync(prompt, "
                f"run_id={run})) tries the call again with the same idempotency key"
            )
        if doubt.kind is IntentKind.MODEL_CALL:
            return head + " (a model call cannot be settled: start the task again)"
        return head + " (the run is finished, so it cannot be settled)"
    return (
        f"{head} in the tool's own system, then settle it:\n"
        f"  it ran:         agent.resolve_sync({run}, result_id={rid}, executed=True, "
        "observation=TEXT, by=NAME)\n"
        f"  it did not run: agent.resolve_sync({run}, result_id={rid}, executed=False, "
        "by=NAME)\n"
        f"  then run it again (agent.run_sync(prompt, run_id={run})) to go on"
    )


def _summary(result: AgentResult[Any]) -> str:
    text = _head(result) + _cost_note(result)
    if result.pending_approval is not None:
        return text + _waiting(result, result.pending_approval)
    if result.unknown_outcome is not None:
        text += _doubt(result, result.unknown_outcome)
    if result.final_answer is not None:
        text += f": {result.final_answer}"
    if result.result.stop_detail is not None:  # tree_limit: which limit, which call (0245)
        text += f": {result.result.stop_detail}"
    return text
