"""``PostgresRunStore``: the run log in a shared PostgreSQL database, with fenced run leases.

Needs the ``postgres`` extra (``psycopg`` 3 with its pool). The driver is imported by
``PostgresRunStore.open`` only, so importing ``polyloop.stores`` never imports it (an
import-linter contract keeps the driver inside this module). Design records 0121 (store and
schema), 0120 (leases) and 0212 (group commit, three commits a step, fleet leases).

Schema (created by ``open``; ``polyloop_schema_version`` holds its version):

* ``polyloop_runs(run_id)``: one row per run id that has any record (the exclusive start),
  written by the start (or by an append to a run that has no start), never by other appends;
* ``polyloop_records(id bigserial, run_id, line bytea)``: each record as the exact bytes the
  JSONL store writes for it (``{"record": <tag>, ...}\\n``), in write order by ``id``; the
  kind is the line's own tag, so a new record kind (the settlement, log schema 1.7) needs no
  new table, column or table version;
* ``polyloop_leases(run_id, epoch, released, expires_at)``: one lease row per leased run.

Every write goes through the store's group commit (a ``Batcher`` of
``polyloop.stores._group_commit``, designs 0212 and 0218): the writes of many runs pending at
once are committed by one statement (so one implicit transaction and one WAL flush), each
record fenced by its own run's epoch inside that statement, each caller released once the
batch carrying its record is durable; a record whose lease is lost fails its own caller only.
Lease grants, first reads and releases are batched by the same engine (a ``Batcher`` each: one
statement for whatever is queued of each kind). A batch's
arrays are built by the store in PostgreSQL's binary array format (``_batch_arrays``), and a
large batch's callers are answered in parts, so a fleet is not one convoy (design 0212,
"fleet client CPU"). The outcome and
step of a step are one row, and
``write_pair`` writes two records of a run (a model result and the step's next record) in one
transaction, so a step is three commits. Every write, barrier or not, returns only once its
commit is durable on the server
(``synchronous_commit`` on, the server's default, which a connection with it off is raised to;
issue 24): a record a write returned for survives a crash or restart of the server, not only
of the client. (Until issue 24 model results and steps committed with it off and could vanish
when the *server* crashed, though the session had reported them.) A lease write carries its
epoch and checks it in the same statement, locking the lease row ``FOR SHARE``, so a release or
a takeover (which update that row) waits for the write to commit, and a write that starts after
them finds its epoch stale and stores nothing. Leases expire by the database's clock and are
renewed, all of a store's in one statement, by a task of the holder's event loop on a
connection of its own. Statements that lock several lease rows lock them in run-id order, so
they never deadlock. A failure of the driver or the server (down,
restarting, a broken connection, a full disk) raises ``StoreUnavailableError`` naming the run
and the record, the driver's error as its cause.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import struct
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    StoreSchemaError,
)
from polyloop.ports import RunLog
from polyloop.stores._group_commit import Batcher, Outcome, Pending
from polyloop.stores._leases import (
    FencedRunLease,
    check_lease_record,
    check_wait_seconds,
    held_error,
    lost_error,
    poll_until,
)
from polyloop.stores._postgres_listing import (
    CREATE_INDEX,
    DEFAULT_PAGE,
    RunPage,
    list_runs,
    read_log_bytes,
)
from polyloop.stores._records import TAGS, Record, assemble_log, decode_entries, is_exclusive
from polyloop.stores._writes import RecordWriter, started_error, unavailable_error

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["SCHEMA_VERSION", "STATEMENTS", "PostgresRunLease", "PostgresRunStore", "to_psycopg"]

logger = logging.getLogger("polyloop.stores.postgres")

SCHEMA_VERSION = 1
"""Version of the tables this module creates; ``open`` refuses a database at a newer one."""

_NAME = "PostgresRunStore"
_MAX_BATCH = 1_000  # records per group commit at most (one statement's arrays)
_STORED = Outcome(held=True, written=True)
_SCHEMA_LOCK = 7_368_756_120  # pg_advisory_xact_lock key serialising schema creation

_CREATE: Final = {
    "polyloop_schema_version": (
        "CREATE TABLE IF NOT EXISTS polyloop_schema_version (version integer NOT NULL)",
    ),
    "polyloop_runs": ("CREATE TABLE IF NOT EXISTS polyloop_runs (run_id text PRIMARY KEY)",),
    "polyloop_records": (
        "CREATE TABLE IF NOT EXISTS polyloop_records ("
        "id bigserial PRIMARY KEY, run_id text NOT NULL, line bytea NOT NULL)",
        "CREATE INDEX IF NOT EXISTS polyloop_records_run ON polyloop_records (run_id, id)",
        CREATE_INDEX,  # the listing's (design 0213): instant on the new, empty table
    ),
    "polyloop_leases": (
        "CREATE TABLE IF NOT EXISTS polyloop_leases (run_id text PRIMARY KEY, "
        "epoch bigint NOT NULL, released boolean NOT NULL, expires_at timestamptz NOT NULL)",
    ),
}
"""Schema v1, table by table, each with its indexes: an open makes only the missing tables,
so it never locks a table that exists (an index statement on one takes a share lock on it
even when the index is there)."""

_TABLES = tuple(_CREATE)
_TABLES_ELSEWHERE = (
    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = ANY(%s::text[]) AND c.relkind = 'r'"
)  # the schemas holding a table of that name, whether the search path reaches them or not
_MISSING_TABLES = (
    "SELECT tbl FROM unnest(%s::text[]) WITH ORDINALITY AS t(tbl, n) "
    "WHERE to_regclass(tbl) IS NULL ORDER BY n"
)  # the tables of ``_CREATE`` that the connection's search path does not find

# Raises a connection's synchronous_commit from off (a server, database or role setting) to on,
# once per connection: every commit of the store is durable when it returns (issue 24). Every
# other value (local, remote_write, on, remote_apply) already waits for the local WAL flush, and
# the stronger ones for a standby too, so it is left as it is.
_DURABLE_COMMITS = (
    "SELECT set_config('synchronous_commit', 'on', false) "
    "WHERE current_setting('synchronous_commit') = 'off'"
)
_FSYNC = "SELECT current_setting('fsync')"
# The batch statement is prepared on each connection (``prepare=True``); its arrays make the
# planner's custom-versus-generic choice keep choosing a fresh custom plan, which costs more
# than executing it. Only the store's own
# statements run on its connections, so they always use the prepared generic plan.
_GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)"

# Every write: a batch of records of distinct runs (the group committer's, at most one record
# per run), one statement, so one transaction and one WAL flush for the whole batch.
# $1 run ids, $2 lines, $3 epochs (NULL: an unfenced write), $4 whether the record is a start.
# Returns a row only for a record that was not stored: (its position from 1, its lease was
# held); none at all for the usual batch, so the reply stays small.
# * l: the fence. The lease rows of the batch's fenced records, current epoch, not released,
#   unexpired by the database's clock, locked FOR SHARE in run-id order (the lease renewal
#   locks in the same order, so the two never deadlock). A release or a takeover updates the
#   row, so it waits for this commit; a batch after it finds the epoch stale.
# * r: the exclusive start. A start inserts its run id (the primary key decides between two
#   starts, also of two processes); an append inserts it only when the run has no row yet (an
#   index lookup, no write, for every run that started: no per-append upsert).
# * w: the records whose fence held (and, for a start, whose run id was free), in batch order.
_BATCH = """
WITH b AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::bigint[], $4::boolean[])
        WITH ORDINALITY AS b (run_id, line, epoch, is_start, ord)
),
l AS (
    SELECT b.ord FROM b JOIN polyloop_leases o ON o.run_id = b.run_id AND o.epoch = b.epoch
    WHERE NOT o.released AND o.expires_at > clock_timestamp()
    ORDER BY o.run_id FOR SHARE OF o
),
ok AS (SELECT b.* FROM b WHERE b.epoch IS NULL OR b.ord IN (SELECT ord FROM l)),
r AS (
    INSERT INTO polyloop_runs (run_id)
    SELECT DISTINCT ok.run_id FROM ok
    WHERE ok.is_start OR NOT EXISTS (SELECT 1 FROM polyloop_runs p WHERE p.run_id = ok.run_id)
    ORDER BY ok.run_id
    ON CONFLICT DO NOTHING RETURNING run_id
),
w AS (
    INSERT INTO polyloop_records (run_id, line)
    SELECT ok.run_id, ok.line FROM ok
    WHERE NOT ok.is_start OR ok.run_id IN (SELECT run_id FROM r)
    ORDER BY ok.ord RETURNING run_id
)
SELECT b.ord, b.epoch IS NULL OR b.ord IN (SELECT ord FROM l) FROM b
WHERE b.run_id NOT IN (SELECT run_id FROM w)
"""

# Lease grants, first reads and releases are batched too (``Batcher``, designs 0212, 0218):
# each is one statement for whatever is queued when a worker is free, whatever the number of
# runs. A batch holds distinct run ids (a second acquire of a run id waits for the next
# batch, where the first holds it), inserted and locked in run-id order; a row held by a live
# lease is left as it is and its run id does not come back.
_ACQUIRE = """
INSERT INTO polyloop_leases AS o (run_id, epoch, released, expires_at)
SELECT k.run_id, 1, false, clock_timestamp() + make_interval(secs => $2)
FROM unnest($1::text[]) AS k (run_id) ORDER BY k.run_id
ON CONFLICT (run_id) DO UPDATE
    SET epoch = o.epoch + 1, released = false, expires_at = EXCLUDED.expires_at
    WHERE o.released OR o.expires_at <= clock_timestamp()
RETURNING o.run_id, o.epoch
"""
# Extends every held lease of the store in one statement. h locks the rows in run-id order
# first, as a batch's fence does, so a renewal and a batch never deadlock; the UPDATE repeats
# the checks, for a row that changed between the snapshot and the lock.
_RENEW = """
WITH h AS (
    SELECT o.run_id, o.epoch FROM polyloop_leases o
    JOIN unnest($1::text[], $2::bigint[]) AS k (run_id, epoch)
        ON o.run_id = k.run_id AND o.epoch = k.epoch
    WHERE NOT o.released AND o.expires_at > clock_timestamp()
    ORDER BY o.run_id FOR NO KEY UPDATE OF o
)
UPDATE polyloop_leases AS o SET expires_at = clock_timestamp() + make_interval(secs => $3)
FROM h
WHERE o.run_id = h.run_id AND o.epoch = h.epoch AND NOT o.released
    AND o.expires_at > clock_timestamp()
RETURNING o.run_id, o.epoch
"""
# Releases: the rows locked in run-id order first (as the renewal does), then marked released.
_RELEASE = """
WITH h AS (
    SELECT o.run_id, o.epoch FROM polyloop_leases o
    JOIN unnest($1::text[], $2::bigint[]) AS k (run_id, epoch)
        ON o.run_id = k.run_id AND o.epoch = k.epoch
    ORDER BY o.run_id FOR NO KEY UPDATE OF o
)
UPDATE polyloop_leases AS o SET released = true
FROM h WHERE o.run_id = h.run_id AND o.epoch = h.epoch
"""
# Whether a lease is still its run's current one (``check_fence``): the batch's fence, alone.
_CURRENT = """
SELECT 1 FROM polyloop_leases o
WHERE o.run_id = $1 AND o.epoch = $2 AND NOT o.released AND o.expires_at > clock_timestamp()
"""
_READ = """
SELECT run_id, line FROM polyloop_records WHERE run_id = ANY($1::text[]) ORDER BY run_id, id
"""
_AUX_WORKERS = 2  # batches of grants (and of reads, and of releases) in flight at once

STATEMENTS = {"batch": _BATCH, "renew": _RENEW, "read_log": _READ}
"""The store's statements in ``$n`` form, for the benchmark (``tools/bench/postgres_store.py``);
``to_psycopg`` converts them. Since issue 24 every write is the ``batch`` statement (``$1``
run ids, ``$2`` lines, ``$3`` epochs, ``$4`` start flags), a batch of one included, and
``read_log`` reads the runs of its ``$1`` (an array of run ids) in one statement."""


def to_psycopg(text: str, *, binary: bool = False) -> str:
    """The statements are written with ``$n`` placeholders; psycopg takes ``%s``-style ones
    (``%b`` ones with ``binary``: parameters sent in binary form)."""
    kind = "b" if binary else "s"
    return re.sub(r"\$(\d+)", lambda m: "%(p" + m.group(1) + ")" + kind, text)


# The statements as psycopg sends them, converted once (not on every write).
# Binary parameters: dumping a batch's arrays as text (quoting every JSON line) costs several
# times what binary does; the store builds the binary arrays itself (``_batch_arrays``,
# below), cheaper still.
_Q_BATCH = to_psycopg(_BATCH, binary=True)
_Q_ACQUIRE = to_psycopg(_ACQUIRE)
_Q_RENEW = to_psycopg(_RENEW)
_Q_RELEASE = to_psycopg(_RELEASE)
_Q_READ = to_psycopg(_READ)
_Q_CURRENT = to_psycopg(_CURRENT)

_Grant = int | None  # a lease grant's answer: its epoch, or None while another holds it


class PostgresRunStore(RecordWriter):
    """A ``RunStore`` and ``LeasingRunStore`` on a PostgreSQL database (14 or newer).

    Build it with ``await PostgresRunStore.open(conninfo, ...)`` (or ``async with``), which
    creates the pool and the tables; ``await store.close()`` closes the pool. ``conninfo`` is
    a libpq connection string or URL; it is never reported by ``parameters()`` or ``repr``.

    * Same records, same bytes and same ``DecodeError`` texts as the JSONL store (records are
      numbered like the lines of a JSONL file), so a run can be copied between stores.
    * ``write_run_started`` is exclusive (``RunAlreadyStartedError``, a ``FileExistsError``,
      when the run id has any record); the outcome and step of a step are one record.
    * Group commit (design 0212): the writes pending at once, of many runs, share one
      statement and one commit; each record is fenced by its own run's epoch inside it, and
      each caller is released only when its own record is durable. ``writers`` batches are in
      flight at once (``open``), each on a connection of the pool.
    * Lease grants, ``read_log`` and lease releases pending at once are one statement each
      (the writes' batching engine, one per kind, two in flight at most): a fleet's starts
      and ends do not queue one statement per run on the pool.
    * ``write_pair(first, second)`` writes two records of one run back to back in one
      transaction (both or neither; neither a ``RunStarted``), durable when it returns; the
      session uses it for a model result and the step's next record (three commits a step).
    * Every write, barrier or not, is durable when it returns: it commits with
      ``synchronous_commit`` on (a connection where the server, database or role says off is
      raised to on when the pool opens it), so with the server's ``fsync`` on every record a
      write returned for survives a crash or restart of the server (issue 24). ``open`` logs a
      warning when the server runs with ``fsync`` off, which no client setting can make up for.
    * A failure of the driver or the server (unreachable, shut down or restarting, a broken
      connection, a full disk on the server, a pool that timed out) raises
      ``polyloop.errors.StoreUnavailableError`` from every write, ``read_log``,
      ``acquire_lease`` and ``open``, naming the run and the record, the driver's error as
      ``__cause__``. Connections the crash broke are replaced by the pool as they fail.
    * Run leases expire ``lease_seconds`` after their last renewal by the database's clock; a
      holder's event loop renews them every third of that. A paused or partitioned holder
      loses its lease, and its next write raises ``RunLeaseLostError`` and stores nothing.
    * Writes of one run are not serialised by the store: the library writes one at a time.
    * ``write_fenced`` and ``end_lease`` are the store side of its leases
      (``polyloop.stores._leases.FencingStore``); write through the lease instead.
    """

    __slots__ = (
        "_committer",
        "_conninfo",
        "_failures",
        "_grants",
        "_held",
        "_lease_seconds",
        "_makes_schema",
        "_pool",
        "_reads",
        "_releases",
        "_renewer",
    )

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        conninfo: str,
        lease_seconds: float,
        writers: int,
        max_batch: int = _MAX_BATCH,
        makes_schema: bool = True,
    ) -> None:
        from psycopg import Error as DriverError  # loaded already: the pool imported it

        self._pool = pool
        # What the driver raises when the server or the connection fails (pool timeouts too);
        # turned into StoreUnavailableError. polyloop's own refusals are raised outside.
        self._failures: tuple[type[BaseException], ...] = (DriverError, OSError)
        self._conninfo = conninfo  # for the renewal connection; never reported
        self._lease_seconds = lease_seconds
        self._makes_schema = makes_schema  # ``open(create_tables=False)``: never change it
        self._held: dict[tuple[str, int], FencedRunLease] = {}
        self._renewer: asyncio.Task[None] | None = None
        batched = functools.partial(Batcher, max_batch=max_batch, failures=self._failures)
        self._committer: Batcher[Outcome] = batched(
            self._commit_batch, name="record writes", workers=writers
        )
        self._grants: Batcher[_Grant] = batched(
            self._grant_batch, name="lease grants", workers=_AUX_WORKERS
        )
        self._reads: Batcher[list[bytes]] = batched(
            self._read_batch, name="first reads", workers=_AUX_WORKERS
        )
        self._releases: Batcher[None] = batched(
            self._release_batch, name="lease releases", workers=_AUX_WORKERS
        )

    @classmethod
    async def open(
        cls,
        conninfo: str,
        *,
        pool_size: int = 10,
        lease_seconds: float = 15.0,
        connect_timeout: float = 30.0,
        writers: int | None = None,
        create_tables: bool = True,
    ) -> PostgresRunStore:
        """Connect a pool of ``pool_size`` connections and create the tables that are missing
        (unless ``create_tables=False``).

        ``writers`` is how many group-commit batches may be in flight at once, each on a
        connection of the pool (default: ``pool_size // 2``, at least 1, so reads and lease
        grants always find a connection); at most ``pool_size``.

        ``create_tables=False`` opens a database whose polyloop tables exist and changes no
        schema: what a reader (``python -m polyloop``) does, so that pointing it at the wrong
        database creates nothing there, and a role without ``CREATE`` on the schema (the
        default on PostgreSQL 15 and later) can read. A database without the tables is then a
        ``StoreSchemaError`` naming the missing ones.

        Raises ``StoreSchemaError`` when the database's polyloop schema is newer than this
        library's (or missing, with ``create_tables=False``), and ``StoreUnavailableError``
        (the driver's error as its cause) when the server cannot be reached or the tables
        cannot be created.
        """
        if not isinstance(create_tables, bool):
            raise PolyloopTypeError(
                f"{_NAME}.open: create_tables must be True or False, got "
                f"{type(create_tables).__name__}"
            )
        if not isinstance(conninfo, str) or not conninfo:
            raise PolyloopTypeError(
                f"{_NAME}.open: conninfo must be a non-empty libpq connection string or URL, "
                f"got {type(conninfo).__name__}"
            )
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise PolyloopValueError(f"{_NAME}.open: pool_size must be an int >= 1")
        if writers is None:
            writers = max(1, pool_size // 2)
        if isinstance(writers, bool) or not isinstance(writers, int) or writers < 1:
            raise PolyloopValueError(
                f"{_NAME}.open: writers must be an int between 1 and pool_size ({pool_size}), "
                f"got {writers!r} ({type(writers).__name__})"
            )
        if writers > pool_size:
            raise PolyloopValueError(
                f"{_NAME}.open: writers ({writers}) must not exceed pool_size ({pool_size}): "
                "each writer commits on a connection of the pool; raise pool_size or lower writers"
            )
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
            raise PolyloopTypeError(f"{_NAME}.open: lease_seconds must be a number of seconds")
        if not 0.05 <= lease_seconds <= 86_400:
            raise PolyloopValueError(
                f"{_NAME}.open: lease_seconds must be between 0.05 and 86400, got {lease_seconds!r}"
            )
        from psycopg import Error as DriverError  # the postgres extra; lazy on purpose
        from psycopg_pool import AsyncConnectionPool

        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            conninfo,
            min_size=pool_size,
            max_size=pool_size,
            kwargs={"autocommit": True},
            configure=_durable_commits,
            open=False,
            timeout=connect_timeout,
        )
        try:
            await pool.open(wait=True, timeout=connect_timeout)
            store = cls(
                pool,
                conninfo=conninfo,
                lease_seconds=float(lease_seconds),
                writers=writers,
                makes_schema=create_tables,
            )
            await _check_schema(pool, create=create_tables)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, DriverError | OSError):
                raise unavailable_error(_NAME, exc, run_id=None, record="schema") from exc
            raise
        return store

    async def close(self) -> None:
        """Commit what is queued, stop renewing leases and close the pool. Leases still held
        expire by themselves."""
        for batcher in (self._committer, self._grants, self._reads, self._releases):
            await batcher.close()
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        await self._pool.close()

    async def __aenter__(self) -> PostgresRunStore:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"PostgresRunStore(lease_seconds={self._lease_seconds})"

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "postgres"}``: never the connection string (credentials, host); moving
        the database must not count as drift."""
        return {"kind": "postgres"}

    # -- writes (the seven methods are RecordWriter's) ----------------------------------------

    async def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> None:
        outcome = await self._submit(record.run_id, (line,), None, kind)
        if is_exclusive(kind) and not outcome.written:
            raise started_error(_NAME, record.run_id)

    async def write_pair(self, first: Record, second: Record) -> None:
        """Write two records of one run back to back in one transaction (see the class
        docstring); returns once both are durable. Neither may be a ``RunStarted``."""
        lines = self._pair_lines(first, second, f"{_NAME}.write_pair")
        await self._submit(first.run_id, lines, None, _pair_tag(first, second))

    async def _submit(
        self, run_id: str, lines: tuple[bytes, ...], epoch: int | None, kind: type[Record] | str
    ) -> Outcome:
        """Hand one write to the group committer; return once its batch is durable. ``kind``:
        the record's class, or the tags of a pair (for the error's text). The one coroutine
        between a write method and the committer's future (fewer coroutine objects a write:
        design 0212, "Cost")."""
        if epoch is None:  # a lease's run id was checked when it was granted
            check_run_id(run_id, f"{_NAME}.write")
        try:
            return await self._committer.submit(run_id, lines, epoch, is_exclusive(kind))
        except self._failures as exc:
            tag = kind if isinstance(kind, str) else TAGS[kind]
            raise unavailable_error(_NAME, exc, run_id=run_id, record=tag) from exc

    async def _commit_batch(self, batch: Sequence[Pending]) -> list[Outcome]:
        """Write ``batch`` (writes of distinct runs) in one statement, so one transaction;
        return each write's outcome, in batch order, once the commit is durable."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                _Q_BATCH, _batch_arrays(batch, _text_codec(conn)), prepare=True
            )
            rows = await cursor.fetchall()
        outcomes = [_STORED] * len(batch)
        if rows:  # only the records not stored come back, by position among the lines
            owners = [index for index, pending in enumerate(batch) for _ in pending.lines]
            for position, held in rows:
                outcomes[owners[position - 1]] = Outcome(held=bool(held), written=False)
        return outcomes

    async def _grant_batch(self, batch: Sequence[Pending]) -> list[_Grant]:
        """Grant the leases of ``batch``'s runs (distinct) in one statement; each one's epoch,
        or ``None`` (held by a live lease)."""
        run_ids = [pending.run_id for pending in batch]
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                _Q_ACQUIRE, {"p1": sorted(run_ids), "p2": self._lease_seconds}, prepare=True
            )
            granted: dict[str, int] = {row[0]: int(row[1]) for row in await cursor.fetchall()}
        return [granted.get(run_id) for run_id in run_ids]

    async def _read_batch(self, batch: Sequence[Pending]) -> list[list[bytes]]:
        """The lines of each of ``batch``'s runs (distinct), in write order, in one statement."""
        logs: dict[str, list[bytes]] = {pending.run_id: [] for pending in batch}
        async with self._pool.connection() as conn:
            cursor = await conn.execute(_Q_READ, {"p1": list(logs)}, prepare=True)
            for run_id, line in await cursor.fetchall():
                logs[run_id].append(bytes(line))
        return [logs[pending.run_id] for pending in batch]

    async def _release_batch(self, batch: Sequence[Pending]) -> list[None]:
        """Mark the lease rows of ``batch`` (its runs and epochs) released, in one statement."""
        async with self._pool.connection() as conn:
            await conn.execute(
                _Q_RELEASE,
                {"p1": [p.run_id for p in batch], "p2": [p.epoch for p in batch]},
                prepare=True,
            )
        return [None] * len(batch)

    async def read_log(self, run_id: str) -> RunLog:
        """Read the run's records in write order; ``RunLog()`` for an unknown run id."""
        check_run_id(run_id, f"{_NAME}.read_log")
        try:
            lines = await self._reads.submit(run_id)
        except self._failures as exc:
            raise unavailable_error(_NAME, exc, run_id=run_id, record="log") from exc
        entries = decode_entries(
            ((number, line[:-1]) for number, line in enumerate(lines, start=1)), run_id=run_id
        )
        return assemble_log((e.record for e in entries), lines=(e.line for e in entries))

    async def list_runs(self, *, after: str | None = None, limit: int = DEFAULT_PAGE) -> RunPage:
        """One page of the runs in the database, in byte order of their ids, after ``after``;
        ``RunPage.next_after`` is the next page's ``after`` (``None`` on the last page).
        Reads the records table only (``polyloop.stores._postgres_listing``; design 0213)."""
        return await list_runs(
            self._pool, self._failures, after=after, limit=limit, make_index=self._makes_schema
        )

    async def read_log_bytes(self, run_ids: Iterable[str]) -> Mapping[str, bytes]:
        """Each run's log as the exact bytes its ``JsonlRunStore`` file would hold, in one
        statement (``b""`` for a run id without records); for readers such as the inspector."""
        return await read_log_bytes(self._pool, self._failures, run_ids)

    # -- leases ------------------------------------------------------------------------------

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> PostgresRunLease:
        """Lease ``run_id`` (see ``polyloop.ports.LeasingRunStore``)."""
        check_run_id(run_id, f"{_NAME}.acquire_lease")
        wait = check_wait_seconds(wait_seconds, f"{_NAME}.acquire_lease")

        async def attempt() -> PostgresRunLease | None:
            try:
                epoch = await self._grants.submit(run_id)
            except self._failures as exc:
                raise unavailable_error(_NAME, exc, run_id=run_id, record="lease") from exc
            if epoch is None:
                return None
            lease = PostgresRunLease(self, run_id, epoch)
            self._hold(lease)
            return lease

        return await poll_until(attempt, wait, lambda: held_error(_NAME, run_id, wait))

    def write_fenced(
        self,
        lease: FencedRunLease,
        line: bytes | tuple[bytes, ...],
        kind: type[Record] | str,
    ) -> Awaitable[None]:
        """Insert ``line`` (or, from ``PostgresRunLease.write_pair``, a pair's two lines, with
        their tags as ``kind``) in one statement that checks ``lease``'s epoch on the lease row
        (``FOR SHARE``) and inserts only if it is current and unexpired; the awaitable returns
        once the commit is durable, or raises what the commit found (``_FencedWrite``). No
        coroutine between a lease's write and the group committer's future (fewer objects a
        write in flight: designs 0212 and 0214); what the
        store refuses before queueing is raised by this call, inside the lease's write."""
        if lease.released:  # a release cancelled before its update: still no write after it
            raise lost_error(_NAME, lease.run_id, lease.epoch, "it was released")
        lines = (line,) if isinstance(line, bytes) else line
        write = _FencedWrite(
            lease.run_id,
            lines,
            lease.epoch,
            is_exclusive(kind),
            asyncio.get_running_loop().create_future(),
            lease,
            kind,
            self._failures,
        )
        try:
            self._committer.put(write)
        except self._failures as exc:
            raise write.unavailable(exc) from exc
        return write.future

    async def check_fence(self, lease: FencedRunLease) -> None:
        """``RunLeaseLostError`` unless ``lease``'s row still has its epoch, unreleased and
        unexpired by the database's clock (the batch's fence, read alone); writes nothing."""
        if lease.released:
            raise lost_error(_NAME, lease.run_id, lease.epoch, "it was released")
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(
                    _Q_CURRENT, {"p1": lease.run_id, "p2": lease.epoch}, prepare=True
                )
                current = await cursor.fetchone()
        except self._failures as exc:
            raise unavailable_error(_NAME, exc, run_id=lease.run_id, record="lease") from exc
        if current is None:
            raise lost_error(
                _NAME, lease.run_id, lease.epoch, "it expired or another lease replaced it"
            )

    async def end_lease(self, lease: FencedRunLease) -> None:
        """Stop renewing ``lease`` and mark its row released (waits for a write in flight).

        Only the first call does anything: a lease no longer renewed was released already,
        or was found lost by the renewer (its row expired or was taken over, so it is free for
        the next acquirer and needs no update). A failed update is logged, never raised: the
        lease then expires by itself.
        """
        if self._held.pop((lease.run_id, lease.epoch), None) is None:
            return
        try:
            await self._releases.submit(lease.run_id, epoch=lease.epoch)
        except self._failures as exc:
            logger.warning("run %s: lease release failed (%s); it will expire", lease.run_id, exc)

    def _hold(self, lease: FencedRunLease) -> None:
        """Renew ``lease`` from now on (one renewer task and connection for all leases)."""
        self._held[(lease.run_id, lease.epoch)] = lease
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.ensure_future(self._renew_forever())

    async def _renew_forever(self) -> None:
        """Every ``lease_seconds / 3``, extend every held lease in one statement, on a
        connection of its own: renewals must not queue behind the pool's writes (with many
        runs per pool they would, and leases would expire under load)."""
        from psycopg import AsyncConnection
        from psycopg import Error as DriverError

        connection: AsyncConnection[Any] | None = None
        try:
            while True:
                await asyncio.sleep(self._lease_seconds / 3)
                held = list(self._held)
                if not held:
                    continue
                try:
                    if connection is None or connection.closed:
                        connection = await AsyncConnection.connect(self._conninfo, autocommit=True)
                        await _durable_commits(connection)
                    cursor = await connection.execute(
                        _Q_RENEW,
                        {
                            "p1": [run_id for run_id, _ in held],
                            "p2": [epoch for _, epoch in held],
                            "p3": self._lease_seconds,
                        },
                    )
                    renewed = {(row[0], int(row[1])) for row in await cursor.fetchall()}
                except (DriverError, OSError) as exc:  # transient: the next round tries again
                    logger.warning("lease renewal failed: %s", exc)
                    connection = None
                    continue
                for key in held:
                    if key not in renewed and key in self._held:
                        logger.warning("run %s: lease (epoch %d) lost, not renewable", *key)
                        self._held.pop(key, None)
        finally:
            if connection is not None:
                await connection.close()


def check_run_id(run_id: object, where: str) -> None:
    """Refuse a run id the database cannot hold, before it is queued: a batch carries the
    records of many runs in one statement, so such an id would fail every run in its batch
    (design 0212: a bad record fails its own caller only). Not a ``str``: ``PolyloopTypeError``;
    a NUL character (no PostgreSQL text holds one) or a lone surrogate (no UTF-8 form):
    ``PolyloopValueError``. The id is never echoed (it may be anything)."""
    if not isinstance(run_id, str):
        raise PolyloopTypeError(f"{where}: run_id must be a str, got {type(run_id).__name__}")
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        unusable = "a lone surrogate (it has no UTF-8 form)"
    else:
        if "\x00" not in run_id:
            return
        unusable = "a NUL character (no PostgreSQL text can hold one)"
    raise PolyloopValueError(
        f"{where}: run_id contains {unusable}; PostgresRunStore keeps run ids as text: use an "
        "id of printable characters"
    )


def _pair_tag(first: Record, second: Record) -> str:
    return f"{TAGS[type(first)]} and {TAGS[type(second)]}"


async def _durable_commits(connection: Any) -> None:
    """The pool's ``configure`` hook: a new connection commits durably (``_DURABLE_COMMITS``),
    keeps its prepared plans (``_GENERIC_PLANS``) and sends the batch's arrays as built
    (``_batch_arrays``)."""
    await connection.execute(_DURABLE_COMMITS)
    await connection.execute(_GENERIC_PLANS)
    for kind, dumper in _array_dumpers().items():
        connection.adapters.register_dumper(kind, dumper)


# -- the batch's four arrays, built in PostgreSQL's binary array format ------------------------
# psycopg's generic list dumper looks up a dumper and calls it for every element in Python
# (at fleet size the largest part of a commit's client side; design 0212, "fleet client
# CPU"). The four arrays of a batch have fixed element types,
# so they are built here with one join each: a header (one dimension, its null flag, the
# element's type, the length, lower bound 1), then each element as its length and its bytes
# (length -1: NULL). The bytes are the driver's own binary forms: text in the connection's
# encoding, bytea as is, int8 big-endian, bool one byte.


class _Array:
    """One of a batch's arrays, already in binary form (``data``); sent as it is by the
    dumper registered on the store's connections for its class (``_array_dumpers``)."""

    __slots__ = ("data",)
    oid = 0

    def __init__(self, data: bytes) -> None:
        self.data = data


class _TextArray(_Array):
    __slots__ = ()
    oid = 1009  # text[]


class _ByteaArray(_Array):
    __slots__ = ()
    oid = 1001  # bytea[]


class _Int8Array(_Array):
    __slots__ = ()
    oid = 1016  # int8[]


class _BoolArray(_Array):
    __slots__ = ()
    oid = 1000  # bool[]


_HEAD = struct.Struct(">iiIii").pack
_LENGTH = struct.Struct(">i").pack
_EPOCH = struct.Struct(">iq").pack
_NULL = _LENGTH(-1)
_TRUE, _FALSE = _LENGTH(1) + b"\x01", _LENGTH(1) + b"\x00"
_ARRAYS = (_TextArray, _ByteaArray, _Int8Array, _BoolArray)


def _text_codec(conn: Any) -> str:
    """The Python codec of the connection's client encoding, as psycopg's own text dumper
    chooses it (``SQL_ASCII``: UTF-8)."""
    codec: str = conn.info.encoding
    return "utf-8" if codec == "ascii" else codec


def _batch_arrays(batch: Sequence[Pending], codec: str) -> dict[str, _Array]:
    """``_BATCH``'s parameters for ``batch``: per line (a pair has two) its run id, the line,
    its epoch (NULL: unfenced) and its start flag."""
    run_ids: list[bytes] = []
    lines: list[bytes] = []
    epochs: list[bytes] = []
    starts: list[bytes] = []
    null_epochs = 0
    for pending in batch:
        encoded = pending.run_id.encode(codec)
        run_id = _LENGTH(len(encoded)) + encoded
        if pending.epoch is None:
            epoch = _NULL
            null_epochs = 1
        else:
            epoch = _EPOCH(8, pending.epoch)
        start = _TRUE if pending.start else _FALSE
        for line in pending.lines:
            run_ids.append(run_id)
            lines.append(_LENGTH(len(line)))
            lines.append(line)
            epochs.append(epoch)
            starts.append(start)
    count = len(run_ids)
    return {
        "p1": _TextArray(_HEAD(1, 0, 25, count, 1) + b"".join(run_ids)),
        "p2": _ByteaArray(_HEAD(1, 0, 17, count, 1) + b"".join(lines)),
        "p3": _Int8Array(_HEAD(1, null_epochs, 20, count, 1) + b"".join(epochs)),
        "p4": _BoolArray(_HEAD(1, 0, 16, count, 1) + b"".join(starts)),
    }


@functools.cache
def _array_dumpers() -> dict[type[_Array], type[Any]]:
    """A psycopg binary dumper for each ``_Array`` class, sending ``data`` as it is (built on
    first use: the driver is imported lazily)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    def dumper(kind: type[_Array]) -> type[Any]:
        class _Dumper(Dumper):
            format = Format.BINARY
            oid = kind.oid

            def dump(self, obj: Any) -> bytes:
                data: bytes = obj.data
                return data

        return _Dumper

    return {kind: dumper(kind) for kind in _ARRAYS}


async def _check_schema(pool: Any, *, create: bool) -> None:
    """Make the tables that are missing (``create``; nothing is touched when all are there, so
    a writer's open takes no lock on a live table), else refuse a database without them;
    refuse a newer schema; warn about a server without ``fsync``."""
    async with pool.connection() as conn, conn.transaction():
        if create:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        cursor = await conn.execute(_MISSING_TABLES, (list(_TABLES),))
        missing = [name for (name,) in await cursor.fetchall()]
        if missing and not create:
            raise StoreSchemaError(await _no_tables(conn, missing))
        for table in missing:
            for statement in _CREATE[table]:
                await conn.execute(statement)
        cursor = await conn.execute("SELECT max(version) FROM polyloop_schema_version")
        row = await cursor.fetchone()
        found = None if row is None else row[0]
        if found is None and not create:
            raise StoreSchemaError(
                f"{_NAME}: the database's polyloop tables have no schema-version row (they "
                "were not made by PostgresRunStore, or the row was deleted); nothing was "
                "changed"
            )
        if found is None:
            await conn.execute(
                "INSERT INTO polyloop_schema_version (version) VALUES (%s)",
                (SCHEMA_VERSION,),
            )
        elif found > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{_NAME}: the database's polyloop tables are at schema version {found}, "
                f"newer than this library's {SCHEMA_VERSION}; upgrade polyloop"
            )
        cursor = await conn.execute(_FSYNC)
        row = await cursor.fetchone()
    if row is not None and row[0] != "on":
        logger.warning(
            "the PostgreSQL server runs with fsync=%s: a record a write returned for can "
            "be lost when the server's machine crashes",
            row[0],
        )


async def _no_tables(conn: Any, missing: list[str]) -> str:
    """Why a store opened not to create tables refuses: which are missing from the search
    path, and where the database does have polyloop tables, if anywhere."""
    cursor = await conn.execute(_TABLES_ELSEWHERE, (list(missing),))
    elsewhere = sorted({schema for (schema,) in await cursor.fetchall()})
    where = (
        f"; the database has polyloop tables in schema {', '.join(elsewhere)}, which this "
        "role's search_path does not reach or it may not use (USAGE)"
        if elsewhere
        else ""
    )
    if len(missing) == len(_TABLES):
        return (
            f"{_NAME}: the database has no polyloop tables on the search path "
            f"({', '.join(missing)}){where or ': no PostgresRunStore has written here'}; "
            "check the database's name (nothing was created)"
        )
    return (
        f"{_NAME}: the database has only some of the polyloop tables ({', '.join(missing)} "
        f"missing{where}); open it once to write (create_tables=True) to make the rest "
        "(nothing was created)"
    )


@dataclass(slots=True, eq=False)
class _FencedWrite(Pending):
    """A lease's write in the group committer: what the commit found becomes what the
    write returns or raises, on its caller's future (``PostgresRunStore.write_fenced``).

    ==============================  =================================================
    the commit found                the caller gets
    ==============================  =================================================
    the lease not held              ``RunLeaseLostError`` ("it was released" if the
                                    lease was released by then, otherwise "it expired
                                    or was taken over"); nothing was stored
    a start on a run with records   ``RunAlreadyStartedError``
    the record stored               ``None``
    a driver or ``OSError`` error   ``StoreUnavailableError`` naming the run and the
                                    record, the error as ``__cause__``
    any other error (a bug)         that error, as it is
    ==============================  =================================================
    """

    lease: FencedRunLease
    kind: type[Record] | str
    failures: tuple[type[BaseException], ...]

    def answer(self, outcome: Outcome) -> None:
        lease = self.lease
        if not outcome.held:
            why = "it was released" if lease.released else "it expired or was taken over"
            self.future.set_exception(lost_error(_NAME, lease.run_id, lease.epoch, why))
        elif self.start and not outcome.written:
            self.future.set_exception(started_error(_NAME, lease.run_id))
        else:
            self.future.set_result(None)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, self.failures):
            failure = self.unavailable(error)
            failure.__cause__ = error
            error = failure
        self.future.set_exception(error)

    def unavailable(self, error: BaseException) -> BaseException:
        """The ``StoreUnavailableError`` of this write, for the driver's ``error``."""
        tag = self.kind if isinstance(self.kind, str) else TAGS[self.kind]
        return unavailable_error(_NAME, error, run_id=self.lease.run_id, record=tag)


class PostgresRunLease(FencedRunLease):
    """A ``RunLease`` on one run of a ``PostgresRunStore`` (from ``acquire_lease``).

    Its epoch is the lease row's. Each write is one statement that checks that epoch on the
    lease row (``FOR SHARE``) and inserts only if it is current and unexpired. A task renews
    the lease every third of ``lease_seconds`` until ``release()``; a failed renewal is
    logged, and the next write then finds out whether the lease survived. Everything else is
    ``polyloop.stores._leases.FencedRunLease``.
    """

    __slots__ = ()

    async def write_pair(self, first: Record, second: Record) -> None:
        """``PostgresRunStore.write_pair`` through this lease: both records fenced by its epoch
        in one statement, both stored or neither (``RunLeaseLostError`` when it is lost)."""
        store = self._store
        assert isinstance(store, PostgresRunStore)
        lines = self._pair_lines(first, second, "PostgresRunLease.write_pair")
        check_lease_record(first.run_id, self._run_id, "PostgresRunLease.write_pair")
        await store.write_fenced(self, lines, _pair_tag(first, second))
