"""Both shipped run stores: what the contract suite cannot check.

The shipped ``RunStoreContract`` checks each store on its own. This file covers the rest: the
JSONL file format and how torn and corrupt lines count, where ``fsync`` happens, crash atomicity
through the store's fault-injection point, concurrency (no interleaving, no leaking, exclusive
start under races, cancellation during a write), the volatile store's aliasing immunity, and
parity: both stores must give identical logs and identical errors for identical writes.

Decisions pinned here: research-wiki/design/0020-jsonl-durability-and-torn-lines.md and
0022-store-write-discipline.md; the format is research-wiki/reference/log-format.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _syncs import SyncGate, SyncRecorder
from polyloop.errors import LogChecksumError
from polyloop.ports import RunLog, RunStore, SettlingRunStore
from polyloop.serialization import SCHEMA_VERSION, DecodeError
from polyloop.session import run
from polyloop.stores import RECORD_KEY, JsonlRunStore, VolatileRunStore
from polyloop.stores import _jsonl as jsonl_module
from polyloop.testing import RecordFactory
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    ApprovalRequest,
    Intent,
    IntentKind,
    ModelCallResult,
    ReplayPolicy,
    RunFinished,
    RunResult,
    RunStarted,
    Settlement,
    SettlementVerdict,
    StepCompleted,
    StepRecord,
    StopReason,
)

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
NON_ASCII = (
    "Gr\u00fc\u00dfe \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \U0001f389 a\u2028b\x85c"
)

# --------------------------------------------------------------------------- records


RECORDS = RecordFactory()


def started(run_id: str = "r1", snapshot: dict[str, str] | None = None) -> RunStarted:
    return RECORDS.run_started(run_id=run_id, parameter_snapshot=snapshot or {"model": "m-1"})


def model_intent(run_id: str = "r1", index: int = 0) -> Intent:
    return RECORDS.model_call_intent(
        run_id=run_id, call_index=index, result_id=f"m{index}", replay_policy=ReplayPolicy.SAFE
    )


def action_intent(run_id: str = "r1", index: int = 0) -> Intent:
    return RECORDS.action_intent(run_id=run_id, call_index=index, result_id=f"a{index}")


def model_result(run_id: str = "r1", index: int = 0, content: str = "act()") -> ModelCallResult:
    reply = RECORDS.reply(call_id=f"call-{index}", content=content)
    return RECORDS.model_call_result(run_id=run_id, result_id=f"m{index}", reply=reply)


def failed_model_result(run_id: str = "r1", index: int = 0) -> ModelCallResult:
    return RECORDS.model_call_result(
        run_id=run_id, result_id=f"m{index}", failure="TimeoutError: no answer"
    )


def step_record(index: int = 0, *, action: bool = True, observation: str = "ok") -> StepRecord:
    """An executed step, or (``action=False``) a parse failure, observing ``observation``."""
    record = RECORDS.step(step_idx=index, parse_ok=action)
    return dataclasses.replace(record, observation=observation)


def step(run_id: str = "r1", index: int = 0, *, observation: str = "ok") -> StepCompleted:
    return RECORDS.step_completed(
        run_id=run_id,
        result_id=f"a{index}",
        action_outcome=dataclasses.replace(RECORDS.outcome(), observation=observation),
        step=step_record(index, observation=observation),
    )


def step_without_action(run_id: str = "r1", index: int = 0) -> StepCompleted:
    return RECORDS.step_completed(
        run_id=run_id, result_id=None, action_outcome=None, step=step_record(index, action=False)
    )


def finished(run_id: str = "r1", answer: str = "42") -> RunFinished:
    result = RECORDS.result(
        run_id=run_id,
        stop_reason=StopReason.FINAL_ANSWER,
        final_answer=answer,
        steps=(step_record(0),),
    )
    return RECORDS.run_finished(run_id=run_id, result=result)


def bad_intent(run_id: str = "r1") -> Intent:
    """An Intent whose call_index is a str: impossible to construct normally."""
    record = object.__new__(Intent)
    for name, value in {
        "run_id": run_id,
        "kind": IntentKind.ACTION,
        "call_index": "zero",
        "result_id": "a0",
        "replay_policy": ReplayPolicy.NEVER,
        "idempotency_key": None,
    }.items():
        object.__setattr__(record, name, value)
    return record


def settlement(
    run_id: str = "r1", index: int = 0, verdict: SettlementVerdict = SettlementVerdict.EXECUTED
) -> Settlement:
    return RECORDS.settlement(run_id=run_id, result_id=f"a{index}", verdict=verdict)


def approval_request(run_id: str = "r1", index: int = 0) -> ApprovalRequest:
    return RECORDS.approval_request(run_id=run_id, step_idx=index)


Record = (
    RunStarted
    | Intent
    | ModelCallResult
    | StepCompleted
    | RunFinished
    | Settlement
    | ApprovalRequest
)


async def write(store: RunStore, record: Record) -> None:
    """Write ``record`` through the method of its kind."""
    if isinstance(record, RunStarted):
        await store.write_run_started(record)
    elif isinstance(record, Intent):
        await store.write_intent(record)
    elif isinstance(record, ModelCallResult):
        await store.write_model_call_result(record)
    elif isinstance(record, StepCompleted):
        await store.write_step_completed(record)
    elif isinstance(record, Settlement):
        assert isinstance(store, SettlingRunStore)
        await store.write_settlement(record)
    elif isinstance(record, ApprovalRequest):
        assert isinstance(store, SettlingRunStore)
        await store.write_approval_request(record)
    else:
        await store.write_run_finished(record)


def full_run(run_id: str = "r1", steps: int = 2) -> list[Record]:
    records: list[Record] = [started(run_id)]
    for index in range(steps):
        records += [
            model_intent(run_id, 2 * index),
            model_result(run_id, 2 * index),
            action_intent(run_id, 2 * index + 1),
            step(run_id, 2 * index + 1),
        ]
    records += [model_intent(run_id, 99), failed_model_result(run_id, 99)]
    records += [step_without_action(run_id, 99), finished(run_id)]
    return records


def expected_log(records: list[Record]) -> RunLog:
    return RunLog(
        started=next((r for r in records if isinstance(r, RunStarted)), None),
        intents=tuple(r for r in records if isinstance(r, Intent)),
        model_results=tuple(r for r in records if isinstance(r, ModelCallResult)),
        steps=tuple(r for r in records if isinstance(r, StepCompleted)),
        finished=next((r for r in records if isinstance(r, RunFinished)), None),
    )


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["jsonl", "volatile"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> JsonlRunStore | VolatileRunStore:
    if request.param == "jsonl":
        return JsonlRunStore(directory=tmp_path / "logs")
    return VolatileRunStore()


def log_path(directory: Path, run_id: str = "r1") -> Path:
    return directory / f"{run_id}.jsonl"


def files_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def stored_lines(directory: Path, run_id: str = "r1") -> list[dict[str, object]]:
    raw = log_path(directory, run_id).read_bytes()
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode("utf-8").split("\n")[:-1]]


# =========================================================================== both stores


def test_both_stores_satisfy_the_run_store_protocol(tmp_path: Path) -> None:
    assert isinstance(JsonlRunStore(directory=tmp_path), RunStore)
    assert isinstance(VolatileRunStore(), RunStore)


def test_parameters_report_only_the_kind(tmp_path: Path) -> None:
    assert JsonlRunStore(directory=tmp_path / "somewhere").parameters() == {"kind": "jsonl"}
    assert VolatileRunStore().parameters() == {"kind": "volatile"}


async def test_every_record_kind_reads_back_in_write_order(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    records = full_run()
    for record in records:
        await write(store, record)
    log = await store.read_log("r1")
    assert log == expected_log(records)
    assert [i.result_id for i in log.intents] == ["m0", "a1", "m2", "a3", "m99"]


async def test_an_unknown_run_reads_as_an_empty_log(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    log = await store.read_log("never-written")
    assert log == RunLog()
    assert log.is_empty


async def test_odd_logs_are_stored_as_written_not_repaired(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    orphan = model_result(index=7)
    await store.write_model_call_result(orphan)
    await store.write_step_completed(step_without_action())
    log = await store.read_log("r1")
    assert log == RunLog(model_results=(orphan,), steps=(step_without_action(),))


async def test_two_runs_do_not_leak_into_each_other(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    for record in full_run("run-a"):
        await write(store, record)
    await store.write_run_started(started("run-b", {"model": "other"}))
    await store.write_intent(model_intent("run-b", 0))
    assert await store.read_log("run-a") == expected_log(full_run("run-a"))
    assert await store.read_log("run-b") == RunLog(
        started=started("run-b", {"model": "other"}), intents=(model_intent("run-b", 0),)
    )


async def test_a_hundred_concurrent_runs_on_one_store_stay_apart(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    async def one_run(number: int) -> None:
        for record in full_run(f"run-{number}", steps=1):
            await write(store, record)
            await asyncio.sleep(0)

    await asyncio.gather(*(one_run(number) for number in range(100)))
    logs = await asyncio.gather(*(store.read_log(f"run-{number}") for number in range(100)))
    for number, log in enumerate(logs):
        assert log == expected_log(full_run(f"run-{number}", steps=1))


async def test_concurrent_writers_to_one_run_all_land_whole(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    await store.write_run_started(started())
    intents = [action_intent(index=index) for index in range(12)]
    await asyncio.gather(*(store.write_intent(intent) for intent in intents))
    log = await store.read_log("r1")
    assert sorted(log.intents, key=lambda i: i.call_index) == intents


async def test_a_second_start_of_one_run_id_is_refused(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    await store.write_run_started(started())
    with pytest.raises(FileExistsError, match="r1"):
        await store.write_run_started(started(snapshot={"model": "m-2"}))
    assert (await store.read_log("r1")).started == started()


async def test_a_run_id_with_any_record_cannot_be_started(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    await store.write_intent(model_intent())
    with pytest.raises(FileExistsError):
        await store.write_run_started(started())
    assert await store.read_log("r1") == RunLog(intents=(model_intent(),))


async def test_of_two_racing_starts_exactly_one_wins(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    contenders = [started(snapshot={"who": str(n)}) for n in range(2)]
    outcomes = await asyncio.gather(
        *(store.write_run_started(record) for record in contenders), return_exceptions=True
    )
    winners = [
        record for record, outcome in zip(contenders, outcomes, strict=True) if outcome is None
    ]
    losers = [outcome for outcome in outcomes if outcome is not None]
    assert len(winners) == 1
    assert len(losers) == 1
    assert isinstance(losers[0], FileExistsError)
    assert (await store.read_log("r1")).started == winners[0]


async def test_a_snapshot_changed_after_writing_does_not_change_the_log(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    snapshot = {"model": "m-1"}
    record = RunStarted(run_id="r1", parameter_snapshot=snapshot)
    await store.write_run_started(record)
    snapshot["model"] = "changed"
    first = await store.read_log("r1")
    assert first.started is not None
    assert dict(first.started.parameter_snapshot) == {"model": "m-1"}
    second = await store.read_log("r1")
    assert second == first
    assert second.started is not first.started  # every read decodes afresh


async def test_non_ascii_text_round_trips(store: JsonlRunStore | VolatileRunStore) -> None:
    records: list[Record] = [
        started(snapshot={NON_ASCII: NON_ASCII}),
        model_result(content=NON_ASCII),
        step(observation=NON_ASCII),
        finished(answer=NON_ASCII),
    ]
    for record in records:
        await write(store, record)
    assert await store.read_log("r1") == expected_log(records)


@pytest.mark.parametrize(
    ("method", "thing"),
    [
        ("write_intent", step_record()),
        ("write_run_started", {"run_id": "r1"}),
        ("write_intent", started()),
        ("write_model_call_result", model_intent()),
        ("write_step_completed", finished()),
        ("write_run_finished", step()),
    ],
    ids=["bare-step-record", "dict", "start-as-intent", "intent-as-result", "finish", "step"],
)
async def test_a_record_of_the_wrong_kind_is_refused_and_leaves_nothing(
    tmp_path: Path, method: str, thing: object
) -> None:
    jsonl = JsonlRunStore(directory=tmp_path)
    volatile = VolatileRunStore()
    for store in (jsonl, volatile):
        with pytest.raises(TypeError, match=rf"\.{method} takes a "):
            await getattr(store, method)(thing)
        assert await store.read_log("r1") == RunLog()
        await store.write_run_started(started())  # the run id is still unused
    assert files_in(tmp_path) == ["r1.jsonl"]


async def test_a_bad_field_type_is_accepted_on_write_and_fails_on_read_identically(
    tmp_path: Path,
) -> None:
    errors: list[str] = []
    for store in (JsonlRunStore(directory=tmp_path), VolatileRunStore()):
        await store.write_run_started(started())
        await store.write_intent(bad_intent())
        with pytest.raises(DecodeError) as caught:
            await store.read_log("r1")
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert errors[0] == "log of run 'r1', line 2: Intent.call_index: expected int, got str"


async def test_both_stores_give_identical_logs_for_identical_writes(tmp_path: Path) -> None:
    jsonl = JsonlRunStore(directory=tmp_path)
    volatile = VolatileRunStore()
    sequences = {
        "full": full_run("full", steps=3),
        "odd": [
            model_result("odd", 4),
            action_intent("odd", 1),
            step_without_action("odd"),
            finished("odd"),
        ],
        "text": [started("text", {NON_ASCII: ""}), step("text", observation=NON_ASCII)],
    }
    for records in sequences.values():
        for record in records:
            await write(jsonl, record)
            await write(volatile, record)
    for run_id, records in sequences.items():
        jsonl_log = await jsonl.read_log(run_id)
        assert jsonl_log == await volatile.read_log(run_id)
        assert jsonl_log == expected_log(records)


async def test_reads_between_writes_see_what_the_jsonl_store_sees(tmp_path: Path) -> None:
    """The volatile store keeps records and encodes them at a read (design 0214, third pass):
    reading after every write, a lease's writes included, gives the JSONL store's log each
    time, and the lines it holds at the end are the JSONL file's bytes."""
    jsonl = JsonlRunStore(directory=tmp_path)
    volatile = VolatileRunStore()
    records = full_run("r1", steps=2)
    for record in records[:3]:
        for store in (jsonl, volatile):
            await write(store, record)
        assert await volatile.read_log("r1") == await jsonl.read_log("r1")
    await volatile.read_log("r1")
    for store in (jsonl, volatile):
        lease = await store.acquire_lease("r1")
        for record in records[3:]:
            await write(lease, record)  # type: ignore[arg-type]
        await lease.release()
        assert (await store.read_log("r1")) == expected_log(records)
    assert volatile._lines["r1"] == (tmp_path / "r1.jsonl").read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize(
    ("value", "error"),
    [(object(), TypeError), (float("nan"), ValueError)],
    ids=["object", "nan"],
)
async def test_a_value_json_cannot_hold_is_refused_on_the_write_by_both_stores(
    tmp_path: Path, value: object, error: type[Exception]
) -> None:
    """Only a record forced around its ``__init__`` can hold a value JSON has no form for.
    Both stores refuse it on the write and keep nothing of it: the volatile store keeps a
    record unencoded only when every value in it is one the encoder writes as it is."""
    unencodable = bad_intent()
    object.__setattr__(unencodable, "call_index", value)
    for store in (JsonlRunStore(directory=tmp_path), VolatileRunStore()):
        await store.write_run_started(started())
        with pytest.raises(error):
            await store.write_intent(unencodable)
        log = await store.read_log("r1")
        assert log.intents == ()


async def test_a_mutable_value_forced_into_a_record_does_not_alias_the_volatile_log() -> None:
    """The volatile store is immune to aliasing (design 0022): a record it keeps unencoded
    holds only immutable values, so one forced to hold a list is encoded on the write, and
    changing the list afterwards leaves the log as written (it fails on read, as on the JSONL
    store, with the list's value at the write)."""
    holder = bad_intent()
    items = ["first"]
    object.__setattr__(holder, "result_id", items)
    store = VolatileRunStore()
    await store.write_run_started(started())
    await store.write_intent(holder)
    items.append("changed after the write")
    lines = store._lines["r1"]
    assert isinstance(lines[1], bytes)
    assert b'"result_id": ["first"]' in lines[1]


@settings(max_examples=25, deadline=None)
@given(texts=st.lists(st.text(max_size=40), min_size=1, max_size=4))
async def test_any_text_reads_back_the_same_from_both_stores(texts: list[str]) -> None:
    records: list[Record] = [started(snapshot={t: t for t in texts})]
    records += [step(index=n, observation=t) for n, t in enumerate(texts)]
    with tempfile.TemporaryDirectory() as directory:
        stores = (JsonlRunStore(directory=directory), VolatileRunStore())
        for store in stores:
            for record in records:
                await write(store, record)
        logs = [await store.read_log("r1") for store in stores]
    assert logs[0] == logs[1] == expected_log(records)


# =========================================================================== the JSONL file


async def test_the_file_is_one_tagged_json_object_per_line(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    for record in [started(), model_intent(), model_result(), step(), finished()]:
        await write(store, record)
    assert files_in(tmp_path) == ["r1.jsonl"]
    lines = stored_lines(tmp_path)
    assert [line[RECORD_KEY] for line in lines] == [
        "run_started",
        "intent",
        "model_call_result",
        "step_completed",
        "run_finished",
    ]
    assert RECORD_KEY == "record"
    assert all(line["schema_version"] == SCHEMA_VERSION for line in lines)
    assert all(next(iter(line)) == RECORD_KEY for line in lines)
    assert all(list(line)[-1] == "checksum" for line in lines)
    assert {key: value for key, value in lines[1].items() if key != "checksum"} == {
        "record": "intent",
        "schema_version": SCHEMA_VERSION,
        "run_id": "r1",
        "kind": "model_call",
        "call_index": 0,
        "result_id": "m0",
        "replay_policy": "safe",
        "idempotency_key": None,
    }


async def test_non_ascii_is_written_as_utf8_not_escaped(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_step_completed(step(observation=NON_ASCII))
    raw = log_path(tmp_path).read_bytes()
    assert "Gr\u00fc\u00dfe".encode() in raw
    assert b"\\u00fc" not in raw
    # Only 0x0A ends a line: U+2028 and U+0085 stay inside the record.
    assert raw.count(b"\n") == 1


async def test_the_directory_is_created_when_missing(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path / "a" / "b")
    await store.write_run_started(started())
    assert log_path(tmp_path / "a" / "b").is_file()


@pytest.mark.parametrize(
    "run_id",
    ["../escape", "a/b", ".hidden", "..", "a b", "back\\slash", "\u00fc", "x" * 250, "a\n"],
)
async def test_unsafe_run_ids_are_refused_with_the_reason(tmp_path: Path, run_id: str) -> None:
    store = JsonlRunStore(directory=tmp_path / "logs")
    reason = r"file name|at most"
    with pytest.raises(ValueError, match=reason):
        await store.write_run_started(started(run_id))
    with pytest.raises(ValueError, match=reason):
        await store.write_intent(model_intent(run_id))
    with pytest.raises(ValueError, match=reason):
        await store.read_log(run_id)
    assert files_in(tmp_path) == []


async def test_an_empty_run_id_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="file name"):
        await JsonlRunStore(directory=tmp_path).read_log("")


@pytest.mark.parametrize("run_id", ["a", "A-b_c.1", "x..y", "run.", "0", "x" * 249])
async def test_safe_run_ids_are_accepted(tmp_path: Path, run_id: str) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(started(run_id))
    assert (await store.read_log(run_id)).started == started(run_id)
    assert log_path(tmp_path, run_id).is_file()


def test_the_error_for_an_unsafe_run_id_says_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        jsonl_module.check_run_id("../x")
    message = str(caught.value)
    assert "'../x'" in message
    assert "letters, digits, '.', '_' and '-'" in message
    assert "must not start with '.'" in message


async def test_two_store_instances_racing_to_start_one_run_cannot_both_win(
    tmp_path: Path,
) -> None:
    """Two instances share no lock, like two processes: the exclusive create decides."""
    stores = [JsonlRunStore(directory=tmp_path) for _ in range(4)]
    outcomes = await asyncio.gather(
        *(s.write_run_started(started(snapshot={"who": str(n)})) for n, s in enumerate(stores)),
        return_exceptions=True,
    )
    assert sum(outcome is None for outcome in outcomes) == 1
    assert all(isinstance(o, FileExistsError) for o in outcomes if o is not None)
    assert len(stored_lines(tmp_path)) == 1


# --------------------------------------------------------------------------- reading


async def test_a_missing_file_reads_as_an_empty_log(tmp_path: Path) -> None:
    assert await JsonlRunStore(directory=tmp_path / "nowhere").read_log("r1") == RunLog()


async def _write_two(directory: Path) -> bytes:
    store = JsonlRunStore(directory=directory)
    await store.write_run_started(started())
    await store.write_intent(model_intent())
    return log_path(directory).read_bytes()


def _line_of(record: Record) -> bytes:
    from polyloop.serialization import encode

    tag = {
        RunStarted: "run_started",
        Intent: "intent",
        ModelCallResult: "model_call_result",
        StepCompleted: "step_completed",
        RunFinished: "run_finished",
    }[type(record)]
    body = json.dumps({RECORD_KEY: tag, **encode(record)}, ensure_ascii=False).encode()
    # Since schema 1.3 every line ends with its checksum: the CRC-32 of the line without it.
    return body[:-1] + b', "checksum": "%08x"}\n' % zlib.crc32(body)


@pytest.mark.parametrize(
    "tail",
    [
        _line_of(action_intent())[:25],
        _line_of(action_intent())[:-1],  # a whole JSON object, only the newline is missing
        b"   ",
        b"garbage that is not json",
    ],
    ids=["half-a-line", "whole-object-no-newline", "spaces", "garbage"],
)
async def test_an_unterminated_last_line_is_a_torn_write_and_is_ignored(
    tmp_path: Path, tail: bytes
) -> None:
    await _write_two(tmp_path)
    with log_path(tmp_path).open("ab") as handle:
        handle.write(tail)
    store = JsonlRunStore(directory=tmp_path)
    assert await store.read_log("r1") == RunLog(started=started(), intents=(model_intent(),))


async def test_writing_after_a_torn_tail_cuts_it_off_instead_of_gluing_to_it(
    tmp_path: Path,
) -> None:
    await _write_two(tmp_path)
    with log_path(tmp_path).open("ab") as handle:
        handle.write(_line_of(action_intent())[:-1])
    store = JsonlRunStore(directory=tmp_path)  # a new process after the crash
    await store.write_model_call_result(model_result())
    log = await store.read_log("r1")
    assert log == RunLog(
        started=started(), intents=(model_intent(),), model_results=(model_result(),)
    )
    assert len(stored_lines(tmp_path)) == 3


async def test_writing_after_a_torn_tail_longer_than_one_read_block_cuts_all_of_it(
    tmp_path: Path,
) -> None:
    await _write_two(tmp_path)
    with log_path(tmp_path).open("ab") as handle:
        handle.write(b"x" * (3 * 64 * 1024 + 5))
    store = JsonlRunStore(directory=tmp_path)
    await store.write_intent(action_intent())
    assert (await store.read_log("r1")).intents == (model_intent(), action_intent())


async def test_a_torn_first_line_is_cut_to_an_empty_file(tmp_path: Path) -> None:
    log_path(tmp_path).write_bytes(b'{"record": "run_sta')
    store = JsonlRunStore(directory=tmp_path)
    assert await store.read_log("r1") == RunLog()
    await store.write_intent(model_intent())
    assert await store.read_log("r1") == RunLog(intents=(model_intent(),))


async def test_blank_lines_are_skipped_and_lines_are_counted_physically(tmp_path: Path) -> None:
    log_path(tmp_path).write_bytes(
        b"\n" + _line_of(started()) + b"  \t\n\n" + _line_of(model_intent()) + b"{bad\n"
    )
    with pytest.raises(DecodeError, match=r"^log of run 'r1', line 6: not a readable JSON line"):
        await JsonlRunStore(directory=tmp_path).read_log("r1")
    log_path(tmp_path).write_bytes(
        b"\n" + _line_of(started()) + b"  \t\n\n" + _line_of(model_intent())
    )
    log = await JsonlRunStore(directory=tmp_path).read_log("r1")
    assert log == RunLog(started=started(), intents=(model_intent(),))


def _checksummed(body: bytes) -> bytes:
    """``body`` (a JSON object) with the checksum a 1.3+ line carries as its last member."""
    return body[:-1] + b', "checksum": "%08x"}' % zlib.crc32(body)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", r"line 2: not a readable JSON line \(JSONDecodeError"),
        (b"\xff\xfe{}", r"line 2: not a readable JSON line \(UnicodeDecodeError"),
        (b'["record", "intent"]', r"line 2: expected a JSON object, got list"),
        (b'{"run_id": "r1"}', r"line 2: the 'record' tag is missing"),
        (b'{"record": "checkpoint"}', r"line 2: unknown 'record' tag 'checkpoint'; expected one"),
        (b'{"record": ["intent"]}', r"line 2: unknown 'record' tag \['intent'\]"),
        (
            _checksummed(
                b'{"record": "intent", "schema_version": "%s", "run_id": "r1"}'
                % SCHEMA_VERSION.encode()
            ),
            r"line 2: Intent\.kind: expected one of .* field is missing",
        ),
        (
            b'{"record": "intent", "schema_version": "2.0"}',
            r"line 2: Intent\.schema_version: the payload has major version 2",
        ),
    ],
    ids=[
        "bad-json",
        "not-utf8",
        "array",
        "no-tag",
        "unknown-tag",
        "unhashable-tag",
        "field",
        "major",
    ],
)
async def test_a_corrupt_terminated_middle_line_is_an_error_naming_run_and_line(
    tmp_path: Path, line: bytes, message: str
) -> None:
    log_path(tmp_path).write_bytes(_line_of(started()) + line + b"\n" + _line_of(model_intent()))
    with pytest.raises(DecodeError, match=rf"^log of run 'r1', {message}"):
        await JsonlRunStore(directory=tmp_path).read_log("r1")


async def test_a_hand_edited_file_with_two_finish_records_reads_the_last(tmp_path: Path) -> None:
    log_path(tmp_path).write_bytes(
        _line_of(started()) + _line_of(finished(answer="first")) + _line_of(finished(answer="2"))
    )
    log = await JsonlRunStore(directory=tmp_path).read_log("r1")
    assert log.finished == finished(answer="2")


async def test_the_example_in_the_log_format_reference_is_a_readable_log(tmp_path: Path) -> None:
    page = (REPO_ROOT / "research-wiki" / "reference" / "log-format.md").read_text("utf-8")
    blocks = re.findall(r"```jsonl\n(.*?)```", page, flags=re.DOTALL)
    assert blocks, "the reference page must contain a ```jsonl example block"
    log_path(tmp_path, "demo-run").write_text(blocks[0], encoding="utf-8")
    log = await JsonlRunStore(directory=tmp_path).read_log("demo-run")
    assert log.started is not None
    assert log.finished is not None
    assert len(log.steps) == len(log.finished.result.steps)


# --------------------------------------------------------------------------- durability


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> SyncRecorder:
    """Every sync of the store."""
    return SyncRecorder(monkeypatch)


async def test_creating_the_log_syncs_the_file_and_the_directory_entry(
    tmp_path: Path, fsyncs: SyncRecorder
) -> None:
    directory = tmp_path / "logs"
    store = JsonlRunStore(directory=directory)
    await store.write_run_started(started())
    assert [kind for kind, _ in fsyncs.calls] == ["file", "directory"]
    assert fsyncs.calls[0][1] == log_path(directory).stat().st_ino
    assert fsyncs.calls[1][1] == directory.stat().st_ino


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (model_intent(), ["file"]),
        (action_intent(), ["file"]),
        (model_result(), []),
        (failed_model_result(), []),
        (step(), []),
        (step_without_action(), []),
        (finished(), ["file"]),
        (settlement(), ["file"]),
        (approval_request(), ["file"]),
    ],
    ids=[
        "model-intent",
        "action-intent",
        "result",
        "failed-result",
        "step",
        "bare-step",
        "finish",
        "settlement",
        "approval-request",
    ],
)
async def test_fsync_happens_exactly_at_the_barriers(
    tmp_path: Path, fsyncs: SyncRecorder, record: Record, expected: list[str]
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(started())
    fsyncs.kinds()
    await write(store, record)
    assert fsyncs.kinds() == expected


async def test_a_whole_step_costs_two_fsyncs(tmp_path: Path, fsyncs: SyncRecorder) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(started())
    fsyncs.kinds()
    for record in full_run(steps=1)[1:5]:
        await write(store, record)
    assert fsyncs.kinds() == ["file", "file"]


async def test_a_write_that_creates_the_file_makes_it_durable(
    tmp_path: Path, fsyncs: SyncRecorder
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_model_call_result(model_result())
    assert fsyncs.kinds() == ["file", "directory"]


async def test_a_write_that_dies_half_way_leaves_nothing_of_that_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(started())
    await store.write_intent(action_intent())

    def dies_half_way(descriptor: int, data: bytes) -> None:
        os.write(descriptor, data[: len(data) // 2])
        raise OSError("simulated crash half-way through a write")

    monkeypatch.setattr(jsonl_module, "_write_all_bytes", dies_half_way)
    with pytest.raises(OSError, match="simulated crash"):
        await store.write_step_completed(step())
    monkeypatch.undo()

    restarted = JsonlRunStore(directory=tmp_path)
    assert await restarted.read_log("r1") == RunLog(started=started(), intents=(action_intent(),))
    # The next process can go on writing; the torn bytes never resurface.
    await restarted.write_step_completed(step())
    assert await restarted.read_log("r1") == RunLog(
        started=started(), intents=(action_intent(),), steps=(step(),)
    )


async def test_a_start_that_dies_half_way_leaves_no_log_and_the_id_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Design 0020 (amended): the log's name appears only with its complete first line, so a
    # start that dies half-way neither claims the id nor leaves a file a later start trips on.
    def dies_half_way(descriptor: int, data: bytes) -> None:
        os.write(descriptor, data[:10])
        raise OSError("simulated crash")

    monkeypatch.setattr(jsonl_module, "_write_all_bytes", dies_half_way)
    store = JsonlRunStore(directory=tmp_path)
    with pytest.raises(OSError, match="simulated crash"):
        await store.write_run_started(started())
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [], "neither the log nor the temporary file may remain"
    assert await store.read_log("r1") == RunLog()
    await store.write_run_started(started())
    assert await store.read_log("r1") == RunLog(started=started())
    with pytest.raises(FileExistsError):
        await store.write_run_started(started())


async def test_short_writes_are_continued_until_the_line_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    sizes: list[int] = []

    def at_most_seven_bytes(descriptor: int, data: bytes) -> int:
        written = real_write(descriptor, bytes(data[:7]))
        sizes.append(written)
        return written

    monkeypatch.setattr(os, "write", at_most_seven_bytes)
    store = JsonlRunStore(directory=tmp_path)
    records = [started(), step(observation=NON_ASCII), finished()]
    for record in records:
        await write(store, record)
    monkeypatch.undo()
    assert len(sizes) > 30
    assert await store.read_log("r1") == expected_log(records)


async def test_a_write_that_makes_no_progress_fails_instead_of_spinning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "write", lambda descriptor, data: 0)
    with pytest.raises(OSError, match="wrote nothing"):
        await JsonlRunStore(directory=tmp_path).write_intent(model_intent())


# --------------------------------------------------------------------------- concurrency


async def test_concurrent_chunked_writes_to_one_run_do_not_interleave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each line is written in small pieces with pauses, so without per-run serialisation the
    worker threads would interleave their bytes and the file would not decode."""

    def in_small_pieces(descriptor: int, data: bytes) -> None:
        for start in range(0, len(data), 5):
            os.write(descriptor, data[start : start + 5])
            time.sleep(0.0002)

    monkeypatch.setattr(jsonl_module, "_write_all_bytes", in_small_pieces)
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(started())
    intents = [action_intent(index=index) for index in range(6)]
    results = [model_result(index=index, content="x" * 50) for index in range(6)]
    await asyncio.gather(
        *(store.write_intent(i) for i in intents),
        *(store.write_model_call_result(r) for r in results),
    )
    log = await store.read_log("r1")
    assert len(log.intents) == 6
    assert sorted(log.intents, key=lambda i: i.call_index) == intents
    assert sorted(log.model_results, key=lambda r: r.result_id) == results


async def test_writes_to_different_runs_proceed_in_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow write to one run must not hold up a write to another."""
    gate = threading.Event()
    real = jsonl_module._write_all_bytes

    def slow_for_run_a(descriptor: int, data: bytes) -> None:
        if b'"run_id": "run-a"' in data and not gate.wait(timeout=10):
            raise TimeoutError("the gate was never opened")
        real(descriptor, data)

    monkeypatch.setattr(jsonl_module, "_write_all_bytes", slow_for_run_a)
    store = JsonlRunStore(directory=tmp_path)
    slow = asyncio.create_task(store.write_intent(model_intent("run-a")))
    await asyncio.wait_for(store.write_intent(model_intent("run-b")), timeout=5)
    assert not slow.done()
    gate.set()
    await slow
    assert (await store.read_log("run-a")).intents == (model_intent("run-a"),)


async def test_a_cancelled_write_finishes_before_the_next_write_to_that_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(started())
    gate = SyncGate(monkeypatch, log_path(tmp_path))

    first = asyncio.create_task(store.write_intent(model_intent()))
    assert await asyncio.to_thread(gate.entered.wait, 10)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first  # the caller learns of the cancellation while the sync is in flight
    second = asyncio.create_task(store.write_run_finished(finished()))
    await asyncio.sleep(0.05)
    assert not second.done(), "the next write must wait for the one still being synced"
    assert log_path(tmp_path).read_bytes().count(b"\n") == 2, "the finish is not written yet"
    gate.open()
    await asyncio.wait_for(second, timeout=5)
    log = await store.read_log("r1")
    assert log == RunLog(started=started(), intents=(model_intent(),), finished=finished())


async def test_the_volatile_store_accepts_run_ids_of_any_shape() -> None:
    store = VolatileRunStore()
    for run_id in ("a/b", "../x", ".hidden", "\u00fc"):
        await store.write_run_started(started(run_id))
        assert (await store.read_log(run_id)).started == started(run_id)


@pytest.mark.parametrize("kind", ["jsonl", "volatile"])
async def test_lone_surrogates_round_trip_instead_of_crashing_the_write(
    kind: str, tmp_path: Path
) -> None:
    """Text from the outside world can carry lone surrogates (os.fsdecode of a non-UTF-8 file
    name); refusing them at write time would crash a run after its side effect."""
    store = JsonlRunStore(directory=tmp_path) if kind == "jsonl" else VolatileRunStore()
    text = "file-\udcff.txt and \ud83d"
    result = RunResult(
        run_id="s1", stop_reason=StopReason.FINAL_ANSWER, final_answer=text, steps=()
    )
    await store.write_run_started(RunStarted(run_id="s1", parameter_snapshot={"k": text}))
    await store.write_run_finished(RunFinished(run_id="s1", result=result))
    log = await store.read_log("s1")
    assert log.finished is not None
    assert log.finished.result.final_answer == text
    assert log.started is not None
    assert log.started.parameter_snapshot["k"] == text
    if kind == "jsonl":
        (tmp_path / "s1.jsonl").read_bytes().decode("utf-8")  # the file stays valid UTF-8


# =========================================================================== settlements (1.7)


def test_both_stores_and_their_leases_can_settle(tmp_path: Path) -> None:
    assert isinstance(JsonlRunStore(directory=tmp_path), SettlingRunStore)
    assert isinstance(VolatileRunStore(), SettlingRunStore)


async def test_settlements_read_back_in_write_order_among_the_other_records(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    asked = settlement(index=0, verdict=SettlementVerdict.UNKNOWN)
    done = settlement(index=0)
    records: list[Record] = [started(), model_intent(), model_result(), action_intent()]
    records += [asked, done, step()]
    for record in records:
        await write(store, record)
    log = await store.read_log("r1")
    assert log.settlements == (asked, done)
    assert [entry.record for entry in log.entries] == records
    assert [entry.line for entry in log.entries] == list(range(1, len(records) + 1))
    assert (await store.read_log("r2")).settlements == ()


async def test_a_log_of_settlements_only_is_not_empty(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    await store.write_settlement(settlement())
    log = await store.read_log("r1")
    assert not log.is_empty
    assert log.settlements == (settlement(),)


async def test_a_lease_writes_a_settlement_through_the_fence(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    lease = await store.acquire_lease("r1")
    await lease.write_settlement(settlement())
    with pytest.raises(ValueError, match="belongs to run 'r2'"):
        await lease.write_settlement(settlement(run_id="r2"))
    await lease.release()
    assert (await store.read_log("r1")).settlements == (settlement(),)
    assert (await store.read_log("r2")).is_empty


async def test_a_settlement_passed_to_another_write_method_is_refused(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    with pytest.raises(TypeError, match=r"write_intent takes a Intent record, got Settlement"):
        await store.write_intent(settlement())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"write_settlement takes a Settlement record, got Intent"):
        await store.write_settlement(action_intent())  # type: ignore[arg-type]
    assert (await store.read_log("r1")).is_empty


async def test_the_settlement_line_is_tagged_and_checksummed(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_settlement(settlement())
    (line,) = stored_lines(tmp_path)
    assert list(line) == [
        "record",
        "schema_version",
        "run_id",
        "result_id",
        "verdict",
        "source",
        "by",
        "at",
        "observation",
        "note",
        "digest",
        "checksum",
    ]
    assert line["record"] == "settlement"
    assert line["verdict"] == "executed"
    assert line["digest"] is None


# ====================================================================== approvals (design 0210)


async def test_approval_requests_and_decisions_read_back_in_write_order(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    request = approval_request(index=0)
    decision = RECORDS.approval_decision(request)
    records: list[Record] = [started(), model_intent(), model_result(), request, decision]
    records += [action_intent(), step()]
    for record in records:
        await write(store, record)
    log = await store.read_log("r1")
    assert log.approval_requests == (request,)
    assert log.settlements == (decision,)
    assert [entry.record for entry in log.entries] == records
    other = await store.read_log("r2")
    assert (other.approval_requests, other.is_empty) == ((), True)


async def test_a_log_of_an_approval_request_only_is_not_empty(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    await store.write_approval_request(approval_request())
    log = await store.read_log("r1")
    assert not log.is_empty
    assert log.approval_requests == (approval_request(),)


async def test_a_lease_writes_an_approval_request_through_the_fence(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    lease = await store.acquire_lease("r1")
    await lease.write_approval_request(approval_request())
    with pytest.raises(ValueError, match="belongs to run 'r2'"):
        await lease.write_approval_request(approval_request(run_id="r2"))
    await lease.release()
    assert (await store.read_log("r1")).approval_requests == (approval_request(),)
    assert (await store.read_log("r2")).is_empty


async def test_an_approval_request_passed_to_another_write_method_is_refused(
    store: JsonlRunStore | VolatileRunStore,
) -> None:
    with pytest.raises(TypeError, match=r"write_settlement takes a Settlement record, got Appr"):
        await store.write_settlement(approval_request())  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"write_approval_request takes a ApprovalRequest record, got Settlement"
    ):
        await store.write_approval_request(settlement())  # type: ignore[arg-type]
    assert (await store.read_log("r1")).is_empty


async def test_the_approval_request_line_is_tagged_and_checksummed(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    request = approval_request()
    await store.write_approval_request(request)
    await store.write_settlement(RECORDS.approval_decision(request, approved=False))
    first, second = stored_lines(tmp_path)
    assert list(first) == [
        "record",
        "schema_version",
        "run_id",
        "result_id",
        "step_idx",
        "tool",
        "tool_call_id",
        "arguments",
        "digest",
        "requested_at",
        "expires_at",
        "checksum",
    ]
    assert first["record"] == "approval_request"
    assert (second["record"], second["verdict"], second["digest"]) == (
        "settlement",
        "rejected",
        request.digest,
    )


# =========================================================================== schema version rule


def _edited_to_claim(line: bytes, version: bytes, old: bytes, new: bytes) -> bytes:
    """``line`` with ``old`` replaced by ``new``, claiming ``version``, without its checksum:
    what a hand edit that wants to pass for an older line looks like."""
    body, _, _ = line.rpartition(b', "checksum": "')
    body = body.replace(old, new, 1)
    body = body.replace(b'"schema_version": "%s"' % SCHEMA_VERSION.encode(), version, 1)
    return body + b"}"


async def test_a_line_claiming_an_older_version_than_the_first_record_is_refused(
    tmp_path: Path,
) -> None:
    """Issue 21: a line that claims 1.2 skips its checksum, so an edited observation passed;
    no line may claim an older schema version than its log's first record."""
    store = JsonlRunStore(directory=tmp_path)
    for record in [started(), model_intent(), model_result(), action_intent()]:
        await write(store, record)
    await write(store, step(observation="paid 10 EUR"))
    lines = log_path(tmp_path).read_bytes().split(b"\n")
    lines[4] = _edited_to_claim(lines[4], b'"schema_version": "1.2"', b"paid 10", b"paid 99")
    log_path(tmp_path).write_bytes(b"\n".join(lines))
    with pytest.raises(LogChecksumError) as caught:
        await store.read_log("r1")
    assert caught.value.line == 5
    assert str(caught.value).startswith(
        "log of run 'r1', line 5: the line claims schema version '1.2', older than the "
        f"'{SCHEMA_VERSION}' of its log's first record (line 1)"
    )


async def test_the_volatile_store_keeps_the_same_version_rule() -> None:
    store = VolatileRunStore()
    await store.write_run_started(started())
    await store.write_intent(model_intent())
    await store.read_log("r1")  # encodes the records kept so far into their lines
    lines = store._lines["r1"]
    lines[1] = _edited_to_claim(lines[1][:-1], b'"schema_version": "1.0"', b"m0", b"m0") + b"\n"
    with pytest.raises(LogChecksumError, match=r"^log of run 'r1', line 2: the line claims"):
        await store.read_log("r1")


def _old_line(record: Record, version: str) -> bytes:
    """``record`` as a line of schema ``version`` before checksums (1.0 to 1.2)."""
    from polyloop.serialization import encode
    from polyloop.stores._records import TAGS

    payload = {RECORD_KEY: TAGS[type(record)], **encode(record), "schema_version": version}
    return json.dumps(payload, ensure_ascii=False).encode() + b"\n"


async def test_a_log_started_by_an_older_version_and_continued_by_this_one_reads(
    tmp_path: Path,
) -> None:
    """A resumed old log holds its own old lines first, then this version's: that reads."""
    log_path(tmp_path).write_bytes(
        _old_line(started(), "1.0") + _old_line(model_intent(), "1.2") + _line_of(model_result())
    )
    log = await JsonlRunStore(directory=tmp_path).read_log("r1")
    assert log == RunLog(
        started=started(), intents=(model_intent(),), model_results=(model_result(),)
    )


async def test_an_older_line_after_a_newer_one_of_an_old_log_is_still_refused(
    tmp_path: Path,
) -> None:
    """The floor is the first record's version: a 1.1 line after a 1.2 first record fails."""
    log_path(tmp_path).write_bytes(_old_line(started(), "1.2") + _old_line(model_intent(), "1.1"))
    with pytest.raises(LogChecksumError, match=r"line 2: the line claims schema version '1\.1'"):
        await JsonlRunStore(directory=tmp_path).read_log("r1")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _TimedOutcome(ActionOutcome):
    """An executor's own ``ActionOutcome`` subclass: the session accepts it (``isinstance``),
    the encoder has no form for it (it encodes only the exact class)."""


class _SubclassingExecutor:
    async def execute(self, action: object) -> ActionOutcome:
        return _TimedOutcome(
            status=ActionStatus.EXECUTED,
            observation="ok",
            observation_is_synthetic=False,
            env_reported_completion=False,
            observation_truncated_chars=0,
        )

    def parameters(self) -> dict[str, str]:
        return {"kind": "subclassing"}


async def test_a_record_holding_a_subclass_fails_its_write_on_the_volatile_store_too() -> None:
    """Design 0214, third pass: the volatile store keeps a record unencoded only when every
    nested value has exactly the library's class. A run whose executor returns an
    ``ActionOutcome`` subclass fails at the step's write, as on the JSONL store and as before,
    instead of finishing with a log that no read can decode; the log stays readable."""
    from _session_doubles import ScriptedModel, definition, request

    store = VolatileRunStore()
    agent = definition(ScriptedModel(["code:x", "final:done"]), store=store)
    with pytest.raises(TypeError, match="not JSON serializable"):
        await run(agent, request("r1", executor=_SubclassingExecutor()))
    log = await store.read_log("r1")
    assert log.steps == ()
    assert len(log.intents) == 2
