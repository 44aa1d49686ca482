"""polyloop.serialization: exact round trips, the payload shape, the schema version rule and
the DecodeError texts.

The decisions pinned here are documented in research-wiki/design/0021-schema-version-rule.md and
research-wiki/reference/log-format.md.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
from collections.abc import Callable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop import serialization
from polyloop.serialization import (
    SCHEMA_VERSION,
    DecodeError,
    decode_approval_request,
    decode_intent,
    decode_model_call_result,
    decode_run_finished,
    decode_run_result,
    decode_run_started,
    decode_settlement,
    decode_step_completed,
    decode_step_record,
    encode,
)
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    Intent,
    IntentKind,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    SettlementSource,
    SettlementVerdict,
    StepCompleted,
    StepRecord,
    StopReason,
)

pytestmark = pytest.mark.unit

NON_ASCII = (
    "Gr\u00fc\u00dfe \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \U0001f389 "
    'line\u2028sep\x85 "q" \\ \n\t'
)

# --------------------------------------------------------------------------- builders


def _step(**changes: object) -> StepRecord:
    fields: dict[str, object] = {
        "step_idx": 0,
        "raw_output": "act()",
        "content_chars": 5,
        "thinking_chars": 0,
        "action": "act()",
        "parse_ok": True,
        "parse_error": None,
        "observation": "done",
        "observation_is_synthetic": False,
        "observation_truncated_chars": 0,
        "prompt_chars": 120,
        "call_id": "call-1",
        "step_wall_ms": 17,
        "action_status": ActionStatus.EXECUTED,
    }
    fields.update(changes)
    return StepRecord(**fields)  # type: ignore[arg-type]


def _outcome(**changes: object) -> ActionOutcome:
    fields: dict[str, object] = {
        "status": ActionStatus.EXECUTED,
        "observation": "done",
        "observation_is_synthetic": False,
        "env_reported_completion": False,
        "observation_truncated_chars": 0,
    }
    fields.update(changes)
    return ActionOutcome(**fields)  # type: ignore[arg-type]


def _intent(**changes: object) -> Intent:
    fields: dict[str, object] = {
        "run_id": "r1",
        "kind": IntentKind.MODEL_CALL,
        "call_index": 0,
        "result_id": "m0",
        "replay_policy": ReplayPolicy.NEVER,
    }
    fields.update(changes)
    return Intent(**fields)  # type: ignore[arg-type]


def _result(**changes: object) -> RunResult:
    fields: dict[str, object] = {
        "run_id": "r1",
        "stop_reason": StopReason.FINAL_ANSWER,
        "final_answer": "42",
        "steps": (_step(), _step(step_idx=1, action=None, action_status=None)),
        "event_delivery_failures": 2,
    }
    fields.update(changes)
    return RunResult(**fields)  # type: ignore[arg-type]


def _forced(cls: type, **fields: object) -> object:
    """Build a record bypassing its validation, as a buggy caller's object might look."""
    record = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(record, name, value)
    return record


DECODERS: dict[type, Callable[[Mapping[str, object]], object]] = {
    RunStarted: decode_run_started,
    Intent: decode_intent,
    ModelCallResult: decode_model_call_result,
    StepCompleted: decode_step_completed,
    RunFinished: decode_run_finished,
    Settlement: decode_settlement,
    ApprovalRequest: decode_approval_request,
    RunResult: decode_run_result,
    StepRecord: decode_step_record,
}


def _round_trip(record: object) -> object:
    """encode, go through JSON text (as every store does), decode."""
    payload = json.loads(json.dumps(encode(record), ensure_ascii=False))  # type: ignore[arg-type]
    return DECODERS[type(record)](payload)


# --------------------------------------------------------------------------- strategies

_text = st.text(max_size=12)
_id = st.text(min_size=1, max_size=8)
_count = st.integers(min_value=0, max_value=2**53)


@st.composite
def _step_records(draw: st.DrawFn) -> StepRecord:
    has_action = draw(st.booleans())
    parse_ok = draw(st.booleans())
    return StepRecord(
        step_idx=draw(_count),
        raw_output=draw(_text),
        content_chars=draw(_count),
        thinking_chars=draw(_count),
        action=draw(_text) if has_action else None,
        parse_ok=parse_ok,
        parse_error=None if parse_ok else draw(_id),
        observation=draw(_text),
        observation_is_synthetic=draw(st.booleans()),
        observation_truncated_chars=draw(_count),
        prompt_chars=draw(_count),
        call_id=draw(st.none() | _id),
        step_wall_ms=draw(_count),
        action_status=draw(st.sampled_from(ActionStatus)) if has_action else None,
    )


_outcomes = st.builds(
    ActionOutcome,
    status=st.sampled_from(ActionStatus),
    observation=_text,
    observation_is_synthetic=st.booleans(),
    env_reported_completion=st.booleans(),
    observation_truncated_chars=_count,
    settled_by=st.none() | _id,
)
_keys = st.none() | st.from_regex(r"[A-Za-z0-9._:-]{1,255}", fullmatch=True)


_digests = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)
_DECISIONS = (SettlementVerdict.APPROVED, SettlementVerdict.REJECTED)


@st.composite
def _settlements(draw: st.DrawFn) -> Settlement:
    """Every valid shape: a verdict on an execution in doubt (a reconciler's or a person's;
    ``unknown`` a reconciler's only), or a decision on a call that waited for approval (a
    person's, or an expiry's rejection with the reason "expired"), which alone has a digest."""
    verdict = draw(st.sampled_from(SettlementVerdict))
    if verdict is SettlementVerdict.UNKNOWN:
        source = SettlementSource.RECONCILER
    elif verdict is SettlementVerdict.APPROVED:
        source = SettlementSource.PERSON
    elif verdict is SettlementVerdict.REJECTED:
        source = draw(st.sampled_from([SettlementSource.PERSON, SettlementSource.EXPIRY]))
    else:
        source = draw(st.sampled_from([SettlementSource.RECONCILER, SettlementSource.PERSON]))
    if source is SettlementSource.EXPIRY:
        note = "expired"
    elif verdict in (SettlementVerdict.UNKNOWN, SettlementVerdict.REJECTED):
        note = draw(_id)
    else:
        note = draw(_text)
    return Settlement(
        run_id=draw(_id),
        result_id=draw(_id),
        verdict=verdict,
        source=source,
        by=draw(_id),
        at=draw(_id),
        observation=draw(_text) if verdict is SettlementVerdict.EXECUTED else None,
        note=note,
        digest=draw(_digests) if verdict in _DECISIONS else None,
    )


_approval_requests = st.builds(
    ApprovalRequest,
    run_id=_id,
    result_id=_id,
    step_idx=_count,
    tool=_id,
    tool_call_id=st.none() | _id,
    arguments=_text,
    digest=_digests,
    requested_at=_id,
    expires_at=st.none() | _id,
)


@st.composite
def _run_results(draw: st.DrawFn, run_id: str | None = None) -> RunResult:
    reason = draw(st.sampled_from(StopReason))
    answer = draw(_id) if reason is StopReason.FINAL_ANSWER else draw(st.none() | _text)
    return RunResult(
        run_id=run_id if run_id is not None else draw(_id),
        stop_reason=reason,
        final_answer=answer,
        steps=draw(st.lists(_step_records(), max_size=3)),
        event_delivery_failures=draw(_count),
    )


@st.composite
def _model_call_results(draw: st.DrawFn) -> ModelCallResult:
    if draw(st.booleans()):
        reply = ModelReply(call_id=draw(st.none() | _id), content=draw(_text), thinking=draw(_text))
        return ModelCallResult(run_id=draw(_id), result_id=draw(_id), reply=reply, failure=None)
    return ModelCallResult(run_id=draw(_id), result_id=draw(_id), reply=None, failure=draw(_id))


@st.composite
def _step_completeds(draw: st.DrawFn) -> StepCompleted:
    outcome = draw(st.none() | _outcomes)
    return StepCompleted(
        run_id=draw(_id),
        result_id=None if outcome is None else draw(_id),
        action_outcome=outcome,
        step=draw(_step_records()),
    )


@st.composite
def _run_finisheds(draw: st.DrawFn) -> RunFinished:
    run_id = draw(_id)
    return RunFinished(run_id=run_id, result=draw(_run_results(run_id=run_id)))


_records = st.one_of(
    st.builds(RunStarted, run_id=_id, parameter_snapshot=st.dictionaries(_text, _text, max_size=4)),
    st.builds(
        Intent,
        run_id=_id,
        kind=st.sampled_from(IntentKind),
        call_index=_count,
        result_id=_id,
        replay_policy=st.sampled_from(ReplayPolicy),
        idempotency_key=_keys,
    ),
    _model_call_results(),
    _settlements(),
    _approval_requests,
    _step_completeds(),
    _run_finisheds(),
    _run_results(),
    _step_records(),
)


# --------------------------------------------------------------------------- round trips


@settings(max_examples=150, deadline=None)
@given(record=_records)
def test_every_encodable_record_round_trips_exactly_through_json_text(record: object) -> None:
    assert _round_trip(record) == record


@settings(max_examples=60, deadline=None)
@given(record=_records)
def test_decoding_the_encoded_dict_directly_round_trips_too(record: object) -> None:
    assert DECODERS[type(record)](encode(record)) == record  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", list(IntentKind))
@pytest.mark.parametrize("policy", list(ReplayPolicy))
def test_intents_keep_kind_and_non_default_replay_policy(
    kind: IntentKind, policy: ReplayPolicy
) -> None:
    record = _intent(kind=kind, replay_policy=policy, call_index=7, result_id="a7")
    decoded = _round_trip(record)
    assert decoded == record
    assert isinstance(decoded, Intent)
    assert decoded.replay_policy is policy
    assert decoded.kind is kind


@pytest.mark.parametrize("reason", list(StopReason))
def test_every_stop_reason_round_trips(reason: StopReason) -> None:
    result = _result(
        stop_reason=reason, final_answer="42" if reason is StopReason.FINAL_ANSWER else None
    )
    assert _round_trip(result) == result
    assert _round_trip(RunFinished(run_id="r1", result=result)) == RunFinished(
        run_id="r1", result=result
    )


@pytest.mark.parametrize("status", [None, *ActionStatus])
@pytest.mark.parametrize("call_id", [None, "call-9"])
@pytest.mark.parametrize("parse_error", [None, "no fence found"])
def test_step_records_keep_every_none_combination(
    status: ActionStatus | None, call_id: str | None, parse_error: str | None
) -> None:
    step = _step(
        action=None if status is None else "act()",
        action_status=status,
        call_id=call_id,
        parse_ok=parse_error is None,
        parse_error=parse_error,
    )
    assert _round_trip(step) == step


@pytest.mark.parametrize(
    "record",
    [
        ModelCallResult(
            run_id="r1", result_id="m0", reply=ModelReply(call_id=None, content=""), failure=None
        ),
        ModelCallResult(
            run_id="r1",
            result_id="m0",
            reply=ModelReply(call_id="c-1", content="hi", thinking="hmm"),
            failure=None,
        ),
        ModelCallResult(run_id="r1", result_id="m0", reply=None, failure="TimeoutError: slow"),
        StepCompleted(run_id="r1", result_id=None, action_outcome=None, step=_step()),
        StepCompleted(run_id="r1", result_id="a0", action_outcome=_outcome(), step=_step()),
        RunStarted(run_id="r1", parameter_snapshot={}),
        RunFinished(run_id="r1", result=_result(final_answer="x", steps=())),
    ],
    ids=[
        "reply-without-call-id",
        "reply-with-thinking",
        "failure",
        "step-without-action",
        "step-with-action",
        "empty-snapshot",
        "finish-without-steps",
    ],
)
def test_optional_parts_round_trip(record: object) -> None:
    assert _round_trip(record) == record


def test_non_ascii_text_round_trips_unchanged() -> None:
    started = RunStarted(run_id="r1", parameter_snapshot={NON_ASCII: NON_ASCII})
    reply = ModelReply(call_id=NON_ASCII, content=NON_ASCII, thinking=NON_ASCII)
    result = ModelCallResult(run_id="r1", result_id="m0", reply=reply, failure=None)
    for record in (started, result, _step(observation=NON_ASCII, raw_output=NON_ASCII)):
        assert _round_trip(record) == record


# --------------------------------------------------------------------------- payload shape


def test_payload_holds_the_fields_the_version_and_plain_json_values() -> None:
    payload = encode(
        StepCompleted(run_id="r1", result_id="a0", action_outcome=_outcome(), step=_step())
    )
    assert payload["schema_version"] == SCHEMA_VERSION
    assert set(payload) == {"schema_version", "run_id", "result_id", "action_outcome", "step"}
    assert payload["action_outcome"] == {
        "status": "executed",
        "observation": "done",
        "observation_is_synthetic": False,
        "env_reported_completion": False,
        "observation_truncated_chars": 0,
        "settled_by": None,
    }
    step = payload["step"]
    assert isinstance(step, dict)
    assert step["action_status"] == "executed"
    # Nested payloads carry no version of their own: the enclosing one governs.
    assert "schema_version" not in step
    assert "schema_version" not in payload["action_outcome"]  # type: ignore[operator]


def test_enums_are_written_as_their_values_and_tuples_as_lists() -> None:
    intent = encode(_intent(kind=IntentKind.ACTION, replay_policy=ReplayPolicy.SAFE))
    assert intent["kind"] == "action"
    assert intent["replay_policy"] == "safe"
    result = encode(_result())
    assert result["stop_reason"] == "final_answer"
    assert isinstance(result["steps"], list)
    assert len(result["steps"]) == 2
    assert result["event_delivery_failures"] == 2


def test_the_snapshot_is_written_as_a_plain_dict() -> None:
    payload = encode(RunStarted(run_id="r1", parameter_snapshot={"model": "m-1"}))
    assert payload["parameter_snapshot"] == {"model": "m-1"}
    assert type(payload["parameter_snapshot"]) is dict
    json.dumps(payload)  # a mappingproxy would not serialise


def test_the_schema_version_is_major_dot_minor() -> None:
    major, minor = SCHEMA_VERSION.split(".")
    assert major.isdigit()
    assert minor.isdigit()


def test_no_record_has_a_field_named_like_the_version_key() -> None:
    for cls in DECODERS:
        assert serialization.VERSION_KEY not in {f.name for f in dataclasses.fields(cls)}


# --------------------------------------------------------------------------- encode refusals


@pytest.mark.parametrize(
    "thing",
    [ModelReply(call_id=None, content="x"), _outcome(), {"run_id": "r1"}, "intent", None],
    ids=["model-reply", "action-outcome", "dict", "str", "none"],
)
def test_encode_refuses_unknown_types_with_a_type_error_naming_them(thing: object) -> None:
    with pytest.raises(TypeError, match=type(thing).__qualname__):
        encode(thing)  # type: ignore[arg-type]


def test_encode_does_not_type_check_and_decode_then_fails() -> None:
    bad = _forced(
        Intent,
        run_id="r1",
        kind=IntentKind.ACTION,
        call_index="zero",
        result_id="a0",
        replay_policy=ReplayPolicy.NEVER,
        idempotency_key=None,
    )
    payload = encode(bad)  # type: ignore[arg-type]
    assert payload["call_index"] == "zero"
    with pytest.raises(DecodeError, match=r"^Intent\.call_index: expected int, got str$"):
        decode_intent(payload)


def test_encode_passes_wrongly_typed_enums_and_nested_values_through() -> None:
    bad = _forced(
        StepCompleted, run_id="r1", result_id=None, action_outcome=None, step="not a step"
    )
    payload = encode(bad)  # type: ignore[arg-type]
    assert payload["step"] == "not a step"
    with pytest.raises(DecodeError, match=r"StepCompleted\.step: expected a mapping"):
        decode_step_completed(payload)
    bad_intent = _forced(
        Intent,
        run_id="r1",
        kind="model_call",
        call_index=0,
        result_id="m0",
        replay_policy=None,
        idempotency_key=None,
    )
    payload = encode(bad_intent)  # type: ignore[arg-type]
    assert payload["kind"] == "model_call"
    with pytest.raises(DecodeError, match=r"Intent\.replay_policy: expected one of"):
        decode_intent(payload)


# --------------------------------------------------------------------------- decode errors


def _intent_payload(**changes: object) -> dict[str, object]:
    payload = encode(_intent())
    payload.update(changes)
    return payload


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"call_index": "0"}, "Intent.call_index: expected int, got str"),
        ({"call_index": True}, "Intent.call_index: expected int, got bool"),
        ({"call_index": 1.0}, "Intent.call_index: expected int, got float"),
        ({"run_id": 5}, "Intent.run_id: expected str, got int"),
        ({"result_id": None}, "Intent.result_id: expected str, got None"),
        ({"kind": "tool"}, "Intent.kind: expected one of 'model_call', 'action', got 'tool'"),
        ({"kind": 1}, "Intent.kind: expected one of 'model_call', 'action', got int"),
        (
            {"replay_policy": "SAFE"},
            "Intent.replay_policy: expected one of 'safe', 'idempotent', 'never'",
        ),
    ],
)
def test_wrong_field_types_name_record_field_and_expectation(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_intent(_intent_payload(**changes))
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("name", ["run_id", "kind", "call_index", "result_id", "replay_policy"])
def test_a_missing_field_is_named(name: str) -> None:
    payload = _intent_payload()
    del payload[name]
    with pytest.raises(DecodeError, match=rf"^Intent\.{name}: expected .* field is missing"):
        decode_intent(payload)


def test_fields_with_dataclass_defaults_are_still_required_in_this_version() -> None:
    payload = encode(_result())
    del payload["event_delivery_failures"]
    with pytest.raises(DecodeError, match=r"RunResult\.event_delivery_failures: .*missing"):
        decode_run_result(payload)


def test_nested_errors_carry_the_full_path() -> None:
    payload = encode(RunFinished(run_id="r1", result=_result()))
    result = payload["result"]
    assert isinstance(result, dict)
    result["steps"][1]["parse_ok"] = "yes"
    with pytest.raises(
        DecodeError, match=r"^RunFinished\.result\.steps\[1\]\.parse_ok: expected bool, got str$"
    ):
        decode_run_finished(payload)

    step_payload = encode(
        StepCompleted(run_id="r1", result_id=None, action_outcome=None, step=_step())
    )
    step_payload["step"]["action_status"] = "done"  # type: ignore[index]
    with pytest.raises(DecodeError) as caught:
        decode_step_completed(step_payload)
    assert str(caught.value) == (
        "StepCompleted.step.action_status: expected one of 'executed', 'not_executed', "
        "'env_error' or None, got 'done'"
    )

    reply_payload = encode(
        ModelCallResult(
            run_id="r1", result_id="m0", reply=ModelReply(call_id=None, content="x"), failure=None
        )
    )
    reply_payload["reply"]["content"] = None  # type: ignore[index]
    with pytest.raises(DecodeError, match=r"^ModelCallResult\.reply\.content: expected str"):
        decode_model_call_result(reply_payload)


def test_steps_must_be_a_list() -> None:
    payload = encode(_result())
    payload["steps"] = {"0": {}}
    with pytest.raises(DecodeError, match=r"^RunResult\.steps: expected a list"):
        decode_run_result(payload)


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ({"k": 1}, r"RunStarted\.parameter_snapshot\['k'\]: expected str, got int"),
        ({1: "v"}, r"RunStarted\.parameter_snapshot: expected str keys, got key 1"),
        (["k", "v"], r"RunStarted\.parameter_snapshot: expected a mapping of str to str"),
    ],
)
def test_snapshots_must_map_str_to_str(snapshot: object, message: str) -> None:
    payload = encode(RunStarted(run_id="r1", parameter_snapshot={}))
    payload["parameter_snapshot"] = snapshot
    with pytest.raises(DecodeError, match=message):
        decode_run_started(payload)


@pytest.mark.parametrize(
    ("decoder", "payload", "message"),
    [
        (
            decode_step_completed,
            encode(StepCompleted(run_id="r1", result_id=None, action_outcome=None, step=_step()))
            | {"result_id": "a0"},
            r"^StepCompleted: StepCompleted\.result_id must be None if and only if",
        ),
        (decode_intent, _intent_payload(run_id=""), r"^Intent: Intent\.run_id must be a non-empty"),
        (
            decode_intent,
            _intent_payload(call_index=-1),
            r"^Intent: Intent\.call_index must be >= 0",
        ),
        (
            decode_model_call_result,
            encode(ModelCallResult(run_id="r1", result_id="m0", reply=None, failure="boom"))
            | {"failure": None},
            r"^ModelCallResult: ModelCallResult needs exactly one of reply",
        ),
        (
            decode_run_finished,
            encode(RunFinished(run_id="r1", result=_result())) | {"run_id": "r2"},
            r"^RunFinished: RunFinished\.run_id 'r2' differs from result\.run_id 'r1'",
        ),
    ],
    ids=["step-ids-disagree", "empty-run-id", "negative-index", "neither-reply-nor-failure", "ids"],
)
def test_dataclass_validation_failures_become_decode_errors(
    decoder: Callable[[Mapping[str, object]], object], payload: dict[str, object], message: str
) -> None:
    with pytest.raises(DecodeError, match=message) as caught:
        decoder(payload)
    assert isinstance(caught.value.__cause__, TypeError | ValueError)


@pytest.mark.parametrize("payload", [["run_id"], "text", None, 3])
def test_a_payload_that_is_not_a_mapping_is_a_decode_error(payload: object) -> None:
    with pytest.raises(DecodeError, match=r"^Intent: expected a mapping"):
        decode_intent(payload)  # type: ignore[arg-type]


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)


# --------------------------------------------------------------------------- schema version


@pytest.mark.parametrize(
    "record", [_intent(), _result(), _step()], ids=["intent", "result", "step"]
)
def test_a_missing_schema_version_is_refused(record: object) -> None:
    payload = encode(record)  # type: ignore[arg-type]
    del payload["schema_version"]
    with pytest.raises(DecodeError, match=r"\.schema_version: expected a version string"):
        DECODERS[type(record)](payload)


@pytest.mark.parametrize("version", ["1", "1.0.0", "v1.0", "one.zero", "1.", " 1.0", "", "1.x"])
def test_an_unparseable_schema_version_is_refused(version: str) -> None:
    with pytest.raises(DecodeError, match=r"^Intent\.schema_version: expected '<major>\.<minor>'"):
        decode_intent(_intent_payload(schema_version=version))


@pytest.mark.parametrize("version", [1.0, 1, None])
def test_a_schema_version_that_is_not_a_string_is_refused(version: object) -> None:
    with pytest.raises(DecodeError, match=r"^Intent\.schema_version: expected str"):
        decode_intent(_intent_payload(schema_version=version))


@pytest.mark.parametrize("version", ["2.0", "0.9", "10.0"])
def test_a_different_major_version_is_refused(version: str) -> None:
    with pytest.raises(DecodeError, match=r"^Intent\.schema_version: the payload has major"):
        decode_intent(_intent_payload(schema_version=version))


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.37"])
def test_any_minor_of_the_known_major_is_accepted(version: str) -> None:
    assert decode_intent(_intent_payload(schema_version=version)) == _intent()


def test_unknown_extra_fields_are_ignored_so_newer_minor_writers_stay_readable() -> None:
    payload = _intent_payload(schema_version="1.4", priority="high", record="intent")
    assert decode_intent(payload) == _intent()
    nested = encode(
        StepCompleted(run_id="r1", result_id="a0", action_outcome=_outcome(), step=_step())
    )
    nested["step"]["added_later"] = [1, 2]  # type: ignore[index]
    nested["action_outcome"]["exit_code"] = 3  # type: ignore[index]
    assert decode_step_completed(nested).step == _step()


def test_nested_payloads_may_omit_the_version_but_a_present_one_is_checked() -> None:
    payload = encode(RunFinished(run_id="r1", result=_result()))
    result = payload["result"]
    assert isinstance(result, dict)
    assert "schema_version" not in result
    assert decode_run_finished(payload).result == _result()
    result["schema_version"] = "3.0"
    with pytest.raises(DecodeError, match=r"^RunFinished\.result\.schema_version: the payload"):
        decode_run_finished(payload)


def test_top_level_decoders_require_the_version_even_for_a_nested_payload() -> None:
    """decode_run_result and decode_step_record read standalone payloads; a payload cut out of
    a RunFinished lacks the version and is refused rather than guessed."""
    payload = encode(RunFinished(run_id="r1", result=_result()))
    with pytest.raises(DecodeError, match=r"^RunResult\.schema_version: expected a version"):
        decode_run_result(payload["result"])  # type: ignore[arg-type]
    versioned = dict(payload["result"]) | {"schema_version": SCHEMA_VERSION}  # type: ignore[call-overload]
    assert decode_run_result(versioned) == _result()


# --------------------------------------------------------------------------- schema 1.7 (issue 21)


def _settlement(**changes: object) -> Settlement:
    fields: dict[str, object] = {
        "run_id": "r1",
        "result_id": "a3",
        "verdict": SettlementVerdict.EXECUTED,
        "source": SettlementSource.PERSON,
        "by": "ops@example.com",
        "at": "2026-01-01T00:00:00Z",
        "observation": "transfer 17 went through",
        "note": "checked in the bank's console",
    }
    fields.update(changes)
    return Settlement(**fields)  # type: ignore[arg-type]


def test_the_schema_is_1_9() -> None:
    assert SCHEMA_VERSION == "1.9"


def test_a_settlement_by_the_executor_round_trips() -> None:
    """Schema 1.9 (design 0227): the run's own ``unknown`` verdict on an action in doubt."""
    settlement = _settlement(
        verdict=SettlementVerdict.UNKNOWN,
        source=SettlementSource.EXECUTOR,
        by="pay",
        observation=None,
        note="ToolOutcomeUnknown: the connection dropped after the request was sent",
    )
    payload = encode(settlement)
    assert payload["source"] == "executor"
    assert decode_settlement(payload) == settlement


def test_a_settlement_is_written_with_every_field_and_its_enums_as_values() -> None:
    payload = encode(_settlement())
    assert payload == {
        "schema_version": SCHEMA_VERSION,
        "run_id": "r1",
        "result_id": "a3",
        "verdict": "executed",
        "source": "person",
        "by": "ops@example.com",
        "at": "2026-01-01T00:00:00Z",
        "observation": "transfer 17 went through",
        "note": "checked in the bank's console",
        "digest": None,
    }
    assert _round_trip(_settlement()) == _settlement()


def test_the_new_fields_of_1_7_are_written_and_read_back() -> None:
    intent = _intent(kind=IntentKind.ACTION, result_id="a0", idempotency_key="polyloop:r:r1:a0")
    assert encode(intent)["idempotency_key"] == "polyloop:r:r1:a0"
    assert _round_trip(intent) == intent
    outcome = _outcome(settled_by="person:ops@example.com")
    completed = StepCompleted(run_id="r1", result_id="a0", action_outcome=outcome, step=_step())
    assert encode(completed)["action_outcome"]["settled_by"] == "person:ops@example.com"  # type: ignore[index]
    assert _round_trip(completed) == completed
    idempotent = _intent(replay_policy=ReplayPolicy.IDEMPOTENT)
    assert encode(idempotent)["replay_policy"] == "idempotent"


def test_an_older_intent_and_outcome_decode_with_none_for_the_fields_of_1_7() -> None:
    payload = _intent_payload(schema_version="1.6")
    del payload["idempotency_key"]
    decoded = decode_intent(payload)
    assert decoded.idempotency_key is None
    assert decoded == _intent()
    completed = encode(
        StepCompleted(run_id="r1", result_id="a0", action_outcome=_outcome(), step=_step())
    )
    completed["schema_version"] = "1.0"
    del completed["action_outcome"]["settled_by"]  # type: ignore[attr-defined]
    outcome = decode_step_completed(completed).action_outcome
    assert outcome is not None
    assert outcome.settled_by is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"idempotency_key": 7}, r"^Intent\.idempotency_key: expected str or None, got int$"),
        ({"idempotency_key": "has space"}, r"^Intent: Intent\.idempotency_key must be 1-255"),
        ({"idempotency_key": ""}, r"^Intent: Intent\.idempotency_key must be 1-255"),
    ],
)
def test_a_malformed_idempotency_key_is_a_decode_error(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_intent(_intent_payload(**changes))


@pytest.mark.parametrize(
    "name", ["run_id", "result_id", "verdict", "source", "by", "at", "observation", "note"]
)
def test_every_field_of_a_settlement_is_required(name: str) -> None:
    """A record kind added in 1.7: no older writer wrote one, so nothing has a default."""
    payload = encode(_settlement())
    del payload[name]
    with pytest.raises(DecodeError, match=rf"^Settlement\.{name}: expected .* field is missing"):
        decode_settlement(payload)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"verdict": "done"}, r"^Settlement\.verdict: expected one of 'executed', 'not_exec"),
        ({"source": "robot"}, r"^Settlement\.source: expected one of 'reconciler', 'person'"),
        ({"observation": 3}, r"^Settlement\.observation: expected str or None, got int"),
        ({"by": ""}, r"^Settlement: .*by"),
        ({"verdict": "not_executed"}, r"^Settlement: .*observation must be None"),
        ({"verdict": "unknown", "observation": None}, r"^Settlement: .*unknown"),
        ({"digest": 7}, r"^Settlement\.digest: expected str or None, got int"),
        ({"digest": "sha256:ab"}, r"^Settlement: .*digest .* set exactly for approved and rej"),
        ({"verdict": "approved", "observation": None}, r"^Settlement: .*digest .* set exactly"),
        ({"source": "expiry"}, r"^Settlement: .*an expiry only rejects, with the reason 'expired'"),
    ],
)
def test_a_bad_settlement_is_a_decode_error_naming_the_field(
    changes: dict[str, object], message: str
) -> None:
    payload = encode(_settlement()) | changes
    with pytest.raises(DecodeError, match=message):
        decode_settlement(payload)


# ---------------------------------------------------------------------- approvals (design 0210)


def _request(**changes: object) -> ApprovalRequest:
    fields: dict[str, object] = {
        "run_id": "r1",
        "result_id": "a2",
        "step_idx": 2,
        "tool": "refund",
        "tool_call_id": "call-7",
        "arguments": '{"amount":250,"order":"o-17"}',
        "digest": "sha256:" + "ab" * 32,
        "requested_at": "2026-01-01T00:00:00.000+00:00",
        "expires_at": "2026-01-02T00:00:00.000+00:00",
    }
    fields.update(changes)
    return ApprovalRequest(**fields)  # type: ignore[arg-type]


def _decision(**changes: object) -> Settlement:
    fields: dict[str, object] = {
        "verdict": SettlementVerdict.APPROVED,
        "observation": None,
        "note": "",
        "digest": _request().digest,
        "result_id": "a2",
    }
    fields.update(changes)
    return _settlement(**fields)


def test_an_approval_request_is_written_with_every_field() -> None:
    assert encode(_request()) == {
        "schema_version": SCHEMA_VERSION,
        "run_id": "r1",
        "result_id": "a2",
        "step_idx": 2,
        "tool": "refund",
        "tool_call_id": "call-7",
        "arguments": '{"amount":250,"order":"o-17"}',
        "digest": "sha256:" + "ab" * 32,
        "requested_at": "2026-01-01T00:00:00.000+00:00",
        "expires_at": "2026-01-02T00:00:00.000+00:00",
    }
    for request in (_request(), _request(tool_call_id=None, expires_at=None)):
        assert _round_trip(request) == request


@pytest.mark.parametrize(
    "name",
    [
        "run_id",
        "result_id",
        "step_idx",
        "tool",
        "tool_call_id",
        "arguments",
        "digest",
        "requested_at",
        "expires_at",
    ],
)
def test_every_field_of_an_approval_request_is_required(name: str) -> None:
    """A record kind no older writer wrote, so nothing has a default (not even the nulls)."""
    payload = encode(_request())
    del payload[name]
    with pytest.raises(DecodeError, match=rf"^ApprovalRequest\.{name}: expected .* missing"):
        decode_approval_request(payload)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"step_idx": -1}, r"^ApprovalRequest: .*step_idx"),
        ({"step_idx": True}, r"^ApprovalRequest\.step_idx: expected int, got bool"),
        ({"tool": ""}, r"^ApprovalRequest: .*tool"),
        ({"digest": ""}, r"^ApprovalRequest: .*digest"),
        ({"tool_call_id": 3}, r"^ApprovalRequest\.tool_call_id: expected str or None, got int"),
        ({"arguments": None}, r"^ApprovalRequest\.arguments: expected str, got None"),
    ],
)
def test_a_bad_approval_request_is_a_decode_error_naming_the_field(
    changes: dict[str, object], message: str
) -> None:
    payload = encode(_request()) | changes
    with pytest.raises(DecodeError, match=message):
        decode_approval_request(payload)


@pytest.mark.parametrize(
    "decision",
    [
        _decision(),
        _decision(verdict=SettlementVerdict.REJECTED, note="not this amount"),
        _decision(
            verdict=SettlementVerdict.REJECTED,
            source=SettlementSource.EXPIRY,
            by="polyloop",
            note="expired",
        ),
    ],
    ids=["approved", "rejected", "expired"],
)
def test_a_decision_is_a_settlement_with_its_verdict_source_and_digest(
    decision: Settlement,
) -> None:
    payload = encode(decision)
    assert (payload["verdict"], payload["source"], payload["digest"]) == (
        decision.verdict.value,
        decision.source.value,
        _request().digest,
    )
    assert payload["observation"] is None
    assert _round_trip(decision) == decision


def test_a_settlement_written_before_the_digest_decodes_with_none() -> None:
    """``digest`` came after the settlement record (design 0210): a settlement line without it
    reads as the verdict on an execution in doubt; a decision without it binds to nothing and
    is refused."""
    payload = encode(_settlement())
    del payload["digest"]
    assert decode_settlement(payload) == _settlement()
    decision = encode(_decision())
    del decision["digest"]
    with pytest.raises(DecodeError, match=r"^Settlement: .*digest .* set exactly for approved"):
        decode_settlement(decision)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"source": SettlementSource.RECONCILER}, r"a person approves or rejects a call"),
        ({"digest": ""}, r"Settlement\.digest must be a non-empty"),
        ({"verdict": SettlementVerdict.REJECTED}, r"note must give the reason of a rejection"),
        (
            {
                "verdict": SettlementVerdict.REJECTED,
                "source": SettlementSource.EXPIRY,
                "note": "late",
            },
            r"an expiry only rejects, with the reason 'expired'",
        ),
    ],
)
def test_a_decision_of_the_wrong_shape_is_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _decision(**changes)


# --------------------------------------------------------------------------- 1.9: tree links


def test_the_tree_links_round_trip_and_are_written_only_when_set() -> None:
    """Schema 1.9 (design 0245): ``RunStarted.parent`` and ``StepRecord.child`` come back as
    written; a record without them has no such key, so its payload is what 1.8 wrote."""
    from polyloop.types import ChildRun, ParentLink

    link = ParentLink(run_id="r", step_idx=2, idempotency_key="polyloop:r:r:a2", depth=1)
    started = RunStarted(run_id="r.a2", parameter_snapshot={"k": "v"}, parent=link)
    assert decode_run_started(encode(started)) == started
    assert encode(started)["parent"] == {
        "run_id": "r",
        "step_idx": 2,
        "idempotency_key": "polyloop:r:r:a2",
        "depth": 1,
        "max_depth": None,
    }
    child = ChildRun(run_id="r.a2", stop_reason=StopReason.STEP_BUDGET, steps=3, tokens=45)
    step = _step(child=child)
    assert decode_step_record(encode(step)) == step
    assert "cost" not in encode(step)["child"]  # type: ignore[operator]
    priced = _step(child=dataclasses.replace(child, cost=decimal.Decimal("0.045")))
    assert encode(priced)["child"]["cost"] == "0.045"  # type: ignore[index]
    assert decode_step_record(encode(priced)) == priced
    assert "parent" not in encode(dataclasses.replace(started, parent=None))
    assert "child" not in encode(_step())


def test_a_bad_tree_link_is_a_decode_error_naming_the_field() -> None:
    from polyloop.errors import DecodeError

    payload = encode(RunStarted(run_id="r", parameter_snapshot={}))
    payload["parent"] = {"run_id": "p", "step_idx": 0, "idempotency_key": "k", "depth": 0}
    with pytest.raises(DecodeError, match=r"RunStarted\.parent"):
        decode_run_started(payload)
    step = encode(_step())
    step["child"] = {"run_id": "c", "stop_reason": "done", "steps": 1, "tokens": 1}
    with pytest.raises(DecodeError, match=r"child\.stop_reason"):
        decode_step_record(step)
