"""Structured output: what an ``output_type`` means as a schema, a check and a value.

An output type is ``str`` (the answer is text, as without an ``Agent``), a dataclass, a
``TypedDict``, a JSON Schema mapping (the value is a ``dict``), or a class with pydantic v2's
``model_json_schema``/``model_validate`` (duck-typed: pydantic is not a dependency). For the
others the answer is the arguments of a ``final_result`` tool whose parameters are the type's
schema; ``OutputParser`` wraps the run's decision parser to read it, and the answer on record
is that validated JSON, from which ``read`` rebuilds the value in any process (design 0208).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Final, Generic, TypeVar, cast, overload

from polyloop._common import thawed
from polyloop.agent._schema import compiled, problems_of
from polyloop.errors import (
    OutputValidationError,
    PolyloopTypeError,
    PolyloopValueError,
    ToolValidationError,
)
from polyloop.ports import Action, DecisionParser, FinalAnswer, InvalidDecision, ParsedReply
from polyloop.tools import ToolSpec
from polyloop.types import ModelReply, ReplayPolicy

__all__ = ["FINAL_RESULT_TOOL", "OutputParser", "OutputType", "output_type_of"]

OutputT = TypeVar("OutputT")

FINAL_RESULT_TOOL: Final = "final_result"
"""The name of the tool whose arguments are a structured final answer."""

_SHOWN_PROBLEMS: Final = 5
_FENCE: Final = re.compile(r"^```[ \t]*(?:json|JSON)?[ \t]*\r?\n(.*?)\r?\n?```$", re.DOTALL)
_DESCRIPTION: Final = (
    "Give your final answer and end the task: call this tool once, when you are done, with "
    "the answer as its arguments. They must match these parameters exactly."
)


class OutputType(Generic[OutputT]):
    """One structured output type: its ``schema``, and ``read`` from JSON to its value.

    ``kind`` is ``"dataclass"``, ``"typeddict"``, ``"json_schema"`` or ``"pydantic"``;
    ``label`` names the type in messages and in the snapshot. The schema is compiled here
    (``PolyloopValueError`` for a ``$ref`` that does not resolve).
    """

    __slots__ = ("check", "kind", "label", "schema")

    def __init__(self, kind: str, label: str, schema: Mapping[str, object]) -> None:
        self.kind = kind
        self.label = label
        self.schema = schema
        self.check = compiled(schema)

    def read(self, data: object) -> OutputT:
        """The value for ``data`` (decoded JSON); ``OutputValidationError`` listing every
        problem (field and expected type) when it does not fit."""
        raise NotImplementedError

    def refuse(self, found: Sequence[str]) -> OutputValidationError:
        return OutputValidationError(
            f"the answer does not fit {self.label}: {listed(found)}", problems=found
        )


def listed(found: Sequence[str]) -> str:
    """The first problems, joined, and how many more there are."""
    shown = "; ".join(found[:_SHOWN_PROBLEMS])
    more = len(found) - _SHOWN_PROBLEMS
    return f"{shown}; and {more} more" if more > 0 else shown


class _TypedOutput(OutputType[OutputT]):
    """A dataclass or ``TypedDict``: the schema ``ToolSpec.from_function`` derives for it, a
    check against that schema, then the value built from the hints (enum members, nested
    dataclasses, ``3.0`` as ``3`` for an ``int``). A ``ValueError``/``TypeError`` the class's
    own construction raises (a ``__post_init__`` check) is a problem like any other."""

    __slots__ = ("_type",)

    def __init__(self, output_type: type[OutputT], kind: str) -> None:
        label = output_type.__qualname__
        super().__init__(kind, label, _derived_schema(output_type, label))
        self._type = output_type

    def read(self, data: object) -> OutputT:
        found = problems_of(self.check, data)
        if found:
            raise self.refuse(found)
        try:
            return cast("OutputT", _built(self._type, data))
        except (ValueError, TypeError) as exc:
            raise self.refuse([f"{self.label} refused it: {exc}"]) from exc


class _SchemaOutput(OutputType[dict[str, Any]]):
    """A JSON Schema mapping: the value is the checked ``dict``."""

    __slots__ = ()

    def read(self, data: object) -> dict[str, Any]:
        found = problems_of(self.check, data)
        if found:
            raise self.refuse(found)
        return cast("dict[str, Any]", json.loads(json.dumps(data)))


class _PydanticOutput(OutputType[OutputT]):
    """A pydantic v2 model class, duck-typed: ``model_json_schema()`` is the schema and
    ``model_validate`` the check and the value; its errors name their fields."""

    __slots__ = ("_type",)

    def __init__(self, output_type: type[OutputT]) -> None:
        label = output_type.__qualname__
        duck: Any = output_type
        schema = duck.model_json_schema()
        if not isinstance(schema, Mapping):
            raise PolyloopTypeError(
                f"Agent(output_type={label}): {label}.model_json_schema() returned "
                f"{type(schema).__name__}, not a JSON Schema mapping"
            )
        super().__init__("pydantic", label, _checked_schema(schema, label))
        self._type = output_type

    def read(self, data: object) -> OutputT:
        duck: Any = self._type
        try:
            return cast("OutputT", duck.model_validate(data))
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise self.refuse(_pydantic_problems(exc)) from exc


def _pydantic_problems(exc: BaseException) -> list[str]:
    errors = getattr(exc, "errors", None)
    listed = errors() if callable(errors) else None
    if not isinstance(listed, list) or not listed:
        return [str(exc).splitlines()[0] if str(exc) else type(exc).__name__]
    found = []
    for error in listed:
        if not isinstance(error, Mapping):
            continue
        location = ".".join(str(part) for part in error.get("loc", ()))
        place = f"the field {location!r}" if location else "the answer"
        found.append(f"{place}: {error.get('msg', 'invalid')}")
    return found or [type(exc).__name__]


def _derived_schema(output_type: type, label: str) -> Mapping[str, object]:
    """The schema ``ToolSpec.from_function`` gives a parameter of this type (design 0114)."""

    async def answer(answer: Any) -> str:
        """The answer."""
        return ""

    answer.__annotations__ = {"answer": output_type, "return": str}
    answer.__qualname__ = f"output_type={label}"
    try:
        spec = ToolSpec.from_function(answer, name=FINAL_RESULT_TOOL)
    except PolyloopTypeError as exc:
        raise PolyloopTypeError(f"Agent(output_type={label}) has no JSON Schema: {exc}") from exc
    properties = spec.parameters["properties"]
    assert isinstance(properties, Mapping)
    return cast("Mapping[str, object]", thawed(properties["answer"]))


def _is_pydantic_model(value: object) -> bool:
    return isinstance(value, type) and all(
        callable(getattr(value, name, None)) for name in ("model_json_schema", "model_validate")
    )


def output_type_of(output_type: object) -> OutputType[Any] | None:
    """The ``OutputType`` for an ``Agent(output_type=...)``; ``None`` for ``str``.

    ``PolyloopTypeError`` for anything else, saying what is accepted; ``PolyloopValueError``
    for a schema that does not describe a JSON object.
    """
    if output_type is str:
        return None
    result: OutputType[Any]
    if _is_pydantic_model(output_type):
        result = _PydanticOutput(cast("type[Any]", output_type))
    elif isinstance(output_type, type) and dataclasses.is_dataclass(output_type):
        result = _TypedOutput(output_type, "dataclass")
    elif isinstance(output_type, type) and typing.is_typeddict(output_type):
        result = _TypedOutput(output_type, "typeddict")
    elif isinstance(output_type, Mapping):
        schema = _checked_schema(output_type, "<a JSON Schema>")
        result = _SchemaOutput("json_schema", "the JSON Schema", schema)
    else:
        shown = getattr(output_type, "__qualname__", None) or type(output_type).__name__
        raise PolyloopTypeError(
            f"Agent(output_type={shown}) is not an output type: pass str (the default: text), "
            "a dataclass, a TypedDict, a JSON Schema mapping for an object, or a pydantic v2 "
            "model class. For a single value, wrap it: @dataclass class Answer: value: int"
        )
    return result


def _checked_schema(schema: Mapping[object, object], label: str) -> Mapping[str, object]:
    """A plain copy of ``schema``, refused unless it is JSON and describes an object."""
    declared = schema.get("type")
    if declared != "object" and not (isinstance(declared, list) and "object" in declared):
        raise PolyloopValueError(
            f"Agent(output_type={label}) must describe a JSON object ('type': 'object'), got "
            f"'type': {declared!r}: the answer is the arguments of the final_result tool, "
            "which are an object. Wrap it: {'type': 'object', 'properties': {'value': <your "
            "schema>}, 'required': ['value']}"
        )
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PolyloopTypeError(
            f"Agent(output_type={label}) is not JSON ({exc}); a schema holds only dicts, "
            "lists, strings, numbers, booleans and None"
        ) from exc
    return cast("Mapping[str, object]", json.loads(text))


def _same_option(option: object, value: object) -> bool:
    if isinstance(option, bool) or isinstance(value, bool):
        return option is value
    return bool(option == value)


def _built(hint: object, value: object) -> object:
    """``value`` (decoded JSON that fits the schema of ``hint``) as a value of ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _built(args[0], value)
    if hint is int and isinstance(value, float):
        return int(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is typing.Literal:
        return next((option for option in args if _same_option(option, value)), value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if origin in (typing.Union, types.UnionType):
        others = [arg for arg in args if arg is not type(None)]
        return None if value is None else _built(others[0], value)
    if isinstance(value, list | tuple):
        item = args[0] if origin is list and args else Any
        return [_built(item, entry) for entry in value]
    if not isinstance(value, Mapping):
        return value
    if origin is dict and len(args) == 2:
        return {key: _built(args[1], entry) for key, entry in value.items()}
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or typing.is_typeddict(hint)):
        hints = typing.get_type_hints(hint, include_extras=True)
        fields = {key: _built(hints[key], entry) for key, entry in value.items()}
        return fields if typing.is_typeddict(hint) else hint(**fields)
    return dict(value)


def _digest(schema: Mapping[str, object]) -> str:
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


async def _never_executed(arguments: Mapping[str, object], /) -> str:
    """The handler of ``final_result``: the ``OutputParser`` reads every call of it, so none
    reaches an executor; one that does (another parser) is refused, not executed."""
    raise ToolValidationError(
        "final_result is read as the final answer by polyloop.agent.OutputParser, which this "
        "run's decision parser is not; it is never executed as a tool",
        tool=FINAL_RESULT_TOOL,
    )


class OutputParser(Generic[OutputT]):
    """A ``DecisionParser`` that wraps another and reads a structured final answer.

    ``parse`` asks ``inner`` first, then:

    * a call of the tool ``final_result`` (native, or ``{"tool": "final_result", ...}`` from a
      text parser): its arguments are checked against the output type; a fit is a
      ``FinalAnswer`` whose text is those arguments as JSON (the answer on record), a misfit an
      ``InvalidDecision`` naming each field and the expected type (a parse failure, counted
      against ``Budget.max_consecutive_parse_failures``);
    * a text ``FinalAnswer``: accepted when the whole text (or one ```` ```json ```` fence) is
      a JSON object that fits, otherwise an ``InvalidDecision`` asking for ``final_result``;
    * anything else (another tool call, an invalid decision): ``inner``'s verdict unchanged.

    ``tool`` is the ``final_result`` ``ToolSpec`` (``SAFE``; its handler refuses to run) to put
    in the run's registry, so its schema is offered with native tool calls, listed in a text
    parser's instructions and, digested, in the snapshot. ``parameters()`` is ``inner``'s plus
    ``output.kind``, ``output.type`` and ``output.schema`` (a sha256 of the schema);
    ``native_tool_calls`` is ``inner``'s claim. ``read(text)`` rebuilds the value from the
    recorded answer.
    """

    __slots__ = ("_inner", "_output", "_parameters", "tool")

    @overload
    def __init__(
        self: OutputParser[dict[str, Any]], inner: DecisionParser, output_type: Mapping[str, Any]
    ) -> None: ...

    @overload
    def __init__(self, inner: DecisionParser, output_type: type[OutputT]) -> None: ...

    def __init__(self, inner: DecisionParser, output_type: object) -> None:
        output = output_type_of(output_type)
        if output is None:
            raise PolyloopTypeError(
                "OutputParser(output_type=str): a text answer needs no OutputParser; use the "
                "inner parser itself"
            )
        parameters = dict(inner.parameters())
        extra = {
            "output.kind": output.kind,
            "output.type": output.label,
            "output.schema": _digest(output.schema),
        }
        clash = sorted(set(parameters) & set(extra))
        if clash:
            raise PolyloopValueError(
                f"OutputParser: the inner parser's parameters() already has {clash}; those keys "
                "are the output type's in the snapshot"
            )
        self._inner = inner
        self._output: OutputType[OutputT] = output
        self._parameters: Mapping[str, str] = types.MappingProxyType({**parameters, **extra})
        self.tool = ToolSpec(
            name=FINAL_RESULT_TOOL,
            description=_DESCRIPTION,
            parameters=output.schema,
            handler=_never_executed,
            replay_policy=ReplayPolicy.SAFE,
        )

    @property
    def native_tool_calls(self) -> bool:
        """The inner parser's claim (design 0100)."""
        return getattr(self._inner, "native_tool_calls", False) is True

    @property
    def inner(self) -> DecisionParser:
        """The wrapped parser."""
        return self._inner

    @property
    def output_label(self) -> str:
        """The output type's name in messages."""
        return self._output.label

    def parameters(self) -> Mapping[str, str]:
        """``inner.parameters()`` plus ``output.kind``, ``output.type`` and ``output.schema``."""
        return self._parameters

    def instructions_note(self) -> str:
        """A sentence for a text protocol's instructions: how to give the answer."""
        return (
            f"Your final answer is structured ({self._output.label}): give it by calling the "
            f'tool "{FINAL_RESULT_TOOL}" with the answer as its arguments, which must match its '
            "parameters, not as plain text."
        )

    def parse(self, reply: ModelReply) -> ParsedReply:
        """The verdict for ``reply`` (see the class docstring)."""
        parsed = self._inner.parse(reply)
        if not isinstance(parsed, ParsedReply):
            return parsed  # the inner parser's breach, reported by the session as its own
        decision = parsed.decision
        verdict: FinalAnswer | InvalidDecision
        if isinstance(decision, Action) and decision.tool_call is not None:
            if decision.tool_call.name != FINAL_RESULT_TOOL:
                return parsed
            verdict = self._judged(decision.tool_call.arguments, "your call to final_result")
        elif isinstance(decision, FinalAnswer):
            verdict = self._judged_text(decision.text)
        else:
            return parsed
        return ParsedReply(
            history_text=parsed.history_text, decision=verdict, tool_calls=parsed.tool_calls
        )

    def _judged(self, data: object, given: str) -> FinalAnswer | InvalidDecision:
        try:
            self._output.read(data)
        except OutputValidationError as exc:
            return InvalidDecision(
                explanation=(
                    f"Your final answer ({given}) does not fit {self._output.label}: "
                    f"{listed(exc.problems)}. Nothing was accepted; call "
                    f"{FINAL_RESULT_TOOL} again with the corrected answer."
                )
            )
        return FinalAnswer(text=json.dumps(data, ensure_ascii=False, allow_nan=False))

    def _judged_text(self, text: str) -> FinalAnswer | InvalidDecision:
        stripped = text.strip()
        fenced = _FENCE.match(stripped)
        candidate = fenced.group(1) if fenced else stripped
        try:
            data = json.loads(candidate) if candidate.startswith("{") else None
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict):
            return self._judged(data, "your reply's JSON")
        return InvalidDecision(
            explanation=(
                f"This task's final answer is structured ({self._output.label}), so a "
                f'plain-text answer is not accepted: call the tool "{FINAL_RESULT_TOOL}" with '
                "the answer as its arguments."
            )
        )

    def read(self, text: str) -> OutputT:
        """The output value of a recorded final answer (``RunResult.final_answer``).

        ``OutputValidationError`` when ``text`` is not JSON that fits the output type: the run
        finished under another output type.
        """
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise OutputValidationError(
                f"the recorded final answer is not JSON ({exc}), so it is not a "
                f"{self._output.label}: the run finished under another output type; start it "
                "again under a new run id",
                problems=[f"not JSON: {exc}"],
            ) from exc
        return self._output.read(data)
