"""The workspace's audit ledger: the environment's own record of every side effect.

Each side-effecting tool call (``write_note``, ``submit_finding``) appends one line::

    <tool>\\t<file name>\\tsha256:<hex digest of the content written>

The line has no step number, no timestamp, no run id: nothing that would differ between the
original execution and a replay of it. That is the point. The soak's hardest criterion, "a
``NEVER`` action is never executed twice", is judged on this file, never on what the library
reports: if recovery ever re-ran a write, the ledger would hold the same line twice, and
deduplicating by ``(tool, file name, digest)`` would shrink it. A volatile field would make
the replayed line look new and hide exactly the failure the check exists for. (The known false
positive, a model writing identical content twice on purpose, is told apart by the step
numbers in the trajectory: a replay straddles a crash.)

The ledger lives in the workspace directory, outside the run log, written by the tools rather
than by polyloop, so it survives the death of the process that drove the run and counts what
the environment did, not what the library believes. It is append-only: lines are added with
one ``O_APPEND`` write each and fsynced before the tool returns; nothing here rewrites or
truncates it. The model can never read it (``read_document`` refuses the name).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path
from typing import Final

__all__ = [
    "AUDIT_LOG_NAME",
    "append_entry",
    "content_digest",
    "duplicate_lines",
    "ledger_entry",
    "ledger_lines",
]

AUDIT_LOG_NAME: Final = ".write_audit.log"


def content_digest(content: str) -> str:
    """``sha256:<hex>`` of the UTF-8 bytes of ``content``."""
    return "sha256:" + hashlib.sha256(content.encode("utf-8")).hexdigest()


def ledger_entry(tool: str, file_name: str, content: str) -> str:
    """The ledger line (without its newline) for writing ``content`` to ``file_name``."""
    for field_name, value in (("tool", tool), ("file_name", file_name)):
        if not value or any(c in value for c in "\t\r\n"):
            raise ValueError(
                f"ledger {field_name} {value!r} must be non-empty and free of tabs and line "
                "breaks, or the line could not be split back into its three fields"
            )
    return f"{tool}\t{file_name}\t{content_digest(content)}"


def append_entry(workspace: Path, tool: str, file_name: str, content: str) -> str:
    """Append the entry for one executed write to the ledger of ``workspace``; return it.

    One ``os.write`` on an ``O_APPEND`` descriptor (so concurrent appenders never interleave
    inside a line), then ``fsync`` (so the line survives a crash once the tool returned).
    ``OSError`` propagates: the caller decides whether that is a broken environment.
    """
    line = ledger_entry(tool, file_name, content)
    descriptor = os.open(
        Path(workspace) / AUDIT_LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
    )
    try:
        os.write(descriptor, (line + "\n").encode("utf-8"))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return line


def ledger_lines(workspace: Path) -> list[str]:
    """Every complete ledger line of ``workspace`` in append order (``[]`` without a ledger).

    Only newline-terminated lines count: a trailing fragment could only come from an append
    torn by a crash, and an execution whose line never completed was not acknowledged.
    """
    path = Path(workspace) / AUDIT_LOG_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    *complete, _fragment = data.decode("utf-8").split("\n")
    return complete


def duplicate_lines(lines: list[str]) -> dict[str, int]:
    """Ledger lines that occur more than once, with their counts (``{}``: no duplicates).

    The no-double-execution check: ``len(lines) == len(set(lines))`` exactly when this is
    empty. Lines are compared whole, i.e. by ``(tool, file name, content digest)``.
    """
    return {line: n for line, n in Counter(lines).items() if n > 1}
