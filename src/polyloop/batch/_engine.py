"""The batch engine on one event loop: a bounded window of items, each driven to its end.

An item's course (``Batch.drive``): attempt 1 is ``run_or_resume`` of its run id, so a
finished run is read back with no model call and an unfinished one continues from its log. An
attempt that finished as the ``RetryPolicy`` retries (``llm_error``, ``action_timeout``), or as
``CANCELLED``, is followed by the next attempt, a new run id that continues it
(``polyloop.session.continue_run``) after the policy's back-off, or, if that run id already has
a log (a batch run again), by ``run_or_resume`` of it; a run left open as
``retries_exhausted`` is resumed after the back-off instead. So running the batch again walks
each item's attempts from the store and picks up exactly where it stopped (design 0242).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
)
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Final

from polyloop.batch._ids import attempt_run_id, check_batch_id, item_key
from polyloop.batch._progress import Tally
from polyloop.batch._report import ItemReport, error_row, row_of_log, row_of_result
from polyloop.batch._retry import RetryPolicy
from polyloop.errors import PolyloopError, PolyloopTypeError, PolyloopValueError, RunIdentityError
from polyloop.ports import RunStore
from polyloop.session import AgentDefinition, RunRequest, continue_run, run_or_resume
from polyloop.types import RunResult, StopReason

__all__ = ["ItemFactory", "default_prompt", "is_agent", "iter_batch"]

logger = logging.getLogger("polyloop.batch")

ItemFactory = Callable[[Any, str], AbstractAsyncContextManager[tuple[AgentDefinition, RunRequest]]]
"""Builds one attempt of an item: ``factory(item, run_id)`` is an async context manager that
yields ``(definition, request)`` with ``request.run_id == run_id`` and closes what it opened."""


def default_prompt(item: object) -> str:
    """An item's prompt for an ``Agent``: the item itself when it is a ``str``, else its
    ``"prompt"`` entry."""
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping) and isinstance(item.get("prompt"), str):
        return str(item["prompt"])
    raise PolyloopTypeError(
        f"batch item {type(item).__name__} has no prompt: give str items, mappings with a "
        "'prompt' str, or pass prompt=<function of an item returning its prompt>"
    )


class _AgentParts:
    """An ``Agent`` as an ``ItemFactory``: one definition for the batch, a request per run."""

    def __init__(self, agent: Any, prompt: Callable[[Any], str]) -> None:
        self._agent = agent
        self._prompt = prompt
        self._definition: AgentDefinition | None = None

    @contextlib.asynccontextmanager
    async def __call__(
        self, item: object, run_id: str
    ) -> AsyncIterator[tuple[AgentDefinition, RunRequest]]:
        if self._definition is None:
            self._definition = self._agent.definition()
        yield self._definition, self._agent.request(self._prompt(item), run_id)


@dataclass(slots=True)
class Where:
    """The attempt an item is at: its number, run id and store (once known)."""

    attempt: int = 1
    run_id: str = ""
    store: RunStore | None = None


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


class Batch:
    """One call's settings and counts; ``drive`` takes one item to its end."""

    def __init__(
        self,
        batch_id: str,
        factory: ItemFactory,
        retry: RetryPolicy,
        lease_wait: float,
    ) -> None:
        self.lease_wait = lease_wait
        self.batch_id = batch_id
        self.factory = factory
        self.retry = retry
        self.rng = random.Random()

    async def drive(self, item: object, key: str) -> ItemReport:
        """The item's row: its last attempt's, or the error an attempt raised."""
        where = Where()
        try:
            result = await self.last(item, key, where)
        except Exception as exc:  # noqa: BLE001 - an item's failure is its row, not the batch's
            logger.warning("batch %s item %s: %s", self.batch_id, key, describe(exc))
            return await self._error_row(key, where, exc)
        return row_of_result(key, where.attempt, result)

    async def last(self, item: object, key: str, where: Where) -> RunResult:
        """Drive the item's attempts, from the first, to the last one's result (``where``
        names the attempt in hand, for an error row). Raises what an attempt raises."""
        tries, previous, wait = 1, None, False
        while True:
            where.run_id = attempt_run_id(self.batch_id, key, where.attempt)
            result = await self._attempt(item, where, previous, tries if wait else 0)
            reason = result.stop_reason
            if (
                reason is not StopReason.CANCELLED
                and not self.retry.retries(reason, tries)
                and not await self._continued(key, where, reason)
            ):
                return result
            tries += reason is not StopReason.CANCELLED
            wait = reason is not StopReason.CANCELLED
            if reason is not StopReason.RETRIES_EXHAUSTED:
                # A finished run: the next attempt is a new run that continues it. A run left
                # open by retries_exhausted is resumed (it tries its action again) instead.
                previous = where.run_id
                where.attempt += 1

    async def _continued(self, key: str, where: Where, reason: StopReason) -> bool:
        """Whether the stopped attempt has a next one on record already (an earlier call of
        the batch, under a policy that retried more): it is walked to, never left behind
        unfinished while the row reports the attempt before it."""
        if reason not in _CONTINUED or where.store is None:
            return False
        later = attempt_run_id(self.batch_id, key, where.attempt + 1)
        return not (await where.store.read_log(later)).is_empty

    async def _attempt(
        self, item: object, where: Where, previous: str | None, tries: int
    ) -> RunResult:
        """One attempt: ``run_or_resume`` of ``where.run_id``, or, when it has no log yet,
        ``continue_run`` of ``previous``; after the back-off of try ``tries`` (0: none) unless
        the run is finished already (a batch run again reads it back at once)."""
        run_id = where.run_id
        async with self.factory(item, run_id) as parts:
            definition, request = _checked(parts, run_id)
            where.store = definition.store
            # A key with a '.' may name a child run of another item ('<run id>.a1', design
            # 0245): read its log first, so that such a run is never taken for the item.
            dotted = "." in run_id[len(self.batch_id) :]
            log = await definition.store.read_log(run_id) if tries or previous or dotted else None
            if log is not None and log.started is not None and log.started.parent is not None:
                raise PolyloopValueError(
                    f"the item's run id {run_id!r} is taken by a child run of run "
                    f"{log.started.parent.run_id!r} (a child run id is '<parent run id>.<call>'):"
                    " give this item a key without '.', or run the batch under a new batch id"
                )
            if tries and log is not None and log.finished is None:
                await asyncio.sleep(self.retry.delay(tries, self.rng))
            if previous is not None and log is not None and log.is_empty:
                try:
                    return await continue_run(
                        definition,
                        request,
                        from_run_id=previous,
                        lease_wait_seconds=self.lease_wait,
                    )
                except RunIdentityError:
                    # Another driver of this batch claimed the attempt meanwhile: go on with
                    # its run (if it has none after all, the error was about something else).
                    if (await definition.store.read_log(run_id)).is_empty:
                        raise
            return await run_or_resume(definition, request, lease_wait_seconds=self.lease_wait)

    async def _error_row(self, key: str, where: Where, exc: Exception) -> ItemReport:
        run_id, attempt, log = where.run_id, where.attempt, None
        if where.store is not None:
            try:
                log = await where.store.read_log(run_id)
            except (PolyloopError, OSError):
                logger.warning("batch %s item %s: its log cannot be read", self.batch_id, key)
        if log is None or log.is_empty or (log.started is not None and log.started.parent):
            return ItemReport(
                key=key,
                run_id=run_id,
                attempts=attempt,
                stop_reason="",
                steps=0,
                tokens=0,
                wall_ms=0,
                final_answer=None,
                error=describe(exc),
            )
        row = row_of_log(key, run_id, attempt, log)
        return ItemReport(**{**_fields(row), "error": describe(exc)})


_CONTINUED: Final = frozenset({StopReason.LLM_ERROR, StopReason.ACTION_TIMEOUT})
"""The stops whose retry is a new run (``continue_run``), which may be on record already."""


def _fields(row: ItemReport) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__slots__}


def _checked(parts: object, run_id: str) -> tuple[AgentDefinition, RunRequest]:
    if (
        not isinstance(parts, tuple)
        or len(parts) != 2
        or not isinstance(parts[0], AgentDefinition)
        or not isinstance(parts[1], RunRequest)
    ):
        raise PolyloopTypeError(
            f"the batch's item factory yielded {type(parts).__name__}; it must yield an "
            "(AgentDefinition, RunRequest) tuple"
        )
    if parts[1].run_id != run_id:
        raise PolyloopValueError(
            f"the batch's item factory gave RunRequest.run_id {parts[1].run_id!r}; it must use "
            f"the run id it is given ({run_id!r}), which names the batch, item and attempt"
        )
    return parts[0], parts[1]


def is_agent(agent: object) -> bool:
    """Whether ``agent`` is used as a ``polyloop.Agent``: it has ``definition()`` and
    ``request(prompt, run_id)`` (checked by shape, so that the batch layer does not import the
    agent, whose model strings reach the HTTP client)."""
    return callable(getattr(agent, "definition", None)) and callable(
        getattr(agent, "request", None)
    )


def item_factory(agent: object, prompt: Callable[[Any], str] | None) -> ItemFactory:
    if is_agent(agent):
        return _AgentParts(agent, default_prompt if prompt is None else prompt)
    if prompt is not None:
        raise PolyloopTypeError(
            "run_batch(prompt=...) goes with an Agent; an item factory builds its own request"
        )
    if not callable(agent):
        raise PolyloopTypeError(
            "run_batch(agent=...) must be a polyloop.Agent or an item factory "
            f"(item, run_id) -> async context manager of (definition, request), got "
            f"{type(agent).__name__}"
        )
    return agent


async def items_of(items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def iter_batch(
    agent: Any,
    items: Iterable[Any] | AsyncIterable[Any],
    *,
    batch_id: str,
    key: Callable[[Any], str] | None = None,
    prompt: Callable[[Any], str] | None = None,
    concurrency: int = 16,
    retry: RetryPolicy | None = None,
    lease_wait_seconds: float = 60.0,
    engine: Any = None,
    tally: Tally | None = None,
) -> AsyncGenerator[ItemReport, None]:
    """Drive every item of ``items`` to its end, ``concurrency`` at a time on this event loop
    (or, with ``engine``, on the connected Ray cluster); yield each item's ``ItemReport`` as it
    ends (``run_batch`` is the whole batch with progress and a report; its docstring says what
    each argument means)."""
    if engine is not None:
        from polyloop.batch._ray import iter_on_ray

        on_ray = iter_on_ray(
            Batch(
                check_batch_id(batch_id),
                _ray_factory(agent, prompt),
                RetryPolicy() if retry is None else _policy(retry),
                lease_wait_seconds,
            ),
            items,
            key=key,
            concurrency=concurrency,
            engine=engine,
            tally=Tally(None) if tally is None else tally,
        )
        async for row in on_ray:
            yield row
        return
    batch = Batch(
        check_batch_id(batch_id),
        item_factory(agent, prompt),
        RetryPolicy() if retry is None else _policy(retry),
        lease_wait_seconds,
    )
    counts = Tally(None) if tally is None else tally
    _check_concurrency(concurrency)
    source = items_of(items)
    tasks: set[asyncio.Task[ItemReport]] = set()
    # Each task puts itself here when it ends: one wake-up per ended item, whatever the window.
    ended: asyncio.Queue[asyncio.Task[ItemReport]] = asyncio.Queue()
    seen: set[str] = set()
    exhausted = False
    try:
        while True:
            while not exhausted and len(tasks) < concurrency:
                try:
                    item = await anext(source)
                except StopAsyncIteration:
                    exhausted = True
                    break
                task = asyncio.ensure_future(_start(batch, item, key, seen))
                task.add_done_callback(ended.put_nowait)
                tasks.add(task)
            counts.running = len(tasks)
            if not tasks:
                return
            task = await ended.get()
            tasks.discard(task)
            row = task.result()
            counts.running = len(tasks)
            counts.ended(row)
            yield row
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            # Each run writes its CANCELLED finish before its task ends; the cancellation (or
            # the error) that brought us here is what propagates.
            await asyncio.wait(tasks)


def keyed(
    item: object, key: Callable[[Any], str] | None, seen: set[str]
) -> tuple[str, ItemReport | None]:
    """The item's key, and the row that refuses it (``None`` when it is fine): a key that is
    not valid, one an earlier item of this call had, or what the key function raised (one
    item's ``KeyError`` is its row's ``error``, never the batch's end)."""
    try:
        named = item_key(key, item)
    except Exception as exc:  # noqa: BLE001 - a key function failing on one item is its row
        logger.warning("batch item %s has no key: %s", type(item).__name__, describe(exc))
        return "", error_row("", describe(exc))
    if named in seen:
        error = f"PolyloopValueError: key {named!r} was given to an earlier item of this batch"
        return named, error_row(named, error)
    seen.add(named)
    return named, None


async def _start(
    batch: Batch, item: object, key: Callable[[Any], str] | None, seen: set[str]
) -> ItemReport:
    """Key the item, refuse a bad or repeated key, drive it."""
    named, refused = keyed(item, key, seen)
    return refused if refused is not None else await batch.drive(item, named)


def _ray_factory(agent: object, prompt: Callable[[Any], str] | None) -> ItemFactory:
    if is_agent(agent):
        raise PolyloopTypeError(
            "run_batch(engine=...) on Ray needs an item factory that pickles (a module-level "
            "function (item, run_id) -> async context manager of (definition, request), which "
            "builds the agent on the worker), not an Agent, whose store and clients stay here"
        )
    return item_factory(agent, prompt)


def _policy(retry: object) -> RetryPolicy:
    if not isinstance(retry, RetryPolicy):
        raise PolyloopTypeError(
            f"run_batch(retry=...) must be a RetryPolicy, got {type(retry).__name__}"
        )
    return retry


def _check_concurrency(concurrency: object) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise PolyloopTypeError(
            f"run_batch(concurrency=...) must be an int, got {type(concurrency).__name__}"
        )
    if concurrency < 1:
        raise PolyloopValueError(f"run_batch(concurrency=...) must be >= 1, got {concurrency}")
