"""A batch on a Ray cluster (design 0242): each item's whole course runs on a worker.

``polyloop.ray.run_on_ray`` places the items (``RayActors`` or ``RayTasks``) and re-executes
one whose worker died. Its factory here is ``_OnWorker``: on the worker it drives the item's
attempts exactly as the one-loop engine does (``Batch.last``: ``run_or_resume``, retries that
``continue_run``), then hands ``run_on_ray`` the last attempt's ``(definition, request)``,
whose ``run_or_resume`` reads the finished result back. An execution Ray repeats (a dead
worker, a duplicate) walks the same attempts in the store and continues where they stand.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from polyloop.batch._engine import Batch, Where, describe, items_of, keyed
from polyloop.batch._ids import attempt_run_id, parse_run_id
from polyloop.batch._progress import Tally
from polyloop.batch._report import ItemReport, error_row, row_of_result
from polyloop.errors import PolyloopValueError
from polyloop.session import AgentDefinition, RunRequest

__all__ = ["iter_on_ray"]


class _OnWorker:
    """``run_on_ray``'s factory: a description is ``(item, key, refusal)``."""

    def __init__(self, batch: Batch) -> None:
        self._batch = batch

    @contextlib.asynccontextmanager
    async def __call__(
        self, description: tuple[Any, str, str | None]
    ) -> AsyncIterator[tuple[AgentDefinition, RunRequest]]:
        item, key, refusal = description
        if refusal is not None:
            raise PolyloopValueError(refusal)
        result = await self._batch.last(item, key, Where())
        async with self._batch.factory(item, result.run_id) as parts:
            yield parts


async def _described(
    items: Iterable[Any] | AsyncIterable[Any], key: Callable[[Any], str] | None
) -> AsyncIterator[tuple[Any, str, str | None]]:
    seen: set[str] = set()
    async for item in items_of(items):
        named, refused = keyed(item, key, seen)
        yield item, named, None if refused is None else refused.error


async def iter_on_ray(
    batch: Batch,
    items: Iterable[Any] | AsyncIterable[Any],
    *,
    key: Callable[[Any], str] | None,
    concurrency: int,
    engine: Any,
    tally: Tally,
) -> AsyncIterator[ItemReport]:
    """``iter_batch`` with ``engine`` (``RayActors`` or ``RayTasks``): the items' rows as
    they end. An item whose course raised (on the worker, or Ray's retries ran out) gets an
    error row naming its first attempt; running the batch again continues it."""
    from polyloop.ray import run_on_ray

    outcomes = run_on_ray(
        _OnWorker(batch),
        _described(items, key),
        max_in_flight=concurrency,
        engine=engine,
        lease_wait_seconds=batch.lease_wait,
    )
    async for outcome in outcomes:
        _item, named, _refusal = outcome.task
        result = outcome.result
        if result is not None:
            parsed = parse_run_id(batch.batch_id, result.run_id)
            row = row_of_result(named, 1 if parsed is None else parsed[1], result)
        else:
            row = error_row(
                named,
                outcome.error or describe(RuntimeError("no result")),
                run_id=attempt_run_id(batch.batch_id, named, 1) if named else "",
            )
        tally.running = outcome.progress.in_flight
        tally.ended(row)
        yield row
