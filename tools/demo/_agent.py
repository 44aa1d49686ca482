"""The agent side of the demo: a rule-based model, a JSON-in-a-fence parser, a console sink.

The model is a set of rules, not a language model, but it talks like one: it reads the goal and
every observation from ``ModelCall.messages`` and answers with prose plus one fenced JSON block.
Its next reply is a pure function of the messages it is shown, so a resumed run (whose history
polyloop rebuilds byte for byte) gets exactly the replies an uninterrupted run would have got.

Reply format, understood by ``FencedJsonParser``::

    I need the price of a pear.
    ```json
    {"tool": "lookup", "arguments": {"item": "pear"}}
    ```

or ``{"final_answer": "..."}`` inside the block.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TextIO

from polyloop.ports import (
    Action,
    Event,
    FinalAnswer,
    InvalidDecision,
    ModelCall,
    ParsedReply,
    ToolCall,
)
from polyloop.tools import ToolRegistry
from polyloop.types import (
    ActionStatus,
    Context,
    Message,
    ModelReply,
    Role,
    StepRecord,
    SyntheticObservations,
    TextBlock,
)

__all__ = [
    "OBSERVATION_PREFIX",
    "OBSERVATION_TEMPLATE",
    "SYNTHETIC_OBSERVATIONS",
    "ConsoleSink",
    "FencedJsonParser",
    "Goal",
    "RuleBasedModel",
    "build_context",
]

OBSERVATION_PREFIX: Final = "Observation:\n"
OBSERVATION_TEMPLATE: Final = OBSERVATION_PREFIX + "{observation}"

SYNTHETIC_OBSERVATIONS: Final = SyntheticObservations(
    action_rejected="[the action was rejected before it ran: check the tool name and arguments]",
    env_failed="[the shop is unavailable; the action did not run]",
    model_call_failed="[the model call failed; this step produced nothing]",
)

_GOAL_HEADER: Final = re.compile(
    r"^Goal \(kind: (?P<kind>[a-z]+); items: (?P<items>[a-z, ]+); note: (?P<note>yes|no)\)$",
    re.MULTILINE,
)
_PRICE: Final = re.compile(r"^(?P<item>[a-z]+) costs (?P<price>\d+\.\d{2})$")
_SUM: Final = re.compile(r" = (?P<total>\d+\.\d{2})$")
_REJECTED_BY_PARSER: Final = "Your reply has no ```json block."


# --------------------------------------------------------------------------- goals and context


@dataclass(frozen=True, slots=True)
class Goal:
    """What one run is asked to do. ``render()`` is the goal-level message; its first line is
    the machine-readable header the rule-based model reads (a real model would read the prose).

    kinds: ``total`` (look up two prices, add them, optionally note the sum, submit it),
    ``price`` (look up one price, answer in words), ``cheapest`` (look up every item, submit the
    cheapest one).
    """

    kind: str
    items: tuple[str, ...]
    note: bool = False

    def render(self) -> str:
        header = f"Goal (kind: {self.kind}; items: {', '.join(self.items)}; note: "
        header += "yes" if self.note else "no"
        header += ")"
        if self.kind == "total":
            first, second = self.items
            prose = (
                f"What do one {first} and one {second} cost together? Look both prices up and "
                "add them"
                + (", write the total in a note," if self.note else "")
                + " then submit the total."
            )
        elif self.kind == "price":
            prose = f"What does one {self.items[0]} cost? Answer in one sentence."
        else:
            prose = "Which item is the cheapest? Check the price of every item, then submit it."
        return f"{header}\n{prose}"


def build_context(goal: Goal, tools: ToolRegistry) -> Context:
    """Run-level instructions (with the tool schema embedded as JSON), then the goal.

    polyloop never renders tool schemas itself: the caller puts ``schema_for_model()`` where
    its model expects it. The run-level text is the same for every run, which keeps a
    provider's prefix cache warm.
    """
    schema = json.dumps(tools.schema_for_model(), indent=2, sort_keys=True)
    instructions = (
        "You are a shop assistant. Work step by step. In every reply, write one short sentence "
        "of reasoning, then exactly one fenced ```json block holding either a tool call\n"
        '  {"tool": "<name>", "arguments": {...}}\n'
        "or, when you can answer without another tool,\n"
        '  {"final_answer": "<text>"}\n'
        f"The tools are:\n{schema}"
    )
    return Context(
        run_level=(Message(role=Role.USER, content=(TextBlock(text=instructions),)),),
        goal_level=(Message(role=Role.USER, content=(TextBlock(text=goal.render()),)),),
    )


# --------------------------------------------------------------------------- the model


def _text(message: Message) -> str:
    return "".join(block.text for block in message.content)


def _fenced(thought: str, payload: Mapping[str, object]) -> str:
    return f"{thought}\n```json\n{json.dumps(payload)}\n```"


def _tool(thought: str, name: str, **arguments: object) -> str:
    return _fenced(thought, {"tool": name, "arguments": arguments})


class RuleBasedModel:
    """A deterministic ``ModelClient`` that reads the conversation and applies fixed rules.

    ``quirk="unfenced-first-reply"`` makes the first reply of a run plain prose without the
    fenced block (the parser rejects it, the rejection becomes the next observation, and the
    model then behaves). The quirk is reported by ``parameters()``, so it is part of the
    model's identity in the parameter snapshot.
    """

    def __init__(self, *, quirk: str | None = None) -> None:
        if quirk not in (None, "unfenced-first-reply"):
            raise ValueError(f"RuleBasedModel: unknown quirk {quirk!r}")
        self._quirk = quirk

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "rule_based", "version": "1", "quirk": self._quirk or "none"}

    async def call(self, call: ModelCall) -> ModelReply:
        content = self._decide(call.messages)
        return ModelReply(call_id=f"rb-{call.run_id}-{call.call_index}", content=content)

    def _decide(self, messages: Sequence[Message]) -> str:
        goal = self._goal(messages)
        first_reply = next(
            (index for index, m in enumerate(messages) if m.role is Role.ASSISTANT), None
        )
        if first_reply is None and self._quirk == "unfenced-first-reply":
            return f"Sure! Let me check the price first: lookup(item={goal.items[0]})"
        # Every USER message after the first reply is an observation (history alternates).
        observations = [
            _text(m).removeprefix(OBSERVATION_PREFIX)
            for m in messages[len(messages) if first_reply is None else first_reply :]
            if m.role is Role.USER
        ]
        if observations and observations[-1].startswith(_REJECTED_BY_PARSER):
            # The parser told us the format was wrong: apologise, then use the right format.
            return "Sorry, here it is in the right format.\n" + self._next_move(goal, observations)
        return self._next_move(goal, observations)

    def _next_move(self, goal: Goal, observations: Sequence[str]) -> str:
        prices: dict[str, str] = {}
        total: str | None = None
        noted = False
        for observation in observations:
            if match := _PRICE.match(observation):
                prices[match["item"]] = match["price"]
            elif match := _SUM.search(observation):
                total = match["total"]
            elif observation == "note saved":
                noted = True
        for item in goal.items:
            if item not in prices:
                return _tool(f"I need the price of one {item}.", "lookup", item=item)
        if goal.kind == "price":
            item = goal.items[0]
            return _fenced(
                "I know the price now.", {"final_answer": f"One {item} costs {prices[item]}."}
            )
        if goal.kind == "cheapest":
            cheapest = min(goal.items, key=lambda name: float(prices[name]))
            return _tool("I have checked every price.", "submit", answer=cheapest)
        first, second = goal.items
        if total is None:
            a, b = float(prices[first]), float(prices[second])
            return _tool("Now I add the two prices.", "add", a=a, b=b)
        if goal.note and not noted:
            return _tool(
                "I keep a note of the total.", "write_note", text=f"{first} + {second} = {total}"
            )
        return _tool("Done, submitting the total.", "submit", answer=total)

    @staticmethod
    def _goal(messages: Sequence[Message]) -> Goal:
        for message in messages:
            match = _GOAL_HEADER.search(_text(message))
            if match is not None:
                items = tuple(item.strip() for item in match["items"].split(","))
                return Goal(kind=match["kind"], items=items, note=match["note"] == "yes")
        raise ValueError("RuleBasedModel: no 'Goal (kind: ...)' header in the messages")


# --------------------------------------------------------------------------- the parser

_FENCE: Final = re.compile(r"```json[ \t]*\r?\n(?P<body>.*?)\r?\n[ \t]*```", re.DOTALL)
_FORMAT_HINT: Final = (
    'Reply with one ```json block holding {"tool": "<name>", "arguments": {...}} or '
    '{"final_answer": "<text>"}.'
)


def _invalid(history: str, explanation: str) -> ParsedReply:
    return ParsedReply(history_text=history, decision=InvalidDecision(explanation=explanation))


class FencedJsonParser:
    """A ``DecisionParser`` for one fenced ```json block per reply.

    Only the first block counts; ``history_text`` is the reply cut after that block, so text
    the model invents after its call never enters the history. Every malformed reply becomes an
    ``InvalidDecision`` whose explanation tells the model how to fix it; ``parse`` never raises.
    """

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "fenced_json", "multi_block_policy": "first_only"}

    def parse(self, reply: ModelReply) -> ParsedReply:
        text = reply.content
        match = _FENCE.search(text)
        if match is None:
            return _invalid(text, f"{_REJECTED_BY_PARSER} {_FORMAT_HINT}")
        history = text[: match.end()]
        try:
            payload = json.loads(match["body"])
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            return _invalid(history, f"The ```json block is not valid JSON ({exc}). {_FORMAT_HINT}")
        if not isinstance(payload, dict):
            return _invalid(history, f"The ```json block must hold an object. {_FORMAT_HINT}")
        if "tool" in payload:
            name, arguments = payload["tool"], payload.get("arguments", {})
            if not isinstance(name, str) or not name:
                return _invalid(history, f'"tool" must be a tool name. {_FORMAT_HINT}')
            if not isinstance(arguments, dict):
                return _invalid(history, f'"arguments" must be an object. {_FORMAT_HINT}')
            trace = f"{name} {json.dumps(arguments, sort_keys=True)}"
            call = ToolCall(name=name, arguments=arguments)
            return ParsedReply(history_text=history, decision=Action(text=trace, tool_call=call))
        answer = payload.get("final_answer")
        if isinstance(answer, str) and answer.strip():
            return ParsedReply(history_text=history, decision=FinalAnswer(text=answer))
        return _invalid(
            history, f'The object needs a "tool" or a non-empty "final_answer". {_FORMAT_HINT}'
        )


# --------------------------------------------------------------------------- the event sink


def describe_step(step: StepRecord, width: int = 64) -> str:
    """One line for a completed step: what the agent did and what came back."""
    if not step.parse_ok:
        what, seen = "(unparseable reply)", step.parse_error or ""
    elif step.action is None:
        what = "(final answer)" if step.raw_output else "(model call failed)"
        seen = ""
    else:
        status = step.action_status
        assert status is not None  # set whenever action is
        shown = "" if status is ActionStatus.EXECUTED else f"[{status.value}]"
        what, seen = step.action, f"{shown} {step.observation}".strip()
    line = f"step {step.step_idx}  {what}"
    if seen:
        seen = seen.replace("\n", " ")
        if len(seen) > width:
            seen = seen[: width - 3] + "..."
        line += f"  ->  {seen}"
    return line


class ConsoleSink:
    """An ``EventSink`` that prints one progress line per completed step."""

    def __init__(self, *, indent: str = "    ", out: TextIO | None = None) -> None:
        self._indent = indent
        self._out = out

    def parameters(self) -> Mapping[str, str]:
        return {"kind": "console"}

    async def emit(self, event: Event) -> None:
        out = self._out if self._out is not None else sys.stdout
        print(f"{self._indent}{describe_step(event.step)}", file=out, flush=True)
