"""One record table, one write surface (design 0220).

* A record kind is declared once, in ``polyloop.types.RECORDS``. A kind added in a scratch
  table (``RECORDS.scratch``, test-only) is encoded and decoded (``polyloop.serialization``),
  framed into a line and read back (``polyloop.stores._records``), stored and read by the
  JSONL and volatile stores and their leases (``write_record``), written through the
  session's ``RunWriter``, assembled into ``RunLog.entries`` and checked by ``check_log``,
  with no change to ``src/``; once the block ends, every layer refuses it again.
* A store written against polyloop 0.2.0 (the seam's five writes, ``read_log`` and
  ``parameters``, nothing else) still certifies with ``RunStoreContract`` and still runs.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from _session_doubles import CodeExecutor, ScriptedModel, definition, request

from polyloop import _recovery, serialization
from polyloop.errors import DecodeError, PolyloopTypeError, PolyloopValueError
from polyloop.ports import LogEntry, RecordWrites, RunLease, RunLog, RunStore, SettlingWrites
from polyloop.session import resume, run
from polyloop.session._leasing import RunWriter
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.stores._records import decode_line, encode_line, is_barrier, is_exclusive
from polyloop.testing import RecordFactory, RunStoreContract
from polyloop.types import (
    RECORDS,
    ApprovalRequest,
    Intent,
    ModelCallResult,
    RecordKind,
    ResumeMark,
    RunFinished,
    RunStarted,
    Settlement,
    StepCompleted,
    StopReason,
)


class LinkRole(enum.Enum):
    CHILD = "child"
    FORK = "fork"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunLink:
    """A record kind the library does not have: a run's link to another run."""

    run_id: str
    other_run_id: str
    role: LinkRole
    step_idx: int
    note: str | None
    labels: tuple[str, ...]
    resumed: ResumeMark | None = dataclasses.field(default=None, compare=False)


LINK = RecordKind(record_cls=RunLink, tag="run_link", barrier=True)


@pytest.fixture
def scratch() -> Iterator[RecordKind]:
    with RECORDS.scratch(LINK) as kind:
        yield kind
    assert RunLink not in RECORDS.by_class


def _link(run_id: str = "r1", **changes: object) -> RunLink:
    fields: dict[str, object] = {
        "run_id": run_id,
        "other_run_id": "r0",
        "role": LinkRole.FORK,
        "step_idx": 2,
        "note": None,
        "labels": ("a", "é"),
    }
    fields.update(changes)
    return RunLink(**fields)  # type: ignore[arg-type]


def test_every_layer_knows_a_scratch_kind_and_forgets_it_after(scratch: RecordKind) -> None:
    link = _link()
    payload = serialization.encode(link)  # type: ignore[arg-type]
    assert payload == {
        "schema_version": serialization.SCHEMA_VERSION,
        "run_id": "r1",
        "other_run_id": "r0",
        "role": "fork",
        "step_idx": 2,
        "note": None,
        "labels": ["a", "é"],
    }
    assert serialization.decode_record(RunLink, payload) == link
    line = encode_line(link, RunLink, "test")  # type: ignore[arg-type]
    assert line.startswith(b'{"record": "run_link", "schema_version": ')
    assert decode_line(line[:-1], run_id="r1", line_number=1) == link
    assert is_barrier(RunLink)
    assert not is_exclusive(RunLink)
    with pytest.raises(DecodeError, match=r"RunLink\.step_idx: expected int, got str"):
        serialization.decode_record(RunLink, {**payload, "step_idx": "2"})
    with pytest.raises(DecodeError, match=r"RunLink\.role: expected one of 'child', 'fork'"):
        serialization.decode_record(RunLink, {**payload, "role": "sibling"})
    marked = _link(resumed=ResumeMark(at="2026-01-01T00:00:00Z", plan="continue", step_idx=2))
    assert serialization.decode_record(RunLink, serialization.encode(marked)).resumed == (  # type: ignore[arg-type]
        marked.resumed
    )
    with pytest.raises(PolyloopValueError, match="declared twice"):
        RECORDS.scratch(LINK).__enter__()


def test_a_kind_removed_from_the_table_is_refused_by_every_layer() -> None:
    with RECORDS.scratch(LINK):
        line = encode_line(_link(), RunLink, "test")  # type: ignore[arg-type]
    with pytest.raises(PolyloopTypeError, match="cannot encode a RunLink"):
        serialization.encode(_link())  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="unknown 'record' tag 'run_link'"):
        decode_line(line[:-1], run_id="r1", line_number=1)
    with pytest.raises(PolyloopTypeError, match="no record kind has the class RunLink"):
        serialization.decode_record(RunLink, {})


def _start(run_id: str) -> RunStarted:
    return RecordFactory().run_started(run_id=run_id, parameter_snapshot={"k": "v"})


def _stores(tmp_path: Path) -> list[JsonlRunStore | VolatileRunStore]:
    return [JsonlRunStore(directory=tmp_path), VolatileRunStore()]


async def test_the_stores_and_their_leases_store_read_and_check_a_scratch_kind(
    scratch: RecordKind, tmp_path: Path
) -> None:
    records = RecordFactory()
    for store in _stores(tmp_path):
        assert isinstance(store, RecordWrites)
        await store.write_run_started(_start("r1"))
        await store.write_record(_link())
        await store.write_intent(
            records.model_call_intent(run_id="r1", call_index=0, result_id="m0")
        )
        log = await store.read_log("r1")
        assert [type(entry.record) for entry in log.entries] == [RunStarted, RunLink, Intent]
        assert log.entries[1].record == _link()
        assert not log.is_empty
        assert _recovery.check_log(log, "r1") is None
        # Through a lease, and through the session's one write surface over it.
        lease = await store.acquire_lease("r2")
        writer = RunWriter(lease)
        assert writer.can_write(RunLink)
        await writer.write(_start("r2"))
        await writer.write(_link("r2"))
        await lease.release()
        log = await store.read_log("r2")
        assert [entry.record for entry in log.entries] == [_start("r2"), _link("r2")]
        assert log.started == _start("r2")
        # check_log's rules for every kind hold for the new one too.
        await store.write_record(_link("r3"))
        breach = _recovery.check_log(await store.read_log("r3"), "r3")
        assert breach is not None
        assert "RunStarted record is missing" in breach.detail
        await store.write_run_started(_start("r4"))
        await store.write_record(_link("r5"))
        other = await store.read_log("r5")
        breach = _recovery.check_log(
            RunLog(
                started=_start("r4"),
                entries=(LogEntry(line=1, record=_start("r4")), *other.entries),
            ),
            "r4",
        )
        assert breach is not None
        assert "a RunLink record belongs to run 'r5'" in breach.detail


async def test_a_scratch_kind_is_refused_where_no_method_takes_it(scratch: RecordKind) -> None:
    writer = RunWriter(Store020())  # type: ignore[arg-type]
    assert not writer.can_write(RunLink)
    with pytest.raises(PolyloopTypeError, match="RecordWrites"):
        writer.write(_link())  # type: ignore[arg-type]
    with pytest.raises(PolyloopTypeError, match="takes a log record"):
        await VolatileRunStore().write_record(object())  # type: ignore[arg-type]


def _listed_names(node: ast.AST) -> set[str]:
    """The names a tuple, list, set, dict (its keys) or ``X | Y | ...`` union lists."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _listed_names(node.left) | _listed_names(node.right)
    if isinstance(node, ast.Name):
        return {node.id}
    items: list[ast.expr | None] = []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = list(node.elts)
    elif isinstance(node, ast.Dict):
        items = list(node.keys)
    return {item.id for item in items if isinstance(item, ast.Name)}


def test_no_module_of_src_but_types_lists_every_record_class() -> None:
    """The record classes are listed together (a union, a tuple, a dict's keys) only beside
    the table, in ``types.py`` (``LogRecord``, for the type checker); everywhere else reads
    ``RECORDS``. Imports do not count."""
    classes = {kind.record_cls.__name__ for kind in RECORDS.kinds}
    src = Path(serialization.__file__).parent
    listing = set()
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if classes <= _listed_names(node):
                listing.add(str(path.relative_to(src)))
    assert listing == {"types.py"}


# --------------------------------------------------------------------------- a 0.2.0 store


class Store020:
    """A store written against polyloop 0.2.0's ``RunStore`` seam and nothing later: the five
    typed writes, ``read_log`` and ``parameters``, from public names only. No leases (it
    says so), no settlements, no ``write_pair``, no ``write_record``."""

    offers_leases = False

    def __init__(self) -> None:
        self._runs: dict[str, list[object]] = {}

    async def write_run_started(self, record: RunStarted) -> None:
        if record.run_id in self._runs:
            raise FileExistsError(f"run {record.run_id!r} exists")
        self._runs[record.run_id] = [record]

    async def _append(self, record: Intent | ModelCallResult | StepCompleted | RunFinished) -> None:
        self._runs.setdefault(record.run_id, []).append(record)

    async def write_intent(self, record: Intent) -> None:
        await self._append(record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await self._append(record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        await self._append(record)

    async def write_run_finished(self, record: RunFinished) -> None:
        await self._append(record)

    async def read_log(self, run_id: str) -> RunLog:
        records = self._runs.get(run_id, [])

        def of(cls: type) -> tuple:  # type: ignore[type-arg]
            return tuple(r for r in records if isinstance(r, cls))

        started, finished = of(RunStarted), of(RunFinished)
        return RunLog(
            started=started[-1] if started else None,
            intents=of(Intent),
            model_results=of(ModelCallResult),
            steps=of(StepCompleted),
            finished=finished[-1] if finished else None,
            entries=tuple(
                LogEntry(line=n, record=r)  # type: ignore[arg-type]
                for n, r in enumerate(records, start=1)
            ),
        )

    def parameters(self) -> Mapping[str, str]:
        return {"store": "written-against-0.2.0"}


class TestStoreWrittenAgainst020(RunStoreContract):
    @pytest.fixture
    def store(self) -> RunStore:
        return Store020()


async def test_a_store_written_against_020_runs_and_resumes() -> None:
    store = Store020()
    assert isinstance(store, RunStore)
    assert not isinstance(store, (SettlingWrites, RecordWrites, RunLease))
    agent = definition(ScriptedModel(["code:print(1)", "final:done"]), store=store)
    result = await run(agent, request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    log = await store.read_log("run-1")
    assert log.finished is not None
    assert len(log.steps) == 2
    assert _recovery.check_log(log, "run-1") is None
    again = await resume(agent, request(executor=CodeExecutor()))
    assert again == result
    writer = RunWriter(store)
    assert not writer.can_write(Settlement)
    assert not writer.can_write(ApprovalRequest)
    assert writer.pair is None
    assert writer.epoch is None


def test_assemble_log_refuses_what_is_no_record_kind_naming_the_kinds() -> None:
    from polyloop.stores import assemble_log

    class NotARecord:
        pass

    with pytest.raises(PolyloopTypeError, match=r"RunStarted.*got .*NotARecord at line 1"):
        assemble_log([NotARecord()])  # type: ignore[list-item]
