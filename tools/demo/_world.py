"""The demo's environment: a shop with a seeded price list, a notes file and an audit ledger.

The world lives in files under ``<runs-dir>/world/`` so that it outlives a killed process,
exactly like a real environment would:

* ``ledger.jsonl`` gets one line per tool execution (run id, tool, arguments, and the pid of the
  process that executed it). It is written by the *environment*, not by polyloop, which is what
  lets the demo prove afterwards that a replayed lookup ran in two processes and that a note
  was written exactly once.
* ``notes.txt`` is the side effect of ``write_note``: one line per note.

Tool handlers are bound to one run id, so ``registry(run_id)`` builds a fresh registry per run.
Handlers are not part of the parameter snapshot (only names, schemas and policies are), which
is why the killed child process may wrap one in a stall without causing drift.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from polyloop.tools import ToolHandler, ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy

__all__ = ["ITEMS", "Handler", "LedgerEntry", "Shop", "World", "format_price"]

ITEMS: Final = ("apple", "pear", "plum", "fig", "kiwi", "mango")
"""What the shop sells, in catalogue order."""

Handler = ToolHandler
"""A tool implementation: ``async def handler(arguments) -> str``."""


def format_price(cents: int) -> str:
    """``235`` -> ``"2.35"``. Prices are kept in cents so sums never show float noise."""
    return f"{cents // 100}.{cents % 100:02d}"


@dataclass(frozen=True, slots=True)
class Shop:
    """The price list. The same seed always gives the same prices."""

    seed: int
    prices: Mapping[str, int]

    @classmethod
    def from_seed(cls, seed: int) -> Shop:
        rng = random.Random(seed)
        return cls(seed=seed, prices={item: rng.randint(40, 480) for item in ITEMS})

    def pick_two(self, salt: int) -> tuple[str, str]:
        """Two different items, chosen by the seed and ``salt`` (one salt per scenario)."""
        first, second = random.Random(self.seed * 1000 + salt).sample(ITEMS, 2)
        return first, second

    def pick_one(self, salt: int) -> str:
        return random.Random(self.seed * 1000 + salt).choice(ITEMS)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    run_id: str
    tool: str
    arguments: Mapping[str, object]
    pid: int


_SCHEMAS: Final[Mapping[str, Mapping[str, object]]] = {
    "lookup": {
        "type": "object",
        "properties": {"item": {"type": "string", "description": "an item name, e.g. pear"}},
        "required": ["item"],
        "additionalProperties": False,
    },
    "add": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "write_note": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "submit": {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    },
}


class World:
    """The shop plus its files. One instance per process; safe to share between runs."""

    def __init__(self, directory: Path, shop: Shop) -> None:
        self.directory = directory
        self.shop = shop
        self.ledger_path = directory / "ledger.jsonl"
        self.notes_path = directory / "notes.txt"

    # ---------------------------------------------------------------- files

    def _append(self, path: Path, line: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            # The ledger and the notes must survive the SIGKILL that follows a stalled call.
            os.fsync(handle.fileno())

    async def _record(self, run_id: str, tool: str, arguments: Mapping[str, object]) -> None:
        line = json.dumps(
            {"run_id": run_id, "tool": tool, "arguments": dict(arguments), "pid": os.getpid()},
            sort_keys=True,
        )
        await asyncio.to_thread(self._append, self.ledger_path, line)

    def ledger(self) -> list[LedgerEntry]:
        """Every tool execution so far, in order (empty before the first one)."""
        if not self.ledger_path.exists():
            return []
        entries = []
        for line in self.ledger_path.read_text(encoding="utf-8").splitlines():
            data = json.loads(line)
            entries.append(
                LedgerEntry(
                    run_id=data["run_id"],
                    tool=data["tool"],
                    arguments=data["arguments"],
                    pid=data["pid"],
                )
            )
        return entries

    def notes(self) -> list[str]:
        if not self.notes_path.exists():
            return []
        return self.notes_path.read_text(encoding="utf-8").splitlines()

    def submission(self, run_id: str) -> str | None:
        """The answer ``run_id`` submitted last, or ``None`` if it never submitted."""
        answers = [
            str(entry.arguments["answer"])
            for entry in self.ledger()
            if entry.run_id == run_id and entry.tool == "submit"
        ]
        return answers[-1] if answers else None

    # ---------------------------------------------------------------- tools

    def handlers(self, run_id: str) -> dict[str, Handler]:
        """The four tool implementations, bound to ``run_id``."""

        async def lookup(arguments: Mapping[str, object]) -> str:
            await self._record(run_id, "lookup", arguments)
            item = str(arguments["item"]).strip().lower()
            cents = self.shop.prices.get(item)
            if cents is None:
                # An ordinary failure of the action: the model sees this text and can retry.
                raise LookupError(f"the shop has no {item!r}; it sells {', '.join(ITEMS)}")
            return f"{item} costs {format_price(cents)}"

        async def add(arguments: Mapping[str, object]) -> str:
            await self._record(run_id, "add", arguments)
            a, b = arguments["a"], arguments["b"]
            # The registry validated both as JSON numbers before this handler was called.
            assert isinstance(a, int | float)
            assert isinstance(b, int | float)
            return f"{a} + {b} = {a + b:.2f}"

        async def write_note(arguments: Mapping[str, object]) -> str:
            await self._record(run_id, "write_note", arguments)
            await asyncio.to_thread(self._append, self.notes_path, f"{run_id}: {arguments['text']}")
            return "note saved"

        async def submit(arguments: Mapping[str, object]) -> str:
            await self._record(run_id, "submit", arguments)
            return f"submitted {arguments['answer']!r}"

        return {"lookup": lookup, "add": add, "write_note": write_note, "submit": submit}

    def registry(
        self, run_id: str, *, wrap: Callable[[str, Handler], Handler] | None = None
    ) -> ToolRegistry:
        """The shop's tools for one run. ``wrap(name, handler)`` may replace a handler (the
        killed child uses it to stall one call); it never changes the model-visible schema."""
        handlers = self.handlers(run_id)
        if wrap is not None:
            handlers = {name: wrap(name, handler) for name, handler in handlers.items()}
        return ToolRegistry(
            [
                ToolSpec(
                    name="lookup",
                    description="Look up the price of one item in the shop.",
                    parameters=_SCHEMAS["lookup"],
                    handler=handlers["lookup"],
                    replay_policy=ReplayPolicy.SAFE,  # read-only: repeating it is harmless
                ),
                ToolSpec(
                    name="add",
                    description="Add two numbers; the sum is rounded to two decimals.",
                    parameters=_SCHEMAS["add"],
                    handler=handlers["add"],
                    replay_policy=ReplayPolicy.SAFE,
                ),
                ToolSpec(
                    name="write_note",
                    description="Append one line to the shared notes file.",
                    parameters=_SCHEMAS["write_note"],
                    handler=handlers["write_note"],
                    replay_policy=ReplayPolicy.NEVER,  # a second call writes a second line
                ),
                ToolSpec(
                    name="submit",
                    description="Submit the final answer of the task; this ends the run.",
                    parameters=_SCHEMAS["submit"],
                    handler=handlers["submit"],
                    replay_policy=ReplayPolicy.NEVER,
                    completes_run=True,
                ),
            ]
        )
