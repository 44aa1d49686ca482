"""The five write methods of a ``RunStore`` and of a ``RunLease``, written once.

Every shipped store and every lease it grants writes a record the same way, so the methods
live here and each class supplies only where the line goes (``RecordWriter._store_line``):

=============================  ===================  =========  ============================
method                         record               exclusive  durability
=============================  ===================  =========  ============================
``write_run_started``          ``RunStarted``       yes        barrier
``write_intent``               ``Intent``           no         barrier
``write_model_call_result``    ``ModelCallResult``  no         with the next barrier
``write_step_completed``       ``StepCompleted``    no         with the next barrier
``write_run_finished``         ``RunFinished``      no         barrier
=============================  ===================  =========  ============================

The durability column is ``polyloop.stores._records.is_barrier`` (the record table's
``barrier`` column): no code here or in a store restates it. "Exclusive" means the write
refuses a run id that has any record with ``polyloop.errors.RunAlreadyStartedError``
(``started_error``) and stores nothing. Each method first encodes its record
(``encode_line``: a record of another kind, or no record at all, is a ``PolyloopTypeError``
naming ``<Class>.<method>``), so nothing reaches a store that it could not read back.
"""

from __future__ import annotations

from polyloop.errors import RunAlreadyStartedError
from polyloop.stores._records import Record, encode_line
from polyloop.types import Intent, ModelCallResult, RunFinished, RunStarted, StepCompleted

__all__ = ["RecordWriter", "started_error"]


def started_error(store: str, run_id: str, *, log: str | None = None) -> RunAlreadyStartedError:
    """The refusal of ``write_run_started`` on a run id that already has records (``log``:
    where that log is, for a store whose logs have a path)."""
    found = "a log" if log is None else f"a log ({log})"
    return RunAlreadyStartedError(
        f"{store}: run id {run_id!r} already has {found}; start a new run with a new run id, "
        "or resume this one",
        run_id=run_id,
    )


class RecordWriter:
    """The five write methods (table above), each ending in ``_store_line``.

    A subclass implements ``_store_line(record, line, kind, where)``: store ``line`` (the
    encoded ``record``, ending in ``\\n``) as its run's next record, exclusively when ``kind``
    is ``RunStarted``, durably before returning when ``is_barrier(kind)``. ``where`` is
    ``"<Class>.<method>"``, for the subclass's own refusals.
    """

    __slots__ = ()

    async def write_run_started(self, record: RunStarted) -> None:
        """Start the run's log: exclusive (``RunAlreadyStartedError``), a barrier."""
        await self._write(record, RunStarted, "write_run_started")

    async def write_intent(self, record: Intent) -> None:
        """Append an intent: a barrier (durable, with every earlier record, on return)."""
        await self._write(record, Intent, "write_intent")

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        """Append a model-call result; durable with the run's next barrier."""
        await self._write(record, ModelCallResult, "write_model_call_result")

    async def write_step_completed(self, record: StepCompleted) -> None:
        """Append a step (outcome and step are one record: both or neither); durable with
        the run's next barrier."""
        await self._write(record, StepCompleted, "write_step_completed")

    async def write_run_finished(self, record: RunFinished) -> None:
        """Append the finish record: a barrier."""
        await self._write(record, RunFinished, "write_run_finished")

    async def _store_line(
        self, record: Record, line: bytes, kind: type[Record], where: str
    ) -> None:
        """Store ``line``, the encoded ``record`` (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _store_line")

    async def _write(self, record: Record, kind: type[Record], method: str) -> None:
        where = f"{type(self).__name__}.{method}"
        line = encode_line(record, kind, where)  # refuses anything but a ``kind`` record
        await self._store_line(record, line, kind, where)
