"""A batch's report: one row per item, and totals; written as JSONL and CSV (design 0242).

A row is derived from the item's last attempt's run alone (``row_of_log``; ``row_of_result`` is
the same for the ``RunResult`` the engine holds), so the report the engine writes as items end
and the one ``python -m polyloop batch PLACE --batch-id ID`` rebuilds from the store are equal:
the store is the batch's only state.
"""

from __future__ import annotations

import csv
import dataclasses
import decimal
import io
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from polyloop._common import EXACT_MONEY, money_text
from polyloop.batch._ids import attempt_run_id, parse_run_id
from polyloop.ports import RunLog, RunStore
from polyloop.session import stop_reason_of
from polyloop.types import RunResult, StepRecord, StopReason

__all__ = [
    "COLUMNS",
    "SUCCESS",
    "BatchTotals",
    "ItemReport",
    "ReportFiles",
    "error_row",
    "row_of_log",
    "row_of_result",
    "stored_rows",
]

SUCCESS: Final = frozenset({StopReason.FINAL_ANSWER.value, StopReason.TASK_COMPLETED.value})
"""Stop reasons counted as done well; every other stop (or an error) counts as failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemReport:
    """One item of a batch, as its last attempt's run stands.

    ``key``: the item's key; ``run_id``: its last attempt's run; ``attempts``: how many runs the
    item has (the first and each retry or continuation); ``stop_reason``: that run's
    (``polyloop.session.stop_reason_of``: ``""`` while it is unfinished, a run left open as
    ``retries_exhausted`` included: running the batch again resumes it); ``error``: what the
    attempt raised, if it raised (``"Type: message"``; never read back from the store);
    ``steps``, ``tokens`` (reported ``prompt + completion`` tokens), ``wall_ms`` (the steps'
    recorded wall time): of that run, the steps its continuations copied included;
    ``final_answer``: the answer on record (for a structured output, its JSON); ``cost``: the
    sum of the steps' recorded costs (design 0236), exact, as decimal text in the currency of
    the run's pricing (``None`` when no step has one: a run without prices).
    """

    key: str
    run_id: str
    attempts: int
    stop_reason: str
    steps: int
    tokens: int
    wall_ms: int
    final_answer: str | None
    error: str | None = None
    cost: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the item ended otherwise than with an answer or a completed task."""
        return self.error is not None or self.stop_reason not in SUCCESS


COLUMNS: Final = tuple(f.name for f in dataclasses.fields(ItemReport))
"""The report's columns, in order (JSONL keys and the CSV header)."""


def _row(
    key: str,
    run_id: str,
    attempts: int,
    reason: str,
    answer: str | None,
    steps: Iterable[StepRecord],
) -> ItemReport:
    count = tokens = wall = 0
    cost: decimal.Decimal | None = None
    for step in steps:
        count += 1
        tokens += 0 if step.usage is None else step.usage.total_tokens
        wall += step.step_wall_ms
        if step.cost is not None:
            cost = step.cost if cost is None else EXACT_MONEY.add(cost, step.cost)
    return ItemReport(
        key=key,
        run_id=run_id,
        attempts=attempts,
        stop_reason=reason,
        steps=count,
        tokens=tokens,
        wall_ms=wall,
        final_answer=answer,
        cost=None if cost is None else money_text(cost),
    )


def error_row(key: str, error: str, *, run_id: str = "") -> ItemReport:
    """The row of an item whose course produced no run result: ``error`` says why (a key that
    could not be made, a factory that raised, a worker lost on Ray); nothing is counted."""
    return ItemReport(
        key=key,
        run_id=run_id,
        attempts=0,
        stop_reason="",
        steps=0,
        tokens=0,
        wall_ms=0,
        final_answer=None,
        error=error,
    )


def row_of_result(key: str, attempts: int, result: RunResult) -> ItemReport:
    """The row of an item whose last attempt returned ``result``. A run that stopped
    ``retries_exhausted`` is left open, unfinished on record (``stop_reason_of`` gives
    ``None``), so its row says ``""`` as the row rebuilt from its log does."""
    reason = result.stop_reason
    return _row(
        key,
        result.run_id,
        attempts,
        "" if reason is StopReason.RETRIES_EXHAUSTED else reason.value,
        result.final_answer,
        result.steps,
    )


def row_of_log(key: str, run_id: str, attempts: int, log: RunLog) -> ItemReport:
    """The row of an item whose last attempt's stored log is ``log``."""
    reason = stop_reason_of(log, run_id)
    finished = log.finished
    answer = None if finished is None else finished.result.final_answer
    return _row(
        key,
        run_id,
        attempts,
        "" if reason is None else reason.value,
        answer,
        (completed.step for completed in log.steps),
    )


async def stored_rows(store: RunStore, batch_id: str, run_ids: Iterable[str]) -> list[ItemReport]:
    """The rows of the batch ``batch_id`` as ``store`` holds them, sorted by key: ``run_ids``
    are the store's run ids (any others are skipped), grouped by item; the last attempt of each
    is read. The child runs of items' runs (their ids have the batch's prefix too) are no
    items, and skipped."""
    last: dict[str, int] = {}
    for run_id in run_ids:
        parsed = parse_run_id(batch_id, run_id)
        if parsed is not None:
            key, attempt = parsed
            last[key] = max(attempt, last.get(key, 0))
    rows = []
    for key in sorted(last):
        run_id = attempt_run_id(batch_id, key, last[key])
        log = await store.read_log(run_id)
        if log.started is not None and log.started.parent is not None:
            continue  # a child run of an item's run ('<run id>.a1', design 0245): no item
        rows.append(row_of_log(key, run_id, last[key], log))
    return rows


@dataclass(slots=True, kw_only=True)
class BatchTotals:
    """The batch's counts: ``items``, ``by_stop_reason`` (``""`` for unfinished), ``failed``
    (items not done well, errors included), ``errors`` (attempts that raised), ``attempts``
    (runs in all), ``retried`` (items with more than one attempt), ``steps``, ``tokens``,
    ``wall_ms``, ``cost`` (summed over the items' last runs; ``cost`` ``None`` when no item
    has one)."""

    items: int = 0
    by_stop_reason: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    errors: int = 0
    attempts: int = 0
    retried: int = 0
    steps: int = 0
    tokens: int = 0
    wall_ms: int = 0
    cost: decimal.Decimal | None = None

    def add(self, row: ItemReport) -> None:
        self.items += 1
        self.by_stop_reason[row.stop_reason] += 1
        self.failed += row.failed
        self.errors += row.error is not None
        self.attempts += row.attempts
        self.retried += row.attempts > 1
        self.steps += row.steps
        self.tokens += row.tokens
        self.wall_ms += row.wall_ms
        if row.cost is not None:
            cost = decimal.Decimal(row.cost)
            self.cost = cost if self.cost is None else EXACT_MONEY.add(self.cost, cost)

    def as_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        data["by_stop_reason"] = dict(sorted(self.by_stop_reason.items()))
        data["cost"] = None if self.cost is None else money_text(self.cost)
        return data


def _csv_line(row: Mapping[str, object]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
    return buffer.getvalue()


class ReportFiles:
    """``report.jsonl``, ``report.csv`` and ``totals.json`` in ``directory``.

    Rows are appended to ``*.partial`` files as items end (nothing is kept in memory); ``close``
    makes them durable and renames them into place, so a complete report is a finished batch's
    and a killed batch leaves only partials, which the next run starts again."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.directory / "report.jsonl"
        self.csv = self.directory / "report.csv"
        self.totals = self.directory / "totals.json"
        self._jsonl = (self.directory / "report.jsonl.partial").open("w", encoding="utf-8")
        self._csv = (self.directory / "report.csv.partial").open("w", encoding="utf-8", newline="")
        self._csv.write(",".join(COLUMNS) + "\n")

    def add(self, row: ItemReport) -> None:
        data = dataclasses.asdict(row)
        self._jsonl.write(json.dumps(data, ensure_ascii=False) + "\n")
        self._csv.write(_csv_line(data))

    def abandon(self) -> None:
        """Close the partial files without putting them in place (the batch did not end)."""
        self._jsonl.close()
        self._csv.close()

    def close(self, totals: BatchTotals) -> None:
        for handle, final in ((self._jsonl, self.jsonl), (self._csv, self.csv)):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            os.replace(handle.name, final)
        partial = self.totals.with_suffix(".json.partial")
        partial.write_text(json.dumps(totals.as_dict(), indent=2) + "\n", encoding="utf-8")
        os.replace(partial, self.totals)
