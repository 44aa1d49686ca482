"""Batches: one agent over thousands of items, resumable by running it again (design 0242).

::

    from polyloop import Agent
    from polyloop.batch import RetryPolicy, run_batch

    agent = Agent("openai:gpt-4o-mini", store="runs")
    report = await run_batch(
        agent, ({"prompt": q} for q in questions), batch_id="eval-7", concurrency=16,
        retry=RetryPolicy(max_attempts=3), report_dir="runs/batches/eval-7",
    )
    print(report.totals.by_stop_reason)

A batch is a layer above ``polyloop.session.run_or_resume``, as ``polyloop.ray`` is, and its
only state is the runs' own logs. Each item's run id is ``<batch id>--<key>`` (``key=``, or a
digest of the item), so running the same batch again returns the finished runs from the store
without a model call, continues the unfinished ones from their logs and starts the missing
ones; no item runs twice. A retry (``RetryPolicy``) is a new run ``<batch id>--<key>--<n>``
that continues the stopped one (``polyloop.session.continue_run``): every attempt stays on
record and nothing recorded is executed again. Items are streamed: at most ``concurrency`` are
in flight and nothing per item is kept once it ended (a set of keys, to refuse a duplicate).

``python -m polyloop batch run ...`` is the command line (``polyloop.batch._cli``), and
``python -m polyloop batch PLACE --batch-id ID`` rebuilds the report from the store. The guide
is ``research-wiki/guides/batches.md``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterable, Callable, Iterable, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.batch._engine import ItemFactory, default_prompt, iter_batch
from polyloop.batch._ids import attempt_run_id, digest_key, parse_run_id
from polyloop.batch._progress import BatchProgress, Display, Tally
from polyloop.batch._report import (
    COLUMNS,
    BatchTotals,
    ItemReport,
    ReportFiles,
    stored_rows,
)
from polyloop.batch._retry import RETRYABLE, RetryPolicy

__all__ = [
    "COLUMNS",
    "RETRYABLE",
    "BatchProgress",
    "BatchReport",
    "BatchTotals",
    "ItemFactory",
    "ItemReport",
    "RetryPolicy",
    "attempt_run_id",
    "default_prompt",
    "digest_key",
    "iter_batch",
    "parse_run_id",
    "run_batch",
    "stored_rows",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchReport:
    """What ``run_batch`` returns: the ``totals``, and the report files (``None`` without a
    ``report_dir``): ``jsonl`` and ``csv`` (one row per item, ``COLUMNS``) and ``totals.json``."""

    batch_id: str
    totals: BatchTotals
    elapsed_seconds: float
    jsonl: Path | None = None
    csv: Path | None = None


async def run_batch(
    agent: Any,
    items: Iterable[Any] | AsyncIterable[Any],
    *,
    batch_id: str,
    key: Callable[[Any], str] | None = None,
    prompt: Callable[[Any], str] | None = None,
    concurrency: int = 16,
    retry: RetryPolicy | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    progress_stream: TextIO | None = sys.stderr,
    progress_every_seconds: float = 30.0,
    total: int | None = None,
    lease_wait_seconds: float = 60.0,
    engine: Any = None,
) -> BatchReport:
    """Run ``agent`` over every item, ``concurrency`` at a time; resumable by calling it again.

    * ``agent``: a ``polyloop.Agent`` (its store keeps the runs; ``prompt(item)``, default
      ``default_prompt``: a ``str`` item, or a mapping's ``"prompt"``; the batch runs
      ``agent.definition()``, so with a model string its HTTP client stays open until
      ``agent.aclose()``), or an ``ItemFactory``
      ``(item, run_id) -> async context manager of (AgentDefinition, RunRequest)``.
    * ``items``: any iterable or async iterable, read only as fast as items end.
    * ``batch_id`` and ``key`` (default: ``digest_key``, a digest of the item's JSON): the run
      id of an item's attempt *n* is ``attempt_run_id(batch_id, key, n)``. Same batch id and
      items again: finished items are read back (no model call), the rest continue.
    * ``retry``: a ``RetryPolicy`` (default ``RetryPolicy()``: ``llm_error``,
      ``retries_exhausted`` and ``action_timeout``, 3 tries, back-off 1 s doubling to 60 s
      with full jitter), applied to each item as soon as its try stops. A ``CANCELLED``
      attempt is always continued.
    * An attempt that raises (an executor breaking its contract, ``ParameterDriftError``...)
      ends its item with ``ItemReport.error``; the batch goes on. Calling again resumes it.
    * ``report_dir``: where ``report.jsonl``, ``report.csv`` and ``totals.json`` go (written
      as items end into ``*.partial`` files, put in place when the batch ends).
    * Progress: ``on_progress`` gets a ``BatchProgress`` each time an item ends;
      ``progress_stream`` (default standard error; ``None``: silent) shows one live line on a
      terminal, else a line every ``progress_every_seconds``. ``total``: the item count for the
      ETA (default ``len(items)`` when ``items`` has one).
    * ``engine``: ``None`` (this event loop), or ``polyloop.ray.RayActors(...)`` /
      ``RayTasks(...)`` to run the items on the connected Ray cluster (``ray.init`` first),
      with the same semantics: each item's whole course (attempts, retries, back-off) runs on
      a worker, ``concurrency`` bounds the items in flight, and an item Ray executes again
      (a dead worker) continues from the store. ``agent`` must then be an ``ItemFactory``
      that pickles (a module-level function building the agent on the worker).
    * ``lease_wait_seconds``: how long an item waits for a run whose lease another process
      holds (a killed earlier driver's lease on PostgreSQL, until it expires; a second driver
      of the same batch), before its row's ``error`` is ``RunLeaseHeldError``.

    Cancelling the call cancels the runs in flight (each writes its ``CANCELLED`` finish) and
    leaves the partial report; the next call continues them.
    """
    if total is None and isinstance(items, Sized):
        total = len(items)
    tally = Tally(total)
    display = Display(progress_stream, every_seconds=progress_every_seconds, callback=on_progress)
    files = None if report_dir is None else ReportFiles(report_dir)
    rows = iter_batch(
        agent,
        items,
        batch_id=batch_id,
        key=key,
        prompt=prompt,
        concurrency=concurrency,
        retry=retry,
        lease_wait_seconds=lease_wait_seconds,
        engine=engine,
        tally=tally,
    )
    try:
        # aclosing: whatever stops this loop (a failed report write, a callback that raises)
        # closes the engine, which cancels the runs in flight (each writes its finish).
        async with contextlib.aclosing(rows):
            async for row in rows:
                if files is not None:
                    files.add(row)
                display.update(tally)
    except BaseException:
        if files is not None:
            files.abandon()
        raise
    display.update(tally, final=True)
    if files is not None:
        files.close(tally.totals)
    return BatchReport(
        batch_id=batch_id,
        totals=tally.totals,
        elapsed_seconds=tally.progress().elapsed_seconds,
        jsonl=None if files is None else files.jsonl,
        csv=None if files is None else files.csv,
    )


# Documented, printed and pickled as ``polyloop.batch.<name>`` (design 0221).
_claim_public_names(__name__, globals())
