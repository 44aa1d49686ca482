"""Prompt assembly: bytes handed to the model per step, and whether each prompt extends the last.

``python -m tools.bench.prompt_assembly [--quick] [--json-out PATH]``

A run of N steps on ``VolatileRunStore`` with a model that keeps every ``ModelCall``. Per call
the prompt's size is the UTF-8 bytes of every text block of every message. Reported:

* ``prompt_bytes_first`` / ``prompt_bytes_last`` and the mean over all calls: what a provider
  receives (the prompt grows by one assistant and one observation message per step);
* ``appended_bytes_per_step``: the mean growth from one call to the next, i.e. what the library
  had to build new for a step (the rest is carried over);
* ``prefix_reuse_pct``: the share of calls n+1 whose messages start with exactly the messages of
  call n (equal values). This is the property provider prefix caches need; it should be 100 %;
* ``shared_objects_pct``: the share of calls n+1 whose leading messages are the *same objects*
  as call n's, i.e. the library appended to its prompt instead of rebuilding it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from polyloop.ports import ModelCall
from polyloop.session import run
from polyloop.stores import VolatileRunStore
from polyloop.types import StopReason
from tools.bench._common import (
    NoopModel,
    Workload,
    argument_parser,
    print_table,
    results_envelope,
    write_json,
)

NAME = "prompt_assembly"
SIZES = (10, 50, 200, 1000)
QUICK_SIZES = (5, 20)


def prompt_bytes(call: ModelCall) -> int:
    return sum(len(block.text.encode("utf-8")) for m in call.messages for block in m.content)


def analyse(calls: Sequence[ModelCall]) -> dict[str, object]:
    sizes = [prompt_bytes(call) for call in calls]
    pairs = list(itertools.pairwise(calls))
    extends = sum(
        1 for before, after in pairs if after.messages[: len(before.messages)] == before.messages
    )
    shared = sum(
        1
        for before, after in pairs
        if len(after.messages) >= len(before.messages)
        and all(a is b for a, b in zip(before.messages, after.messages, strict=False))
    )
    growth = [after - before for before, after in itertools.pairwise(sizes)]
    return {
        "steps": len(calls),
        "messages_first": len(calls[0].messages),
        "messages_last": len(calls[-1].messages),
        "prompt_bytes_first": sizes[0],
        "prompt_bytes_last": sizes[-1],
        "prompt_bytes_mean": sum(sizes) / len(sizes),
        "prompt_bytes_total": sum(sizes),
        "appended_bytes_per_step": sum(growth) / len(growth) if growth else 0.0,
        "prefix_reuse_pct": 100.0 * extends / len(pairs) if pairs else 100.0,
        "shared_objects_pct": 100.0 * shared / len(pairs) if pairs else 100.0,
    }


async def measure(sizes: Sequence[int]) -> list[dict[str, object]]:
    workload = Workload.build()
    rows = []
    for steps in sizes:
        model = NoopModel(capture=True)
        result = await run(
            workload.definition(VolatileRunStore(), model), workload.request(f"p{steps}", steps)
        )
        if result.stop_reason is not StopReason.STEP_BUDGET:
            raise RuntimeError(f"the bench run ended wrongly: {result.stop_reason}")
        rows.append(analyse(model.calls))
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argument_parser(NAME, "Bytes assembled per step and prefix reuse.")
    args = parser.parse_args(argv)
    rows = asyncio.run(measure(QUICK_SIZES if args.quick else SIZES))
    results = results_envelope(NAME, argv, quick=args.quick, rows=rows)
    print_table(
        "prompt assembly (bytes are UTF-8 text of all message blocks handed to the model)",
        ["N", "first B", "last B", "mean B", "appended B/step", "prefix reuse %", "shared objs %"],
        [
            [
                row["steps"],
                row["prompt_bytes_first"],
                row["prompt_bytes_last"],
                row["prompt_bytes_mean"],
                row["appended_bytes_per_step"],
                row["prefix_reuse_pct"],
                row["shared_objects_pct"],
            ]
            for row in rows
        ],
    )
    write_json(args.json_out, results)
    print(f"\nresults written to {args.json_out}")
    return results


if __name__ == "__main__":
    main()
