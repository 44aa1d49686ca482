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
