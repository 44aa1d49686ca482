"""What a target holds: its runs, decoded and interpreted, and the logs that do not decode.

A *target* is a path to a ``<run_id>.jsonl`` log, a path to a directory of them, or a store
URL (``jsonl://PATH``, ``postgres://``/``postgresql://`` for a ``PostgresRunStore``): the
inspector's one store locator (``polyloop.inspect._locator``, design 0222) says which, reads
its logs and names the commands a run shows; this module only decodes and interprets them.
A URL whose scheme no row reads (``VolatileRunStore`` has no URL form) is an ``InspectError``
that lists the readable ones and never repeats the rest of the URL (it may hold a password).

Logs are decoded by ``polyloop.stores.decode_lines``, the JSONL store's own reading rule, so
the inspector accepts exactly the logs the store accepts and names a bad line the same way.
A directory's or a database's log that does not decode is reported beside the others
(``Unreadable``); a log file given alone that does not is the command's error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polyloop.errors import DecodeError, InspectError, LogCorruptError
from polyloop.inspect._locator import (
    SCHEMES,
    log_files,
    open_target,
    read_log_file,
    run_id_of,
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
]


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
    raw = read_log_file(path)
    return _decoded(raw, run_id=run_id_of(path), source=str(path))


def _decoded(raw: bytes, *, run_id: str, source: str) -> tuple[tuple[LogEntry, ...], int]:
    """A log's bytes decoded (the store's reading rule), and the size of its torn tail."""
    try:
        records = decode_lines(raw, run_id=run_id)
    except (DecodeError, LogCorruptError) as exc:
        raise InspectError(f"{source}: {_one_line(str(exc))}") from exc
    return records, len(raw) - (raw.rfind(b"\n") + 1)


def load_file(path: Path) -> RunView:
    """The run in the JSONL log ``path``; ``InspectError`` if it cannot be read or decoded."""
    records, torn = read_records(path)
    return _view(records, torn, source=str(path), fallback=run_id_of(path))


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


def display_target(target: str) -> str:
    """``target`` as messages may print it (a ``postgres://`` URL without its password)."""
    return open_target(target).shown


def load_target(target: str, *, run_id: str | None = None) -> Loaded:
    """Load a path or a store URL (see the module docstring); ``InspectError`` when it cannot.

    ``run_id`` is a hint for a store that can read one run alone (a ``postgres://`` URL): read
    that run only (a directory is read whole, its files named by their runs or not)."""
    place = open_target(target)
    runs: list[RunView] = []
    unreadable: list[Unreadable] = []
    for log in place.logs(run_id):
        try:
            records, torn = _decoded(log.read(), run_id=log.run_id, source=log.source)
            view = _view(records, torn, source=log.source, fallback=log.run_id)
        except InspectError as exc:
            if not place.several:
                raise
            unreadable.append(Unreadable(source=log.source, message=str(exc)))
        else:
            runs.append(place.hints(view))
    return Loaded(runs=tuple(runs), unreadable=tuple(unreadable))
