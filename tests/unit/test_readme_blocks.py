"""Every README code block marked ``python runnable`` runs, as a script, and exits cleanly.

A block opts in with the exact info string ``python runnable`` (a plain ``python`` block is
illustration and is not run). Each one is written to a file in a fresh temporary directory and
run there with this interpreter, the way a reader would paste and run it: only the installed
``polyloop`` is importable, not ``tests/`` or ``tools/``.

These tests spawn processes, hence the ``integration`` marker despite the directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INFO_STRING = "python runnable"
_OPENING = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    line: int
    """1-based line number of the opening fence in the Markdown file."""
    info: str
    code: str


def fenced_blocks(markdown: str) -> list[Block]:
    """Every fenced code block (CommonMark rules that matter here): the closing fence uses the
    same character, is at least as long as the opening one and has nothing after it; an
    unclosed block runs to the end of the document."""
    blocks = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        opening = _OPENING.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            body.append(re.sub(rf"^ {{0,{indent}}}", "", lines[end]))
            end += 1
        code = "\n".join(body) + "\n" if body else ""
        blocks.append(Block(line=index + 1, info=opening["info"].strip(), code=code))
        index = end + 1
    return blocks


def runnable_blocks() -> list[Block]:
    if not README.is_file():
        return []
    return [b for b in fenced_blocks(README.read_text(encoding="utf-8")) if b.info == INFO_STRING]


def test_readme_has_a_runnable_block() -> None:
    assert README.is_file(), f"{README} is missing; the README is the newcomer's entry point"
    assert runnable_blocks(), (
        f"README.md has no `{INFO_STRING}` block: mark the complete run/resume example with "
        f"```{INFO_STRING} so that this suite proves it works"
    )


_BLOCKS = runnable_blocks()


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=f"README.md:{b.line}") for b in _BLOCKS]
    or [
        pytest.param(
            None,
            marks=pytest.mark.skip(
                reason="README.md has no runnable block yet; test_readme_has_a_runnable_block "
                "fails and says so"
            ),
            id="no-runnable-block",
        )
    ],
)
def test_runnable_block_exits_cleanly(block: Block, tmp_path: Path) -> None:
    script = tmp_path / f"readme_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    process = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 0, (
        f"the `{INFO_STRING}` block at README.md line {block.line} failed with exit status "
        f"{process.returncode}\n--- stdout\n{process.stdout}--- stderr\n{process.stderr}"
    )


# --------------------------------------------------------------------------- the block finder


def test_finder_takes_only_the_exact_info_string_and_reports_the_fence_line() -> None:
    markdown = (
        "# Title\n"  # line 1
        "```python\nprint('illustration')\n```\n"  # lines 2-4
        "```python runnable\nprint('one')\n\nprint('two')\n```\n"  # lines 5-9
        "````python runnable\n```\nnested = True\n````\n"  # lines 10-13
        "```python runnable extra\nprint('no')\n```\n"  # lines 14-16
    )
    blocks = [b for b in fenced_blocks(markdown) if b.info == INFO_STRING]
    assert [(b.line, b.code) for b in blocks] == [
        (5, "print('one')\n\nprint('two')\n"),
        (10, "```\nnested = True\n"),
    ]


def test_finder_strips_the_opening_fence_indent_and_keeps_an_unclosed_block() -> None:
    markdown = "  ```python runnable\n  x = 1\n    y = 2\n"
    (block,) = fenced_blocks(markdown)
    assert block.line == 1
    assert block.code == "x = 1\n  y = 2\n"
