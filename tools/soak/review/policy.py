"""The scripted reviewer the loopback policy server plays for the review scenario.

``policy(request)`` reads the conversation exactly as a model would receive it (system
message, task message, then alternating replies and observations) and returns the next reply.
It is a pure function of the request: its only randomness is ``random.Random`` seeded from
the request's seed, task, phase, persona and turn number, so a resumed run (whose history
polyloop rebuilds byte for byte) gets the reply an uninterrupted run would have got.

The competent script, per phase:

* plan: one ``grep_document`` per probe of the checkpoint's category, then ``write_note``
  plan.md with every matching line as "- <doc> line <n>: <text>", then a final answer;
* execute: read plan.md, re-read each listed line in its document (``read_document`` around
  it), ``write_note`` evidence.md with the verified lines, then a final answer (without a
  plan it runs the probes itself);
* summarize: read evidence.md, judge, ``submit_finding``.

Progress is derived from the history, not from a turn counter: a call counts as done when an
earlier reply made it and its observation is not the rejection text. That is what lets the
other personas share the script: ``sloppy`` spends its first one to three turns on unknown
tools and broken arguments, ``malformed`` replaces about three turns in ten with unparseable
text, ``verbose`` wraps every move in thousands of characters of musing, and ``stubborn``
reads and greps at random forever (it never writes, answers or submits, so every phase ends
on its step budget).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Final

from polyloop.ports import Action
from polyloop.types import ModelReply
from tools.soak.review.domain import NAME, PHASES
from tools.soak.review.parser import ReviewParser, canonical_call
from tools.soak.review.prompts import (
    EVIDENCE_NOTE,
    OBSERVATION_PREFIX,
    PLAN_NOTE,
    SYNTHETIC_OBSERVATIONS,
)
from tools.soak.scenarios.base import PERSONAS, PolicyRequest

__all__ = ["PROBES", "judge", "policy"]

PROBES: Final[Mapping[str, tuple[tuple[str, str], ...]]] = MappingProxyType(
    {
        "bid_security": (
            ("notice.md", "Procurement budget"),
            ("tender.md", "[Bb]id security amount"),
        ),
        "bid_period": (
            ("notice.md", "Issue date of the tender documents|Bid submission deadline"),
            ("tender.md", "Bid submission deadline"),
        ),
        "regional_restriction": (
            ("tender.md", "place of registration|registered branch office|local service office"),
        ),
        "payment_terms": (("tender.md", r"^\d+\.\d+ Payment:"),),
    }
)
"""What the scripted reviewer searches for, per checkpoint category: ``(doc_id, pattern)``."""

_PARSER: Final = ReviewParser()
_FAILED_OBSERVATIONS: Final = frozenset(
    {SYNTHETIC_OBSERVATIONS.action_rejected, SYNTHETIC_OBSERVATIONS.env_failed}
)
_CATEGORY: Final = re.compile(r"^Checkpoint \S+ \(category: ([a-z_]+);", re.MULTILINE)
_DOCUMENT: Final = re.compile(r"^- (\S+): (\d+) lines$", re.MULTILINE)
_NUMBERED: Final = re.compile(r"^(\d+): (.*)$")
_PLAN_ENTRY: Final = re.compile(r"^\d+: - (\S+) line (\d+): ")
_EVIDENCE_ENTRY: Final = re.compile(r"^\d+: (\S+) line (\d+): (.*)$")
_AMOUNT: Final = re.compile(r"CNY ([0-9,]+\.[0-9]{2})")
_DATE: Final = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
_PAYMENT_DAYS: Final = re.compile(r"within (\d+) days after final acceptance")


# --------------------------------------------------------------------------- reading the chat


@dataclass(frozen=True, slots=True)
class _Goal:
    category: str
    documents: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class _Call:
    tool: str
    arguments: Mapping[str, object]

    @property
    def key(self) -> str:
        return canonical_call(self.tool, self.arguments)


@dataclass(frozen=True, slots=True)
class _Finish:
    text: str


_Move = _Call | _Finish


@dataclass(slots=True)
class _Memory:
    """Every tool call the conversation shows, with its observation and whether it ran."""

    results: dict[str, tuple[str, bool]] = field(default_factory=dict)

    def attempted(self, call: _Call) -> bool:
        return call.key in self.results

    def ok(self, call: _Call) -> bool:
        return self.results.get(call.key, ("", False))[1]

    def observation(self, call: _Call) -> str:
        return self.results.get(call.key, ("", False))[0]


def _read_conversation(messages: Sequence[Mapping[str, str]]) -> tuple[str, list[tuple[str, str]]]:
    """The task message and the ``(reply, observation)`` pairs after it."""
    goal_at = next((i for i, message in enumerate(messages) if message.get("role") == "user"), None)
    if goal_at is None:
        raise ValueError("the conversation has no user message, so no review task to work on")
    turns: list[tuple[str, str]] = []
    rest = list(messages[goal_at + 1 :])
    for index, message in enumerate(rest):
        if message.get("role") != "assistant":
            continue
        following = rest[index + 1] if index + 1 < len(rest) else None
        observation = ""
        if following is not None and following.get("role") == "user":
            observation = following.get("content", "").removeprefix(OBSERVATION_PREFIX)
        turns.append((message.get("content", ""), observation))
    return messages[goal_at].get("content", ""), turns


def _parse_goal(text: str) -> _Goal:
    category = _CATEGORY.search(text)
    if category is None:
        raise ValueError("the task message names no checkpoint category")
    documents = {doc: int(count) for doc, count in _DOCUMENT.findall(text)}
    return _Goal(category=category.group(1), documents=documents)


def _memory(turns: Sequence[tuple[str, str]]) -> _Memory:
    memory = _Memory()
    for reply, observation in turns:
        decision = _PARSER.parse(ModelReply(call_id=None, content=reply)).decision
        if isinstance(decision, Action) and decision.tool_call is not None:
            memory.results[decision.text] = (observation, observation not in _FAILED_OBSERVATIONS)
    return memory


def _numbered(observation: str) -> list[tuple[int, str]]:
    found = []
    for line in observation.split("\n"):
        match = _NUMBERED.match(line)
        if match is not None:
            found.append((int(match.group(1)), match.group(2)))
    return found


# --------------------------------------------------------------------------- judging


def _amount(text: str) -> Decimal | None:
    match = _AMOUNT.search(text)
    return None if match is None else Decimal(match.group(1).replace(",", ""))


def judge(category: str, evidence: Sequence[str]) -> tuple[str, str]:
    """``(verdict, summary)`` for a checkpoint category from verbatim evidence lines."""
    if category == "bid_security":
        budgets = [a for line in evidence if "Procurement budget" in line if (a := _amount(line))]
        bonds = {a for line in evidence if "id security amount" in line if (a := _amount(line))}
        if not budgets or not bonds:
            return "doubtful", "The evidence lacks the budget or the bid security amount."
        if len(bonds) > 1:
            return "doubtful", f"The tender states {len(bonds)} different bid security amounts."
        (bond,) = bonds
        share = bond * 100 / budgets[0]
        verdict = "compliant" if bond * 100 <= budgets[0] * 2 else "non_compliant"
        return verdict, f"The bid security is {share:.2f}% of the budget; the limit is 2%."
    if category == "bid_period":
        issues = [
            m.group(1) for line in evidence if "Issue date" in line if (m := _DATE.search(line))
        ]
        deadlines = {
            m.group(1) for line in evidence if "Bid submission deadline" in line
            if (m := _DATE.search(line))
        }  # fmt: skip
        if not issues or not deadlines:
            return "doubtful", "The evidence lacks the issue date or the deadline."
        if len(deadlines) > 1:
            return "doubtful", "The notice and the tender state different deadlines."
        days = (dt.date.fromisoformat(deadlines.pop()) - dt.date.fromisoformat(issues[0])).days
        verdict = "compliant" if days >= 20 else "non_compliant"
        return verdict, f"Bidders get {days} days from issue to deadline; the minimum is 20."
    if category == "regional_restriction":
        if any("must have a registered branch office" in line for line in evidence):
            return "non_compliant", "Bidders must keep a registered office in one city."
        if any("are preferred" in line for line in evidence):
            return "doubtful", "The tender prefers bidders with a local office."
        if any("No restriction" in line for line in evidence):
            return "compliant", "The tender places no restriction on the place of registration."
        return "doubtful", "The evidence says nothing about the place of registration."
    if category == "payment_terms":
        if any("will be agreed" in line for line in evidence):
            return "doubtful", "The payment schedule is left open until after the award."
        for line in evidence:
            match = _PAYMENT_DAYS.search(line)
            if match is not None:
                days = int(match.group(1))
                verdict = "compliant" if days <= 30 else "non_compliant"
                return verdict, f"Payment is due {days} days after acceptance; the limit is 30."
        return "doubtful", "The evidence contains no payment clause."
    raise ValueError(f"unknown checkpoint category {category!r}")


# --------------------------------------------------------------------------- the script


def _probe_calls(goal: _Goal) -> list[_Call]:
    return [
        _Call("grep_document", {"doc_id": doc, "pattern": pattern})
        for doc, pattern in PROBES.get(goal.category, ())
    ]


def _locations(memory: _Memory, probes: Sequence[_Call]) -> list[tuple[str, int, str]]:
    found = []
    for call in probes:
        if memory.ok(call):
            doc = str(call.arguments["doc_id"])
            found += [(doc, n, text) for n, text in _numbered(memory.observation(call))]
    return found


def _next_probe(memory: _Memory, probes: Sequence[_Call]) -> _Call | None:
    return next((call for call in probes if not memory.attempted(call)), None)


def _plan_move(goal: _Goal, memory: _Memory) -> _Move:
    probes = _probe_calls(goal)
    probe = _next_probe(memory, probes)
    if probe is not None:
        return probe
    locations = _locations(memory, probes)
    lines = [f"# Plan: {goal.category}", *(f"- {d} line {n}: {t}" for d, n, t in locations)]
    if not locations:
        lines.append("(no candidate location found)")
    write = _Call("write_note", {"name": PLAN_NOTE, "text": "\n".join(lines) + "\n"})
    if not memory.attempted(write):
        return write
    return _Finish(f"{PLAN_NOTE} lists {len(locations)} locations to verify.")


def _execute_move(goal: _Goal, memory: _Memory) -> _Move:
    read_plan = _Call("read_document", {"doc_id": PLAN_NOTE, "start_line": 1})
    if not memory.attempted(read_plan):
        return read_plan
    if memory.ok(read_plan):
        targets = [
            (m.group(1), int(m.group(2)))
            for line in memory.observation(read_plan).split("\n")
            if (m := _PLAN_ENTRY.match(line))
        ]
    else:
        probes = _probe_calls(goal)
        probe = _next_probe(memory, probes)
        if probe is not None:
            return probe
        targets = [(doc, n) for doc, n, _text in _locations(memory, probes)]
    evidence = []
    for doc, number in targets:
        read = _Call(
            "read_document", {"doc_id": doc, "start_line": max(1, number - 1), "max_lines": 3}
        )
        if not memory.attempted(read):
            return read
        evidence += [
            f"{doc} line {n}: {text}"
            for n, text in _numbered(memory.observation(read))
            if n == number
        ]
    text = "\n".join([f"# Evidence: {goal.category}", *evidence]) + "\n"
    write = _Call("write_note", {"name": EVIDENCE_NOTE, "text": text})
    if not memory.attempted(write):
        return write
    return _Finish(f"{EVIDENCE_NOTE} holds {len(evidence)} verified lines.")


def _summarize_move(goal: _Goal, memory: _Memory) -> _Move:
    read = _Call("read_document", {"doc_id": EVIDENCE_NOTE, "start_line": 1})
    if not memory.attempted(read):
        return read
    evidence = []
    if memory.ok(read):
        evidence = [
            m.group(3) for line in memory.observation(read).split("\n")
            if (m := _EVIDENCE_ENTRY.match(line))
        ]  # fmt: skip
    verdict, summary = judge(goal.category, evidence)
    return _Call("submit_finding", {"verdict": verdict, "summary": summary})


def _competent_move(phase: str, goal: _Goal, memory: _Memory) -> _Move:
    if phase == "plan":
        return _plan_move(goal, memory)
    if phase == "execute":
        return _execute_move(goal, memory)
    return _summarize_move(goal, memory)


# --------------------------------------------------------------------------- personas


def _sloppy_move(phase: str, rng: random.Random) -> _Call:
    if phase == "summarize":
        options = [
            _Call("grep_document", {"doc_id": "tender.md", "pattern": "security"}),
            _Call("write_note", {"name": "verdict.md", "text": "looks fine"}),
            _Call("submit_finding", {"verdict": "mostly compliant", "summary": "probably ok"}),
            _Call("read_document", {"doc_id": ".write_audit.log", "start_line": 1}),
        ]
    else:
        options = [
            _Call("search_web", {"query": "tender rules"}),
            _Call("read_document", {"doc_id": "tender.md", "start_line": "first"}),
            _Call("read_document", {"doc_id": "tender.md", "start_line": 1, "max_lines": 5000}),
            _Call("read_document", {"doc_id": "../../etc/passwd", "start_line": 1}),
            _Call("write_note", {"name": "../escape.md", "text": "notes"}),
            _Call("grep_document", {"doc_id": "tender.md"}),
            _Call("grep_document", {"doc_id": "tender.md", "pattern": "(unclosed"}),
        ]
    return rng.choice(options)


def _stubborn_move(phase: str, goal: _Goal, rng: random.Random) -> _Call:
    documents = sorted(goal.documents.items()) or [("tender.md", 1)]
    doc, count = rng.choice(documents)
    if phase != "summarize" and rng.random() < 0.3:
        word = rng.choice(("security", "deadline", "Payment", "office", "CNY", "acceptance"))
        return _Call("grep_document", {"doc_id": doc, "pattern": word})
    return _Call(
        "read_document",
        {
            "doc_id": doc,
            "start_line": rng.randrange(1, max(2, count)),
            "max_lines": rng.randrange(20, 61),
        },
    )


_GARBAGE: Final = (
    '{"tool": "read_document", "arguments": {"doc_id": "tender.md", "start_line": 1',
    "Let me think about where the clause might be before I act.",
    '["read_document", "tender.md", 1]',
    '{"action": "read_document", "target": "tender.md"}',
    '{"tool": "grep_document", "arguments": "tender.md deadline"}',
    "```json\n{'tool': 'read_document'}\n```",
)


def _json(move: _Move, *, flat: bool) -> str:
    if isinstance(move, _Finish):
        return json.dumps({"final_answer": move.text}, ensure_ascii=False)
    if flat:
        return json.dumps({"tool": move.tool, **move.arguments}, ensure_ascii=False)
    return json.dumps({"tool": move.tool, "arguments": dict(move.arguments)}, ensure_ascii=False)


def _remark(move: _Move) -> str:
    if isinstance(move, _Finish):
        return "The work of this phase is done."
    target = move.arguments.get("doc_id") or move.arguments.get("name") or "the review"
    return f"Next I call {move.tool} on {target}."


def _render(move: _Move, rng: random.Random) -> str:
    style = rng.choice(("bare", "fenced", "flat"))
    if style == "bare":
        return _json(move, flat=False)
    if style == "flat" and isinstance(move, _Call):
        return _json(move, flat=True)
    return f"{_remark(move)}\n```json\n{_json(move, flat=False)}\n```"


def _musing(goal: _Goal, turns: Sequence[tuple[str, str]], rng: random.Random) -> str:
    """Several thousand characters of deliberation, free of braces, backticks and fences."""
    seen = [line for _reply, observation in turns[-3:] for line in observation.split("\n")]
    paragraphs = [
        f"Let me think this through carefully. The checkpoint is about {goal.category}, and "
        f"the documents are {', '.join(goal.documents) or 'not listed'}.",
    ]
    target = rng.randrange(2_000, 6_000)
    while sum(len(p) for p in paragraphs) < target:
        paragraphs.append(
            rng.choice(
                (
                    "I should not conclude before the evidence is verified word for word.",
                    "The placeholders stand for real organisations; I treat them as names.",
                    "Amounts and dates are the values that decide this checkpoint.",
                    "Each phase has its own tools, so I use only the ones listed now.",
                )
            )
        )
        if seen:
            paragraphs.append("I noted this line: " + rng.choice(seen)[:200])
    text = "\n\n".join(paragraphs)
    return text.translate({ord(c): None for c in "{}`"})


def _check(request: PolicyRequest) -> None:
    if request.scenario != NAME:
        raise ValueError(f"this policy serves scenario {NAME!r}, not {request.scenario!r}")
    if request.phase not in PHASES:
        raise ValueError(f"phase {request.phase!r} is unknown; use one of {', '.join(PHASES)}")
    if request.persona not in PERSONAS:
        raise ValueError(
            f"persona {request.persona!r} is unknown; use one of {', '.join(PERSONAS)}"
        )


def policy(request: PolicyRequest) -> str:
    """The reply of the scripted reviewer to one model call (see the module docstring)."""
    _check(request)
    phase = request.phase
    assert phase is not None
    goal_message, turns = _read_conversation(request.messages)
    goal = _parse_goal(goal_message)
    turn = len(turns)
    stem = f"{request.seed}|{request.task_id}|{phase}|{request.persona}"
    rng = random.Random(f"{stem}|{turn}")
    persona = request.persona
    if persona == "stubborn":
        return _render(_stubborn_move(phase, goal, rng), rng)
    if persona == "sloppy" and turn < random.Random(stem).randint(1, 3):
        return _render(_sloppy_move(phase, rng), rng)
    if persona == "malformed" and rng.random() < 0.3:
        return rng.choice(_GARBAGE)
    move = _competent_move(phase, goal, _memory(turns))
    if persona == "verbose":
        return f"{_musing(goal, turns, rng)}\n\n```json\n{_json(move, flat=False)}\n```"
    return _render(move, rng)
