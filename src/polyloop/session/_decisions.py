"""Reading a stored or fresh model reply: the parser's verdict, and what the action's tool says.

Both the step and resume need these, and they must agree: resume re-parses stored replies
(parsers are deterministic; the drift guard has confirmed the settings) to learn which action
a dangling intent belongs to and whether the last stored step should have stopped the run.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Final, NamedTuple

from polyloop import _recovery
from polyloop._common import describe_exception
from polyloop.errors import ToolValidationError
from polyloop.ports import Action, DecisionParser, ParsedReply
from polyloop.tools import ToolRegistry
from polyloop.types import ApprovalRequest, ModelReply, ReplayPolicy

__all__ = [
    "ToolFlags",
    "approval_digest",
    "approval_request_for",
    "is_expired",
    "parse_reply",
    "tool_flags",
]

logger = logging.getLogger("polyloop.session")


def parse_reply(
    parser: DecisionParser, reply: ModelReply, run_id: str, step_idx: int
) -> ParsedReply | str:
    """The parser's verdict on ``reply``, or the description of its contract breach.

    A parser must never raise, but the reply it chokes on is already durable, so a raise
    that escaped would be raised again by every ``resume``: the run could neither finish
    nor be abandoned. The breach is contained instead (design 0161).
    """
    try:
        parsed = parser.parse(reply)
    except Exception as exc:  # DecisionParser contract breach: contained (design 0161)
        description = f"{type(parser).__name__}.parse raised {describe_exception(exc)}"
        logger.error(  # noqa: TRY400 - the traceback is attached through exc_info
            "run %s step %d: %s; the run stops with parser_error",
            run_id,
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


class ToolFlags(NamedTuple):
    """What the registry says about the tool an action calls."""

    replay_policy: ReplayPolicy
    """The policy its intent records: the tool's, or ``NEVER`` for code and unknown tools."""
    completes_run: bool
    """Whether executing it ends the run with ``TASK_COMPLETED``."""


def tool_flags(tools: ToolRegistry, action: Action) -> ToolFlags:
    """The replay policy and completion flag of the tool ``action`` calls.

    A ``ToolCall`` is unvalidated parser output: a non-``str`` name names no tool (and an
    unhashable one must not raise here, between the stored reply and its step).
    """
    call = action.tool_call
    spec = None if call is None or not isinstance(call.name, str) else tools.spec_for(call.name)
    if spec is None:
        return _NO_TOOL
    flags = _FLAGS.get((spec.replay_policy, spec.completes_run))
    return ToolFlags(spec.replay_policy, spec.completes_run) if flags is None else flags


# The few values a ``ToolFlags`` can take, built once: a step keeps its flags across its
# action's commits, and a fresh tuple each step was one more object a fleet's collector
# traced (design 0214). Equal values, so nothing can tell them apart.
_FLAGS: Final[Mapping[tuple[ReplayPolicy, bool], ToolFlags]] = {
    (policy, completes): ToolFlags(policy, completes)
    for policy in ReplayPolicy
    for completes in (False, True)
}
_NO_TOOL: Final = _FLAGS[ReplayPolicy.NEVER, False]


def approval_digest(run_id: str, result_id: str, tool: str, arguments: str) -> str:
    """``sha256:<hex>`` of the run id, the call's result id, the tool's name and the canonical
    arguments, one per line: what a decision names, so that it binds to exactly one call of
    one run, even when the model repeats an identical call later (design 0210)."""
    text = f"{run_id}\n{result_id}\n{tool}\n{arguments}"
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def approval_request_for(
    tools: ToolRegistry,
    action: Action | None,
    *,
    run_id: str,
    step_idx: int,
    expires_seconds: float | None,
) -> ApprovalRequest | None:
    """The request for approval the call of ``action`` needs, or ``None``.

    ``None`` for a code action, an unknown tool, arguments the registry refuses (the executor
    refuses them without anyone's approval) and a tool whose ``needs_approval`` says no.
    """
    call = None if action is None else action.tool_call
    spec = None if call is None or not isinstance(call.name, str) else tools.spec_for(call.name)
    if call is None or spec is None or spec.needs_approval is False:
        # A tool that never asks needs no look at the arguments: the executor checks them.
        return None
    try:
        tools.validate(call)
    except ToolValidationError:
        return None
    if not spec.asks_approval(call.arguments):
        return None
    arguments = json.dumps(
        call.arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    now = datetime.datetime.now(datetime.UTC)
    call_id = getattr(call, "id", None)
    result_id = _recovery.action_result_id(step_idx)
    return ApprovalRequest(
        run_id=run_id,
        result_id=result_id,
        step_idx=step_idx,
        tool=spec.name,
        tool_call_id=call_id if isinstance(call_id, str) and call_id else None,
        arguments=arguments,
        digest=approval_digest(run_id, result_id, spec.name, arguments),
        requested_at=now.isoformat(timespec="milliseconds"),
        expires_at=(
            None
            if expires_seconds is None
            else (now + datetime.timedelta(seconds=expires_seconds)).isoformat(
                timespec="milliseconds"
            )
        ),
    )


def is_expired(request: ApprovalRequest, now: datetime.datetime) -> bool:
    """Whether ``request``'s ``expires_at`` is at or before ``now`` (an aware UTC instant).

    The library writes UTC with its offset; a bare time (a hand-edited log) is read as UTC.
    """
    if request.expires_at is None:
        return False
    expires = datetime.datetime.fromisoformat(request.expires_at)
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=datetime.UTC)
    return expires <= now
