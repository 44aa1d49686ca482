"""The docs check (issue 41, point 6; issue 36, point 8): links resolve, reference pages state
the present, every benchmark command a reference page names is a module that exists, and every
command README and the guides give a reader runs the virtualenv's ``.venv/bin/python`` (the
blocks marked ``bash runnable`` are run by ``tests/integration/test_reference_commands.py``).

Static checks on the text only; they read a few hundred kilobytes and run well under a second.
The runnable Python blocks of README and the guides are executed elsewhere
(``test_readme_blocks.py``, ``test_cluster_guide.py``, ``tests/integration/test_guide_*.py``);
each benchmark named here is run in its ``--quick`` form by
``tests/integration/test_reference_commands.py``.

Each failure lists every offending place as ``file:line``, so one run shows all there is to fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from _docs import (
    RUNNABLE_INFO,
    bare_python_commands,
    fenced_blocks,
    module_exists,
    reference_commands,
    reference_pages,
    runnable_blocks,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
WIKI = ROOT / "research-wiki"


def linked_pages() -> list[Path]:
    """The pages whose internal links must resolve: README, CHANGELOG and the whole wiki."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(WIKI.rglob("*.md"))]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _where(path: Path, line: int) -> str:
    return f"{_shown(path)}:{line}"


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of ``path`` outside fenced code blocks (code is not a link)."""
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker is not None:
            if fence is None:
                fence = marker.group(1)
                continue
            if stripped.startswith(fence) and not stripped[len(fence) :].strip():
                fence = None
                continue
        if fence is None:
            yield number, line


_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or [text](target "title"); ![alt](image) too. The text may hold one level of
# brackets ([`x[0]`](page.md)); the target is everything up to the first space or ")".
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target (a reference-style definition)
_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")


def links(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, target)`` of every markdown link in ``path``'s prose (not in code)."""
    for number, line in prose_lines(path):
        text = _INLINE_CODE.sub("", line)
        for match in _LINK.finditer(text):
            yield number, match.group(1)
        definition = _DEFINITION.match(text)
        if definition is not None:
            yield number, definition.group(1)


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lowercase, punctuation except ``-`` and
    ``_`` dropped, each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    kept = (char for char in text if char in "-_ " or char.isalnum())
    return "".join(kept).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of ``path``'s headings, numbered ``-1``, ``-2`` for repeats as GitHub does,
    plus any explicit ``<a name=...>``/``id=...`` anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _number, line in prose_lines(path):
        heading = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is not None:
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return frozenset(found)


def broken_link(page: Path, target: str) -> str | None:
    """Why ``target`` (a link on ``page``) does not resolve, or ``None`` when it does or is
    not internal (a URL, a mail address)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
        return None
    path_part, _, anchor = target.partition("#")
    destination = page if not path_part else (page.parent / path_part).resolve()
    if not destination.exists():
        return f"{target}: no such file {_shown(destination)}"
    if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
        return f"{target}: no heading of {_shown(destination)} has the anchor #{anchor}"
    return None


def test_github_slug_follows_githubs_rules() -> None:
    assert github_slug("What a step costs") == "what-a-step-costs"
    assert github_slug("`run()` and `resume()`: the API") == "run-and-resume-the-api"
    assert (
        github_slug("Fleet throughput (PostgreSQL, 8 cores)")
        == "fleet-throughput-postgresql-8-cores"
    )
    assert github_slug("snake_case and dash-es") == "snake_case-and-dash-es"
    assert github_slug("Design 0214 → 0219") == "design-0214--0219"


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# A `title`, here\n\n## Again\n## Again\n", encoding="utf-8"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "See [it](other.md#a-title-here), [the second](other.md#again-1), [top](#local),\n"
        "[web](https://example.com/x#y) and `[code](nowhere.md)`.\n"
        "# Local\n"
        "[gone](missing.md) [wrong](other.md#nope) [self](#nope)\n"
        "```\n[fenced](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    broken = [(line, target) for line, target in links(page) if broken_link(page, target)]
    assert broken == [(4, "missing.md"), (4, "other.md#nope"), (4, "#nope")]


def test_every_internal_link_resolves() -> None:
    broken = [
        f"{_where(page, line)}: {reason}"
        for page in linked_pages()
        for line, target in links(page)
        if (reason := broken_link(page, target)) is not None
    ]
    assert not broken, "broken internal links:\n" + "\n".join(broken)


# A word of 7 to 40 hex digits with at least one digit and one letter a-f: how a commit is named.
_HEX_WORD = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
# Issue 41's grep, `grep -rnE "sitting|[0-9]+(st|nd|rd|th) pass"`, ignoring case ("Sitting").
_SITTING = re.compile(r"sitting|[0-9]+(st|nd|rd|th) pass", re.IGNORECASE)


def commit_hashes(line: str) -> list[str]:
    return [
        word
        for word in _HEX_WORD.findall(line)
        if re.search(r"[0-9]", word) and re.search(r"[a-f]", word)
    ]


def test_commit_hash_detection() -> None:
    assert commit_hashes("the quiet figure at c0090e4 (load 1.2)") == ["c0090e4"]
    assert commit_hashes("at 39baf9b0e4c1d2a3b4c5d6e7f8091a2b3c4d5e6f") == [
        "39baf9b0e4c1d2a3b4c5d6e7f8091a2b3c4d5e6f"
    ]
    assert commit_hashes("1234567 steps, deadbeef, 0x1f2e3d4c, a1b2c3") == []


def test_no_reference_page_names_a_commit() -> None:
    """A reference page states the present; which commit a figure came from is git's to say."""
    found = [
        f"{_where(page, number)}: {', '.join(hashes)}"
        for page in reference_pages()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
        if (hashes := commit_hashes(line))
    ]
    assert not found, "reference pages naming a commit:\n" + "\n".join(found)


def _sittings(paths: list[Path]) -> list[str]:
    return [
        f"{_where(path, number)}: {line.strip()[:120]}"
        for path in paths
        for number, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1
        )
        if _SITTING.search(line)
    ]


def test_no_reference_page_or_readme_names_a_sitting() -> None:
    """Issue 41's grep over ``research-wiki/reference/`` and README: no "sitting", no "Nth
    pass"; a figure carries its command, date and load instead."""
    found = _sittings([*reference_pages(), ROOT / "README.md"])
    assert not found, "sittings and passes named:\n" + "\n".join(found)


def _is_text(path: Path) -> bool:
    return path.is_file() and path.suffix in {".py", ".pyi", ".md", ".txt", ".html", ".js", ".css"}


def test_no_source_names_a_sitting() -> None:
    """Issue 41's grep over ``src/``: a docstring states the contract, not its history."""
    found = _sittings(sorted(path for path in (ROOT / "src").rglob("*") if _is_text(path)))
    assert not found, "sittings and passes named in src/:\n" + "\n".join(found)


def test_every_command_a_reference_page_names_is_a_module() -> None:
    named = reference_commands()
    assert any(module.startswith("tools.bench.") for module in named), "no benchmark found"
    missing = [
        f"{place}: python -m {module}: no such module"
        for module, places in sorted(named.items())
        if not module_exists(module)
        for place in places
    ]
    assert not missing, "\n".join(missing)


def test_every_command_a_reader_types_runs_the_virtualenvs_python() -> None:
    """README and the guides say ``.venv/bin/python``, never a bare ``python`` that may be
    another interpreter without polyloop (issue 36, point 8); ``python3 -m venv`` is allowed:
    it makes the virtualenv."""
    found = bare_python_commands()
    assert not found, "commands running a bare python:\n" + "\n".join(found)


def test_the_bare_python_check_finds_what_it_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import _docs

    page = tmp_path / "README.md"
    page.write_text(
        "```bash\n$ python agent.py\nKEY=1 python3 -m polyloop ls runs\n"
        "python3 -m venv .venv\n.venv/bin/python -m polyloop ls runs\n"
        "    approve: python -m polyloop approve x\n```\n"
        "```python\npython = 1\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(_docs, "ROOT", tmp_path)
    monkeypatch.setattr(_docs, "command_pages", lambda: [page])
    assert _docs.bare_python_commands() == [
        "README.md:2: $ python agent.py",
        "README.md:3: KEY=1 python3 -m polyloop ls runs",
    ]
    assert [b.info for b in fenced_blocks(page)] == ["bash", "python"]


def test_readme_marks_its_inspector_commands_runnable() -> None:
    """The README's commands after ``make demo`` are marked, so the integration test runs them
    (``tests/integration/test_reference_commands.py``)."""
    readme = [b for b in runnable_blocks() if b.where.startswith("README.md:")]
    assert readme, f"README has no block marked {RUNNABLE_INFO!r}"
    commands = "".join(block.code for block in readme)
    for command in ("ls runs/", "verify runs/", "show runs/demo-*/"):
        assert f".venv/bin/python -m polyloop {command}" in commands
