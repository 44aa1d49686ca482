"""``verify``: decode every log of a target and check its structure with ``check_log``.

A log passes when every complete line decodes (the JSONL store's reading rule,
``polyloop.stores.decode_lines``) and ``polyloop.session.check_log``, the structural check
``resume`` runs before it trusts a log, finds no breach: contiguous steps, every intent
answered (or the last execution, or explained by the finish's stop reason), no result without
an intent, one start and one finish, records in write order, each record of the file's run.
A log without a single complete line passes with a note: a start that died before its first
line was complete leaves exactly that, and there is nothing in it to contradict.
The soak scoreboard calls the same two functions (its ``lines_decode`` and ``log_consistent``
checks), so the two cannot give different verdicts on a log.

Over a place of several logs (a directory, a store), the runs' links are checked too
(``tree_breaches``: ``polyloop.session.check_tree``, design 0245): each child's parent is
there and names it back, each step's child is there and names it as its parent.

The run id a log is checked against is its file name without ``.jsonl``: that is how
``JsonlRunStore`` finds a run, so a record naming another run is a breach (a renamed copy of
a log is reported as belonging to another run, which it does). In a ``postgres://`` store it
is the run id the records are stored under. Every target is read through the inspector's
store locator (``polyloop.inspect._locator``, design 0222).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from polyloop.errors import DecodeError, InspectError, LogCorruptError
from polyloop.inspect._locator import open_target
from polyloop.inspect._safe import visible
from polyloop.inspect._units import plural
from polyloop.ports import RunLog
from polyloop.session import check_log, check_tree
from polyloop.stores import assemble_log, decode_lines

__all__ = ["LogVerdict", "tree_breaches", "verify_log_bytes", "verify_path", "verify_target"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogVerdict:
    """One log's verdict: ``breach`` is ``None`` when it passed, else one line saying what
    breaks; ``line`` is the 1-based line of the first breach (``None`` when no line applies)."""

    source: str
    run_id: str
    records: int
    line: int | None
    breach: str | None
    log: RunLog | None = field(default=None, compare=False, repr=False)
    """The log as read, when it decoded (for the tree check, ``tree_breaches``)."""

    @property
    def ok(self) -> bool:
        return self.breach is None

    def describe(self) -> str:
        """The verdict as one line, made visible (a breach may quote the log; design 0180)."""
        if self.breach is None and not self.records:
            line = f"ok      {self.source} (no record: a start that died before its first line)"
        elif self.breach is None:
            line = f"ok      {self.source} ({plural(self.records, 'record')})"
        else:
            where = "" if self.line is None else f"line {self.line}: "
            line = f"BREACH  {self.source}: {where}{self.breach}"
        return visible(line)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def verify_log_bytes(raw: bytes, *, run_id: str, source: str) -> LogVerdict:
    """The verdict on one log's bytes, checked as the log of ``run_id``."""
    try:
        entries = decode_lines(raw, run_id=run_id)
    except (DecodeError, LogCorruptError) as exc:
        prefix = f"log of run {run_id!r}, line {exc.line}: "
        detail = str(exc).removeprefix(prefix) if exc.line is not None else str(exc)
        return LogVerdict(
            source=source,
            run_id=run_id,
            records=0,
            line=exc.line,
            breach=f"the line does not decode: {_one_line(detail)}",
        )
    if not entries:
        # What a start that died before its first line was complete leaves: nothing to check.
        return LogVerdict(source=source, run_id=run_id, records=0, line=None, breach=None)
    log: RunLog = assemble_log((e.record for e in entries), lines=(e.line for e in entries))
    found = check_log(log, run_id)
    return LogVerdict(
        source=source,
        run_id=run_id,
        records=len(entries),
        line=None if found is None else found.line,
        breach=None if found is None else _one_line(found.detail),
        log=log,
    )


def tree_breaches(verdicts: list[LogVerdict]) -> tuple[str, ...]:
    """The broken links between the runs of a place (``polyloop.session.check_tree``, design
    0245): a child whose parent is missing or does not name it back, a step naming a child
    that is not there. Checked only for a place of more than one log: a single log is one
    run, whose relatives live elsewhere."""
    if len(verdicts) < 2:
        return ()
    return check_tree({v.run_id: v.log for v in verdicts if v.log is not None})


def verify_path(path: Path) -> LogVerdict:
    """The verdict on the log file ``path`` (``InspectError`` when it cannot be read)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InspectError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise InspectError(
            f"{path}: cannot be read ({exc.strerror or type(exc).__name__})"
        ) from exc
    name = path.name
    run_id = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    return verify_log_bytes(raw, run_id=run_id, source=str(path))


def verify_target(target: str) -> list[LogVerdict]:
    """Verdicts for every log of ``target``, as the store locator finds them (a file, a
    directory, a ``jsonl://`` URL, a ``postgres://`` URL: each run's log bytes, as its JSONL
    copy holds them; ``polyloop.inspect._locator``). A log that cannot be read is the
    command's error (``InspectError``): a log nobody can read is no verdict."""
    return [
        verify_log_bytes(log.read(), run_id=log.run_id, source=log.source)
        for log in open_target(target).logs(None)
    ]
