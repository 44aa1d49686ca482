"""``postgres://`` targets: the runs of a ``PostgresRunStore``, read through its public API.

``ls``, ``show``, ``verify``, ``diff``, ``html`` and ``approvals`` read a PostgreSQL store as
they read a directory of logs (issue 24, item 4; design 0213); ``resolve``, ``approve`` and
``reject`` write their one decision record to it (``--run-id`` names the run; design 0213,
amendment). They reach it through the ``postgres`` and ``postgresql`` rows of the inspector's
store locator (``polyloop.inspect._locator``, design 0222), which call the rules here; no
other module tells a URL from a path. This module imports no driver: it calls
``PostgresRunStore.open``, ``list_runs`` and ``read_log_bytes`` (``polyloop.stores``), which
import ``psycopg`` when a store is opened, so ``polyloop.inspect`` imports without the
``postgres`` extra and only a ``postgres://`` target needs it.

=====================  ==================================================================
rule                   what it means
=====================  ==================================================================
the URL                ``postgres://`` or ``postgresql://``, libpq's URI form:
                       ``postgresql://[user@][host][:port][,host2[:port2]...][/dbname]``
                       ``[?param=value&...]``; every part may be left out and libpq fills
                       it from its environment variables (``PGHOST``, ``PGPORT``,
                       ``PGUSER``, ``PGDATABASE``, ``PGSERVICE``, ``PGSSLMODE``, ...). The
                       keyword form (``host=... dbname=...``) is not a target (it has no
                       ``://``): pass it as a URL
the password           from ``PGPASSWORD``, the password file (``~/.pgpass`` or
                       ``PGPASSFILE``) or a service file: libpq's rules. One written in the
                       URL (``user:secret@``, ``?password=``) works too, but is seen by
                       every process list and shell history; it is never printed
what is printed        ``display_url``: scheme, user, hosts, ports and database only (no
                       password, no query); a run's ``source`` is ``<display_url>/<run_id>``
                       (its last path part is the run id, as a file's name is in a directory).
                       Every error message is also scrubbed of the password and of
                       ``PGPASSWORD``'s value (``scrub``)
a run                  a run id with records; ``list_runs`` pages through them in byte
                       order of the ids (the store's rule), and each page's logs are read in
                       one statement (``read_log_bytes``): the exact bytes a JSONL copy of
                       the run holds, decoded by the same rule, so every output equals the
                       copy's but for the source
a bad URL              a scheme with no ``://`` part after it, a port that is not 1-65535, a
                       bad ``%`` escape, a query that is not ``key=value`` pairs: one line
                       naming the part (never its user or password), exit status 2
no server              the first failed connection attempt (refused, unknown host,
                       authentication failed) ends the attempt at once, with the driver's
                       words; a server that does not answer is given ``connect_timeout``
                       seconds (the URL's, libpq's parameter; default ``CONNECT_TIMEOUT``).
                       One line, exit status 2
no driver              ``psycopg`` is not installed: one line naming the extra, exit 2
in doubt, awaiting     ``resolve``, ``approve`` and ``reject`` take the URL with
                       ``--run-id RUN`` (``opened_store``): a run in doubt or waiting for
                       approval shows those commands with ``command_url`` (the shown URL
                       and the query's parameters but ``password``/``sslpassword``), and
                       ``approvals URL`` lists the calls that wait
the driver's log       kept off stderr while a command uses the store (``_driver_quiet``);
                       a failure is the command's one line
the database           opened without creating anything
                       (``PostgresRunStore.open(create_tables=False)``): a database without
                       the polyloop tables is one line naming them, and nothing is created
                       there; a role that may read the tables (no ``CREATE``) can read
=====================  ==================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import shlex
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

from polyloop.errors import InspectError, PolyloopError, StoreSchemaError, StoreUnavailableError
from polyloop.inspect._view import RunView, approval_command_lines, resolve_command_lines
from polyloop.stores import PostgresRunStore

__all__ = [
    "CONNECT_TIMEOUT",
    "SCHEMES",
    "check_url",
    "command_url",
    "display_url",
    "is_postgres_url",
    "opened_store",
    "postgres_logs",
    "scrub",
    "store_url_view",
]

SCHEMES: Final = ("postgres", "postgresql")
CONNECT_TIMEOUT: Final = 10.0
"""Seconds the inspector waits for a server that does not answer (``connect_timeout`` in the
URL overrides it)."""
PAGE: Final = 500
"""Runs per ``list_runs`` page (and per ``read_log_bytes`` statement)."""

_PORT = re.compile(r"[0-9]{1,5}")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_DRIVER_LOGGER = "psycopg.pool"  # where the pool reports each failed connection attempt
_STORE_LOGGER = "polyloop.stores.postgres"  # where the store reports what it works around
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})


def is_postgres_url(target: str) -> bool:
    """Whether ``target`` is a ``postgres://`` or ``postgresql://`` URL (any case): the URLs
    the locator's PostgreSQL rows read (``SCHEMES``)."""
    scheme, sep, _ = target.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def _userinfo_and_hosts(target: str) -> tuple[str, str]:
    netloc = target.partition("://")[2].partition("/")[0].partition("?")[0]
    userinfo, at, hosts = netloc.rpartition("@")
    return (userinfo, hosts) if at else ("", netloc)


def _passwords(target: str) -> set[str]:
    """Every password written in the URL (``user:secret@``, ``?password=``), as written and
    decoded."""
    userinfo, _ = _userinfo_and_hosts(target)
    written = {userinfo.partition(":")[2]}
    query = target.partition("?")[2].partition("#")[0]
    written |= {v for k, v in parse_qsl(query) if k == "password"}  # parse_qsl decodes
    written |= {p.partition("=")[2] for p in query.split("&") if p.startswith("password=")}
    return {form for secret in written for form in (secret, unquote(secret)) if form}


def display_url(target: str) -> str:
    """``target`` as it may be printed: scheme, user, hosts, ports and database, nothing else."""
    scheme = target.partition("://")[0].lower()
    userinfo, hosts = _userinfo_and_hosts(target)
    user = userinfo.partition(":")[0]
    rest = target.partition("://")[2].partition("?")[0]
    path = rest.partition("/")[2] if "/" in rest else ""
    return f"{scheme}://{user + '@' if user else ''}{hosts}{'/' + path if path else ''}"


def command_url(target: str) -> str:
    """``target`` as a printed command may name it to be run again: ``display_url`` and the
    query's parameters as written (``host``, ``port``, ``sslmode``, ``options``: without them
    the command could reach another server, or connect without TLS), but the secret ones
    (``password``, ``sslpassword``)."""
    query = target.partition("?")[2]
    kept = [
        part
        for part in query.split("&")
        if part and unquote(part.partition("=")[0]) not in _SECRET_PARAMETERS
    ]
    return display_url(target) + ("?" + "&".join(kept) if kept else "")


def scrub(text: str, target: str) -> str:
    """``text`` without the URL's password or ``PGPASSWORD``'s value, in any spelling."""
    secrets = _passwords(target) | {os.environ.get("PGPASSWORD", "")}
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return " ".join(text.split())


def check_url(target: str) -> float:
    """Refuse a URL libpq would refuse, naming the part; return the connect timeout."""
    shown = display_url(target)
    if _BAD_ESCAPE.search(target.partition("://")[2]):
        raise InspectError(
            f"{scrub(shown, target)}: the URL has a '%' that starts no %XX escape; write a "
            "'%' in a user, password or database name as %25"
        )
    parts = urlsplit(target)
    if parts.fragment:
        raise InspectError(f"{shown}: a postgres:// URL has no '#' part; remove it")
    for host in _userinfo_and_hosts(target)[1].split(","):
        port = host.rpartition("]")[2].partition(":")[2] if ":" in host else ""
        if port and (not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535):
            raise InspectError(
                f"{target.partition('://')[0].lower()}:// URL: the port {port!r} is not a "
                "number from 1 to 65535"
            )
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise InspectError(
            f"{shown}: the URL's query is not key=value pairs joined by '&' (libpq's "
            "parameters, such as ?sslmode=require&connect_timeout=5)"
        ) from None
    timeout = next((v for k, v in query if k == "connect_timeout"), None)
    if timeout is None:
        return CONNECT_TIMEOUT
    if not timeout.isdigit() or int(timeout) < 1:
        raise InspectError(
            f"{shown}: connect_timeout must be a whole number of seconds >= 1, got {timeout!r}"
        )
    return float(timeout)


class _FirstFailure(logging.Handler):
    """Catches the pool's report of a failed connection attempt (its words, for the error
    line) and tells the waiting open to stop: a command line does not retry for minutes."""

    def __init__(self, failed: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None
        self._failed = failed

    def emit(self, record: logging.LogRecord) -> None:
        if self.message is None:
            self.message = record.getMessage()
            self._failed()


def _unreachable(words: str | None) -> str:
    """The pool's report of a failed attempt, as the error line says it, with the fix."""
    said = re.sub(r"^error connecting in '[^']*': ", "", words or "no reason given")
    return (
        f"cannot connect ({said}); check the URL, that the server runs, and the password "
        "(PGPASSWORD or the password file)"
    )


async def _open(target: str, wait_seconds: float) -> PostgresRunStore:
    """Open the store, ending at the first failed connection attempt (``InspectError``).
    Called inside ``_driver_quiet`` (``opened_store``), which keeps the pool's words off
    stderr; the handler here only catches the first of them for the error line."""
    loop = asyncio.get_running_loop()
    failed = asyncio.Event()

    def tell() -> None:  # the pool may log from another thread
        loop.call_soon_threadsafe(failed.set)

    handler = _FirstFailure(tell)
    driver_log = logging.getLogger(_DRIVER_LOGGER)
    driver_log.addHandler(handler)
    opening = asyncio.ensure_future(
        PostgresRunStore.open(
            target, pool_size=1, connect_timeout=wait_seconds, create_tables=False
        )
    )
    waiting = asyncio.ensure_future(failed.wait())
    try:
        await asyncio.wait((opening, waiting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        driver_log.removeHandler(handler)
    if not opening.done():
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        raise InspectError(f"{display_url(target)}: {scrub(_unreachable(handler.message), target)}")
    try:
        return opening.result()
    except ImportError as exc:
        raise InspectError(
            "reading a postgres:// URL needs the PostgreSQL driver: pip install "
            f"'polyloop[postgres]' ({type(exc).__name__}: {exc})"
        ) from exc
    except (StoreUnavailableError, StoreSchemaError) as exc:
        words = str(exc) if handler.message is None else f"{_unreachable(handler.message)} ({exc})"
        raise InspectError(f"{display_url(target)}: {scrub(words, target)}") from exc


@contextlib.contextmanager
def _driver_quiet() -> Iterator[None]:
    """While a command uses a store: the pool's and the store's own log lines stay off stderr.
    A failure reaches the person as the command's one line (scrubbed); what the pool logs on
    the way (a reconnect, a lease the store could not release on close: it expires by itself)
    is the store's to handle, and raw driver text could carry what ``scrub`` removes."""
    loggers = [logging.getLogger(name) for name in (_DRIVER_LOGGER, _STORE_LOGGER)]
    quiet = logging.NullHandler()  # a logger without handlers would fall back to stderr
    kept = [(each, each.propagate) for each in loggers]
    for each in loggers:
        each.addHandler(quiet)
        each.propagate = False
    try:
        yield
    finally:
        for each, propagate in kept:
            each.removeHandler(quiet)
            each.propagate = propagate


@contextlib.asynccontextmanager
async def opened_store(target: str) -> AsyncIterator[PostgresRunStore]:
    """The store at ``target`` for one command, closed after it: the URL checked first
    (``check_url``), its first failed connection attempt ending the open (one ``InspectError``
    line without the password), the driver's log lines kept off stderr (``_driver_quiet``).
    One connection: a command reads, or takes the run's lease and writes one record, in turn."""
    with _driver_quiet():
        store = await _open(target, check_url(target))
        try:
            yield store
        finally:
            await store.close()


async def _fetch(target: str, run_id: str | None) -> list[tuple[str, str, bytes]]:
    source = display_url(target)
    found: list[tuple[str, str, bytes]] = []
    async with opened_store(target) as store:
        try:
            if run_id is not None:
                logs = await store.read_log_bytes([run_id])
                found += [(rid, f"{source}/{rid}", raw) for rid, raw in logs.items() if raw]
                return found
            after: str | None = None
            while True:
                page = await store.list_runs(after=after, limit=PAGE)
                logs = await store.read_log_bytes(run.run_id for run in page.runs)
                found += [
                    (rid, f"{source}/{rid}", logs[rid]) for rid in (r.run_id for r in page.runs)
                ]
                if page.next_after is None:
                    return found
                after = page.next_after
        except PolyloopError as exc:
            raise InspectError(f"{source}: {scrub(str(exc), target)}") from exc


def postgres_logs(target: str, *, run_id: str | None = None) -> list[tuple[str, str, bytes]]:
    """``(run_id, source, log bytes)`` of every run of the store at ``target`` (of ``run_id``
    alone when given), in the listing's order; ``InspectError`` (one line, no password) when
    the URL is bad, the server cannot be reached, the driver is missing or no run is there."""
    found = asyncio.run(_fetch(target, run_id))
    if not found and run_id is None:
        raise InspectError(f"{display_url(target)}: holds no runs (no PostgresRunStore records)")
    return found


def _decide_on(url: str, run_id: str) -> str:
    """The command-line words naming ``run_id`` in the store at ``url`` (shown form)."""
    return f"{shlex.quote(url)} --run-id {shlex.quote(run_id)}"


def store_url_view(view: RunView, url: str) -> RunView:
    """``view`` of a run read from the ``postgres://`` store named ``url`` (``command_url``):
    an in-doubt or awaiting run names the ``resolve``/``approve``/``reject`` commands with the
    URL and ``--run-id`` instead of a log file (the password is never in them: libpq takes it
    from ``PGPASSWORD`` or the password file, as for every command here)."""
    doubt, awaiting = view.in_doubt, view.awaiting
    where = _decide_on(url, view.run_id)
    if doubt is not None and doubt.commands:
        doubt = dataclasses.replace(
            doubt, commands=resolve_command_lines(where, doubt.result_id), note=""
        )
    if awaiting is not None:
        awaiting = dataclasses.replace(
            awaiting, commands=approval_command_lines(where, awaiting.request.digest), note=""
        )
    if doubt is view.in_doubt and awaiting is view.awaiting:
        return view
    return dataclasses.replace(view, in_doubt=doubt, awaiting=awaiting)
