"""``PostgresRunStore``: the run log in a shared PostgreSQL database, with fenced run leases.

Needs the ``postgres`` extra (``psycopg`` 3 with its pool). The driver is imported by
``PostgresRunStore.open`` only, so importing ``polyloop.stores`` never imports it (an
import-linter contract keeps the driver inside this module). Design records 0121 (store and
schema) and 0120 (leases).

Schema (created by ``open``; ``polyloop_schema_version`` holds its version):

* ``polyloop_runs(run_id)``: one row per run id that has any record (the exclusive start);
* ``polyloop_records(id bigserial, run_id, line bytea)``: each record as the exact bytes the
  JSONL store writes for it (``{"record": <tag>, ...}\\n``), in write order by ``id``; the
  kind is the line's own tag, so a new record kind (the settlement, log schema 1.7) needs no
  new table, column or table version;
* ``polyloop_leases(run_id, epoch, released, expires_at)``: one lease row per leased run.

Every write is one SQL statement (so one implicit transaction): the outcome and step of a step
are one row. Every write, barrier or not, returns only once its commit is durable on the server
(``synchronous_commit`` on, the server's default, which a connection with it off is raised to;
issue 24): a record a write returned for survives a crash or restart of the server, not only
of the client. (Until issue 24 model results and steps committed with it off and could vanish
when the *server* crashed, though the session had reported them.) A lease write carries its
epoch and checks it in the same statement, locking the lease row ``FOR SHARE``, so a release or
a takeover (which update that row) waits for the write to commit, and a write that starts after
them finds its epoch stale and stores nothing. Leases expire by the database's clock and are
renewed by a task of the holder's event loop. A failure of the driver or the server (down,
restarting, a broken connection, a full disk) raises ``StoreUnavailableError`` naming the run
and the record, the driver's error as its cause.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from polyloop.errors import (
    PolyloopTypeError,
    PolyloopValueError,
    StoreSchemaError,
)
from polyloop.ports import RunLog
from polyloop.stores._leases import (
    FencedRunLease,
    check_wait_seconds,
    held_error,
    lost_error,
    poll_until,
)
from polyloop.stores._postgres_listing import DEFAULT_PAGE, RunPage, list_runs, read_log_bytes
from polyloop.stores._records import TAGS, Record, assemble_log, decode_entries
from polyloop.stores._writes import RecordWriter, started_error, unavailable_error
from polyloop.types import RunStarted

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["SCHEMA_VERSION", "STATEMENTS", "PostgresRunLease", "PostgresRunStore", "to_psycopg"]

logger = logging.getLogger("polyloop.stores.postgres")

SCHEMA_VERSION = 1
"""Version of the tables this module creates; ``open`` refuses a database at a newer one."""

_NAME = "PostgresRunStore"
_SCHEMA_LOCK = 7_368_756_120  # pg_advisory_xact_lock key serialising schema creation

_CREATE = """
CREATE TABLE IF NOT EXISTS polyloop_schema_version (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS polyloop_runs (run_id text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS polyloop_records (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    line bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS polyloop_records_run ON polyloop_records (run_id, id);
CREATE TABLE IF NOT EXISTS polyloop_leases (
    run_id text PRIMARY KEY,
    epoch bigint NOT NULL,
    released boolean NOT NULL,
    expires_at timestamptz NOT NULL
);
"""

# Raises a connection's synchronous_commit from off (a server, database or role setting) to on,
# once per connection: every commit of the store is durable when it returns (issue 24). Every
# other value (local, remote_write, on, remote_apply) already waits for the local WAL flush, and
# the stronger ones for a standby too, so it is left as it is.
_DURABLE_COMMITS = (
    "SELECT set_config('synchronous_commit', 'on', false) "
    "WHERE current_setting('synchronous_commit') = 'off'"
)
_FSYNC = "SELECT current_setting('fsync')"

# Plain (unfenced) writes. $1 run_id, $2 line.
_PLAIN_START = """
WITH r AS (INSERT INTO polyloop_runs (run_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1)
INSERT INTO polyloop_records (run_id, line) SELECT $1, $2 FROM r RETURNING id
"""
_PLAIN_APPEND = """
WITH r AS (INSERT INTO polyloop_runs (run_id) VALUES ($1) ON CONFLICT DO NOTHING)
INSERT INTO polyloop_records (run_id, line) VALUES ($1, $2) RETURNING id
"""

# Fenced writes. $1 run_id, $2 line, $3 epoch. Returns (lease held, record written).
_LEASE_ROW = """
l AS (SELECT 1 FROM polyloop_leases WHERE run_id = $1 AND epoch = $3 AND NOT released
      AND expires_at > clock_timestamp() FOR SHARE)
"""
_FENCED_START = f"""
WITH {_LEASE_ROW},
r AS (INSERT INTO polyloop_runs (run_id) SELECT $1 FROM l ON CONFLICT DO NOTHING RETURNING 1),
w AS (INSERT INTO polyloop_records (run_id, line) SELECT $1, $2 FROM r RETURNING 1)
SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM w)
"""
_FENCED_APPEND = f"""
WITH {_LEASE_ROW},
r AS (INSERT INTO polyloop_runs (run_id) SELECT $1 FROM l ON CONFLICT DO NOTHING),
w AS (INSERT INTO polyloop_records (run_id, line) SELECT $1, $2 FROM l RETURNING 1)
SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM w)
"""

_ACQUIRE = """
INSERT INTO polyloop_leases AS o (run_id, epoch, released, expires_at)
VALUES ($1, 1, false, clock_timestamp() + make_interval(secs => $2))
ON CONFLICT (run_id) DO UPDATE
    SET epoch = o.epoch + 1, released = false, expires_at = EXCLUDED.expires_at
    WHERE o.released OR o.expires_at <= clock_timestamp()
RETURNING epoch
"""
_RENEW = """
UPDATE polyloop_leases AS o SET expires_at = clock_timestamp() + make_interval(secs => $3)
FROM unnest($1::text[], $2::bigint[]) AS h (run_id, epoch)
WHERE o.run_id = h.run_id AND o.epoch = h.epoch AND NOT o.released
    AND o.expires_at > clock_timestamp()
RETURNING o.run_id, o.epoch
"""
_RELEASE = "UPDATE polyloop_leases SET released = true WHERE run_id = $1 AND epoch = $2"
_READ = "SELECT line FROM polyloop_records WHERE run_id = $1 ORDER BY id"

STATEMENTS = {
    "fenced_barrier": _FENCED_APPEND,
    "fenced_non_barrier": _FENCED_APPEND,
    "read_log": _READ,
}
"""The store's statements in ``$n`` form (``$1`` run id, ``$2`` line, ``$3`` epoch), for the
driver benchmark (``tools/bench/postgres_store.py``); ``to_psycopg`` converts them. Since
issue 24 a barrier and a non-barrier record are written by the same statement (both commit
durably); the two keys stay so the benchmark's rows keep their meaning."""


def to_psycopg(text: str) -> str:
    """The statements are written with ``$n`` placeholders; psycopg takes ``%s``-style ones."""
    return re.sub(r"\$(\d+)", lambda m: "%(p" + m.group(1) + ")s", text)


# The statements as psycopg sends them, converted once (not on every write).
_Q_PLAIN_START = to_psycopg(_PLAIN_START)
_Q_PLAIN_APPEND = to_psycopg(_PLAIN_APPEND)
_Q_FENCED_START = to_psycopg(_FENCED_START)
_Q_FENCED_APPEND = to_psycopg(_FENCED_APPEND)
_Q_ACQUIRE = to_psycopg(_ACQUIRE)
_Q_RENEW = to_psycopg(_RENEW)
_Q_RELEASE = to_psycopg(_RELEASE)
_Q_READ = to_psycopg(_READ)


class PostgresRunStore(RecordWriter):
    """A ``RunStore`` and ``LeasingRunStore`` on a PostgreSQL database (14 or newer).

    Build it with ``await PostgresRunStore.open(conninfo, ...)`` (or ``async with``), which
    creates the pool and the tables; ``await store.close()`` closes the pool. ``conninfo`` is
    a libpq connection string or URL; it is never reported by ``parameters()`` or ``repr``.

    * Same records, same bytes and same ``DecodeError`` texts as the JSONL store (records are
      numbered like the lines of a JSONL file), so a run can be copied between stores.
    * ``write_run_started`` is exclusive (``RunAlreadyStartedError``, a ``FileExistsError``,
      when the run id has any record); every write is one statement, so the outcome and step
      of a step land together.
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

    __slots__ = ("_conninfo", "_failures", "_held", "_lease_seconds", "_pool", "_renewer")

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, conninfo: str, lease_seconds: float
    ) -> None:
        from psycopg import Error as DriverError  # loaded already: the pool imported it

        self._pool = pool
        # What the driver raises when the server or the connection fails (pool timeouts too);
        # turned into StoreUnavailableError. polyloop's own refusals are raised outside.
        self._failures: tuple[type[BaseException], ...] = (DriverError, OSError)
        self._conninfo = conninfo  # for the renewal connection; never reported
        self._lease_seconds = lease_seconds
        self._held: dict[tuple[str, int], FencedRunLease] = {}
        self._renewer: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        conninfo: str,
        *,
        pool_size: int = 10,
        lease_seconds: float = 15.0,
        connect_timeout: float = 30.0,
    ) -> PostgresRunStore:
        """Connect a pool of ``pool_size`` connections and create the tables if missing.

        Raises ``StoreSchemaError`` when the database's polyloop schema is newer than this
        library's, and ``StoreUnavailableError`` (the driver's error as its cause) when the
        server cannot be reached or the tables cannot be created.
        """
        if not isinstance(conninfo, str) or not conninfo:
            raise PolyloopTypeError(
                f"{_NAME}.open: conninfo must be a non-empty libpq connection string or URL, "
                f"got {type(conninfo).__name__}"
            )
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise PolyloopValueError(f"{_NAME}.open: pool_size must be an int >= 1")
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
            store = cls(pool, conninfo=conninfo, lease_seconds=float(lease_seconds))
            await store._create_schema()
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, DriverError | OSError):
                raise unavailable_error(_NAME, exc, run_id=None, record="schema") from exc
            raise
        return store

    async def close(self) -> None:
        """Stop renewing leases and close the pool. Leases still held expire by themselves."""
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

    async def _create_schema(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            await conn.execute(_CREATE)
            cursor = await conn.execute("SELECT max(version) FROM polyloop_schema_version")
            row = await cursor.fetchone()
            found = None if row is None else row[0]
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

    # -- writes (the seven methods are RecordWriter's) ----------------------------------------

    async def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> None:
        if kind is not RunStarted:
            await self._execute(_Q_PLAIN_APPEND, record.run_id, line, kind)
        elif await self._execute(_Q_PLAIN_START, record.run_id, line, kind) == 0:
            raise started_error(_NAME, record.run_id)

    async def read_log(self, run_id: str) -> RunLog:
        """Read the run's records in write order; ``RunLog()`` for an unknown run id."""
        if not isinstance(run_id, str):
            raise PolyloopTypeError(f"{_NAME}.read_log: run_id must be a str")
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(_Q_READ, {"p1": run_id})
                rows = await cursor.fetchall()
        except self._failures as exc:
            raise unavailable_error(_NAME, exc, run_id=run_id, record="log") from exc
        entries = decode_entries(
            ((number, bytes(row[0])[:-1]) for number, row in enumerate(rows, start=1)),
            run_id=run_id,
        )
        return assemble_log((e.record for e in entries), lines=(e.line for e in entries))

    async def list_runs(self, *, after: str | None = None, limit: int = DEFAULT_PAGE) -> RunPage:
        """One page of the runs in the database, in byte order of their ids, after ``after``;
        ``RunPage.next_after`` is the next page's ``after`` (``None`` on the last page).
        Reads the records table only (``polyloop.stores._postgres_listing``; design 0213)."""
        return await list_runs(self._pool, self._failures, after=after, limit=limit)

    async def read_log_bytes(self, run_ids: Iterable[str]) -> Mapping[str, bytes]:
        """Each run's log as the exact bytes its ``JsonlRunStore`` file would hold, in one
        statement (``b""`` for a run id without records); for readers such as the inspector."""
        return await read_log_bytes(self._pool, self._failures, run_ids)

    async def _execute(self, query: str, run_id: str, line: bytes, kind: type[Record]) -> int:
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(query, {"p1": run_id, "p2": line})
                return int(cursor.rowcount)
        except self._failures as exc:
            raise unavailable_error(_NAME, exc, run_id=run_id, record=TAGS[kind]) from exc

    # -- leases ------------------------------------------------------------------------------

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> PostgresRunLease:
        """Lease ``run_id`` (see ``polyloop.ports.LeasingRunStore``)."""
        if not isinstance(run_id, str):
            raise PolyloopTypeError(f"{_NAME}.acquire_lease: run_id must be a str")
        wait = check_wait_seconds(wait_seconds, f"{_NAME}.acquire_lease")

        async def attempt() -> PostgresRunLease | None:
            try:
                async with self._pool.connection() as conn:
                    cursor = await conn.execute(
                        _Q_ACQUIRE, {"p1": run_id, "p2": self._lease_seconds}
                    )
                    row = await cursor.fetchone()
            except self._failures as exc:
                raise unavailable_error(_NAME, exc, run_id=run_id, record="lease") from exc
            if row is None:
                return None
            lease = PostgresRunLease(self, run_id, int(row[0]))
            self._hold(lease)
            return lease

        return await poll_until(attempt, wait, lambda: held_error(_NAME, run_id, wait))

    async def write_fenced(self, lease: FencedRunLease, line: bytes, kind: type[Record]) -> None:
        """Insert ``line`` in one statement that checks ``lease``'s epoch on the lease row
        (``FOR SHARE``) and inserts only if it is current and unexpired; returns once the
        commit is durable."""
        if lease.released:  # a release cancelled before its update: still no write after it
            raise lost_error(_NAME, lease.run_id, lease.epoch, "it was released")
        query = _Q_FENCED_START if kind is RunStarted else _Q_FENCED_APPEND
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(
                    query, {"p1": lease.run_id, "p2": line, "p3": lease.epoch}
                )
                row = await cursor.fetchone()
        except self._failures as exc:
            raise unavailable_error(_NAME, exc, run_id=lease.run_id, record=TAGS[kind]) from exc
        assert row is not None
        held, written = int(row[0]), int(row[1])
        if not held:
            why = "it was released" if lease.released else "it expired or was taken over"
            raise lost_error(_NAME, lease.run_id, lease.epoch, why)
        if kind is RunStarted and not written:
            raise started_error(_NAME, lease.run_id)

    async def end_lease(self, lease: FencedRunLease) -> None:
        """Stop renewing ``lease`` and mark its row released (waits for a write in flight).

        Only the first call does anything: a lease no longer renewed was released already,
        or was found lost by the renewer (its row expired or was taken over, so it is free for
        the next acquirer and needs no update). A failed update is logged, never raised: the
        lease then expires by itself.
        """
        if self._held.pop((lease.run_id, lease.epoch), None) is None:
            return
        from psycopg import Error as DriverError

        try:
            async with self._pool.connection() as conn:
                await conn.execute(_Q_RELEASE, {"p1": lease.run_id, "p2": lease.epoch})
        except (DriverError, OSError) as exc:
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


async def _durable_commits(connection: Any) -> None:
    """The pool's ``configure`` hook: a new connection commits durably (``_DURABLE_COMMITS``)."""
    await connection.execute(_DURABLE_COMMITS)


class PostgresRunLease(FencedRunLease):
    """A ``RunLease`` on one run of a ``PostgresRunStore`` (from ``acquire_lease``).

    Its epoch is the lease row's. Each write is one statement that checks that epoch on the
    lease row (``FOR SHARE``) and inserts only if it is current and unexpired. A task renews
    the lease every third of ``lease_seconds`` until ``release()``; a failed renewal is
    logged, and the next write then finds out whether the lease survived. Everything else is
    ``polyloop.stores._leases.FencedRunLease``.
    """

    __slots__ = ()
