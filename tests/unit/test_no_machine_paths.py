"""No absolute path of one machine in the README or the research wiki (issue 26 item 5).

A reader's checkout is not ours: a guide that says ``/work/llama-venv`` or ``/tmp/llm`` works
on the machine it was written on only. Paths in the docs are relative to the checkout (``.venv``,
``../llama-venv`` for a sibling), or named by what they are. The pattern is an absolute path
whose first component is one of the usual per-machine roots; URLs (``https://host/home/...``)
and ``~/`` are not matched. Only the system paths in ``ALLOWED`` (each with its reason) are
allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(
    r"(?<![\w.~/:-])/(?:work|tmp|root|home|usr|opt|Users|mnt|var|srv|private|Volumes|media|nix"
    r"|snap)(?![\w-]|\.\w)"
    r"|(?<![\w\\])[A-Za-z]:\\{1,2}[\w.$-]"
)
"""An absolute path of one machine: ``/work``, ``/tmp``, ``/root``, ``/home``, ``/usr``,
``/opt``, ``/Users``, ``/mnt``, ``/var``, ``/srv``, ``/private``, ``/Volumes``, ``/media``,
``/nix`` or ``/snap`` as a path's first component (not inside a URL or a longer path:
``https://x/home``, ``a/tmp``; not a longer name: ``/tmpfs``, ``/homework``), or a Windows
drive path (``C:\\Users``, ``D:\\\\venv`` as written in a string)."""

ALLOWED = {
    "/usr/bin/time": "GNU time, the same binary on every Linux machine; the absolute path is "
    "how one asks for it instead of the shell's `time` keyword (design 0211's figures)",
    "/usr/bin/chromium": "Debian's chromium package puts its browser there on every machine; "
    "the viewer guides may name it as the distribution's path, not as ours",
}
"""System paths that are the same on every machine of their kind, each with its reason: they
are removed from a line before the pattern looks at it. Nothing else is allowed."""


def _documents() -> list[Path]:
    wiki = [p for p in sorted((ROOT / "research-wiki").rglob("*")) if p.is_file()]
    return [ROOT / "README.md", *wiki]


def _machine_paths(text: str) -> list[tuple[int, str]]:
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if MACHINE_PATH.search(_without_allowed(line))
    ]


def _without_allowed(line: str) -> str:
    for path in ALLOWED:
        line = re.sub(re.escape(path) + r"(?![\w/.-])", "", line)
    return line


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
        "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/llama",
        "/usr/local/bin/python3.12 -m venv .venv",
        "installed in /opt/llama.cpp/build",
        "open /Users/me/runs/r1.jsonl",
        "copy it to /mnt/data first",
        "logs under /var/log/polyloop",
        r"C:\Users\me\venv\Scripts\python.exe",
        r'store = JsonlRunStore(directory="D:\\runs")',
        "/usr/bin/chromium-browser --headless",
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
        "measured with `/usr/bin/time -v python -m pytest`",
        "Debian installs it as /usr/bin/chromium (`apt-get install chromium`)",
        "read and/or write, 40 km/h, a 1/var ratio",
        "the regex [A-Za-z]: and a URL https://example.com/usr/share",
    ],
)
def test_the_pattern_leaves_relative_paths_and_urls_alone(line: str) -> None:
    assert _machine_paths(line) == []
