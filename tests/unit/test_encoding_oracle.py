"""The stored bytes of every record are exactly what they were before the third pass of design
0214 (the encoder's payloads built in one dict each, the C JSON encoder made once).

The oracle is ``_frozen_encoding``: a verbatim copy of the encoding path at 62dc0c0. Every test
here encodes the same record both ways and requires the same bytes, or, when the old path
raised, an exception of the same type from the new one. The records cover every record class
and every optional field, resume marks, native tool calls and usage present or absent, text with
lone and paired surrogates, non-ASCII and control characters, records forced to hold wrongly
typed values (``object.__setattr__``: encode never judges), values JSON cannot hold (NaN, a set,
a cycle, nesting deeper than the recursion limit), and every line of the committed fixture logs
decoded and encoded again.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import enum
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyloop import serialization
from polyloop.session import run
from polyloop.stores import JsonlRunStore
from polyloop.stores._records import StepLines, decode_lines, encode_line
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    Context,
    ForkOrigin,
    Intent,
    IntentKind,
    Message,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import _frozen_encoding as frozen  # noqa: E402
from tools.bench._common import Workload  # noqa: E402

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOG_CLASSES = tuple(frozen.TAGS)

# --------------------------------------------------------------------------- strategies

_SPECIAL = [
    "\ud800",
    "\udfff",
    "\ud83d\ude00",  # a pair: stored as the high's escape and the low's 3 bytes
    "\ude00\ud83d",  # the other order: two escapes
    "\ud83d\ud83d\ude00",
    "caf\u00e9",
    "\u4e2d\u6587",
    "\U0001f600",
    "\u2028\x85",
    '"',
    "\\",
    "\x00",
    "\x1f",
    "\n\t",
    '"step": {',
    '"steps": []',
    ', "checksum": "',
]
_text = st.lists(
    st.sampled_from(_SPECIAL) | st.text(st.characters(exclude_categories=()), max_size=4),
    max_size=4,
).map("".join)
_id = _text.filter(bool) | st.text(min_size=1, max_size=6)
_count = st.integers(min_value=0, max_value=2**64)
_maybe_count = st.none() | _count
_calls = st.lists(
    st.builds(NativeToolCall, id=_id, name=_id, arguments=_text),
    max_size=2,
    unique_by=lambda c: c.id,
).map(tuple)
_usage = st.none() | st.builds(
    Usage, prompt_tokens=_count, completion_tokens=_count, cached_tokens=_maybe_count
)
_marks = st.none() | st.builds(ResumeMark, at=_id, plan=_id, step_idx=_count, epoch=_maybe_count)


@st.composite
def _steps(draw: st.DrawFn) -> StepRecord:
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
        usage=draw(_usage),
        model_ms=draw(_maybe_count),
        action_ms=draw(_maybe_count),
        tool_calls=draw(_calls),
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
_replies = st.builds(
    ModelReply,
    call_id=st.none() | _id,
    content=_text,
    thinking=_text,
    usage=_usage,
    tool_calls=_calls,
    finish_reason=st.none() | _id,
)


@st.composite
def _model_call_results(draw: st.DrawFn) -> ModelCallResult:
    failed = draw(st.booleans())
    return ModelCallResult(
        run_id=draw(_id),
        result_id=draw(_id),
        reply=None if failed else draw(_replies),
        failure=draw(_id) if failed else None,
        duration_ms=draw(_maybe_count),
        context_length_exceeded=failed and draw(st.booleans()),
        resumed=draw(_marks),
    )


@st.composite
def _step_completeds(draw: st.DrawFn) -> StepCompleted:
    outcome = draw(st.none() | _outcomes)
    return StepCompleted(
        run_id=draw(_id),
        result_id=None if outcome is None else draw(_id),
        action_outcome=outcome,
        step=draw(_steps()),
        resumed=draw(_marks),
    )


@st.composite
def _run_results(draw: st.DrawFn) -> RunResult:
    reason = draw(st.sampled_from(StopReason))
    return RunResult(
        run_id=draw(_id),
        stop_reason=reason,
        final_answer=draw(_id) if reason is StopReason.FINAL_ANSWER else draw(st.none() | _text),
        steps=tuple(draw(st.lists(_steps(), max_size=3))),
        event_delivery_failures=draw(_count),
        unknown_outcome=draw(st.none() | _id),
    )


@st.composite
def _run_finisheds(draw: st.DrawFn) -> RunFinished:
    result = draw(_run_results())
    return RunFinished(run_id=result.run_id, result=result, resumed=draw(_marks))


@st.composite
def _messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(Role))
    return Message(
        role=role,
        content=tuple(draw(st.lists(st.builds(TextBlock, text=_text), max_size=2))),
        tool_calls=draw(_calls) if role is Role.ASSISTANT else (),
        tool_call_id=draw(_id) if role is Role.TOOL else None,
    )


_contexts = st.none() | st.builds(
    Context,
    run_level=st.lists(_messages(), max_size=2).map(tuple),
    goal_level=st.lists(_messages(), max_size=2).map(tuple),
)
_run_starteds = st.builds(
    RunStarted,
    run_id=_id,
    parameter_snapshot=st.dictionaries(_text, _text, max_size=3).map(MappingProxyType),
    continues=st.none() | _id,
    context=_contexts,
)
_intents = st.builds(
    Intent,
    run_id=_id,
    kind=st.sampled_from(IntentKind),
    call_index=_count,
    result_id=_id,
    replay_policy=st.sampled_from(ReplayPolicy),
    idempotency_key=st.none() | st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True),
    resumed=_marks,
)
_approval_requests = st.builds(
    ApprovalRequest,
    run_id=_id,
    result_id=_id,
    step_idx=_count,
    tool=_id,
    tool_call_id=st.none() | _id,
    arguments=_text,
    digest=st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True),
    requested_at=_id,
    expires_at=st.none() | _id,
    resumed=_marks,
)


@st.composite
def _settlements(draw: st.DrawFn) -> Settlement:
    """A verdict on an execution in doubt, or a person's decision on an approval."""
    verdict = draw(st.sampled_from(SettlementVerdict))
    decision = verdict in (SettlementVerdict.APPROVED, SettlementVerdict.REJECTED)
    return Settlement(
        run_id=draw(_id),
        result_id=draw(_id),
        verdict=verdict,
        source=SettlementSource.RECONCILER
        if verdict is SettlementVerdict.UNKNOWN
        else SettlementSource.PERSON,
        by=draw(_id),
        at=draw(_id),
        observation=draw(_text) if verdict is SettlementVerdict.EXECUTED else None,
        note=draw(_id),
        digest=draw(_id) if decision else None,
    )


_log_records = st.one_of(
    _run_starteds,
    _intents,
    _model_call_results(),
    _step_completeds(),
    _run_finisheds(),
    _settlements(),
    _approval_requests,
)


class _Other(enum.Enum):
    MEMBER = "model_call"


class _Int(int):
    pass


class _Str(str):
    __slots__ = ()


_REPLY = ModelReply(call_id=None, content="x")
_STEP = StepRecord(
    step_idx=0,
    raw_output="",
    content_chars=0,
    thinking_chars=0,
    action=None,
    parse_ok=True,
    parse_error=None,
    observation="",
    observation_is_synthetic=False,
    observation_truncated_chars=0,
    prompt_chars=0,
    call_id=None,
    step_wall_ms=0,
    action_status=None,
)
_JUNK_ATOMS = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    math.nan,
    math.inf,
    "",
    "\ud800",
    _Str("s"),
    _Int(3),
    IntentKind.ACTION,
    ReplayPolicy.NEVER,
    ActionStatus.EXECUTED,
    StopReason.STEP_BUDGET,
    _Other.MEMBER,
    (),
    [],
    {},
    {"k": "v"},
    ("a", 1),
    [1, "b"],
    {1, 2},
    object(),
    b"bytes",
    NativeToolCall(id="c", name="n", arguments="{}"),
    (NativeToolCall(id="c", name="n", arguments="{}"), "not a call"),
    [NativeToolCall(id="c", name="n", arguments="{}")],
    Usage(prompt_tokens=1, completion_tokens=2),
    _REPLY,
    _STEP,
    [_STEP, "x"],
    ActionOutcome(
        status=ActionStatus.EXECUTED,
        observation="o",
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    ),
    ResumeMark(at="a", plan="p", step_idx=0),
    {"at": "a"},
    MappingProxyType({"k": "v"}),
]
_junk = st.sampled_from(_JUNK_ATOMS)


_NEWER_THAN_THE_ORACLE = frozenset(
    {
        (RunStarted, "fork"),
        (RunStarted, "parent"),
        (StepRecord, "child"),
        (RunResult, "stop_detail"),
    }
)
"""Fields added after 62dc0c0 (schema 1.9: a fork's origin, design 0239; a child run's parent,
a step's child and a result's stop detail, design 0245): the oracle cannot know them; a record
without them must still encode as it did (every other test here);
``test_a_fork_origin_is_written_only_on_a_fork`` and ``test_serialization.py``'s tree-link
tests say what they add."""


def _field_names(record: object) -> list[str]:
    return [
        field.name
        for field in dataclasses.fields(record)  # type: ignore[arg-type]
        if (type(record), field.name) not in _NEWER_THAN_THE_ORACLE
    ]


@st.composite
def _forced(draw: st.DrawFn, base: st.SearchStrategy[object] = _log_records) -> object:
    """A valid record with one or two fields, possibly nested, forced to a wrong value."""
    record = draw(base)
    for _ in range(draw(st.integers(min_value=1, max_value=2))):
        target = record
        nested = [
            getattr(record, name)
            for name in _field_names(record)
            if dataclasses.is_dataclass(getattr(record, name))
        ]
        if nested and draw(st.booleans()):
            target = copy.copy(draw(st.sampled_from(nested)))
            for name in _field_names(record):
                if type(getattr(record, name)) is type(target):
                    object.__setattr__(record, name, target)
        name = draw(st.sampled_from(_field_names(target)))
        object.__setattr__(target, name, draw(_junk))
    return record


def _outcome_of(encoder: Callable[[], bytes]) -> tuple[str, object]:
    try:
        return "bytes", encoder()
    except Exception as exc:  # the exception's type is what is compared
        return "raises", type(exc)


def _assert_same_line(record: object) -> None:
    old = _outcome_of(lambda: frozen.encode_line(record))
    new = _outcome_of(lambda: encode_line(record, type(record), "w"))  # type: ignore[arg-type]
    assert new == old, record


def _assert_same_payload(record: object) -> None:
    old = _outcome_of(lambda: frozen.encode(record))  # type: ignore[arg-type,return-value]
    new = _outcome_of(lambda: serialization.encode(record))  # type: ignore[arg-type,return-value]
    assert new == old
    if new[0] == "bytes":
        assert list(new[1].items()) == list(old[1].items())  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the comparisons

_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_log_records)
def test_every_log_record_is_stored_as_the_same_bytes(record: object) -> None:
    _assert_same_line(record)


@_SETTINGS
@given(st.one_of(_log_records, _run_results(), _steps()))
def test_encode_returns_the_same_payload_in_the_same_key_order(record: object) -> None:
    _assert_same_payload(record)


@_SETTINGS
@given(_forced())
def test_a_record_forced_to_wrong_types_encodes_or_fails_as_before(record: object) -> None:
    _assert_same_line(record)
    _assert_same_payload(record)


@pytest.mark.parametrize("cls", LOG_CLASSES)
def test_a_record_built_around_its_init_encodes_or_fails_as_before(cls: type) -> None:
    """Slots never set: ``resumed`` and ``context`` read as ``None``, any other is an
    ``AttributeError`` both ways."""
    bare = object.__new__(cls)
    _assert_same_line(bare)
    for name in ("resumed", "context"):
        if name in _field_names(bare):
            full = object.__new__(cls)
            for other in _field_names(bare):
                if other != name:
                    object.__setattr__(full, other, "v")
            _assert_same_line(full)
            _assert_same_payload(full)


@pytest.mark.parametrize("value", [math.nan, -math.inf, {1, 2}, object()])
def test_values_json_cannot_hold_raise_the_same_exception(value: object) -> None:
    record = Intent(
        run_id="r",
        kind=IntentKind.ACTION,
        call_index=0,
        result_id="a0",
        replay_policy=ReplayPolicy.SAFE,
    )
    object.__setattr__(record, "idempotency_key", value)
    with pytest.raises(ValueError if isinstance(value, float) else TypeError):
        encode_line(record, Intent, "w")
    _assert_same_line(record)


def test_a_cycle_is_a_value_error_and_deep_nesting_a_recursion_error_as_before() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    deep: list[object] = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    for value, expected in (
        (cycle, ValueError),
        ({"a": {"b": cycle}}, ValueError),
        (deep, RecursionError),
    ):
        record = RunStarted(run_id="r", parameter_snapshot={})
        object.__setattr__(record, "continues", value)
        with pytest.raises(expected) as raised:
            encode_line(record, RunStarted, "w")
        assert raised.value.__context__ is None, "the first attempt's RecursionError leaked"
        _assert_same_line(record)
    # The failure left nothing behind: the same objects encode once the cycle is gone.
    cycle.clear()
    object.__setattr__(record, "continues", {"a": {"b": cycle}})
    assert encode_line(record, RunStarted, "w") == frozen.encode_line(record)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_step_completeds(), _forced(_step_completeds())), max_size=4), st.data())
def test_a_run_through_step_lines_is_stored_as_the_same_bytes(
    records: list[object], data: st.DataObject
) -> None:
    """``StepLines`` (every lease writes through it): steps, then a finish holding exactly the
    steps kept, or other ones; each line as the old ``encode_line`` wrote it."""
    lines = StepLines()
    kept = []
    for record in records:
        expected = _outcome_of(lambda r=record: frozen.encode_line(r))  # type: ignore[misc]
        assert _outcome_of(lambda r=record: lines.encode(r, StepCompleted, "w")) == expected
        if expected[0] == "bytes":
            kept.append(record.step)  # type: ignore[attr-defined]
    result = data.draw(_run_results())
    if data.draw(st.booleans()):
        result = dataclasses.replace(result, steps=())
        object.__setattr__(result, "steps", tuple(kept))
    finish = RunFinished(run_id=result.run_id, result=result, resumed=data.draw(_marks))
    old = _outcome_of(lambda: frozen.encode_line(finish))
    assert _outcome_of(lambda: lines.encode(finish, RunFinished, "w")) == old


def _fixture_lines() -> list[tuple[str, bytes]]:
    found = []
    for path in sorted(FIXTURES.glob("logs-*/*.jsonl")):
        for number, line in enumerate(path.read_bytes().split(b"\n")[:-1], start=1):
            found.append((f"{path.parent.name}/{path.name}:{number}", line + b"\n"))
    return found


FIXTURE_LINES = _fixture_lines()


def test_the_fixtures_are_there() -> None:
    assert len(FIXTURE_LINES) > 50


@pytest.mark.parametrize(("where", "line"), FIXTURE_LINES, ids=[w for w, _ in FIXTURE_LINES])
def test_every_fixture_line_encodes_again_as_before(where: str, line: bytes) -> None:
    """Each committed line decoded and encoded again: the old and the new bytes agree, and
    where the old path reproduced the line (a line of this schema's shape), so does the new."""
    (entry,) = decode_lines(line, run_id="fixture")
    old = frozen.encode_line(entry.record)
    assert encode_line(entry.record, type(entry.record), "w") == old, where
    lines = StepLines()
    assert lines.encode(entry.record, type(entry.record), "w") == old, where


def test_a_real_run_stores_what_the_old_encoder_wrote(tmp_path: Path) -> None:
    """End to end: every line a run of the benchmark's workload stores (``JsonlRunStore``,
    through its lease's ``StepLines``) is the old encoding of the record it decodes to. (No
    fixture line comes back byte for byte: each was written by an older schema version.)"""
    workload = Workload.build()
    store = JsonlRunStore(directory=tmp_path)
    asyncio.run(run(workload.definition(store), workload.request("oracle", 7)))
    raw = (tmp_path / "oracle.jsonl").read_bytes()
    stored = raw.split(b"\n")[:-1]
    entries = decode_lines(raw, run_id="oracle")
    assert len(entries) == len(stored) == 2 + 4 * 7
    for entry, line in zip(entries, stored, strict=True):
        assert frozen.encode_line(entry.record) == line + b"\n"


# --------------------------------------------------------------------------- every field, forced

_MARK = ResumeMark(at="2026-12-01T00:00:00Z", plan="replay", step_idx=1, epoch=2)
_CALL = NativeToolCall(id="c1", name="t\u00e9", arguments='{"a": "\ud83d\ude00"}')
_USAGE = Usage(prompt_tokens=3, completion_tokens=4, cached_tokens=1)
_FULL_STEP = dataclasses.replace(
    _STEP,
    action="act",
    action_status=ActionStatus.EXECUTED,
    usage=_USAGE,
    model_ms=1,
    action_ms=2,
    tool_calls=(_CALL,),
)
_OUTCOME = ActionOutcome(
    status=ActionStatus.NOT_EXECUTED,
    observation="o\ud800",
    observation_is_synthetic=True,
    env_reported_completion=False,
    observation_truncated_chars=3,
    settled_by="s",
)
_FULL_RESULT = RunResult(
    run_id="r",
    stop_reason=StopReason.STEP_BUDGET,
    final_answer=None,
    steps=(_FULL_STEP, _STEP),
    unknown_outcome="u",
)
FULL_RECORDS: tuple[object, ...] = (
    RunStarted(
        run_id="r",
        parameter_snapshot=MappingProxyType({"k": "v"}),
        continues="p",
        context=Context(
            run_level=(Message.system("s"),),
            goal_level=(
                Message(role=Role.ASSISTANT, content=(TextBlock(text="a"),), tool_calls=(_CALL,)),
                Message(role=Role.TOOL, content=(TextBlock(text="t"),), tool_call_id="c1"),
            ),
        ),
    ),
    Intent(
        run_id="r",
        kind=IntentKind.MODEL_CALL,
        call_index=1,
        result_id="m1",
        replay_policy=ReplayPolicy.IDEMPOTENT,
        idempotency_key="k",
        resumed=_MARK,
    ),
    ModelCallResult(
        run_id="r",
        result_id="m1",
        reply=ModelReply(
            call_id="c",
            content="x",
            thinking="y",
            usage=_USAGE,
            tool_calls=(_CALL,),
            finish_reason="stop",
        ),
        failure=None,
        duration_ms=5,
        resumed=_MARK,
    ),
    StepCompleted(run_id="r", result_id="a1", action_outcome=_OUTCOME, step=_FULL_STEP),
    StepCompleted(run_id="r", result_id=None, action_outcome=None, step=_STEP, resumed=_MARK),
    RunFinished(run_id="r", result=_FULL_RESULT, resumed=_MARK),
    Settlement(
        run_id="r",
        result_id="a1",
        verdict=SettlementVerdict.EXECUTED,
        source=SettlementSource.PERSON,
        by="b",
        at="t",
        observation="o",
        note="n",
    ),
    ApprovalRequest(
        run_id="r",
        result_id="a1",
        step_idx=0,
        tool="t",
        tool_call_id="c1",
        arguments="{}",
        digest="d",
        requested_at="t",
        expires_at=None,
        resumed=_MARK,
    ),
    _FULL_RESULT,
    _FULL_STEP,
)


def _paths(record: object, depth: int = 0) -> list[tuple[object, ...]]:
    """Every ``(attribute or index, ...)`` path to a dataclass field, nested ones included."""
    found: list[tuple[object, ...]] = []
    for name in _field_names(record):
        found.append((name,))
        value = getattr(record, name)
        if depth < 3 and dataclasses.is_dataclass(value):
            found += [(name, *rest) for rest in _paths(value, depth + 1)]
        if depth < 3 and isinstance(value, tuple):
            for index, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    found += [(name, index, *rest) for rest in _paths(item, depth + 1)]
    return found


def _forced_at(record: object, path: tuple[object, ...], value: object) -> object:
    """A copy of ``record`` with the field at ``path`` set to ``value`` (the original and
    everything off the path are shared, not changed)."""
    head, *rest = path
    if isinstance(head, int):
        items = list(record)  # type: ignore[call-overload]
        items[head] = _forced_at(items[head], tuple(rest), value)
        return tuple(items)
    forced = copy.copy(record)
    inner = _forced_at(getattr(record, str(head)), tuple(rest), value) if rest else value
    object.__setattr__(forced, str(head), inner)
    return forced


@pytest.mark.parametrize("record", FULL_RECORDS, ids=lambda r: type(r).__name__)
def test_every_field_forced_to_every_wrong_value_encodes_or_fails_as_before(
    record: object,
) -> None:
    """Each field at every depth (a reply's usage, a finish's second step's status, a
    context's message's tool call) set to each wrong value in turn."""
    if type(record) in LOG_CLASSES:
        _assert_same_line(record)
    _assert_same_payload(record)
    paths = _paths(record)
    assert len(paths) >= len(_field_names(record))
    for path in paths:
        for value in _JUNK_ATOMS:
            forced = _forced_at(record, path, value)
            if type(forced) in LOG_CLASSES:
                _assert_same_line(forced)
            _assert_same_payload(forced)


def test_a_fork_origin_is_written_only_on_a_fork() -> None:
    """Schema 1.9 (design 0239): a start without ``fork`` is the oracle's bytes; one with it
    has the same payload plus ``fork`` last; a forced value is passed through (encode never
    judges)."""
    plain = RunStarted(run_id="r", parameter_snapshot={"k": "v"})
    origin = ForkOrigin(
        run_id="s",
        step_idx=2,
        records=7,
        digest="sha256:ab",
        chain=(ForkOrigin(run_id="t", step_idx=1, records=3, digest="sha256:cd"),),
    )
    forked = dataclasses.replace(plain, fork=origin)
    assert encode_line(plain, RunStarted, "w") == frozen.encode_line(plain)
    payload = serialization.encode(forked)
    assert list(payload)[:-1] == list(frozen.encode(plain))
    assert payload["fork"] == {
        "run_id": "s",
        "step_idx": 2,
        "records": 7,
        "digest": "sha256:ab",
        "chain": [{"run_id": "t", "step_idx": 1, "records": 3, "digest": "sha256:cd"}],
    }
    odd = copy.copy(plain)
    object.__setattr__(odd, "fork", ["not", "an", "origin"])
    assert serialization.encode(odd)["fork"] == ["not", "an", "origin"]
