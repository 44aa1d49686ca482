"""No absolute path of one machine in the README or the research wiki (issue 26 item 5).

A reader's checkout is not ours: a guide that says ``/work/llama-venv`` or ``/tmp/llm`` works
on the machine it was written on only. Paths in the docs are relative to the checkout (``.venv``,
``../llama-venv`` for a sibling), or named by what they are. The pattern is an absolute path
whose first component is one of the usual per-machine roots; URLs (``https://host/home/...``)
and ``~/`` are not matched. Nothing is allow-listed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(r"(?<![\w.~/:-])/(?:work|tmp|root|home)(?![\w-]|\.\w)")
"""``/work``, ``/tmp``, ``/root`` or ``/home`` as a path's first component: not inside a URL or
a longer path (``https://x/home``, ``a/tmp``), not a longer name (``/tmpfs``, ``/homework``)."""


def _documents() -> list[Path]:
    wiki = [p for p in sorted((ROOT / "research-wiki").rglob("*")) if p.is_file()]
    return [ROOT / "README.md", *wiki]


def _machine_paths(text: str) -> list[tuple[int, str]]:
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if MACHINE_PATH.search(line)
    ]


def test_the_readme_and_the_wiki_name_no_machine_path() -> None:
    found = []
    for path in _documents():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a screenshot: no text to read
            continue
        found += [f"{path.relative_to(ROOT)}:{n}: {line}" for n, line in _machine_paths(text)]
    assert found == [], "absolute machine paths (use paths relative to the checkout):\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    "line",
    [
        "python3 -m venv /work/llama-venv",
        "see /work/llama-build/NOTES.md",
        "PYTHONPATH=/tmp/polyloop-before .venv/bin/python",
        "`/tmp/peers-venv/bin/python -m tools.bench.peers`",
        "cd /root && make",
        "(/home/me/runs)",
        "TMPDIR defaults to /tmp.",
    ],
)
def test_the_pattern_finds_machine_paths(line: str) -> None:
    assert _machine_paths(line) == [(1, line)]


@pytest.mark.parametrize(
    "line",
    [
        "https://docs.example.com/home/index.html",
        "python3 -m venv ../llama-venv",
        "runs/tmp/agent-1.jsonl",
        "a file in ~/ray_bootstrap_config.yaml",
        "mount a /tmpfs, do /homework",
        ".venv/bin/python -m pytest -q",
    ],
)
def test_the_pattern_leaves_relative_paths_and_urls_alone(line: str) -> None:
    assert _machine_paths(line) == []
