"""One lease class for the three shipped stores, one write path, one barrier rule (issue 20).

``polyloop.stores._leases.FencedRunLease`` is the lease of every shipped store; it reaches its
store only through ``FencingStore`` (``write_fenced``, ``end_lease``). The seven write methods
(``write_settlement`` since schema 1.7, ``write_approval_request`` since design 0210) are
``polyloop.stores._writes.RecordWriter``'s, for the stores and the leases alike, and which
records are durability barriers is ``polyloop.stores._records.is_barrier`` alone. The contract
suites check the behaviour; this file pins that it has one home.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from _syncs import SyncRecorder
from polyloop import _common
from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    RunAlreadyStartedError,
    RunLeaseLostError,
)
from polyloop.ports import RunLease
from polyloop.stores import (
    JsonlRunLease,
    JsonlRunStore,
    PostgresRunLease,
    PostgresRunStore,
    VolatileRunLease,
    VolatileRunStore,
    _leases,
    _records,
    _writes,
)
from polyloop.stores._records import Record
from polyloop.testing import RecordFactory
from polyloop.types import (
    RECORDS,
    ApprovalRequest,
    Intent,
    ModelCallResult,
    ResumeStopped,
    RunFinished,
    RunStarted,
    Settlement,
    StepCompleted,
)

pytestmark = pytest.mark.unit

LEASES = (JsonlRunLease, VolatileRunLease, PostgresRunLease)
STORES = (JsonlRunStore, VolatileRunStore, PostgresRunStore)
WRITES = (
    "write_run_started",
    "write_intent",
    "write_model_call_result",
    "write_step_completed",
    "write_run_finished",
    "write_settlement",
    "write_approval_request",
)
KINDS: dict[str, type[Record]] = {
    "write_run_started": RunStarted,
    "write_intent": Intent,
    "write_model_call_result": ModelCallResult,
    "write_step_completed": StepCompleted,
    "write_run_finished": RunFinished,
    "write_settlement": Settlement,
    "write_approval_request": ApprovalRequest,
}


def one_of_each(records: RecordFactory, run_id: str) -> dict[str, Record]:
    return {
        "write_run_started": records.run_started(run_id=run_id, parameter_snapshot={"k": "v"}),
        "write_intent": records.model_call_intent(run_id=run_id, call_index=0, result_id="m0"),
        "write_model_call_result": records.model_call_result(
            run_id=run_id, result_id="m0", reply=records.reply()
        ),
        "write_step_completed": records.step_completed(
            run_id=run_id,
            result_id=None,
            action_outcome=None,
            step=records.step(step_idx=0, parse_ok=False),
        ),
        "write_run_finished": records.run_finished(run_id=run_id),
        "write_settlement": records.settlement(run_id=run_id, result_id="a0"),
        "write_approval_request": records.approval_request(run_id=run_id),
    }


# --------------------------------------------------------------------------- one lease class


@pytest.mark.parametrize("lease_class", LEASES)
def test_every_shipped_lease_is_the_one_base_and_adds_nothing(lease_class: type) -> None:
    assert issubclass(lease_class, _leases.FencedRunLease)
    own = {name for name in vars(lease_class) if not name.startswith("__")}
    # The additions: the PostgreSQL and JSONL leases write two records in one commit or one
    # file write (designs 0212 and 0214), handing them to their store like every other write;
    # the volatile lease hands its store the record instead of its line, to be encoded at the
    # next read (design 0214, third pass), and writes a pair too (fourth pass).
    expected = {
        "PostgresRunLease": {"write_pair"},
        "JsonlRunLease": {"write_pair"},
        "VolatileRunLease": {"_write", "write_pair"},
    }.get(lease_class.__name__, set())
    assert own == expected, f"{lease_class.__name__} defines {sorted(own)} beside the base"


@pytest.mark.parametrize("cls", LEASES + STORES)
@pytest.mark.parametrize("method", WRITES)
def test_the_seven_write_methods_are_written_once(cls: type, method: str) -> None:
    assert getattr(cls, method) is getattr(_writes.RecordWriter, method)


@pytest.mark.parametrize("store_class", STORES)
def test_every_shipped_store_offers_its_leases_the_fencing_interface(store_class: type) -> None:
    for name in ("write_fenced", "end_lease"):
        mine = inspect.signature(getattr(store_class, name))
        declared = inspect.signature(getattr(_leases.FencingStore, name))
        assert list(mine.parameters) == list(declared.parameters), (store_class, name)


class RecordingStore:
    """A ``FencingStore`` that records what the lease hands it and stores nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, object]] = []

    async def write_fenced(
        self, lease: _leases.FencedRunLease, line: bytes, kind: type[Record]
    ) -> None:
        self.calls.append(("write_fenced", lease, kind))

    async def end_lease(self, lease: _leases.FencedRunLease) -> None:
        self.calls.append(("end_lease", lease, lease.released))


async def test_the_lease_reaches_its_store_only_through_the_fencing_interface() -> None:
    store = RecordingStore()
    lease = _leases.FencedRunLease(store, "r1", 7)
    assert isinstance(lease, RunLease)
    assert (lease.run_id, lease.epoch, lease.released) == ("r1", 7, False)
    for method, record in one_of_each(RecordFactory(), "r1").items():
        await getattr(lease, method)(record)
    await lease.release()
    assert store.calls == [
        *(("write_fenced", lease, kind) for kind in KINDS.values()),
        ("end_lease", lease, True),
    ]


async def test_the_lease_refuses_another_runs_record_before_its_store_sees_it() -> None:
    store = RecordingStore()
    lease = _leases.FencedRunLease(store, "r1", 1)
    with pytest.raises(PolyloopValueError, match=r"FencedRunLease\.write_intent: .* run 'r2'"):
        await lease.write_intent(
            RecordFactory().model_call_intent(run_id="r2", call_index=0, result_id="m0")
        )
    with pytest.raises(PolyloopTypeError, match=r"FencedRunLease\.write_intent takes a Intent"):
        await lease.write_intent(RecordFactory().run_finished(run_id="r1"))  # type: ignore[arg-type]
    assert store.calls == []


@pytest.mark.parametrize("lease_class", LEASES)
def test_a_lease_names_its_class_in_its_repr(lease_class: type) -> None:
    lease = lease_class(RecordingStore(), "r1", 3)
    assert repr(lease) == f"{lease_class.__name__}(run_id='r1', epoch=3)"


# --------------------------------------------------------------------------- one barrier rule


def test_the_barriers_are_the_start_the_intents_the_decisions_and_the_finish() -> None:
    # A settlement or an approval decision is acted on once it returns, and the run stops on
    # an approval request for a person to decide on it (designs 0206, 0210); a resume that
    # stops again returns once its resume_stopped record is durable (design 0231).
    typed = {RunStarted, Intent, Settlement, ApprovalRequest, RunFinished}
    assert {kind for kind in KINDS.values() if _records.is_barrier(kind)} == typed
    assert _records.is_barrier(ResumeStopped)  # written through write_record only
    assert {entry.record_cls for entry in RECORDS.kinds if entry.barrier} == {*typed, ResumeStopped}


def test_no_store_or_lease_module_states_the_barrier_rule_itself() -> None:
    # The behaviour is pinned below for JSONL; this keeps the Postgres store (whose durability
    # cannot be observed without a crash) from growing its own copy of the rule.
    for module in ("_jsonl", "_volatile", "_postgres", "_leases", "_writes"):
        source = (Path(_records.__file__).parent / f"{module}.py").read_text(encoding="utf-8")
        assert "barrier=True" not in source, module
        assert "barrier=False" not in source, module


async def test_changing_the_one_rule_changes_the_plain_and_the_leased_write_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Make model results barriers in the record table alone: the JSONL store's plain write
    and its lease's write both start to fsync them."""
    records = RecordFactory()
    store = JsonlRunStore(directory=tmp_path)
    await store.write_intent(records.model_call_intent(run_id="r1", call_index=0, result_id="m0"))
    lease = await store.acquire_lease("r2")
    await lease.write_intent(records.model_call_intent(run_id="r2", call_index=0, result_id="m0"))
    syncs = SyncRecorder(monkeypatch)

    def result(run_id: str) -> ModelCallResult:
        return records.model_call_result(run_id=run_id, result_id="m0", reply=records.reply())

    await store.write_model_call_result(result("r1"))
    await lease.write_model_call_result(result("r2"))
    assert syncs.kinds() == []
    monkeypatch.setattr(_records, "_BARRIERS", _records._BARRIERS | {ModelCallResult})
    await store.write_model_call_result(result("r1"))
    await lease.write_model_call_result(result("r2"))
    assert syncs.kinds() == ["file", "file"]
    await lease.release()


# --------------------------------------------------------------------------- exclusive start


@pytest.mark.parametrize("kind", ["jsonl", "volatile"])
async def test_a_taken_run_id_is_refused_with_run_already_started_error(
    kind: str, tmp_path: Path
) -> None:
    records = RecordFactory()
    store = JsonlRunStore(directory=tmp_path) if kind == "jsonl" else VolatileRunStore()
    start = records.run_started(run_id="r1", parameter_snapshot={"k": "v"})
    await store.write_run_started(start)
    with pytest.raises(RunAlreadyStartedError, match=r"run id 'r1' already has a log") as plain:
        await store.write_run_started(start)
    lease = await store.acquire_lease("r1")
    with pytest.raises(RunAlreadyStartedError, match=r"run id 'r1' already has a log") as leased:
        await lease.write_run_started(start)
    await lease.release()
    for caught in (plain.value, leased.value):
        assert isinstance(caught, FileExistsError)
        assert caught.run_id == "r1"
        assert type(store).__name__ in str(caught)
        assert "start a new run with a new run id, or resume this one" in str(caught)
    assert (await store.read_log("r1")).started == start


async def test_the_jsonl_refusal_names_the_log_and_keeps_the_os_error_as_its_cause(
    tmp_path: Path,
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    start = RecordFactory().run_started(run_id="r1", parameter_snapshot={"k": "v"})
    await store.write_run_started(start)
    with pytest.raises(RunAlreadyStartedError) as caught:
        await store.write_run_started(start)
    assert str(tmp_path / "r1.jsonl") in str(caught.value)
    assert type(caught.value.__cause__) is FileExistsError


# --------------------------------------------------------------------------- the wait check


def test_the_stores_wait_check_keeps_its_words() -> None:
    where = "JsonlRunStore.acquire_lease"
    with pytest.raises(PolyloopTypeError) as wrong_type:
        _leases.check_wait_seconds("1", where)
    assert str(wrong_type.value) == (
        "JsonlRunStore.acquire_lease: wait_seconds must be a number of seconds (0 for no "
        "wait), got str"
    )
    with pytest.raises(PolyloopValueError) as wrong_value:
        _leases.check_wait_seconds(-1, where)
    assert str(wrong_value.value) == (
        "JsonlRunStore.acquire_lease: wait_seconds must be finite and >= 0 (0 for no wait), got -1"
    )
    assert _leases.check_wait_seconds(2, where) == 2.0


@pytest.mark.parametrize(
    ("value", "error", "text"),
    [
        (True, PolyloopTypeError, "must be a number of seconds (0 to refuse at once), got bool"),
        (None, PolyloopTypeError, "must be a number of seconds (0 to refuse at once), got "),
        (float("nan"), PolyloopValueError, "must be finite and >= 0 (0 to refuse at once), got"),
        (float("inf"), PolyloopValueError, "must be finite and >= 0 (0 to refuse at once), got"),
        (-0.5, PolyloopValueError, "must be finite and >= 0 (0 to refuse at once), got -0.5"),
    ],
)
def test_check_seconds_names_the_field_the_value_and_what_zero_means(
    value: object, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as caught:
        _common.check_seconds(value, where="", field="x_seconds", zero_means="to refuse at once")
    assert str(caught.value).startswith("x_seconds " + text)
    with pytest.raises(error, match=r"^f\(\): x_seconds must"):
        _common.check_seconds(value, where="f()", field="x_seconds", zero_means="to refuse")


@pytest.mark.parametrize("value", [0, 0.0, 3, 2.5])
def test_check_seconds_returns_a_float(value: float) -> None:
    checked = _common.check_seconds(value, where="w", field="f", zero_means="for none")
    assert checked == value
    assert type(checked) is float


async def test_a_released_shipped_lease_says_so_when_it_refuses(tmp_path: Path) -> None:
    records = RecordFactory()
    for store in (JsonlRunStore(directory=tmp_path), VolatileRunStore()):
        lease = await store.acquire_lease("r1")
        await lease.release()
        assert lease.released
        with pytest.raises(RunLeaseLostError, match=r"no longer held \(it was released\)"):
            await lease.write_intent(
                records.model_call_intent(run_id="r1", call_index=0, result_id="m0")
            )


@pytest.mark.parametrize("kind", ["jsonl", "volatile"])
async def test_a_lease_whose_release_began_writes_nothing_more(kind: str, tmp_path: Path) -> None:
    """``release()`` marks the lease released before it frees the run; if the release is
    cancelled in between (a write in flight held the run lock), the lock may still be held,
    but the lease promised that no write lands after ``release()`` was called (review of
    issue 20). Staged by stopping the release right after it marked the lease."""

    class JsonlNeverFrees(JsonlRunStore):
        async def end_lease(self, lease: object) -> None:  # type: ignore[override]
            raise asyncio.CancelledError

    class VolatileNeverFrees(VolatileRunStore):
        async def end_lease(self, lease: object) -> None:  # type: ignore[override]
            raise asyncio.CancelledError

    store = JsonlNeverFrees(directory=tmp_path) if kind == "jsonl" else VolatileNeverFrees()
    lease = await store.acquire_lease("r1")
    factory = RecordFactory()
    await lease.write_run_started(factory.run_started(run_id="r1", parameter_snapshot={}))
    with pytest.raises(asyncio.CancelledError):
        await lease.release()
    assert lease.released
    with pytest.raises(RunLeaseLostError):
        await lease.write_intent(
            factory.model_call_intent(run_id="r1", call_index=0, result_id="m0")
        )
    assert (await store.read_log("r1")).intents == ()
