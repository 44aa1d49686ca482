"""Turn persisted records into JSON-ready payloads and back, exactly.

``encode(record)`` returns a ``dict`` holding the record's own fields plus ``"schema_version"``;
the ``decode_*`` functions rebuild the record from such a mapping. Stores add their own framing
(the JSONL store adds a ``"record"`` type tag); the payload never contains one.
``encode_tagged(record, key, tag)`` is ``{key: tag, **encode(record)}`` built as one dict, which
is how the stores frame a line (design 0214).

What a reader would otherwise get wrong:

* **encode never judges.** It does not type-check field values, so a record whose fields were
  forced to wrong types still encodes; it fails on decode with ``DecodeError``. Stores rely on
  this ("encode on write, decode on read"), which is why both shipped stores accept such a record
  (as long as JSON can represent its values) and then fail on ``read_log`` with the same
  message. ``encode`` raises ``TypeError`` only for
  an object that is not one of the eight encodable types (a subclass counts as unknown).
* **Representation.** Enums are written as their ``.value`` (``"model_call"``, ``"never"``),
  nested records as nested objects, tuples as lists, mappings as objects, ``None`` as ``null``.
* **Schema version.** Every top-level payload carries ``"schema_version": "<major>.<minor>"``.
  Decoding requires it and accepts any minor of the major it knows (``SCHEMA_VERSION``'s); a
  different major, a missing or malformed version is a ``DecodeError``. Payloads nested inside
  another payload (a reply inside a model-call result, the result inside a run-finished record,
  step records inside a result) are written without a version: the enclosing one governs. If a
  nested payload carries one anyway it is checked like a top-level one.
* **Unknown extra fields are ignored**, so a payload written by a newer minor version (which may
  only *add* fields) stays readable. A field of 1.0 must be present, even when the dataclass has
  a default for it; a field added by a later minor (1.1: usage, finish reason, durations, the
  context-length flag; 1.4: tool calls; 1.6: the unknown outcome; 1.7: an intent's idempotency
  key, an outcome's ``settled_by``; 1.9: a step's ``cost``) takes its default when absent, so
  older logs keep decoding. A record kind added by a later minor (1.7: ``Settlement``) has all
  its fields required, because no older writer ever wrote one.
* **DecodeError messages** name the record type, the path of the field and what was expected,
  e.g. ``Intent.call_index: expected int, got str`` or
  ``StepCompleted.step.action_status: expected one of 'executed', 'not_executed', 'env_error'
  or None, got 'done'``. Invariant violations caught by the dataclasses' own validation (an empty
  ``run_id``, a ``StepCompleted`` whose ``result_id`` and ``action_outcome`` disagree) become a
  ``DecodeError`` too, prefixed with the path of the record that failed.

* **Which codec.** Each log record kind of ``polyloop.types.RECORDS`` (design 0220) is encoded
  and decoded by the functions registered for its class (``@_encodes``, ``@_decodes``: the
  seven kinds of schema 1.8, written by hand), or, for a kind without them, by a codec derived
  once from its dataclass fields (``_derived_codec``). ``decode_record(cls, payload)`` decodes
  a payload of any kind.

The rule for changing the format is in ``research-wiki/design/0021-schema-version-rule.md``; the
on-disk format is documented field by field in ``research-wiki/reference/log-format.md``.

This module imports only ``polyloop.types`` (and ``polyloop._common``'s ``money_text``, the one
spelling of a cost) and the standard library, and does no I/O.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import functools
import re
import types
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, NoReturn, TypeVar, cast

from polyloop._common import money_text
from polyloop.errors import DecodeError, PolyloopTypeError
from polyloop.types import (
    RECORDS,
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    ChildRun,
    Context,
    ForkOrigin,
    Intent,
    IntentKind,
    LogRecord,
    Message,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
    ParentLink,
    ReplayPolicy,
    ResumeMark,
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
    Usage,
)

__all__ = [
    "SCHEMA_VERSION",
    "VERSION_KEY",
    "DecodeError",
    "Encodable",
    "decode_approval_request",
    "decode_intent",
    "decode_model_call_result",
    "decode_record",
    "decode_run_finished",
    "decode_run_result",
    "decode_run_started",
    "decode_settlement",
    "decode_step_completed",
    "decode_step_record",
    "encode",
]

SCHEMA_VERSION = "1.9"
"""Version of the payload format, ``"<major>.<minor>"``.

Raise the minor when a field is added (readers of the same major ignore fields they do not know;
a field added later must have a default its decoder applies when the field is absent). Raise the
major for anything else: a renamed, removed or retyped field, or a changed meaning.

History: ``1.0`` (polyloop 0.1.0); ``1.1`` adds usage, finish reason, durations and the
context-length flag (design 0200); ``1.2`` adds the ``parser_error`` stop reason and UTF-8
surrogate pairs (design 0161); ``1.3`` adds the per-line checksum (design 0162); ``1.4`` adds
``tool_calls`` to a model reply and to a step record (native tool calls, design 0100); a payload
without them decodes with ``()``; ``1.5`` adds the ``action_timeout`` stop reason (design 0164);
``1.6`` adds ``unknown_outcome`` to a run result (design 0163); ``1.7`` adds the idempotency key
on intents and the ``idempotent`` replay policy (design 0205), ``settled_by`` on action outcomes
and the settlement record (design 0206); an intent or outcome without them decodes with
``None``. Before any release shipped 1.7, it also got the approval request record, a
settlement's ``digest`` (``None`` when absent), the verdicts ``approved`` and ``rejected`` and
the source ``expiry`` (design 0210); ``1.8`` adds the run's ``context`` to ``RunStarted``
(``None`` when absent, or when the run was started with ``record_context=False``) and the
``resumed`` mark (written only on the first record a resume writes: an intent, a model call
result, a step record, an approval request or the run's finish; absent reads as ``None``;
design 0215); ``1.9`` adds a step record's ``cost`` (a decimal string, written only when
known; absent reads as ``None``; design 0236) and the ``cost_budget`` stop reason; and the
settlement source ``executor`` (an ``unknown`` verdict the run writes when its executor could
not tell whether an action took effect, design 0227); and the
``resume_stopped`` record (``ResumeStopped``: the mark of a resume that stopped again,
waiting, and wrote nothing else; design 0231), written through the derived codec; a fork's
origin on ``RunStarted`` (``fork``, written only on a fork; absent reads as ``None``; design
0239); and a child run's ``parent`` link on ``RunStarted`` and the ``child`` a step's action
ran on a step record (trees of runs, design 0245), both written only when set (absent reads
as ``None``), with the ``tree_limit`` stop reason and a run result's ``stop_detail`` (written
only when set; absent reads as ``None``).
"""

VERSION_KEY = "schema_version"
"""The payload key that holds ``SCHEMA_VERSION``. No record may have a field of this name."""

_VERSION_PATTERN = re.compile(r"([0-9]+)\.([0-9]+)")
_MAJOR = int(SCHEMA_VERSION.split(".", 1)[0])
_MAX_MAJOR_DIGITS = 18

_T = TypeVar("_T")
_E = TypeVar("_E", bound=enum.Enum)

Encodable = LogRecord | RunResult | StepRecord
"""The types ``encode`` accepts: the log records (``polyloop.types.RECORDS``), ``RunResult``
and ``StepRecord``."""

_Payload = Callable[[Any, str, str], dict[str, object]]
_PAYLOADS: dict[type, _Payload] = {}
"""The hand-written payload builder of each class that has one, by exact class (a subclass is
unknown): ``RunResult``, ``StepRecord`` and each log record kind that registered one with
``_encodes``. A kind of ``RECORDS`` without one gets the builder derived from its fields
(``_derived_codec``)."""

_DECODERS: dict[type, Callable[[Mapping[str, object]], Any]] = {}
"""The hand-written decoder of each log record kind that registered one (``_decodes``)."""


def _encodes(cls: type) -> Callable[[_Payload], _Payload]:
    """Register the decorated function as ``cls``'s payload builder."""

    def register(build: _Payload) -> _Payload:
        _PAYLOADS[cls] = build
        return build

    return register


def _decodes(
    cls: type[_T],
) -> Callable[[Callable[[Mapping[str, object]], _T]], Callable[[Mapping[str, object]], _T]]:
    """Register the decorated function as ``cls``'s decoder."""

    def register(
        decode: Callable[[Mapping[str, object]], _T],
    ) -> Callable[[Mapping[str, object]], _T]:
        _DECODERS[cls] = decode
        return decode

    return register


# --------------------------------------------------------------------------- encoding
#
# How the payloads are built (design 0214): one dict literal per record, with the
# caller's first key (``encode``: the version itself; the stores: their type tag) and the
# version in front and every field in its place, so no payload is copied into another. A
# field whose value has its exact expected type (an ``IntentKind``, a ``ModelReply``, ``()``)
# takes the short way written inline; any other value goes the general way (``_plain``; a
# nested record of another type passed through as it is; ``_tool_call_fields``), so a record
# forced to wrong types encodes exactly as it always did. An enum's ``_value_`` is
# what its ``value`` property returns, without the property's call.


def encode(record: Encodable) -> dict[str, object]:
    """Return a JSON-ready ``dict`` of ``record``'s fields plus ``"schema_version"``.

    The result contains only ``str``/``int``/``bool``/``None``, lists and dicts when the record
    holds correctly typed values; wrongly typed values are passed through unchanged (see the
    module docstring). Raises ``TypeError`` for any other type of object.
    """
    return encode_tagged(record, VERSION_KEY, SCHEMA_VERSION)


def encode_tagged(record: Encodable, key: str, tag: str) -> dict[str, object]:
    """``{key: tag, **encode(record)}``, built as one dict: what a store frames a line with.

    ``key`` must be no field of any record (``VERSION_KEY`` itself gives ``encode(record)``).
    Raises ``TypeError`` as ``encode`` does.
    """
    build = _PAYLOADS.get(type(record))
    if build is None:
        build = _derived_payload(type(record))
    return build(record, key, tag)


def _derived_payload(cls: type) -> _Payload:
    """The payload builder of a record kind of ``RECORDS`` that registered none; refuses any
    other class."""
    if cls not in RECORDS.by_class:
        raise PolyloopTypeError(
            f"encode() cannot encode a {cls.__qualname__}; it encodes exactly "
            f"{RECORDS.names().replace(' and ', ', ')}, RunResult and StepRecord (not "
            "subclasses)"
        )
    return _derived_codec(cls).payload


def _plain(value: object) -> object:
    """An enum member as its value, a tuple as a list; anything else unchanged."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _resumed(record: object, payload: dict[str, object]) -> dict[str, object]:
    """``payload`` with the record's resume mark (1.8, design 0215) last, when it has one.

    Read with ``getattr`` because encode never judges, not even a record built around its
    ``__init__`` (whose ``resumed`` slot may be unset)."""
    resumed = getattr(record, "resumed", None)
    if resumed is not None:
        payload["resumed"] = _resume_mark_fields(resumed)
    return payload


@_encodes(RunStarted)
def _run_started(record: RunStarted, key: str, tag: str) -> dict[str, object]:
    snapshot = record.parameter_snapshot
    payload: dict[str, object] = {
        key: tag,
        VERSION_KEY: SCHEMA_VERSION,
        "run_id": record.run_id,
        "parameter_snapshot": dict(snapshot) if isinstance(snapshot, Mapping) else snapshot,
        "continues": record.continues,
        "context": _context_fields(getattr(record, "context", None)),
        **_parent_fields(getattr(record, "parent", None)),
    }
    fork = getattr(record, "fork", None)
    if fork is not None:  # only on a fork (1.9, design 0239): other starts keep their bytes
        payload["fork"] = _fork_fields(fork)
    return payload


def _parent_fields(parent: object) -> dict[str, object]:
    """``{"parent": {...}}`` for a child run's start (1.9, design 0245); nothing for a root."""
    if parent is None:
        return {}
    if type(parent) is not ParentLink:
        return {"parent": parent}
    return {
        "parent": {
            "run_id": parent.run_id,
            "step_idx": parent.step_idx,
            "idempotency_key": parent.idempotency_key,
            "depth": parent.depth,
            "max_depth": parent.max_depth,
        }
    }


def _child_fields(child: object) -> dict[str, object]:
    """``{"child": {...}}`` for a step that ran a child run (1.9, design 0245); else nothing,
    so that every other step is written byte for byte as before."""
    if child is None:
        return {}
    if type(child) is not ChildRun:
        return {"child": child}
    return {
        "child": {
            "run_id": child.run_id,
            "stop_reason": _plain(child.stop_reason),
            "steps": child.steps,
            "tokens": child.tokens,
            **({} if child.cost is None else {"cost": _money(child.cost)}),
        }
    }


@_encodes(Intent)
def _intent(record: Intent, key: str, tag: str) -> dict[str, object]:
    return _resumed(
        record,
        {
            key: tag,
            VERSION_KEY: SCHEMA_VERSION,
            "run_id": record.run_id,
            "kind": k._value_ if type(k := record.kind) is IntentKind else _plain(k),
            "call_index": record.call_index,
            "result_id": record.result_id,
            "replay_policy": (
                p._value_ if type(p := record.replay_policy) is ReplayPolicy else _plain(p)
            ),
            "idempotency_key": record.idempotency_key,
        },
    )


def _usage_fields(usage: Usage) -> dict[str, object]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }


_NO_CALLS: tuple[NativeToolCall, ...] = ()
"""The empty tuple (one object in CPython): ``tool_calls is _NO_CALLS`` is the short way to
``[]``; any other value, an equal one included, goes through ``_tool_call_fields``."""


def _tool_call_fields(value: object) -> object:
    """``[{"id", "name", "arguments"}, ...]`` for a tuple of tool calls; anything else as is."""
    if not isinstance(value, (tuple, list)):  # a tuple, not a union built per call
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
        "usage": _usage_fields(u) if type(u := reply.usage) is Usage else u,
        "tool_calls": [] if (c := reply.tool_calls) is _NO_CALLS else _tool_call_fields(c),
        "finish_reason": reply.finish_reason,
    }


@_encodes(ModelCallResult)
def _model_call_result(record: ModelCallResult, key: str, tag: str) -> dict[str, object]:
    return _resumed(
        record,
        {
            key: tag,
            VERSION_KEY: SCHEMA_VERSION,
            "run_id": record.run_id,
            "result_id": record.result_id,
            "reply": _model_reply_fields(r) if type(r := record.reply) is ModelReply else r,
            "failure": record.failure,
            "duration_ms": record.duration_ms,
            "context_length_exceeded": record.context_length_exceeded,
        },
    )


def _action_outcome_fields(outcome: ActionOutcome) -> dict[str, object]:
    return {
        "status": s._value_ if type(s := outcome.status) is ActionStatus else _plain(s),
        "observation": outcome.observation,
        "observation_is_synthetic": outcome.observation_is_synthetic,
        "env_reported_completion": outcome.env_reported_completion,
        "observation_truncated_chars": outcome.observation_truncated_chars,
        "settled_by": outcome.settled_by,
    }


def _step_record_fields(step: StepRecord) -> dict[str, object]:
    """A step's fields (no version): nested in a ``StepCompleted`` or a ``RunResult``."""
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
        "action_status": s._value_ if type(s := step.action_status) is ActionStatus else _plain(s),
        "usage": _usage_fields(u) if type(u := step.usage) is Usage else u,
        "model_ms": step.model_ms,
        "action_ms": step.action_ms,
        "tool_calls": [] if (c := step.tool_calls) is _NO_CALLS else _tool_call_fields(c),
        # 1.9 (design 0236): written only when known, so a step without a cost is stored
        # byte for byte as before.
        **({} if (m := step.cost) is None else {"cost": _money(m)}),
        **_child_fields(getattr(step, "child", None)),
    }


def _money(amount: object) -> object:
    """A cost as its decimal string (``"0.0125"``), anything else as ``_plain`` has it."""
    return money_text(amount) if type(amount) is decimal.Decimal else _plain(amount)


@_encodes(StepRecord)
def _step_record(step: StepRecord, key: str, tag: str) -> dict[str, object]:
    return {key: tag, VERSION_KEY: SCHEMA_VERSION, **_step_record_fields(step)}


@_encodes(StepCompleted)
def _step_completed(record: StepCompleted, key: str, tag: str) -> dict[str, object]:
    return _resumed(
        record,
        {
            key: tag,
            VERSION_KEY: SCHEMA_VERSION,
            "run_id": record.run_id,
            "result_id": record.result_id,
            "action_outcome": (
                _action_outcome_fields(o)
                if type(o := record.action_outcome) is ActionOutcome
                else o
            ),
            "step": _step_record_fields(s) if type(s := record.step) is StepRecord else s,
        },
    )


def _run_result_fields(result: RunResult) -> dict[str, object]:
    steps: object = result.steps
    if isinstance(steps, (tuple, list)):  # a tuple, not a union built per call
        steps = [_step_record_fields(s) if type(s) is StepRecord else s for s in steps]
    return {
        "run_id": result.run_id,
        "stop_reason": _plain(result.stop_reason),
        "final_answer": result.final_answer,
        "steps": steps,
        "event_delivery_failures": result.event_delivery_failures,
        "unknown_outcome": result.unknown_outcome,
        # Written only when set (design 0245): every other result encodes as before.
        **({} if result.stop_detail is None else {"stop_detail": result.stop_detail}),
    }


@_encodes(RunResult)
def _run_result(result: RunResult, key: str, tag: str) -> dict[str, object]:
    return {key: tag, VERSION_KEY: SCHEMA_VERSION, **_run_result_fields(result)}


@_encodes(RunFinished)
def _run_finished(record: RunFinished, key: str, tag: str) -> dict[str, object]:
    return _resumed(
        record,
        {
            key: tag,
            VERSION_KEY: SCHEMA_VERSION,
            "run_id": record.run_id,
            "result": _run_result_fields(r) if type(r := record.result) is RunResult else r,
        },
    )


@_encodes(Settlement)
def _settlement(record: Settlement, key: str, tag: str) -> dict[str, object]:
    return {
        key: tag,
        VERSION_KEY: SCHEMA_VERSION,
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


@_encodes(ApprovalRequest)
def _approval_request(record: ApprovalRequest, key: str, tag: str) -> dict[str, object]:
    return _resumed(
        record,
        {
            key: tag,
            VERSION_KEY: SCHEMA_VERSION,
            "run_id": record.run_id,
            "result_id": record.result_id,
            "step_idx": record.step_idx,
            "tool": record.tool,
            "tool_call_id": record.tool_call_id,
            "arguments": record.arguments,
            "digest": record.digest,
            "requested_at": record.requested_at,
            "expires_at": record.expires_at,
        },
    )


# --------------------------------------------------------------------------- decoding: helpers


def _describe(value: object) -> str:
    """The type name used in "got ..." (``None`` is spelled ``None``)."""
    return "None" if value is None else type(value).__name__


def _object(value: object, path: str, *, top: bool) -> Mapping[str, object]:
    """Check that ``value`` is a mapping and that its schema version is readable.

    ``top`` payloads must carry a version; nested ones may omit it.
    """
    if type(value) is not dict and not isinstance(value, Mapping):
        raise DecodeError(f"{path}: expected a mapping (JSON object), got {_describe(value)}")
    if VERSION_KEY in value:
        _check_version(value[VERSION_KEY], path)
    elif top:
        raise DecodeError(
            f"{path}.{VERSION_KEY}: expected a version string like {SCHEMA_VERSION!r}, but the "
            "field is missing (every top-level payload written by encode() has one)"
        )
    return value


def _check_version(version: object, path: str) -> None:
    if version == SCHEMA_VERSION and isinstance(version, str):
        return  # the version this library writes: the common case, and always readable
    where = f"{path}.{VERSION_KEY}"
    if not isinstance(version, str):
        raise DecodeError(
            f"{where}: expected str like {SCHEMA_VERSION!r}, got {_describe(version)}"
        )
    match = _VERSION_PATTERN.fullmatch(version)
    if match is None:
        raise DecodeError(
            f"{where}: expected '<major>.<minor>' made of decimal integers, got {version!r}"
        )
    digits = match.group(1)
    # Compared as text first: int() of a 5,000-digit major raises ValueError, not DecodeError.
    major = int(digits) if len(digits) <= _MAX_MAJOR_DIGITS else None
    if major != _MAJOR:
        if major is None:
            raise DecodeError(
                f"{where}: the payload's major version has {len(digits)} digits; this polyloop "
                f"reads major version {_MAJOR} (SCHEMA_VERSION {SCHEMA_VERSION!r})"
            )
        raise DecodeError(
            f"{where}: the payload has major version {major} ({version!r}) but this polyloop "
            f"reads major version {_MAJOR} (SCHEMA_VERSION {SCHEMA_VERSION!r}); read it with "
            f"a polyloop whose SCHEMA_VERSION has major version {major}"
        )


def _missing(path: str, name: str, expected: str) -> NoReturn:
    raise DecodeError(f"{path}.{name}: expected {expected}, but the field is missing")


def _field(payload: Mapping[str, object], path: str, name: str, expected: str) -> object:
    if name not in payload:
        _missing(path, name, expected)
    return payload[name]


def _str(payload: Mapping[str, object], path: str, name: str) -> str:
    value = _field(payload, path, name, "str")
    if not isinstance(value, str):
        raise DecodeError(f"{path}.{name}: expected str, got {_describe(value)}")
    return value


def _optional_str(payload: Mapping[str, object], path: str, name: str) -> str | None:
    value = _field(payload, path, name, "str or None")
    if value is not None and not isinstance(value, str):
        raise DecodeError(f"{path}.{name}: expected str or None, got {_describe(value)}")
    return value


def _int(payload: Mapping[str, object], path: str, name: str) -> int:
    value = _field(payload, path, name, "int")
    # bool is an int subclass in Python, but true/false is never a count or an index.
    if isinstance(value, bool) or not isinstance(value, int):
        raise DecodeError(f"{path}.{name}: expected int, got {_describe(value)}")
    return value


def _added_optional_int(payload: Mapping[str, object], path: str, name: str) -> int | None:
    """An ``int or None`` field added after 1.0: absent (an older writer) reads as ``None``."""
    value = payload.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise DecodeError(f"{path}.{name}: expected int or None, got {_describe(value)}")
    return value


def _added_optional_str(payload: Mapping[str, object], path: str, name: str) -> str | None:
    """A ``str or None`` field added after 1.0: absent (an older writer) reads as ``None``."""
    value = payload.get(name)
    if value is not None and not isinstance(value, str):
        raise DecodeError(f"{path}.{name}: expected str or None, got {_describe(value)}")
    return value


def _added_money(payload: Mapping[str, object], path: str, name: str) -> decimal.Decimal | None:
    """A cost added in 1.9, written as a decimal string: absent or ``null`` reads as ``None``."""
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DecodeError(
            f"{path}.{name}: expected a decimal string or None, got {_describe(value)}"
        )
    try:
        amount = decimal.Decimal(value)
    except decimal.InvalidOperation:
        amount = None
    if amount is None or not amount.is_finite() or amount < 0 or value != value.strip():
        raise DecodeError(
            f"{path}.{name}: expected a decimal string >= 0 like '0.0125', got {value!r}"
        )
    return amount


def _added_bool(payload: Mapping[str, object], path: str, name: str, default: bool) -> bool:
    """A ``bool`` field added after 1.0: absent (an older writer) reads as ``default``."""
    value = payload.get(name, default)
    if not isinstance(value, bool):
        raise DecodeError(f"{path}.{name}: expected bool, got {_describe(value)}")
    return value


def _added_usage(payload: Mapping[str, object], path: str) -> Usage | None:
    """The ``usage`` object added in 1.1 (absent or ``null`` reads as ``None``)."""
    value = payload.get("usage")
    if value is None:
        return None
    where = f"{path}.usage"
    usage = _object(value, where, top=False)
    return _build(
        where,
        Usage,
        prompt_tokens=_int(usage, where, "prompt_tokens"),
        completion_tokens=_int(usage, where, "completion_tokens"),
        cached_tokens=_optional_int(usage, where, "cached_tokens"),
    )


def _optional_int(payload: Mapping[str, object], path: str, name: str) -> int | None:
    value = _field(payload, path, name, "int or None")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise DecodeError(f"{path}.{name}: expected int or None, got {_describe(value)}")
    return value


def _bool(payload: Mapping[str, object], path: str, name: str) -> bool:
    value = _field(payload, path, name, "bool")
    if not isinstance(value, bool):
        raise DecodeError(f"{path}.{name}: expected bool, got {_describe(value)}")
    return value


@functools.cache
def _choices(enum_cls: type[enum.Enum]) -> str:
    return ", ".join(repr(member.value) for member in enum_cls)


@functools.cache
def _members_by_value(enum_cls: type[enum.Enum]) -> Mapping[object, enum.Enum]:
    return MappingProxyType({member.value: member for member in enum_cls})


def _enum_value(value: object, path: str, enum_cls: type[_E], *, optional: bool) -> _E | None:
    if value is None and optional:
        return None
    if isinstance(value, str):
        member = _members_by_value(enum_cls).get(value)
        if member is not None:
            return cast(_E, member)
    suffix = " or None" if optional else ""
    got = repr(value) if isinstance(value, str) else _describe(value)
    raise DecodeError(f"{path}: expected one of {_choices(enum_cls)}{suffix}, got {got}")


def _enum(payload: Mapping[str, object], path: str, name: str, enum_cls: type[_E]) -> _E:
    if name not in payload:
        _missing(path, name, f"one of {_choices(enum_cls)}")
    member = _enum_value(payload[name], f"{path}.{name}", enum_cls, optional=False)
    assert member is not None  # optional=False never returns None
    return member


def _optional_enum(
    payload: Mapping[str, object], path: str, name: str, enum_cls: type[_E]
) -> _E | None:
    if name not in payload:
        _missing(path, name, f"one of {_choices(enum_cls)} or None")
    return _enum_value(payload[name], f"{path}.{name}", enum_cls, optional=True)


def _str_mapping(payload: Mapping[str, object], path: str, name: str) -> dict[str, str]:
    value = _field(payload, path, name, "a mapping of str to str")
    where = f"{path}.{name}"
    if not isinstance(value, Mapping):
        raise DecodeError(f"{where}: expected a mapping of str to str, got {_describe(value)}")
    result: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise DecodeError(f"{where}: expected str keys, got key {key!r} ({_describe(key)})")
        if not isinstance(item, str):
            raise DecodeError(f"{where}[{key!r}]: expected str, got {_describe(item)}")
        result[key] = item
    return result


def _build(path: str, factory: Callable[..., _T], **fields: object) -> _T:
    """Construct a record, turning the dataclass's own validation errors into DecodeError."""
    try:
        return factory(**fields)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{path}: {exc}") from exc


# --------------------------------------------------------------------------- decoding: records


def _tool_calls(payload: Mapping[str, object], path: str) -> tuple[NativeToolCall, ...]:
    """The ``tool_calls`` list (added in 1.4): absent means ``()``, as in older payloads."""
    if "tool_calls" not in payload:
        return ()
    raw = payload["tool_calls"]
    where = f"{path}.tool_calls"
    if not isinstance(raw, list | tuple):
        raise DecodeError(f"{where}: expected a list of tool call objects, got {_describe(raw)}")
    calls: list[NativeToolCall] = []
    for index, item in enumerate(raw):
        item_path = f"{where}[{index}]"
        checked = _object(item, item_path, top=False)
        calls.append(
            _build(
                item_path,
                NativeToolCall,
                id=_str(checked, item_path, "id"),
                name=_str(checked, item_path, "name"),
                arguments=_str(checked, item_path, "arguments"),
            )
        )
    return tuple(calls)


def _model_reply_at(value: object, path: str) -> ModelReply:
    payload = _object(value, path, top=False)
    return _build(
        path,
        ModelReply,
        call_id=_optional_str(payload, path, "call_id"),
        content=_str(payload, path, "content"),
        thinking=_str(payload, path, "thinking"),
        usage=_added_usage(payload, path),
        finish_reason=_added_optional_str(payload, path, "finish_reason"),
        tool_calls=_tool_calls(payload, path),
    )


def _action_outcome_at(value: object, path: str) -> ActionOutcome:
    payload = _object(value, path, top=False)
    return _build(
        path,
        ActionOutcome,
        status=_enum(payload, path, "status", ActionStatus),
        observation=_str(payload, path, "observation"),
        observation_is_synthetic=_bool(payload, path, "observation_is_synthetic"),
        env_reported_completion=_bool(payload, path, "env_reported_completion"),
        observation_truncated_chars=_int(payload, path, "observation_truncated_chars"),
        settled_by=_added_optional_str(payload, path, "settled_by"),
    )


def _step_record_at(value: object, path: str, *, top: bool) -> StepRecord:
    payload = _object(value, path, top=top)
    return _build(
        path,
        StepRecord,
        step_idx=_int(payload, path, "step_idx"),
        raw_output=_str(payload, path, "raw_output"),
        content_chars=_int(payload, path, "content_chars"),
        thinking_chars=_int(payload, path, "thinking_chars"),
        action=_optional_str(payload, path, "action"),
        parse_ok=_bool(payload, path, "parse_ok"),
        parse_error=_optional_str(payload, path, "parse_error"),
        observation=_str(payload, path, "observation"),
        observation_is_synthetic=_bool(payload, path, "observation_is_synthetic"),
        observation_truncated_chars=_int(payload, path, "observation_truncated_chars"),
        prompt_chars=_int(payload, path, "prompt_chars"),
        call_id=_optional_str(payload, path, "call_id"),
        step_wall_ms=_int(payload, path, "step_wall_ms"),
        action_status=_optional_enum(payload, path, "action_status", ActionStatus),
        usage=_added_usage(payload, path),
        model_ms=_added_optional_int(payload, path, "model_ms"),
        action_ms=_added_optional_int(payload, path, "action_ms"),
        tool_calls=_tool_calls(payload, path),
        cost=_added_money(payload, path, "cost"),
        child=_added_child(payload, path),
    )


def _run_result_at(value: object, path: str, *, top: bool) -> RunResult:
    payload = _object(value, path, top=top)
    raw_steps = _field(payload, path, "steps", "a list of step records")
    if not isinstance(raw_steps, list | tuple):
        raise DecodeError(
            f"{path}.steps: expected a list of step records, got {_describe(raw_steps)}"
        )
    steps = tuple(
        _step_record_at(item, f"{path}.steps[{index}]", top=False)
        for index, item in enumerate(raw_steps)
    )
    return _build(
        path,
        RunResult,
        run_id=_str(payload, path, "run_id"),
        stop_reason=_enum(payload, path, "stop_reason", StopReason),
        final_answer=_optional_str(payload, path, "final_answer"),
        steps=steps,
        event_delivery_failures=_int(payload, path, "event_delivery_failures"),
        unknown_outcome=_added_optional_str(payload, path, "unknown_outcome"),
        stop_detail=_added_optional_str(payload, path, "stop_detail"),
    )


@_decodes(RunStarted)
def decode_run_started(payload: Mapping[str, object]) -> RunStarted:
    """Rebuild a ``RunStarted``; snapshot keys and values must all be ``str``."""
    path = "RunStarted"
    checked = _object(payload, path, top=True)
    return _build(
        path,
        RunStarted,
        run_id=_str(checked, path, "run_id"),
        parameter_snapshot=_str_mapping(checked, path, "parameter_snapshot"),
        continues=_added_optional_str(checked, path, "continues"),
        context=_added_context(checked, path),
        fork=_added_fork(checked, path),
        parent=_added_parent(checked, path),
    )


@_decodes(Intent)
def decode_intent(payload: Mapping[str, object]) -> Intent:
    """Rebuild an ``Intent``."""
    path = "Intent"
    checked = _object(payload, path, top=True)
    return _build(
        path,
        Intent,
        run_id=_str(checked, path, "run_id"),
        kind=_enum(checked, path, "kind", IntentKind),
        call_index=_int(checked, path, "call_index"),
        result_id=_str(checked, path, "result_id"),
        replay_policy=_enum(checked, path, "replay_policy", ReplayPolicy),
        idempotency_key=_added_optional_str(checked, path, "idempotency_key"),
        resumed=_added_resume_mark(checked, path),
    )


@_decodes(ModelCallResult)
def decode_model_call_result(payload: Mapping[str, object]) -> ModelCallResult:
    """Rebuild a ``ModelCallResult``; ``reply`` is a nested object or ``None``."""
    path = "ModelCallResult"
    checked = _object(payload, path, top=True)
    raw_reply = _field(checked, path, "reply", "a model reply object or None")
    reply = None if raw_reply is None else _model_reply_at(raw_reply, f"{path}.reply")
    return _build(
        path,
        ModelCallResult,
        run_id=_str(checked, path, "run_id"),
        result_id=_str(checked, path, "result_id"),
        reply=reply,
        failure=_optional_str(checked, path, "failure"),
        duration_ms=_added_optional_int(checked, path, "duration_ms"),
        context_length_exceeded=_added_bool(checked, path, "context_length_exceeded", False),
        resumed=_added_resume_mark(checked, path),
    )


@_decodes(StepCompleted)
def decode_step_completed(payload: Mapping[str, object]) -> StepCompleted:
    """Rebuild a ``StepCompleted``; ``action_outcome`` is a nested object or ``None``."""
    path = "StepCompleted"
    checked = _object(payload, path, top=True)
    raw_outcome = _field(checked, path, "action_outcome", "an action outcome object or None")
    outcome = (
        None if raw_outcome is None else _action_outcome_at(raw_outcome, f"{path}.action_outcome")
    )
    step = _step_record_at(
        _field(checked, path, "step", "a step record object"), f"{path}.step", top=False
    )
    return _build(
        path,
        StepCompleted,
        run_id=_str(checked, path, "run_id"),
        result_id=_optional_str(checked, path, "result_id"),
        action_outcome=outcome,
        step=step,
        resumed=_added_resume_mark(checked, path),
    )


@_decodes(RunFinished)
def decode_run_finished(payload: Mapping[str, object]) -> RunFinished:
    """Rebuild a ``RunFinished``; its ``result`` is a nested ``RunResult`` object."""
    path = "RunFinished"
    checked = _object(payload, path, top=True)
    result = _run_result_at(
        _field(checked, path, "result", "a run result object"), f"{path}.result", top=False
    )
    return _build(
        path,
        RunFinished,
        run_id=_str(checked, path, "run_id"),
        result=result,
        resumed=_added_resume_mark(checked, path),
    )


@_decodes(Settlement)
def decode_settlement(payload: Mapping[str, object]) -> Settlement:
    """Rebuild a ``Settlement`` (schema 1.7); every field is required."""
    path = "Settlement"
    checked = _object(payload, path, top=True)
    return _build(
        path,
        Settlement,
        run_id=_str(checked, path, "run_id"),
        result_id=_str(checked, path, "result_id"),
        verdict=_enum(checked, path, "verdict", SettlementVerdict),
        source=_enum(checked, path, "source", SettlementSource),
        by=_str(checked, path, "by"),
        at=_str(checked, path, "at"),
        observation=_optional_str(checked, path, "observation"),
        note=_str(checked, path, "note"),
        digest=_added_optional_str(checked, path, "digest"),
    )


@_decodes(ApprovalRequest)
def decode_approval_request(payload: Mapping[str, object]) -> ApprovalRequest:
    """Rebuild an ``ApprovalRequest`` (schema 1.7, design 0210); every field is required."""
    path = "ApprovalRequest"
    checked = _object(payload, path, top=True)
    return _build(
        path,
        ApprovalRequest,
        run_id=_str(checked, path, "run_id"),
        result_id=_str(checked, path, "result_id"),
        step_idx=_int(checked, path, "step_idx"),
        tool=_str(checked, path, "tool"),
        tool_call_id=_optional_str(checked, path, "tool_call_id"),
        arguments=_str(checked, path, "arguments"),
        digest=_str(checked, path, "digest"),
        requested_at=_str(checked, path, "requested_at"),
        expires_at=_optional_str(checked, path, "expires_at"),
        resumed=_added_resume_mark(checked, path),
    )


def decode_run_result(payload: Mapping[str, object]) -> RunResult:
    """Rebuild a ``RunResult`` from ``encode(result)``; for reading results without a store."""
    return _run_result_at(payload, "RunResult", top=True)


def decode_step_record(payload: Mapping[str, object]) -> StepRecord:
    """Rebuild a ``StepRecord`` from ``encode(step)``; for reading trajectories without a store."""
    return _step_record_at(payload, "StepRecord", top=True)


# --------------------------------------------------------------------------- 1.8: context, resumes


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


def _fork_fields(origin: object) -> object:
    if type(origin) is not ForkOrigin:
        return origin
    fields: dict[str, object] = {
        "run_id": origin.run_id,
        "step_idx": origin.step_idx,
        "records": origin.records,
        "digest": origin.digest,
    }
    if origin.chain:
        fields["chain"] = [_fork_fields(entry) for entry in origin.chain]
    return fields


def _fork_at(value: object, where: str, *, nested: bool) -> ForkOrigin:
    checked = _object(value, where, top=False)
    chain: tuple[ForkOrigin, ...] = ()
    if not nested and checked.get("chain") is not None:
        chain = tuple(
            _fork_at(raw, f"{where}.chain[{index}]", nested=True)
            for index, raw in enumerate(_list(checked, where, "chain", "fork origins"))
        )
    return _build(
        where,
        ForkOrigin,
        run_id=_str(checked, where, "run_id"),
        step_idx=_int(checked, where, "step_idx"),
        records=_int(checked, where, "records"),
        digest=_str(checked, where, "digest"),
        chain=chain,
    )


def _added_fork(payload: Mapping[str, object], path: str) -> ForkOrigin | None:
    """A run's ``fork`` origin (added in 1.9): absent or ``null`` reads as ``None``."""
    value = payload.get("fork")
    return None if value is None else _fork_at(value, f"{path}.fork", nested=False)


def _resume_mark_fields(mark: object) -> object:
    if type(mark) is not ResumeMark:
        return mark
    return {"at": mark.at, "plan": mark.plan, "step_idx": mark.step_idx, "epoch": mark.epoch}


def _list(payload: Mapping[str, object], path: str, name: str, what: str) -> list[object]:
    value = _field(payload, path, name, f"a list of {what}")
    if not isinstance(value, list | tuple):
        raise DecodeError(f"{path}.{name}: expected a list of {what}, got {_describe(value)}")
    return list(value)


def _message_at(value: object, path: str) -> Message:
    checked = _object(value, path, top=False)
    blocks: list[TextBlock] = []
    for index, raw in enumerate(_list(checked, path, "content", "text block objects")):
        where = f"{path}.content[{index}]"
        blocks.append(
            _build(where, TextBlock, text=_str(_object(raw, where, top=False), where, "text"))
        )
    return _build(
        path,
        Message,
        role=_enum(checked, path, "role", Role),
        content=tuple(blocks),
        tool_calls=_tool_calls(checked, path),
        tool_call_id=_optional_str(checked, path, "tool_call_id"),
    )


def _added_context(payload: Mapping[str, object], path: str) -> Context | None:
    """The run's ``context`` (added in 1.8): absent or ``null`` reads as ``None``."""
    value = payload.get("context")
    if value is None:
        return None
    where = f"{path}.context"
    checked = _object(value, where, top=False)
    levels = {
        level: tuple(
            _message_at(raw, f"{where}.{level}[{index}]")
            for index, raw in enumerate(_list(checked, where, level, "message objects"))
        )
        for level in ("run_level", "goal_level")
    }
    return _build(where, Context, **levels)


def _added_parent(payload: Mapping[str, object], path: str) -> ParentLink | None:
    """A child run's ``parent`` link (added in 1.9): absent or ``null`` reads as ``None``."""
    value = payload.get("parent")
    if value is None:
        return None
    where = f"{path}.parent"
    checked = _object(value, where, top=False)
    return _build(
        where,
        ParentLink,
        run_id=_str(checked, where, "run_id"),
        step_idx=_int(checked, where, "step_idx"),
        idempotency_key=_str(checked, where, "idempotency_key"),
        depth=_int(checked, where, "depth"),
        max_depth=_optional_int(checked, where, "max_depth"),
    )


def _added_child(payload: Mapping[str, object], path: str) -> ChildRun | None:
    """A step's ``child`` run (added in 1.9): absent or ``null`` reads as ``None``."""
    value = payload.get("child")
    if value is None:
        return None
    where = f"{path}.child"
    checked = _object(value, where, top=False)
    return _build(
        where,
        ChildRun,
        run_id=_str(checked, where, "run_id"),
        stop_reason=_enum(checked, where, "stop_reason", StopReason),
        steps=_int(checked, where, "steps"),
        tokens=_int(checked, where, "tokens"),
        cost=_added_money(checked, where, "cost"),
    )


def _added_resume_mark(payload: Mapping[str, object], path: str) -> ResumeMark | None:
    """A record's ``resumed`` mark (added in 1.8): absent or ``null`` reads as ``None``."""
    value = payload.get("resumed")
    if value is None:
        return None
    where = f"{path}.resumed"
    checked = _object(value, where, top=False)
    return _build(
        where,
        ResumeMark,
        at=_str(checked, where, "at"),
        plan=_str(checked, where, "plan"),
        step_idx=_int(checked, where, "step_idx"),
        epoch=_optional_int(checked, where, "epoch"),
    )


# --------------------------------------------------------------------------- records: by kind


def decode_record(cls: type[_T], payload: Mapping[str, object]) -> _T:
    """Rebuild a record of the kind ``cls`` (a class of ``polyloop.types.RECORDS``) from its
    payload: the kind's hand-written decoder, or the one derived from its fields. A class that
    is no record kind is a ``PolyloopTypeError``."""
    return cast(_T, record_decoder(cls)(payload))


def record_decoder(cls: type) -> Callable[[Mapping[str, object]], Any]:
    """The decoder of the record kind ``cls`` (see ``decode_record``), for a reader that
    decodes many payloads of one kind: look it up once."""
    decode = _DECODERS.get(cls)
    if decode is not None:
        return decode
    if cls not in RECORDS.by_class:
        raise PolyloopTypeError(
            f"no record kind has the class {cls.__qualname__}; the kinds are {RECORDS.names()}"
        )
    return _derived_codec(cls).decode


class _Codec(NamedTuple):
    """A record kind's payload builder and decoder, derived from its dataclass fields."""

    payload: _Payload
    decode: Callable[[Mapping[str, object]], Any]


_FieldDecoder = Callable[[Mapping[str, object], str, str], object]


def _float(payload: Mapping[str, object], path: str, name: str) -> float:
    value = _field(payload, path, name, "float")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(f"{path}.{name}: expected float, got {_describe(value)}")
    return float(value)


def _optional(decode: _FieldDecoder, what: str) -> _FieldDecoder:
    def optional(payload: Mapping[str, object], path: str, name: str) -> object:
        if _field(payload, path, name, f"{what} or None") is None:
            return None
        return decode(payload, path, name)

    return optional


def _enum_field(enum_cls: type[enum.Enum]) -> _FieldDecoder:
    def decode(payload: Mapping[str, object], path: str, name: str) -> object:
        return _enum(payload, path, name, enum_cls)

    return decode


def _str_tuple(payload: Mapping[str, object], path: str, name: str) -> tuple[str, ...]:
    items = _list(payload, path, name, "str")
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise DecodeError(f"{path}.{name}[{index}]: expected str, got {_describe(item)}")
    return cast(tuple[str, ...], tuple(items))


_FIELD_DECODERS: Mapping[object, tuple[_FieldDecoder, str]] = {
    str: (_str, "str"),
    int: (_int, "int"),
    bool: (_bool, "bool"),
    float: (_float, "float"),
    Mapping[str, str]: (_str_mapping, "a mapping of str to str"),
    tuple[str, ...]: (_str_tuple, "a list of str"),
}
"""The field types a derived codec reads (and ``X | None`` of each, and enums); a record kind
with a field of any other type registers a hand-written codec (``_encodes``, ``_decodes``)."""


def _field_decoder(owner: str, name: str, hint: object) -> _FieldDecoder:
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        decode = _field_decoder(owner, name, inner)
        return _optional(decode, _FIELD_DECODERS.get(inner, (None, "a value"))[1])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_field(hint)
    known = _FIELD_DECODERS.get(hint)
    if known is None:
        raise PolyloopTypeError(
            f"{owner}.{name}: a record kind's codec is derived only for fields of types str, "
            "int, bool, float, Mapping[str, str], tuple[str, ...], enums and those or None; "
            "register a hand-written codec in polyloop.serialization for this one"
        )
    return known[0]


@functools.cache
def _derived_codec(cls: type) -> _Codec:
    """The codec of a record kind without a hand-written one, built once per class: every
    field in declaration order, each required, written as ``_plain`` writes it (a mapping as
    an object); ``resumed`` (a ``ResumeMark``) written last and only when set, like the
    hand-written kinds'."""
    owner = cls.__name__
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls) if f.name != "resumed")
    resumes = any(f.name == "resumed" for f in dataclasses.fields(cls))
    decoders = tuple((name, _field_decoder(owner, name, hints[name])) for name in names)

    def payload(record: object, key: str, tag: str) -> dict[str, object]:
        built: dict[str, object] = {key: tag, VERSION_KEY: SCHEMA_VERSION}
        for name in names:
            value = getattr(record, name)
            built[name] = dict(value) if isinstance(value, Mapping) else _plain(value)
        return _resumed(record, built) if resumes else built

    def decode(raw: Mapping[str, object]) -> object:
        checked = _object(raw, owner, top=True)
        fields = {name: read(checked, owner, name) for name, read in decoders}
        if resumes:
            fields["resumed"] = _added_resume_mark(checked, owner)
        return _build(owner, cls, **fields)

    return _Codec(payload, decode)
