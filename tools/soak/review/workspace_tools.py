"""The review scenario's environment: four tools over pseudonymised documents and a workspace,
and the executor that guards them with the leak gate.

Tools (registration order; ``PHASE_TOOLS`` narrows them per phase):

==================  ===========  ============  ==============================================
tool                replay       completes_run  effect
==================  ===========  ============  ==============================================
``read_document``   ``SAFE``     no            numbered lines of a document or a note
``grep_document``   ``SAFE``     no            numbered lines matching a regular expression
``write_note``      ``NEVER``    no            writes ``notes/<name>``, appends a ledger line
``submit_finding``  ``NEVER``    yes           writes ``finding.json``, appends a ledger line
==================  ===========  ============  ==============================================

Argument rules beyond the JSON schema (a known document or note, line ranges, note names, a
compilable pattern, a verdict from ``VERDICT_LEVELS``) are checked by ``ReviewExecutor``
*before* dispatch, and a violation is a ``NOT_EXECUTED`` action. That matters most for
``submit_finding``: polyloop completes a run on any ``EXECUTED`` call of a ``completes_run``
tool, including one whose handler raised, so a finding with a misspelt verdict must never
reach the handler, or it would end the run without writing a finding. The handlers check the
same rules again (and raise ``ValueError``), so calling them directly is safe too.

Workspace layout: ``notes/<name>`` (model-written notes), ``finding.json`` (the last submitted
finding) and ``.write_audit.log`` (the ledger; see ``ledger``). A broken workspace (deleted,
unwritable) raises ``ToolEnvironmentError`` inside a handler, which the registry executor turns
into ``ENV_ERROR``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from polyloop.ports import Action, ToolCall
from polyloop.tools import ToolEnvironmentError, ToolRegistry, ToolSpec, ToolValidationError
from polyloop.types import ActionOutcome, ActionStatus, ReplayPolicy
from tools.soak.review.domain import ALL_TOOLS, VERDICT_LEVELS
from tools.soak.review.ledger import AUDIT_LOG_NAME, append_entry
from tools.soak.review.redaction import KnownOriginals, LeakGate, assert_no_residue

__all__ = [
    "FINDING_NAME",
    "MAX_GREP_MATCHES",
    "MAX_NOTE_CHARS",
    "MAX_PATTERN_CHARS",
    "MAX_READ_LINES",
    "NOTES_DIR",
    "ReviewExecutor",
    "ReviewTools",
]

MAX_READ_LINES: Final = 200
"""The most lines one ``read_document`` call returns; larger ``max_lines`` is refused."""
MAX_GREP_MATCHES: Final = 50
"""The most matching lines one ``grep_document`` call shows (the total is always reported)."""
MAX_PATTERN_CHARS: Final = 200
MAX_NOTE_CHARS: Final = 50_000
MAX_SUMMARY_CHARS: Final = 4_000
FINDING_NAME: Final = "finding.json"
NOTES_DIR: Final = "notes"

_NOTE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,47}\.(?:md|txt)")


def _outcome(status: ActionStatus, observation: str) -> ActionOutcome:
    return ActionOutcome(
        status=status,
        observation=observation,
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    )


def _int_arg(arguments: Mapping[str, object], key: str, default: int | None = None) -> int:
    # Called after the registry checked the JSON types; 3.0 counts as an integer there.
    value = arguments.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key} must be an integer; validate the call against the registry first")
    return int(value)


def _str_arg(arguments: Mapping[str, object], key: str) -> str:
    value = arguments[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string; validate the call against the registry first")
    return value


def _split_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class ReviewTools:
    """The tools of one task's workspace: the task's documents plus the notes on disk.

    ``documents`` maps a document id (``"tender.md"``) to its pseudonymised lines. Notes are
    read from disk on every call, which is how the three phases (three runs, three instances
    of this class) share state.
    """

    __slots__ = ("_documents", "_registry", "_workspace")

    def __init__(self, *, documents: Mapping[str, Sequence[str]], workspace: Path) -> None:
        self._documents: Mapping[str, tuple[str, ...]] = {
            doc_id: tuple(lines) for doc_id, lines in documents.items()
        }
        self._workspace = Path(workspace)
        self._registry = self._build_registry()

    @property
    def workspace(self) -> Path:
        return self._workspace

    # ------------------------------------------------------------------ schema

    def registry(self) -> ToolRegistry:
        """All four tools in ``ALL_TOOLS`` order; narrow it with ``restrict_to``."""
        return self._registry

    def _build_registry(self) -> ToolRegistry:
        documents = ", ".join(self._documents)
        specs = {
            "read_document": ToolSpec(
                name="read_document",
                description=(
                    f"Return up to max_lines numbered lines (at most {MAX_READ_LINES}) of a "
                    f"document ({documents}) or of a note you wrote, from start_line on."
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "doc_id": {"type": "string", "description": "document id or note name"},
                        "start_line": {"type": "integer", "minimum": 1},
                        "max_lines": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_READ_LINES,
                            "description": f"defaults to {MAX_READ_LINES}",
                        },
                    },
                    "required": ["doc_id", "start_line"],
                    "additionalProperties": False,
                },
                handler=self.read_document,
                replay_policy=ReplayPolicy.SAFE,
            ),
            "grep_document": ToolSpec(
                name="grep_document",
                description=(
                    "Return the numbered lines of a document or note that match a Python "
                    f"regular expression (case-sensitive; the first {MAX_GREP_MATCHES} "
                    "matches and the total count)."
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "doc_id": {"type": "string"},
                        "pattern": {"type": "string", "maxLength": MAX_PATTERN_CHARS},
                    },
                    "required": ["doc_id", "pattern"],
                    "additionalProperties": False,
                },
                handler=self.grep_document,
                replay_policy=ReplayPolicy.SAFE,
            ),
            "write_note": ToolSpec(
                name="write_note",
                description=(
                    "Write (or overwrite) a note in the shared workspace, for example plan.md "
                    "or evidence.md. Names are letters, digits, '-' and '_' ending in .md or "
                    ".txt."
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "text": {"type": "string", "maxLength": MAX_NOTE_CHARS},
                    },
                    "required": ["name", "text"],
                    "additionalProperties": False,
                },
                handler=self.write_note,
                replay_policy=ReplayPolicy.NEVER,
            ),
            "submit_finding": ToolSpec(
                name="submit_finding",
                description=(
                    "Submit the verdict on the checkpoint with a short summary of the "
                    "evidence. This ends the review."
                ),
                parameters={
                    "type": "object",
                    "properties": {
                        "verdict": {"type": "string", "enum": list(VERDICT_LEVELS)},
                        "summary": {"type": "string", "maxLength": MAX_SUMMARY_CHARS},
                    },
                    "required": ["verdict", "summary"],
                    "additionalProperties": False,
                },
                handler=self.submit_finding,
                replay_policy=ReplayPolicy.NEVER,
                completes_run=True,
            ),
        }
        return ToolRegistry(specs[name] for name in ALL_TOOLS)

    # ------------------------------------------------------------------ argument rules

    def _note_path(self, name: str) -> Path:
        return self._workspace / NOTES_DIR / name

    def _source_problem(self, doc_id: str) -> str | None:
        if doc_id in self._documents:
            return None
        if _NOTE_NAME.fullmatch(doc_id) and self._note_path(doc_id).is_file():
            return None
        return (
            f"doc_id {doc_id[:80]!r} is neither a document ({', '.join(self._documents)}) nor "
            "a note written with write_note"
        )

    def argument_problem(self, tool: str, arguments: Mapping[str, object]) -> str | None:
        """Why schema-valid ``arguments`` still may not run ``tool``, or ``None``.

        Reads the disk only to see whether a note exists.
        """
        if tool in ("read_document", "grep_document"):
            problem = self._source_problem(_str_arg(arguments, "doc_id"))
            if problem is not None:
                return problem
        if tool == "read_document":
            start = _int_arg(arguments, "start_line")
            count = _int_arg(arguments, "max_lines", MAX_READ_LINES)
            if start < 1:
                return f"start_line must be 1 or more, got {start}"
            if not 1 <= count <= MAX_READ_LINES:
                return f"max_lines must be between 1 and {MAX_READ_LINES}, got {count}"
        elif tool == "grep_document":
            pattern = _str_arg(arguments, "pattern")
            if not pattern or len(pattern) > MAX_PATTERN_CHARS:
                return f"pattern must have 1 to {MAX_PATTERN_CHARS} characters"
            try:
                re.compile(pattern)
            except re.error as exc:
                return f"pattern is not a valid regular expression: {exc}"
        elif tool == "write_note":
            name, text = _str_arg(arguments, "name"), _str_arg(arguments, "text")
            if not _NOTE_NAME.fullmatch(name):
                return (
                    f"note name {name[:80]!r} is not allowed: use letters, digits, '-' and '_' "
                    "(at most 48, starting with a letter or digit) followed by .md or .txt"
                )
            if not text.strip() or len(text) > MAX_NOTE_CHARS:
                return f"note text must be non-blank and at most {MAX_NOTE_CHARS} characters"
        elif tool == "submit_finding":
            verdict, summary = _str_arg(arguments, "verdict"), _str_arg(arguments, "summary")
            if verdict not in VERDICT_LEVELS:
                return f"verdict must be exactly one of {', '.join(VERDICT_LEVELS)}"
            if not summary.strip() or len(summary) > MAX_SUMMARY_CHARS:
                return f"summary must be non-blank and at most {MAX_SUMMARY_CHARS} characters"
        return None

    def _checked(self, tool: str, arguments: Mapping[str, object]) -> None:
        self._registry.validate(ToolCall(name=tool, arguments=arguments))
        problem = self.argument_problem(tool, arguments)
        if problem is not None:
            raise ValueError(f"{tool}: {problem}")

    # ------------------------------------------------------------------ handlers

    def _lines_of(self, doc_id: str) -> tuple[str, ...]:
        lines = self._documents.get(doc_id)
        if lines is not None:
            return lines
        try:
            text = self._note_path(doc_id).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ValueError(f"note {doc_id!r} does not exist (any more)") from exc
        except OSError as exc:
            raise ToolEnvironmentError(f"the workspace cannot be read: {exc}") from exc
        return tuple(_split_lines(text))

    async def read_document(self, arguments: Mapping[str, object], /) -> str:
        """Numbered lines ``start_line ..`` plus a trailer saying what was left out."""
        self._checked("read_document", arguments)
        doc_id = _str_arg(arguments, "doc_id")
        start = _int_arg(arguments, "start_line")
        count = _int_arg(arguments, "max_lines", MAX_READ_LINES)
        lines = self._lines_of(doc_id)
        total = len(lines)
        if start > total:
            return f"[{doc_id} has {total} lines; start_line {start} is past its end]"
        stop = min(total, start + count - 1)
        shown = [f"{number}: {lines[number - 1]}" for number in range(start, stop + 1)]
        rest = total - stop
        tail = f"{rest} more lines after line {stop}" if rest else "end of document"
        shown.append(f"[lines {start} to {stop} of {total} in {doc_id}; {tail}]")
        return "\n".join(shown)

    async def grep_document(self, arguments: Mapping[str, object], /) -> str:
        """Numbered matching lines (at most ``MAX_GREP_MATCHES``) plus the total count."""
        self._checked("grep_document", arguments)
        doc_id = _str_arg(arguments, "doc_id")
        pattern = re.compile(_str_arg(arguments, "pattern"))
        lines = self._lines_of(doc_id)
        matches = [n for n, line in enumerate(lines, start=1) if pattern.search(line)]
        if not matches:
            return f"[no line of {doc_id} matches the pattern]"
        shown = [f"{n}: {lines[n - 1]}" for n in matches[:MAX_GREP_MATCHES]]
        total = f"{len(matches)} matching line{'s' if len(matches) > 1 else ''} in {doc_id}"
        if len(matches) > MAX_GREP_MATCHES:
            shown.append(f"[{total}; the first {MAX_GREP_MATCHES} are shown]")
        else:
            shown.append(f"[{total}]")
        return "\n".join(shown)

    def _write_atomically(self, path: Path, content: str) -> None:
        scratch = path.with_name(f".{path.name}.partial")
        with scratch.open("w", encoding="utf-8", newline="\n") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, path)

    async def write_note(self, arguments: Mapping[str, object], /) -> str:
        """Write ``notes/<name>``, then append the ledger line."""
        self._checked("write_note", arguments)
        name, text = _str_arg(arguments, "name"), _str_arg(arguments, "text")
        try:
            (self._workspace / NOTES_DIR).mkdir(exist_ok=True)
            self._write_atomically(self._note_path(name), text)
            append_entry(self._workspace, "write_note", name, text)
        except OSError as exc:
            raise ToolEnvironmentError(f"the workspace cannot be written: {exc}") from exc
        return f"saved note {name}: {len(_split_lines(text))} lines, {len(text)} characters"

    async def submit_finding(self, arguments: Mapping[str, object], /) -> str:
        """Write ``finding.json`` (the last submission wins), then append the ledger line."""
        self._checked("submit_finding", arguments)
        verdict, summary = _str_arg(arguments, "verdict"), _str_arg(arguments, "summary")
        content = (
            json.dumps({"summary": summary, "verdict": verdict}, ensure_ascii=False, sort_keys=True)
            + "\n"
        )
        try:
            self._write_atomically(self._workspace / FINDING_NAME, content)
            append_entry(self._workspace, "submit_finding", FINDING_NAME, content)
        except OSError as exc:
            raise ToolEnvironmentError(f"the workspace cannot be written: {exc}") from exc
        return f"finding recorded: {verdict}"


def _gate_mode(known: KnownOriginals | LeakGate | None) -> str:
    """What the gate sweeps for besides the rules (recorded in the executor's parameters)."""
    if isinstance(known, LeakGate):
        return "rules+ground_truth+known_originals"
    return "rules+known_originals" if known is not None else "rules"


class ReviewExecutor:
    """The ``ActionExecutor`` of one review run: the registry executor, plus two guards.

    1. Domain argument rules (``ReviewTools.argument_problem``) are checked before dispatch;
       a violation is ``NOT_EXECUTED`` with the rule as its (logged) observation.
    2. The leak gate: every outcome's observation is scanned with ``assert_no_residue``
       before it is returned, and residue raises ``RedactionResidueError`` out of
       ``execute``. polyloop does not catch executor exceptions, so the run ends right there
       with "action intent, no step" in its log; the observation reaches neither the log nor
       any prompt. A hard stop is the point: a leak is not something a model should be shown
       and allowed to work around.

    ``registry`` is the registry the run's ``tools`` must equal (it is not a
    ``RegistryExecutor``, so ``RunRequest`` cannot check that itself; ``build_run_request``
    does).
    """

    __slots__ = ("_inner", "_known", "_parameters", "_registry", "_tools")

    def __init__(
        self,
        *,
        tools: ReviewTools,
        registry: ToolRegistry,
        known: KnownOriginals | LeakGate | None,
    ) -> None:
        self._tools = tools
        self._registry = registry
        self._inner = registry.executor()
        self._known = known
        parameters = dict(self._inner.parameters())
        parameters["kind"] = "review_gated_registry"
        parameters["leak_gate"] = _gate_mode(known)
        parameters["max_read_lines"] = str(MAX_READ_LINES)
        self._parameters: Mapping[str, str] = parameters

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def tools(self) -> ReviewTools:
        return self._tools

    def parameters(self) -> Mapping[str, str]:
        """The registry executor's keys (schemas, replay policies, completes_run), with
        ``kind`` replaced, plus the gate mode and ``MAX_READ_LINES``. No workspace path: it
        changes between machines and would make every resume look drifted."""
        return self._parameters

    def _schema_accepts(self, call: ToolCall) -> bool:
        try:
            self._registry.validate(call)
        except ToolValidationError:
            return False  # the inner executor rejects it with the registry's own message
        return True

    async def execute(self, action: Action) -> ActionOutcome:
        call = action.tool_call
        outcome: ActionOutcome | None = None
        if call is not None and self._schema_accepts(call):
            problem = self._tools.argument_problem(call.name, call.arguments)
            if problem is not None:
                outcome = _outcome(ActionStatus.NOT_EXECUTED, f"not executed: {problem}")
        if outcome is None:
            outcome = await self._inner.execute(action)
        # Only a registered name goes into the error text: an invented one is model output of
        # any length and content, and error texts end up in reports.
        registered = call is not None and self._registry.spec_for(call.name) is not None
        name = call.name if registered and call is not None else "an unregistered tool"
        assert_no_residue(
            outcome.observation,
            where=f"observation of {name} ({outcome.status.value})",
            known=self._known,
        )
        return outcome


# The ledger is never a readable note: its name fails the note-name rule (leading dot).
assert not _NOTE_NAME.fullmatch(AUDIT_LOG_NAME)
