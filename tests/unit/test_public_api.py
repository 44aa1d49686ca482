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
