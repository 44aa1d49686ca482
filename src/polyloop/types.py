"""Persisted data: the values a run is made of and the records its log is made of.

This module is the sink of the dependency graph's data: from ``polyloop`` it imports only the
exception root (``polyloop.errors``) and the shared field checks (``polyloop._common``), and
nothing third-party, so every other layer (and every downstream project) can depend on it.

Every public dataclass is ``frozen=True, slots=True, kw_only=True``. Construction validates the
values whose breakage would otherwise surface far from its cause (a negative budget, an empty
``call_id``, a step record whose action columns disagree); the error names the field and says
what to pass instead. A value of the wrong type raises ``PolyloopTypeError`` (a
``TypeError``), a right-typed value that is not allowed ``PolyloopValueError`` (a
``ValueError``). Sequence fields accept any iterable and are stored as tuples; mapping fields
are copied into read-only views, so a caller's later edits never reach a record.

Fields of persisted structures are only ever added, never renamed or removed; adding one means
raising ``polyloop.serialization.SCHEMA_VERSION``.
"""

from __future__ import annotations

import decimal
import enum
import re
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import ClassVar, Final, cast

from polyloop._common import (
    EXACT_MONEY,
    PER_MILLION,
    frozen_str_mapping,
    money_text,
    require_bool,
    require_enum,
    require_int,
    require_money,
    require_nonempty_str,
    require_str,
    tuple_of,
)
from polyloop.errors import PolyloopTypeError, PolyloopValueError

__all__ = [
    "IDEMPOTENCY_KEY_MAX_CHARS",
    "OPEN_STOP_REASONS",
    "RECORDS",
    "ActionOutcome",
    "ActionStatus",
    "ApprovalRequest",
    "Budget",
    "ChildRun",
    "ContentBlock",
    "Context",
    "ForkOrigin",
    "Injection",
    "Intent",
    "IntentKind",
    "LogRecord",
    "Message",
    "ModelCallResult",
    "ModelPrices",
    "ModelReply",
    "NativeToolCall",
    "ParentLink",
    "RecordKind",
    "RecordTable",
    "ReplayPolicy",
    "ResumeMark",
    "ResumeStopped",
    "Role",
    "RunFinished",
    "RunResult",
    "RunStarted",
    "RunTotals",
    "Settlement",
    "SettlementSource",
    "SettlementVerdict",
    "StepCompleted",
    "StepRecord",
    "StopReason",
    "SyntheticObservations",
    "TextBlock",
    "Usage",
    "check_idempotency_key",
]


# --------------------------------------------------------------------------- enums


class Role(enum.Enum):
    """Author of a message. The library never adds a ``SYSTEM`` message on its own.

    ``TOOL`` is the answer to one native tool call (``Message.tool_call_id`` names it); the
    library writes it only for steps whose assistant turn carried native tool calls.
    """

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ReplayPolicy(enum.Enum):
    """What recovery may do with an execution whose intent is logged but whose result is not.

    ``SAFE``: running it again is harmless (a read-only lookup), so recovery replays it.
    ``IDEMPOTENT``: running it again *with the same idempotency key* has no further effect,
    because the tool's own system deduplicates by the key (a payment API's
    ``Idempotency-Key``); recovery replays it with the key recorded on its intent (design 0205).
    ``NEVER``: it must not run twice; recovery stops the run with
    ``StopReason.RESUME_STATE_UNKNOWN`` instead of guessing. ``NEVER`` is the default wherever
    a default exists, because the cost of a wrong guess is a duplicated side effect.
    """

    SAFE = "safe"
    IDEMPOTENT = "idempotent"
    NEVER = "never"


class ActionStatus(enum.Enum):
    """How far an action got.

    ``EXECUTED``: it ran, *even if it failed* (code raised, a command exited non-zero); the
    error text is an ordinary observation the model can learn from.
    ``NOT_EXECUTED``: it never entered execution (unknown tool, invalid arguments, an action
    form the executor cannot dispatch). The run goes on.
    ``ENV_ERROR``: the environment itself can no longer serve. The run stops with
    ``StopReason.ENV_ERROR``. Executors *return* this status; they do not raise it.
    """

    EXECUTED = "executed"
    NOT_EXECUTED = "not_executed"
    ENV_ERROR = "env_error"


class StopReason(enum.Enum):
    """Why a run ended. Every ``RunResult`` carries exactly one.

    The order in which the conditions are checked (and which wins when two hold after the same
    step) is documented in ``research-wiki/reference/stop-reasons.md``.
    """

    TASK_COMPLETED = "task_completed"
    """The environment reported completion, or an executed tool has ``completes_run=True``."""
    FINAL_ANSWER = "final_answer"
    """The agent declared a final answer (``ports.FinalAnswer``)."""
    STEP_BUDGET = "step_budget"
    """``Budget.max_steps`` model calls were made."""
    ACTION_BUDGET = "action_budget"
    """``Budget.max_actions`` actions were handed to the executor."""
    PARSE_FAILURES = "parse_failures"
    """``Budget.max_consecutive_parse_failures`` replies in a row could not be parsed."""
    PROMPT_TOO_LARGE = "prompt_too_large"
    """The next prompt would exceed ``Budget.max_prompt_chars``; nothing was sent or logged."""
    LLM_ERROR = "llm_error"
    """The model client raised."""
    ENV_ERROR = "env_error"
    """The executor returned ``ActionStatus.ENV_ERROR``."""
    TOKEN_BUDGET = "token_budget"
    """The tokens of the run's model calls reached ``Budget.max_total_tokens`` (design 0201)."""
    PROMPT_TOKEN_LIMIT = "prompt_token_limit"
    """The next prompt's estimated tokens exceed ``Budget.max_prompt_tokens``; nothing was sent
    or logged."""
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    """The endpoint refused the prompt as longer than the model's context (the model client
    raised ``polyloop.errors.ContextLengthExceededError``)."""
    CANCELLED = "cancelled"
    """The task running the loop was cancelled."""
    RESUME_STATE_UNKNOWN = "resume_state_unknown"
    """Resume found an execution with an intent, no result and ``ReplayPolicy.NEVER``."""
    AWAITING_APPROVAL = "awaiting_approval"
    """The model called a tool that needs a person's approval first (``ToolSpec.needs_approval``,
    design 0210): the request is on record, nothing was executed, and the run stays open until
    it is approved or rejected (``polyloop.session.approve``/``reject``); no finish record."""
    ACTION_TIMEOUT = "action_timeout"
    """Logs written before design 0227 only: the executor did not return within
    ``RunRequest.action_timeout_seconds`` and the run finished with the intent unanswered. A
    timeout is now an outcome in doubt settled by the action's replay policy."""
    RETRIES_EXHAUSTED = "retries_exhausted"
    """A ``SAFE`` or ``IDEMPOTENT`` action's outcome stayed unknown on every attempt this call
    of ``run``/``resume`` made (``ToolOutcomeUnknown``, an action timeout; design 0227), or a
    retry could not reach its tool. No finish record: the run stays open, ``unknown_outcome``
    names the action, and the next ``resume`` tries it again with the same idempotency key."""
    COST_BUDGET = "cost_budget"
    """The run's cost reached ``Budget.max_cost``, or the next call could cross it (its prompt
    at the input price plus the client's ``max_output_tokens`` at the output price; nothing was
    sent or logged then). Design 0236."""
    PARSER_ERROR = "parser_error"
    """The decision parser raised (or returned something other than a ``ParsedReply``)
    instead of returning ``InvalidDecision``: a contract breach, contained so that the stored
    reply cannot wedge the run. The last step's ``parse_error`` holds the description."""
    TREE_LIMIT = "tree_limit"
    """A call of a child-run tool would have started a child past the tool's ``max_depth`` or
    ``max_children`` (design 0245): nothing of the child was started, the call's action intent
    stays unanswered and the run finished; ``RunResult.stop_detail`` names the limit and the
    call."""


OPEN_STOP_REASONS: Final = frozenset(
    {StopReason.RESUME_STATE_UNKNOWN, StopReason.AWAITING_APPROVAL, StopReason.RETRIES_EXHAUSTED}
)
"""The stop reasons a run may be left open with (no ``RunFinished``): it waits for a decision
from outside (a settlement, design 0206; an approval, design 0210) or, after
``RETRIES_EXHAUSTED``, for a resume that tries the action in doubt again (design 0227). A
``ResumeStopped`` reports only these. A model call in doubt is the exception the other way:
it finishes its run ``RESUME_STATE_UNKNOWN``, so the log, not the reason, says whether a run
was left open."""


class IntentKind(enum.Enum):
    """The two kinds of execution that get a write-ahead intent."""

    MODEL_CALL = "model_call"
    ACTION = "action"


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True, kw_only=True)
class TextBlock:
    """A piece of text inside a message. The only content block in this version."""

    text: str

    def __post_init__(self) -> None:
        require_str("TextBlock", "text", self.text)


ContentBlock = TextBlock
"""The union of content block types. A new block type must come with its own size metric."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NativeToolCall:
    """One tool call as a model's native function-calling API returned it.

    ``id`` is the provider's id for this call (the ``tool`` message that answers it must carry
    it back); ``name`` is the tool the model asked for, unchecked; ``arguments`` is the raw
    argument text exactly as the model wrote it, which is usually, but not always, a JSON
    object. Nothing is parsed or judged here: the log records what the model said, and the
    decision parser decides what it means (design 0100).
    """

    id: str
    name: str
    arguments: str

    def __post_init__(self) -> None:
        require_nonempty_str("NativeToolCall", "id", self.id)
        require_str("NativeToolCall", "name", self.name)
        require_str("NativeToolCall", "arguments", self.arguments)


def _tool_calls(owner: str, value: object) -> tuple[NativeToolCall, ...]:
    calls = cast("tuple[NativeToolCall, ...]", tuple_of(owner, "tool_calls", value, NativeToolCall))
    seen: set[str] = set()
    for call in calls:
        if call.id in seen:
            raise PolyloopValueError(
                f"{owner}.tool_calls has the id {call.id!r} twice; every tool call of one "
                "turn needs its own id, because its answer is matched by it"
            )
        seen.add(call.id)
    return calls


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One chat message: a role and a sequence of content blocks (not a bare string).

    ``tool_calls`` are the native tool calls of an ``ASSISTANT`` turn (empty for every other
    role). ``tool_call_id`` is set exactly on ``TOOL`` messages: the id of the call the message
    answers.
    """

    role: Role
    content: tuple[ContentBlock, ...]
    tool_calls: tuple[NativeToolCall, ...] = ()
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        require_enum("Message", "role", self.role, Role)
        object.__setattr__(self, "content", tuple_of("Message", "content", self.content, TextBlock))
        object.__setattr__(self, "tool_calls", _tool_calls("Message", self.tool_calls))
        if self.tool_calls and self.role is not Role.ASSISTANT:
            raise PolyloopValueError(
                f"Message.tool_calls is only for Role.ASSISTANT turns, not {self.role}; the "
                "answer to a tool call is a Role.TOOL message with tool_call_id"
            )
        if self.role is Role.TOOL:
            require_nonempty_str("Message", "tool_call_id", self.tool_call_id)
        elif self.tool_call_id is not None:
            raise PolyloopValueError(
                f"Message.tool_call_id is only for Role.TOOL messages, not {self.role}; "
                "leave it None"
            )

    @classmethod
    def of(cls, role: Role, *texts: str) -> Message:
        """A ``role`` message with one ``TextBlock`` per text: ``Message.of(Role.USER, "hi")``."""
        for index, text in enumerate(texts):
            require_str("Message.of", f"texts[{index}]", text)
        return cls(role=role, content=tuple(TextBlock(text=text) for text in texts))

    @classmethod
    def user(cls, *texts: str) -> Message:
        """``Message(role=Role.USER, content=(TextBlock(text=...), ...))``, one block per text."""
        return cls.of(Role.USER, *texts)

    @classmethod
    def assistant(cls, *texts: str) -> Message:
        """A ``Role.ASSISTANT`` message, one ``TextBlock`` per text (for demonstrations)."""
        return cls.of(Role.ASSISTANT, *texts)

    @classmethod
    def system(cls, *texts: str) -> Message:
        """A ``Role.SYSTEM`` message, one ``TextBlock`` per text. The library never adds one;
        this is for callers who put their own system prompt into ``Context.run_level``."""
        return cls.of(Role.SYSTEM, *texts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """Rendered prompt segments supplied by the caller.

    ``run_level`` is what stays the same across a batch (role description, demonstrations);
    ``goal_level`` is the per-task text. Context text never enters the parameter snapshot.
    """

    run_level: tuple[Message, ...] = ()
    goal_level: tuple[Message, ...] = ()

    def __post_init__(self) -> None:
        for name in ("run_level", "goal_level"):
            object.__setattr__(self, name, tuple_of("Context", name, getattr(self, name), Message))


@dataclass(frozen=True, slots=True, kw_only=True)
class Injection:
    """One entry pasted verbatim into the prompt's injection slot.

    ``entry_id`` is recorded in the parameter snapshot (ids of one channel are joined with
    ``","``, so an id containing a comma is refused). ``content`` is pasted as is and is never
    recorded anywhere.
    """

    entry_id: str
    content: str

    def __post_init__(self) -> None:
        require_nonempty_str("Injection", "entry_id", self.entry_id)
        if "," in self.entry_id:
            raise PolyloopValueError(
                f"Injection.entry_id {self.entry_id!r} contains ','; the parameter snapshot "
                "joins ids with commas, so choose an id without one"
            )
        require_str("Injection", "content", self.content)


# --------------------------------------------------------------------------- money


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPrices:
    """What one model's tokens cost, per million tokens, as the user's contract states it
    (design 0236; ``polyloop.Pricing`` maps model names to these).

    ``input`` prices prompt tokens, ``cached_input`` the prompt tokens the endpoint reports as
    served from its cache (``Usage.cached_tokens``; ``None`` means the same as ``input``),
    ``output`` completion tokens. Each is a ``Decimal``, an ``int`` or a decimal string; a
    ``float`` is refused. They are stored as ``Decimal``. polyloop ships no prices.
    """

    input: decimal.Decimal
    output: decimal.Decimal
    cached_input: decimal.Decimal | None = None

    def __post_init__(self) -> None:
        owner = "ModelPrices"
        object.__setattr__(self, "input", require_money(owner, "input", self.input))
        object.__setattr__(self, "output", require_money(owner, "output", self.output))
        cached = self.input if self.cached_input is None else self.cached_input
        object.__setattr__(self, "cached_input", require_money(owner, "cached_input", cached))

    @property
    def _cached(self) -> decimal.Decimal:
        cached = self.cached_input
        return self.input if cached is None else cached

    def cost(self, usage: Usage) -> decimal.Decimal:
        """The exact cost of a call that reported ``usage``: uncached prompt tokens at
        ``input``, cached ones at ``cached_input``, completion tokens at ``output``, divided
        by one million (``Decimal`` arithmetic, never rounded)."""
        cached = min(usage.cached_tokens or 0, usage.prompt_tokens)
        ctx = EXACT_MONEY
        total = ctx.add(
            ctx.add(
                ctx.multiply(decimal.Decimal(usage.prompt_tokens - cached), self.input),
                ctx.multiply(decimal.Decimal(cached), self._cached),
            ),
            ctx.multiply(decimal.Decimal(usage.completion_tokens), self.output),
        )
        return ctx.divide(total, PER_MILLION)

    def at_most(self, prompt_tokens: int, completion_tokens: int) -> decimal.Decimal:
        """The most a call of ``prompt_tokens`` and ``completion_tokens`` can cost: every
        prompt token at the higher of ``input`` and ``cached_input``."""
        ctx = EXACT_MONEY
        total = ctx.add(
            ctx.multiply(decimal.Decimal(prompt_tokens), max(self.input, self._cached)),
            ctx.multiply(decimal.Decimal(completion_tokens), self.output),
        )
        return ctx.divide(total, PER_MILLION)

    def snapshot_text(self, model: str) -> str:
        """These prices for ``model`` as one canonical line (the ``request.pricing`` value)."""
        return (
            f"model={model} input={money_text(self.input)} "
            f"cached_input={money_text(self._cached)} output={money_text(self.output)}"
        )


# --------------------------------------------------------------------------- run inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The limits of one run: four always enforced and two optional token budgets.

    ``Budget()`` is the stock default (design 0113): 30 steps, 30 actions, 3 consecutive parse
    failures, 400,000 prompt characters (about 100k tokens of English), no token budgets.
    Every value is recorded in the parameter snapshot, so a default is as reproducible as an
    explicit value; pass your own wherever a run's cost matters.

    ``max_steps`` counts model calls (parse failures, failed calls and final answers included).
    ``max_actions`` counts actions handed to the executor, rejected ones included.
    ``max_consecutive_parse_failures`` counts unparseable replies in a row.
    ``max_prompt_chars`` is a hard safety limit checked before every model call; a prompt
    longer than it stops the run. It is never a truncation threshold.

    The token budgets (``None``: not enforced; design 0201) count the endpoint's own tokens.
    ``max_total_tokens`` bounds the prompt plus completion tokens of all the run's model calls
    (``StopReason.TOKEN_BUDGET`` after the step that reaches it). ``max_prompt_tokens`` is
    checked before every model call against an estimate of the next prompt's tokens
    (``StopReason.PROMPT_TOKEN_LIMIT``; nothing sent, nothing logged): the last reported
    ``prompt_tokens`` plus the characters added since, at the characters-per-token ratio
    that report showed; before any report, ``prompt_chars / ESTIMATE_CHARS_PER_TOKEN``
    rounded up (``polyloop._stopping``). A step whose endpoint reported no usage counts at the
    same estimate. Neither budget ever truncates anything.
    """

    max_steps: int = 30
    max_actions: int = 30
    max_consecutive_parse_failures: int = 3
    max_prompt_chars: int = 400_000
    max_total_tokens: int | None = None
    max_prompt_tokens: int | None = None
    max_cost: decimal.Decimal | None = None
    """The most the run may cost, in the currency of ``RunRequest.pricing`` (``None``: not
    enforced; design 0236): a ``Decimal``, an ``int`` or a decimal string, > 0. Checked after
    every step (``StopReason.COST_BUDGET`` once the cost reaches it) and before every call
    (refused when the prompt at the input price plus the client's ``max_output_tokens`` at the
    output price could cross it). A step whose endpoint reported no usage counts at the
    character estimate the token budgets use. Needs ``RunRequest.pricing``."""

    def __post_init__(self) -> None:
        if self.max_cost is not None:
            object.__setattr__(
                self, "max_cost", require_money("Budget", "max_cost", self.max_cost, positive=True)
            )
        for name in (
            "max_steps",
            "max_actions",
            "max_consecutive_parse_failures",
            "max_prompt_chars",
        ):
            require_int("Budget", name, getattr(self, name), minimum=1)
        for name in ("max_total_tokens", "max_prompt_tokens"):
            if getattr(self, name) is not None:
                require_int("Budget", name, getattr(self, name), minimum=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticObservations:
    """Fixed texts the library puts in history where no real observation exists.

    ``action_rejected`` replaces the observation of a ``NOT_EXECUTED`` action, ``env_failed``
    that of an ``ENV_ERROR`` action, and ``model_call_failed`` is the observation of a step
    whose model call raised. Fixed texts keep two runs of one configuration identical.

    ``action_rejected`` may opt in to the executor's reason with the placeholder
    ``{reason}`` (see ``rejection``): ``"[rejected] {reason}"`` shows the model
    ``"[rejected] not executed: tool 'add': the required parameter 'b' is missing"`` for a
    ``RegistryExecutor`` refusal, so a model that forgot an argument learns which one.

    ``SyntheticObservations()`` holds the stock texts (design 0113); its ``action_rejected``
    uses the placeholder. The texts enter the parameter snapshot like explicit ones.
    """

    action_rejected: str = "[not executed] {reason}"
    env_failed: str = "[the environment failed]"
    model_call_failed: str = "[the model call failed]"

    REASON: ClassVar[str] = "{reason}"
    """The opt-in placeholder of ``action_rejected``: replaced by the executor's reason."""

    NO_REASON: ClassVar[str] = "(no reason given)"
    """What ``REASON`` becomes when the executor's observation is empty or blank."""

    def __post_init__(self) -> None:
        for name in ("action_rejected", "env_failed", "model_call_failed"):
            require_nonempty_str("SyntheticObservations", name, getattr(self, name))

    def rejection(self, reason: str) -> str:
        """The observation of a ``NOT_EXECUTED`` action whose executor said ``reason``.

        ``action_rejected`` with every ``{reason}`` replaced by ``reason`` (``NO_REASON`` when
        it is blank). A text without the placeholder is returned unchanged, so texts written
        before the placeholder existed behave as they did. The replacement is literal: no
        other brace in the text has a meaning.
        """
        require_str("SyntheticObservations.rejection", "reason", reason)
        return self.action_rejected.replace(
            self.REASON, reason if reason.strip() else self.NO_REASON
        )


# --------------------------------------------------------------------------- step data


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts as the endpoint reported them for one model call (design 0200).

    ``prompt_tokens`` and ``completion_tokens`` are the provider's own figures (its tokenizer,
    its chat template included); ``cached_tokens`` is the part of the prompt the provider says
    it served from its prefix cache, ``None`` when it does not say. The library never invents
    these numbers: a client whose endpoint reports nothing returns ``ModelReply.usage=None``.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    def __post_init__(self) -> None:
        require_int("Usage", "prompt_tokens", self.prompt_tokens, minimum=0)
        require_int("Usage", "completion_tokens", self.completion_tokens, minimum=0)
        if self.cached_tokens is not None:
            require_int("Usage", "cached_tokens", self.cached_tokens, minimum=0)

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + completion_tokens`` (cached tokens are part of the prompt)."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReply:
    """What a model client returns.

    ``call_id`` is the provider's id for the call, the only join key between a trajectory and
    billing. It is ``None`` when the provider gives none, never ``""``. ``usage`` is what the
    endpoint reported about the call's tokens (``None`` when it reported nothing), and
    ``finish_reason`` why it stopped generating (``"stop"``, ``"length"``...; ``None`` when
    not reported). Both are recorded, never interpreted, except that ``usage`` feeds the
    token budgets (``Budget.max_total_tokens``, ``Budget.max_prompt_tokens``).

    ``tool_calls`` are the native tool calls the reply carries beside its text, in the order
    the provider sent them (ids unique; design 0100). ``finish_reason`` ``"length"`` means the
    reply was cut off and its tool calls may be incomplete.
    """

    call_id: str | None
    content: str
    thinking: str = ""
    usage: Usage | None = None
    tool_calls: tuple[NativeToolCall, ...] = ()
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.call_id is not None:
            require_str("ModelReply", "call_id", self.call_id)
            if not self.call_id:
                raise PolyloopValueError(
                    "ModelReply.call_id must be None or a non-empty string, not ''"
                )
        require_str("ModelReply", "content", self.content)
        require_str("ModelReply", "thinking", self.thinking)
        if self.usage is not None and not isinstance(self.usage, Usage):
            raise PolyloopTypeError(
                f"ModelReply.usage must be a polyloop.types.Usage or None, got "
                f"{type(self.usage).__name__}"
            )
        object.__setattr__(self, "tool_calls", _tool_calls("ModelReply", self.tool_calls))
        if self.finish_reason is not None:
            require_nonempty_str("ModelReply", "finish_reason", self.finish_reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionOutcome:
    """What an executor returns for one action. The first five fields are required.

    ``settled_by`` is ``None`` for an outcome an executor returned. It is set only on the
    outcome of an execution that was in doubt (its intent durable, its result lost with a
    process) and was then settled as executed: ``"reconciler"`` when the tool's reconciler
    asked the tool's own system, ``"person:<name>"`` when someone resolved it (design 0206).
    """

    status: ActionStatus
    observation: str
    observation_is_synthetic: bool
    env_reported_completion: bool
    observation_truncated_chars: int
    settled_by: str | None = None

    def __post_init__(self) -> None:
        require_enum("ActionOutcome", "status", self.status, ActionStatus)
        require_str("ActionOutcome", "observation", self.observation)
        require_bool("ActionOutcome", "observation_is_synthetic", self.observation_is_synthetic)
        require_bool("ActionOutcome", "env_reported_completion", self.env_reported_completion)
        require_int(
            "ActionOutcome",
            "observation_truncated_chars",
            self.observation_truncated_chars,
            minimum=0,
        )
        if self.settled_by is not None:
            require_nonempty_str("ActionOutcome", "settled_by", self.settled_by)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRun:
    """The child run a step's action ran (schema 1.9, design 0245): the parent's side of the
    link between two runs of a tree.

    ``run_id`` is the child's run id (derived from the parent's run id and the call's
    idempotency key, ``polyloop.agent.child_run_id``); ``stop_reason`` how the child ended;
    ``steps``, ``tokens`` and ``cost`` what the child's whole subtree used (its own plus its
    children's, recursively): the parent's budget counts them
    (``polyloop._stopping.Counters.after``), so a budget bounds a whole tree.
    """

    run_id: str
    stop_reason: StopReason
    steps: int
    tokens: int
    cost: decimal.Decimal | None = None
    """What the child's subtree cost, as its steps recorded it (``StepRecord.cost``, design
    0236): ``None`` when no step of it had a cost (a run without pricing). The parent's cost
    counter adds it, so ``Budget.max_cost`` bounds a tree too."""

    def __post_init__(self) -> None:
        require_nonempty_str("ChildRun", "run_id", self.run_id)
        require_enum("ChildRun", "stop_reason", self.stop_reason, StopReason)
        require_int("ChildRun", "steps", self.steps, minimum=0)
        require_int("ChildRun", "tokens", self.tokens, minimum=0)
        if self.cost is not None:
            object.__setattr__(self, "cost", require_money("ChildRun", "cost", self.cost))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One row of the trajectory: everything about one model call and what followed it.

    ``raw_output`` is the parser's ``history_text`` (what goes back into history), not
    necessarily the model's original text, which lives in the ``ModelCallResult``.
    ``usage`` is the reply's reported token usage (``None`` for a failed call or an endpoint
    that reports none); ``model_ms`` is how long the model call took and ``action_ms`` how long
    the executor took (``None`` for a step without an action). Steps written before schema 1.1
    have ``None`` in all three.
    ``action`` and ``action_status`` are both ``None`` for a step without an action (parse
    failure, failed model call, final answer) and both set otherwise. ``parse_error`` is set
    exactly when ``parse_ok`` is false.

    ``tool_calls`` are the native tool calls of the step's assistant turn (the parser's
    ``ParsedReply.tool_calls``). When there are any, history shows them on the assistant turn
    and the observation goes back as one ``TOOL`` message per call instead of a ``USER``
    message (design 0100).

    ``child`` is the child run the step's action ran (a tool made by ``Agent.as_tool`` or
    ``polyloop.agent.child_tool``; schema 1.9, design 0245), ``None`` for every other step and
    in steps written before 1.9.
    """

    step_idx: int
    raw_output: str
    content_chars: int
    thinking_chars: int
    action: str | None
    parse_ok: bool
    parse_error: str | None
    observation: str
    observation_is_synthetic: bool
    observation_truncated_chars: int
    prompt_chars: int
    call_id: str | None
    step_wall_ms: int
    action_status: ActionStatus | None
    usage: Usage | None = None
    model_ms: int | None = None
    action_ms: int | None = None
    tool_calls: tuple[NativeToolCall, ...] = ()
    cost: decimal.Decimal | None = None
    """What the step's model call cost (schema 1.9, design 0236): its ``usage`` at the run's
    ``RunRequest.pricing``, exact. ``None`` when the run had no pricing, the endpoint reported
    no usage (the cost is unknown, never zero) or the step was written before schema 1.9."""
    child: ChildRun | None = None

    def __post_init__(self) -> None:
        owner = "StepRecord"
        if self.cost is not None:
            object.__setattr__(self, "cost", require_money(owner, "cost", self.cost))
        if self.child is not None and not isinstance(self.child, ChildRun):
            raise PolyloopTypeError(
                f"StepRecord.child must be a polyloop.types.ChildRun or None, got "
                f"{type(self.child).__name__}"
            )
        if self.usage is not None and not isinstance(self.usage, Usage):
            raise PolyloopTypeError("StepRecord.usage must be a polyloop.types.Usage or None")
        for name in ("model_ms", "action_ms"):
            if getattr(self, name) is not None:
                require_int(owner, name, getattr(self, name), minimum=0)
        for name in (
            "step_idx",
            "content_chars",
            "thinking_chars",
            "observation_truncated_chars",
            "prompt_chars",
            "step_wall_ms",
        ):
            require_int(owner, name, getattr(self, name), minimum=0)
        require_str(owner, "raw_output", self.raw_output)
        require_str(owner, "observation", self.observation)
        require_bool(owner, "parse_ok", self.parse_ok)
        require_bool(owner, "observation_is_synthetic", self.observation_is_synthetic)
        if self.action is not None:
            require_str(owner, "action", self.action)
        if self.action_status is not None:
            require_enum(owner, "action_status", self.action_status, ActionStatus)
        if (self.action is None) != (self.action_status is None):
            raise PolyloopValueError(
                "StepRecord.action and StepRecord.action_status must both be None (a step "
                "without an action) or both be set"
            )
        if self.parse_ok:
            if self.parse_error is not None:
                raise PolyloopValueError(
                    "StepRecord.parse_error must be None when parse_ok is True"
                )
        elif not isinstance(self.parse_error, str) or not self.parse_error:
            raise PolyloopValueError(
                "StepRecord.parse_error must be the parser's non-empty explanation when "
                "parse_ok is False"
            )
        if self.call_id is not None:
            require_nonempty_str(owner, "call_id", self.call_id)
        object.__setattr__(self, "tool_calls", _tool_calls(owner, self.tool_calls))


# --------------------------------------------------------------------------- log records


@dataclass(frozen=True, slots=True, kw_only=True)
class ParentLink:
    """Where a child run comes from (schema 1.9, design 0245): the child's side of the link
    between two runs of a tree, recorded on its ``RunStarted``.

    ``run_id`` is the parent's run id, ``step_idx`` the parent's step whose action started the
    child, ``idempotency_key`` that action's key (the child's run id is derived from it) and
    ``depth`` the child's depth in the tree (the root is at 0, so a child is at 1 or more).
    ``max_depth`` is the deepest a descendant of the child may be, inherited down the tree
    (``None``: no bound).
    """

    run_id: str
    step_idx: int
    idempotency_key: str
    depth: int
    max_depth: int | None = None

    def __post_init__(self) -> None:
        require_nonempty_str("ParentLink", "run_id", self.run_id)
        require_int("ParentLink", "step_idx", self.step_idx, minimum=0)
        require_nonempty_str("ParentLink", "idempotency_key", self.idempotency_key)
        require_int("ParentLink", "depth", self.depth, minimum=1)
        if self.max_depth is not None:
            require_int("ParentLink", "max_depth", self.max_depth, minimum=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkOrigin:
    """Where a fork's copied prefix came from (schema 1.9, design 0239): on its ``RunStarted``.

    ==============  ===================================================================
    field           meaning
    ==============  ===================================================================
    ``run_id``      the source run
    ``step_idx``    *k*: the source's steps ``0 .. k-1`` were copied; the fork's own
                    steps begin at ``k``
    ``records``     how many records the copy holds, its ``RunStarted`` included (so a
                    resume can tell an interrupted copy and finish it)
    ``digest``      ``sha256:<hex>`` of the copied records as the source holds them
                    (``polyloop.session.prefix_digest``): two forks of one prefix agree
    ``chain``       the source's own origin and that one's, nearest first, when the
                    source is itself a fork (each entry's ``chain`` is empty)
    ==============  ===================================================================
    """

    run_id: str
    step_idx: int
    records: int
    digest: str
    chain: tuple[ForkOrigin, ...] = ()

    def __post_init__(self) -> None:
        require_nonempty_str("ForkOrigin", "run_id", self.run_id)
        require_int("ForkOrigin", "step_idx", self.step_idx, minimum=0)
        require_int("ForkOrigin", "records", self.records, minimum=1)
        require_nonempty_str("ForkOrigin", "digest", self.digest)
        chain = cast(
            tuple[ForkOrigin, ...], tuple_of("ForkOrigin", "chain", self.chain, ForkOrigin)
        )
        if any(entry.chain for entry in chain):
            raise PolyloopValueError(
                "ForkOrigin.chain lists each ancestor once, nearest first: its entries have an "
                "empty chain of their own"
            )
        object.__setattr__(self, "chain", chain)

    @property
    def lineage(self) -> tuple[ForkOrigin, ...]:
        """This origin and its chain: the nearest source first, the root's last."""
        return (
            ForkOrigin(
                run_id=self.run_id, step_idx=self.step_idx, records=self.records, digest=self.digest
            ),
            *self.chain,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """First record of every run: its id and the parameter snapshot the drift guard compares.

    ``continues`` is set on a ``continue_cancelled`` continuation: the id of the cancelled run
    whose records it copies (design 0163, amended by 0206). Resume uses it to finish a copy
    that was interrupted, so that nothing the cancelled run already did is done again.
    ``None`` for every other run, and in records written before schema 1.7.
    """

    run_id: str
    parameter_snapshot: Mapping[str, str]
    continues: str | None = None
    context: Context | None = None
    """The run's context as the first prompt held it (``RunRequest.context``: the run-level
    instructions and the goal-level question), recorded once at the start so that a viewer can
    show what the run was asked (schema 1.8, design 0215). ``None`` when the run was started
    with ``RunRequest.record_context=False``, and in records written before schema 1.8.
    Injections are never recorded (only their entry ids, in the snapshot)."""
    fork: ForkOrigin | None = None
    """Set on a fork (``polyloop.session.fork``, schema 1.9, design 0239): where its copied
    prefix came from. ``None`` for every other run, and in records written before 1.9."""
    parent: ParentLink | None = None
    """The run that started this one, when it is a child run (``RunRequest.parent``; schema
    1.9, design 0245); ``None`` for a root run and in records written before 1.9."""

    def __post_init__(self) -> None:
        require_nonempty_str("RunStarted", "run_id", self.run_id)
        if self.parent is not None and not isinstance(self.parent, ParentLink):
            raise PolyloopTypeError(
                f"RunStarted.parent must be a ParentLink or None, got {type(self.parent).__name__}"
            )
        if self.continues is not None:
            require_nonempty_str("RunStarted", "continues", self.continues)
        if self.fork is not None and not isinstance(self.fork, ForkOrigin):
            raise PolyloopTypeError(
                f"RunStarted.fork must be a ForkOrigin or None, got {type(self.fork).__name__}"
            )
        if self.context is not None and not isinstance(self.context, Context):
            raise PolyloopTypeError(
                f"RunStarted.context must be a Context or None, got {type(self.context).__name__}"
            )
        object.__setattr__(
            self,
            "parameter_snapshot",
            frozen_str_mapping("RunStarted", "parameter_snapshot", self.parameter_snapshot),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Intent:
    """Write-ahead intent: durable before the execution it announces starts.

    ``result_id`` is the id the result record will carry; recovery matches intents to results
    by it and by nothing else. ``replay_policy`` is recorded here so recovery never has to
    consult today's configuration about yesterday's execution.

    ``idempotency_key`` is the key the execution is handed (``Action.idempotency_key``,
    ``ModelCall.idempotency_key``), recorded so that every replay of this execution passes the
    very same key (design 0205): at most 255 characters of ``[A-Za-z0-9._:-]``. ``None`` in
    intents written before schema 1.7.
    """

    run_id: str
    kind: IntentKind
    call_index: int
    result_id: str
    replay_policy: ReplayPolicy
    idempotency_key: str | None = None
    resumed: ResumeMark | None = field(default=None, compare=False)
    """Set when this is the first record a resumed run writes (schema 1.8, design 0215): when
    and how that resume began (the other record kinds a resume can write first carry the same
    field). It says something about the process, not the execution, so it takes no
    part in equality (an intent announced again after a settlement is still the same intent).
    ``None`` on every other record, and in records written before schema 1.8."""

    def __post_init__(self) -> None:
        require_nonempty_str("Intent", "run_id", self.run_id)
        require_enum("Intent", "kind", self.kind, IntentKind)
        require_int("Intent", "call_index", self.call_index, minimum=0)
        require_nonempty_str("Intent", "result_id", self.result_id)
        require_enum("Intent", "replay_policy", self.replay_policy, ReplayPolicy)
        if self.idempotency_key is not None:
            check_idempotency_key("Intent.idempotency_key", self.idempotency_key)
        _require_resume_mark("Intent", self.resumed)


def _require_resume_mark(owner: str, value: object) -> None:
    """A record's ``resumed`` field is a ``ResumeMark`` or ``None`` (design 0215)."""
    if value is not None and not isinstance(value, ResumeMark):
        raise PolyloopTypeError(
            f"{owner}.resumed must be a ResumeMark or None, got {type(value).__name__}; pass "
            "a polyloop.types.ResumeMark (or leave it out)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeMark:
    """How a resume began, recorded on the first record it writes (schema 1.8, design 0215):
    an ``Intent``, a ``ModelCallResult``, a ``StepCompleted``, an ``ApprovalRequest`` or a
    ``RunFinished``, whichever comes first.

    ==============  ===================================================================
    field           meaning
    ==============  ===================================================================
    ``at``          when the resume planned the log (ISO 8601, UTC, milliseconds)
    ``plan``        the plan it followed (a ``ResumeAction`` value: ``continue``,
                    ``redo_model_call``, ``replay_last_action``...)
    ``step_idx``    the step it entered at (the plan's next step), at most the
                    step of the record that carries the mark
    ``epoch``       the fencing epoch of the lease it held (``None``: a store without
                    leases); larger for every later holder of the run
    ==============  ===================================================================
    """

    at: str
    plan: str
    step_idx: int
    epoch: int | None = None

    def __post_init__(self) -> None:
        require_nonempty_str("ResumeMark", "at", self.at)
        require_nonempty_str("ResumeMark", "plan", self.plan)
        require_int("ResumeMark", "step_idx", self.step_idx, minimum=0)
        if self.epoch is not None:
            require_int("ResumeMark", "epoch", self.epoch, minimum=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallResult:
    """Result of one model call: exactly one of ``reply`` and ``failure`` is set.

    A failed call gets a result record too (``failure`` is ``"<ExceptionClass>: <text>"``), so
    recovery never mistakes it for an unknown outcome. ``duration_ms`` is how long the call took
    (``None`` in records written before schema 1.1). ``context_length_exceeded`` is true when
    the call failed because the endpoint refused the prompt as longer than the model's context
    (the client raised ``polyloop.errors.ContextLengthExceededError``); such a run stops with
    ``StopReason.CONTEXT_LENGTH_EXCEEDED``.
    """

    run_id: str
    result_id: str
    reply: ModelReply | None
    failure: str | None
    duration_ms: int | None = None
    context_length_exceeded: bool = False
    resumed: ResumeMark | None = field(default=None, compare=False)
    """The resume mark (schema 1.8, design 0215) when this is the first record a resume wrote
    (a model call redone under the intent
    already on record); ``None`` otherwise."""

    def __post_init__(self) -> None:
        _require_resume_mark("ModelCallResult", self.resumed)
        require_nonempty_str("ModelCallResult", "run_id", self.run_id)
        require_nonempty_str("ModelCallResult", "result_id", self.result_id)
        if (self.reply is None) == (self.failure is None):
            raise PolyloopValueError(
                "ModelCallResult needs exactly one of reply (a successful call) and failure "
                "(a description of the exception)"
            )
        if self.reply is not None and not isinstance(self.reply, ModelReply):
            raise PolyloopTypeError("ModelCallResult.reply must be a ModelReply or None")
        if self.failure is not None:
            require_nonempty_str("ModelCallResult", "failure", self.failure)
        if self.duration_ms is not None:
            require_int("ModelCallResult", "duration_ms", self.duration_ms, minimum=0)
        require_bool("ModelCallResult", "context_length_exceeded", self.context_length_exceeded)
        if self.context_length_exceeded and self.failure is None:
            raise PolyloopValueError(
                "ModelCallResult.context_length_exceeded may only be True for a failed call"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCompleted:
    """A finished step; for a step with an action, also that action's result.

    ``result_id`` is ``None`` exactly when ``action_outcome`` is ``None`` (a step without an
    action). Outcome and step are one record, so they become visible together or not at all.
    """

    run_id: str
    result_id: str | None
    action_outcome: ActionOutcome | None
    step: StepRecord
    resumed: ResumeMark | None = field(default=None, compare=False)
    """The resume mark (schema 1.8, design 0215) when this is the first record a resume wrote
    (a last action replayed, a stored
    final-answer reply recorded as its step); ``None`` otherwise."""

    def __post_init__(self) -> None:
        _require_resume_mark("StepCompleted", self.resumed)
        require_nonempty_str("StepCompleted", "run_id", self.run_id)
        if (self.result_id is None) != (self.action_outcome is None):
            raise PolyloopValueError(
                "StepCompleted.result_id must be None if and only if action_outcome is None "
                "(both None for a step without an action, both set for a step with one)"
            )
        if self.result_id is not None:
            require_nonempty_str("StepCompleted", "result_id", self.result_id)
        if self.action_outcome is not None and not isinstance(self.action_outcome, ActionOutcome):
            raise PolyloopTypeError("StepCompleted.action_outcome must be an ActionOutcome or None")
        if not isinstance(self.step, StepRecord):
            raise PolyloopTypeError("StepCompleted.step must be a StepRecord")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTotals:
    """What a run cost, summed over its steps (``RunResult.totals``; design 0200).

    ``prompt_tokens``, ``completion_tokens`` and ``cached_tokens`` add up the usage the
    endpoint reported; ``steps_without_usage`` counts the steps that reported none (failed
    calls, endpoints that report nothing, steps written before schema 1.1), so a total is
    known to be complete exactly when it is 0. ``cached_tokens`` adds the steps that reported a
    cached figure. ``model_ms`` and ``action_ms`` add the recorded durations of model calls and
    actions (steps without a recorded duration add nothing). ``actions`` counts the steps whose
    decision was an action (a tool call), whatever became of it (executed, refused, failed): a
    run that offered tools and shows ``actions == 0`` never had one called (issue 26;
    ``polyloop.AgentResult.summary`` says so).
    """

    steps: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    steps_without_usage: int
    model_ms: int
    action_ms: int
    actions: int = 0
    cost: decimal.Decimal | None = None
    """The sum of the steps' recorded ``cost`` (design 0236); ``None`` when no step has one (a
    run without pricing, or one whose endpoint never reported usage). In a priced run a step's
    cost is unknown exactly when its usage is, so the sum is complete exactly when
    ``steps_without_usage`` is 0."""

    def __post_init__(self) -> None:
        if self.cost is not None:
            object.__setattr__(self, "cost", require_money("RunTotals", "cost", self.cost))
        for name in (
            "steps",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "steps_without_usage",
            "model_ms",
            "action_ms",
            "actions",
        ):
            require_int("RunTotals", name, getattr(self, name), minimum=0)

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + completion_tokens``."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, steps: Iterable[StepRecord]) -> RunTotals:
        """The totals of ``steps``."""
        count = prompt = completion = cached = without = model_ms = action_ms = actions = 0
        cost: decimal.Decimal | None = None
        for step in steps:
            count += 1
            if step.cost is not None:
                cost = step.cost if cost is None else EXACT_MONEY.add(cost, step.cost)
            actions += step.action is not None
            usage = step.usage
            if usage is None:
                without += 1
            else:
                prompt += usage.prompt_tokens
                completion += usage.completion_tokens
                cached += usage.cached_tokens or 0
            model_ms += step.model_ms or 0
            action_ms += step.action_ms or 0
        return cls(
            steps=count,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            steps_without_usage=without,
            model_ms=model_ms,
            action_ms=action_ms,
            actions=actions,
            cost=cost,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What ``run()`` and ``resume()`` return, and what ``RunFinished`` stores.

    ``final_answer`` is set for ``StopReason.FINAL_ANSWER``. ``steps`` is the whole trajectory
    of the run, across every process that worked on it. ``event_delivery_failures`` counts
    events the sink failed to accept. ``totals`` sums the steps' reported tokens and recorded
    model and action time. ``unknown_outcome`` is the result id (``"a3"``, ``"m2"``) of the
    execution whose outcome is unknown because the run stopped while it was in flight
    (``CANCELLED``, ``ACTION_TIMEOUT`` in older logs), because its tool could not tell
    (``RETRIES_EXHAUSTED``, ``RESUME_STATE_UNKNOWN``; design 0227) or because resume found its
    intent unanswered (``RESUME_STATE_UNKNOWN``); ``None`` when every execution's outcome is
    known (design 0163).
    ``pending_approval`` is the call an ``AWAITING_APPROVAL`` run waits for (design 0210),
    ``None`` otherwise; it is not part of the stored result (such a run has no finish record).
    ``stop_detail`` says which limit stopped a ``TREE_LIMIT`` run and which call (design
    0245); ``None`` for every other stop (schema 1.9, written only when set).
    """

    run_id: str
    stop_reason: StopReason
    final_answer: str | None
    steps: tuple[StepRecord, ...]
    event_delivery_failures: int = 0
    unknown_outcome: str | None = None
    pending_approval: ApprovalRequest | None = None
    stop_detail: str | None = None

    def __post_init__(self) -> None:
        require_nonempty_str("RunResult", "run_id", self.run_id)
        require_enum("RunResult", "stop_reason", self.stop_reason, StopReason)
        if self.final_answer is not None:
            require_str("RunResult", "final_answer", self.final_answer)
        if self.stop_reason is StopReason.FINAL_ANSWER and not self.final_answer:
            raise PolyloopValueError(
                "RunResult.final_answer must be non-empty when stop_reason is FINAL_ANSWER"
            )
        object.__setattr__(self, "steps", tuple_of("RunResult", "steps", self.steps, StepRecord))
        require_int("RunResult", "event_delivery_failures", self.event_delivery_failures, minimum=0)
        if self.unknown_outcome is not None:
            require_nonempty_str("RunResult", "unknown_outcome", self.unknown_outcome)
        if self.pending_approval is not None and not isinstance(
            self.pending_approval, ApprovalRequest
        ):
            raise PolyloopTypeError("RunResult.pending_approval must be an ApprovalRequest or None")
        if self.stop_detail is not None:
            require_nonempty_str("RunResult", "stop_detail", self.stop_detail)

    @property
    def totals(self) -> RunTotals:
        """Tokens, cost and time summed over ``steps`` (computed, not stored: the steps are).
        Each step's own cost is ``steps[i].cost``."""
        return RunTotals.of(self.steps)

    def priced(self, prices: ModelPrices) -> RunResult:
        """This result with a cost on every step that reported usage but has none on record
        (a run without pricing, a log written before schema 1.9), computed at ``prices``
        (``polyloop.Pricing.for_model``). Recorded costs are kept; a step without usage stays
        unknown. Nothing is written: this is how an old log's cost is read."""
        if not isinstance(prices, ModelPrices):
            raise PolyloopTypeError(
                f"RunResult.priced(prices) must be a ModelPrices (Pricing.for_model(name)), "
                f"got {type(prices).__name__}"
            )
        steps = tuple(
            replace(step, cost=prices.cost(step.usage))
            if step.cost is None and step.usage is not None
            else step
            for step in self.steps
        )
        return replace(self, steps=steps)


_KEY_CHARS = re.compile(r"[A-Za-z0-9._:-]{1,255}")
IDEMPOTENCY_KEY_MAX_CHARS = 255
"""An idempotency key fits an HTTP ``Idempotency-Key`` header: 1-255 of ``[A-Za-z0-9._:-]``."""


def check_idempotency_key(where: str, key: object) -> None:
    """Refuse a value that is not a well-formed idempotency key, naming ``where``."""
    if not isinstance(key, str):
        raise PolyloopTypeError(f"{where} must be a str, got {type(key).__name__}")
    if _KEY_CHARS.fullmatch(key) is None:
        raise PolyloopValueError(
            f"{where} must be 1-{IDEMPOTENCY_KEY_MAX_CHARS} characters of [A-Za-z0-9._:-], "
            f"got {len(key)} characters{'' if len(key) > 80 else f' ({key!r})'}"
        )


class SettlementVerdict(enum.Enum):
    """What became of an execution that was in doubt (design 0206)."""

    EXECUTED = "executed"
    """It happened: ``Settlement.observation`` becomes the step's observation."""
    NOT_EXECUTED = "not_executed"
    """It did not happen: the action runs now, with its recorded idempotency key."""
    UNKNOWN = "unknown"
    """Nobody could tell (a reconciler's answer only): the run stays in doubt."""
    APPROVED = "approved"
    """A person approved the call that waited for approval (design 0210): it executes under
    its replay policy."""
    REJECTED = "rejected"
    """A person rejected the call (or its request expired): it never executes; the model reads
    the rejection, with the reason, and the run goes on."""


class SettlementSource(enum.Enum):
    """Who settled it."""

    RECONCILER = "reconciler"
    """The tool's reconciler asked the tool's own system."""
    PERSON = "person"
    """A person, through ``polyloop.session.resolve`` or ``python -m polyloop resolve``, or
    ``approve``/``reject``."""
    EXPIRY = "expiry"
    """The library, on resume: an approval request's ``expires_at`` passed with no decision,
    so the call is rejected with the reason ``"expired"``."""
    EXECUTOR = "executor"
    """The run itself (schema 1.9, design 0227): the executor could not tell whether the
    action took effect (``ToolOutcomeUnknown``, an action timeout). Always ``unknown``, its
    ``note`` the reason, ``by`` the tool's name; the policy then settles the action."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settlement:
    """The verdict on one execution in doubt, durable before anything acts on it (design 0206).

    ``result_id`` is the in-doubt action's (its intent is in the log, its result is not).
    ``by`` names who decided (the person's name; the tool's name for a reconciler), ``at`` is
    when (ISO 8601, UTC). ``observation`` is set exactly for ``EXECUTED``. ``note`` is free
    text; for ``UNKNOWN`` it is the reason and must not be empty.
    """

    run_id: str
    result_id: str
    verdict: SettlementVerdict
    source: SettlementSource
    by: str
    at: str
    observation: str | None = None
    note: str = ""
    digest: str | None = None
    """For an approval decision: the digest of the exact call decided on (the request's);
    ``None`` for the verdict on an execution in doubt."""

    @property
    def is_approval_decision(self) -> bool:
        """Whether this decides on a call that waited for approval (not on one in doubt)."""
        return self.verdict in (SettlementVerdict.APPROVED, SettlementVerdict.REJECTED)

    def __post_init__(self) -> None:
        require_nonempty_str("Settlement", "run_id", self.run_id)
        require_nonempty_str("Settlement", "result_id", self.result_id)
        require_enum("Settlement", "verdict", self.verdict, SettlementVerdict)
        require_enum("Settlement", "source", self.source, SettlementSource)
        require_nonempty_str("Settlement", "by", self.by)
        require_nonempty_str("Settlement", "at", self.at)
        require_str("Settlement", "note", self.note)
        executed = self.verdict is SettlementVerdict.EXECUTED
        if executed and not isinstance(self.observation, str):
            raise PolyloopTypeError(
                "Settlement.observation must be the str the tool's system reported when the "
                f"verdict is executed, got {type(self.observation).__name__}"
            )
        if not executed and self.observation is not None:
            raise PolyloopValueError(
                f"Settlement.observation must be None when the verdict is "
                f"{self.verdict.value} (nothing was observed)"
            )
        if self.verdict is SettlementVerdict.UNKNOWN and not self.note:
            raise PolyloopValueError("Settlement.note must give the reason of an unknown verdict")
        if self.is_approval_decision != (self.digest is not None):
            raise PolyloopValueError(
                "Settlement.digest is the digest of the call an approval decision binds to: set "
                "exactly for approved and rejected"
            )
        if self.digest is not None:
            require_nonempty_str("Settlement", "digest", self.digest)
        if self.is_approval_decision and self.source is SettlementSource.RECONCILER:
            raise PolyloopValueError(
                "Settlement: a person approves or rejects a call (or its expiry rejects it); "
                "a reconciler only answers on an execution in doubt"
            )
        if self.verdict is SettlementVerdict.REJECTED and not self.note:
            raise PolyloopValueError("Settlement.note must give the reason of a rejection")
        if self.source is SettlementSource.EXPIRY and not (
            self.verdict is SettlementVerdict.REJECTED and self.note == "expired"
        ):
            raise PolyloopValueError(
                "Settlement: an expiry only rejects, with the reason 'expired'"
            )
        if self.verdict is SettlementVerdict.UNKNOWN and self.source is SettlementSource.PERSON:
            raise PolyloopValueError(
                "Settlement: a person settles an execution as executed or not_executed; "
                "unknown is a reconciler's answer (leave the run as it is instead)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """A call that waits for a person's approval, on record before the run stops (design 0210).

    ``result_id`` is the id the call's action will have (``a<step>``); nothing of it has been
    executed, and no action intent exists yet. ``arguments`` is the call's arguments as
    canonical JSON (sorted keys, no spaces) and ``digest`` is ``sha256:<hex>`` of the run id,
    the result id, the tool name and those arguments, one per line: a decision names the
    digest, so it binds to exactly this call (even if the model repeats it later).
    ``requested_at`` and ``expires_at`` (``None``: never) are ISO 8601, UTC.
    """

    run_id: str
    result_id: str
    step_idx: int
    tool: str
    tool_call_id: str | None
    arguments: str
    digest: str
    requested_at: str
    expires_at: str | None = None
    resumed: ResumeMark | None = field(default=None, compare=False)
    """The resume mark (schema 1.8, design 0215) when this is the first record a resume wrote
    (a stored reply whose call waits for a
    person); ``None`` otherwise."""

    def __post_init__(self) -> None:
        _require_resume_mark("ApprovalRequest", self.resumed)
        require_nonempty_str("ApprovalRequest", "run_id", self.run_id)
        require_nonempty_str("ApprovalRequest", "result_id", self.result_id)
        require_int("ApprovalRequest", "step_idx", self.step_idx, minimum=0)
        require_nonempty_str("ApprovalRequest", "tool", self.tool)
        if self.tool_call_id is not None:
            require_nonempty_str("ApprovalRequest", "tool_call_id", self.tool_call_id)
        require_str("ApprovalRequest", "arguments", self.arguments)
        require_nonempty_str("ApprovalRequest", "digest", self.digest)
        require_nonempty_str("ApprovalRequest", "requested_at", self.requested_at)
        if self.expires_at is not None:
            require_nonempty_str("ApprovalRequest", "expires_at", self.expires_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinished:
    """Last record of a run. Durable before ``run()``/``resume()`` returns."""

    run_id: str
    result: RunResult
    resumed: ResumeMark | None = field(default=None, compare=False)
    """The resume mark (schema 1.8, design 0215) when this is the first record a resume wrote
    (a resume that found the last stored
    step should have stopped the run, or a model call in doubt); ``None`` otherwise."""

    def __post_init__(self) -> None:
        _require_resume_mark("RunFinished", self.resumed)
        require_nonempty_str("RunFinished", "run_id", self.run_id)
        if not isinstance(self.result, RunResult):
            raise PolyloopTypeError("RunFinished.result must be a RunResult")
        if self.result.run_id != self.run_id:
            raise PolyloopValueError(
                f"RunFinished.run_id {self.run_id!r} differs from result.run_id "
                f"{self.result.run_id!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeStopped:
    """A resume that stopped again, open, without writing any other record (schema 1.9,
    design 0231): it found the run in doubt about ``result_id`` (``RESUME_STATE_UNKNOWN``: an
    action that nothing settled), waiting for a person's decision on it
    (``AWAITING_APPROVAL``), or it tried that ``SAFE``/``IDEMPOTENT`` action again and its
    outcome stayed unknown after every attempt (``RETRIES_EXHAUSTED``, design 0227: the only
    records that attempt wrote are the executor's ``unknown`` settlements, which carry no
    mark), and left the run open.

    Its only purpose is ``resumed``, the resume's mark (when, the plan, the step, the lease
    epoch: ``ResumeMark``), which every other resume puts on the first record it writes
    (design 0215): without this record such a resume left no trace, and a reader could not
    see it. It changes nothing ``resume`` plans (the run is as open after it as before).
    Written only when the resume wrote nothing else; never by a run's first process.
    """

    run_id: str
    stop_reason: StopReason
    result_id: str
    resumed: ResumeMark | None = None

    def __post_init__(self) -> None:
        require_nonempty_str("ResumeStopped", "run_id", self.run_id)
        require_enum("ResumeStopped", "stop_reason", self.stop_reason, StopReason)
        if self.stop_reason not in OPEN_STOP_REASONS:
            raise PolyloopValueError(
                "ResumeStopped.stop_reason must be resume_state_unknown, awaiting_approval or "
                "retries_exhausted (the stops that leave a run open), got "
                f"{self.stop_reason.value!r}"
            )
        require_nonempty_str("ResumeStopped", "result_id", self.result_id)
        _require_resume_mark("ResumeStopped", self.resumed)
        if self.resumed is None:
            raise PolyloopValueError(
                "ResumeStopped.resumed must be the resume's ResumeMark: the record exists to "
                "carry it"
            )


# --------------------------------------------------------------------------- the record table

LogRecord = (
    RunStarted
    | Intent
    | ModelCallResult
    | StepCompleted
    | RunFinished
    | Settlement
    | ApprovalRequest
    | ResumeStopped
)
"""The log record classes a ``RunStore`` keeps: the classes of ``RECORDS``, as one type for
the type checker (a row added to ``RECORDS`` is added here, beside it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordKind:
    """One kind of log record, declared once (design 0220): a row of ``RECORDS``.

    * ``record_cls``: the record's class (exactly it: a subclass is no log record).
    * ``tag``: its ``"record"`` tag on every stored line; never changes once written.
    * ``barrier``: writing it is a durability barrier: when the write returns, the record and
      every earlier record of its run survive a crash; other records become durable with the
      next barrier at the latest (a store may make them durable sooner).
    * ``exclusive``: its write refuses a run id that already has records
      (``RunAlreadyStartedError``) and stores nothing; only the run's start is.
    * ``write_method``: the name of the typed write method of ``RunStore`` and ``RunLease``
      (or of the ``SettlingWrites`` capability) that takes it. A kind that no typed method
      takes (``None``) is written through ``RecordWrites.write_record``.
    * ``log_field``: the ``RunLog`` field that holds it (``None``: only ``RunLog.entries``).
    * ``single``: that field holds the last record of the kind, not a tuple of all of them.
    * ``required``: the write method is part of the ``RunStore`` seam itself (every store has
      it), not of an optional capability.

    The codec is ``polyloop.serialization``'s for ``record_cls``: a hand-written one where a
    kind registered one (the seven kinds of schema 1.8, byte for byte what they always wrote),
    otherwise one derived from the dataclass's fields.
    """

    record_cls: type
    tag: str
    barrier: bool
    exclusive: bool = False
    write_method: str | None = None
    log_field: str | None = None
    single: bool = False
    required: bool = False


class RecordTable:
    """The record kinds (``RecordKind``), in the order ``RunLog`` and the messages list them,
    and the lookups every layer derives from them, built once.

    ``by_class``, ``by_tag``, ``tags`` (class to tag) and ``barriers`` are live read-only
    views: every module that reads them sees the same table. ``scratch`` adds a kind for the
    length of a ``with`` block; it exists for tests that show a new kind going through every
    layer (design 0220).
    """

    __slots__ = (
        "_barriers",
        "_by_class",
        "_by_tag",
        "_kinds",
        "_tags",
        "barriers",
        "by_class",
        "by_tag",
        "kinds",
        "tags",
    )

    def __init__(self, kinds: Iterable[RecordKind]) -> None:
        self._kinds: list[RecordKind] = []
        self.kinds: tuple[RecordKind, ...] = ()
        """Every row, in declaration order."""
        self._by_class: dict[type, RecordKind] = {}
        self._by_tag: dict[str, RecordKind] = {}
        self._barriers: set[type] = set()
        self._tags: dict[type, str] = {}
        self.tags: Mapping[type, str] = MappingProxyType(self._tags)
        self.by_class: Mapping[type, RecordKind] = MappingProxyType(self._by_class)
        self.by_tag: Mapping[str, RecordKind] = MappingProxyType(self._by_tag)
        self.barriers: AbstractSet[type] = self._barriers
        for kind in kinds:
            self._add(kind)

    def names(self) -> str:
        """The record classes' names, for messages: ``"RunStarted, Intent, ... and X"``."""
        names = [kind.record_cls.__name__ for kind in self._kinds]
        return ", ".join(names[:-1]) + " and " + names[-1]

    def _add(self, kind: RecordKind) -> None:
        if kind.record_cls in self._by_class or kind.tag in self._by_tag:
            raise PolyloopValueError(
                f"record kind {kind.record_cls.__name__} ({kind.tag!r}) is declared twice"
            )
        self._kinds.append(kind)
        self.kinds = tuple(self._kinds)
        self._by_class[kind.record_cls] = kind
        self._by_tag[kind.tag] = kind
        self._tags[kind.record_cls] = kind.tag
        if kind.barrier:
            self._barriers.add(kind.record_cls)

    @contextmanager
    def scratch(self, kind: RecordKind) -> Iterator[RecordKind]:
        """Add ``kind`` to the table while the block runs, then remove it (tests only)."""
        self._add(kind)
        try:
            yield kind
        finally:
            self._kinds.remove(kind)
            self.kinds = tuple(self._kinds)
            del self._by_class[kind.record_cls]
            del self._by_tag[kind.tag]
            del self._tags[kind.record_cls]
            self._barriers.discard(kind.record_cls)


RECORDS = RecordTable(
    (
        RecordKind(
            record_cls=RunStarted,
            tag="run_started",
            barrier=True,
            exclusive=True,
            write_method="write_run_started",
            log_field="started",
            single=True,
            required=True,
        ),
        RecordKind(
            record_cls=Intent,
            tag="intent",
            barrier=True,
            write_method="write_intent",
            log_field="intents",
            required=True,
        ),
        RecordKind(
            record_cls=ModelCallResult,
            tag="model_call_result",
            barrier=False,
            write_method="write_model_call_result",
            log_field="model_results",
            required=True,
        ),
        RecordKind(
            record_cls=StepCompleted,
            tag="step_completed",
            barrier=False,
            write_method="write_step_completed",
            log_field="steps",
            required=True,
        ),
        RecordKind(
            record_cls=RunFinished,
            tag="run_finished",
            barrier=True,
            write_method="write_run_finished",
            log_field="finished",
            single=True,
            required=True,
        ),
        # Schema 1.7 (design 0206): a verdict is acted on (an action runs, or its step is
        # recorded) only after it is durable, so its write is a barrier like an intent's.
        RecordKind(
            record_cls=Settlement,
            tag="settlement",
            barrier=True,
            write_method="write_settlement",
            log_field="settlements",
        ),
        # Design 0210: the run stops on it and a person decides on it, so it is a barrier too.
        RecordKind(
            record_cls=ApprovalRequest,
            tag="approval_request",
            barrier=True,
            write_method="write_approval_request",
            log_field="approval_requests",
        ),
        # Schema 1.9 (design 0231): a resume that stopped again, waiting, and wrote nothing
        # else; a barrier, so that what the resume returned is on record when it returns.
        # No typed write method and no RunLog field: written through write_record, read from
        # RunLog.entries (design 0220).
        RecordKind(record_cls=ResumeStopped, tag="resume_stopped", barrier=True),
    )
)
"""The one table of log record kinds (design 0220). ``polyloop.ports`` (``RunLog``), the
stores (tags, barriers, exclusive start, assembling a log), ``polyloop.serialization`` (which
codec), the contract suite and ``check_log`` derive what they know of the kinds from it."""
