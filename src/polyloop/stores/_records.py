"""What the stores know of the record kinds, and the line format both shipped stores share.

The kinds are declared once, in ``polyloop.types.RECORDS`` (design 0220): ``TAGS``,
``is_barrier``, ``is_exclusive``, the decoding of a line and ``assemble_log`` are read from
that table, so a record kind added there is stored, read and assembled with no change here.

Both stores hold a record as the same bytes: one line ``{"record": <tag>, **encode(record),
"checksum": <crc32>}`` in UTF-8 followed by ``\\n`` (``encode_line``; the checksum since schema
1.3, design 0162), and all three turn a log's lines back into records with ``decode_entries``
(one line: ``decode_line``). Because the volatile and PostgreSQL stores keep exactly what the
JSONL store would write, the three cannot disagree about what a record looks like or about the
text of a ``DecodeError``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import NamedTuple

from polyloop.errors import LogChecksumError, PolyloopTypeError
from polyloop.ports import LogEntry, RunLog
from polyloop.serialization import (
    SCHEMA_VERSION,
    VERSION_KEY,
    DecodeError,
    encode_tagged,
    record_decoder,
)
from polyloop.types import (
    RECORDS,
    LogRecord,
    RunFinished,
    RunResult,
    StepCompleted,
    StepRecord,
)

RECORD_KEY = "record"
"""Key of the type tag on every stored line. Reserved: no record class may have such a field."""

Record = LogRecord
"""The log record classes a ``RunStore`` accepts (``polyloop.types.RECORDS``)."""

Decoder = Callable[[Mapping[str, object]], Record]

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
"""``json.dumps(..., ensure_ascii=False, allow_nan=False)`` without building an encoder per call
(``dumps`` makes a new one whenever an argument differs from its defaults)."""

_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None,  # no markers: a cycle is found by the retry in _json (design 0214)
        _ENCODER.default,
        encode_basestring,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
)
"""The C encoder ``_ENCODER.encode`` builds on every call, built once."""


def _json(payload: dict[str, object]) -> str:
    """``_ENCODER.encode(payload)``: the same text and the same exceptions, cheaper.

    ``_C_ENCODER`` is the C encoder that ``JSONEncoder.encode`` makes for each call, with the
    same separators, ``ensure_ascii=False`` (the same string escaping function), ``allow_nan=
    False`` (NaN and infinities raise ``ValueError``) and the same ``default`` (any other
    object raises ``TypeError``), made once. It keeps no markers (``check_circular``), because
    a markers dict shared by every call would be shared by threads and keep stale entries after
    a failure. A record forced to hold a value that contains itself then recurses until
    ``RecursionError``; only then is the payload encoded again by ``_ENCODER``, which raises
    what it always raised: ``ValueError`` for a cycle, ``RecursionError`` again for a value
    merely nested too deep. (Under a recursion limit raised far above what the C stack holds,
    both the cycle and the deep value can exhaust the stack.)
    """
    if _C_ENCODER is None:  # an interpreter without the C accelerator
        return _ENCODER.encode(payload)
    try:
        return "".join(_C_ENCODER(payload, 0))
    except RecursionError:
        pass  # a cycle, or nesting too deep: the retry below raises what the old path raised
    return _ENCODER.encode(payload)  # outside the handler: no chained RecursionError


TAGS: Mapping[type[Record], str] = RECORDS.tags
"""Each record class's tag: the table's own live view (``RECORDS.tags``)."""
_BARRIERS = RECORDS.barriers
"""The classes whose write is a barrier: the table's own live set."""


def is_barrier(kind: type[Record]) -> bool:
    """Whether a write of a ``kind`` record is a durability barrier (``RECORDS``' ``barrier``
    column): the run start, an intent, a settlement, an approval request and the finish are; a
    model result and a step are not.

    Every shipped store and lease that tells the two apart asks this, and nothing else: the JSONL
    store when it decides to ``fsync``. ``PostgresRunStore`` makes every write durable before
    it returns (issue 24), barrier or not, so it has nothing to decide.
    """
    return kind in _BARRIERS


def is_exclusive(kind: object) -> bool:
    """Whether a write of a ``kind`` record refuses a run id that has records (``RECORDS``'
    ``exclusive`` column: the run's start); ``False`` for anything that is no record class."""
    entry = RECORDS.by_class.get(kind) if isinstance(kind, type) else None
    return entry is not None and entry.exclusive


def encode_line(record: object, expected: type[Record], where: str) -> bytes:
    """Return the stored bytes of ``record``, refusing anything but an ``expected`` instance.

    Raises ``TypeError`` (naming ``where``, e.g. ``"JsonlRunStore.write_intent"``) when
    ``record`` is not exactly of class ``expected``: an object that is no log record at all, and
    also a record of another kind, which would otherwise be written with the wrong durability.
    Field values are not checked (``encode`` never judges); a wrongly typed record is stored and
    fails on read. Values JSON cannot represent (NaN, arbitrary objects) raise
    ``TypeError``/``ValueError`` here, before anything is stored.

    Every ``str`` reads back exactly, surrogate code points included (real text carries them:
    ``os.fsdecode`` of a non-UTF-8 file name, a ``"\\ud83d"`` escape from an endpoint; refusing
    them would crash a run after its side effect). They have no UTF-8 form, so (``_utf8``) a
    surrogate is written as its JSON escape (``\\udcff``), except a low surrogate right after a
    high one: the escapes of the two would read back as *one* character (JSON's pair rule), so
    that low surrogate is written as its 3-byte generalized UTF-8 sequence instead, which
    ``decode_line`` reads with ``surrogatepass``. Only such a line is not strict UTF-8.
    """
    return _line(_json(_payload(record, expected, where)))


def check_kind(record: object, expected: type[Record], where: str) -> None:
    """``encode_line``'s refusal of anything but an ``expected`` instance, on its own (for a
    store that keeps the record and encodes it later: ``VolatileRunStore``)."""
    if type(record) is not expected:
        raise PolyloopTypeError(
            f"{where} takes a {expected.__name__} record, got {type(record).__qualname__}; "
            f"a RunStore stores only {RECORDS.names()}, each through its own write method"
        )


def _payload(record: object, expected: type[Record], where: str) -> dict[str, object]:
    """The JSON-ready line of ``record`` before encoding; the refusal ``encode_line`` states."""
    check_kind(record, expected, where)
    return encode_tagged(record, RECORD_KEY, TAGS[expected])  # type: ignore[arg-type]


def _line(text: str) -> bytes:
    """The stored bytes of a line's JSON ``text``: UTF-8 (``_utf8``), checksum, newline."""
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:  # surrogates: the rare, slow path
        body = _utf8(text)
    return b'%s%s%08x"}\n' % (body[:-1], _CHECKSUM_PREFIX, zlib.crc32(body))


_STEP_KEY = '"step": {'
_STEPS_SLOT = '"steps": []'


class StepLines:
    """``encode_line`` for the records of one run written in order, without encoding any step
    twice (design 0214).

    A run's ``RunFinished`` repeats every step its ``StepCompleted`` records hold, and
    encoding them again is a measurable part of a step. So the text of each ``StepCompleted``
    line's step (its last member) is kept. A ``RunFinished`` whose result holds exactly the
    steps kept, the very objects in the same order, is encoded with no steps, and the kept
    texts are spliced in where its empty list is. The bytes are ``encode_line``'s: the compact
    JSON text of an object nested in another is the same text as on its own, and the splice
    points are plain ASCII, so the surrogate rule of ``_utf8`` sees the same text. A step
    whose key is not found exactly once is not kept; a ``RunFinished`` whose steps are not
    the ones kept (a resumed run rebuilt them from its log), or whose empty list is not found
    exactly once, is encoded in full.
    """

    __slots__ = ("_steps", "_texts")

    def __init__(self) -> None:
        self._steps: list[StepRecord] = []
        self._texts: list[str] = []

    def encode(self, record: object, expected: type[Record], where: str) -> bytes:
        """``encode_line(record, expected, where)``: the same bytes and the same refusals."""
        if expected is StepCompleted and type(record) is StepCompleted:
            return self._step_completed(record)
        if expected is RunFinished and type(record) is RunFinished and self._steps:
            line = self._run_finished(record)
            if line is not None:
                return line
        return encode_line(record, expected, where)

    def _step_completed(self, record: StepCompleted) -> bytes:
        payload = _payload(record, StepCompleted, "")
        text = _json(payload)
        # The step is the last member, so its text runs from its key to the closing brace.
        # The key cannot overlap itself, so "found once" is: found, and not again after it.
        at = text.find(_STEP_KEY)
        if next(reversed(payload)) == "step" and at >= 0 and text.find(_STEP_KEY, at + 1) < 0:
            self._steps.append(record.step)
            self._texts.append(text[at + len(_STEP_KEY) - 1 : -1])
        return _line(text)

    def _run_finished(self, record: RunFinished) -> bytes | None:
        """The line spliced from the kept steps, or ``None`` when they are not its steps."""
        result = record.result
        steps = result.steps
        if (
            type(result) is not RunResult
            or len(steps) != len(self._steps)
            or not all(map(operator.is_, steps, self._steps))
        ):
            return None
        try:
            bare = dataclasses.replace(record, result=dataclasses.replace(result, steps=()))
        except (TypeError, ValueError):  # fields forced to wrong types: encoded as they are
            return None
        text = _json(_payload(bare, RunFinished, ""))
        if text.count(_STEPS_SLOT) != 1:
            return None
        return _line(text.replace(_STEPS_SLOT, '"steps": [' + ", ".join(self._texts) + "]"))


CHECKSUM_KEY = "checksum"
"""Key of the per-line checksum (since schema 1.3). Reserved like ``RECORD_KEY``."""

_CHECKSUM_PREFIX = b', "checksum": "'
_CHECKSUM_SUFFIX_LENGTH = len(_CHECKSUM_PREFIX) + 8 + 2  # prefix, 8 hex digits, '"}'
_CHECKSUMMED_SINCE_MINOR = 3


def _verify_checksum(line: bytes, run_id: str, line_number: int) -> bool:
    """Check the line's checksum if it has one in its place; say whether it had one.

    The checksum is the CRC-32 (``zlib.crc32``, 8 lowercase hex digits) of the line's bytes as
    they would be without it: everything before ``, "checksum": "`` plus the closing ``}``.
    A mismatch raises ``LogChecksumError`` (a ``LogCorruptError`` and a ``DecodeError``) naming
    the run and line.
    """
    size = _CHECKSUM_SUFFIX_LENGTH
    if len(line) <= size or line[-size : -size + len(_CHECKSUM_PREFIX)] != _CHECKSUM_PREFIX:
        return False
    if not line.endswith(b'"}'):
        return False
    stated = line[-10:-2]
    actual = b"%08x" % zlib.crc32(line[:-size] + b"}")
    if stated != actual:
        raise LogChecksumError(
            f"{_where(run_id, line_number)}: the checksum does not match the record "
            f"(stored {stated.decode('ascii', 'replace')!r}, computed {actual.decode()!r}): "
            "the line was changed after it was written; it is never trusted or skipped",
            line=line_number,
        )
    return True


_MAJOR = SCHEMA_VERSION.partition(".")[0]


def _claimed_minor(payload: Mapping[str, object]) -> tuple[int, str] | None:
    """The minor version a payload of this major claims, as a key that orders numerically
    (``(digits, digits without leading zeros)``, so a 5,000-digit minor needs no ``int``);
    ``None`` when the payload claims no readable version of this major (its decoder says why).
    """
    version = payload.get(VERSION_KEY)
    if not isinstance(version, str):
        return None
    major, _, minor = version.partition(".")
    if major != _MAJOR or not (minor.isascii() and minor.isdigit()):
        return None
    digits = minor.lstrip("0") or "0"
    return len(digits), digits


_CHECKSUMMED_SINCE = (1, str(_CHECKSUMMED_SINCE_MINOR))


def _requires_checksum(claimed: tuple[int, str] | None) -> bool:
    """Whether a payload claiming ``claimed`` was written by a version that always adds a
    checksum."""
    return claimed is not None and claimed >= _CHECKSUMMED_SINCE


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8, surrogates written so that they read back unchanged (see above).

    ``_line`` tries the plain ``text.encode("utf-8")`` first and calls this only when the text
    holds a surrogate."""
    out = bytearray()
    position = 0
    previous_high_at = -2
    for match in _SURROGATE.finditer(text):
        at = match.start()
        out += text[position:at].encode("utf-8")
        code = ord(text[at])
        if code >= 0xDC00 and previous_high_at == at - 1:
            out += text[at].encode("utf-8", "surrogatepass")
        else:
            out += f"\\u{code:04x}".encode("ascii")
        if code < 0xDC00:
            previous_high_at = at
        position = at + 1
    out += text[position:].encode("utf-8")
    return bytes(out)


def decode_line(line: bytes, *, run_id: str, line_number: int) -> Record:
    """Turn one stored line (without its ``\\n``) back into a record.

    Every failure is a ``DecodeError`` whose message starts with the run id and the 1-based line
    number, followed by what is wrong: not UTF-8, not JSON, not a JSON object, no ``"record"``
    tag, an unknown tag, or a field the record's decoder rejects. A line whose checksum does
    not match, or a line of schema 1.3 or later without its checksum in place, is a
    ``LogChecksumError`` (a ``LogCorruptError`` that is also a ``DecodeError``) with the same
    prefix (and ``line`` set): the bytes were changed.
    Lines written before 1.3 have no checksum and are read as before.

    One line alone cannot show the rule that ties it to its log (no line claims an older
    schema version than the log's first record); ``decode_entries`` and ``decode_lines``, which
    the stores read with, check it too.
    """
    return _decode_line(line, run_id, line_number, None)[0]


class _Floor(NamedTuple):
    """The schema version a log's first record claims: no later line may claim an older one."""

    minor: tuple[int, str]
    version: str
    line: int


def _decode_line(
    line: bytes, run_id: str, line_number: int, floor: _Floor | None
) -> tuple[Record, tuple[int, str] | None, object]:
    """``decode_line``, plus the version rule against ``floor`` (``None`` for the log's first
    record); returns the record, the minor it claims and its version as written."""
    checked = _verify_checksum(line, run_id, line_number)
    try:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            # A low surrogate right after a high one is stored as its generalized UTF-8
            # sequence (see encode_line); any other invalid byte still fails here.
            text = line.decode("utf-8", "surrogatepass")
        payload = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: not JSON (JSONDecodeError), or an integer longer than Python converts
        # (sys.get_int_max_str_digits). RecursionError: nesting deeper than the parser's stack.
        where = _where(run_id, line_number)
        raise DecodeError(
            f"{where}: not a readable JSON line ({type(exc).__name__}: {_short(exc)}); a "
            "complete line that does not parse means the file was changed by something other "
            "than this library, and it is never skipped"
        ) from exc
    if not isinstance(payload, dict):
        where = _where(run_id, line_number)
        raise DecodeError(f"{where}: expected a JSON object, got {type(payload).__name__}")
    claimed = _claimed_minor(payload)
    if floor is not None and claimed is not None and claimed < floor.minor:
        raise LogChecksumError(
            f"{_where(run_id, line_number)}: the line claims schema version "
            f"{payload[VERSION_KEY]!r}, older than the {floor.version!r} of its log's first "
            f"record (line {floor.line}); no line may claim an older version than its log's "
            "first record, because an older version's line skips checks (the checksum) that "
            "the log's own version requires: the line was changed after it was written, or "
            "appended by an older polyloop",
            line=line_number,
        )
    if not checked and (CHECKSUM_KEY in payload or _requires_checksum(claimed)):
        raise LogChecksumError(
            f"{_where(run_id, line_number)}: the line's checksum is missing or not in its "
            f"place (the last member, written by schema 1.{_CHECKSUMMED_SINCE_MINOR} and "
            "later): the line was changed after it was written",
            line=line_number,
        )
    if RECORD_KEY not in payload:
        raise DecodeError(f"{_where(run_id, line_number)}: the {RECORD_KEY!r} tag is missing")
    tag = payload[RECORD_KEY]
    kind = RECORDS.by_tag.get(tag) if isinstance(tag, str) else None
    if kind is None:
        raise DecodeError(
            f"{_where(run_id, line_number)}: unknown {RECORD_KEY!r} tag {tag!r}; expected one of "
            f"{', '.join(repr(entry.tag) for entry in RECORDS.kinds)}"
        )
    decoder = record_decoder(kind.record_cls)
    try:
        return decoder(payload), claimed, payload[VERSION_KEY]
    except DecodeError as exc:
        raise DecodeError(f"{_where(run_id, line_number)}: {exc}") from exc


def decode_entries(lines: Iterable[tuple[int, bytes]], *, run_id: str) -> tuple[LogEntry, ...]:
    """Decode a log's stored lines, ``(line number, line without its \\n)`` in write order.

    Each line is ``decode_line``'s, and one more rule ties the lines to each other: no line
    may claim an older schema version than the log's first record (schema 1.7, issue 21). A
    log written by one version, or resumed by newer ones, reads; a line that claims an older
    version than the first record is a ``LogChecksumError`` naming the run and the line,
    because the older version's rules are weaker (a line that claims 1.2 carries no
    checksum), so such a claim would hide an edited line. Every failure carries its line
    number as ``DecodeError.line``. This is how all three shipped stores read a log.
    """
    entries: list[LogEntry] = []
    floor: _Floor | None = None
    for number, line in lines:
        try:
            record, claimed, version = _decode_line(line, run_id, number, floor)
        except DecodeError as exc:
            exc.line = number
            raise
        if floor is None and claimed is not None:
            floor = _Floor(claimed, str(version), number)
        entries.append(LogEntry(line=number, record=record))
    return tuple(entries)


def decode_lines(raw: bytes, *, run_id: str) -> tuple[LogEntry, ...]:
    """Decode a whole JSONL log's bytes into its records, in file order, with line numbers.

    This is the one reading rule of ``JsonlRunStore``: a line counts if and only if it ends
    with ``\\n``; the bytes after the last ``\\n`` are a write that never completed and are
    ignored; whitespace-only lines are ignored; every other line must decode, and one that does
    not raises ``DecodeError`` naming ``run_id`` and the line in its message and carrying the
    line number as ``DecodeError.line``; the lines together keep ``decode_entries``'s version
    rule. ``JsonlRunStore.read_log`` is ``assemble_log`` over this; readers that need to say
    *where* a record is (``python -m polyloop``, the soak scoreboard) use it directly.
    """
    numbered = enumerate(raw.split(b"\n")[:-1], start=1)
    return decode_entries(
        ((number, line) for number, line in numbered if line.strip()), run_id=run_id
    )


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def _where(run_id: str, line_number: int) -> str:
    """The prefix of every ``DecodeError`` of a line; built only when a line fails."""
    return f"log of run {run_id!r}, line {line_number}"


def assemble_log(records: Iterable[Record], *, lines: Iterable[int] | None = None) -> RunLog:
    """Build a ``RunLog`` from records in write order.

    Each kind goes to its ``RunLog`` field (``RECORDS``' ``log_field``), in order. ``started``
    and ``finished`` (the ``single`` kinds) hold the last record of their kind; the shipped
    stores never write a second ``RunStarted`` (exclusive start), so two can only come from a
    file edited by hand. ``RunLog.entries`` holds every record with its line: the matching item
    of ``lines`` (the JSONL store skips blank lines, so its line numbers can have gaps), or its
    1-based position when ``lines`` is ``None``.
    """
    by_class = RECORDS.by_class
    fields: dict[str, object] = {}
    entries: list[LogEntry] = []
    numbers = iter(lines) if lines is not None else itertools.count(1)
    for record, line in zip(records, numbers, strict=False):
        entries.append(LogEntry(line=line, record=record))
        kind = by_class.get(type(record))
        if kind is None:
            raise PolyloopTypeError(
                f"assemble_log takes log records ({RECORDS.names()}), got "
                f"{type(record).__qualname__} at line {line}; pass the records a store decoded"
            )
        name = kind.log_field
        if name is None:
            continue
        if kind.single:
            fields[name] = record
        else:
            kept = fields.get(name)
            if kept is None:
                fields[name] = [record]
            else:
                kept.append(record)  # type: ignore[attr-defined]
    for name, value in fields.items():
        if type(value) is list:
            fields[name] = tuple(value)
    return RunLog(entries=tuple(entries), **fields)  # type: ignore[arg-type]
