"""Structured output: output types, their check, and ``OutputParser`` (issue 25, design 0208).

Offline: replies are built by hand. The run over loopback HTTP is in
``tests/integration/test_agent_loopback.py``.
"""

from __future__ import annotations

import enum
import importlib.util
import json
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import pytest

from _infra import skip_unless_available
from polyloop.agent import FINAL_RESULT_TOOL, OutputParser
from polyloop.errors import OutputValidationError, PolyloopTypeError, PolyloopValueError
from polyloop.parsers import JsonToolCallParser, NativeToolCallParser
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ToolCall
from polyloop.tools import RegistryExecutor, ToolRegistry
from polyloop.types import ActionStatus, ModelReply, NativeToolCall, ReplayPolicy

pytestmark = pytest.mark.unit


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


@dataclass
class Address:
    city: str
    zip_code: str | None = None


@dataclass
class Person:
    name: str
    age: int
    colour: Colour
    address: Address
    tags: list[str] = field(default_factory=list)
    mood: Literal["calm", "busy"] = "calm"


class Summary(TypedDict):
    title: str
    points: list[int]


@dataclass
class Positive:
    value: int

    def __post_init__(self) -> None:
        if self.value <= 0:
            raise ValueError("value must be positive")


def _native(name: str, arguments: object, *, call_id: str = "call_1") -> ModelReply:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ModelReply(
        call_id="r",
        content="",
        tool_calls=(NativeToolCall(id=call_id, name=name, arguments=text),),
    )


def _text(content: str) -> ModelReply:
    return ModelReply(call_id="r", content=content)


PERSON = {
    "name": "Ada",
    "age": 36.0,
    "colour": "green",
    "address": {"city": "London"},
    "tags": ["math"],
}


# --------------------------------------------------------------------------- the answer's tool


def test_a_fitting_final_result_call_is_the_final_answer_as_its_json() -> None:
    parser = OutputParser(NativeToolCallParser(), Person)
    parsed = parser.parse(_native(FINAL_RESULT_TOOL, PERSON))

    assert isinstance(parsed.decision, FinalAnswer)
    assert json.loads(parsed.decision.text) == PERSON  # the validated JSON is what is recorded
    assert parsed.tool_calls[0].name == FINAL_RESULT_TOOL  # history keeps the call, by id
    person = parser.read(parsed.decision.text)
    assert person == Person(
        name="Ada", age=36, colour=Colour.GREEN, address=Address(city="London"), tags=["math"]
    )
    assert type(person.age) is int  # 36.0 is an integer in JSON, built as an int


def test_a_misfit_names_every_field_and_its_expected_type() -> None:
    parser = OutputParser(NativeToolCallParser(), Person)
    wrong = {
        "name": "Ada",
        "age": "thirty",
        "colour": "blue",
        "address": {"city": 7, "planet": "Earth"},
        "extra": True,
    }
    decision = parser.parse(_native(FINAL_RESULT_TOOL, wrong)).decision

    assert isinstance(decision, InvalidDecision)
    text = decision.explanation
    assert "does not fit Person" in text
    assert "the field 'age' must be integer, got string \"thirty\"" in text
    assert 'the field \'colour\' must be one of "red", "green", got string "blue"' in text
    assert "the field 'address.city' must be string, got integer 7" in text
    assert "the field 'address.planet' is not expected" in text
    assert "the field 'extra' is not expected" in text
    assert f"call {FINAL_RESULT_TOOL} again" in text


def test_a_missing_required_field_is_named() -> None:
    decision = OutputParser(NativeToolCallParser(), Summary).parse(
        _native(FINAL_RESULT_TOOL, {"points": [1, 2]})
    )
    assert isinstance(decision.decision, InvalidDecision)
    assert "the field 'title' is missing" in decision.decision.explanation


def test_a_typeddict_answer_is_a_dict() -> None:
    parser = OutputParser(NativeToolCallParser(), Summary)
    decision = parser.parse(_native(FINAL_RESULT_TOOL, {"title": "t", "points": [1, 2.0]})).decision
    assert isinstance(decision, FinalAnswer)
    assert parser.read(decision.text) == {"title": "t", "points": [1, 2]}


def test_the_classes_own_check_is_a_misfit_told_to_the_model() -> None:
    parser = OutputParser(NativeToolCallParser(), Positive)
    decision = parser.parse(_native(FINAL_RESULT_TOOL, {"value": -3})).decision
    assert isinstance(decision, InvalidDecision)
    assert "Positive refused it: value must be positive" in decision.explanation


def test_a_text_answer_is_accepted_when_it_is_fitting_json_and_refused_otherwise() -> None:
    parser = OutputParser(NativeToolCallParser(), Summary)
    fenced = parser.parse(_text('```json\n{"title": "t", "points": []}\n```')).decision
    bare = parser.parse(_text('{"title": "t", "points": []}')).decision
    prose = parser.parse(_text("The title is t.")).decision

    assert isinstance(fenced, FinalAnswer)
    assert isinstance(bare, FinalAnswer)
    assert isinstance(prose, InvalidDecision)
    assert f'call the tool "{FINAL_RESULT_TOOL}"' in prose.explanation
    assert "(Summary)" in prose.explanation


def test_other_decisions_pass_through_unchanged() -> None:
    inner = NativeToolCallParser()
    parser = OutputParser(inner, Summary)
    for reply in (
        _native("lookup", {"q": "x"}),
        _native("lookup", "{broken"),
        ModelReply(
            call_id="r",
            content="",
            tool_calls=(
                NativeToolCall(id="a", name=FINAL_RESULT_TOOL, arguments="{}"),
                NativeToolCall(id="b", name="lookup", arguments="{}"),
            ),
        ),
    ):
        assert parser.parse(reply) == inner.parse(reply)


def test_with_the_json_parser_the_answer_is_a_final_result_call_in_the_text() -> None:
    parser = OutputParser(JsonToolCallParser(), Summary)
    call = '{"tool": "final_result", "arguments": {"title": "t", "points": [3]}}'
    decision = parser.parse(_text(call)).decision
    assert isinstance(decision, FinalAnswer)
    assert json.loads(decision.text) == {"title": "t", "points": [3]}
    assert parser.native_tool_calls is False
    assert "final_result" in parser.instructions_note()


def test_the_parser_reports_the_output_type_in_its_parameters() -> None:
    parser = OutputParser(NativeToolCallParser(), Person)
    parameters = parser.parameters()
    assert parameters["kind"] == "native_tool_calls"
    assert parameters["output.kind"] == "dataclass"
    assert parameters["output.type"] == "Person"
    assert parameters["output.schema"].startswith("sha256:")
    assert parser.native_tool_calls is True
    other = OutputParser(NativeToolCallParser(), Summary).parameters()["output.schema"]
    assert other != parameters["output.schema"]  # another type is another snapshot


async def test_the_final_result_tool_is_safe_and_never_executed() -> None:
    parser = OutputParser(NativeToolCallParser(), Summary)
    spec = parser.tool
    assert spec.name == FINAL_RESULT_TOOL
    assert spec.replay_policy is ReplayPolicy.SAFE
    assert spec.parameters["required"] == ("title", "points")
    outcome = await RegistryExecutor(ToolRegistry([spec])).execute(
        Action(text="x", tool_call=ToolCall(name=FINAL_RESULT_TOOL, arguments={}))
    )
    assert outcome.status is ActionStatus.NOT_EXECUTED


# --------------------------------------------------------------------------- JSON Schema mapping


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"const": "report"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["kind", "items"],
    "additionalProperties": False,
    "$defs": {
        "Item": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "flag": {"type": "boolean"}},
            "required": ["n"],
        }
    },
}


def test_a_json_schema_answer_is_checked_through_refs_and_alternatives() -> None:
    parser = OutputParser(NativeToolCallParser(), SCHEMA)
    good = {"kind": "report", "items": [{"n": 1}, {"n": 2, "flag": False}], "note": None}
    decision = parser.parse(_native(FINAL_RESULT_TOOL, good)).decision
    assert isinstance(decision, FinalAnswer)
    assert parser.read(decision.text) == good

    bad = {"kind": "memo", "items": [{"n": True}, {}], "note": 4}
    refused = parser.parse(_native(FINAL_RESULT_TOOL, bad)).decision
    assert isinstance(refused, InvalidDecision)
    text = refused.explanation
    assert "the field 'kind' must be \"report\"" in text
    assert "the field 'items[0].n' must be integer, got boolean true" in text
    assert "the field 'items[1].n' is missing" in text
    assert "the field 'note' fits none of its allowed forms" in text


def test_a_schema_that_is_not_an_object_or_has_a_broken_ref_is_refused() -> None:
    with pytest.raises(PolyloopValueError, match="must describe a JSON object"):
        OutputParser(NativeToolCallParser(), {"type": "array"})
    with pytest.raises(PolyloopValueError, match="points to nothing"):
        OutputParser(
            NativeToolCallParser(),
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}},
        )


def test_types_that_are_not_output_types_are_refused_saying_what_is() -> None:
    with pytest.raises(PolyloopTypeError, match=r"output_type=int.*dataclass.*TypedDict"):
        OutputParser(NativeToolCallParser(), int)
    with pytest.raises(PolyloopTypeError, match="needs no OutputParser"):
        OutputParser(NativeToolCallParser(), str)

    @dataclass
    class Odd:
        values: set[int]

    with pytest.raises(PolyloopTypeError, match=r"output_type=.*Odd.*has no JSON Schema.*values"):
        OutputParser(NativeToolCallParser(), Odd)


def test_reading_a_recorded_answer_that_no_longer_fits_says_so() -> None:
    parser = OutputParser(NativeToolCallParser(), Summary)
    with pytest.raises(OutputValidationError) as caught:
        parser.read('{"title": 3}')
    assert "the field 'title' must be string" in str(caught.value)
    assert caught.value.problems
    with pytest.raises(OutputValidationError, match="not JSON"):
        parser.read("plain text")


# --------------------------------------------------------------------------- pydantic (duck-typed)


def _pydantic() -> Any:
    skip_unless_available(
        importlib.util.find_spec("pydantic") is not None,
        what="pydantic (structured output with a pydantic model is duck-typed; the test needs it)",
        how_to_install='pip install -e ".[dev]" (make install does it)',
    )
    import pydantic

    return pydantic


def test_a_pydantic_model_is_its_own_schema_and_check() -> None:
    pydantic = _pydantic()

    class Street(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        name: str
        number: int

    class Home(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        owner: str
        street: Street
        rooms: int | None = None

    parser = OutputParser(NativeToolCallParser(), Home)
    assert parser.parameters()["output.kind"] == "pydantic"
    assert "$defs" in parser.tool.parameters  # pydantic's nested models, by reference
    good = {"owner": "Ada", "street": {"name": "Main", "number": 3}}
    decision = parser.parse(_native(FINAL_RESULT_TOOL, good)).decision
    assert isinstance(decision, FinalAnswer)
    home = parser.read(decision.text)
    assert isinstance(home, Home)
    assert home.street.number == 3

    bad = {"owner": "Ada", "street": {"name": "Main", "number": "three"}}
    refused = parser.parse(_native(FINAL_RESULT_TOOL, bad)).decision
    assert isinstance(refused, InvalidDecision)
    assert "the field 'street.number'" in refused.explanation
    assert "integer" in refused.explanation
