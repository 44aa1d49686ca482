"""The dependency rules that import-linter cannot express (rules 6, 9 and half of 10).

The others are contracts in pyproject.toml; ``test_import_linter_contracts_are_kept`` runs them
too, so a broken contract also fails the test suite, not only ``make check``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "polyloop"

ALLOWED_MODULES = {
    "__init__.py",
    "py.typed",
    "errors.py",
    "types.py",
    "ports.py",
    "tools.py",
    "_assembly.py",
    "_stopping.py",
    "_recovery.py",
    "serialization.py",
    "session.py",
    "stores",
    "adapters",
    "testing",
}


def _imported_top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", ["types.py", "ports.py"])
def test_rule_6_types_and_ports_import_only_the_standard_library(module: str) -> None:
    imported = _imported_top_level_names(SRC / module)
    third_party = {
        name for name in imported if name not in sys.stdlib_module_names and name != "polyloop"
    }
    assert third_party == set(), f"{module} imports third-party packages: {sorted(third_party)}"


def test_rule_6_types_imports_nothing_from_polyloop() -> None:
    assert "polyloop" not in _imported_top_level_names(SRC / "types.py")


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(completed.stdout.split())


def test_rule_9_import_polyloop_does_not_import_the_http_client() -> None:
    modules = _modules_after("import polyloop")
    assert "polyloop.session" in modules, "the probe must really import the core"
    assert not {m for m in modules if m == "httpx" or m.startswith("httpx.")}


def test_rule_10_import_polyloop_does_not_import_pytest() -> None:
    modules = _modules_after("import polyloop")
    assert not {m for m in modules if m.split(".")[0] in {"pytest", "_pytest", "pytest_asyncio"}}


def test_optional_parts_are_not_imported_by_the_core() -> None:
    modules = _modules_after("import polyloop")
    assert not {"polyloop.stores", "polyloop.adapters", "polyloop.testing"} & modules


def test_only_the_modules_of_the_layer_table_exist() -> None:
    present = {p.name for p in SRC.iterdir() if p.name != "__pycache__"}
    assert present <= ALLOWED_MODULES, f"unexpected modules: {sorted(present - ALLOWED_MODULES)}"


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.exists():
        pytest.skip(
            "the layering contracts are promised by pyproject.toml; this environment lacks "
            "lint-imports (install the dev extra), `make imports` checks them"
        )
    completed = subprocess.run(
        [str(lint_imports), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=SRC.parents[1],
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 broken" in completed.stdout
