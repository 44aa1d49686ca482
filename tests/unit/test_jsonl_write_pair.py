"""JSONL store: ``write_pair`` is the two writes in order, in one file write (design 0214, third
pass).

The session hands a writer that has ``write_pair`` a model call's result together with the
step's next record (design 0212). For the JSONL store that is one open, the two lines in one
write and one ``fsync`` when either is a barrier. These tests pin that it changes nothing
else: the bytes are the two writes' bytes, every state a crash can leave is one the two
writes in order could leave (and the next write cuts its torn tail as before), the lease is
checked once and refuses both, and a failure names the run, both records and the file.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from _syncs import SyncRecorder
from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    RunLeaseLostError,
    StoreUnavailableError,
)
from polyloop.ports import RunLog
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl as jsonl_module
from polyloop.stores._records import encode_line
from polyloop.testing import RecordFactory
from polyloop.types import Intent, StepCompleted

pytestmark = pytest.mark.unit

RUN = "r1"
records = RecordFactory()
STARTED = records.run_started(run_id=RUN, parameter_snapshot={"k": "v"})
MODEL_INTENT = records.model_call_intent(run_id=RUN, call_index=0, result_id="m0")
RESULT = records.model_call_result(run_id=RUN, result_id="m0")
ACTION_INTENT = records.action_intent(run_id=RUN, call_index=0, result_id="a0")
STEP = records.step_completed(
    run_id=RUN, result_id=None, action_outcome=None, step=records.step(parse_ok=False)
)
NEXT_INTENT = records.model_call_intent(run_id=RUN, call_index=1, result_id="m1")


def _counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[object]:
    """Wrap ``owner.name``; the returned list gets the first argument of every call."""
    calls: list[object] = []
    real = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[0] if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def _started(directory: Path) -> JsonlRunStore:
    store = JsonlRunStore(directory=directory)
    await store.write_run_started(STARTED)
    await store.write_intent(MODEL_INTENT)
    return store


def _log_bytes(directory: Path) -> bytes:
    return (directory / f"{RUN}.jsonl").read_bytes()


async def test_a_pair_with_a_barrier_is_the_two_writes_bytes_in_one_synced_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    apart = await _started(tmp_path / "apart")
    await apart.write_model_call_result(RESULT)
    await apart.write_intent(ACTION_INTENT)

    paired = await _started(tmp_path / "paired")
    writes = _counting(monkeypatch, jsonl_module, "_write_all_bytes")
    syncs = SyncRecorder(monkeypatch)
    opens = _counting(monkeypatch, os, "open")
    await paired.write_pair(RESULT, ACTION_INTENT)

    assert _log_bytes(tmp_path / "paired") == _log_bytes(tmp_path / "apart")
    assert (len(opens), len(writes), syncs.kinds()) == (1, 1, ["file"])
    assert await paired.read_log(RUN) == RunLog(
        started=STARTED, intents=(MODEL_INTENT, ACTION_INTENT), model_results=(RESULT,)
    )


async def test_a_pair_without_a_barrier_is_appended_in_place_unsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model result and a final step: no ``fsync``, no hand-off to a writer thread."""
    apart = await _started(tmp_path / "apart")
    await apart.write_model_call_result(RESULT)
    await apart.write_step_completed(STEP)

    paired = await _started(tmp_path / "paired")
    handed_off = _counting(monkeypatch, jsonl_module._WRITERS, "submit")
    syncs = SyncRecorder(monkeypatch)
    writes = _counting(monkeypatch, jsonl_module, "_write_all_bytes")
    await paired.write_pair(RESULT, STEP)

    assert _log_bytes(tmp_path / "paired") == _log_bytes(tmp_path / "apart")
    assert (len(handed_off), syncs.kinds(), len(writes)) == (0, [], 1)


NOT_A_PAIR = [
    (STARTED, MODEL_INTENT, PolyloopTypeError, "other than RunStarted"),
    (RESULT, STARTED, PolyloopTypeError, "by write_run_started), got RunStarted"),
    (RESULT, "not a record", PolyloopTypeError, "got str"),
    (
        RESULT,
        records.action_intent(run_id="other", call_index=0, result_id="a0"),
        PolyloopValueError,
        "both records must belong to one run, got run ids 'r1' and 'other'",
    ),
]
"""Pairs ``write_pair`` refuses (``first``, ``second``, the error, words of its text); the
volatile store's tests use them too."""


@pytest.mark.parametrize(("first", "second", "error", "words"), NOT_A_PAIR)
async def test_a_pair_that_is_not_two_records_of_one_run_is_refused_and_writes_nothing(
    tmp_path: Path, first: object, second: object, error: type[Exception], words: str
) -> None:
    store = await _started(tmp_path)
    before = _log_bytes(tmp_path)
    with pytest.raises(error, match=r"^JsonlRunStore\.write_pair: ") as caught:
        await store.write_pair(first, second)  # type: ignore[arg-type]
    assert words in str(caught.value)
    assert _log_bytes(tmp_path) == before


def _dies_after(count: int):  # type: ignore[no-untyped-def]
    """A ``_write_all_bytes`` that writes the first ``count`` bytes, then fails (a crash or a
    full disk half-way through the write)."""

    def write(descriptor: int, data: bytes) -> None:
        os.write(descriptor, data[:count])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return write


@pytest.mark.parametrize(("second", "tag"), [(ACTION_INTENT, "intent"), (STEP, "step_completed")])
async def test_every_state_a_torn_pair_leaves_is_one_the_two_writes_could_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: Intent | StepCompleted, tag: str
) -> None:
    """Cut the pair's bytes at every boundary and on a stride in between: the log reads as
    nothing of the pair (the result torn) or the result alone (the second record torn), the
    error names both records and the file, and the next write cuts the torn tail and lands
    right after what counts."""
    first_length = len(encode_line(RESULT, type(RESULT), "test"))
    total = first_length + len(encode_line(second, type(second), "test"))
    cuts = sorted({0, 1, first_length - 1, first_length, first_length + 1, total - 1})
    cuts = sorted(set(cuts) | set(range(0, total, 23)))
    for cut in cuts:
        directory = tmp_path / f"cut-{cut}"
        store = await _started(directory)
        monkeypatch.setattr(jsonl_module, "_write_all_bytes", _dies_after(cut))
        with pytest.raises(StoreUnavailableError) as caught:
            await store.write_pair(RESULT, second)
        monkeypatch.undo()
        assert caught.value.record == f"model_call_result and {tag}"
        assert caught.value.path == str(directory / f"{RUN}.jsonl")
        kept = (RESULT,) if cut >= first_length else ()
        log = await store.read_log(RUN)
        assert log == RunLog(started=STARTED, intents=(MODEL_INTENT,), model_results=kept), cut

        await store.write_intent(NEXT_INTENT)  # cuts the torn tail, then appends
        log = await store.read_log(RUN)
        assert log.intents == (MODEL_INTENT, NEXT_INTENT), cut
        assert log.model_results == kept, cut
        assert _log_bytes(directory).endswith(b"\n")


async def test_a_pair_through_a_lease_is_fenced_once_and_refused_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    lease = await store.acquire_lease(RUN)
    await lease.write_run_started(STARTED)
    await lease.write_intent(MODEL_INTENT)
    fences = _counting(monkeypatch, JsonlRunStore, "_fence")
    await lease.write_pair(RESULT, ACTION_INTENT)
    assert len(fences) == 1
    assert (await store.read_log(RUN)).intents == (MODEL_INTENT, ACTION_INTENT)

    other = records.action_intent(run_id="other", call_index=0, result_id="a0")
    with pytest.raises(PolyloopValueError, match=r"^JsonlRunLease\.write_pair: "):
        await lease.write_pair(records.model_call_result(run_id="other", result_id="m0"), other)

    before = _log_bytes(tmp_path)
    lock_file = tmp_path / jsonl_module.LEASE_DIRECTORY / f"{RUN}.lock"
    lock_file.unlink()
    lock_file.write_text("1\n")  # replaced: someone else may lock the new file
    with pytest.raises(RunLeaseLostError, match="removed or replaced"):
        await lease.write_pair(RESULT, NEXT_INTENT)
    await lease.release()
    with pytest.raises(RunLeaseLostError, match="released"):
        await lease.write_pair(RESULT, NEXT_INTENT)
    assert _log_bytes(tmp_path) == before
