"""The dependency rules that import-linter cannot express (rules 6, 9 and half of 10).

The others are contracts in pyproject.toml; ``test_import_linter_contracts_are_kept`` runs them
too, so a broken contract also fails the test suite, not only ``make check``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "polyloop"

ALLOWED_MODULES = {
    "__init__.py",
    "__main__.py",
    "py.typed",
    "errors.py",
    "_common.py",
    "types.py",
    "ports.py",
    "tools.py",
    "sinks.py",
    "parsers.py",
    "_assembly.py",
    "_stopping.py",
    "_recovery.py",
    "serialization.py",
    "session",
    "stores",
    "adapters",
    "testing",
    "inspect",
    "otel",
    "ray.py",
    "agent",
    "batch",
    "mcp",
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


@pytest.mark.parametrize("module", ["errors.py", "_common.py", "types.py", "ports.py"])
def test_rule_6_types_and_ports_import_only_the_standard_library(module: str) -> None:
    imported = _imported_top_level_names(SRC / module)
    third_party = {
        name for name in imported if name not in sys.stdlib_module_names and name != "polyloop"
    }
    assert third_party == set(), f"{module} imports third-party packages: {sorted(third_party)}"


def _imported_polyloop_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.name for a in node.names if a.name.split(".")[0] == "polyloop")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == "polyloop"
        ):
            modules.add(node.module)
    return modules


def test_rule_4_types_imports_only_the_exception_root_and_the_shared_helpers() -> None:
    assert _imported_polyloop_modules(SRC / "types.py") <= {"polyloop.errors", "polyloop._common"}
    assert _imported_polyloop_modules(SRC / "_common.py") <= {"polyloop.errors"}
    assert _imported_polyloop_modules(SRC / "errors.py") == set()


def _package_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _private_name_imports(source_text: str) -> list[str]:
    """``module.name`` for every ``from polyloop.<module> import _name`` whose ``_name`` is not
    itself a module (importing a private *module*, as session does with ``_assembly``, is how
    the logic layer is woven)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source_text)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        if node.module.split(".")[0] != "polyloop":
            continue
        source = importlib.import_module(node.module)
        for alias in node.names:
            if alias.name.startswith("_") and not isinstance(
                getattr(source, alias.name, None), types.ModuleType
            ):
                found.append(f"{node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """Shared helpers live in ``polyloop._common`` under public names (design 0110)."""
    offenders = {
        _module_name(path): names
        for path in _package_files()
        if (names := _private_name_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_private_name_check_tells_names_from_modules() -> None:
    code = "from polyloop import _assembly\nfrom polyloop.types import Role, _private_thing\n"
    assert _private_name_imports(code) == ["polyloop.types._private_thing"]


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


def test_rule_12_import_polyloop_does_not_import_ray() -> None:
    modules = _modules_after("import polyloop; import polyloop.stores; import polyloop.session")
    assert "polyloop.stores" in modules, "the probe must really import the core"
    assert not {m for m in modules if m == "ray" or m.startswith("ray.")}


def test_rule_10_import_polyloop_does_not_import_pytest() -> None:
    modules = _modules_after("import polyloop")
    assert not {m for m in modules if m.split(".")[0] in {"pytest", "_pytest", "pytest_asyncio"}}


def test_optional_parts_are_not_imported_by_the_core() -> None:
    modules = _modules_after("import polyloop")
    assert (
        not {
            "polyloop.stores",
            "polyloop.adapters",
            "polyloop.testing",
            "polyloop.inspect",
            "polyloop.__main__",
            "polyloop.otel",
            "polyloop.mcp",
        }
        & modules
    )


def test_rule_17_import_polyloop_does_not_import_the_mcp_sdk() -> None:
    modules = _modules_after("import polyloop; import polyloop.tools; import polyloop.session")
    assert "polyloop.session" in modules, "the probe must really import the core"
    assert not {m for m in modules if m.split(".")[0] in {"mcp", "mcp_types", "httpx2"}}


def test_the_short_path_loads_no_extra_and_no_pydantic() -> None:
    """``from polyloop import Agent, tool`` is part of the core (design 0208): no httpx (the
    gateway is loaded when a model string needs it), no store, and no pydantic (duck-typed)."""
    modules = _modules_after("from polyloop import Agent, tool")
    assert "polyloop.agent" in modules, "the probe must really import the short path"
    loaded = {m.split(".")[0] for m in modules}
    assert not loaded & {"httpx", "pydantic", "pydantic_core"}
    assert not {"polyloop.stores", "polyloop.adapters"} & modules


def test_no_module_of_the_package_imports_pydantic() -> None:
    """Structured output takes pydantic models by their methods, never by import."""
    importing = sorted(
        _module_name(path)
        for path in _package_files()
        if "pydantic" in _imported_top_level_names(path)
    )
    assert importing == []


def test_rule_13_import_polyloop_does_not_import_opentelemetry() -> None:
    modules = _modules_after("import polyloop")
    assert "polyloop.session" in modules, "the probe must really import the core"
    assert not {m for m in modules if m.split(".")[0] == "opentelemetry"}


def test_the_inspector_loads_no_third_party_module() -> None:
    modules = _modules_after("import polyloop.inspect")
    assert "polyloop.inspect" in modules, "the probe must really import the inspector"
    at_startup = _modules_after("pass")  # the interpreter's own (site hooks, __main__)
    third_party = {
        name.split(".")[0]
        for name in modules - at_startup
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "polyloop"
    }
    assert third_party == set(), f"python -m polyloop would need: {sorted(third_party)}"


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


def test_rule_14_importing_the_stores_does_not_import_a_postgres_driver() -> None:
    modules = _modules_after("import polyloop.stores\nfrom polyloop.stores import PostgresRunStore")
    assert "polyloop.stores._postgres" in modules, "the probe must really import the store"
    drivers = {"psycopg", "psycopg_pool", "asyncpg"}
    assert not {m for m in modules if m.split(".")[0] in drivers}


def test_rule_14_the_inspector_reads_postgres_without_importing_a_driver_itself() -> None:
    """``python -m polyloop`` loads no driver until a ``postgres://`` target opens the store
    (design 0213): the inspector and the store's listing module import none."""
    modules = _modules_after("import polyloop.inspect\nimport polyloop.stores._postgres_listing")
    assert "polyloop.inspect._postgres" in modules, "the probe must really import the reader"
    drivers = {"psycopg", "psycopg_pool", "asyncpg"}
    assert not {m for m in modules if m.split(".")[0] in drivers}
