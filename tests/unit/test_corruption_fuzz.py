"""Corruption fuzz (issue 15): mutated logs resume like a clean prefix or fail typed.

A clean run's JSONL log is mutated at random (seeded): byte flips, truncation, reordered and
duplicated lines, deep nesting, huge numbers, invalid UTF-8, and edited fields (hand edits that
leave the checksum stale, and "buggy writer" edits that re-seal it). Every mutated log is then
resumed by a fresh process-like agent, under a time limit. The only acceptable outcomes:

* one of the library's typed errors (``PolyloopError``), or
* a result; then the records the store read must be a prefix of the clean log's records (for
  re-sealed edits: as long as one), and the result must equal the result of resuming that clean
  prefix (timings aside).

Never another exception type, never a hang, and never a second execution of the ``NEVER``
tool. The case count, the seed and the outcome mix are printed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import random
import time
import zlib
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, Tally, definition, tool_request

from polyloop.errors import PolyloopError
from polyloop.session import resume, run
from polyloop.stores import JsonlRunStore, decode_lines
from polyloop.types import RunResult, StepRecord

pytestmark = pytest.mark.unit

RUN = "run-1"
SEED = 15
MAX_CASES = 600
TIME_BUDGET_SECONDS = 20.0
RESUME_TIMEOUT_SECONDS = 10.0
SCRIPT = [
    'tool:echo {"text": "a"}',
    'tool:write {"text": "note"}',  # the NEVER tool: executed once, by the clean run
    "what?",
    'tool:echo {"text": "b"}',
    "final:done",
]


def agent_and_request(directory: Path) -> tuple[object, object, Tally]:
    tally = Tally()
    agent = definition(ScriptedModel(SCRIPT), store=JsonlRunStore(directory=directory))
    return agent, tool_request(tally), tally


def timeless(result: RunResult) -> RunResult:
    def strip(step: StepRecord) -> StepRecord:
        return dataclasses.replace(
            step,
            step_wall_ms=0,
            model_ms=None if step.model_ms is None else 0,
            action_ms=None if step.action_ms is None else 0,
        )

    return dataclasses.replace(result, steps=tuple(strip(s) for s in result.steps))


def prepare(directory: Path, content: bytes) -> None:
    directory.mkdir()
    (directory / f"{RUN}.jsonl").write_bytes(content)


async def outcome_of(directory: Path, content: bytes) -> tuple[str, object, Tally]:
    prepare(directory, content)
    agent, request, tally = agent_and_request(directory)
    try:
        result = await asyncio.wait_for(
            resume(agent, request),  # type: ignore[arg-type]
            RESUME_TIMEOUT_SECONDS,
        )
    except PolyloopError as exc:
        return "typed", type(exc).__name__, tally
    return "result", timeless(result), tally


def sealed(payload: dict[str, object]) -> bytes:
    payload = {k: v for k, v in payload.items() if k != "checksum"}
    body = json.dumps(payload, ensure_ascii=False).encode()
    return body[:-1] + b', "checksum": "%08x"}' % zlib.crc32(body)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


class Mutator:
    def __init__(self, rng: random.Random, lines: list[bytes]) -> None:
        self.rng = rng
        self.lines = lines

    def whole(self, lines: list[bytes]) -> bytes:
        return b"".join(line + b"\n" for line in lines)

    def pick(self) -> int:
        return self.rng.randrange(len(self.lines))

    def edited_payload(self) -> tuple[int, dict[str, object]]:
        index = self.pick()
        payload = json.loads(self.lines[index])
        rng = self.rng
        field = rng.choice(
            [
                "run_id",
                "replay_policy",
                "call_index",
                "result_id",
                "kind",
                "record",
                "step",
                "result",
                "schema_version",
                "reply",
                "parameter_snapshot",
                "checksum",
            ]
        )
        choices: list[object] = [
            "other",
            "safe",
            "never",
            0,
            1,
            3,
            7,
            -1,
            "m1",
            "a1",
            "a9",
            None,
            True,
            1.5,
            "",
            "model_call",
            "action",
            "intent",
            "step_completed",
            "run_finished",
            "1.0",
            "9.0",
            {},
            [],
            {"step_idx": 5},
            "00000000",
        ]
        if field == "step" and isinstance(payload.get("step"), dict):
            step = dict(payload["step"])  # type: ignore[arg-type]
            key = rng.choice(sorted(step))
            step[key] = rng.choice(choices)
            payload["step"] = step
        elif field == "result" and isinstance(payload.get("result"), dict):
            result = dict(payload["result"])  # type: ignore[arg-type]
            result[rng.choice(["stop_reason", "final_answer", "steps"])] = rng.choice(
                [*choices, "cancelled", "final_answer", "step_budget"]
            )
            payload["result"] = result
        else:
            payload[field] = rng.choice(choices)
        return index, payload

    def mutate(self) -> tuple[str, bytes, bool]:
        """(kind, bytes, resealed): resealed edits carry a valid checksum on purpose."""
        rng = self.rng
        lines = list(self.lines)
        raw = self.whole(lines)
        kind = rng.choice(
            [
                "flip",
                "truncate",
                "swap",
                "duplicate",
                "drop",
                "deep",
                "huge",
                "utf8",
                "hand-edit",
                "sealed-edit",
                "sealed-deep",
                "sealed-huge",
                "blank",
            ]
        )
        if kind == "flip":
            data = bytearray(raw)
            for _ in range(rng.choice([1, 1, 2, 8])):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            return kind, bytes(data), False
        if kind == "truncate":
            return kind, raw[: rng.randrange(len(raw) + 1)], False
        if kind == "swap":
            i, j = self.pick(), self.pick()
            lines[i], lines[j] = lines[j], lines[i]
            return kind, self.whole(lines), False
        if kind == "duplicate":
            i = self.pick()
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
            return kind, self.whole(lines), False
        if kind == "drop":
            del lines[self.pick()]
            return kind, self.whole(lines), False
        if kind == "blank":
            lines.insert(rng.randrange(len(lines) + 1), b"  \t")
            return kind, self.whole(lines), False
        if kind in ("deep", "huge"):
            i = self.pick()
            value = deep(rng.choice([50, 990, 5_000])) if kind == "deep" else "9" * 5_000
            lines[i] = lines[i][:-1] + b', "x": ' + value.encode() + b"}"
            return kind, self.whole(lines), False
        if kind == "utf8":
            data = bytearray(raw)
            at = rng.randrange(len(data))
            data[at:at] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xfe\xfe"])
            return kind, bytes(data), False
        if kind in ("sealed-deep", "sealed-huge"):
            i = self.pick()
            text = sealed(json.loads(lines[i]))
            value = deep(rng.choice([990, 5_000])) if kind == "sealed-deep" else "7" * 5_000
            body = text[: text.rindex(b', "checksum"')] + b', "x": ' + value.encode() + b"}"
            lines[i] = body[:-1] + b', "checksum": "%08x"}' % zlib.crc32(body)
            return kind, self.whole(lines), True
        index, payload = self.edited_payload()
        if kind == "hand-edit":
            lines[index] = json.dumps(payload, ensure_ascii=False).encode()
            return kind, self.whole(lines), False
        lines[index] = sealed(payload)
        return kind, self.whole(lines), True


async def test_mutated_logs_resume_like_a_clean_prefix_or_fail_typed(tmp_path: Path) -> None:
    clean_dir = tmp_path / "clean"
    agent, request, tally = agent_and_request(clean_dir)
    await run(agent, request)  # type: ignore[arg-type]
    assert tally.runs.get("write") == 1
    raw = (clean_dir / f"{RUN}.jsonl").read_bytes()
    lines = raw.split(b"\n")[:-1]
    clean_records = [entry.record for entry in decode_lines(raw, run_id=RUN)]
    write_step = 1  # SCRIPT index of the NEVER tool

    prefix_outcomes: dict[int, tuple[str, object]] = {}

    async def clean_prefix(k: int) -> tuple[str, object]:
        if k not in prefix_outcomes:
            content = b"".join(line + b"\n" for line in lines[:k])
            kind, value, _ = await outcome_of(tmp_path / f"prefix-{k}", content)
            prefix_outcomes[k] = (kind, value)
        return prefix_outcomes[k]

    rng = random.Random(SEED)
    mix: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    cases = 0
    while cases < MAX_CASES and time.monotonic() - started < TIME_BUDGET_SECONDS:
        cases += 1
        # Often mutate a crash prefix rather than the finished log, so that dangling intents
        # (the NEVER tool's among them) get edited, duplicated and reordered too.
        base = lines[: rng.randrange(1, len(lines) + 1)] if rng.random() < 0.5 else lines
        kind, content, resealed = Mutator(rng, base).mutate()
        where = f"seed {SEED} case {cases} ({kind})"
        try:
            read = decode_lines(content, run_id=RUN)
        except PolyloopError:
            read = None
        try:
            outcome, value, tally = await outcome_of(tmp_path / f"case-{cases}", content)
        except TimeoutError:
            pytest.fail(f"{where}: resume hung for {RESUME_TIMEOUT_SECONDS} s")
        except Exception as exc:
            pytest.fail(f"{where}: resume raised {type(exc).__name__}: {exc}")
        had_write_intent = read is not None and any(
            getattr(entry.record, "result_id", None) == f"a{write_step}"
            and type(entry.record).__name__ == "Intent"
            for entry in read
        )
        if had_write_intent:
            assert tally.runs.get("write", 0) == 0, f"{where}: the NEVER tool ran twice"
        mix[f"{kind}:{outcome}"] += 1
        if outcome == "typed":
            continue
        assert read is not None, f"{where}: resume read a log that does not decode"
        records = [entry.record for entry in read]
        k = len(records)
        if not resealed:
            assert records == clean_records[:k], f"{where}: a changed log was accepted"
        assert (outcome, value) == await clean_prefix(k), (
            f"{where}: the resume differs from a clean resume of the first {k} records"
        )
    accepted = sum(n for key, n in mix.items() if key.endswith(":result"))
    print(
        f"\ncorruption fuzz: seed {SEED}, {cases} mutated logs in "
        f"{time.monotonic() - started:.1f} s; {accepted} resumed like a clean prefix, "
        f"{cases - accepted} refused with a typed error; NEVER doubles 0; "
        f"mix {dict(sorted(mix.items()))}"
    )
    assert cases >= 100, "the time budget allowed too few cases to mean anything"
    assert accepted > 0
    assert cases - accepted > 0
