"""``PostgresRunStore.open``'s schema rules (designs 0121, 0213) on the session's throwaway
server: a newer schema is refused; ``create_tables=False`` (the inspector's way) creates
nothing, names the missing tables, and lets a role that may only read the tables read."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from test_postgres_listing import cli, url_of

from polyloop.errors import PolyloopTypeError, StoreSchemaError
from polyloop.inspect import EXIT_BAD_INPUT, EXIT_OK
from polyloop.stores import PostgresRunStore
from polyloop.testing import RecordFactory

pytestmark = pytest.mark.integration

TABLES = ("polyloop_schema_version", "polyloop_runs", "polyloop_records", "polyloop_leases")
records = RecordFactory()


def tables(conninfo: str) -> list[str]:
    """The polyloop tables the database has."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'polyloop%' ORDER BY 1"
        ).fetchall()
    return [name for (name,) in rows]


async def _open_close(conninfo: str, **options: object) -> None:
    store = await PostgresRunStore.open(conninfo, pool_size=1, **options)  # type: ignore[arg-type]
    await store.close()


def test_without_create_tables_a_database_without_them_is_refused_and_left_as_it_was(
    postgres_database: str,
) -> None:
    with pytest.raises(StoreSchemaError, match="no polyloop tables on the search path") as no:
        asyncio.run(_open_close(postgres_database, create_tables=False))
    for name in TABLES:
        assert name in str(no.value)
    assert "no PostgresRunStore has written here" in str(no.value)
    assert "nothing was created" in str(no.value)
    assert tables(postgres_database) == []
    asyncio.run(_open_close(postgres_database))  # the default creates them
    assert tables(postgres_database) == sorted(TABLES)
    asyncio.run(_open_close(postgres_database, create_tables=False))  # now it opens


def test_a_newer_or_an_unversioned_schema_is_refused_and_left_as_it_was(
    postgres_database: str,
) -> None:
    asyncio.run(_open_close(postgres_database))
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("UPDATE polyloop_schema_version SET version = version + 1")
    for create in (True, False):
        with pytest.raises(StoreSchemaError, match="newer than this library's 1; upgrade"):
            asyncio.run(_open_close(postgres_database, create_tables=create))
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("DELETE FROM polyloop_schema_version")
    with pytest.raises(StoreSchemaError, match="have no schema-version row .they were not made"):
        asyncio.run(_open_close(postgres_database, create_tables=False))
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM polyloop_schema_version").fetchone() == (0,)


def test_create_tables_must_be_a_bool(postgres_database: str) -> None:
    with pytest.raises(PolyloopTypeError, match="create_tables must be True or False, got str"):
        asyncio.run(_open_close(postgres_database, create_tables="no"))
    assert tables(postgres_database) == []


def test_the_inspector_creates_nothing_and_a_reader_role_can_read(postgres_database: str) -> None:
    """``ls`` of a database without polyloop tables (a wrong database name) is one line and
    creates nothing; a role with only ``SELECT`` on the tables (no ``CREATE`` on the schema)
    lists and shows the runs a writer stored."""
    url = url_of(postgres_database)
    code, out, err = cli("ls", url)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert "the database has no polyloop tables" in err
    assert tables(postgres_database) == []

    async def write_one() -> None:
        async with await PostgresRunStore.open(postgres_database, pool_size=1) as store:
            await store.write_run_started(records.run_started(run_id="r1", parameter_snapshot={}))

    asyncio.run(write_one())
    reader = f"reader_{uuid.uuid4().hex[:12]}"
    database = postgres_database.rpartition("dbname=")[2].split()[0]
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {reader} LOGIN")  # a fresh hex name: nothing to escape
        conn.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {reader}")
        conn.execute(f"GRANT CONNECT ON DATABASE {database} TO {reader}")
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {reader}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}")
        # A database from before the listing's index came with the tables: the reader lists
        # without it (it may not build it) and leaves it unbuilt.
        conn.execute("DROP INDEX polyloop_records_run_c")
    as_reader = url.replace("postgres@", f"{reader}@", 1)
    code, out, err = cli("ls", as_reader)
    assert (code, err) == (EXIT_OK, ""), err
    assert "r1" in out
    code, out, err = cli("show", as_reader, "--run", "r1")
    assert (code, err) == (EXIT_OK, "")
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('polyloop_records_run_c')").fetchone() == (None,)

    async def list_as_writer() -> None:  # a store that may change the schema builds it
        async with await PostgresRunStore.open(postgres_database, pool_size=1) as store:
            assert [run.run_id for run in (await store.list_runs()).runs] == ["r1"]

    asyncio.run(list_as_writer())
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('polyloop_records_run_c') IS NOT NULL").fetchone()
    assert row == (True,)


def test_a_missing_table_is_named_and_a_writers_open_makes_only_it(postgres_database: str) -> None:
    asyncio.run(_open_close(postgres_database))
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("DROP TABLE polyloop_leases")
    with pytest.raises(StoreSchemaError, match=r"only some .*\(polyloop_leases missing\)"):
        asyncio.run(_open_close(postgres_database, create_tables=False))
    assert "polyloop_leases" not in tables(postgres_database)
    asyncio.run(_open_close(postgres_database))
    assert tables(postgres_database) == sorted(TABLES)


def test_tables_in_a_schema_off_the_search_path_are_named(postgres_database: str) -> None:
    """A reader whose search path does not reach the tables is told where they are, not that
    no store ever wrote here."""
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA elsewhere")
    in_elsewhere = f"{postgres_database} options=-csearch_path=elsewhere"
    asyncio.run(_open_close(in_elsewhere))
    with pytest.raises(StoreSchemaError, match="in schema elsewhere, which this role's search_p"):
        asyncio.run(_open_close(postgres_database, create_tables=False))
    asyncio.run(_open_close(in_elsewhere, create_tables=False))


def test_a_writers_open_builds_no_index_on_a_table_with_records(postgres_database: str) -> None:
    """The listing's index is built with a new (empty) records table only: a writer opening a
    database that has records but not the index (made before it) takes no lock to build it;
    its first listing builds it concurrently, and rebuilds one a failed build left invalid."""
    asyncio.run(_open_close(postgres_database))

    async def write_and_list(listing: bool) -> None:
        async with await PostgresRunStore.open(postgres_database, pool_size=1) as store:
            if listing:
                assert [run.run_id for run in (await store.list_runs()).runs] == ["r1"]
            else:
                await store.write_run_started(
                    records.run_started(run_id="r1", parameter_snapshot={})
                )

    asyncio.run(write_and_list(False))
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("DROP INDEX polyloop_records_run_c")
    asyncio.run(_open_close(postgres_database))
    assert _index_valid(postgres_database) is None, "a writer's open built no index"
    asyncio.run(write_and_list(True))
    assert _index_valid(postgres_database) is True
    with psycopg.connect(postgres_database, autocommit=True) as conn:  # as a failed build does
        conn.execute(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = 'polyloop_records_run_c'::regclass"
        )
    assert _index_valid(postgres_database) is False
    asyncio.run(write_and_list(True))
    assert _index_valid(postgres_database) is True


def _index_valid(conninfo: str) -> bool | None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT indisvalid FROM pg_index "
            "WHERE indexrelid = to_regclass('polyloop_records_run_c')"
        ).fetchone()
    return None if row is None else bool(row[0])


def test_repairing_a_missing_table_takes_no_lock_on_a_live_records_table(
    postgres_database: str,
) -> None:
    """A writer's open that makes a missing table runs only that table's statements: an
    insert in flight on the records table (another process's) does not block it."""
    asyncio.run(_open_close(postgres_database))
    with psycopg.connect(postgres_database) as busy:  # a transaction left open
        busy.execute("INSERT INTO polyloop_records (run_id, line) VALUES ('x', 'y')")
        with psycopg.connect(postgres_database, autocommit=True) as conn:
            conn.execute("DROP TABLE polyloop_leases")

        async def open_within_seconds() -> None:
            await asyncio.wait_for(_open_close(postgres_database), 10)

        asyncio.run(open_within_seconds())
        busy.rollback()
    assert tables(postgres_database) == sorted(TABLES)


def test_an_index_being_built_is_left_to_its_builder(postgres_database: str) -> None:
    """An index under construction reads as invalid, as a failed build's does: a listing that
    cannot take the builders' advisory lock leaves it alone (and lists without it); the lock's
    holder drops an invalid one and builds it again."""
    from polyloop.stores import _postgres_listing

    asyncio.run(_open_close(postgres_database))

    async def list_runs() -> list[str]:
        async with await PostgresRunStore.open(postgres_database, pool_size=1) as store:
            return [run.run_id for run in (await store.list_runs()).runs]

    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = 'polyloop_records_run_c'::regclass"
        )
        oid = conn.execute("SELECT 'polyloop_records_run_c'::regclass::oid").fetchone()
        conn.execute("SELECT pg_advisory_lock(%s)", (_postgres_listing._INDEX_LOCK,))
        assert asyncio.run(list_runs()) == []
        assert conn.execute("SELECT 'polyloop_records_run_c'::regclass::oid").fetchone() == oid
        assert _index_valid(postgres_database) is False, "another builder's index untouched"
        conn.execute("SELECT pg_advisory_unlock(%s)", (_postgres_listing._INDEX_LOCK,))
    assert asyncio.run(list_runs()) == []
    assert _index_valid(postgres_database) is True
