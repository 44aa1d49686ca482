"""``ReviewParser``: JSON tool calls and final answers, with the tolerances models need.

Accepted decisions::

    {"tool": "<name>", "arguments": {...}}      -> Action (tool call)
    {"tool": "<name>", "<param>": ..., ...}     -> Action ("flattened" arguments)
    {"final_answer": "<non-empty text>"}        -> FinalAnswer

Tolerated around them: a ```json (or bare ```) fence, prose before and after, stray braces in
the prose. When an object has both ``tool`` and ``final_answer`` the tool wins: ending the run
on the answer would silently drop the call, while running the call loses nothing (the model
can answer again). Flattening never turns ``final_answer`` into an argument.

Five ways to fail, each with its own explanation (the observation the model reads next): no
JSON at all; a JSON syntax error; JSON that is not an object; an object with neither a usable
``tool`` nor a usable ``final_answer``; ``arguments`` that is not an object. ``parse`` never
raises (deep nesting, huge numbers and ``NaN`` are syntax errors), is deterministic, and hands
the reply back unchanged as ``history_text`` (never lengthened, never shortened).

``Action.text``, the trace form stored in the step record, is the call re-serialised with
sorted keys, so two spellings of one call (fenced or not, flattened or not) trace identically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

from polyloop.ports import Action, FinalAnswer, InvalidDecision, ParsedReply, ToolCall
from polyloop.types import ModelReply

__all__ = [
    "ARGUMENTS_NOT_AN_OBJECT",
    "NEITHER_TOOL_NOR_FINAL_ANSWER",
    "NOT_AN_OBJECT",
    "NO_JSON",
    "ReviewParser",
    "canonical_call",
]

NO_JSON: Final = (
    "Your reply contains no JSON. Reply with one JSON object, for example "
    '{"tool": "read_document", "arguments": {"doc_id": "tender.md", "start_line": 1}}.'
)
_SYNTAX: Final = (
    "Your reply's JSON has a syntax error ({detail}). Send one well-formed JSON object, "
    "double-quoted keys and strings, no trailing commas."
)
NOT_AN_OBJECT: Final = (
    'Your reply\'s JSON is not an object. Send a JSON object with a "tool" key, such as '
    '{"tool": "grep_document", "arguments": {"doc_id": "tender.md", "pattern": "deadline"}}.'
)
NEITHER_TOOL_NOR_FINAL_ANSWER: Final = (
    'Your JSON object has neither a "tool" name nor a non-empty "final_answer". Call a tool '
    'with {"tool": "<name>", "arguments": {...}}, or finish (where the phase allows it) with '
    '{"final_answer": "<text>"}.'
)
ARGUMENTS_NOT_AN_OBJECT: Final = (
    'The "arguments" of your tool call must be a JSON object mapping parameter names to '
    'values, such as {"doc_id": "tender.md", "start_line": 1}.'
)

_FENCE: Final = re.compile(r"```[ \t]*(?:json)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_MAX_ATTEMPTS: Final = 64
_RESERVED: Final = ("tool", "final_answer")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant)


def canonical_call(name: str, arguments: Mapping[str, object]) -> str:
    """The trace form of a tool call: ``{"arguments": {...}, "tool": name}``, keys sorted."""
    return json.dumps(
        {"tool": name, "arguments": dict(arguments)}, ensure_ascii=False, sort_keys=True
    )


def _decode_at(text: str, position: int) -> tuple[object, int, str | None]:
    """``(value, end, None)`` if a JSON value starts at ``position``, else
    ``(None, position, reason)``."""
    try:
        value, end = _DECODER.raw_decode(text, position)
    except json.JSONDecodeError as exc:
        return None, position, f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, position, "nested too deeply"
    except ValueError as exc:  # NaN/Infinity, or an integer too long to convert
        return None, position, str(exc)
    return value, end, None


def _candidates(text: str, opener: str) -> list[int]:
    positions: list[int] = []
    found = text.find(opener)
    while found != -1 and len(positions) < _MAX_ATTEMPTS:
        positions.append(found)
        found = text.find(opener, found + 1)
    return positions


def _decision(obj: Mapping[str, object]) -> Action | FinalAnswer | InvalidDecision:
    tool = obj.get("tool")
    if isinstance(tool, str) and tool.strip():
        if "arguments" in obj:
            arguments = obj["arguments"]
            if not isinstance(arguments, dict):
                return InvalidDecision(explanation=ARGUMENTS_NOT_AN_OBJECT)
        else:
            arguments = {k: v for k, v in obj.items() if k not in _RESERVED}
        return Action(
            text=canonical_call(tool, arguments),
            tool_call=ToolCall(name=tool, arguments=arguments),
        )
    answer = obj.get("final_answer")
    if isinstance(answer, str) and answer.strip():
        return FinalAnswer(text=answer)
    return InvalidDecision(explanation=NEITHER_TOOL_NOR_FINAL_ANSWER)


def _decide(text: str) -> Action | FinalAnswer | InvalidDecision:
    first_object: dict[str, object] | None = None
    first_error: str | None = None
    covered_until = 0  # braces inside an object already decoded are not candidates
    for position in _candidates(text, "{"):
        if position < covered_until:
            continue
        value, end, error = _decode_at(text, position)
        if isinstance(value, dict):
            covered_until = end
            if "tool" in value or "final_answer" in value:
                return _decision(value)
            if first_object is None and first_error is None:
                first_object = value
        elif error is not None and first_error is None and first_object is None:
            first_error = error
    if first_object is not None:
        return _decision(first_object)
    if first_error is not None:
        return InvalidDecision(explanation=_SYNTAX.format(detail=first_error))
    arrays = _candidates(text, "[")
    errors = []
    for position in arrays:
        _value, _end, error = _decode_at(text, position)
        if error is None:
            return InvalidDecision(explanation=NOT_AN_OBJECT)
        errors.append(error)
    if errors:
        return InvalidDecision(explanation=_SYNTAX.format(detail=errors[0]))
    return InvalidDecision(explanation=NO_JSON)


class ReviewParser:
    """The review scenario's ``DecisionParser`` (see the module docstring for the format).

    Where the JSON is looked for: inside the first fenced block if the reply has one (and
    that block holds any), otherwise anywhere in the reply. Among the top-level ``{``
    positions, the first object that has a ``tool`` or ``final_answer`` key is the decision;
    failing that, the first object decides (and is invalid); failing that, the first syntax
    error is reported.
    """

    __slots__ = ()

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "review_json_tool_call", "version": "1"}

    def parse(self, reply: ModelReply) -> ParsedReply:
        content = reply.content
        fence = _FENCE.search(content)
        decision = _decide(fence.group(1)) if fence is not None else None
        if decision is None or (
            isinstance(decision, InvalidDecision) and decision.explanation == NO_JSON
        ):
            decision = _decide(content)  # a fence without JSON: look at the whole reply
        return ParsedReply(history_text=content, decision=decision)
