"""Stock decision parsers: optional ready-made implementations of ``ports.DecisionParser``.

``NativeToolCallParser`` reads the tool calls a model returned through its provider's native
function calling (``ModelReply.tool_calls``), the protocol every OpenAI-compatible endpoint
speaks. Use it with a model client that claims native tool calls (``GatewayModelClient``): the
session then offers the run's tool schemas on every model call. Design record 0100 explains
every verdict below.

Nothing here is required: any object with ``parse`` and ``parameters`` is a parser. Every
parser in this module is certified by the contract suite (``polyloop.testing``).

This module imports only ``polyloop.ports``, ``polyloop.types`` and the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import Action, FinalAnswer, InvalidDecision, ParsedReply, ToolCall
from polyloop.types import ModelReply, NativeToolCall

__all__ = ["NativeToolCallParser"]

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
