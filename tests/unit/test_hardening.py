"""Regression tests for defects 1, 2, 3, 4 and 6 of issue 15 (defect 5: test_log_checks.py).

Each test fails on polyloop 0.1.0 (commit 14eff8d) and passes now:

1. a log line nested ~1,000 levels deep, or holding a 5,000-digit integer, was a
   ``RecursionError``/bare ``ValueError`` instead of a ``DecodeError`` naming run and line;
2. tool arguments nested 1,000+ levels deep crashed validation with ``RecursionError`` after
   the action's intent was durable;
3. an exception whose ``__str__`` raises escaped a tool handler (and a model client);
4. two halves of a surrogate pair stored as separate characters came back as one;
6. a parser raising on a stored reply left the run stuck: every resume raised again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from _session_doubles import (
    ScriptedModel,
    Tally,
    TinyParser,
    definition,
    request,
    tool_request,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop.ports import Action, ParsedReply, ToolCall
from polyloop.serialization import DecodeError
from polyloop.session import resume, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.stores._records import decode_line, encode_line
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import (
    ActionStatus,
    ModelCallResult,
    ModelReply,
    StopReason,
)

pytestmark = pytest.mark.unit

RUN = "run-1"


def deep_list(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels):
        value = [value]
    return value


def _jsonl_with(tmp_path: Path, line: bytes) -> JsonlRunStore:
    """A log whose line 2 is ``line`` after a valid run start."""
    started = (
        b'{"record": "run_started", "schema_version": "1.0", "run_id": "run-1", '
        b'"parameter_snapshot": {}}\n'
    )
    (tmp_path / f"{RUN}.jsonl").write_bytes(started + line + b"\n")
    return JsonlRunStore(directory=tmp_path)


def _intent_line(**overrides: object) -> bytes:
    fields: dict[str, object] = {
        "record": "intent",
        "schema_version": "1.0",
        "run_id": RUN,
        "kind": "model_call",
        "call_index": 0,
        "result_id": "m0",
        "replay_policy": "never",
    }
    fields.update(overrides)
    return json.dumps(fields).encode()


# --------------------------------------------------------------------------- defect 1


@pytest.mark.parametrize("levels", [980, 990, 1_000, 100_000])
async def test_defect_1_deep_nesting_in_a_log_line_is_a_decode_error(
    tmp_path: Path, levels: int
) -> None:
    nested = b"[" * levels + b"]" * levels
    line = _intent_line()[:-1] + b', "extra": ' + nested + b"}"
    store = _jsonl_with(tmp_path, line)
    agent = definition(ScriptedModel([]), store=store)
    with pytest.raises(DecodeError, match=r"log of run 'run-1', line 2"):
        await store.read_log(RUN)
    with pytest.raises(DecodeError, match=r"log of run 'run-1', line 2"):
        await resume(agent, request())


def _spliced(field: bytes, text: bytes) -> bytes:
    """The intent line with ``field``'s value replaced by raw JSON ``text`` (json.dumps refuses
    integers of more than 4,300 digits, so they are spliced in as text)."""
    line = _intent_line(**{field.decode(): "PLACEHOLDER"})
    return line.replace(b'"PLACEHOLDER"', text)


@pytest.mark.parametrize(
    "line",
    [
        _spliced(b"call_index", b"9" * 5_000),
        _spliced(b"extra", b"-" + b"7" * 5_000),
        _spliced(b"schema_version", b'"' + b"5" * 5_000 + b'.0"'),
        _spliced(b"schema_version", b'"' + b"0" * 4_998 + b'1.0"'),
    ],
    ids=["huge-field", "huge-extra", "huge-major", "padded-major"],
)
async def test_defect_1_huge_integers_are_decode_errors(tmp_path: Path, line: bytes) -> None:
    store = _jsonl_with(tmp_path, line)
    agent = definition(ScriptedModel([]), store=store)
    with pytest.raises(DecodeError, match=r"log of run 'run-1', line 2"):
        await store.read_log(RUN)
    with pytest.raises(DecodeError, match=r"log of run 'run-1', line 2"):
        await resume(agent, request())


# --------------------------------------------------------------------------- defect 2


class _Raising(Mapping[str, object]):
    """Arguments whose iteration raises: untrusted parser output at its worst."""

    def __getitem__(self, key: str) -> object:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("cannot iterate")

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize(
    "arguments",
    [
        {"text": deep_list(1_000)},
        {"text": deep_list(50_000)},
        {"text": {"a": deep_list(5_000)}},
        {"text": 10**5_000},
        _Raising(),
    ],
    ids=["1000-deep", "50000-deep", "deep-in-object", "huge-int", "raising-mapping"],
)
async def test_defect_2_arguments_that_cannot_be_described_are_refused_not_raised(
    arguments: Mapping[str, object],
) -> None:
    tally = Tally()
    executor = tool_request(tally).action_executor
    outcome = await executor.execute(
        Action(text="write", tool_call=ToolCall(name="write", arguments=arguments))
    )
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert outcome.observation.startswith("not executed: ")
    assert tally.runs == {}


class _DeepParser(TinyParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        if reply.content == "deep":
            call = ToolCall(name="write", arguments={"text": deep_list(3_000)})
            return ParsedReply(history_text="deep", decision=Action(text="deep", tool_call=call))
        return super().parse(reply)


async def test_defect_2_a_never_tool_with_deep_arguments_is_a_rejected_step() -> None:
    tally = Tally()
    agent = dataclasses.replace(
        definition(ScriptedModel(["deep", "final:ok"])), decision_parser=_DeepParser()
    )
    result = await run(agent, tool_request(tally))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].action_status is ActionStatus.NOT_EXECUTED
    assert tally.runs == {}
    # Nothing is left dangling for resume to misjudge as resume_state_unknown.
    assert await resume(agent, tool_request(tally)) == result


# --------------------------------------------------------------------------- defect 3


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


async def test_defect_3_a_handler_exception_with_a_raising_str_is_an_executed_action() -> None:
    async def handler(arguments: Mapping[str, object]) -> str:
        raise _Unprintable

    spec = ToolSpec(name="odd", description="odd", parameters={}, handler=handler)
    registry = ToolRegistry([spec])
    outcome = await registry.executor().execute(
        Action(text="odd", tool_call=ToolCall(name="odd", arguments={}))
    )
    assert outcome.status is ActionStatus.EXECUTED
    assert outcome.observation.startswith("_Unprintable: ")
    assert "could not be read" in outcome.observation


async def test_defect_3_a_model_exception_with_a_raising_str_is_a_failed_call() -> None:
    agent = definition(ScriptedModel([_Unprintable()]))
    result = await run(agent, request())
    assert result.stop_reason is StopReason.LLM_ERROR
    log = await agent.store.read_log(RUN)
    failure = log.model_results[0].failure
    assert failure is not None
    assert failure.startswith("_Unprintable: ")


# --------------------------------------------------------------------------- defect 4

_TEXT = st.lists(
    st.one_of(
        st.sampled_from(["\ud83d", "\ude00", "\udbff", "\udc00", "a", "\\", '"', "\U0001f600"]),
        st.integers(min_value=0xD800, max_value=0xDFFF).map(chr),
        st.characters(),
    ),
    max_size=24,
).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(content=_TEXT, thinking=_TEXT)
def test_defect_4_every_str_round_trips_exactly(content: str, thinking: str) -> None:
    record = ModelCallResult(
        run_id=RUN,
        result_id="m0",
        reply=ModelReply(call_id=None, content=content, thinking=thinking),
        failure=None,
    )
    line = encode_line(record, ModelCallResult, "test")
    back = decode_line(line[:-1], run_id=RUN, line_number=1)
    assert back == record


def test_defect_4_pair_halves_stored_apart_stay_apart() -> None:
    content = "<\ud83d\ude00>\ud83d\ud83d\ude00\ude00\udc00\udbff"
    record = ModelCallResult(
        run_id=RUN, result_id="m0", reply=ModelReply(call_id=None, content=content), failure=None
    )
    back = decode_line(encode_line(record, ModelCallResult, "t")[:-1], run_id=RUN, line_number=1)
    assert isinstance(back, ModelCallResult)
    assert back.reply is not None
    assert len(back.reply.content) == len(content) == 10
    assert back.reply.content == content


async def test_defect_4_a_resumed_final_answer_equals_the_uninterrupted_one(
    tmp_path: Path,
) -> None:
    reply = "final:x\ud83d\ude00y"
    store = JsonlRunStore(directory=tmp_path)
    whole = await run(definition(ScriptedModel([reply]), store=store), request())
    assert whole.final_answer == "x\ud83d\ude00y"
    path = tmp_path / f"{RUN}.jsonl"
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:3]) + b"\n")  # start, intent, model result
    again = await resume(definition(ScriptedModel([]), store=store), request())
    assert again.final_answer == whole.final_answer
    walls = {"step_wall_ms": 0}
    assert [dataclasses.replace(s, **walls) for s in again.steps] == [
        dataclasses.replace(s, **walls) for s in whole.steps
    ]


# --------------------------------------------------------------------------- defect 6


class _PoisonedParser(TinyParser):
    def parse(self, reply: ModelReply) -> ParsedReply:
        if reply.content == "poison":
            raise KeyError("the parser trips over this reply")
        return super().parse(reply)


async def test_defect_6_a_parser_that_raises_stops_the_run_with_a_typed_reason() -> None:
    tally = Tally()
    agent = dataclasses.replace(
        definition(ScriptedModel(["tool:echo {}", "poison"])), decision_parser=_PoisonedParser()
    )
    result = await run(agent, tool_request(tally))
    assert result.stop_reason is StopReason.PARSER_ERROR
    last = result.steps[-1]
    assert last.parse_ok is False
    assert last.parse_error is not None
    assert "_PoisonedParser.parse raised KeyError" in last.parse_error
    assert tally.runs == {"echo": 1}
    log = await agent.store.read_log(RUN)
    assert log.finished is not None
    assert log.finished.result == result


async def test_defect_6_a_stored_reply_the_parser_chokes_on_does_not_wedge_resume(
    tmp_path: Path,
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    agent = dataclasses.replace(
        definition(ScriptedModel(["poison"]), store=store), decision_parser=_PoisonedParser()
    )
    whole = await run(agent, request())
    path = tmp_path / f"{RUN}.jsonl"
    lines = path.read_bytes().split(b"\n")
    for keep in (3, 4):  # crash before the step record / before the finish record
        path.write_bytes(b"\n".join(lines[:keep]) + b"\n")
        again = await resume(agent, request())
        assert again.stop_reason is StopReason.PARSER_ERROR
        assert [s.parse_error for s in again.steps] == [s.parse_error for s in whole.steps]
        # and the run is finished now: a further resume hands the result back
        assert await resume(agent, request()) == again


async def test_defect_6_a_parser_raising_before_a_safe_replay_executes_nothing() -> None:
    tally = Tally()
    store = VolatileRunStore()
    agent = definition(ScriptedModel(["tool:echo {}"]), store=store)
    req = tool_request(tally, budget=dataclasses.replace(request().budget, max_steps=1))
    await run(agent, req)
    log = await store.read_log(RUN)
    crashed = VolatileRunStore()
    await crashed.write_run_started(log.started)  # type: ignore[arg-type]
    await crashed.write_intent(log.intents[0])
    await crashed.write_model_call_result(log.model_results[0])
    await crashed.write_intent(log.intents[1])  # the SAFE echo's intent, no result
    poisoned = dataclasses.replace(
        agent, store=crashed, decision_parser=_Flaky(log.model_results[0].reply)
    )
    result = await resume(poisoned, req)
    assert result.stop_reason is StopReason.PARSER_ERROR
    assert tally.runs == {"echo": 1}  # the first run's execution only


class _Flaky(TinyParser):
    """Parses everything except one reply (the parser was fine when the run wrote it)."""

    def __init__(self, bad: ModelReply | None) -> None:
        self._bad = bad

    def parse(self, reply: ModelReply) -> ParsedReply:
        if reply == self._bad:
            raise ValueError("not today")
        return super().parse(reply)
