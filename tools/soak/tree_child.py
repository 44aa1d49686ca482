"""One attempt at a tree of runs, for the tree kill storm to SIGKILL (design 0245).

``python -m tools.soak.tree_child DIR ROOT_ID ATTEMPT`` prints ``READY`` once imported, then
brings the tree ``ROOT_ID`` (``tools.soak.trees``) to its end with ``run_or_resume`` of its
root in the JSONL store ``DIR/runs`` and prints ``DONE <stop reason>``. Every tool execution is
on ``DIR/ledger.txt`` and every model call on ``DIR/calls.txt`` (``<attempt> <run id> <call
index>``), both fsynced before they return, so the storm can count what ran, and when.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from polyloop.ports import ModelCall
from polyloop.session import run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.types import ModelReply
from tools.soak.trees import Ledger, Tree, TreeModel

PAUSE = 0.01
"""Seconds each model call and tool execution may pause (at random), so a kill lands
anywhere in a step."""


class CountedModel(TreeModel):
    """``TreeModel`` that puts every call on ``calls.txt`` before answering it."""

    def __init__(self, calls: Path, attempt: str) -> None:
        super().__init__(pause=PAUSE)
        self.calls_file = calls
        self.attempt = attempt

    def _append(self, call: ModelCall) -> None:
        with self.calls_file.open("a", encoding="utf-8") as handle:
            handle.write(f"{self.attempt} {call.run_id} {call.call_index}\n")
            handle.flush()
            os.fsync(handle.fileno())

    async def call(self, call: ModelCall) -> ModelReply:
        await asyncio.to_thread(self._append, call)
        return await super().call(call)


async def main(directory: Path, root: str, attempt: str) -> None:
    store = JsonlRunStore(directory=directory / "runs")
    model = CountedModel(directory / "calls.txt", attempt)
    tree = Tree(model, store, Ledger(directory / "ledger.txt", pause=PAUSE), steps=40)
    print("READY", flush=True)
    result = await run_or_resume(tree.definition, tree.request(root))
    print(f"DONE {result.stop_reason.value}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
