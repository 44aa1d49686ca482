"""The architecture page is a claim about the code; this test keeps the claim true."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "research-wiki" / "explanation" / "architecture.md").read_text(encoding="utf-8")
PACKAGE = ROOT / "src" / "polyloop"


def _code_map_entries() -> set[str]:
    return set(re.findall(r"^\| `polyloop/([^`]+)` \|", PAGE, flags=re.MULTILINE))


def test_every_module_in_the_package_is_on_the_code_map() -> None:
    present = {
        p.name + ("/" if p.is_dir() else "")
        for p in PACKAGE.iterdir()
        if p.name not in {"__pycache__", "py.typed"}
    }
    assert present == _code_map_entries()


def test_every_design_record_the_page_cites_exists() -> None:
    cited = set(re.findall(r"\b(\d{4})\b", PAGE.split("## Code map", 1)[1]))
    existing = {p.name[:4] for p in (ROOT / "research-wiki" / "design").glob("*.md")}
    assert cited <= existing, f"cited but missing: {sorted(cited - existing)}"


def test_every_import_linter_contract_is_on_the_rules_table() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "importlinter"
    ]["contracts"]
    for contract in contracts:
        assert f"`{contract['id']}`" in PAGE, f"contract {contract['id']} is not documented"


def test_layer_table_matches_the_layers_contract() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "importlinter"
    ]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    for layer in layers:
        for module in layer.split("|"):
            name = module.strip().removeprefix("polyloop.")
            assert f"`polyloop/{name}" in PAGE, f"{name} missing from the code map"
