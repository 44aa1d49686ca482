"""Behaviour of tool specs, the tool registry and the registry-derived executor.

The central promise is "four from one source": the schema the model is shown, the existence
check, argument validation and dispatch all come from one registry instance, so narrowing a
registry narrows all four together.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop._common import frozen
from polyloop.errors import PolyloopTypeError
from polyloop.ports import Action, ActionExecutor, ToolCall
from polyloop.tools import (
    RegistryExecutor,
    ToolEnvironmentError,
    ToolRegistry,
    ToolSpec,
    ToolValidationError,
)
from polyloop.types import ActionOutcome, ActionStatus, Injection, ReplayPolicy

pytestmark = pytest.mark.unit


def make_spec(name: str, **overrides: Any) -> ToolSpec:
    fields: dict[str, Any] = {"name": name, "description": f"what {name} does", "parameters": {}}
    fields.update(overrides)
    return ToolSpec(**fields)


async def _echo(arguments: Mapping[str, object]) -> str:
    return f"echo {dict(arguments)}"


def tool_action(name: str, arguments: object = None) -> Action:
    args = {} if arguments is None else arguments
    return Action(text=f"{name}({args!r})", tool_call=ToolCall(name=name, arguments=args))  # type: ignore[arg-type]


def assert_constant_columns(outcome: ActionOutcome) -> None:
    assert outcome.observation_is_synthetic is False
    assert outcome.observation_truncated_chars == 0
    assert outcome.env_reported_completion is False


# --------------------------------------------------------------------------- ToolSpec


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_spec_refuses_an_empty_or_blank_name(name: str) -> None:
    with pytest.raises(ValueError, match="tool name"):
        ToolSpec(name=name, description="", parameters={})


def test_spec_refuses_a_name_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match="tool name"):
        ToolSpec(name=123, description="", parameters={})  # type: ignore[arg-type]


def test_spec_refuses_a_comma_in_the_name_because_the_snapshot_joins_names_with_commas() -> None:
    with pytest.raises(ValueError, match="','"):
        make_spec("read,write")


def test_spec_refuses_a_description_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match="description"):
        ToolSpec(name="search", description=object(), parameters={})  # type: ignore[arg-type]


def test_an_empty_description_is_allowed() -> None:
    assert ToolSpec(name="search", description="", parameters={}).description == ""


def test_spec_refuses_parameters_that_are_not_a_mapping() -> None:
    with pytest.raises(TypeError, match="parameters"):
        ToolSpec(name="search", description="", parameters=["query"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"properties": {"q": {"enum": {1, 2}}}}, r"\['properties'\]\['q'\]\['enum'\]"),
        ({"x-meta": object()}, r"\['x-meta'\]"),
        ({"properties": {1: {"type": "string"}}}, "key 1"),
    ],
)
def test_spec_refuses_parameters_that_json_cannot_represent(
    parameters: dict[Any, Any], fragment: str
) -> None:
    with pytest.raises(TypeError, match=fragment):
        make_spec("search", parameters=parameters)


@pytest.mark.parametrize(
    ("parameters", "error", "fragment"),
    [
        ({"type": "string"}, ValueError, "top-level type must be 'object'"),
        ({"properties": ["q"]}, TypeError, r"\['properties'\]"),
        ({"properties": {"q": "string"}}, TypeError, r"\['properties'\]\['q'\]"),
        ({"properties": {"q": {"type": "text"}}}, ValueError, "unknown JSON type"),
        ({"properties": {"q": {"type": []}}}, TypeError, r"\['type'\]"),
        ({"required": "q"}, TypeError, r"\['required'\]"),
        ({"required": [1]}, TypeError, r"\['required'\]"),
        ({"additionalProperties": "no"}, TypeError, "additionalProperties"),
        ({"patternProperties": ["^x_"]}, TypeError, "patternProperties"),
    ],
)
def test_spec_refuses_schema_keywords_that_validation_could_not_interpret(
    parameters: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        make_spec("search", parameters=parameters)


def test_spec_accepts_a_top_level_object_type_and_boolean_property_schemas() -> None:
    spec = make_spec(
        "search",
        parameters={"type": ["object", "null"], "properties": {"q": True, "r": {}}},
    )
    assert spec.parameters["properties"] == {"q": True, "r": {}}


def test_spec_refuses_a_handler_that_is_not_callable() -> None:
    with pytest.raises(TypeError, match="handler"):
        make_spec("search", handler="not a function")


def test_spec_refuses_a_replay_policy_that_is_not_the_enum() -> None:
    with pytest.raises(TypeError, match="replay_policy"):
        make_spec("search", replay_policy="safe")


def test_spec_refuses_a_completes_run_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="completes_run"):
        make_spec("search", completes_run=1)


def test_spec_defaults_are_the_conservative_ones() -> None:
    spec = make_spec("write_file")

    assert spec.handler is None
    assert spec.replay_policy is ReplayPolicy.NEVER
    assert spec.completes_run is False


def test_spec_keeps_the_shape_it_was_given_when_the_caller_edits_its_dict_later() -> None:
    inner = {"type": "string"}
    schema: dict[str, Any] = {"properties": {"query": inner}, "required": ["query"]}
    spec = make_spec("search", parameters=schema)

    inner["type"] = "integer"
    schema["required"].append("other")
    schema["properties"] = {}

    assert spec.parameters["properties"] == {"query": {"type": "string"}}
    assert spec.parameters["required"] == ("query",)


def test_a_spec_taken_out_of_the_registry_cannot_be_edited_at_any_depth() -> None:
    registry = ToolRegistry(
        [
            make_spec(
                "read",
                parameters={"properties": {"path": {"type": "string"}}, "required": ["path"]},
            )
        ]
    )
    taken = registry.spec_for("read")
    assert taken is not None

    with pytest.raises(TypeError):
        taken.parameters["required"] = ["path", "mode"]  # type: ignore[index]
    with pytest.raises(TypeError):
        taken.parameters["properties"]["path"]["type"] = "integer"  # type: ignore[index]
    with pytest.raises(AttributeError):
        taken.parameters["required"].append("mode")  # type: ignore[attr-defined]

    registry.validate(ToolCall(name="read", arguments={"path": "a.txt"}))
    with pytest.raises(ToolValidationError):
        registry.validate(ToolCall(name="read", arguments={"path": 1}))


def test_specs_compare_by_value_and_are_unhashable() -> None:
    assert make_spec("read", parameters={"a": [1]}) == make_spec("read", parameters={"a": [1]})
    assert make_spec("read") != make_spec("read", completes_run=True)
    with pytest.raises(TypeError):
        hash(make_spec("read"))


# --------------------------------------------------------------------------- frozen


def test_frozen_turns_mappings_into_read_only_copies_and_lists_into_tuples() -> None:
    source: dict[str, Any] = {"a": {"b": [1, {"c": 2}]}, "d": (3, [4])}

    frozen_copy = frozen(source)
    source["a"]["b"].append(5)
    source["e"] = 6

    assert isinstance(frozen_copy, MappingProxyType)
    assert frozen_copy == {"a": {"b": (1, {"c": 2})}, "d": (3, (4,))}
    assert "e" not in frozen_copy
    assert isinstance(frozen_copy["a"], MappingProxyType)
    assert isinstance(frozen_copy["a"]["b"][1], MappingProxyType)
    with pytest.raises(TypeError):
        frozen_copy["a"]["b"][1]["c"] = 9  # type: ignore[index]


def test_frozen_keeps_arbitrary_objects_as_leaves() -> None:
    entry = Injection(entry_id="e1", content="text")
    binding = {"k": "v"}

    frozen_injections = frozen({"skill": (entry,), "hint": []})
    frozen_binding = frozen(binding)

    assert frozen_injections["skill"][0] is entry
    assert frozen_injections["hint"] == ()
    assert frozen_binding == {"k": "v"}
    with pytest.raises(TypeError):
        frozen_binding["k"] = "w"  # type: ignore[index]


def test_frozen_copies_even_a_read_only_view_so_the_view_s_owner_cannot_reach_in() -> None:
    owner = {"k": "v"}
    frozen_copy = frozen(MappingProxyType(owner))
    owner["k"] = "changed"

    assert frozen_copy == {"k": "v"}


def test_frozen_returns_scalars_unchanged() -> None:
    for value in ("text", 3, 2.5, True, None):
        assert frozen(value) is value


# --------------------------------------------------------------------------- registry basics


def test_registry_refuses_duplicate_names() -> None:
    with pytest.raises(ValueError, match="duplicate tool name 'search'"):
        ToolRegistry([make_spec("search"), make_spec("search")])


def test_registry_refuses_things_that_are_not_specs() -> None:
    with pytest.raises(TypeError, match=r"specs\[0\]"):
        ToolRegistry([{"name": "search"}])  # type: ignore[list-item]


def test_registry_refuses_a_non_iterable_or_a_string() -> None:
    with pytest.raises(TypeError):
        ToolRegistry(make_spec("read"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolRegistry("read")  # type: ignore[arg-type]


def test_an_empty_registry_is_a_normal_configuration() -> None:
    for registry in (ToolRegistry(), ToolRegistry(()), ToolRegistry([])):
        assert registry.names() == ()
        assert registry.schema_for_model() == []


def test_registration_order_is_preserved_everywhere() -> None:
    registry = ToolRegistry(make_spec(n) for n in ("read", "write", "search"))

    assert registry.names() == ("read", "write", "search")
    assert [entry["name"] for entry in registry.schema_for_model()] == ["read", "write", "search"]


def test_spec_for_answers_none_for_an_unregistered_name() -> None:
    read = make_spec("read")
    registry = ToolRegistry([read])

    assert registry.spec_for("read") is read
    assert registry.spec_for("write") is None
    assert registry.spec_for(["read"]) is None  # type: ignore[arg-type]


def test_a_registry_cannot_be_modified() -> None:
    registry = ToolRegistry([make_spec("read")])

    with pytest.raises(AttributeError):
        registry._specs = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del registry._specs
    assert registry.names() == ("read",)


def test_registries_compare_by_specs_and_order_and_are_unhashable() -> None:
    specs = [make_spec("read"), make_spec("write")]

    assert ToolRegistry(specs) == ToolRegistry(specs)
    assert ToolRegistry(specs) != ToolRegistry(list(reversed(specs)))
    assert ToolRegistry(specs) != ToolRegistry(specs[:1])
    assert ToolRegistry(specs) != specs
    with pytest.raises(TypeError):
        hash(ToolRegistry(specs))


def test_registry_repr_shows_the_names() -> None:
    assert "'read'" in repr(ToolRegistry([make_spec("read")]))


# --------------------------------------------------------------------------- narrowing


def test_restrict_to_keeps_registration_order_not_the_caller_order() -> None:
    registry = ToolRegistry(make_spec(n) for n in ("read", "write", "search"))

    assert registry.restrict_to({"search", "read"}).names() == ("read", "search")
    assert registry.restrict_to(["search", "read", "search"]).names() == ("read", "search")


def test_restrict_to_returns_a_new_registry_and_leaves_the_original_alone() -> None:
    specs = [make_spec("read"), make_spec("write")]
    registry = ToolRegistry(specs)

    narrowed = registry.restrict_to(["read"])

    assert narrowed.names() == ("read",)
    assert registry.names() == ("read", "write")
    assert narrowed == ToolRegistry(specs[:1])


def test_restrict_to_refuses_every_name_it_does_not_have() -> None:
    registry = ToolRegistry([make_spec("read")])

    with pytest.raises(ValueError, match="not in the registry") as info:
        registry.restrict_to(["read", "reed", "wrte"])
    assert "'reed'" in str(info.value)
    assert "'wrte'" in str(info.value)


def test_restrict_to_refuses_a_bare_string() -> None:
    with pytest.raises(TypeError, match="collection of tool names"):
        ToolRegistry([make_spec("read")]).restrict_to("read")


def test_restricting_to_nothing_gives_an_empty_registry() -> None:
    assert ToolRegistry(()).restrict_to(()).names() == ()
    assert ToolRegistry([make_spec("read")]).restrict_to(set()).names() == ()


async def test_narrowing_hides_a_tool_from_schema_lookup_validation_and_dispatch_together() -> None:
    calls: list[str] = []

    async def record(arguments: Mapping[str, object]) -> str:
        calls.append("write")
        return "written"

    registry = ToolRegistry([make_spec("read", handler=_echo), make_spec("write", handler=record)])
    narrowed = registry.restrict_to(["read"])

    assert [entry["name"] for entry in narrowed.schema_for_model()] == ["read"]
    assert narrowed.spec_for("write") is None
    with pytest.raises(ToolValidationError, match="does not exist") as info:
        narrowed.validate(ToolCall(name="write", arguments={}))
    assert "'write'" not in str(info.value).split(";", 1)[1]
    outcome = await narrowed.executor().execute(tool_action("write"))
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert calls == []
    assert (await registry.executor().execute(tool_action("write"))).observation == "written"


# --------------------------------------------------------------------------- model schema


def test_schema_for_model_entries_are_name_description_parameters() -> None:
    registry = ToolRegistry(
        [make_spec("read", description="Read a file", parameters={"required": ["path"]})]
    )

    assert registry.schema_for_model() == [
        {"name": "read", "description": "Read a file", "parameters": {"required": ["path"]}}
    ]


def test_schema_for_model_is_plain_json_data() -> None:
    registry = ToolRegistry(
        [make_spec("read", parameters={"properties": {"path": {"type": ["string", "null"]}}})]
    )

    schema = registry.schema_for_model()

    def walk(value: object) -> None:
        assert type(value) in (dict, list, str, int, float, bool, type(None))
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(schema)
    assert json.loads(json.dumps(schema)) == schema


def test_mutating_the_returned_schema_does_not_touch_the_registry() -> None:
    registry = ToolRegistry(
        [make_spec("read", parameters={"properties": {"path": {"type": "string"}}})]
    )

    first = registry.schema_for_model()
    first[0]["parameters"]["properties"]["path"]["type"] = "integer"  # type: ignore[index]
    first.append({"name": "ghost"})

    assert registry.schema_for_model() == [
        {
            "name": "read",
            "description": "what read does",
            "parameters": {"properties": {"path": {"type": "string"}}},
        }
    ]
    registry.validate(ToolCall(name="read", arguments={"path": "a.txt"}))


_json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=60)
@given(st.dictionaries(st.text(max_size=6).map(lambda key: "x-" + key), _json, max_size=4))
def test_schema_for_model_gives_back_exactly_what_was_registered(schema: dict[str, Any]) -> None:
    registry = ToolRegistry([make_spec("tool", parameters=schema)])

    assert registry.schema_for_model()[0]["parameters"] == schema


# --------------------------------------------------------------------------- validation


def _registry(parameters: Mapping[str, object], name: str = "tool") -> ToolRegistry:
    return ToolRegistry([make_spec(name, parameters=parameters)])


def test_validate_accepts_a_well_formed_call() -> None:
    registry = _registry(
        {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        }
    )

    registry.validate(ToolCall(name="tool", arguments={"path": "a.txt"}))


def test_validate_refuses_an_unregistered_tool_and_lists_the_available_ones() -> None:
    registry = ToolRegistry([make_spec("read"), make_spec("write")])

    with pytest.raises(ToolValidationError, match="does not exist") as info:
        registry.validate(ToolCall(name="delete", arguments={}))
    assert "'delete'" in str(info.value)
    assert "'read', 'write'" in str(info.value)
    assert info.value.tool == "delete"
    assert info.value.key is None


def test_validate_on_an_empty_registry_says_there_are_no_tools() -> None:
    with pytest.raises(ToolValidationError, match="no tools"):
        ToolRegistry().validate(ToolCall(name="read", arguments={}))


def test_validate_refuses_a_name_that_is_not_a_string() -> None:
    with pytest.raises(ToolValidationError, match="must be a string") as info:
        _registry({}).validate(ToolCall(name=["tool"], arguments={}))  # type: ignore[arg-type]
    assert info.value.tool is None


def test_validate_refuses_arguments_that_are_not_a_mapping() -> None:
    with pytest.raises(ToolValidationError, match="must be a mapping") as info:
        _registry({}).validate(ToolCall(name="tool", arguments=["a.txt"]))  # type: ignore[arg-type]
    assert "'tool'" in str(info.value)
    assert "array" in str(info.value)


def test_validate_refuses_argument_names_that_are_not_strings() -> None:
    with pytest.raises(ToolValidationError, match="parameter names must be strings"):
        _registry({}).validate(ToolCall(name="tool", arguments={1: "x"}))  # type: ignore[dict-item]


def test_validate_refuses_a_missing_required_parameter_naming_tool_and_key() -> None:
    registry = _registry({"properties": {"path": {"type": "string"}}, "required": ["path"]})

    with pytest.raises(ToolValidationError, match="required parameter 'path'") as info:
        registry.validate(ToolCall(name="tool", arguments={}))
    assert "'tool'" in str(info.value)
    assert (info.value.tool, info.value.key) == ("tool", "path")


def test_a_required_key_need_not_be_declared_in_properties() -> None:
    registry = _registry({"required": ["token"]})

    registry.validate(ToolCall(name="tool", arguments={"token": 1}))
    with pytest.raises(ToolValidationError, match="'token'"):
        registry.validate(ToolCall(name="tool", arguments={}))


def test_undeclared_keys_are_refused_only_under_additional_properties_false() -> None:
    declared = {"properties": {"path": {"type": "string"}}}
    call = ToolCall(name="tool", arguments={"path": "a.txt", "encoding": "utf-8"})

    _registry(declared).validate(call)
    _registry({**declared, "additionalProperties": True}).validate(call)
    _registry({**declared, "additionalProperties": {"type": "string"}}).validate(call)
    with pytest.raises(ToolValidationError, match="'encoding' is undeclared") as info:
        _registry({**declared, "additionalProperties": False}).validate(call)
    assert "'path'" in str(info.value)
    assert info.value.key == "encoding"


def test_pattern_properties_switches_off_the_undeclared_key_check() -> None:
    registry = _registry(
        {
            "properties": {"id": {"type": "string"}},
            "patternProperties": {"^x_": {"type": "string"}},
            "additionalProperties": False,
        }
    )

    registry.validate(ToolCall(name="tool", arguments={"id": "1", "x_1": "a"}))
    registry.validate(ToolCall(name="tool", arguments={"y": 1}))


def test_validate_refuses_a_wrong_top_level_type_naming_tool_key_and_expectation() -> None:
    registry = _registry({"properties": {"path": {"type": "string"}}}, name="read")

    with pytest.raises(ToolValidationError, match="wrong type") as info:
        registry.validate(ToolCall(name="read", arguments={"path": 7}))
    message = str(info.value)
    assert "'read'" in message
    assert "'path'" in message
    assert "expected string" in message
    assert "got integer" in message
    assert (info.value.tool, info.value.key) == ("read", "path")


@pytest.mark.parametrize(
    ("declared", "accepted", "refused"),
    [
        ("string", ["", "x"], [1, None, b"x", ["x"]]),
        ("integer", [0, -3, 3.0, json.loads("1e2"), 10**30], [True, False, 3.5, "3", None]),
        ("number", [0, 2.5, -1e300, 7], [True, "1", None]),
        ("boolean", [True, False], [0, 1, "true", None]),
        ("null", [None], [0, "", False]),
        ("object", [{}, {"a": 1}, MappingProxyType({})], [[], "x", None]),
        ("array", [[], [1], (1, 2)], [{}, "ab", None]),
    ],
)
def test_json_types_follow_json_not_python(
    declared: str, accepted: list[object], refused: list[object]
) -> None:
    registry = _registry({"properties": {"v": {"type": declared}}})

    for value in accepted:
        registry.validate(ToolCall(name="tool", arguments={"v": value}))
    for value in refused:
        with pytest.raises(ToolValidationError, match="wrong type"):
            registry.validate(ToolCall(name="tool", arguments={"v": value}))


@settings(max_examples=60)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_float_is_an_integer_exactly_when_it_has_no_fractional_part(value: float) -> None:
    registry = _registry({"properties": {"n": {"type": "integer"}}})
    call = ToolCall(name="tool", arguments={"n": value})

    if value.is_integer():
        registry.validate(call)
    else:
        with pytest.raises(ToolValidationError):
            registry.validate(call)


def test_a_type_may_be_a_list_of_alternatives_including_null() -> None:
    registry = _registry({"properties": {"n": {"type": ["integer", "null"]}}})

    registry.validate(ToolCall(name="tool", arguments={"n": 3}))
    registry.validate(ToolCall(name="tool", arguments={"n": None}))
    with pytest.raises(ToolValidationError, match="expected integer or null"):
        registry.validate(ToolCall(name="tool", arguments={"n": "3"}))


def test_an_empty_schema_accepts_any_arguments() -> None:
    _registry({}).validate(ToolCall(name="tool", arguments={"anything": [1, 2, 3], "x": None}))


def test_an_absent_optional_parameter_is_not_type_checked() -> None:
    _registry({"properties": {"n": {"type": "integer"}}}).validate(
        ToolCall(name="tool", arguments={})
    )


def test_nested_arguments_are_checked_deeply_naming_the_path() -> None:
    registry = _registry(
        {"properties": {"opts": {"type": "object", "properties": {"depth": {"type": "integer"}}}}}
    )

    registry.validate(ToolCall(name="tool", arguments={"opts": {"depth": 3}}))
    with pytest.raises(ToolValidationError, match="wrong type") as info:
        registry.validate(ToolCall(name="tool", arguments={"opts": {"depth": "deep"}}))
    assert "the parameter 'opts.depth'" in str(info.value)
    assert 'expected integer, got string "deep"' in str(info.value)
    assert (info.value.tool, info.value.key) == ("tool", "opts")


ITEMS_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "shown, never enforced"},
                    "count": {"type": "integer", "minimum": 1},
                    "mode": {"enum": ["fast", "slow"]},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
        },
        "kind": {"const": "order"},
        "note": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Note"}]},
    },
    "required": ["items"],
    "$defs": {"Note": {"type": "object", "properties": {"text": {"type": "string"}}}},
}


@pytest.mark.parametrize(
    ("arguments", "fragment", "key"),
    [
        (
            {"items": [{"name": "a"}, {"name": "b"}, {"name": 7}]},
            "'items[2].name' has the wrong type: expected string, got integer 7",
            "items",
        ),
        ({"items": [{"count": 1}]}, "the required parameter 'items[0].name' is missing", "items"),
        (
            {"items": [{"name": "a", "colour": "red"}]},
            "'items[0].colour' is undeclared; the object 'items[0]' accepts only 'name', "
            "'count', 'mode'",
            "items",
        ),
        (
            {"items": [{"name": "a", "count": True}]},
            "'items[0].count' has the wrong type: expected integer, got boolean true",
            "items",
        ),
        (
            {"items": [{"name": "a", "mode": "medium"}]},
            '\'items[0].mode\' must be one of "fast", "slow", got string "medium"',
            "items",
        ),
        ({"items": [], "kind": "memo"}, '\'kind\' must be "order", got string "memo"', "kind"),
        (
            {"items": [], "note": {"text": 5}},
            "'note.text' has the wrong type: expected string, got integer 5",
            "note",
        ),
        (
            {"items": [], "note": 5},
            "'note' fits none of its allowed forms: the parameter 'note' must be string, "
            "got integer 5",
            "note",
        ),
        (
            {"items": {"name": "a"}},
            "'items' has the wrong type: expected array, got an object",
            "items",
        ),
    ],
)
def test_a_nested_violation_is_refused_naming_its_path_and_what_fits(
    arguments: dict[str, object], fragment: str, key: str
) -> None:
    with pytest.raises(ToolValidationError) as info:
        _registry(ITEMS_SCHEMA, name="order").validate(ToolCall(name="order", arguments=arguments))
    assert fragment in str(info.value)
    assert str(info.value).startswith("tool 'order': ")
    assert (info.value.tool, info.value.key) == ("order", key)


def test_nested_arguments_that_fit_are_accepted_with_json_s_number_rules() -> None:
    registry = _registry(ITEMS_SCHEMA, name="order")
    fitting = {
        "items": [{"name": "a", "count": 3.0, "mode": "slow"}, {"name": "b", "count": 0}],
        "kind": "order",
        "note": {"text": "t", "more": 1},
    }

    registry.validate(ToolCall(name="order", arguments=fitting))
    registry.validate(ToolCall(name="order", arguments=frozen(fitting)))  # tuples, proxies
    registry.validate(ToolCall(name="order", arguments={"items": (), "note": "plain"}))


async def test_the_executor_refuses_a_nested_violation_without_calling_the_handler() -> None:
    calls: list[Mapping[str, object]] = []

    async def handler(arguments: Mapping[str, object]) -> str:
        calls.append(arguments)
        return "ran"

    executor = ToolRegistry(
        [make_spec("order", handler=handler, parameters=ITEMS_SCHEMA)]
    ).executor()

    outcome = await executor.execute(tool_action("order", {"items": [{"name": ["a"]}]}))

    assert calls == []
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert outcome.observation == (
        "not executed: tool 'order': the parameter 'items[0].name' has the wrong type: "
        "expected string, got an array of 1"
    )
    assert_constant_columns(outcome)


@pytest.mark.parametrize(
    ("schema", "accepted"),
    [
        ({"type": ["string", "null"], "format": "uri", "pattern": "^h"}, ["x", None]),
        ({"type": "object", "properties": {"q": {"type": "float"}}}, [{"q": "text"}]),
        ({"$ref": "#/definitions/Missing"}, ["x", None, [1]]),
        ({"$ref": "https://example.com/schema.json"}, ["x", {"q": 1}]),
        ({"items": [{"type": "integer"}], "x-vendor": {"any": "thing"}}, [["two"], "x"]),
        ({"anyOf": "not a list", "enum": "nor this", "required": 3}, ["x", {}]),
        ({"type": "string", "default": None, "examples": [1], "title": "P"}, ["x"]),
        ({"type": "array", "minItems": 9, "uniqueItems": True}, [[1, 1]]),
    ],
)
def test_keywords_and_shapes_the_check_does_not_read_are_never_refused(
    schema: dict[str, object], accepted: list[object]
) -> None:
    """Schemas as MCP servers send them: unknown keywords, unusual shapes, unresolvable
    references below the top level are shown to the model and enforce nothing."""
    registry = _registry(
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"p": schema}}
    )

    for value in accepted:
        registry.validate(ToolCall(name="tool", arguments={"p": value}))


def test_a_refusal_never_echoes_a_huge_value() -> None:
    registry = _registry({"properties": {"p": {"type": "object"}, "n": {"type": "string"}}})

    for value in ("x" * 100_000, 10**5000, list(range(100_000)), 1e308):
        with pytest.raises(ToolValidationError) as info:
            registry.validate(ToolCall(name="tool", arguments={"p": value}))
        assert len(str(info.value)) < 160
    with pytest.raises(ToolValidationError) as info:
        registry.validate(ToolCall(name="tool", arguments={"n": {"k": "v" * 100_000}}))
    assert str(info.value).endswith("got an object")


def test_a_validation_error_is_a_value_error() -> None:
    assert issubclass(ToolValidationError, ValueError)


def test_validate_takes_only_a_tool_call() -> None:
    with pytest.raises(TypeError, match="ToolCall"):
        _registry({}).validate({"name": "tool"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- executor


def test_executor_refuses_a_registry_naming_every_spec_without_a_handler() -> None:
    registry = ToolRegistry(
        [make_spec("read"), make_spec("echo", handler=_echo), make_spec("write")]
    )

    with pytest.raises(ValueError, match="handler") as info:
        registry.executor()
    assert "'read'" in str(info.value)
    assert "'write'" in str(info.value)
    assert "'echo'" not in str(info.value)
    assert registry.restrict_to(["echo"]).executor().registry.names() == ("echo",)


def test_registry_executor_can_be_built_directly_with_the_same_checks() -> None:
    registry = ToolRegistry([make_spec("echo", handler=_echo)])

    assert RegistryExecutor(registry).registry == registry
    with pytest.raises(TypeError, match="ToolRegistry"):
        RegistryExecutor([make_spec("echo", handler=_echo)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'read'"):
        RegistryExecutor(ToolRegistry([make_spec("read")]))


def test_the_executor_keeps_the_registry_it_came_from_and_is_an_action_executor() -> None:
    registry = ToolRegistry([make_spec("echo", handler=_echo)])

    executor = registry.executor()

    assert executor.registry is registry
    assert isinstance(executor, ActionExecutor)


async def test_an_action_without_a_tool_call_is_not_executed() -> None:
    executor = ToolRegistry([make_spec("echo", handler=_echo)]).executor()

    outcome = await executor.execute(Action(text="print('hello')"))

    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert "only dispatches tool calls" in outcome.observation
    assert_constant_columns(outcome)


async def test_an_invalid_call_is_not_executed_and_the_handler_is_not_called() -> None:
    calls: list[Mapping[str, object]] = []

    async def handler(arguments: Mapping[str, object]) -> str:
        calls.append(arguments)
        return "ran"

    executor = ToolRegistry(
        [make_spec("read", handler=handler, parameters={"required": ["path"]})]
    ).executor()

    missing = await executor.execute(tool_action("read", {}))
    unknown = await executor.execute(tool_action("delete", {"path": "x"}))
    not_a_mapping = await executor.execute(tool_action("read", ["x"]))

    assert calls == []
    for outcome in (missing, unknown, not_a_mapping):
        assert outcome.status is ActionStatus.NOT_EXECUTED
        assert_constant_columns(outcome)
    assert "required parameter 'path'" in missing.observation
    assert "'delete' does not exist" in unknown.observation
    assert "must be a mapping" in not_a_mapping.observation


async def test_a_handler_s_return_value_is_the_observation_of_an_executed_action() -> None:
    received: list[Mapping[str, object]] = []

    async def handler(args: Mapping[str, object]) -> str:
        received.append(args)
        return "file contents"

    arguments = {"path": "a.txt"}
    executor = ToolRegistry([make_spec("read", handler=handler)]).executor()

    outcome = await executor.execute(tool_action("read", arguments))

    assert outcome.status is ActionStatus.EXECUTED
    assert outcome.observation == "file contents"
    assert received == [arguments]
    assert_constant_columns(outcome)


async def test_an_empty_observation_is_still_an_executed_action() -> None:
    async def silent(arguments: Mapping[str, object]) -> str:
        return ""

    outcome = (
        await ToolRegistry([make_spec("t", handler=silent)]).executor().execute(tool_action("t"))
    )

    assert (outcome.status, outcome.observation) == (ActionStatus.EXECUTED, "")


async def test_a_completing_tool_is_still_reported_without_env_completion() -> None:
    spec = make_spec("submit", handler=_echo, completes_run=True)

    outcome = await ToolRegistry([spec]).executor().execute(tool_action("submit"))

    assert outcome.status is ActionStatus.EXECUTED
    assert outcome.env_reported_completion is False


async def test_a_handler_that_raises_is_an_executed_action_with_the_error_as_observation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def boom(arguments: Mapping[str, object]) -> str:
        raise ValueError("no such column 'x'")

    executor = ToolRegistry([make_spec("query", handler=boom)]).executor()

    with caplog.at_level(logging.WARNING, logger="polyloop.tools"):
        outcome = await executor.execute(tool_action("query"))

    assert outcome.status is ActionStatus.EXECUTED
    assert outcome.observation == "ValueError: no such column 'x'"
    assert "Traceback" not in outcome.observation
    assert_constant_columns(outcome)
    records = [r for r in caplog.records if r.name == "polyloop.tools"]
    assert len(records) == 1
    assert records[0].exc_info is not None
    assert records[0].exc_info[0] is ValueError
    assert "'query'" in records[0].getMessage()


async def test_an_exception_without_text_is_described_by_its_class() -> None:
    async def boom(arguments: Mapping[str, object]) -> str:
        raise RuntimeError

    outcome = (
        await ToolRegistry([make_spec("t", handler=boom)]).executor().execute(tool_action("t"))
    )

    assert (outcome.status, outcome.observation) == (ActionStatus.EXECUTED, "RuntimeError")


async def test_a_tool_environment_error_is_an_env_error(caplog: pytest.LogCaptureFixture) -> None:
    class SandboxGone(ToolEnvironmentError):
        pass

    async def broken(arguments: Mapping[str, object]) -> str:
        raise SandboxGone("worker process died")

    executor = ToolRegistry([make_spec("run", handler=broken)]).executor()

    with caplog.at_level(logging.WARNING, logger="polyloop.tools"):
        outcome = await executor.execute(tool_action("run"))

    assert outcome.status is ActionStatus.ENV_ERROR
    assert outcome.observation == "SandboxGone: worker process died"
    assert_constant_columns(outcome)
    assert any(r.exc_info is not None for r in caplog.records if r.name == "polyloop.tools")


async def test_a_handler_returning_a_non_string_is_a_programming_error_that_propagates() -> None:
    async def wrong(arguments: Mapping[str, object]) -> str:
        return {"rows": 3}  # type: ignore[return-value]

    executor = ToolRegistry([make_spec("count", handler=wrong)]).executor()

    with pytest.raises(TypeError, match=r"'count' returned dict"):
        await executor.execute(tool_action("count"))


def test_a_synchronous_handler_is_refused_when_the_spec_is_built() -> None:
    ran: list[str] = []

    def sync(arguments: Mapping[str, object]) -> str:
        ran.append("side effect")
        return "ran"

    with pytest.raises(PolyloopTypeError, match=r"ToolSpec\(name='t'\)\.handler 'test_a_.*sync'"):
        make_spec("t", handler=sync)
    assert ran == []


async def test_a_synchronous_callable_object_still_fails_at_the_call_not_silently() -> None:
    class Sync:
        def __call__(self, arguments: Mapping[str, object]) -> str:
            return "ran"

    executor = ToolRegistry([make_spec("t", handler=Sync())]).executor()

    with pytest.raises(TypeError, match="async callable"):
        await executor.execute(tool_action("t"))


async def test_cancellation_of_a_running_handler_propagates() -> None:
    started = asyncio.Event()

    async def slow(arguments: Mapping[str, object]) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    executor = ToolRegistry([make_spec("slow", handler=slow)]).executor()
    task = asyncio.create_task(executor.execute(tool_action("slow")))
    await started.wait()

    assert task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_a_cancelled_error_raised_by_a_handler_is_not_turned_into_an_outcome() -> None:
    async def cancelled(arguments: Mapping[str, object]) -> str:
        raise asyncio.CancelledError

    executor = ToolRegistry([make_spec("t", handler=cancelled)]).executor()

    with pytest.raises(asyncio.CancelledError):
        await executor.execute(tool_action("t"))


async def test_a_base_exception_from_a_handler_is_not_caught() -> None:
    class Abort(BaseException):
        pass

    async def abort(arguments: Mapping[str, object]) -> str:
        raise Abort

    with pytest.raises(Abort):
        await ToolRegistry([make_spec("t", handler=abort)]).executor().execute(tool_action("t"))


async def test_a_callable_object_with_an_async_call_is_a_handler() -> None:
    class Counter:
        def __init__(self) -> None:
            self.count = 0

        async def __call__(self, arguments: Mapping[str, object]) -> str:
            self.count += 1
            return str(self.count)

    executor = ToolRegistry([make_spec("count", handler=Counter())]).executor()

    assert (await executor.execute(tool_action("count"))).observation == "1"
    assert (await executor.execute(tool_action("count"))).observation == "2"


# --------------------------------------------------------------------------- parameters()


def test_parameters_of_an_empty_registry_are_only_the_kind() -> None:
    assert dict(ToolRegistry().executor().parameters()) == {"kind": "registry"}


def test_parameters_describe_each_tool_with_string_values() -> None:
    registry = ToolRegistry(
        [
            make_spec("read", handler=_echo, replay_policy=ReplayPolicy.SAFE),
            make_spec("submit", handler=_echo, completes_run=True),
        ]
    )

    parameters = registry.executor().parameters()

    assert set(parameters) == {
        "kind",
        "tool.read.schema",
        "tool.read.replay_policy",
        "tool.read.completes_run",
        "tool.submit.schema",
        "tool.submit.replay_policy",
        "tool.submit.completes_run",
    }
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in parameters.items())
    assert parameters["kind"] == "registry"
    assert parameters["tool.read.replay_policy"] == "safe"
    assert parameters["tool.submit.replay_policy"] == "never"
    assert parameters["tool.read.completes_run"] == "false"
    assert parameters["tool.submit.completes_run"] == "true"
    assert parameters["tool.read.schema"].startswith("sha256:")
    assert len(parameters["tool.read.schema"]) == len("sha256:") + 64


def test_parameters_are_the_same_for_equal_registries_and_read_only() -> None:
    def build() -> RegistryExecutor:
        return ToolRegistry(
            [make_spec("read", handler=_echo, parameters={"required": ["path"]})]
        ).executor()

    first = build().parameters()

    assert first == build().parameters()
    with pytest.raises(TypeError):
        first["kind"] = "other"  # type: ignore[index]


@pytest.mark.parametrize(
    "change",
    [
        {"description": "another description"},
        {"parameters": {"required": ["path", "mode"]}},
    ],
)
def test_the_schema_digest_changes_when_what_the_model_sees_changes(
    change: dict[str, Any],
) -> None:
    base = {"handler": _echo, "parameters": {"required": ["path"]}}
    before = ToolRegistry([make_spec("read", **base)]).executor().parameters()
    after = ToolRegistry([make_spec("read", **{**base, **change})]).executor().parameters()

    assert before["tool.read.schema"] != after["tool.read.schema"]


def test_the_handler_does_not_enter_the_parameters() -> None:
    async def other(arguments: Mapping[str, object]) -> str:
        return "other"

    assert (
        ToolRegistry([make_spec("t", handler=_echo)]).executor().parameters()
        == ToolRegistry([make_spec("t", handler=other)]).executor().parameters()
    )


async def test_a_handler_that_refuses_its_arguments_is_not_executed() -> None:
    async def picky(arguments: Mapping[str, object]) -> str:
        raise ToolValidationError("verdict must be one of pass/fail", tool="submit", key="verdict")

    registry = ToolRegistry(
        [ToolSpec(name="submit", description="d", parameters={}, handler=picky, completes_run=True)]
    )
    outcome = await registry.executor().execute(
        Action(text="submit", tool_call=ToolCall(name="submit", arguments={"verdict": "maybe"}))
    )
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert outcome.observation == "not executed: verdict must be one of pass/fail"
