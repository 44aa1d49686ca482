"""A frozen copy of the encoding path as it was at 62dc0c0 (before the third pass of design
0214): the oracle the new encoder's bytes are compared with (``test_encoding_oracle.py``).

Never edit it to follow a change of the encoder: a schema change that alters the bytes needs its
own oracle. It is test code, not a second encoder of the library.
"""

from __future__ import annotations

import decimal
import enum
import json
import re
import zlib
from collections.abc import Callable, Mapping
from typing import TypeVar

from polyloop.errors import PolyloopTypeError
from polyloop.serialization import SCHEMA_VERSION, VERSION_KEY, Encodable
from polyloop.types import (
    ActionOutcome,
    ApprovalRequest,
    Context,
    Intent,
    Message,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
    ResumeMark,
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    StepCompleted,
    StepRecord,
    Usage,
)

_T = TypeVar("_T")
RECORD_KEY = "record"
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_CHECKSUM_PREFIX = b', "checksum": "'
TAGS = {
    RunStarted: "run_started",
    Intent: "intent",
    ModelCallResult: "model_call_result",
    StepCompleted: "step_completed",
    RunFinished: "run_finished",
    Settlement: "settlement",
    ApprovalRequest: "approval_request",
}


def encode_line(record: object) -> bytes:
    """``_records.encode_line`` of 62dc0c0 for a record of one of the seven log classes."""
    return _line(_ENCODER.encode({RECORD_KEY: TAGS[type(record)], **encode(record)}))


def encode(record: Encodable) -> dict[str, object]:
    """Return a JSON-ready ``dict`` of ``record``'s fields plus ``"schema_version"``.

    The result contains only ``str``/``int``/``bool``/``None``, lists and dicts when the record
    holds correctly typed values; wrongly typed values are passed through unchanged (see the
    module docstring). Raises ``TypeError`` for any other type of object.
    """
    fields: dict[str, object]
    if type(record) is RunStarted:
        fields = _run_started_fields(record)
    elif type(record) is Intent:
        fields = _intent_fields(record)
    elif type(record) is ModelCallResult:
        fields = _model_call_result_fields(record)
    elif type(record) is StepCompleted:
        fields = _step_completed_fields(record)
    elif type(record) is RunFinished:
        fields = _run_finished_fields(record)
    elif type(record) is Settlement:
        fields = _settlement_fields(record)
    elif type(record) is ApprovalRequest:
        fields = _approval_request_fields(record)
    elif type(record) is RunResult:
        fields = _run_result_fields(record)
    elif type(record) is StepRecord:
        fields = _step_record_fields(record)
    else:
        raise PolyloopTypeError(
            f"encode() cannot encode a {type(record).__qualname__}; it encodes exactly "
            "RunStarted, Intent, ModelCallResult, StepCompleted, RunFinished, Settlement, "
            "ApprovalRequest, "
            "RunResult and StepRecord (not subclasses)"
        )
    # The resume mark (1.8, design 0215) rides on whichever record a resume wrote first; read
    # with getattr because encode never judges, not even a record built around its __init__.
    resumed = getattr(record, "resumed", None)
    if resumed is not None:
        fields["resumed"] = _resume_mark_fields(resumed)
    return {VERSION_KEY: SCHEMA_VERSION, **fields}


def _plain(value: object) -> object:
    """An enum member as its value, a tuple as a list; anything else unchanged."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _nested(value: object, encoder: Callable[[_T], dict[str, object]], cls: type[_T]) -> object:
    """Encode a nested record if it has the expected type; pass anything else through."""
    if type(value) is cls:
        return encoder(value)
    return value


def _run_started_fields(record: RunStarted) -> dict[str, object]:
    snapshot = record.parameter_snapshot
    return {
        "run_id": record.run_id,
        "parameter_snapshot": dict(snapshot) if isinstance(snapshot, Mapping) else snapshot,
        "continues": record.continues,
        "context": _context_fields(getattr(record, "context", None)),
    }


def _intent_fields(record: Intent) -> dict[str, object]:
    fields: dict[str, object] = {
        "run_id": record.run_id,
        "kind": _plain(record.kind),
        "call_index": record.call_index,
        "result_id": record.result_id,
        "replay_policy": _plain(record.replay_policy),
        "idempotency_key": record.idempotency_key,
    }
    return fields


def _usage_fields(usage: Usage) -> dict[str, object]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }


def _tool_call_fields(value: object) -> object:
    """``[{"id", "name", "arguments"}, ...]`` for a tuple of tool calls; anything else as is."""
    if not isinstance(value, tuple | list):
        return value
    return [
        {"id": call.id, "name": call.name, "arguments": call.arguments}
        if type(call) is NativeToolCall
        else call
        for call in value
    ]


def _model_reply_fields(reply: ModelReply) -> dict[str, object]:
    return {
        "call_id": reply.call_id,
        "content": reply.content,
        "thinking": reply.thinking,
        "usage": _nested(reply.usage, _usage_fields, Usage),
        "tool_calls": _tool_call_fields(reply.tool_calls),
        "finish_reason": reply.finish_reason,
    }


def _model_call_result_fields(record: ModelCallResult) -> dict[str, object]:
    return {
        "run_id": record.run_id,
        "result_id": record.result_id,
        "reply": _nested(record.reply, _model_reply_fields, ModelReply),
        "failure": record.failure,
        "duration_ms": record.duration_ms,
        "context_length_exceeded": record.context_length_exceeded,
    }


def _action_outcome_fields(outcome: ActionOutcome) -> dict[str, object]:
    return {
        "status": _plain(outcome.status),
        "observation": outcome.observation,
        "observation_is_synthetic": outcome.observation_is_synthetic,
        "env_reported_completion": outcome.env_reported_completion,
        "observation_truncated_chars": outcome.observation_truncated_chars,
        "settled_by": outcome.settled_by,
    }


def _step_record_fields(step: StepRecord) -> dict[str, object]:
    return {
        "step_idx": step.step_idx,
        "raw_output": step.raw_output,
        "content_chars": step.content_chars,
        "thinking_chars": step.thinking_chars,
        "action": step.action,
        "parse_ok": step.parse_ok,
        "parse_error": step.parse_error,
        "observation": step.observation,
        "observation_is_synthetic": step.observation_is_synthetic,
        "observation_truncated_chars": step.observation_truncated_chars,
        "prompt_chars": step.prompt_chars,
        "call_id": step.call_id,
        "step_wall_ms": step.step_wall_ms,
        "action_status": _plain(step.action_status),
        "usage": _nested(step.usage, _usage_fields, Usage),
        "model_ms": step.model_ms,
        "action_ms": step.action_ms,
        "tool_calls": _tool_call_fields(step.tool_calls),
        # Schema 1.9's cost (design 0236), written only when set: the one addition since.
        **({} if step.cost is None else {"cost": _cost(step.cost)}),
    }


def _cost(cost: object) -> object:
    if type(cost) is not decimal.Decimal:
        return _plain(cost)
    text = format(cost, "f")
    return (text.rstrip("0").rstrip(".") if "." in text else text) or "0"


def _step_completed_fields(record: StepCompleted) -> dict[str, object]:
    return {
        "run_id": record.run_id,
        "result_id": record.result_id,
        "action_outcome": _nested(record.action_outcome, _action_outcome_fields, ActionOutcome),
        "step": _nested(record.step, _step_record_fields, StepRecord),
    }


def _run_result_fields(result: RunResult) -> dict[str, object]:
    steps: object = result.steps
    if isinstance(steps, tuple | list):
        steps = [_nested(step, _step_record_fields, StepRecord) for step in steps]
    return {
        "run_id": result.run_id,
        "stop_reason": _plain(result.stop_reason),
        "final_answer": result.final_answer,
        "steps": steps,
        "event_delivery_failures": result.event_delivery_failures,
        "unknown_outcome": result.unknown_outcome,
    }


def _run_finished_fields(record: RunFinished) -> dict[str, object]:
    return {
        "run_id": record.run_id,
        "result": _nested(record.result, _run_result_fields, RunResult),
    }


def _settlement_fields(record: Settlement) -> dict[str, object]:
    return {
        "run_id": record.run_id,
        "result_id": record.result_id,
        "verdict": _plain(record.verdict),
        "source": _plain(record.source),
        "by": record.by,
        "at": record.at,
        "observation": record.observation,
        "note": record.note,
        "digest": record.digest,
    }


def _approval_request_fields(record: ApprovalRequest) -> dict[str, object]:
    return {
        "run_id": record.run_id,
        "result_id": record.result_id,
        "step_idx": record.step_idx,
        "tool": record.tool,
        "tool_call_id": record.tool_call_id,
        "arguments": record.arguments,
        "digest": record.digest,
        "requested_at": record.requested_at,
        "expires_at": record.expires_at,
    }


def _message_fields(message: object) -> object:
    if type(message) is not Message:
        return message
    return {
        "role": _plain(message.role),
        "content": [{"text": block.text} for block in message.content],
        "tool_calls": _tool_call_fields(message.tool_calls),
        "tool_call_id": message.tool_call_id,
    }


def _context_fields(context: object) -> object:
    """``{"run_level": [message...], "goal_level": [message...]}``, ``None`` as ``null``."""
    if type(context) is not Context:
        return context
    return {
        "run_level": [_message_fields(m) for m in context.run_level],
        "goal_level": [_message_fields(m) for m in context.goal_level],
    }


def _resume_mark_fields(mark: object) -> object:
    if type(mark) is not ResumeMark:
        return mark
    return {"at": mark.at, "plan": mark.plan, "step_idx": mark.step_idx, "epoch": mark.epoch}


def _line(text: str) -> bytes:
    """The stored bytes of a line's JSON ``text``: UTF-8 (``_utf8``), checksum, newline."""
    body = _utf8(text)
    return b'%s%s%08x"}\n' % (body[:-1], _CHECKSUM_PREFIX, zlib.crc32(body))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8, surrogates written so that they read back unchanged (see above)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        pass  # surrogates: the rare, slow path below
    out = bytearray()
    position = 0
    previous_high_at = -2
    for match in _SURROGATE.finditer(text):
        at = match.start()
        out += text[position:at].encode("utf-8")
        code = ord(text[at])
        if code >= 0xDC00 and previous_high_at == at - 1:
            out += text[at].encode("utf-8", "surrogatepass")
        else:
            out += f"\\u{code:04x}".encode("ascii")
        if code < 0xDC00:
            previous_high_at = at
        position = at + 1
    out += text[position:].encode("utf-8")
    return bytes(out)
