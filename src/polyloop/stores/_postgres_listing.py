"""Run listing and bulk log reading for ``PostgresRunStore`` (issue 24, item 4; design 0213).

``PostgresRunStore.list_runs`` and ``PostgresRunStore.read_log_bytes`` are thin methods that
call the functions here with the store's pool (a ``psycopg_pool.AsyncConnectionPool``, typed
``Any`` here) and the errors its driver raises. They read the ``polyloop_records`` table only
(never ``polyloop_runs``, whose per-append upsert a write path may drop) and import no driver,
not even for typing (contract ``r14``): the pool hands out the connections.

=====================  ==================================================================
rule                   what it means
=====================  ==================================================================
a run                  a run id with at least one record in ``polyloop_records``
order                  run ids in byte order of their UTF-8 text (``COLLATE "C"``), the
                       same on every server whatever its locale; Python's ``sorted`` of
                       the ids gives the same order
page                   at most ``limit`` runs (1 to ``MAX_PAGE``) whose ids sort after
                       ``after`` (all runs when ``after`` is ``None``)
cursor                 ``RunPage.next_after`` is the last id of a full page when more runs
                       follow it, ``None`` on the last page; pass it back as ``after``. A run
                       started between two pages appears exactly when its id sorts after the
                       cursor: the paging never repeats a run and never skips one that existed
                       throughout
summary                ``RunSummary``: ``started`` (its first record is a ``RunStarted``),
                       ``finished`` (it has a ``RunFinished``), ``stop_reason`` (that finish's,
                       else ``None``; read from the finish line's JSON alone, without the
                       record's checks, which ``read_log`` makes; ``None`` on a finished run
                       whose finish line does not parse or names no ``StopReason``: one bad
                       log never fails the listing), ``steps`` (its ``StepCompleted``
                       records), ``records``
                       (all its records). The log holds no wall-clock time, so start and finish
                       are facts, not timestamps
cost                   one statement per page, touching only the page's runs: the run ids come
                       from a loose index scan of ``polyloop_records_run_c`` (one index probe
                       per run), made with the tables (``CREATE_INDEX``) or, in a database
                       made before it, on a writer's first listing (``CREATE_INDEX_LATER``,
                       concurrently, by one lister at a time (an advisory lock); one a
                       failed build left invalid is dropped and built again by the lock's
                       holder); a store opened not to create tables never makes it (a reader
                       may not) and lists without it: one scan of the records table per run
                       of the page, seconds on a large table; a record's kind is its
                       stored line's prefix (no JSON parsing on the server); only finish lines
                       are parsed, in Python (a fraction of what decoding the record
                       with its checks costs)
bulk read              ``read_log_bytes(run_ids)``: each run's log as the exact bytes a
                       ``JsonlRunStore`` file of it holds (its lines, each ending in ``\\n``,
                       in write order), one statement for all; a run id without a record
                       maps to ``b""``
errors                 a failure of the driver or the server is ``StoreUnavailableError``
                       (``record="log"``), the driver's error as its cause
=====================  ==================================================================
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.stores._records import RECORD_KEY, TAGS
from polyloop.stores._writes import unavailable_error
from polyloop.types import RunFinished, RunStarted, StepCompleted, StopReason

__all__ = [
    "CREATE_INDEX",
    "CREATE_INDEX_LATER",
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "RunPage",
    "RunSummary",
    "check_page",
    "line_prefix",
    "list_runs",
    "read_log_bytes",
]

DEFAULT_PAGE: Final = 100
MAX_PAGE: Final = 10_000
_NAME: Final = "PostgresRunStore"


def line_prefix(kind: type[RunStarted] | type[RunFinished] | type[StepCompleted]) -> bytes:
    """The bytes every stored line of ``kind`` starts with: ``{"record": "<tag>",``
    (``encode_line`` writes the tag first, with the JSON encoder's default separators)."""
    return b'{"' + RECORD_KEY.encode() + b'": "' + TAGS[kind].encode() + b'",'


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """One run of a store's listing (see the module docstring's ``summary`` row)."""

    run_id: str
    started: bool
    finished: bool
    stop_reason: str | None
    steps: int
    records: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPage:
    """One page of a listing: its runs in order, and the cursor of the next page."""

    runs: tuple[RunSummary, ...]
    next_after: str | None


def check_page(after: object, limit: object) -> tuple[str, int]:
    """Validate ``after`` and ``limit``; ``after`` ``None`` becomes ``""`` (sorts first)."""
    if after is not None and not isinstance(after, str):
        raise PolyloopTypeError(
            f"{_NAME}.list_runs: after must be a run id (str) or None, got {type(after).__name__}"
        )
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise PolyloopTypeError(
            f"{_NAME}.list_runs: limit must be an int, got {type(limit).__name__}"
        )
    if not 1 <= limit <= MAX_PAGE:
        raise PolyloopValueError(
            f"{_NAME}.list_runs: limit must be between 1 and {MAX_PAGE}, got {limit}"
        )
    return after or "", limit


_INDEX_STATE = (
    "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('polyloop_records_run_c')"
)
"""No row: no index; ``False``: a concurrent build that failed left it invalid (unused)."""
_DROP_INVALID_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS polyloop_records_run_c"
_INDEX_LOCK: Final = 7_368_756_121  # pg_try_advisory_lock key: one builder of the index at once
_TRY_INDEX_LOCK = "SELECT pg_try_advisory_lock(%s)"
_UNLOCK_INDEX = "SELECT pg_advisory_unlock(%s)"
CREATE_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS polyloop_records_run_c "
    'ON polyloop_records ((run_id COLLATE "C"), id)'
)
"""The listing's index, in the transaction that creates the records table (empty: instant)."""
# CONCURRENTLY: writers are not blocked while it is built (an autocommit connection, as the
# pool's are). IF NOT EXISTS: two listers racing build it once.
CREATE_INDEX_LATER: Final = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS polyloop_records_run_c "
    'ON polyloop_records ((run_id COLLATE "C"), id)'
)

# %(after)s the cursor, %(n)s the page size + 1 (to know whether another page follows),
# %(started)s / %(step)s / %(finished)s the line prefixes. The recursive part finds the next
# run id with one index probe each (a loose index scan); the outer LIMIT stops it.
_PAGE = """
WITH RECURSIVE ids (run_id) AS (
    (SELECT run_id COLLATE "C" FROM polyloop_records
     WHERE run_id COLLATE "C" > %(after)s ORDER BY run_id COLLATE "C" LIMIT 1)
    UNION ALL
    SELECT (SELECT r.run_id COLLATE "C" FROM polyloop_records r
            WHERE r.run_id COLLATE "C" > ids.run_id ORDER BY r.run_id COLLATE "C" LIMIT 1)
    FROM ids WHERE ids.run_id IS NOT NULL
),
page AS (SELECT run_id FROM ids WHERE run_id IS NOT NULL LIMIT %(n)s)
SELECT p.run_id,
    (SELECT substr(f.line, 1, length(%(started)s)) = %(started)s FROM polyloop_records f
     WHERE f.run_id = p.run_id ORDER BY f.id LIMIT 1),
    count(*),
    count(*) FILTER (WHERE substr(r.line, 1, length(%(step)s)) = %(step)s),
    (SELECT e.line FROM polyloop_records e
     WHERE e.run_id = p.run_id AND substr(e.line, 1, length(%(finished)s)) = %(finished)s
     ORDER BY e.id DESC LIMIT 1)
FROM page p JOIN polyloop_records r ON r.run_id = p.run_id
GROUP BY p.run_id
ORDER BY p.run_id COLLATE "C"
"""
_PREFIXES: Final = {
    "started": line_prefix(RunStarted),
    "step": line_prefix(StepCompleted),
    "finished": line_prefix(RunFinished),
}
_STOP_REASONS: Final = frozenset(reason.value for reason in StopReason)
_BULK = "SELECT run_id, line FROM polyloop_records WHERE run_id = ANY(%(ids)s) ORDER BY run_id, id"


async def list_runs(
    pool: Any,
    failures: tuple[type[BaseException], ...],
    *,
    after: str | None,
    limit: int,
    make_index: bool,
) -> RunPage:
    """One page of the store's runs (the module docstring's rules); ``failures`` are the
    driver's errors, raised as ``StoreUnavailableError``. ``make_index``: build the listing's
    index if the database has none (a store that may change the schema)."""
    cursor_id, size = check_page(after, limit)
    try:
        async with pool.connection() as conn:
            if make_index:
                await _make_index(conn)
            cursor = await conn.execute(_PAGE, {"after": cursor_id, "n": size + 1, **_PREFIXES})
            rows = await cursor.fetchall()
    except failures as exc:
        raise unavailable_error(_NAME, exc, run_id=None, record="log") from exc
    runs = tuple(_summary(row) for row in rows[:size])
    return RunPage(runs=runs, next_after=runs[-1].run_id if len(rows) > size else None)


async def _make_index(conn: Any) -> None:
    """Build the listing's index if it is missing or invalid, by one lister at a time.

    An index being built concurrently reads as invalid, exactly like one a failed build left;
    so only the holder of ``_INDEX_LOCK`` (a session advisory lock, taken without waiting)
    looks again and drops an invalid one before building: it knows nobody else is building.
    A lister that does not get the lock lists without the index this time."""
    state = await (await conn.execute(_INDEX_STATE)).fetchone()
    if state is not None and state[0]:
        return
    taken = await (await conn.execute(_TRY_INDEX_LOCK, (_INDEX_LOCK,))).fetchone()
    if taken is None or not taken[0]:
        return
    try:
        state = await (await conn.execute(_INDEX_STATE)).fetchone()
        if state is not None and not state[0]:
            await conn.execute(_DROP_INVALID_INDEX)  # a failed build's: build it again
        if state is None or not state[0]:
            await conn.execute(CREATE_INDEX_LATER)
    finally:
        await conn.execute(_UNLOCK_INDEX, (_INDEX_LOCK,))


def _summary(row: tuple[Any, ...]) -> RunSummary:
    run_id, started, records, steps, finish = row
    return RunSummary(
        run_id=run_id,
        started=bool(started),
        finished=finish is not None,
        stop_reason=None if finish is None else _stop_reason(bytes(finish)),
        steps=int(steps),
        records=int(records),
    )


def _stop_reason(line: bytes) -> str | None:
    """The stop reason a finish line names, read from its JSON alone (a summary, not a
    verified read: ``read_log`` checks the record and its checksum); ``None`` when the line
    does not say one (it does not parse, or names no ``StopReason``)."""
    try:
        payload = json.loads(line.decode("utf-8", "surrogatepass"))
    except ValueError:  # not UTF-8 or not JSON: explicit None, read_log names the error
        return None
    result = payload.get("result") if isinstance(payload, dict) else None
    reason = result.get("stop_reason") if isinstance(result, dict) else None
    return reason if reason in _STOP_REASONS else None


async def read_log_bytes(
    pool: Any,
    failures: tuple[type[BaseException], ...],
    run_ids: Iterable[str],
) -> Mapping[str, bytes]:
    """Each run's log as the bytes its JSONL file would hold (``b""`` for an unknown id)."""
    wanted = list(run_ids)
    if not all(isinstance(run_id, str) for run_id in wanted):
        raise PolyloopTypeError(f"{_NAME}.read_log_bytes: run_ids must be run ids (str)")
    logs: dict[str, list[bytes]] = {run_id: [] for run_id in wanted}
    if not wanted:
        return {}
    try:
        async with pool.connection() as conn:
            rows = await (await conn.execute(_BULK, {"ids": wanted})).fetchall()
    except failures as exc:
        raise unavailable_error(_NAME, exc, run_id=None, record="log") from exc
    for run_id, line in rows:
        logs[run_id].append(bytes(line))
    return {run_id: b"".join(lines) for run_id, lines in logs.items()}
