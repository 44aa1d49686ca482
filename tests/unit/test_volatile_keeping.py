"""The volatile store keeps a record unencoded only where that changes nothing a caller sees
(design 0214, third and fourth pass; design 0022: immune to aliasing, refusing on the write).

The reference is the same store encoding every record on the write (``_EncodingStore``: the
write of ``RecordWriter``, which the volatile store did before the third pass). Every field at
every depth of a full record of each kept kind (``Intent``, ``ModelCallResult``,
``StepCompleted``, ``RunFinished``; the paths of ``test_encoding_oracle``) is forced to each
wrong value in turn: a float, NaN, a list, a dict, a set, ``object()``, a ``str`` or ``int``
subclass, an enum member of another class, a record of another class, ints too large for the
encoder's text limit. Each write must raise what the reference's raises (type and text) or
succeed as it does, and after every mutable value in the record has been changed, the log
read back must be the reference's (or fail with the same ``DecodeError``).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Awaitable
from pathlib import Path

import pytest

from polyloop.errors import PolyloopError
from polyloop.serialization import DecodeError
from polyloop.stores import VolatileRunStore
from polyloop.stores._records import Record
from polyloop.stores._writes import RecordWriter
from polyloop.types import Intent, ModelCallResult, RunFinished, RunStarted, StepCompleted

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_encoding_oracle import _JUNK_ATOMS, FULL_RECORDS, _forced_at, _paths

pytestmark = pytest.mark.unit

METHODS = {
    Intent: "write_intent",
    ModelCallResult: "write_model_call_result",
    StepCompleted: "write_step_completed",
    RunFinished: "write_run_finished",
}
KEPT_RECORDS = [r for r in FULL_RECORDS if type(r) in METHODS]
START = RunStarted(run_id="r", parameter_snapshot={"k": "v"})

_EXTRA_VALUES: list[object] = [
    10**5000,  # more digits than int-to-text allows: the encoder refuses it
    -(10**5000),
    2**63,
    -(2**63),
    2**63 - 1,
    ["mutable", ["nested"]],
    {"mutable": ["nested"]},
]


class _EncodingStore(VolatileRunStore):
    """The volatile store as it was before the third pass: every record encoded on the write."""

    __slots__ = ()

    def _write(self, record: Record, kind: type[Record], method: str) -> Awaitable[None]:
        return RecordWriter._write(self, record, kind, method)


async def _outcome(step: Awaitable[object]) -> object:
    """What awaiting ``step`` gave: the value, or the exception's type and text."""
    try:
        return await step
    except (AttributeError, TypeError, ValueError, DecodeError, PolyloopError) as error:
        return type(error), str(error)


def _mutate(value: object) -> None:
    """Change every list, dict and set in ``value`` (the caller's objects after the write)."""
    if isinstance(value, list):
        for item in value:
            _mutate(item)
        value.append("changed after the write")
    elif isinstance(value, dict):
        for item in value.values():
            _mutate(item)
        value["changed"] = "after the write"
    elif isinstance(value, set):
        value.add("changed after the write")


@pytest.mark.parametrize("record", KEPT_RECORDS, ids=lambda r: type(r).__name__)
async def test_a_full_record_of_a_kept_kind_is_kept_until_the_read(record: Record) -> None:
    """The records the session writes, every optional field set, are kept as they are (what
    saves the volatile store its encoding on the write), and read back as written."""
    store = VolatileRunStore()
    await store.write_run_started(START)
    await getattr(store, METHODS[type(record)])(record)
    assert store._lines["r"][-1] is record
    log = await store.read_log("r")
    assert record in [entry.record for entry in log.entries] or log.finished == record


async def _written_and_read(
    store: VolatileRunStore, record: Record, *, mutable: object = None, lease: bool = False
) -> tuple[object, object, bool]:
    """What writing ``record`` (after a start, through a lease if ``lease``) gave, then what
    reading the log gave once every list, dict and set in ``mutable`` was changed (a text
    names the writer's class as ``<writer>``), and whether the write kept the record."""
    await store.write_run_started(START)
    writer: RecordWriter = await store.acquire_lease("r") if lease else store
    written = await _outcome(getattr(writer, METHODS[type(record)])(record))
    if isinstance(written, tuple):
        written = (written[0], written[1].replace(type(writer).__name__, "<writer>"))
    kept = any(entry is record for entry in store._lines.get("r", ()))
    _mutate(mutable)
    return written, await _outcome(store.read_log("r")), kept


def _fresh(value: object) -> object:
    """A copy of ``value`` owning its mutable parts (one that cannot be copied is immutable)."""
    try:
        return copy.deepcopy(value)
    except TypeError:
        return value


@pytest.mark.parametrize("record", KEPT_RECORDS, ids=lambda r: type(r).__name__)
async def test_every_field_forced_to_every_wrong_value_is_stored_as_if_encoded_on_the_write(
    record: Record,
) -> None:
    """The module docstring: each forced record, on the store and through a lease, gives what
    the store encoding on the write gives, on the write and on the read after the caller
    changed what it still holds."""
    kept = encoded = 0
    for path in _paths(record):
        for junk in [*_JUNK_ATOMS, *_EXTRA_VALUES]:
            reference = _EncodingStore()
            value = _fresh(junk)
            expected = await _written_and_read(
                reference, _forced_at(record, path, value), mutable=value
            )
            # A lease refuses a record of another run first (test_lease_base).
            for lease in (False, True) if path != ("run_id",) else (False,):
                store = VolatileRunStore()
                value = _fresh(junk)
                forced = _forced_at(record, path, value)
                *got, was_kept = await _written_and_read(store, forced, mutable=value, lease=lease)
                assert tuple(got) == expected[:2], f"{type(record).__name__} at {path} = {junk!r}"
            if was_kept:
                kept += 1
            else:
                encoded += 1
    # Both ways were taken: a forced value of a declared type is kept, the others are not.
    assert kept > 0
    assert encoded > 0


async def test_an_int_too_long_for_text_is_refused_on_the_write() -> None:
    """An int with more digits than Python turns into text (``sys.get_int_max_str_digits``)
    fails to encode: refused on the write, as by the JSONL store, not later at the read."""
    record = next(r for r in KEPT_RECORDS if type(r) is Intent)
    forced = dataclasses.replace(record)
    object.__setattr__(forced, "call_index", 10**5000)
    store = VolatileRunStore()
    await store.write_run_started(START)
    with pytest.raises(ValueError, match="integer string conversion"):
        await store.write_intent(forced)
    assert (await store.read_log("r")).intents == ()


@pytest.mark.parametrize("record", KEPT_RECORDS, ids=lambda r: type(r).__name__)
async def test_a_record_with_a_field_left_unset_is_stored_as_if_encoded_on_the_write(
    record: Record,
) -> None:
    """A record forced around its ``__init__`` with one slot never set: its write fails
    where encoding fails (``AttributeError``), on the store and through its lease, or, for
    an unset ``resumed`` (which the encoder reads as ``None``), stores what the encoding
    gives; never a record kept unencoded."""
    names = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
    for name in names:
        unset = object.__new__(type(record))
        for other in names:
            if other != name:
                object.__setattr__(unset, other, getattr(record, other))
        expected = await _written_and_read(_EncodingStore(), unset)
        for lease in (False, True) if name != "run_id" else (False,):
            store = VolatileRunStore()
            assert await _written_and_read(store, unset, lease=lease) == (*expected[:2], False)
