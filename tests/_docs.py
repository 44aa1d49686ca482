"""The commands the reference pages name, for the docs check (issue 41, point 6).

``tests/unit/test_docs_check.py`` checks that each names a module that exists;
``tests/integration/test_reference_commands.py`` runs each benchmark's ``--quick`` form.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "research-wiki" / "reference"

# `python -m tools.x` or `python -m tools.bench.x`, whichever interpreter runs it.
_TOOLS_COMMAND = re.compile(r"python3?\s+-m\s+(tools(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def reference_pages() -> list[Path]:
    return sorted(REFERENCE.rglob("*.md"))


def reference_commands() -> dict[str, list[str]]:
    """Every ``tools`` module a reference page runs, with the ``file:line`` places naming it."""
    named: dict[str, list[str]] = {}
    for page in reference_pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            for module in _TOOLS_COMMAND.findall(line):
                named.setdefault(module, []).append(f"{page.relative_to(ROOT)}:{number}")
    return named


def module_exists(module: str) -> bool:
    """Whether ``python -m module`` finds a file in this repository."""
    relative = ROOT / Path(*module.split("."))
    return relative.with_suffix(".py").is_file() or (relative / "__main__.py").is_file()
