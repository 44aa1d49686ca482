"""The public API only grows: every public module keeps every name it exported before.

``tests/fixtures/public-api/before-issue-20.json`` is each public module's ``__all__`` as it
was before the session package was split into rooms (issue 20); it is frozen. New names may
appear; a name that disappears, or stops resolving, breaks downstream code.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_FROZEN = Path(__file__).resolve().parents[1] / "fixtures" / "public-api" / "before-issue-20.json"
_BEFORE: dict[str, list[str]] = json.loads(_FROZEN.read_text(encoding="utf-8"))
_DIR = _FROZEN.with_name("dir-before-issue-20.json")
_DIR_BEFORE: dict[str, list[str]] = json.loads(_DIR.read_text(encoding="utf-8"))
"""Per public module, the non-underscore names of ``dir()`` before issue 20 whose objects come
from polyloop (modules and the standard library's helpers left out)."""


@pytest.mark.parametrize("module_name", sorted(_BEFORE))
def test_every_public_name_of_before_is_still_exported_and_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = set(module.__all__)
    missing = sorted(set(_BEFORE[module_name]) - exported)
    assert missing == [], f"{module_name} no longer exports {missing}"
    unresolved = sorted(name for name in exported if not hasattr(module, name))
    assert unresolved == [], f"{module_name}.__all__ names what it does not define: {unresolved}"


def test_the_session_classes_say_they_live_in_polyloop_session() -> None:
    """Where a class sits inside the package is not API: docs, reprs and pickles say
    ``polyloop.session.<name>``, and that path keeps resolving to the class."""
    import polyloop.session as session

    for name in ("AgentDefinition", "RunRequest"):
        cls = getattr(session, name)
        assert cls.__module__ == "polyloop.session", name
        assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls


def test_the_session_package_keeps_its_import_paths() -> None:
    from polyloop.session import (  # noqa: F401 - the import is the assertion
        AgentDefinition,
        RunRequest,
        check_log,
        continue_cancelled,
        plan_resume,
        resume,
        run,
        run_or_resume,
    )

    assert callable(run_or_resume)


@pytest.mark.parametrize("module_name", sorted(_DIR_BEFORE))
def test_every_name_dir_showed_before_still_resolves_to_the_same_object(module_name: str) -> None:
    """``from polyloop.session import StopReason`` worked in 0.1.0 (the old module's own
    import); it keeps working, and gives the same object as its home module."""
    module = importlib.import_module(module_name)
    lost = [
        name
        for name in _DIR_BEFORE[module_name]
        if not hasattr(module, name) and not _was_private(module_name, name)
    ]
    assert lost == [], f"{module_name} lost {lost}"


def _was_private(module_name: str, name: str) -> bool:
    """Names the old session imported from private modules (``_common``, ``_stopping``) were
    never API; they came along with its imports and are not kept."""
    return module_name == "polyloop.session" and name in {
        "Counters",
        "StepFacts",
        "describe_exception",
        "frozen",
        "frozen_str_mapping",
        "is_async_callable",
        "is_plain_function",
        "require_nonempty_str",
    }


def test_the_progress_names_are_public() -> None:
    """Added deliberately for the progress of running tool calls (design 0211, amendment)."""
    import polyloop.ports as ports

    assert {"ProgressSink", "ToolProgress"} <= set(ports.__all__)
    assert "report_progress" in dir(ports.ToolContext)
    assert {"tool_name", "progress_reporter"} <= set(ports.ToolContext.__dataclass_fields__)
    import polyloop.testing as testing

    assert callable(testing.RecordFactory().progress)


# --------------------------------------------------------------------------- public homes (0221)


def _public_module_names() -> list[str]:
    import pkgutil

    import polyloop

    names = ["polyloop"]
    names += [info.name for info in pkgutil.walk_packages(polyloop.__path__, prefix="polyloop.")]
    return [name for name in names if not any(part.startswith("_") for part in name.split("."))]


def _public_definitions() -> list[tuple[str, str, object]]:
    import inspect

    found = []
    for module_name in _public_module_names():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                found.append((module_name, name, value))
    return found


def test_the_walk_finds_the_public_modules_and_their_definitions() -> None:
    # Guards the next tests against passing on an empty walk.
    modules = set(_public_module_names())
    assert {"polyloop", "polyloop.stores", "polyloop.session", "polyloop.testing"} <= modules
    assert not any(name.startswith("polyloop._") for name in modules)
    assert len(_public_definitions()) > 100


def test_no_public_class_or_function_names_a_private_module() -> None:
    """``JsonlRunStore.__module__`` was ``polyloop.stores._jsonl`` and ``ResumePlan``'s
    ``polyloop._recovery``: a room of the package, not a place to import from (design 0221)."""
    private = sorted(
        f"{module}.{name} says {value.__module__}"  # type: ignore[attr-defined]
        for module, name, value in _public_definitions()
        if any(part.startswith("_") for part in value.__module__.split("."))  # type: ignore[attr-defined]
    )
    assert private == []


def test_every_public_class_and_function_is_found_where_it_says_it_lives() -> None:
    """Pickle (and Ray's cloudpickle, which sends definitions and results to workers) finds a
    class or function as ``getattr(import_module(obj.__module__), obj.__qualname__)``."""
    import pickle

    lost = []
    for module, name, value in _public_definitions():
        home = importlib.import_module(value.__module__)  # type: ignore[attr-defined]
        if getattr(home, value.__qualname__, None) is not value:  # type: ignore[attr-defined]
            lost.append(f"{module}.{name}")
        elif pickle.loads(pickle.dumps(value)) is not value:
            lost.append(f"{module}.{name} (pickle)")
    assert lost == []


def test_the_type_hints_of_every_public_class_still_resolve() -> None:
    """Moving a class's ``__module__`` to its package must not break ``typing.get_type_hints``
    (pydantic, cattrs and documentation tools read hints through it): it evaluates string
    annotations in ``sys.modules[cls.__module__]``, where the room's own imports are absent.
    ``RunRequest`` and ``AgentResult`` failed so before design 0221."""
    import inspect
    import typing

    broken = []
    for module, name, value in _public_definitions():
        if inspect.isclass(value):
            try:
                typing.get_type_hints(value)
            except NameError as exc:
                broken.append(f"{module}.{name}: {exc}")
    assert broken == []


def test_a_public_name_exported_twice_keeps_the_home_of_the_package_that_defines_it() -> None:
    import polyloop
    import polyloop.agent
    import polyloop.session
    import polyloop.stores

    assert polyloop.stores.JsonlRunStore.__module__ == "polyloop.stores"
    assert polyloop.session.ResumePlan.__module__ == "polyloop.session"
    assert polyloop.tool is polyloop.agent.tool
    assert polyloop.tool.__module__ == "polyloop.agent"
    assert polyloop.Agent.__module__ == "polyloop.agent"


def test_claiming_public_names_moves_only_private_top_level_definitions() -> None:
    import sys
    import types
    import typing

    from polyloop._common import claim_public_names

    room = types.ModuleType("pkg_0221._room")
    exec(  # a module of our own text, to test the helper on it
        "from __future__ import annotations\n"
        "from collections.abc import Mapping\n"
        "class Public:\n"
        "    field: Mapping[str, int]\n"
        "class Aliased: pass\n"
        "def helper() -> None: pass\n",
        room.__dict__,
    )
    sys.modules[room.__name__] = room
    try:
        namespace = {
            "__all__": ["Public", "Other", "helper", "Builtin", "CONSTANT"],
            "Public": room.Public,
            "Other": room.Aliased,  # exported under another name: its pickle path would break
            "helper": room.helper,
            "Builtin": ValueError,
            "CONSTANT": "text",
        }
        claim_public_names("pkg_0221", namespace)
    finally:
        del sys.modules[room.__name__]
    assert room.Public.__module__ == "pkg_0221"
    assert room.helper.__module__ == "pkg_0221"
    assert room.Aliased.__module__ == "pkg_0221._room"
    assert ValueError.__module__ == "builtins"
    from collections.abc import Mapping

    assert typing.get_type_hints(room.Public) == {"field": Mapping[str, int]}
