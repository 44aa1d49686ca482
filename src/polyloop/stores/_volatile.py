"""``VolatileRunStore``: the JSONL store's contract, held in process memory."""

from __future__ import annotations

from collections.abc import Mapping

from polyloop.ports import RunLog
from polyloop.stores._records import Record, assemble_log, decode_line, encode_line
from polyloop.types import Intent, ModelCallResult, RunFinished, RunStarted, StepCompleted

__all__ = ["VolatileRunStore"]


class VolatileRunStore:
    """A ``RunStore`` in memory: what it lacks is recovery across processes, nothing else.

    * It keeps, per run id, the exact bytes the JSONL store would write, and decodes them on
      every ``read_log``. So nothing aliases: changing a snapshot dict after writing it, or a
      record read back, never changes the log; and every ``DecodeError`` has the same text as
      the JSONL store's (records are numbered like the lines of the JSONL file).
    * ``write_run_started`` raises ``FileExistsError`` when the run id has *any* record (the
      JSONL store's criterion: any write creates the file).
    * A record with wrongly typed fields (values JSON can still represent) is accepted on write
      and fails on read; a value JSON cannot represent is refused on write; a record passed
      to the wrong write method, or an object that is not a log record, is refused with
      ``TypeError`` and leaves nothing behind (not even an empty entry for its run id).
    * Run ids have no shape restriction here (``"a/b"`` is fine), unlike the JSONL store.
    * Writes contain no ``await``, so each one is atomic with respect to other tasks on the same
      event loop. The store is not thread-safe: use one instance per event loop.
    """

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: dict[str, list[bytes]] = {}

    def __repr__(self) -> str:
        return f"VolatileRunStore(<{len(self._lines)} runs>)"

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "volatile"}``; never instance state such as how many runs it holds."""
        return {"kind": "volatile"}

    async def write_run_started(self, record: RunStarted) -> None:
        """Start a run's log; ``FileExistsError`` if the run id has any record already."""
        line = encode_line(record, RunStarted, "VolatileRunStore.write_run_started")
        if record.run_id in self._lines:
            raise FileExistsError(
                f"VolatileRunStore: run id {record.run_id!r} already has a log; start a new run "
                "with a new run id, or resume this one"
            )
        self._lines[record.run_id] = [line]

    async def write_intent(self, record: Intent) -> None:
        """Append an intent."""
        self._append(record, encode_line(record, Intent, "VolatileRunStore.write_intent"))

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        """Append a model-call result."""
        where = "VolatileRunStore.write_model_call_result"
        self._append(record, encode_line(record, ModelCallResult, where))

    async def write_step_completed(self, record: StepCompleted) -> None:
        """Append a step; outcome and step are one entry."""
        where = "VolatileRunStore.write_step_completed"
        self._append(record, encode_line(record, StepCompleted, where))

    async def write_run_finished(self, record: RunFinished) -> None:
        """Append the finish record."""
        where = "VolatileRunStore.write_run_finished"
        self._append(record, encode_line(record, RunFinished, where))

    async def read_log(self, run_id: str) -> RunLog:
        """Decode the run's records afresh; ``RunLog()`` for an unknown run id."""
        lines = tuple(self._lines.get(run_id, ()))
        return assemble_log(
            decode_line(line[:-1], run_id=run_id, line_number=number)
            for number, line in enumerate(lines, start=1)
        )

    def _append(self, record: Record, line: bytes) -> None:
        self._lines.setdefault(record.run_id, []).append(line)
