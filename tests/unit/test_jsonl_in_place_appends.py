"""JSONL store: model results and steps written on the loop's thread keep the store's promises.

Model results and steps appended to an existing, cleanly ending log skip the worker thread
(``research-wiki/reference/performance.md`` says why); so do the bytes of a barrier, whose sync
alone runs in a writer thread (design 0219). These tests pin what must not
change because of that: such an append still waits for a write of the same run whose sync is
still in flight, and it still shares the file with barriers without losing or reordering
records.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from _syncs import SyncGate
from polyloop.ports import RunLog
from polyloop.stores import JsonlRunStore
from polyloop.types import (
    Intent,
    IntentKind,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    RunStarted,
)

pytestmark = pytest.mark.unit

RUN = "r1"
STARTED = RunStarted(run_id=RUN, parameter_snapshot={"k": "v"})
INTENT = Intent(
    run_id=RUN,
    kind=IntentKind.MODEL_CALL,
    call_index=0,
    result_id="m0",
    replay_policy=ReplayPolicy.NEVER,
)
RESULT = ModelCallResult(
    run_id=RUN, result_id="m0", reply=ModelReply(call_id=None, content="hi"), failure=None
)


async def test_a_result_waits_for_a_cancelled_intent_still_being_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    path = tmp_path / f"{RUN}.jsonl"
    gate = SyncGate(monkeypatch, path)

    intent = asyncio.create_task(store.write_intent(INTENT))
    assert await asyncio.to_thread(gate.entered.wait, 10)
    intent.cancel()
    with pytest.raises(asyncio.CancelledError):
        await intent
    result = asyncio.create_task(store.write_model_call_result(RESULT))
    await asyncio.sleep(0.05)
    assert not result.done(), "the result must wait for the intent still being synced"
    assert b'"model_call_result"' not in path.read_bytes()
    gate.open()
    await asyncio.wait_for(result, timeout=5)
    assert await store.read_log(RUN) == RunLog(
        started=STARTED, intents=(INTENT,), model_results=(RESULT,)
    )
    raw = path.read_bytes()
    assert raw.index(b'"intent"') < raw.index(b'"model_call_result"')


async def test_appends_after_a_log_edited_to_end_without_newline_cut_the_fragment(
    tmp_path: Path,
) -> None:
    """A log whose last bytes are a fragment (a torn write from another process) is repaired
    by the next result or step too, not only by the next barrier."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    await store.write_intent(INTENT)
    path = tmp_path / f"{RUN}.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"record": "step_comp')
    await store.write_model_call_result(RESULT)
    assert await store.read_log(RUN) == RunLog(
        started=STARTED, intents=(INTENT,), model_results=(RESULT,)
    )
    assert path.read_bytes().endswith(b"\n")
    assert b"step_comp" not in path.read_bytes()


async def test_many_interleaved_runs_keep_every_record_in_order(tmp_path: Path) -> None:
    """Barriers in threads and in-place appends of many runs at once: each run's file holds
    exactly its own records in write order."""
    store = JsonlRunStore(directory=tmp_path)

    async def one_run(index: int) -> None:
        run_id = f"run-{index}"
        await store.write_run_started(RunStarted(run_id=run_id, parameter_snapshot={}))
        for call in range(5):
            await store.write_intent(
                Intent(
                    run_id=run_id,
                    kind=IntentKind.MODEL_CALL,
                    call_index=call,
                    result_id=f"m{call}",
                    replay_policy=ReplayPolicy.SAFE,
                )
            )
            await store.write_model_call_result(
                ModelCallResult(
                    run_id=run_id,
                    result_id=f"m{call}",
                    reply=ModelReply(call_id=None, content=f"{index}:{call}"),
                    failure=None,
                )
            )

    await asyncio.gather(*(one_run(index) for index in range(20)))
    for index in range(20):
        log = await store.read_log(f"run-{index}")
        assert [i.call_index for i in log.intents] == list(range(5))
        assert [r.reply.content for r in log.model_results if r.reply] == [
            f"{index}:{call}" for call in range(5)
        ]
        lines = (tmp_path / f"run-{index}.jsonl").read_bytes().split(b"\n")[:-1]
        kinds = [line.split(b'"record": "', 1)[1].split(b'"', 1)[0] for line in lines]
        assert kinds == [b"run_started"] + [b"intent", b"model_call_result"] * 5
    assert sorted(os.listdir(tmp_path)) == sorted(f"run-{index}.jsonl" for index in range(20))
