"""``RecordFactory`` (readable construction of every record) and ``ContractBase``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import ClassVar

from polyloop.errors import PolyloopValueError
from polyloop.ports import Action, Event, EventKind, ModelCall, ToolCall, ToolProgress
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    Intent,
    IntentKind,
    Message,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    Role,
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepCompleted,
    StepRecord,
    StopReason,
    TextBlock,
)

__all__ = ["RecordFactory"]


class RecordFactory:
    """Builds valid records and call shells with short, readable calls.

    It is a convenience for test bodies, not a subject under test: ``records.action_intent(
    run_id="r1", call_index=0, result_id="a0")`` says what matters and hides the fields that
    do not. Every product is a real instance of the ``polyloop.types`` / ``polyloop.ports``
    class, so it passes that class's own validation and round-trips through
    ``polyloop.serialization``.

    Two rules keep tests honest:

    * Methods that build **log records** (anything a store persists) take ``run_id`` without
      a default. A default would let "two runs do not see each other" quietly become "one run
      written twice".
    * Defaults are the conservative or ordinary case: ``ReplayPolicy.NEVER`` for intents,
      ``ActionStatus.EXECUTED`` for outcomes, a parsed step with an action, one user message
      in a model call.
    """

    action_status: ClassVar[type[ActionStatus]] = ActionStatus
    """The ``ActionStatus`` enum, so tests can write ``records.action_status.EXECUTED``."""

    # ------------------------------------------------------------------ call shells

    def reply(self, *, call_id: str | None = "call-1", content: str = "hi") -> ModelReply:
        """A model reply with empty ``thinking``."""
        return ModelReply(call_id=call_id, content=content, thinking="")

    def model_call(
        self,
        *,
        call_index: int,
        result_id: str,
        run_id: str = "r1",
        messages: Iterable[Message] | None = None,
        binding: Mapping[str, str] | None = None,
        tools: Iterable[Mapping[str, object]] = (),
    ) -> ModelCall:
        """A call to hand to a ``ModelClient``.

        Unlike the log-record methods, ``run_id`` has a default: a call shell never enters a
        log, so no test tells two runs apart by it. ``messages`` defaults to one short user
        message rather than none, because a real client is entitled to refuse an empty prompt
        and the test would then exercise that refusal instead of the reply's shape. Pass
        ``messages=()`` explicitly when an empty prompt is what you want. ``tools`` are tool
        schemas (entries of ``ToolRegistry.schema_for_model()``) for native tool calls.
        """
        chosen = (
            tuple(messages)
            if messages is not None
            else (Message(role=Role.USER, content=(TextBlock(text="Say hello."),)),)
        )
        return ModelCall(
            messages=chosen,
            call_index=call_index,
            run_id=run_id,
            result_id=result_id,
            binding=dict(binding) if binding is not None else {},
            tools=tuple(tools),
        )

    def action(
        self,
        *,
        text: str = "do something",
        tool_name: str | None = None,
        arguments: Mapping[str, object] | None = None,
    ) -> Action:
        """An action. Without ``tool_name`` it is code-style (``tool_call is None``); with it,
        it carries a ``ToolCall`` of that name and ``arguments`` (default: none)."""
        if tool_name is None:
            if arguments is not None:
                raise PolyloopValueError(
                    "RecordFactory.action: arguments need a tool_name; a code-style action "
                    "(tool_name=None) carries no tool call"
                )
            return Action(text=text, tool_call=None)
        return Action(
            text=text,
            tool_call=ToolCall(
                name=tool_name, arguments=dict(arguments) if arguments is not None else {}
            ),
        )

    def event(self, *, step_idx: int = 0, run_id: str = "r1") -> Event:
        """A ``STEP_FINISHED`` event carrying ``step(step_idx=step_idx)`` and an empty
        binding."""
        return Event(
            kind=EventKind.STEP_FINISHED,
            run_id=run_id,
            step=self.step(step_idx=step_idx),
            model_binding={},
        )

    def progress(
        self, *, step_idx: int = 0, run_id: str = "r1", progress: float = 1.0
    ) -> ToolProgress:
        """A progress report of tool ``t`` in step ``step_idx``: ``progress`` of 3, a message."""
        return ToolProgress(
            run_id=run_id,
            step_idx=step_idx,
            tool_name="t",
            tool_call_id=None,
            progress=progress,
            total=3.0,
            message=f"{progress:g} of 3",
        )

    # ------------------------------------------------------------------ step data

    def outcome(
        self,
        *,
        status: ActionStatus = ActionStatus.EXECUTED,
        observation: str | None = None,
        settled_by: str | None = None,
    ) -> ActionOutcome:
        """An action outcome with the given status and a non-synthetic observation (by default
        one that names the status). ``settled_by`` marks the outcome of an execution that was
        in doubt and was settled as executed (``"reconciler"``, ``"person:<name>"``)."""
        return ActionOutcome(
            status=status,
            observation=(
                observation
                if observation is not None
                else f"observation of an action that ended {status.value}"
            ),
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
            settled_by=settled_by,
        )

    def step(self, *, step_idx: int = 0, parse_ok: bool = True) -> StepRecord:
        """A trajectory row.

        ``parse_ok=True`` gives a step whose action was executed; ``parse_ok=False`` gives a
        step without an action (``action`` and ``action_status`` are ``None`` and
        ``parse_error`` is set), the shape of a parse failure.
        """
        if parse_ok:
            return StepRecord(
                step_idx=step_idx,
                raw_output="DO do something",
                content_chars=15,
                thinking_chars=0,
                action="do something",
                parse_ok=True,
                parse_error=None,
                observation="it was done",
                observation_is_synthetic=False,
                observation_truncated_chars=0,
                prompt_chars=40,
                call_id=f"call-{step_idx}",
                step_wall_ms=5,
                action_status=ActionStatus.EXECUTED,
            )
        return StepRecord(
            step_idx=step_idx,
            raw_output="I am not sure what to do.",
            content_chars=25,
            thinking_chars=0,
            action=None,
            parse_ok=False,
            parse_error="the reply contains no action",
            observation="the reply contains no action",
            observation_is_synthetic=False,
            observation_truncated_chars=0,
            prompt_chars=40,
            call_id=f"call-{step_idx}",
            step_wall_ms=5,
            action_status=None,
        )

    def result(
        self,
        *,
        run_id: str,
        stop_reason: StopReason = StopReason.TASK_COMPLETED,
        final_answer: str | None = None,
        steps: Iterable[StepRecord] = (),
    ) -> RunResult:
        """A run result. ``StopReason.FINAL_ANSWER`` needs a non-empty ``final_answer``
        (``RunResult`` enforces it)."""
        return RunResult(
            run_id=run_id,
            stop_reason=stop_reason,
            final_answer=final_answer,
            steps=tuple(steps),
        )

    # ------------------------------------------------------------------ log records

    def run_started(self, *, run_id: str, parameter_snapshot: Mapping[str, str]) -> RunStarted:
        """The first record of a run."""
        return RunStarted(run_id=run_id, parameter_snapshot=parameter_snapshot)

    def model_call_intent(
        self,
        *,
        run_id: str,
        call_index: int,
        result_id: str,
        replay_policy: ReplayPolicy = ReplayPolicy.NEVER,
    ) -> Intent:
        """A write-ahead intent of kind ``MODEL_CALL``."""
        return Intent(
            run_id=run_id,
            kind=IntentKind.MODEL_CALL,
            call_index=call_index,
            result_id=result_id,
            replay_policy=replay_policy,
        )

    def action_intent(
        self,
        *,
        run_id: str,
        call_index: int,
        result_id: str,
        replay_policy: ReplayPolicy = ReplayPolicy.NEVER,
        idempotency_key: str | None = None,
    ) -> Intent:
        """A write-ahead intent of kind ``ACTION``; the default policy is the conservative
        ``NEVER``, so pass ``ReplayPolicy.SAFE`` to build the non-default case.
        ``idempotency_key`` is the key the execution is handed (``None``: none recorded)."""
        return Intent(
            run_id=run_id,
            kind=IntentKind.ACTION,
            call_index=call_index,
            result_id=result_id,
            replay_policy=replay_policy,
            idempotency_key=idempotency_key,
        )

    def model_call_result(
        self,
        *,
        run_id: str,
        result_id: str,
        reply: ModelReply | None = None,
        failure: str | None = None,
    ) -> ModelCallResult:
        """The result of a model call.

        Give ``reply`` for a successful call or ``failure`` for a failed one. With neither,
        the call succeeded with ``reply()``. Giving both is refused by ``ModelCallResult``.
        """
        if reply is None and failure is None:
            reply = self.reply()
        return ModelCallResult(run_id=run_id, result_id=result_id, reply=reply, failure=failure)

    def step_completed(
        self,
        *,
        run_id: str,
        result_id: str | None,
        action_outcome: ActionOutcome | None,
        step: StepRecord,
    ) -> StepCompleted:
        """A finished step. ``result_id`` and ``action_outcome`` are both ``None`` for a step
        without an action and both set otherwise; all four arguments are required so a test
        always says which case it builds."""
        return StepCompleted(
            run_id=run_id, result_id=result_id, action_outcome=action_outcome, step=step
        )

    def settlement(
        self,
        *,
        run_id: str,
        result_id: str,
        verdict: SettlementVerdict = SettlementVerdict.EXECUTED,
        source: SettlementSource | None = None,
        by: str = "ops@example.com",
        at: str = "2026-01-01T00:00:00Z",
        observation: str | None = None,
        note: str = "",
    ) -> Settlement:
        """The verdict on an execution in doubt (default: a person says it was executed).

        ``source`` defaults to ``RECONCILER`` for ``UNKNOWN`` (only a reconciler answers that)
        and to ``PERSON`` otherwise; an ``EXECUTED`` verdict without ``observation`` gets one
        that says so, an ``UNKNOWN`` one without ``note`` a reason.
        """
        executed = verdict is SettlementVerdict.EXECUTED
        unknown = verdict is SettlementVerdict.UNKNOWN
        return Settlement(
            run_id=run_id,
            result_id=result_id,
            verdict=verdict,
            source=source
            if source is not None
            else (SettlementSource.RECONCILER if unknown else SettlementSource.PERSON),
            by=by,
            at=at,
            observation=(
                observation
                if observation is not None or not executed
                else "the tool's system reports it done"
            ),
            note=note if note or not unknown else "the tool's system did not answer",
        )

    def approval_request(
        self,
        *,
        run_id: str,
        step_idx: int = 0,
        tool: str = "transfer",
        arguments: str = '{"amount":250,"to":"acct-17"}',
        tool_call_id: str | None = "call-1",
        requested_at: str = "2026-01-01T00:00:00.000+00:00",
        expires_at: str | None = None,
    ) -> ApprovalRequest:
        """A call of ``tool`` at step ``step_idx`` that waits for approval (design 0210).

        ``result_id`` is the step's action id (``a<step_idx>``) and ``digest`` is
        ``sha256:<hex>`` of the run id, that result id, the tool name and ``arguments``, one per
        line, as the session writes them; ``arguments`` is canonical JSON text.
        """
        text = f"{run_id}\na{step_idx}\n{tool}\n{arguments}"
        digest = "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        return ApprovalRequest(
            run_id=run_id,
            result_id=f"a{step_idx}",
            step_idx=step_idx,
            tool=tool,
            tool_call_id=tool_call_id,
            arguments=arguments,
            digest=digest,
            requested_at=requested_at,
            expires_at=expires_at,
        )

    def approval_decision(
        self,
        request: ApprovalRequest,
        *,
        approved: bool = True,
        expired: bool = False,
        by: str = "ops@example.com",
        at: str = "2026-01-01T00:05:00.000+00:00",
        note: str = "",
        digest: str | None = None,
    ) -> Settlement:
        """A person's decision on ``request`` (a ``Settlement`` with verdict ``approved`` or
        ``rejected``), bound to its digest unless ``digest`` names another one. A rejection
        without ``note`` gets a reason. ``expired=True`` is the rejection resume writes for a
        request whose ``expires_at`` passed (source ``expiry``, by ``polyloop``, reason
        ``"expired"``)."""
        if expired:
            if approved:
                raise PolyloopValueError(
                    "RecordFactory.approval_decision: an expiry only rejects; pass "
                    "approved=False with expired=True"
                )
            by, note = "polyloop", "expired"
        return Settlement(
            run_id=request.run_id,
            result_id=request.result_id,
            verdict=SettlementVerdict.APPROVED if approved else SettlementVerdict.REJECTED,
            source=SettlementSource.EXPIRY if expired else SettlementSource.PERSON,
            by=by,
            at=at,
            note=note if note or approved else "not this amount",
            digest=request.digest if digest is None else digest,
        )

    def run_finished(self, *, run_id: str, result: RunResult | None = None) -> RunFinished:
        """The last record of a run; ``result`` defaults to ``result(run_id=run_id)``."""
        return RunFinished(
            run_id=run_id, result=result if result is not None else self.result(run_id=run_id)
        )
