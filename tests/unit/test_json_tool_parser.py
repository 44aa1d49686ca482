"""``polyloop.parsers.JsonToolCallParser`` (issue 12, item 2; design 0115): fenced or bare
JSON, a tool call or a final answer, and never an exception on model output."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.parsers import JsonToolCallParser
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ToolCall
from polyloop.types import ModelReply

pytestmark = pytest.mark.unit


def _parse(content: str, parser: JsonToolCallParser | None = None):  # type: ignore[no-untyped-def]
    return (parser or JsonToolCallParser()).parse(ModelReply(call_id=None, content=content))


@pytest.mark.parametrize(
    "content",
    [
        '{"tool": "add", "arguments": {"a": 2, "b": 3}}',
        '  \n{"tool": "add", "arguments": {"a": 2, "b": 3}}\n',
        'I will add them.\n```json\n{"tool": "add", "arguments": {"a": 2, "b": 3}}\n```\nDone.',
        '```\n{"tool": "add", "arguments": {"a": 2, "b": 3}}\n```',
        'Let me call {"tool": "add", "arguments": {"a": 2, "b": 3}} now',
        'Sets use {braces}. {"tool": "add", "arguments": {"a": 2, "b": 3}}',
    ],
)
def test_a_tool_call_is_read_fenced_bare_or_after_prose(content: str) -> None:
    parsed = _parse(content)
    assert parsed.decision == Action(
        text='add({"a": 2, "b": 3})', tool_call=ToolCall(name="add", arguments={"a": 2, "b": 3})
    )
    assert parsed.history_text == content


def test_missing_arguments_read_as_an_empty_object_and_a_call_wins_over_an_answer() -> None:
    assert _parse('{"tool": "now"}').decision == Action(
        text="now({})", tool_call=ToolCall(name="now", arguments={})
    )
    both = _parse('{"tool": "now", "arguments": {}, "final_answer": "x"}').decision
    assert isinstance(both, Action)


def test_a_final_answer() -> None:
    assert _parse('```json\n{"final_answer": "20"}\n```').decision == FinalAnswer(text="20")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"x": 1}', 'no usable "tool"'),
        ("I think the answer is 5.", "contains no JSON object"),
        ("[1, 2]", "contains no JSON object"),
        ("```json\n[1, 2]\n```", "is a JSON array, not an object"),
        ('```json\n{"tool": "add",}\n```', "could not be read"),
        ('{"tool": "add", "arguments": [1]}', "is a JSON array, not an object; nothing was run"),
        ('{"tool": "", "final_answer": "  "}', 'no usable "tool"'),
        ('{"tool": 3}', 'no usable "tool"'),
        ('{"final_answer": NaN}', "could not be read"),
        ("{" * 500, "could not be read"),
        ("```json\n" + "[" * 100_000 + "\n```", "could not be read (nested too deeply)"),
        ("", "contains no JSON object"),
    ],
)
def test_unusable_replies_are_invalid_decisions_that_say_what_to_send(
    content: str, words: str
) -> None:
    decision = _parse(content).decision
    assert isinstance(decision, InvalidDecision)
    assert words in decision.explanation
    assert 'Reply with one JSON object: {"tool": "<tool name>"' in decision.explanation


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_never_raises_on_any_text(content: str) -> None:
    parsed = _parse(content)
    assert parsed.history_text == content
    assert isinstance(parsed.decision, Action | FinalAnswer | InvalidDecision)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=10,
    )
)
def test_parse_never_raises_on_any_json(value: object) -> None:
    import json

    parsed = _parse(json.dumps(value))
    assert isinstance(parsed.decision, Action | FinalAnswer | InvalidDecision)


def test_the_key_names_are_settings_and_on_record() -> None:
    parser = JsonToolCallParser(tool_key="name", arguments_key="args", answer_key="answer")
    assert _parse('{"name": "f", "args": {"x": 1}}', parser).decision == Action(
        text='f({"x": 1})', tool_call=ToolCall(name="f", arguments={"x": 1})
    )
    assert _parse('{"answer": "ok"}', parser).decision == FinalAnswer(text="ok")
    assert parser.parameters() == {
        "kind": "json_tool_call",
        "tool_key": "name",
        "arguments_key": "args",
        "answer_key": "answer",
    }
    with pytest.raises(PolyloopValueError, match="must differ"):
        JsonToolCallParser(tool_key="x", answer_key="x")
    with pytest.raises(PolyloopTypeError, match=r"JsonToolCallParser\.tool_key must be a str"):
        JsonToolCallParser(tool_key=3)  # type: ignore[arg-type]


def test_instructions_state_the_form_and_list_the_tools_deterministically() -> None:
    schemas = [{"name": "add", "description": "Add.", "parameters": {"type": "object"}}]
    text = JsonToolCallParser().instructions(schemas)
    assert text == JsonToolCallParser().instructions(schemas)
    assert text.startswith('Reply with one JSON object: {"tool": "<tool name>", "arguments"')
    assert '"name": "add"' in text
