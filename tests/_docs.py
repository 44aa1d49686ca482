"""The commands the docs name, for the docs check (issue 41, point 6; issue 36, point 8).

``tests/unit/test_docs_check.py`` checks that each ``tools`` module a reference page names
exists, and that every command a reader types in README or a guide runs the virtualenv's
interpreter; ``tests/integration/test_reference_commands.py`` runs each benchmark's ``--quick``
form, and every block marked ``bash runnable`` (``RUNNABLE_INFO``) as written, from the root of
a fresh copy of the repository after ``make demo``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "research-wiki" / "reference"
GUIDES = ROOT / "research-wiki" / "guides"
RUNNABLE_INFO = "bash runnable"
"""The info string of a fenced block whose commands run as written from the repository root
after ``make demo`` (the way ``python runnable`` marks a Python block that runs)."""

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


_OPENING = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: ``page:line`` of its opening fence, its info string, its text."""

    where: str
    info: str
    code: str


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced code block of ``page`` (the CommonMark rules that matter here: a closing
    fence uses the opening's character, at least as many, and nothing after it)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _OPENING.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence = opening["fence"]
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        where = f"{page.relative_to(ROOT)}:{index + 1}"
        code = "\n".join(lines[index + 1 : end]) + "\n"
        blocks.append(Block(where=where, info=opening["info"].strip(), code=code))
        index = end + 1
    return blocks


def command_pages() -> list[Path]:
    """The pages a reader types commands from: README and the guides."""
    return [ROOT / "README.md", *sorted(GUIDES.glob("*.md"))]


def runnable_blocks() -> list[Block]:
    """Every block marked ``bash runnable`` in README and the guides."""
    return [
        block
        for page in command_pages()
        for block in fenced_blocks(page)
        if block.info == RUNNABLE_INFO
    ]


# A command line a reader types: optionally after a prompt "$ " and VAR=value assignments, a
# bare `python`/`python3` that is not `python3 -m venv` (which makes the virtualenv).
_BARE_PYTHON = re.compile(r"^(?:\$ )?(?:[A-Za-z_][A-Za-z0-9_]*=\S* )*python3?\s(?!-m venv\b)")


def bare_python_commands() -> list[str]:
    """``page:line: text`` of every command in a fenced block of README or a guide that runs a
    bare ``python``: which interpreter that is depends on the reader's shell (issue 36)."""
    found = []
    for page in command_pages():
        for block in fenced_blocks(page):
            if block.info not in ("", "bash", "sh", "shell", "console", RUNNABLE_INFO):
                continue
            first = int(block.where.rsplit(":", 1)[1]) + 1
            for offset, line in enumerate(block.code.splitlines()):
                if _BARE_PYTHON.match(line):
                    found.append(f"{page.relative_to(ROOT)}:{first + offset}: {line.strip()}")
    return found
