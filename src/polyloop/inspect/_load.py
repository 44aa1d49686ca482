"""Where the inspector's runs come from: a JSONL log, a directory of logs, or a store URL.

A *target* is one of:

* a path to a ``<run_id>.jsonl`` file (one run; the run id is the file name without
  ``.jsonl``, as ``JsonlRunStore`` names it);
* a path to a directory: every ``*.jsonl`` file in it, sorted by name, except the soak
  harness's ``*.events.jsonl`` sidecars;
* a store URL ``<scheme>://<location>``. The shipped schemes are in ``SCHEMES``:
  ``jsonl://PATH`` reads ``PATH`` (a file or a directory) exactly as above, so
  ``jsonl:///var/runs`` is the directory ``/var/runs`` and ``jsonl://runs`` is ``./runs``.
  ``postgres://`` and ``postgresql://`` (libpq's URI) read the runs of a ``PostgresRunStore``
  through its public API (``list_runs``, ``read_log_bytes``): ``polyloop.inspect._postgres``
  says how the URL and its password are given; a run's source is the URL without password or
  query, ``/`` and the run id. Only ``load_target`` reads them (``ls``, ``show``, ``verify``,
  ``diff``, ``html``, ``approvals``); ``target_path`` refuses them (they name no local path;
  ``resolve``, ``approve`` and ``reject`` open the store themselves, ``_resolve.locate_run``).
  ``VolatileRunStore`` has no URL form: its runs live in one process's memory. A scheme
  without a reader is an ``InspectError`` that lists the known ones and never repeats the
  rest of the URL (it may hold a password).

Logs are decoded by ``polyloop.stores.decode_lines``, the JSONL store's own reading rule, so
the inspector accepts exactly the logs the store accepts and names a bad line the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from polyloop.errors import DecodeError, InspectError, LogCorruptError
from polyloop.inspect._postgres import (
    command_url,
    display_url,
    is_postgres_url,
    postgres_logs,
    store_url_view,
)
from polyloop.inspect._view import RunView, view_run
from polyloop.ports import LogEntry
from polyloop.stores import decode_lines
from polyloop.types import RunStarted

__all__ = [
    "SCHEMES",
    "Loaded",
    "Unreadable",
    "display_target",
    "load_file",
    "load_target",
    "log_files",
    "read_records",
    "target_files",
    "target_path",
]

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_LOG_SUFFIX = ".jsonl"
_SIDECAR_SUFFIX = ".events.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class Unreadable:
    """A log in a directory that could not be read; ``message`` is one line."""

    source: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Loaded:
    """What a target held: the runs that decode and, for a directory, the logs that do not."""

    runs: tuple[RunView, ...]
    unreadable: tuple[Unreadable, ...] = ()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def read_records(path: Path) -> tuple[tuple[LogEntry, ...], int]:
    """Decode the log at ``path``: its numbered records and the size of its torn tail.

    Raises ``InspectError`` (one line, naming the file, and the line for a bad line) when the
    file is missing, unreadable, or a complete line does not decode.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InspectError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InspectError(f"{path}: is a directory, expected a .jsonl log file") from None
    except OSError as exc:
        raise InspectError(
            f"{path}: cannot be read ({exc.strerror or type(exc).__name__})"
        ) from exc
    return _decoded(raw, run_id=_run_id_of(path), source=str(path))


def _decoded(raw: bytes, *, run_id: str, source: str) -> tuple[tuple[LogEntry, ...], int]:
    """A log's bytes decoded (the store's reading rule), and the size of its torn tail."""
    try:
        records = decode_lines(raw, run_id=run_id)
    except (DecodeError, LogCorruptError) as exc:
        raise InspectError(f"{source}: {_one_line(str(exc))}") from exc
    return records, len(raw) - (raw.rfind(b"\n") + 1)


def _run_id_of(path: Path) -> str:
    name = path.name
    return name[: -len(_LOG_SUFFIX)] if name.endswith(_LOG_SUFFIX) else name


def load_file(path: Path) -> RunView:
    """The run in the JSONL log ``path``; ``InspectError`` if it cannot be read or decoded."""
    records, torn = read_records(path)
    return _view(records, torn, source=str(path), fallback=_run_id_of(path))


def _view(records: tuple[LogEntry, ...], torn: int, *, source: str, fallback: str) -> RunView:
    if not records:
        raise InspectError(f"{source}: holds no record (an empty log, or only a torn line)")
    return view_run(_logged_run_id(records, fallback), source, records, torn_bytes=torn)


def _logged_run_id(records: tuple[LogEntry, ...], fallback: str) -> str:
    """The run id the log's records carry (its ``RunStarted``'s, else its first record's);
    ``fallback`` (the file's name) only for a log whose records name no run, which cannot
    happen."""
    for numbered in records:
        if isinstance(numbered.record, RunStarted):
            return numbered.record.run_id
    return records[0].record.run_id if records else fallback


def log_files(directory: Path) -> list[Path]:
    """The run logs in ``directory``, sorted by name (``InspectError`` when there is none)."""
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise InspectError(
            f"{directory}: cannot be listed ({exc.strerror or type(exc).__name__})"
        ) from exc
    found = [
        entry
        for entry in entries
        if entry.name.endswith(_LOG_SUFFIX)
        and not entry.name.endswith(_SIDECAR_SUFFIX)
        and entry.is_file()
    ]
    if not found:
        raise InspectError(f"{directory}: no run logs (*.jsonl files) in this directory")
    return found


def _load_path(path: Path) -> Loaded:
    if path.is_dir():
        runs: list[RunView] = []
        unreadable: list[Unreadable] = []
        for file in log_files(path):
            try:
                runs.append(load_file(file))
            except InspectError as exc:
                unreadable.append(Unreadable(source=str(file), message=str(exc)))
        return Loaded(runs=tuple(runs), unreadable=tuple(unreadable))
    if not path.exists():
        raise InspectError(f"{path}: no such file or directory")
    return Loaded(runs=(load_file(path),))


def _jsonl_location(location: str) -> Path:
    if not location:
        raise InspectError("jsonl:// needs a path: jsonl:///absolute/dir or jsonl://relative/dir")
    return Path(location)


SCHEMES: Mapping[str, Callable[[str], Path]] = MappingProxyType({"jsonl": _jsonl_location})
"""Store URL schemes the inspector can read: scheme -> where the text after ``://`` points.
Every shipped scheme is a file store, so a URL resolves to a local path."""

_NO_POSTGRES = (
    "a postgres:// URL names no local path: it is read through PostgresRunStore by every "
    "command (resolve, approve and reject with --run-id RUN)"
)
_NO_URL_FORM: Mapping[str, str] = MappingProxyType(
    {
        "volatile": "VolatileRunStore keeps its runs in one process's memory and has no URL form",
        "memory": "VolatileRunStore keeps its runs in one process's memory and has no URL form",
        "postgres": _NO_POSTGRES,
        "postgresql": _NO_POSTGRES,
    }
)


def target_path(target: str) -> Path:
    """The local path a target names: itself, or what a store URL resolves to.

    ``InspectError`` for a URL whose scheme no shipped store has; the message lists the known
    schemes and never repeats the rest of the URL (it may hold a password).
    """
    if "://" not in target:
        return Path(target)
    scheme, _, location = target.partition("://")
    scheme = scheme.lower()
    if not _SCHEME.fullmatch(scheme):
        raise InspectError(
            "the target looks like a URL but has no valid scheme before '://'; pass a "
            "path, or a store URL such as jsonl:///path/to/runs"
        )
    resolve = SCHEMES.get(scheme)
    if resolve is not None:
        return resolve(location)
    known = ", ".join(f"{name}://" for name in sorted(SCHEMES))
    known += " (and postgres://, postgresql://, read through PostgresRunStore)"
    why = _NO_URL_FORM.get(scheme, f"unknown store URL scheme {scheme!r}")
    raise InspectError(f"{why}; the store URL schemes this polyloop reads are: {known}")


def target_files(target: str) -> list[Path]:
    """The log files of a target: the file itself, or every log of a directory."""
    path = target_path(target)
    if path.is_dir():
        return log_files(path)
    if not path.exists():
        raise InspectError(f"{path}: no such file or directory")
    return [path]


def display_target(target: str) -> str:
    """``target`` as messages may print it: a ``postgres://`` URL without its password."""
    return display_url(target) if is_postgres_url(target) else target


def load_target(target: str, *, run_id: str | None = None) -> Loaded:
    """Load a path or a store URL (see the module docstring); ``InspectError`` when it cannot.

    ``run_id`` is a hint for a ``postgres://`` store: read that run only (a directory is read
    whole, its files named by their runs or not)."""
    if not is_postgres_url(target):
        return _load_path(target_path(target))
    runs: list[RunView] = []
    unreadable: list[Unreadable] = []
    for logged, source, raw in postgres_logs(target, run_id=run_id):
        try:
            records, torn = _decoded(raw, run_id=logged, source=source)
            view = _view(records, torn, source=source, fallback=logged)
            runs.append(store_url_view(view, command_url(target)))
        except InspectError as exc:
            unreadable.append(Unreadable(source=source, message=str(exc)))
    return Loaded(runs=tuple(runs), unreadable=tuple(unreadable))
