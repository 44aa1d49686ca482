"""Stock decision parsers: optional ready-made implementations of ``ports.DecisionParser``.

``NativeToolCallParser`` reads the tool calls a model returned through its provider's native
function calling (``ModelReply.tool_calls``), the protocol every OpenAI-compatible endpoint
speaks. Use it with a model client that claims native tool calls (``GatewayModelClient``): the
session then offers the run's tool schemas on every model call. Design record 0100 explains
every verdict below.

``JsonToolCallParser`` reads one tool call or a final answer written as a JSON object in the
reply's text, fenced or bare, for endpoints and models without native function calling
(design 0115).

Nothing here is required: any object with ``parse`` and ``parameters`` is a parser. Every
parser in this module is certified by the contract suite (``polyloop.testing``).

This module imports only ``polyloop.errors``, ``polyloop.ports``, ``polyloop.types`` and the
standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ParsedReply, ToolCall
from polyloop.types import ModelReply, NativeToolCall

__all__ = ["JsonToolCallParser", "NativeToolCallParser"]

_PARAMETERS: Final[Mapping[str, str]] = MappingProxyType({"kind": "native_tool_calls"})


def _reject_constant(name: str) -> object:
    """``json.loads`` hook for ``NaN``/``Infinity``, which JSON does not have; caught below."""
    raise PolyloopValueError(f"{name} is not a JSON value")


def _described(call: NativeToolCall) -> str:
    return f"{call.name!r} (id {call.id!r})"


class NativeToolCallParser:
    """Turn a reply's native tool calls into a decision; never raises on model output.

    ``parse`` decides, in this order (the first rule that applies wins):

    1. ``finish_reason == "length"``: the reply was cut off, its tool call arguments may be
       incomplete -> ``InvalidDecision`` saying so (nothing is executed).
    2. two or more tool calls -> ``InvalidDecision`` naming every call and asking for one tool
       per reply (none is executed; polyloop runs one action per step, design 0100).
    3. one tool call with an empty name, or arguments that are not one JSON object ->
       ``InvalidDecision`` naming the tool and what was wrong. Arguments that are empty or
       whitespace only read as ``{}`` (some servers send ``""`` for a call without arguments).
    4. one tool call -> ``Action`` with ``ToolCall(name, arguments)`` and the trace form
       ``"<name>(<raw arguments>)"``. Whether the tool exists and the arguments fit its schema
       is the executor's judgement (``ToolRegistry.validate``: an unknown tool is a
       ``NOT_EXECUTED`` action), because the registry is the one source of that truth.
    5. no tool call and non-blank text -> ``FinalAnswer`` with the text.
    6. no tool call and blank text -> ``InvalidDecision`` asking for a tool call or an answer.

    ``history_text`` is always the reply's ``content`` and ``tool_calls`` always all of the
    reply's tool calls, whatever the verdict: the assistant turn in history is what the model
    said, and the protocol wants every call of a turn answered by a ``tool`` message.
    ``parameters()`` is ``{"kind": "native_tool_calls"}``.
    """

    __slots__ = ()

    native_tool_calls: ClassVar[bool] = True
    """The claim the session reads: offer the run's tool schemas on every model call."""

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "native_tool_calls"}``: the parser has no settings."""
        return _PARAMETERS

    def parse(self, reply: ModelReply) -> ParsedReply:
        """The verdict for ``reply`` (see the class docstring). ``TypeError`` for a non-reply."""
        if not isinstance(reply, ModelReply):
            raise PolyloopTypeError(
                f"NativeToolCallParser.parse takes a polyloop.types.ModelReply, got "
                f"{type(reply).__name__}"
            )
        return ParsedReply(
            history_text=reply.content,
            decision=self._decide(reply),
            tool_calls=reply.tool_calls,
        )

    def _decide(self, reply: ModelReply) -> Action | FinalAnswer | InvalidDecision:
        calls = reply.tool_calls
        if reply.finish_reason == "length":
            what = (
                "its tool call arguments may be incomplete, so no tool was run"
                if calls
                else "so it was not taken as your answer"
            )
            return InvalidDecision(
                explanation=(
                    "Your reply was cut off at the output token limit (finish_reason "
                    f"'length'); {what}. Reply again, shorter: call one tool, or give your "
                    "final answer."
                )
            )
        if len(calls) > 1:
            listed = ", ".join(_described(call) for call in calls)
            return InvalidDecision(
                explanation=(
                    f"You called {len(calls)} tools in one reply ({listed}); none of them was "
                    "run. Call exactly one tool per reply and wait for its result."
                )
            )
        if calls:
            return _action_for(calls[0])
        if reply.content.strip():
            return FinalAnswer(text=reply.content)
        return InvalidDecision(
            explanation=(
                "Your reply had neither a tool call nor any text. Call one of the tools, or "
                "reply with your final answer as text."
            )
        )


def _action_for(call: NativeToolCall) -> Action | InvalidDecision:
    if not call.name.strip():
        return InvalidDecision(
            explanation=(
                f"Your tool call (id {call.id!r}) has no tool name, so nothing was run. Call "
                "one of the tools by its name."
            )
        )
    raw = call.arguments
    if not raw.strip():
        arguments: object = {}
    else:
        try:
            arguments = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            # ValueError covers json.JSONDecodeError and the refused NaN/Infinity; a nesting
            # deeper than the interpreter's recursion limit is refused the same way.
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            return InvalidDecision(
                explanation=(
                    f"The arguments of your call to tool {_described(call)} are not valid JSON "
                    f"({reason}); nothing was run. Send the arguments as one JSON object, for "
                    'example {"name": "value"}.'
                )
            )
    if not isinstance(arguments, dict):
        return InvalidDecision(
            explanation=(
                f"The arguments of your call to tool {_described(call)} are a JSON "
                f"{_json_kind(arguments)}, not an object; nothing was run. Send the arguments "
                'as one JSON object, for example {"name": "value"}.'
            )
        )
    return Action(
        text=f"{call.name}({raw})",
        tool_call=ToolCall(name=call.name, arguments=arguments),
    )


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array"


# --------------------------------------------------------------------------- JSON in text

_FENCE: Final = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n(.*?)```", re.DOTALL)
_MAX_BARE_ATTEMPTS: Final = 32
"""How many ``{`` positions the bare-JSON search tries before giving up (bounds the cost of a
reply full of braces)."""


def _first_object(text: str) -> tuple[object, str | None]:
    """The first JSON value found in ``text`` and ``None``, or ``None`` and why not.

    Fenced blocks (```` ```json ```` or a bare ```` ``` ````) are tried first, in order; then
    the text itself when it starts with ``{``; then the JSON starting at each ``{`` in turn.
    A decoding error is remembered so that the explanation can quote it.
    """
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    error: str | None = None
    candidates = [match.group(1) for match in _FENCE.finditer(text)]
    for candidate in candidates:
        try:
            return decoder.decode(candidate.strip()), None
        except (ValueError, RecursionError) as exc:
            error = error or _json_error(exc)
    if candidates:
        return None, error
    start = text.find("{")
    attempts = 0
    while start != -1 and attempts < _MAX_BARE_ATTEMPTS:
        attempts += 1
        try:
            value, _ = decoder.raw_decode(text, start)
            return value, None
        except (ValueError, RecursionError) as exc:
            error = error or _json_error(exc)
        start = text.find("{", start + 1)
    return None, error


def _json_error(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


class JsonToolCallParser:
    """Read a tool call or a final answer written as one JSON object in the reply's text.

    For endpoints (or models) without native function calling. The model is asked to reply
    with ``{"tool": "<name>", "arguments": {...}}`` to call a tool or
    ``{"final_answer": "<text>"}`` to finish (the three key names are settings);
    ``instructions(tools.schema_for_model())`` writes that request and the tool list for the
    prompt. The object may stand alone, sit in a ```` ```json ```` (or bare ```` ``` ````)
    fence, or follow some prose. ``parse`` never raises on model output (design 0115):

    1. no JSON object can be found or decoded -> ``InvalidDecision`` quoting the JSON error
       and restating the expected form (``NaN``/``Infinity`` are refused, and so is nesting
       deeper than the interpreter can decode);
    2. a JSON value that is not an object -> ``InvalidDecision``;
    3. a non-empty string under ``tool_key`` -> ``Action`` with ``ToolCall(name, arguments)``
       and the trace form ``name(<arguments as JSON>)``; a missing ``arguments_key`` reads as
       ``{}``, one that is not an object is an ``InvalidDecision``. A tool call wins over a
       final answer in the same object: ending the run would drop the call silently;
    4. a non-blank string under ``answer_key`` -> ``FinalAnswer``;
    5. anything else (``{"x": 1}``, an empty tool name, a blank answer) -> ``InvalidDecision``
       saying which keys are expected.

    ``history_text`` is always the reply's whole ``content``: history shows what the model
    said. Whether the tool exists and its arguments fit is the registry's judgement.
    ``parameters()`` is ``{"kind": "json_tool_call", "tool_key", "arguments_key",
    "answer_key"}``.
    """

    __slots__ = ("_answer_key", "_arguments_key", "_parameters", "_tool_key")

    def __init__(
        self,
        *,
        tool_key: str = "tool",
        arguments_key: str = "arguments",
        answer_key: str = "final_answer",
    ) -> None:
        keys = {"tool_key": tool_key, "arguments_key": arguments_key, "answer_key": answer_key}
        for field, value in keys.items():
            if not isinstance(value, str):
                raise PolyloopTypeError(
                    f"JsonToolCallParser.{field} must be a str, got {type(value).__name__}"
                )
            if not value:
                raise PolyloopValueError(f"JsonToolCallParser.{field} must not be empty")
        if len(set(keys.values())) != len(keys):
            raise PolyloopValueError(
                f"JsonToolCallParser: tool_key, arguments_key and answer_key must differ, got "
                f"{tool_key!r}, {arguments_key!r}, {answer_key!r}"
            )
        self._tool_key = tool_key
        self._arguments_key = arguments_key
        self._answer_key = answer_key
        self._parameters: Mapping[str, str] = MappingProxyType({"kind": "json_tool_call", **keys})

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "json_tool_call"}`` plus the three key names."""
        return self._parameters

    def _form(self) -> str:
        return (
            f'Reply with one JSON object: {{"{self._tool_key}": "<tool name>", '
            f'"{self._arguments_key}": {{...}}}} to call a tool, or '
            f'{{"{self._answer_key}": "<your answer>"}} when you are done.'
        )

    def instructions(self, tool_schemas: Sequence[Mapping[str, object]]) -> str:
        """A prompt text that asks for this parser's form and lists the tools.

        ``tool_schemas`` is ``ToolRegistry.schema_for_model()``. The text is deterministic
        (same tools, same text), so it may go into ``Context.run_level`` without breaking
        prefix stability; record it in ``RunRequest.fingerprints`` if you version prompts.
        """
        listed = json.dumps(list(tool_schemas), ensure_ascii=False, indent=1)
        return f"{self._form()} Call one tool per reply. The tools:\n{listed}"

    def parse(self, reply: ModelReply) -> ParsedReply:
        """The verdict for ``reply`` (see the class docstring). ``PolyloopTypeError`` for a
        ``reply`` that is not a ``ModelReply``, which is a programming error, not output."""
        if not isinstance(reply, ModelReply):
            raise PolyloopTypeError(
                "JsonToolCallParser.parse takes a polyloop.types.ModelReply, got "
                f"{type(reply).__name__}"
            )
        return ParsedReply(history_text=reply.content, decision=self._decide(reply.content))

    def _decide(self, text: str) -> Action | FinalAnswer | InvalidDecision:
        value, error = _first_object(text)
        if error is not None and value is None:
            return InvalidDecision(
                explanation=f"Your reply's JSON could not be read ({error}). {self._form()}"
            )
        if value is None and error is None:
            return InvalidDecision(
                explanation=f"Your reply contains no JSON object. {self._form()}"
            )
        if not isinstance(value, dict):
            return InvalidDecision(
                explanation=(
                    f"The value in your reply is a JSON {_json_kind(value)}, not an object. "
                    f"{self._form()}"
                )
            )
        tool = value.get(self._tool_key)
        if isinstance(tool, str) and tool.strip():
            arguments = value.get(self._arguments_key, {})
            if not isinstance(arguments, dict):
                return InvalidDecision(
                    explanation=(
                        f'"{self._arguments_key}" of your call to tool {tool!r} is a JSON '
                        f"{_json_kind(arguments)}, not an object; nothing was run. "
                        f"{self._form()}"
                    )
                )
            trace = json.dumps(arguments, ensure_ascii=False)
            return Action(
                text=f"{tool}({trace})", tool_call=ToolCall(name=tool, arguments=arguments)
            )
        answer = value.get(self._answer_key)
        if isinstance(answer, str) and answer.strip():
            return FinalAnswer(text=answer)
        return InvalidDecision(
            explanation=(
                f'Your JSON object has no usable "{self._tool_key}" (a tool name) and no '
                f'usable "{self._answer_key}" (a non-empty text). {self._form()}'
            )
        )
