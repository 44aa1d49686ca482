"""What one step of the run loop costs, counted rather than timed (issue 24 item 5, design 0214).

Wall and CPU time on a shared machine move by tens of percent between sittings, so a timed test
would either be flaky or assert nothing. These counts are exact on every machine: the
``per_step`` benchmark's workload (``tools.bench._common``) runs 20 and then 60 steps, and the
difference over 40 steps is the steady-state cost of one step, with the run's fixed costs
(snapshot, start, finish) cancelled out.

=========================================  ======  ============================================
count per step                              bound   what a breach means
=========================================  ======  ============================================
lines encoded, and steps turned into JSON   4, 1    a record is encoded twice (two intents, the
                                                    model result and the step: one line each),
                                                    or the finish encodes the steps again
timers armed on the loop                    0       a bounded wait (the event sink's default
                                                    30 s) arms a timer for a call that returned
                                                    without suspending (design 0214, 2nd pass)
JSONL syncs; hand-offs to a writer thread   2; 2    a barrier was added, or a write left the
                                                    loop's thread although its sync alone needs
                                                    to (design 0214, 4th pass; design 0219: the
                                                    two syncs are the hand-offs)
JSONL file writes; ``call_soon_threadsafe``  3, 0    the model result no longer goes with the
                                                    step's next record (``write_pair``), or a
                                                    writer thread wakes the loop through its
                                                    self-pipe and a ``Handle`` instead of the
                                                    store's own pipe (design 0214, 3rd pass)
objects a waiting run keeps beyond its      50      a run keeps something for its whole call
steps, volatile                                     again (a finished task, its snapshot, a
                                                    generator-based context, a per-run table
                                                    of bound methods: 64 before design 0214's
                                                    fourth pass); each such object is traced
                                                    by every full pass of the collector
polyloop's own Python calls, volatile       215     the loop does more work per step (199 when
                                                    the bound was set, in the second pass of
                                                    design 0214; 231 before it; raise it
                                                    deliberately, with ``tools.bench.per_step``
                                                    figures)
=========================================  ======  ============================================
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import polyloop
from polyloop import serialization
from polyloop.errors import UnleasedStoreWarning
from polyloop.ports import ModelCall
from polyloop.session import run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.stores import _jsonl as jsonl_module
from polyloop.stores import _records as records_module
from polyloop.types import ModelReply, StopReason

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.bench._common import NoopModel, Workload  # noqa: E402

from _syncs import SyncRecorder  # noqa: E402

pytestmark = pytest.mark.unit

SHORT, LONG = 20, 60
POLYLOOP_CALLS_PER_STEP = 215
OBJECTS_A_WAITING_RUN_KEEPS = 50
_PACKAGE = str(Path(polyloop.__file__).resolve().parent)


async def _one_run(store: JsonlRunStore | VolatileRunStore, steps: int) -> None:
    workload = Workload.build()
    result = await run(workload.definition(store), workload.request(f"cost-{steps}", steps))
    assert result.stop_reason is StopReason.STEP_BUDGET
    assert len(result.steps) == steps


def _per_step(count: Callable[[int], int]) -> float:
    return (count(LONG) - count(SHORT)) / (LONG - SHORT)


def _counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """Wrap ``owner.name`` so that every call is counted in the returned one-item list."""
    calls = [0]
    real = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_each_record_of_a_step_is_encoded_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Four lines a step, and each step's record turned into JSON once: the finish record,
    which repeats every step, reuses their text (``StepLines``, design 0214)."""
    lines = _counting(monkeypatch, records_module, "_line")
    steps_encoded = _counting(monkeypatch, serialization, "_step_record_fields")
    runs = iter(range(1000))

    def counter(calls: list[int]) -> Callable[[int], int]:
        def count(steps: int) -> int:
            calls[0] = 0
            asyncio.run(_one_run(JsonlRunStore(directory=tmp_path / str(next(runs))), steps))
            return calls[0]

        return count

    assert _per_step(counter(lines)) == 4
    assert _per_step(counter(steps_encoded)) == 1


def test_the_volatile_store_encodes_a_run_at_its_first_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Design 0214, third pass: a run on ``VolatileRunStore`` encodes nothing but its start
    while it runs; its first ``read_log`` encodes every other record once, and the next
    read none (it decodes the kept lines afresh)."""
    lines = _counting(monkeypatch, records_module, "_line")
    store = VolatileRunStore()
    asyncio.run(_one_run(store, 20))
    assert lines[0] == 1  # the RunStarted
    first = asyncio.run(store.read_log("cost-20"))
    assert lines[0] == 1 + 20 * 4 + 1  # four records a step, then the finish
    second = asyncio.run(store.read_log("cost-20"))
    assert lines[0] == 1 + 20 * 4 + 1
    assert second == first
    assert second.finished is not first.finished


def test_a_step_whose_seams_answer_at_once_arms_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's model, executor and sink return without suspending, so no bound needs
    a timer (the event sink's is 30 s by default): none is armed."""
    calls = _counting(monkeypatch, asyncio.BaseEventLoop, "call_at")

    def count(steps: int) -> int:
        calls[0] = 0
        asyncio.run(_one_run(VolatileRunStore(), steps))
        return calls[0]

    assert _per_step(count) == 0


def test_a_jsonl_step_syncs_twice_and_hands_nothing_else_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two intents (barriers) are synced in a writer thread; every step's bytes are
    written on the loop's thread (design 0214, fourth pass; design 0219)."""
    recorder = SyncRecorder(monkeypatch)
    calls = _counting(monkeypatch, jsonl_module._WRITERS, "submit")
    # A directory per run (not per ``id(counted)``: a freed lambda's id can come back).
    runs = iter(range(1000))

    def count(counted: Callable[[], int]) -> Callable[[int], int]:
        def per_run(steps: int) -> int:
            recorder.kinds()
            calls[0] = 0
            directory = tmp_path / f"{steps}-{next(runs)}"
            asyncio.run(_one_run(JsonlRunStore(directory=directory), steps))
            return counted()

        return per_run

    assert _per_step(count(lambda: len(recorder.kinds()))) == 2
    assert _per_step(count(lambda: calls[0])) == 2


def test_a_jsonl_step_is_three_file_writes_and_wakes_the_loop_through_its_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model intent, the model result with the action intent (one ``write_pair``), and
    the step; the writer thread's answers reach the loop without ``call_soon_threadsafe``."""
    writes = _counting(monkeypatch, jsonl_module, "_write_all_bytes")
    wakes = _counting(monkeypatch, asyncio.BaseEventLoop, "call_soon_threadsafe")

    def count(calls: list[int]) -> Callable[[int], int]:
        def counted(steps: int) -> int:
            calls[0] = 0
            asyncio.run(_one_run(JsonlRunStore(directory=tmp_path / f"{steps}-{id(calls)}"), steps))
            return calls[0]

        return counted

    assert _per_step(count(writes)) == 3
    assert _per_step(count(wakes)) == 0


def test_a_volatile_step_stays_within_its_call_budget() -> None:
    def count(steps: int) -> int:
        calls = 0

        def profile(frame: object, event: str, _arg: object) -> None:
            nonlocal calls
            code = getattr(frame, "f_code", None)
            if event == "call" and code is not None and code.co_filename.startswith(_PACKAGE):
                calls += 1

        async def measured() -> None:
            sys.setprofile(profile)
            try:
                await _one_run(VolatileRunStore(), steps)
            finally:
                sys.setprofile(None)

        asyncio.run(measured())
        return calls

    per_step = _per_step(count)
    assert per_step <= POLYLOOP_CALLS_PER_STEP, (
        f"a volatile step now makes {per_step:.1f} calls into polyloop's own functions, more "
        f"than the {POLYLOOP_CALLS_PER_STEP} allowed (issue 24 item 5): find the new per-step "
        "work, or raise the bound deliberately with before/after tools.bench.per_step figures"
    )


class _ParkingModel(NoopModel):
    """The benchmark's model, whose call of step ``park_at`` waits for ``gate``."""

    def __init__(self, park_at: int, runs: int, gate: asyncio.Event) -> None:
        super().__init__()
        self.park_at, self.runs, self.gate, self.parked = park_at, runs, gate, 0
        self.all_parked = asyncio.Event()

    async def call(self, call: ModelCall) -> ModelReply:
        if call.call_index == self.park_at:
            self.parked += 1
            if self.parked == self.runs:
                self.all_parked.set()
            await self.gate.wait()
        return await super().call(call)


def _objects_a_waiting_run_keeps(park_at: int, runs: int = 40) -> float:
    """The objects the collector tracks, per run, while ``runs`` runs wait in the model call
    of step ``park_at`` (their requests and definitions included)."""

    async def fleet() -> float:
        workload = Workload.build()
        store = VolatileRunStore()
        await run(workload.definition(store), workload.request("warm", 3))  # caches, imports
        gate = asyncio.Event()
        model = _ParkingModel(park_at, runs, gate)
        gc.collect()
        before = len(gc.get_objects())
        waiting = [
            asyncio.ensure_future(
                run(workload.definition(store, model), workload.request(f"wait-{i}", 10))
            )
            for i in range(runs)
        ]
        await model.all_parked.wait()
        gc.collect()
        during = len(gc.get_objects())
        gate.set()
        results = await asyncio.gather(*waiting)
        assert {r.stop_reason for r in results} == {StopReason.STEP_BUDGET}
        return (during - before) / runs

    return asyncio.run(fleet())


def test_a_waiting_run_keeps_few_objects_beyond_its_steps() -> None:
    """Design 0214, fourth pass: in a fleet every object a run keeps alive is traced by the
    collector's full passes, so a run keeps nothing for its whole call that it no longer
    needs. Counted per run at two steps and the steady growth of its steps taken out (what
    the run's history and the store keep per step, which this test does not bound)."""
    early, late = _objects_a_waiting_run_keeps(2), _objects_a_waiting_run_keeps(6)
    per_step = (late - early) / 4
    beyond_steps = early - 2 * per_step
    assert beyond_steps <= OBJECTS_A_WAITING_RUN_KEEPS, (
        f"a run waiting in its model call keeps {beyond_steps:.1f} objects beyond its steps "
        f"({per_step:.1f} a step), more than the {OBJECTS_A_WAITING_RUN_KEEPS} allowed: find "
        "what the run keeps for its whole call, or raise the bound deliberately with "
        "tools.bench.postgres_store --gc-stats figures"
    )


class _LoggingWrapper:
    """A user's wrapper: it records every model result it is given and forwards everything
    else it does not define to the store (``__getattr__``), leases hidden."""

    def __init__(self, inner: JsonlRunStore) -> None:
        self._inner = inner
        self.results: list[object] = []

    def __getattr__(self, name: str) -> object:
        if name in ("acquire_lease", "write_fenced", "end_lease"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    async def write_model_call_result(self, record: object) -> None:
        self.results.append(record)
        await self._inner.write_model_call_result(record)  # type: ignore[arg-type]


def test_a_wrapper_that_forwards_to_a_pairing_store_still_sees_every_model_result(
    tmp_path: Path,
) -> None:
    """``write_pair`` counts only where the writer's class declares it: a wrapper that
    forwards what it does not define is not paired past its own ``write_model_call_result``
    (the store's own ``write_pair`` would skip it)."""
    wrapper = _LoggingWrapper(JsonlRunStore(directory=tmp_path))
    workload = Workload.build()
    with pytest.warns(UnleasedStoreWarning):
        result = asyncio.run(run(workload.definition(wrapper), workload.request("wrapped", 3)))  # type: ignore[arg-type]
    assert len(result.steps) == 3
    assert len(wrapper.results) == 3
