"""One agent run against the payments service, SIGKILLed at random moments by the in-doubt kill
test: ``python _payments_child.py DIR RUN_ID MODE PORT``.

``MODE`` picks the tool the run calls ``CALLS`` times before its final answer:

* ``idempotent``: ``charge`` (``POST /charge``, which deduplicates), ``ReplayPolicy.IDEMPOTENT``;
* ``reconciled``: ``transfer`` (``POST /transfer``, which does not), ``ReplayPolicy.NEVER``,
  with a reconciler that asks ``GET /transfers?key=``;
* ``unreconciled``: ``transfer``, ``NEVER``, no reconciler (the test resolves what is in doubt).

Every tool passes ``ctx.idempotency_key`` as the ``Idempotency-Key`` header, and sleeps after
the service answered and before it returns, so that a kill often lands in the in-doubt window
(the service has acted, the log does not know). The run is brought to an end with
``run_or_resume`` on a ``JsonlRunStore`` in ``DIR``. The child prints ``READY`` once it is
about to touch the run, and ``DONE <stop_reason> <unknown_outcome or -> <steps>`` when
``run_or_resume`` returns.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _shared_doubles

from _shared_doubles import PausingModel, TinyParser, killed_run
from polyloop.session import AgentDefinition, RunRequest, run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.tools import Reconciliation, ToolContext, ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy

CALLS = 4
MODES = ("idempotent", "reconciled", "unreconciled")
HTTP_TIMEOUT_SECONDS = 10.0


def tool_of(mode: str) -> str:
    return "charge" if mode == "idempotent" else "transfer"


def amount_of(call: int) -> int:
    return 100 * (call + 1)


def script_for(mode: str) -> list[str]:
    tool = tool_of(mode)
    replies = [
        f"tool:{tool} " + json.dumps({"n": n, "amount_cents": amount_of(n)}) for n in range(CALLS)
    ]
    replies.append("final:paid")
    return replies


def observation_of(entry: Mapping[str, object]) -> str:
    """What a tool reports for a ledger entry; a reconciler reports the very same text."""
    return f"{entry['kind']} {entry['id']} of {entry['amount_cents']} cents (call {entry['call']})"


def registry(mode: str, base_url: str) -> ToolRegistry:
    async def post(path: str, ctx: ToolContext, n: int, amount_cents: int) -> str:
        await asyncio.sleep(random.uniform(0.0, 0.02))
        async with httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT_SECONDS) as client:
            response = await client.post(
                path,
                json={"run_id": ctx.run_id, "call": n, "amount_cents": amount_cents},
                headers={"Idempotency-Key": ctx.idempotency_key},
            )
        response.raise_for_status()
        # The money has moved and the log does not know yet: the in-doubt window.
        await asyncio.sleep(random.uniform(0.1, 0.2))
        return observation_of(response.json())

    async def charge(ctx: ToolContext, n: int, amount_cents: int) -> str:
        """Charge the customer's card (the service deduplicates by Idempotency-Key)."""
        return await post("/charge", ctx, n, amount_cents)

    async def transfer(ctx: ToolContext, n: int, amount_cents: int) -> str:
        """Transfer money out (every call moves money: never run it twice)."""
        return await post("/transfer", ctx, n, amount_cents)

    async def reconcile(ctx: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        async with httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT_SECONDS) as client:
            response = await client.get("/transfers", params={"key": ctx.idempotency_key})
        response.raise_for_status()
        answer = response.json()
        if answer["found"]:
            return Reconciliation.executed(observation_of(answer["transfer"]))
        return Reconciliation.not_executed()

    if mode == "idempotent":
        spec = ToolSpec.from_function(charge, replay_policy=ReplayPolicy.IDEMPOTENT)
    elif mode == "reconciled":
        spec = ToolSpec.from_function(
            transfer, replay_policy=ReplayPolicy.NEVER, reconcile=reconcile
        )
    elif mode == "unreconciled":
        spec = ToolSpec.from_function(transfer, replay_policy=ReplayPolicy.NEVER)
    else:
        raise SystemExit(f"unknown mode {mode!r}; one of {MODES}")
    return ToolRegistry([spec])


def build(directory: Path, run_id: str, mode: str, port: int) -> tuple[AgentDefinition, RunRequest]:
    model = PausingModel(script_for(mode), kind="payments-script", pause=0.02)
    tools = registry(mode, f"http://127.0.0.1:{port}")
    return killed_run(
        run_id,
        model,
        TinyParser("payments-parser"),
        JsonlRunStore(directory=directory),
        tools,
        steps=CALLS + 2,
        prompt="pay the bills",
    )


async def main(directory: Path, run_id: str, mode: str, port: int) -> None:
    definition, request = build(directory, run_id, mode, port)
    print("READY", flush=True)
    result = await run_or_resume(definition, request)
    print(
        f"DONE {result.stop_reason.value} {result.unknown_outcome or '-'} {len(result.steps)}",
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])))
