"""Settings every test process needs before any test module is imported.

``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray reads it when it is first imported (which the
package-walking tests do, through ``polyloop.ray``). Set, Ray uses the loopback address for
this machine instead of its interface address; the project's machines allow loopback only.
See ``tools/ray_cluster.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tools.pg_cluster import PgCluster

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

# The repository root, so that tests can import the tools (tools.ray_cluster, tools.soak, ...).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


@pytest.fixture(scope="session")
def postgres_conninfo() -> Iterator[str]:
    """A PostgreSQL server for the session: ``POLYLOOP_TEST_POSTGRES`` if set, else a
    throwaway cluster from the system binaries (``tools/pg_cluster.py``), always stopped.
    Skips (fails under ``CI=true``) when neither the server nor the driver is available."""
    from _infra import skip_unless_available

    skip_unless_available(
        importlib.util.find_spec("psycopg_pool") is not None,
        what="the PostgreSQL driver (psycopg 3 with its pool)",
        how_to_install='pip install -e ".[postgres]" (make install does it)',
    )
    named = os.environ.get("POLYLOOP_TEST_POSTGRES")
    if named:
        yield named
        return
    with _throwaway_cluster("polyloop-pg-") as cluster:
        yield cluster.conninfo()


@contextmanager
def _throwaway_cluster(prefix: str) -> Iterator[PgCluster]:
    """A PostgreSQL cluster of its own from the system binaries, started, always destroyed
    (skips, or fails under ``CI=true``, when the binaries are missing)."""
    from tools.pg_cluster import HOW_TO_INSTALL, PgCluster, binaries_available

    from _infra import skip_unless_available

    skip_unless_available(binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL)
    cluster = PgCluster(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def own_pg_cluster() -> Iterator[PgCluster]:
    """A throwaway PostgreSQL cluster for one test alone: for tests that crash, stop or fill
    the server, which the session's shared server (``postgres_conninfo``) must survive."""
    with _throwaway_cluster("polyloop-own-pg-") as cluster:
        yield cluster


@pytest.fixture
def postgres_database(postgres_conninfo: str) -> str:
    """A new, empty database on the session's server (so each test starts from no runs)."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # a fresh hex name: nothing to escape
    return postgres_conninfo.replace("dbname=postgres", f"dbname={name}")
