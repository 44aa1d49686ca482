"""Packaging facts a user relies on: version, typing marker, the public surface."""

from __future__ import annotations

import datetime
import re
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


def test_the_version_has_a_dated_changelog_section_and_the_readme_names_it() -> None:
    """A release is a version, a dated changelog section and a README that says which version
    its examples are for (research-wiki/guides/releasing.md, sections 1-2)."""
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert released, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    newest, day = released[0]
    assert newest == polyloop.__version__, (
        f"the newest dated CHANGELOG section is {newest}, the package says {polyloop.__version__}"
    )
    datetime.date.fromisoformat(day)
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{newest}]")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"polyloop {polyloop.__version__}" in readme, "README must name the version it is for"


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
