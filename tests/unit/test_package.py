"""Packaging facts a user relies on: version, typing marker, the public surface."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import polyloop

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_single_sourced_from_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "polyloop.__version__"}
    assert polyloop.__version__.count(".") == 2


def test_core_has_no_runtime_dependencies() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["dependencies"] == []
    extras = pyproject["project"]["optional-dependencies"]
    assert any(req.startswith("httpx") for req in extras["gateway"])
    assert all("==" not in req for req in extras["testing"]), "testing extra: lower bounds only"
    assert all("==" in req for req in extras["dev"]), "dev extra: exact pins only"


def test_package_ships_the_typing_marker() -> None:
    assert (Path(polyloop.__file__).parent / "py.typed").is_file()


def test_top_level_reexports_only_the_public_core() -> None:
    exported = set(polyloop.__all__)
    assert {"types", "ports", "tools", "session", "serialization"} <= exported
    assert not {"stores", "adapters", "testing"} & exported
