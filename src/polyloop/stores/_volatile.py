"""``VolatileRunStore``: the JSONL store's contract, held in process memory."""

from __future__ import annotations

import collections
import dataclasses
import enum
import re
import types
import typing
import zlib
from collections.abc import Callable, Mapping
from typing import ClassVar

from polyloop.errors import PolyloopTypeError
from polyloop.ports import RunLog
from polyloop.stores._leases import (
    FencedRunLease,
    check_lease_record,
    check_wait_seconds,
    held_error,
    lost_error,
    poll_until,
)
from polyloop.stores._records import Record, assemble_log, decode_entries, encode_line, is_exclusive
from polyloop.stores._writes import RecordWriter, check_pair, started_error
from polyloop.types import (
    ActionOutcome,
    ApprovalRequest,
    Intent,
    ModelCallResult,
    ModelReply,
    NativeToolCall,
    ResumeMark,
    RunFinished,
    RunResult,
    StepCompleted,
    StepRecord,
    Usage,
)

__all__ = ["VolatileRunLease", "VolatileRunStore"]

_NAME = "VolatileRunStore"


class _Packed:
    """The lines of a run whose lease ended a while ago, packed (``VolatileRunStore``'s
    docstring): ``zlib`` of their bytes, compressed with the store's dictionary."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def lines(self, dictionary: bytes) -> list[bytes]:
        """The packed lines, each ending in ``\\n``, exactly as they were packed."""
        data = zlib.decompressobj(zdict=dictionary).decompress(self.blob)
        return [line + b"\n" for line in data[:-1].split(b"\n")]


_Entry = bytes | Record | _Packed
"""What the store holds for one record: its line, or the record to encode at the next read;
or, first in a run's list, the run's earlier lines packed."""

_PACK_LEVEL = 6
"""``zlib``'s level for packing: 351 bytes a two-step batch run with the dictionary against
561 at level 1, for 20 µs against 13 (design 0244)."""

_DICTIONARY_BYTES = 32 * 1024
"""``zlib``'s window: only a dictionary's last 32 KiB can be referred to."""


class VolatileRunStore(RecordWriter):
    """A ``RunStore`` in memory: what it lacks is recovery across processes, nothing else.

    * It keeps, per run id, the exact bytes the JSONL store would write, and decodes them on
      every ``read_log``. So nothing aliases: changing a snapshot dict after writing it, or a
      record read back, never changes the log; and every ``DecodeError`` has the same text as
      the JSONL store's (records are numbered like the lines of the JSONL file).
    * It may encode a record when the run is next read instead of on the write (design
      0214): an ``Intent``, ``ModelCallResult``, ``StepCompleted`` or ``RunFinished``
      whose every field, at every depth, holds exactly a value of a type the field declares
      (``_keeper``'s table: ``str``, ``bool``, ``None``, an ``int`` within 2**63, a member of
      the declared enum, exactly the declared nested record class, a ``tuple`` of it; what the
      session writes) is kept as the object, and ``read_log`` turns every record kept so far
      into its line, once, and keeps the line. Such a record cannot change after the write and
      cannot fail to encode, so what a caller sees is exactly what encoding on the write
      gives: the same refusals on the write, the same bytes, no aliasing. Every other record
      (``RunStarted``, settlements, approval requests, anything holding a subclass, a float,
      a mutable value, a value of an undeclared type or a field left unset) is encoded on the
      write. The test is written once per class as straight-line code (design 0214).
    * ``write_run_started`` raises ``RunAlreadyStartedError`` (a ``FileExistsError``) when the
      run id has *any* record (the JSONL store's criterion: any write creates the file).
    * Its leases have ``write_pair(first, second)`` (design 0214): two records
      of one run, neither a ``RunStarted``, stored in one synchronous block, the lease checked
      once; the session hands it a model result with the step's next record (design 0212).
      Each record is kept or encoded exactly as its own write would, and both are decided
      before either is stored: a refusal of either (``TypeError`` or ``ValueError`` from the
      encoder, a record of another run, a lost lease) stores neither, as the JSONL store's
      ``write_pair``, whose two lines are encoded before its one write. The refusals name
      ``VolatileRunLease.write_pair``. The store itself has none, on purpose: a wrapper that
      forwards unknown attributes to a ``VolatileRunStore`` and overrides one of its write
      methods (a test double that fails the step's write, say) hides the store's leases, and
      must still be handed each record through its own method.
    * A record with wrongly typed fields (values JSON can still represent) is accepted on write
      and fails on read; a value JSON cannot represent is refused on write; a record passed
      to the wrong write method, or an object that is not a log record, is refused with
      ``TypeError`` and leaves nothing behind (not even an empty entry for its run id).
    * It packs the logs of runs whose lease ended long ago (design 0244): once the runs whose
      lease has ended and which are not packed hold more than ``_pack_budget`` records
      (131,072, about 80 MB of lines), the run whose lease ended first is packed: its
      records encoded (what its next read would do) and its lines compressed together with
      ``zlib``, against a dictionary made of the first run it packed (runs of one agent share
      most of their bytes: 5,900 bytes of lines become about 350). A read of a packed run
      decompresses them: the same lines, the same records, the same ``DecodeError``s; a
      later write appends after them. A run whose records cannot all be encoded (a kept
      record never fails; the keepers guarantee it) stays as it is and raises on its reads.
      So 100,000 two-step batch runs grow the process by 138 MiB instead of 502
      (``tools.bench.batch --stream``), and a store of fewer records (the fleet benchmark's
      82,000) never packs: packing costs about 85 µs of CPU a two-step run, two thirds of it the
      encoding the read would have done.
    * Run ids have no shape restriction here (``"a/b"`` is fine), unlike the JSONL store.
    * Writes contain no ``await``, so each one is atomic with respect to other tasks on the same
      event loop. The store is not thread-safe: use one instance per event loop.
    * Run leases (``LeasingRunStore``, design 0120) exclude other tasks using this instance;
      a lease write checks, in the same synchronous block as the append, that its lease is
      still the run's current one. Nothing here spans processes, and leases never expire.
      ``write_fenced`` and ``end_lease`` are the store side of its leases
      (``polyloop.stores._leases.FencingStore``); write through the lease instead.
    """

    __slots__ = ("_dictionary", "_ended", "_ended_records", "_epochs", "_holders", "_lines")

    _pack_budget: ClassVar[int] = 2**17
    """The records the ended, unpacked runs may hold before the oldest is packed."""

    def __init__(self) -> None:
        self._lines: dict[str, list[_Entry]] = {}
        """Per run, in write order: a stored line, or a record kept until the next read;
        first, the run's earlier lines packed (``_Packed``), if it was packed."""
        self._holders: dict[str, FencedRunLease] = {}
        self._epochs: dict[str, int] = {}
        self._ended: collections.OrderedDict[str, int] = collections.OrderedDict()
        """The runs whose lease ended, unpacked, oldest end first: their unpacked records (an
        ``OrderedDict``: a plain dict's first key is found past every key deleted before it)."""
        self._ended_records = 0
        """The sum of ``_ended``'s values."""
        self._dictionary = b""
        """``zlib``'s dictionary for packing: the end of the first run packed."""

    def __repr__(self) -> str:
        return f"VolatileRunStore(<{len(self._lines)} runs>)"

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "volatile"}``; never instance state such as how many runs it holds."""
        return {"kind": "volatile"}

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> VolatileRunLease:
        """Lease ``run_id`` to the caller (see ``polyloop.ports.LeasingRunStore``)."""
        if not isinstance(run_id, str):
            raise PolyloopTypeError(
                f"{_NAME}.acquire_lease: run_id must be a str, got {type(run_id).__name__}"
            )
        wait = check_wait_seconds(wait_seconds, f"{_NAME}.acquire_lease")

        async def attempt() -> VolatileRunLease | None:
            if run_id in self._holders:
                return None
            epoch = self._epochs.get(run_id, 0) + 1
            self._epochs[run_id] = epoch
            lease = VolatileRunLease(self, run_id, epoch)
            self._holders[run_id] = lease
            return lease

        return await poll_until(attempt, wait, lambda: held_error(_NAME, run_id, wait))

    async def read_log(self, run_id: str) -> RunLog:
        """Decode the run's records afresh; ``RunLog()`` for an unknown run id."""
        lines = self._encoded(run_id)
        entries = decode_entries(
            ((number, line[:-1]) for number, line in enumerate(lines, start=1)), run_id=run_id
        )
        return assemble_log((e.record for e in entries), lines=(e.line for e in entries))

    # -- the store side of its leases (FencingStore) -----------------------------------------

    async def write_fenced(self, lease: FencedRunLease, line: bytes, kind: type[Record]) -> None:
        """Check that ``lease`` is the run's current lease and store ``line``, with no
        ``await`` in between (so no release or takeover can fall between check and append)."""
        self.keep_fenced(lease, line, kind)

    def keep_fenced(self, lease: FencedRunLease, entry: _Entry, kind: type[Record]) -> None:
        """``write_fenced`` for a line or a record to encode later (``VolatileRunLease``)."""
        self._store(self._fence(lease), entry, kind)

    def keep_fenced_pair(self, lease: FencedRunLease, entries: tuple[_Entry, _Entry]) -> None:
        """``keep_fenced`` for the two entries of a ``write_pair`` (neither a ``RunStarted``),
        the lease checked once, in the same synchronous block as the append."""
        self._lines.setdefault(self._fence(lease), []).extend(entries)

    def _fence(self, lease: FencedRunLease) -> str:
        """Refuse a write through ``lease`` unless it is the run's current lease; its run id."""
        run_id = lease.run_id
        if self._holders.get(run_id) is not lease or lease.released:
            why = "it was released" if lease.released else "another lease replaced it"
            raise lost_error(_NAME, run_id, lease.epoch, why)
        return run_id

    async def check_fence(self, lease: FencedRunLease) -> None:
        """``RunLeaseLostError`` unless ``lease`` is the run's current lease (``_fence``)."""
        self._fence(lease)

    async def end_lease(self, lease: FencedRunLease) -> None:
        """Free the run if ``lease`` still holds it; then, while the ended, unpacked runs
        hold more than ``_pack_budget`` records, pack the one that ended first (a run held
        again is skipped: it is counted again when its lease ends)."""
        run_id = lease.run_id
        if self._holders.get(run_id) is not lease:
            return
        del self._holders[run_id]
        entries = self._lines.get(run_id)
        if entries is None:
            return
        self._ended_records += len(entries) - self._ended.pop(run_id, 0)
        self._ended[run_id] = len(entries)
        while self._ended_records > self._pack_budget:
            oldest, records = self._ended.popitem(last=False)
            self._ended_records -= records
            if oldest not in self._holders:  # else it is counted again at its lease's end
                self._pack(oldest)

    # -- internals ---------------------------------------------------------------------------

    async def _write(self, record: Record, kind: type[Record], method: str) -> None:
        """``RecordWriter``'s write, keeping the record to encode at the next read."""
        if not _keeps(record, kind):
            await super()._write(record, kind, method)
            return
        self._store(record.run_id, record, kind)

    async def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> None:
        self._store(record.run_id, line, kind)

    def _store(self, run_id: str, entry: _Entry, kind: type[Record]) -> None:
        if not is_exclusive(kind):
            self._lines.setdefault(run_id, []).append(entry)
        elif run_id in self._lines:
            raise started_error(_NAME, run_id)
        else:
            self._lines[run_id] = [entry]

    def _encoded(self, run_id: str) -> tuple[bytes, ...]:
        """The run's lines, encoding (once) every record kept since the last read. A record
        that cannot be encoded raises here, on every read, and stays as it is."""
        entries = self._lines.get(run_id)
        if not entries:
            return ()
        for index, entry in enumerate(entries):
            if not isinstance(entry, (bytes, _Packed)):
                entries[index] = encode_line(entry, type(entry), f"{_NAME}.read_log")
        first = entries[0]
        if isinstance(first, _Packed):  # every later entry is a line now
            return (*first.lines(self._dictionary), *entries[1:])  # type: ignore[arg-type]
        return tuple(entries)  # type: ignore[arg-type]  # every entry is a line now

    def _pack(self, run_id: str) -> None:
        """Replace the run's entries by one ``_Packed`` of its lines (the docstring). A run
        with a record that cannot be encoded stays as it is: its reads raise."""
        if not self._lines.get(run_id):
            return
        try:
            data = b"".join(self._encoded(run_id))
        except (TypeError, ValueError):  # not swallowed: every read of the run raises it
            return
        if not self._dictionary:
            self._dictionary = data[-_DICTIONARY_BYTES:]
        packer = zlib.compressobj(_PACK_LEVEL, zdict=self._dictionary)
        self._lines[run_id] = [_Packed(packer.compress(data) + packer.flush())]


class VolatileRunLease(FencedRunLease):
    """A ``RunLease`` on one run of a ``VolatileRunStore`` (from ``acquire_lease``).

    Each write checks the record, then checks the lease and appends in one synchronous block
    (no ``await`` in between), so no release or takeover can fall between check and append.
    Like the store's own writes it keeps the record, to be encoded at the next read (the
    store's docstring); a ``RunStarted`` is encoded on the write. ``write_pair`` stores two
    records in one such block, the lease checked once for both (the store's docstring).
    Everything else is ``polyloop.stores._leases.FencedRunLease``.
    """

    __slots__ = ()

    async def _write(self, record: Record, kind: type[Record], method: str) -> None:
        if not _keeps(record, kind):
            await super()._write(record, kind, method)
            return
        if record.run_id != self._run_id:  # the text only for the refusal
            check_lease_record(record.run_id, self._run_id, f"{type(self).__name__}.{method}")
        store = self._store
        assert isinstance(store, VolatileRunStore), "granted only by a VolatileRunStore"
        store.keep_fenced(self, record, kind)

    async def write_pair(self, first: Record, second: Record) -> None:
        """Store two records of this lease's run, ``first`` then ``second``, in one
        synchronous block (designs 0212, 0214): each kept or encoded exactly as its own write
        would, both decided before either is stored, so a refusal of either stores neither
        (as the JSONL store's ``write_pair``); neither may be a ``RunStarted``. A record of
        another run is refused before the lease is checked (after the encoder's refusals, as
        on the JSONL lease); once the lease is lost, neither is stored
        (``RunLeaseLostError``)."""
        where = "VolatileRunLease.write_pair"
        entries = _pair_entries(self, first, second, where)
        check_lease_record(first.run_id, self.run_id, where)
        store = self._store
        assert isinstance(store, VolatileRunStore), "granted only by a VolatileRunStore"
        store.keep_fenced_pair(self, entries)


def _pair_entries(
    writer: RecordWriter, first: Record, second: Record, where: str
) -> tuple[_Entry, _Entry]:
    """The entries of ``write_pair(first, second)``: each record kept (``_keeps``) or encoded
    through ``writer`` as its own write would; both decided before either is stored."""
    check_pair(first, second, where)
    kind, other = type(first), type(second)
    return (
        first if _keeps(first, kind) else writer._encode(first, kind, where),
        second if _keeps(second, other) else writer._encode(second, other, where),
    )


def _keeps(record: object, kind: type[Record]) -> bool:
    """Whether a write of ``record`` (through the ``kind`` method) may keep it unencoded:
    exactly a ``kind`` of the four kept kinds, every field holding exactly a value of a type
    the field declares, of the kinds the encoder writes as they are and that cannot change
    (``_keeper``). Such a record cannot change after the write (so nothing aliases) and
    cannot fail to encode later (so a write refuses exactly what it refused when it
    encoded). Anything else, a wrong kind included (the encoder refuses it), is encoded on
    the write."""
    keeps = _KEEPERS.get(kind)
    if keeps is None:  # the first write of this kind: written now, not at import
        keeps = _KEEPERS[kind] = _keeper(kind) if kind in _KEPT_KINDS else _never
    return keeps(record)


def _never(record: object) -> bool:
    return False


_KEPT_KINDS = frozenset({Intent, ModelCallResult, StepCompleted, RunFinished})

_KEEPERS: dict[type, Callable[[object], bool]] = {}
"""Per write method's kind, its keeper (``_never`` for a kind that is always encoded)."""


_INT_BOUND = 2**63
"""A kept ``int`` lies strictly between ``-_INT_BOUND`` and ``_INT_BOUND``: far below the
interpreter's smallest limit on turning an int into text (640 digits,
``sys.set_int_max_str_digits``), which would otherwise fail at the read, not the write."""

_NESTED = frozenset(
    {ActionOutcome, ApprovalRequest, ModelReply, NativeToolCall, ResumeMark, RunResult}
    | {StepRecord, Usage}
)
"""The frozen classes the encoder writes field by field where a field declares them."""

_KEEPER_CACHE: dict[type, Callable[[object], bool]] = {}


def _keeper(cls: type) -> Callable[[object], bool]:
    """A function telling whether a value is exactly a ``cls`` whose every field holds
    exactly a value of one of the types it declares (``_accepts``), written once per class
    as straight-line code, the way ``polyloop._common.trusted_builder`` writes a builder.

    ===============================  ===========================================================
    a field declaring                accepts
    ===============================  ===========================================================
    ``str``, ``bool``, ``None``      exactly that type (no subclass)
    ``int``                          exactly ``int`` (not ``bool``), within ``_INT_BOUND``
    an ``Enum`` class                exactly a member of it (if its members' values are all
                                     ``str``; else nothing)
    a ``_NESTED`` class              exactly that class, itself accepted by its own keeper
    ``tuple[<_NESTED class>, ...]``  exactly a ``tuple`` of such values
    ``A | B``                        what ``A`` or ``B`` accepts
    anything else                    nothing (the record is encoded on the write)
    ===============================  ===========================================================

    A field left unset (a record forced around its ``__init__``) is refused. The source
    holds field names (Python identifiers, ``dataclasses`` requires them), builtins
    (``type``, ``str``, ``bool``, ``int``, ``tuple``, ``all``, ``map``), ``_cls`` and ``_tN``
    names bound in its own namespace (the class, the enums and the nested classes' keepers)
    and literal ints; never a value, and no class's name but the builtins' (the keeper's name
    is set after ``exec``).
    """
    found = _KEEPER_CACHE.get(cls)
    if found is not None:
        return found
    namespace: dict[str, object] = {"_cls": cls}
    hints = typing.get_type_hints(cls)
    terms = ["type(r) is _cls"]
    terms += [_term(f.name, hints[f.name], namespace) for f in dataclasses.fields(cls)]
    lines = ["def keeps(r):", "    try:", f"        return ({terms[0]}"]
    lines += [f"            and {term}" for term in terms[1:]]
    lines += [
        "        )",
        "    except AttributeError:  # a field left unset",
        "        return False",
    ]
    exec("\n".join(lines), namespace)  # source built from field names only
    keeps: Callable[[object], bool] = namespace["keeps"]  # type: ignore[assignment]
    keeps.__name__ = keeps.__qualname__ = f"keeps_{cls.__name__}"
    _KEEPER_CACHE[cls] = keeps
    return keeps


def _term(name: str, hint: object, namespace: dict[str, object]) -> str:
    """The source of the test on field ``name`` (declared ``hint``): the field's value is
    fetched once, into ``v``, by the first alternative."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    options = typing.get_args(hint) if union else (hint,)
    accepted = [_accepts(option, namespace) for option in options]
    # ``None`` first: the cheapest test, and the one that fetches the value.
    tests = sorted((t for t in accepted if t is not None), key=lambda t: not t.startswith("{v} is"))
    if not tests:
        return "False"
    # The value goes into ``v`` only where a later part of the test reads it again.
    again = len(tests) > 1 or re.search(r"\bv\b", tests[0].replace("{v}", "")) is not None
    fetched = f"(v := r.{name})" if again else f"r.{name}"
    return (
        "(" + " or ".join([tests[0].format(v=fetched), *(t.format(v="v") for t in tests[1:])]) + ")"
    )


def _accepts(option: object, namespace: dict[str, object]) -> str | None:
    """The source of the test of ``{v}`` against one declared type (``_keeper``'s table), or
    ``None`` for a type it never accepts."""
    if option is type(None):
        return "{v} is None"
    if option is str or option is bool:
        return f"type({{v}}) is {option.__name__}"
    if option is int:
        return f"(type({{v}}) is int and {-_INT_BOUND} < v < {_INT_BOUND})"
    if isinstance(option, type) and issubclass(option, enum.Enum):
        if not all(type(member._value_) is str for member in option):
            return None
        return f"type({{v}}) is {_bind(option, namespace)}"
    if option in _NESTED:
        return f"{_bind(_keeper(option), namespace)}({{v}})"
    args = typing.get_args(option)
    if typing.get_origin(option) is not tuple or args[1:] != (Ellipsis,) or args[0] not in _NESTED:
        return None
    return f"(type({{v}}) is tuple and all(map({_bind(_keeper(args[0]), namespace)}, v)))"


def _bind(value: object, namespace: dict[str, object]) -> str:
    name = f"_t{len(namespace)}"
    namespace[name] = value
    return name
