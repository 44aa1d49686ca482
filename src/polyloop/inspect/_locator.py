"""Where a target's runs are: one table, keyed by scheme, that every command goes through.

Every command of ``python -m polyloop`` finds its runs through ``open_target`` (design 0222):
``ls``, ``show``, ``diff``, ``html`` and ``approvals`` read ``Place.logs`` (``_load.load_target``),
``verify`` checks them (``_verify.verify_target``), messages name the target by ``Place.shown``,
the commands printed for a run come from ``Place.hints``, and ``resolve``, ``approve`` and
``reject`` write through ``Place.run`` (a ``RunPlace``: the store to open and the words that
name the run in the commands they print). No other module of the inspector tells one kind of
target from another: a store with a URL form is one row of ``LOCATORS`` (and the module that
knows its URL rules).

=====================  ==================================================================
row (``LOCATORS``)     what it reads
=====================  ==================================================================
``""`` (no ``://``)    a path: a ``<run_id>.jsonl`` log, or a directory of them (every
                       ``*.jsonl`` file, sorted by name, but the soak harness's
                       ``*.events.jsonl`` sidecars), and below it the logs of every
                       subdirectory not hidden (``nested_log_files``: a directory of run
                       directories, such as ``runs/`` after ``make demo``); decisions open
                       a ``JsonlRunStore`` on the directory
``jsonl``              ``jsonl://PATH``: ``PATH`` as above (``jsonl:///var/runs`` is the
                       directory ``/var/runs``, ``jsonl://runs`` is ``./runs``);
                       ``SCHEMES`` maps it to its path
``postgres``,          a ``PostgresRunStore``, read and written through its public API;
``postgresql``         ``polyloop.inspect._postgres`` holds the URL's rules (the password
                       is never printed)
``volatile``,          refused: ``VolatileRunStore`` keeps its runs in one process's memory
``memory``             and has no URL form
=====================  ==================================================================

Any other scheme is refused with the list of the readable ones; the rest of the URL is never
repeated (it may hold a password). A row opens a place without reading anything: reading,
and the store's checks, happen when a command asks (``Place.logs``, ``RunPlace.store``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Protocol

from polyloop.errors import InspectError
from polyloop.inspect._postgres import (
    check_url,
    command_url,
    display_url,
    opened_store,
    postgres_logs,
    scrub,
    store_url_view,
)
from polyloop.inspect._view import RunView
from polyloop.ports import RunStore
from polyloop.stores import JsonlRunStore

__all__ = [
    "LOCATORS",
    "SCHEMES",
    "Locator",
    "Place",
    "RunPlace",
    "StoredLog",
    "log_files",
    "nested_log_files",
    "open_target",
    "read_log_file",
    "run_id_of",
]

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_LOG_SUFFIX: Final = ".jsonl"
_SIDECAR_SUFFIX: Final = ".events.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredLog:
    """One run's log at a place: ``run_id`` is the run it is decoded and checked as (a file's
    name without ``.jsonl``, as ``JsonlRunStore`` finds it; a store's own id), ``source`` how
    messages name it, ``read`` its bytes (``InspectError``, one line, when they cannot be
    read)."""

    run_id: str
    source: str
    read: Callable[[], bytes]


def _identity(words: str) -> str:
    return words


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlace:
    """Where a command that writes finds its run (``Place.run``): the store that keeps it and
    the words that name it in what the command prints (never a password).

    ``where``: the directory or the URL as commands name it; ``target``: the run's log file or
    that URL, quoted for a shell (``verify TARGET``); ``show``: the words after ``python -m
    polyloop show`` that show the run; ``scrub``: a store's words (an error) without what the
    place's name must not show."""

    run_id: str
    where: str
    target: str
    show: str
    opener: Callable[[], AbstractAsyncContextManager[RunStore]] = field(repr=False)
    scrub: Callable[[str], str] = field(default=_identity, repr=False)

    def store(self) -> AbstractAsyncContextManager[RunStore]:
        """The store that keeps the run, for one decision (opened and closed around it)."""
        return self.opener()


class Place(Protocol):
    """One target, opened by its row of ``LOCATORS``: what a command reads, names and writes."""

    @property
    def shown(self) -> str:
        """The target as messages print it (no password)."""
        ...

    @property
    def several(self) -> bool:
        """Whether the place holds several logs: one that cannot be read or decoded is then
        reported beside the others (``Unreadable``), not as the command's error."""
        ...

    def logs(self, run_id: str | None) -> Sequence[StoredLog]:
        """The logs of the place, in its order (``run_id``: a hint, that run alone where the
        place can read one run alone). ``InspectError`` when there is none or it cannot be
        reached."""
        ...

    def hints(self, view: RunView) -> RunView:
        """``view`` with the commands it prints (``resolve``, ``approve``, ``reject``) naming
        the run as this place does."""
        ...

    def run(self, run_id: str | None) -> RunPlace:
        """The run a command that writes decides on (``--run-id``, or the one the target
        names); ``InspectError`` when the target names none."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Locator:
    """One row of ``LOCATORS``: ``open`` makes a ``Place`` of a target (reading nothing), or
    is ``None`` for a scheme refused with ``refusal``; ``through`` is the store a URL scheme is
    read through, as the list of readable schemes names it (``None``: a path scheme)."""

    open: Callable[[str], Place] | None
    through: str | None = None
    refusal: str = ""


# -- files: a log, a directory of logs ------------------------------------------------------


def run_id_of(path: Path) -> str:
    """The run a log file is named after (``JsonlRunStore`` keeps run R in ``R.jsonl``)."""
    name = path.name
    return name[: -len(_LOG_SUFFIX)] if name.endswith(_LOG_SUFFIX) else name


def read_log_file(path: Path) -> bytes:
    """The bytes of the log at ``path``; ``InspectError`` (one line naming the file) when it
    is missing or cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InspectError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InspectError(f"{path}: is a directory, expected a .jsonl log file") from None
    except OSError as exc:
        raise InspectError(
            f"{path}: cannot be read ({exc.strerror or type(exc).__name__})"
        ) from exc


def _listed(directory: Path) -> list[Path]:
    """``directory``'s entries sorted by name (``InspectError`` naming it when it cannot be
    listed)."""
    try:
        return sorted(directory.iterdir())
    except OSError as exc:
        raise InspectError(
            f"{directory}: cannot be listed ({exc.strerror or type(exc).__name__})"
        ) from exc


def _logs_among(entries: list[Path]) -> list[Path]:
    """The run logs among ``entries``: ``*.jsonl`` files that are not sidecars."""
    return [
        entry
        for entry in entries
        if entry.name.endswith(_LOG_SUFFIX)
        and not entry.name.endswith(_SIDECAR_SUFFIX)
        and entry.is_file()
    ]


def log_files(directory: Path) -> list[Path]:
    """The run logs in ``directory``, sorted by name (``InspectError`` when there is none)."""
    found = _logs_among(_listed(directory))
    if not found:
        raise InspectError(f"{directory}: no run logs (*.jsonl files) in this directory")
    return found


def _own_logs(directory: Path) -> tuple[list[Path], list[Path]]:
    """The ``*.jsonl`` files of ``directory`` (not sidecars) and its subdirectories that are
    not hidden (``.leases``) and not links (no loops), each sorted by name."""
    entries = _listed(directory)
    files = _logs_among(entries)
    below = [
        entry
        for entry in entries
        if not entry.name.startswith(".") and entry.is_dir() and not entry.is_symlink()
    ]
    return files, below


def is_polyloop_log(path: Path) -> bool:
    """Whether a ``*.jsonl`` file below the named directory is a run log: its first line is a
    polyloop record (a JSON object with a ``"record"`` key), is not a JSON object at all (a
    damaged log: reported, never passed over), or is not complete yet. A JSON object without
    ``"record"`` (the demo's ``world/ledger.jsonl``, an application's own JSON Lines) is not
    polyloop's and is passed over (design 0234)."""
    try:
        with path.open("rb") as handle:
            first = handle.readline()
    except OSError:
        return True  # unreadable: reading it again reports why
    if not first.endswith(b"\n"):
        return True
    try:
        decoded = json.loads(first)
    except ValueError:
        return True
    return not isinstance(decoded, dict) or "record" in decoded


def nested_log_files(directory: Path) -> list[Path]:
    """The run logs of ``directory`` (``log_files``' rule) followed by those below it, each
    subdirectory's in name order, depth first; below ``directory`` a file counts only when
    ``is_polyloop_log``. ``InspectError`` when there is none anywhere."""
    files, below = _own_logs(directory)
    found = list(files)
    pending = list(reversed(below))
    while pending:
        current = pending.pop()
        inner, deeper = _own_logs(current)
        found += [file for file in inner if is_polyloop_log(file)]
        pending += reversed(deeper)
    if not found:
        raise InspectError(
            f"{directory}: no run logs (*.jsonl files) in this directory or below it"
        )
    return found


def _stored(path: Path) -> StoredLog:
    return StoredLog(run_id=run_id_of(path), source=str(path), read=lambda: read_log_file(path))


@contextlib.asynccontextmanager
async def _jsonl_store(directory: Path) -> AsyncIterator[RunStore]:
    yield JsonlRunStore(directory=directory)


@dataclass(frozen=True, slots=True)
class _Files:
    """A log file or a directory of logs (a path, or ``jsonl://PATH``), kept by a
    ``JsonlRunStore``."""

    path: Path
    shown: str

    @property
    def several(self) -> bool:
        return self.path.is_dir()

    def logs(self, run_id: str | None) -> Sequence[StoredLog]:
        del run_id  # a directory is read whole, its files named by their runs or not
        if self.path.is_dir():
            return [_stored(file) for file in nested_log_files(self.path)]
        if not self.path.exists():
            raise InspectError(f"{self.path}: no such file or directory")
        return [_stored(self.path)]

    def hints(self, view: RunView) -> RunView:
        return view  # a log's view names its file already

    def run(self, run_id: str | None) -> RunPlace:
        """``InspectError`` when the path names no existing log, or a ``--run-id``
        contradicts the file's name (``JsonlRunStore`` keeps run R in R.jsonl)."""
        path = self.path
        if path.is_dir():
            if run_id is None:
                files = log_files(path)
                if len(files) > 1:
                    raise InspectError(
                        f"{path}: holds {len(files)} run logs; name the run with --run-id RUN"
                    )
                run_id = run_id_of(files[0])
            directory = path
        elif not path.exists():
            raise InspectError(f"{path}: no such file or directory")
        elif not path.name.endswith(_LOG_SUFFIX):
            raise InspectError(
                f"{path}: is not a <run_id>.jsonl log (JsonlRunStore keeps run R in R.jsonl)"
            )
        else:
            stem = run_id_of(path)
            if run_id is not None and run_id != stem:
                raise InspectError(
                    f"{path} is the log of run {stem!r}, not {run_id!r} (JsonlRunStore keeps "
                    "run R in R.jsonl); drop --run-id, or pass the directory with --run-id"
                )
            run_id, directory = stem, path.parent
        log = shlex.quote(str(directory / f"{run_id}{_LOG_SUFFIX}"))
        if not (directory / f"{run_id}{_LOG_SUFFIX}").is_file():
            raise InspectError(
                f"refused [no_log]: {directory} holds no log of run {run_id!r}; check the run "
                f"id: python -m polyloop ls {shlex.quote(str(directory))} lists the runs there"
            )
        return RunPlace(
            run_id=run_id,
            where=str(directory),
            target=log,
            show=log,
            opener=lambda: _jsonl_store(directory),
        )


def _open_path(target: str) -> Place:
    return _Files(Path(target), target)


def _jsonl_location(location: str) -> Path:
    if not location:
        raise InspectError("jsonl:// needs a path: jsonl:///absolute/dir or jsonl://relative/dir")
    return Path(location)


def _open_jsonl(target: str) -> Place:
    return _Files(_jsonl_location(target.partition("://")[2]), target)


# -- PostgreSQL: a PostgresRunStore's URL (its rules: polyloop.inspect._postgres) ------------


def _bytes(raw: bytes) -> Callable[[], bytes]:
    return lambda: raw


@dataclass(frozen=True, slots=True)
class _Postgres:
    """The runs of a ``PostgresRunStore`` (``url`` as given: it may hold a password, which
    nothing here prints)."""

    url: str = field(repr=False)

    @property
    def shown(self) -> str:
        return display_url(self.url)

    @property
    def several(self) -> bool:
        return True

    def logs(self, run_id: str | None) -> Sequence[StoredLog]:
        return [
            StoredLog(run_id=logged, source=source, read=_bytes(raw))
            for logged, source, raw in postgres_logs(self.url, run_id=run_id)
        ]

    def hints(self, view: RunView) -> RunView:
        return store_url_view(view, command_url(self.url))

    def run(self, run_id: str | None) -> RunPlace:
        """The URL checked first (``check_url``), then ``--run-id`` required: a database holds
        many runs. Whether it holds this one is the session's to say (``no_log``)."""
        url = self.url
        check_url(url)
        shown = command_url(url)
        if run_id is None:
            raise InspectError(
                f"{shown}: a PostgreSQL store holds many runs; name the run with --run-id RUN "
                f"(python -m polyloop ls {shlex.quote(shown)} lists them)"
            )
        quoted = shlex.quote(shown)
        return RunPlace(
            run_id=run_id,
            where=shown,
            target=quoted,
            show=f"{quoted} --run {shlex.quote(run_id)}",
            opener=lambda: opened_store(url),
            scrub=lambda words: scrub(words, url),
        )


_NO_URL_FORM: Final = "VolatileRunStore keeps its runs in one process's memory and has no URL form"
_POSTGRES: Final = Locator(open=_Postgres, through="PostgresRunStore")

LOCATORS: Mapping[str, Locator] = MappingProxyType(
    {
        "": Locator(open=_open_path),
        "jsonl": Locator(open=_open_jsonl),
        "postgres": _POSTGRES,
        "postgresql": _POSTGRES,
        "volatile": Locator(open=None, refusal=_NO_URL_FORM),
        "memory": Locator(open=None, refusal=_NO_URL_FORM),
    }
)
"""The inspector's one store locator: scheme (``""`` for a path) -> its row. A store with a
URL form is one more row; every command reaches it through ``open_target``."""

SCHEMES: Mapping[str, Callable[[str], Path]] = MappingProxyType({"jsonl": _jsonl_location})
"""Store URL schemes that name a local path (the file rows of ``LOCATORS``): scheme -> where
the text after ``://`` points."""


def _readable() -> str:
    """The readable schemes as a refusal lists them: path schemes, then each store's."""
    rows = sorted((s, row) for s, row in LOCATORS.items() if s and row.open is not None)
    listed = ", ".join(f"{scheme}://" for scheme, row in rows if row.through is None)
    stores: dict[str, list[str]] = {}
    for scheme, row in rows:
        if row.through is not None:
            stores.setdefault(row.through, []).append(f"{scheme}://")
    for through, schemes in stores.items():
        listed += f" (and {', '.join(schemes)}, read through {through})"
    return listed


def open_target(target: str) -> Place:
    """The place ``target`` names, opened by its row of ``LOCATORS`` (nothing is read yet).

    ``InspectError`` for a URL whose scheme no row reads; the message lists the readable
    schemes and never repeats the rest of the URL (it may hold a password)."""
    scheme = ""
    if "://" in target:
        scheme = target.partition("://")[0].lower()
        if not _SCHEME.fullmatch(scheme):
            raise InspectError(
                "the target looks like a URL but has no valid scheme before '://'; pass a "
                "path, or a store URL such as jsonl:///path/to/runs"
            )
    row = LOCATORS.get(scheme)
    if row is not None and row.open is not None:
        return row.open(target)
    why = row.refusal if row is not None else f"unknown store URL scheme {scheme!r}"
    raise InspectError(f"{why}; the store URL schemes this polyloop reads are: {_readable()}")
