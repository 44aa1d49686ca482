"""``polyloop.ray`` without a cluster: argument checks and the refusal to start one itself."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from _infra import skip_unless_available
from polyloop.errors import EngineNotConnectedError, PolyloopTypeError, PolyloopValueError

pytestmark = pytest.mark.unit


@pytest.fixture
def ray_module() -> Any:
    skip_unless_available(
        importlib.util.find_spec("ray") is not None,
        what="Ray (the ray extra)",
        how_to_install="pip install -e '.[ray]' (make install)",
    )
    import polyloop.ray

    return polyloop.ray


async def _first(iterator: Any) -> Any:
    return await anext(iterator)


def test_without_ray_init_it_refuses_and_starts_nothing(ray_module: Any) -> None:
    import ray

    assert not ray.is_initialized()
    with pytest.raises(
        EngineNotConnectedError, match=r"ray\.init\(address=\.\.\., _node_ip_address=\.\.\.\)"
    ):
        asyncio.run(_first(ray_module.run_on_ray(lambda task: None, ["t"])))
    assert not ray.is_initialized(), "run_on_ray must never start a local cluster"


@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda m: m.RayActors(actors=0), PolyloopValueError, "RayActors.actors must be >= 1"),
        (lambda m: m.RayActors(runs_per_actor=1.5), PolyloopTypeError, "runs_per_actor"),
        (lambda m: m.RayActors(num_cpus=-1), PolyloopValueError, "RayActors.num_cpus"),
        (lambda m: m.RayActors(max_restarts=-1), PolyloopValueError, "max_restarts"),
        (lambda m: m.RayTasks(num_cpus=float("nan")), PolyloopValueError, "RayTasks.num_cpus"),
        (lambda m: m.RayTasks(max_retries=True), PolyloopTypeError, "RayTasks.max_retries"),
        (lambda m: m.RayActors(spread="yes"), PolyloopTypeError, "RayActors.spread"),
        (lambda m: m.RayTasks(spread=1), PolyloopTypeError, "RayTasks.spread"),
    ],
)
def test_placement_settings_are_checked_when_built(
    ray_module: Any, build: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        build(ray_module)


def test_defaults_are_actors(ray_module: Any) -> None:
    actors = ray_module.RayActors()
    assert actors.actors >= 1
    assert actors.runs_per_actor > 1, "the point of an async actor is many runs at once"
    assert actors.max_restarts > 0
    assert actors.max_task_retries > 0, "a dead actor's runs must be sent again"
    assert ray_module.RayTasks().max_retries > 0


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        (
            {"capacity_wait_seconds": 0},
            PolyloopValueError,
            "capacity_wait_seconds=...\\) must be > 0",
        ),
        ({"capacity_wait_seconds": -1.0}, PolyloopValueError, "capacity_wait_seconds"),
        ({"capacity_wait_seconds": float("inf")}, PolyloopValueError, "capacity_wait_seconds"),
        ({"capacity_wait_seconds": "60"}, PolyloopTypeError, "capacity_wait_seconds"),
        ({"max_in_flight": 0}, PolyloopValueError, "max_in_flight"),
    ],
)
def test_run_options_are_checked_before_anything_else(
    ray_module: Any, options: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        asyncio.run(_first(ray_module.run_on_ray(lambda task: None, ["t"], **options)))


def test_a_shortage_counts_only_while_there_is_work_and_no_room(ray_module: Any) -> None:
    shortage = ray_module._Shortage(wait=10.0)
    assert not shortage.note(0.0, room=False, busy=True)
    assert not shortage.note(9.0, room=False, busy=True)
    assert shortage.note(10.5, room=False, busy=True), "no room for longer than the bound"
    assert not shortage.note(11.0, room=True, busy=True), "room again: the count starts over"
    assert not shortage.note(12.0, room=False, busy=True)
    assert not shortage.note(30.0, room=False, busy=False), "nothing to do: no shortage"
    assert not shortage.note(31.0, room=False, busy=True)


def test_an_actor_takes_new_runs_only_while_it_answers(ray_module: Any) -> None:
    import concurrent.futures

    slot = ray_module._Slot(actor=None, incarnation=0, created=0.0)
    assert not slot.live(1.0, 5.0), "never answered: maybe not placed yet"
    slot.answered = 1.0
    assert slot.live(1.0, 5.0)
    loop = asyncio.new_event_loop()
    try:
        slot.ping = asyncio.wrap_future(concurrent.futures.Future(), loop=loop)
        slot.ping_sent = 2.0
        assert slot.live(6.0, 5.0)
        assert not slot.live(7.5, 5.0), "its ping outstanding too long"
        assert slot.unanswered_for(7.5) == 5.5
        slot.ping.cancel()
    finally:
        loop.close()
    slot.ping = None
    slot.suspect = True
    assert not slot.live(8.0, 5.0), "a call of it failed with an actor error"
