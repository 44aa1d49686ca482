"""The shape of ``polyloop.testing`` and of its pytest plugin entry point.

Whether the suite really works for a downstream (collected, green for a correct store,
readable when red) is shown end to end by ``tests/integration/test_downstream_rehearsal.py``;
these are the cheap structural guards behind it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import polyloop.testing
from polyloop.testing import _plugin, _scripted

pytestmark = pytest.mark.unit

BASES = (
    "ActionExecutorContract",
    "DecisionParserContract",
    "EventSinkContract",
    "ModelClientContract",
    "NativeToolCallModelClientContract",
    "NativeToolCallParserContract",
    "RunLeaseContract",
    "RunStoreContract",
)


def test_the_public_names_are_the_bases_the_factory_and_the_scripted_model() -> None:
    # ScriptedModelClient joined in issue 20 (a test double for users); nothing else may.
    assert sorted(polyloop.testing.__all__) == sorted(
        [*BASES, "RecordFactory", "ScriptedModelClient"]
    )
    assert "ContractBase" not in polyloop.testing.__all__


@pytest.mark.parametrize("name", BASES)
def test_a_base_is_not_collected_on_its_own_but_a_test_subclass_is(name: str) -> None:
    # pytest collects classes named Test*; a base must not be one, and must not switch
    # collection off in a way its subclasses would inherit.
    base = getattr(polyloop.testing, name)
    assert not name.startswith("Test")
    assert not hasattr(base, "__test__")
    assert not hasattr(type(f"Test{name}", (base,), {}), "__test__")


def test_the_pytest11_entry_point_names_the_plugin_module() -> None:
    entry_points = importlib.metadata.entry_points(group="pytest11")
    ours = [ep for ep in entry_points if ep.value.startswith("polyloop")]
    assert [(ep.name, ep.value) for ep in ours] == [("polyloop", "polyloop.testing._plugin")]


def _non_stdlib_imports(module: ModuleType) -> set[str]:
    """The top-level names of what ``module``'s source imports, standard library left out."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    return {name for name in imported if name not in sys.stdlib_module_names}


def test_the_plugin_module_imports_at_most_pytest_and_the_standard_library() -> None:
    assert _non_stdlib_imports(_plugin) <= {"pytest"}


def test_the_scripted_model_imports_only_the_standard_library_and_polyloop() -> None:
    # Usable outside a pytest run (a soak or bench tool); pytest comes only with the package.
    assert _non_stdlib_imports(_scripted) == {"polyloop"}


def test_loading_the_plugin_pulls_in_no_store_adapter_or_http_client() -> None:
    # pytest imports the plugin in every test run of every project that has polyloop
    # installed; it must not drag the optional parts in with it.
    code = (
        "import sys, polyloop.testing._plugin; "
        "print(sorted(m for m in ('httpx', 'polyloop.adapters', 'polyloop.stores') "
        "if m in sys.modules))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "[]"


def test_the_doubles_import_without_pytest_and_the_bases_still_load_on_access() -> None:
    # A script or bench tool that only wants the scripted model must not pay pytest's import
    # (design 0226); the contract bases still come from the same public address.
    code = (
        "import pickle, sys, polyloop.testing\n"
        "from polyloop.testing import RecordFactory, ScriptedModelClient\n"
        "print('pytest' in sys.modules, ScriptedModelClient.__module__)\n"
        "from polyloop.testing import RunStoreContract\n"
        "print('pytest' in sys.modules, RunStoreContract.__module__, "
        "pickle.loads(pickle.dumps(RunStoreContract)) is RunStoreContract, "
        "sorted(polyloop.testing.__all__) == sorted(n for n in polyloop.testing.__all__ "
        "if hasattr(polyloop.testing, n)))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert completed.stdout.splitlines() == [
        "False polyloop.testing",
        "True polyloop.testing True True",
    ]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchContract"):
        polyloop.testing.NoSuchContract  # noqa: B018
