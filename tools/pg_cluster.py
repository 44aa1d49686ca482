"""A throwaway PostgreSQL server from the system's binaries, for tests and benchmarks.

``PgCluster(base)`` runs ``initdb`` and ``pg_ctl`` in ``base``: the server listens on
127.0.0.1 only, on a free port, with its unix socket in ``base``; ``destroy()`` stops it
(``immediate``) and removes the directory; ``crash()`` and ``restart()`` crash the running
server (``pg_ctl stop -m immediate``), the latter starting it again. As root (CI,
containers) every command runs as the ``postgres`` user, because PostgreSQL refuses to run as
root. Each command waits at most a minute. ``POLYLOOP_PG_BIN`` overrides the binaries'
directory (Debian's newest installed PostgreSQL by default).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

__all__ = ["HOW_TO_INSTALL", "PG_BIN", "PgCluster", "binaries_available"]


def _default_bin() -> Path:
    """Debian's newest installed PostgreSQL (``/usr/lib/postgresql/<major>/bin``)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = Path(os.environ["POLYLOOP_PG_BIN"]) if "POLYLOOP_PG_BIN" in os.environ else _default_bin()
HOW_TO_INSTALL = "apt-get install -y postgresql (or set POLYLOOP_TEST_POSTGRES to a server)"
_TIMEOUT = 60


def binaries_available() -> bool:
    """Whether ``initdb``, ``pg_ctl`` and ``postgres`` are in ``PG_BIN``."""
    return all((PG_BIN / name).exists() for name in ("initdb", "pg_ctl", "postgres"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PgCluster:
    """One server in ``base``; ``init`` once, then ``start``/``stop``/``crash``/``restart`` as
    needed."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = _free_port()
        self._user = "postgres" if os.geteuid() == 0 else None

    def conninfo(self, dbname: str = "postgres") -> str:
        """A libpq connection string for ``dbname`` on this server (no password: trust)."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=10"

    def _run(self, *args: str) -> None:
        command = list(args)
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=_TIMEOUT)

    def init(self) -> None:
        """Create the data directory (``initdb``, trust authentication, UTF-8)."""
        self.base.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        initdb = str(PG_BIN / "initdb")
        self._run(
            initdb,
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} "
            "-c max_connections=200 -c shared_buffers=32MB"
        )
        log = str(self.base / "server.log")
        pg_ctl = str(PG_BIN / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.data), "-o", options, "-w", "-t", "60", "-l", log, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``mode="immediate"`` is a crash (no checkpoint, WAL replay next)."""
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"
        )

    def crash(self) -> None:
        """Crash the server, as an OOM kill or a crash of its processes does: ``pg_ctl stop -m
        immediate``; the postmaster SIGQUITs every backend at once, with no checkpoint and no
        flush, so whatever sat in shared memory only (WAL buffers of commits made with
        ``synchronous_commit`` off) is lost. What the server had written to the OS survives (a
        process crash, not a machine crash). Clients see their connections broken."""
        self.stop("immediate")

    def restart(self) -> None:
        """``crash()``, then ``start()`` on the same port: returns once the server has replayed
        its WAL and accepts connections again (connections made before are broken)."""
        self.crash()
        self.start()

    def destroy(self) -> None:
        """Stop the server if it runs and remove its directory."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
