"""The one JSON Schema check (``polyloop._common.JsonSchema``, design 0223).

Tool arguments (``ToolRegistry.validate``) and a structured answer (``polyloop.agent``) are
checked by it; these tests bind what it enforces, what it leaves alone, and that the two users
can never disagree about whether a value fits.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop._common import JsonSchema, described_value, frozen
from polyloop.agent import OutputParser
from polyloop.errors import PolyloopValueError
from polyloop.parsers import NativeToolCallParser
from polyloop.ports import FinalAnswer, InvalidDecision, ToolCall
from polyloop.tools import ToolRegistry, ToolSpec, ToolValidationError
from polyloop.types import ModelReply, NativeToolCall

pytestmark = pytest.mark.unit


def places(schema: dict[str, Any], value: object) -> list[str]:
    """Where each problem is (``items[2].name``) and its kind, in the order found."""
    return [f"{p.dotted}:{p.kind}" for p in JsonSchema(schema).problems(value)]


def test_every_problem_is_found_in_document_order_with_its_path() -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer"}},
                    "required": ["n"],
                    "additionalProperties": False,
                },
            },
            "when": {"type": ["string", "null"]},
        },
        "required": ["items", "who"],
    }
    value = {"items": [{"n": 1}, {"n": True, "x": 0}, {}], "when": 3}

    assert places(schema, value) == [
        "who:missing",
        "items[1].x:undeclared",
        "items[1].n:type",
        "items[2].n:missing",
        "when:type",
    ]
    assert [p.dotted for p in JsonSchema(schema).problems(value, first_only=True)] == ["who"]


@pytest.mark.parametrize(
    ("declared", "fits", "misfits"),
    [
        ("integer", [0, -3, 3.0, 10**40], [True, 2.5, "1", None]),
        ("number", [1, 2.5, 1e300], [False, "1"]),
        ("boolean", [True, False], [0, 1, None]),
        ("null", [None], [0, "", False]),
        ("array", [[], (1,)], [{}, "ab"]),
        ("object", [{}, frozen({"a": 1})], [[], None]),
    ],
)
def test_types_follow_json_below_the_top_level_too(
    declared: str, fits: list[object], misfits: list[object]
) -> None:
    schema = {"type": "object", "properties": {"a": {"items": {"type": declared}}}}
    for value in fits:
        assert places(schema, {"a": [value]}) == []
    for value in misfits:
        assert places(schema, {"a": [value]}) == ["a[0]:type"]


def test_enum_and_const_use_json_equality() -> None:
    schema = {"properties": {"e": {"enum": [1, "one", [1, 2], {"k": None}]}, "c": {"const": True}}}

    for fitting in (1, 1.0, "one", [1, 2], (1, 2), {"k": None}):
        assert places(schema, {"e": fitting}) == []
    for misfit in (True, "1", [1], [1, 2, 3], {"k": 0}, [True, 2]):
        assert places(schema, {"e": misfit}) == ["e:enum"]
    assert places(schema, {"c": True}) == []
    assert places(schema, {"c": 1}) == ["c:const"]
    assert places(frozen(schema), frozen({"e": [1, 2]})) == []  # type: ignore[arg-type]


def test_the_combinators_and_boolean_schemas() -> None:
    schema = {
        "properties": {
            "any": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "one": {"oneOf": [{"type": "number"}, {"type": "integer"}]},
            "all": {"allOf": [{"type": "object"}, {"required": ["id"]}]},
            "never": False,
            "always": True,
        }
    }

    assert places(schema, {"any": "x", "one": 2.5, "all": {"id": 1}, "always": [None]}) == []
    assert places(schema, {"any": None}) == ["any:none_fits"]
    assert places(schema, {"one": 2}) == ["one:many_fit"]
    assert places(schema, {"all": {}}) == ["all.id:missing"]
    assert places(schema, {"never": 0}) == ["never:not_allowed"]


def test_references_resolve_recursively_and_a_cycle_without_data_ends() -> None:
    tree = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["kids"],
            }
        },
        "$ref": "#/$defs/Node",
    }
    deep: dict[str, Any] = {"kids": []}
    for _ in range(50):
        deep = {"kids": [deep]}
    assert places(tree, deep) == []
    deep["kids"][0]["kids"][0]["kids"].append({})
    assert places(tree, deep) == ["kids[0].kids[0].kids[1].kids:missing"]

    assert places({"$ref": "#"}, {}) == [":too_deep"]


def test_unresolvable_references_enforce_nothing_unless_refused() -> None:
    schema = {"properties": {"a": {"$ref": "#/$defs/Gone"}, "b": {"$ref": "other.json#/x"}}}

    assert places(schema, {"a": 1, "b": [2]}) == []
    with pytest.raises(PolyloopValueError, match="points to nothing"):
        JsonSchema(schema, refs_must_resolve=True)


def test_keywords_it_does_not_read_change_nothing() -> None:
    annotated = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:x",
        "title": "T",
        "type": "object",
        "properties": {
            "s": {"type": "string", "format": "email", "maxLength": 1, "pattern": "^a$"},
            "n": {"type": "integer", "minimum": 10, "multipleOf": 7, "default": 0},
            "u": {"type": "unknown-type"},
            "p": {"prefixItems": [{"type": "string"}], "contains": {"const": 1}},
        },
        "dependentRequired": {"s": ["n"]},
        "unevaluatedProperties": False,
        "x-anything": {"type": "integer"},
    }

    assert places(annotated, {"s": "not an email", "n": 3, "u": None, "p": [1], "z": 1}) == []


# --------------------------------------------------------------------------- one check, two users

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([2.5, 1.0])
    | st.text("ab", max_size=2),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=8,
)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": ["integer", "null"]},
        "b": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/B"}]}},
        "c": {"enum": [1, "a", None, [True]]},
    },
    "required": ["a"],
    "additionalProperties": {"type": "object", "properties": {"a": {"const": "b"}}},
    "$defs": {"B": {"type": "object", "required": ["a"], "additionalProperties": False}},
}


def _tool_refuses(arguments: dict[str, Any]) -> bool:
    registry = ToolRegistry([ToolSpec(name="t", description="d", parameters=_SCHEMA)])
    try:
        registry.validate(ToolCall(name="t", arguments=arguments))
    except ToolValidationError:
        return True
    return False


def _answer_refused(parser: OutputParser[Any], arguments: dict[str, Any]) -> bool:
    call = NativeToolCall(id="c", name="final_result", arguments=json.dumps(arguments))
    decision = parser.parse(ModelReply(call_id="r", content="", tool_calls=(call,))).decision
    assert isinstance(decision, FinalAnswer | InvalidDecision)
    return isinstance(decision, InvalidDecision)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from("abcd"), _JSON, max_size=4))
def test_tool_arguments_and_a_structured_answer_are_refused_alike(
    arguments: dict[str, Any],
) -> None:
    parser: OutputParser[Any] = OutputParser(NativeToolCallParser(), _SCHEMA)
    assert _tool_refuses(arguments) == _answer_refused(parser, arguments)
    assert _tool_refuses(arguments) == bool(JsonSchema(_SCHEMA).problems(arguments))


# --------------------------------------------------------------------------- messages


@settings(max_examples=200, deadline=None)
@given(_JSON | st.text(min_size=100) | st.integers() | st.floats())
def test_a_value_is_described_by_its_type_and_never_at_length(value: object) -> None:
    text = described_value(value)
    assert len(text) <= 250  # 40 characters at most, each escaped in at most 6
    kind = text.split(" ", 1)[0]
    assert kind in {"string", "integer", "number", "boolean", "null", "an"}


def test_huge_values_are_described_not_shown() -> None:
    assert described_value("x" * 10_000) == f"string {json.dumps('x' * 37 + '...')}"
    assert described_value(10**5000) == "integer of about 5001 digits"
    assert described_value(list(range(10**5))) == "an array of 100000"
    assert described_value({"k": "v" * 10**5}) == "an object"
    assert described_value(b"x") == "Python bytes"


def test_an_enum_of_many_options_is_shown_in_part() -> None:
    schema = {"properties": {"e": {"enum": [f"option-{i}" for i in range(500)]}}}

    (problem,) = JsonSchema(schema).problems({"e": "none"})
    assert problem.expected.endswith("and 490 more")
    assert len(problem.expected) < 200


def test_a_huge_or_secret_key_the_value_brought_is_cut_in_the_path() -> None:
    """An undeclared key comes from the value (the model's arguments, its answer): the path
    that names it is cut like any shown value, never repeated whole."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    key = "sk-" + "x" * 5_000
    [problem] = JsonSchema({**schema, "additionalProperties": False}).problems({key: 1})
    assert problem.kind == "undeclared"
    assert len(problem.dotted) <= 40
    assert problem.dotted.endswith("...")
