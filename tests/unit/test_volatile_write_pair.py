"""Volatile store: its leases' ``write_pair`` is the two writes in order, in one synchronous
block (design 0214, fourth pass).

The session hands a writer that has ``write_pair`` a model call's result together with the
step's next record (design 0212). For a lease of the volatile store both records are kept (or
encoded, each exactly as its own write would) and appended with no ``await`` in between, the
lease checked once. A refusal of either record (not a record, a ``RunStarted``, two runs, a
value the encoder refuses, a lost lease) stores neither: the JSONL store's rule for a pair,
whose two lines are encoded before its one write. The store itself has no ``write_pair``, so
a wrapper that forwards to it and overrides a write method still sees every record.
"""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import pytest

from polyloop.errors import RunLeaseLostError
from polyloop.session import run
from polyloop.stores import JsonlRunLease, JsonlRunStore, VolatileRunLease, VolatileRunStore
from polyloop.stores import _volatile as volatile_module
from polyloop.types import StopReason

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from test_jsonl_write_pair import (
    ACTION_INTENT,
    MODEL_INTENT,
    NEXT_INTENT,
    NOT_A_PAIR,
    RESULT,
    RUN,
    STARTED,
    STEP,
    _counting,
    records,
)
from tools.bench._common import Workload

pytestmark = pytest.mark.unit


async def _started(store: VolatileRunStore | JsonlRunStore) -> JsonlRunLease | VolatileRunLease:
    lease = await store.acquire_lease(RUN)
    await lease.write_run_started(STARTED)
    await lease.write_intent(MODEL_INTENT)
    return lease


def test_the_store_itself_has_no_write_pair() -> None:
    """A wrapper forwarding to the store (and hiding its leases) must keep seeing each write."""
    assert not hasattr(VolatileRunStore(), "write_pair")


@pytest.mark.parametrize("second", [ACTION_INTENT, STEP], ids=["intent", "step"])
async def test_a_pair_reads_back_as_the_two_writes_in_order_and_is_kept_unencoded(
    second: object,
) -> None:
    apart, paired = VolatileRunStore(), VolatileRunStore()
    lease = await _started(apart)
    await lease.write_model_call_result(RESULT)
    await getattr(lease, "write_intent" if second is ACTION_INTENT else "write_step_completed")(
        second
    )
    await (await _started(paired)).write_pair(RESULT, second)  # type: ignore[arg-type]
    assert paired._lines[RUN][-2:] == [RESULT, second]  # kept as the objects, encoded at a read
    assert await paired.read_log(RUN) == await apart.read_log(RUN)
    assert paired._lines[RUN] == apart._lines[RUN]  # the same lines once read


@pytest.mark.parametrize(("first", "second", "error", "words"), NOT_A_PAIR)
async def test_a_pair_that_is_not_two_records_of_one_run_is_refused_and_stores_nothing(
    first: object, second: object, error: type[Exception], words: str
) -> None:
    store = VolatileRunStore()
    lease = await _started(store)
    before = await store.read_log(RUN)
    with pytest.raises(error, match=r"^VolatileRunLease\.write_pair: ") as caught:
        await lease.write_pair(first, second)  # type: ignore[arg-type]
    assert words in str(caught.value)
    assert await store.read_log(RUN) == before


@pytest.mark.parametrize("which", ["first", "second"])
async def test_a_record_the_encoder_refuses_stores_neither_as_on_the_jsonl_store(
    tmp_path: Path, which: str
) -> None:
    """A value JSON cannot hold (NaN, forced into a record around its ``__init__``) in either
    record of the pair: both stores' leases raise the encoder's error and store neither."""
    forced = records.action_intent(run_id=RUN, call_index=0, result_id="a0")
    object.__setattr__(forced, "call_index", math.nan)
    first, second = (forced, ACTION_INTENT) if which == "first" else (RESULT, forced)
    logs = []
    for store in (JsonlRunStore(directory=tmp_path), VolatileRunStore()):
        lease = await _started(store)
        with pytest.raises(ValueError, match="Out of range float values"):
            await lease.write_pair(first, second)  # type: ignore[arg-type]
        log = await store.read_log(RUN)
        assert (log.intents, log.model_results) == ((MODEL_INTENT,), ())
        logs.append(log)
    assert logs[0] == logs[1]


async def test_a_pair_through_a_lease_is_fenced_once_and_refused_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = VolatileRunStore()
    lease = await store.acquire_lease(RUN)
    await lease.write_run_started(STARTED)
    await lease.write_intent(MODEL_INTENT)
    fences = _counting(monkeypatch, VolatileRunStore, "_fence")
    await lease.write_pair(RESULT, ACTION_INTENT)
    assert len(fences) == 1
    assert (await store.read_log(RUN)).intents == (MODEL_INTENT, ACTION_INTENT)

    before = await store.read_log(RUN)
    await lease.release()
    with pytest.raises(RunLeaseLostError, match="released"):
        await lease.write_pair(RESULT, NEXT_INTENT)
    successor = await store.acquire_lease(RUN)
    with pytest.raises(RunLeaseLostError, match="released"):
        await lease.write_pair(RESULT, NEXT_INTENT)
    await successor.write_pair(RESULT, NEXT_INTENT)  # the current lease writes both
    log = await store.read_log(RUN)
    assert log.intents == (*before.intents, NEXT_INTENT)
    assert log.model_results == (*before.model_results, RESULT)


def test_a_run_writes_each_model_result_with_the_steps_next_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session finds ``write_pair`` on the volatile lease (``_step._StepWrites``): a step
    is the model intent, one pair (result and action intent) and the step record."""
    pairs = _counting(monkeypatch, volatile_module.VolatileRunLease, "write_pair")
    singles = _counting(monkeypatch, volatile_module.VolatileRunLease, "_write")
    workload = Workload.build()
    store = VolatileRunStore()

    async def one_run() -> None:
        result = await run(workload.definition(store), workload.request("paired", 10))
        assert result.stop_reason is StopReason.STEP_BUDGET

    asyncio.run(one_run())
    assert len(pairs) == 10
    assert len(singles) == 1 + 2 * 10 + 1  # the start, two a step, the finish
