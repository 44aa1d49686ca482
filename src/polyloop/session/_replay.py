"""Replay: a recorded run driven through today's settings offline (design 0240).

The recorded model replies stand in for the model and the recorded outcomes for the tools:
nothing is sent and nothing is executed. Each recorded step is taken through what today's
code does with it, and the first step where anything differs is reported:

==================  ==========================================================================
check, in order     today's side                         the recorded side
==================  ==========================================================================
``stop_reason``     ``_stopping.stop_before_call`` with  the run made the step
(before the call)   today's budget
``prompt``          the prompt today's ``RunState``      the prompt rebuilt from the log
                    assembles (today's context,          (the recorded context when the
                    injections, template; history of     start holds one, the recorded
                    today's replayed steps)              template, the recorded steps), and
                                                         the recorded ``prompt_chars``
``decision``        today's parser on the recorded       the recorded step: parsed or not,
                    reply (``parse_reply``, contained)   the action, the history text, the
                                                         native tool calls
``tool``            today's registry: the called tool's  the start's snapshot
                    schema digest, replay policy,        (``action_executor.tool.<name>.*``)
                    completion and approval flags        and the action intent's policy
``stop_reason``     ``_stopping.stop_after_step``        the run went on, or its finish
(after the step)
==================  ==========================================================================

A step whose call waited for approval replays its recorded decision (an approved call's
outcome, a rejected call's rejection). A fork's copied steps (design 0239) are taken into the
history as recorded, as a resume takes them, and not compared: the source's settings made
them; the fork's own steps are. The open step of an unfinished log (a reply whose
action has an intent and no result) is checked for its decision and its tool, as far as the
log goes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from polyloop import _recovery, _stopping
from polyloop._assembly import assemble, own_history_pair
from polyloop._stopping import StepFacts
from polyloop.errors import LogCorruptError
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ParsedReply, RunLog
from polyloop.session._config import AgentDefinition, RunRequest, run_prices
from polyloop.session._decisions import parse_reply, tool_flags
from polyloop.session._resume import rejection_reason
from polyloop.session._seams import claimed_max_output_tokens
from polyloop.session._state import RunState
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    IntentKind,
    Message,
    ModelCallResult,
    Settlement,
    SettlementVerdict,
    StepRecord,
    StopReason,
)

__all__ = ["Divergence", "ReplayReport", "replay_log"]

_UNREPRODUCED: Final = frozenset(
    {
        StopReason.CANCELLED,
        StopReason.ACTION_TIMEOUT,
        StopReason.RESUME_STATE_UNKNOWN,
        StopReason.AWAITING_APPROVAL,
        StopReason.TREE_LIMIT,
    }
)
"""Finishes that come from outside the step (a cancellation, a bound, a doubt, a person, a
child-run tool's tree limit, design 0245):
a replay cannot reproduce them, so it does not compare them."""

_TOOL_KEYS: Final = ("schema", "replay_policy", "completes_run", "needs_approval")
"""The snapshot keys of a tool (``action_executor.tool.<name>.<key>``) a replay compares."""

_SHOWN: Final = 120
"""Characters of a differing text shown in a divergence's detail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """The first place where today's code and settings part from a recorded run.

    ``step_idx`` is the step, ``what`` one of ``"prompt"``, ``"decision"``, ``"tool"`` and
    ``"stop_reason"``, ``detail`` one line saying what differs (recorded, then today's).
    """

    step_idx: int
    what: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayReport:
    """What ``polyloop.session.replay`` found for one run: ``steps`` recorded steps replayed,
    and the first ``divergence`` (``None``: today's code does with the log exactly what the
    recorded run did)."""

    run_id: str
    steps: int
    divergence: Divergence | None

    @property
    def same(self) -> bool:
        """Whether nothing diverged."""
        return self.divergence is None

    def describe(self) -> str:
        """One line: ``<run>: same (N steps)`` or ``<run>: diverged at step K: <what>: ...``."""
        found = self.divergence
        if found is None:
            noun = "step" if self.steps == 1 else "steps"
            return f"{self.run_id}: same ({self.steps} {noun})"
        return f"{self.run_id}: diverged at step {found.step_idx}: {found.what}: {found.detail}"


def _cut(text: str) -> str:
    shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return repr(shown)


def prompt_digest(messages: Sequence[Message]) -> str:
    """``sha256:<hex>`` of a prompt: each message's role, tool call id and text, in order."""
    digest = hashlib.sha256()
    for message in messages:
        text = "".join(getattr(block, "text", "") for block in message.content)
        calls = ";".join(f"{call.name}({call.arguments})" for call in message.tool_calls)
        line = f"{message.role.value}\x1f{message.tool_call_id or ''}\x1f{calls}\x1f{text}\x1e"
        digest.update(line.encode("utf-8", "surrogatepass"))
    return "sha256:" + digest.hexdigest()[:16]


def _message_text(message: Message) -> str:
    return "".join(getattr(block, "text", "") for block in message.content)


class _Replay:
    """One recorded run, replayed step by step against today's definition and request."""

    def __init__(self, definition: AgentDefinition, request: RunRequest, log: RunLog) -> None:
        started = log.started
        assert started is not None
        self._definition = definition
        self._request = request
        self._log = log
        self._run_id = started.run_id
        self._recorded = started.parameter_snapshot
        self._today = request.parameter_snapshot()
        self._template = self._recorded.get(
            "request.observation_template", request.observation_template
        )
        self.state = RunState(request, run_prices(definition, request))
        self._max_output_tokens = claimed_max_output_tokens(definition.model_client)
        self._reference: list[Message] = list(
            assemble(
                context=started.context if started.context is not None else request.context,
                injections=request.injections,
                steps=(),
                observation_template=self._template,
            )
        )
        self._compared = 0
        self._results: Mapping[str, ModelCallResult] = {r.result_id: r for r in log.model_results}
        self._settlements: Mapping[str, Settlement] = {s.result_id: s for s in log.settlements}
        self._policies = {
            intent.call_index: intent.replay_policy
            for intent in log.intents
            if intent.kind is IntentKind.ACTION
        }
        self._tools_checked: set[str] = set()

    # ------------------------------------------------------------------ the run

    def run(self) -> Divergence | None:
        steps = self._log.steps
        started = self._log.started
        copied = 0 if started is None or started.fork is None else started.fork.step_idx
        for position, completed in enumerate(steps):
            if position < copied:
                self._take_copied(completed.step)
                continue
            last = position == len(steps) - 1
            found = self._step(completed.step, completed.action_outcome, last=last)
            if found is not None:
                return found
        return self._open_step(len(steps))

    def _take_copied(self, recorded: StepRecord) -> None:
        """A fork's copied step (design 0239): history, as a resume takes it; the source's
        settings made it, so it is not compared with today's."""
        self.state.add_step(recorded)
        pair, _ = own_history_pair(recorded, self._template)
        self._reference.extend(pair)

    def _step(
        self, recorded: StepRecord, outcome: ActionOutcome | None, *, last: bool
    ) -> Divergence | None:
        idx = recorded.step_idx
        state = self.state
        before = self._stop_before_call()
        if before is not None:
            return Divergence(
                step_idx=idx,
                what="stop_reason",
                detail=f"the recorded run made this step; today's stops before it ({before.value})",
            )
        found = self._prompt(idx, recorded.prompt_chars)
        if found is not None:
            return found
        today, facts, forced = self._today_step(recorded, outcome)
        if isinstance(today, Divergence):
            return today
        found = _decision(idx, recorded, today)
        if found is not None:
            return found
        state.add_step(today)
        pair, _ = own_history_pair(recorded, self._template)
        self._reference.extend(pair)
        verdict = forced or _stopping.stop_after_step(self._request.budget, state.counters, facts)
        return self._stop_after(idx, verdict, last=last)

    def _stop_after(self, idx: int, verdict: StopReason | None, *, last: bool) -> Divergence | None:
        if not last:
            if verdict is None:
                return None
            return Divergence(
                step_idx=idx,
                what="stop_reason",
                detail=f"the recorded run went on after this step; today's stops ({verdict.value})",
            )
        finished = self._log.finished
        if finished is None or finished.result.stop_reason in _UNREPRODUCED:
            return None
        recorded = finished.result.stop_reason
        today = verdict or self._stop_before_call()
        if today is recorded:
            return None
        said = "goes on" if today is None else f"stops with {today.value}"
        return Divergence(
            step_idx=idx,
            what="stop_reason",
            detail=(
                f"the recorded run stopped with {recorded.value} after this step; today's {said}"
            ),
        )

    def _stop_before_call(self) -> StopReason | None:
        """Today's stop before the next call, as the driver's loop decides it."""
        state = self.state
        return _stopping.stop_before_call(
            self._request.budget,
            state.counters,
            state.prompt_chars,
            prices=state.prices,
            max_output_tokens=self._max_output_tokens,
        )

    # ------------------------------------------------------------------ the prompt

    def _prompt(self, idx: int, recorded_chars: int | None) -> Divergence | None:
        today, reference = self.state.prompt, self._reference
        start = self._compared
        for index in range(start, max(len(today), len(reference))):
            mine = today[index] if index < len(today) else None
            theirs = reference[index] if index < len(reference) else None
            if mine != theirs:
                return self._prompt_divergence(idx, index, theirs, mine)
        self._compared = len(today)
        if recorded_chars is not None and recorded_chars != self.state.prompt_chars:
            return Divergence(
                step_idx=idx,
                what="prompt",
                detail=(
                    f"{recorded_chars} characters recorded, {self.state.prompt_chars} today "
                    f"(digest today {prompt_digest(today)})"
                ),
            )
        return None

    def _prompt_divergence(
        self, idx: int, index: int, theirs: Message | None, mine: Message | None
    ) -> Divergence:
        recorded = (
            "none" if theirs is None else f"{theirs.role.value} {_cut(_message_text(theirs))}"
        )
        today = "none" if mine is None else f"{mine.role.value} {_cut(_message_text(mine))}"
        return Divergence(
            step_idx=idx,
            what="prompt",
            detail=(
                f"digest {prompt_digest(self._reference)} recorded, "
                f"{prompt_digest(self.state.prompt)} today; first differing message {index}: "
                f"recorded {recorded}, today {today}"
            ),
        )

    # ------------------------------------------------------------------ the step

    def _today_step(
        self, recorded: StepRecord, outcome: ActionOutcome | None
    ) -> tuple[StepRecord | Divergence, StepFacts, StopReason | None]:
        """Today's record of the step: today's parse of the recorded reply, the recorded
        outcome standing in for the tool (or the recorded decision on an approval)."""
        idx = recorded.step_idx
        texts = self._definition.synthetic_observations
        result = self._results.get(_recovery.model_result_id(idx))
        reply = None if result is None else result.reply
        if reply is None:
            exceeded = result is not None and result.context_length_exceeded
            facts = StepFacts(
                model_failed=True,
                final_answer=False,
                outcome=None,
                tool_completes_run=False,
                context_length_exceeded=exceeded,
            )
            return _record(recorded, None, observation=texts.model_call_failed), facts, None
        parsed = parse_reply(self._definition.decision_parser, reply, self._run_id, idx)
        if isinstance(parsed, str):
            record = _record(recorded, None, observation=parsed, parse_error=parsed)
            return record, _NO_FACTS, StopReason.PARSER_ERROR
        decision = parsed.decision
        if isinstance(decision, InvalidDecision):
            explanation = decision.explanation
            record = _record(recorded, parsed, observation=explanation, parse_error=explanation)
            return record, _NO_FACTS, None
        if isinstance(decision, FinalAnswer):
            self.state.final_answer = decision.text
            facts = StepFacts(
                model_failed=False, final_answer=True, outcome=None, tool_completes_run=False
            )
            return _record(recorded, parsed, observation=""), facts, None
        assert isinstance(decision, Action)
        return self._action_step(recorded, parsed, decision, outcome)

    def _action_step(
        self,
        recorded: StepRecord,
        parsed: ParsedReply,
        action: Action,
        outcome: ActionOutcome | None,
    ) -> tuple[StepRecord | Divergence, StepFacts, StopReason | None]:
        idx = recorded.step_idx
        texts = self._definition.synthetic_observations
        found = self._tool(idx, action)
        if found is not None:
            return found, _NO_FACTS, None
        decided = self._settlements.get(_recovery.action_result_id(idx))
        if (
            outcome is None
            and decided is not None
            and decided.verdict is SettlementVerdict.REJECTED
        ):
            observation = texts.rejection(rejection_reason(decided))
            return _record(recorded, parsed, observation=observation), _NO_FACTS, None
        if outcome is None:
            # The recorded step has no outcome for an action today's parser sees: the
            # decision check names the difference.
            return _record(recorded, parsed, observation=recorded.observation), _NO_FACTS, None
        if outcome.status is ActionStatus.NOT_EXECUTED:
            observation = texts.rejection(outcome.observation)
        elif outcome.status is ActionStatus.ENV_ERROR:
            observation = texts.env_failed
        else:
            observation = outcome.observation
        record = _record(
            recorded, parsed, observation=observation, action=action.text, status=outcome.status
        )
        completes = tool_flags(self._request.tools, action).completes_run
        facts = StepFacts(
            model_failed=False, final_answer=False, outcome=outcome, tool_completes_run=completes
        )
        return record, facts, None

    def _tool(self, idx: int, action: Action) -> Divergence | None:
        """The called tool as today's registry has it, against the recorded snapshot and the
        policy the action's intent recorded."""
        recorded_policy = self._policies.get(idx)
        today_policy = tool_flags(self._request.tools, action).replay_policy
        call = action.tool_call
        name = call.name if call is not None and isinstance(call.name, str) else None
        if recorded_policy is not None and recorded_policy is not today_policy:
            who = "a code action" if name is None else f"tool {name!r}"
            return Divergence(
                step_idx=idx,
                what="tool",
                detail=(
                    f"{who}: replay policy {recorded_policy.value} recorded, "
                    f"{today_policy.value} today"
                ),
            )
        if name is None or name in self._tools_checked:
            return None
        self._tools_checked.add(name)
        prefix = f"action_executor.tool.{name}."
        if f"{prefix}schema" not in self._recorded:
            return None  # the recorded executor did not describe its tools (not a registry)
        for key in _TOOL_KEYS:
            mine, theirs = self._today.get(prefix + key), self._recorded.get(prefix + key)
            if mine != theirs:
                return Divergence(
                    step_idx=idx,
                    what="tool",
                    detail=(
                        f"tool {name!r}: {key} {theirs or 'absent'} recorded, "
                        f"{mine or 'absent'} today"
                    ),
                )
        return None

    def _open_step(self, idx: int) -> Divergence | None:
        """The open step of an unfinished log: a reply whose action's intent is on record."""
        if self._log.finished is not None:
            return None
        result = self._results.get(_recovery.model_result_id(idx))
        if result is None or result.reply is None or idx not in self._policies:
            return None
        parsed = parse_reply(self._definition.decision_parser, result.reply, self._run_id, idx)
        decision = None if isinstance(parsed, str) else parsed.decision
        if not isinstance(decision, Action):
            return Divergence(
                step_idx=idx,
                what="decision",
                detail="the recorded reply was an action (its intent is on record); today's "
                "parser makes it none",
            )
        return self._tool(idx, decision)


_NO_FACTS: Final = StepFacts(
    model_failed=False, final_answer=False, outcome=None, tool_completes_run=False
)


def _record(
    recorded: StepRecord,
    parsed: ParsedReply | None,
    *,
    observation: str,
    parse_error: str | None = None,
    action: str | None = None,
    status: ActionStatus | None = None,
) -> StepRecord:
    """Today's step record: today's decision, the recorded sizes, timings and outcome."""
    return StepRecord(
        step_idx=recorded.step_idx,
        raw_output="" if parsed is None else parsed.history_text,
        content_chars=recorded.content_chars,
        thinking_chars=recorded.thinking_chars,
        action=action,
        parse_ok=parse_error is None,
        parse_error=parse_error,
        observation=observation,
        observation_is_synthetic=recorded.observation_is_synthetic,
        observation_truncated_chars=recorded.observation_truncated_chars,
        prompt_chars=recorded.prompt_chars,
        call_id=recorded.call_id,
        step_wall_ms=recorded.step_wall_ms,
        action_status=status,
        usage=recorded.usage,
        model_ms=recorded.model_ms,
        action_ms=recorded.action_ms if status is not None else None,
        tool_calls=() if parsed is None else parsed.tool_calls,
    )


def _decision(idx: int, recorded: StepRecord, today: StepRecord) -> Divergence | None:
    """The first field of the parsed decision that differs, recorded then today's."""
    for name, label in (
        ("parse_ok", "parsed"),
        ("parse_error", "parse error"),
        ("action", "action"),
        ("raw_output", "history text"),
        ("tool_calls", "native tool calls"),
    ):
        theirs, mine = getattr(recorded, name), getattr(today, name)
        if theirs != mine:
            return Divergence(
                step_idx=idx,
                what="decision",
                detail=f"{label}: {_shown(theirs)} recorded, {_shown(mine)} today",
            )
    return None


def _shown(value: object) -> str:
    return _cut(value) if isinstance(value, str) else repr(value)


def replay_log(definition: AgentDefinition, request: RunRequest, log: RunLog) -> ReplayReport:
    """Replay ``log`` (a recorded run) through ``definition`` and ``request`` (today's
    settings); see the module docstring. Pure: nothing is called, executed or written.
    ``LogCorruptError`` when the log fails ``check_log``."""
    started = log.started
    run_id = request.run_id if started is None else started.run_id
    breach = _recovery.check_log(log, run_id)
    if breach is not None or started is None:
        detail = "it has no RunStarted" if breach is None else breach.detail
        raise LogCorruptError(
            f"run {run_id!r}: {detail}; replay refused",
            line=None if breach is None else breach.line,
        )
    replay = _Replay(definition, request, log)
    return ReplayReport(run_id=run_id, steps=len(log.steps), divergence=replay.run())
