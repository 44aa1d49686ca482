"""Every benchmark a reference page names runs in its ``--quick`` form (issue 41, point 6), and
every command block of README and the guides marked ``bash runnable`` runs as written from the
root of a fresh copy of the repository after ``make demo`` (issue 36, point 8).

The modules are read from ``research-wiki/reference/*.md`` (``tests/_docs.py``), so a command a
page starts quoting is run here without a change to this file. Three benchmarks are already run
quick by their own smoke tests and are not run twice (``ALREADY_RUN``); three diagnostics have
no ``--quick`` flag and run with the smallest sizes they take (``SMALLEST``).

Not timed tests: each run must exit 0 within its subprocess timeout and print something; the
figures are the pages'.

The fresh tree (``demo_tree``, once per module): the repository's files as git lists them
(tracked and new, not ignored) copied to a temporary directory, ``.venv`` a link to this
interpreter's virtualenv (as ``make install`` would have made it; installing again would need
the package index), and ``make demo`` run there with the copy's ``src`` first on the path, so
the commands run the code under test and find ``runs/demo-<timestamp>/`` as a reader would.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tools.pg_cluster import HOW_TO_INSTALL, binaries_available

from _docs import ROOT, Block, reference_commands, runnable_blocks
from _infra import skip_unless_available, skip_unless_loopback_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# module -> the test that already runs its --quick form
ALREADY_RUN = {
    "run_all": "tests/integration/test_bench_smoke.py",
    "per_step": "tests/integration/test_bench_smoke.py",  # inside run_all --quick
    "many_runs": "tests/integration/test_bench_smoke.py",
    "resume_cost": "tests/integration/test_bench_smoke.py",
    "prompt_assembly": "tests/integration/test_bench_smoke.py",
    "postgres_store": "tests/integration/test_postgres_bench_smoke.py",
}

# diagnostics without --quick: the smallest run they take ({tmp} is a fresh directory)
SMALLEST = {
    "encode_step": ["--steps", "5", "--runs", "2", "--repeats", "1"],
    "profile_step": ["--steps", "5", "--runs", "1", "--disk-dir", "{tmp}"],
    "schema_check": ["--number", "10", "--repeats", "1"],
}

NEEDS_RAY = {"ray_engines", "ray_failover"}
NEEDS_POSTGRES = {"postgres_listing"}
# Not a dependency of anything: run in a throwaway venv (the module's docstring says how).
NEEDS_PEERS = {"peers": ("langgraph", "pydantic_ai")}

THIS_MODULE = ".venv/bin/python -m pytest -q tests/integration/test_reference_commands.py"
TIMEOUT_S = 300


def named_benchmarks() -> list[str]:
    prefix = "tools.bench."
    return sorted(
        {module[len(prefix) :] for module in reference_commands() if module.startswith(prefix)}
    )


def to_run() -> list[str]:
    return [name for name in named_benchmarks() if name not in ALREADY_RUN]


def test_the_benchmarks_run_elsewhere_are_run_quick_there() -> None:
    for name, test_file in ALREADY_RUN.items():
        text = (ROOT / test_file).read_text(encoding="utf-8")
        assert "--quick" in text
        runner = "run_all" if test_file.endswith("test_bench_smoke.py") else name
        assert f"tools.bench.{runner}" in text or f'"{runner}"' in text, (name, test_file)
    run_all = (ROOT / "tools" / "bench" / "run_all.py").read_text(encoding="utf-8")
    for name, test_file in ALREADY_RUN.items():
        if test_file.endswith("test_bench_smoke.py") and name != "run_all":
            assert name in run_all, f"run_all no longer runs {name}: run it quick here"


@pytest.mark.parametrize("name", to_run())
def test_each_benchmark_a_reference_page_names_runs_quick(name: str, tmp_path: Path) -> None:
    if name in NEEDS_RAY:
        skip_unless_available(
            importlib.util.find_spec("ray") is not None,
            what="Ray (the ray extra)",
            how_to_install="pip install -e '.[ray]' (make install)",
        )
        skip_unless_loopback_namespace(what="a Ray cluster", command=THIS_MODULE)
    if name in NEEDS_POSTGRES:
        skip_unless_available(
            binaries_available(), what="PostgreSQL", how_to_install=HOW_TO_INSTALL
        )
    peers = NEEDS_PEERS.get(name, ())
    if any(importlib.util.find_spec(peer) is None for peer in peers):
        pytest.skip(
            f"tools.bench.{name} measures {', '.join(peers)}, never a dependency; its --quick "
            "form runs in the throwaway venv its docstring describes"
        )
    args = [arg.format(tmp=tmp_path) for arg in SMALLEST.get(name, ["--quick"])]
    if name not in SMALLEST:
        args += ["--json-out", str(tmp_path / f"{name}.json")]
    completed = subprocess.run(
        [sys.executable, "-m", f"tools.bench.{name}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip(), f"tools.bench.{name} printed nothing"
    if name not in SMALLEST:
        assert (tmp_path / f"{name}.json").is_file()


# --------------------------------------------------------------------------- runnable blocks

DEMO_TIMEOUT_S = 300
BLOCK_TIMEOUT_S = 120


def _copy_of_the_repository(destination: Path) -> None:
    """The files git lists (tracked, and new ones not ignored), as a fresh clone has them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    for raw in listed:
        relative = raw.decode()
        if not relative or not (ROOT / relative).is_file():
            continue  # a file deleted in the working tree
        (destination / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, destination / relative)


@pytest.fixture(scope="module")
def demo_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh copy of the repository after ``make demo``, and the environment to run in it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the runnable blocks run on a git checkout's files (git ls-files)")
    if shutil.which("make") is None:
        pytest.skip("make demo needs make")
    if sys.prefix == sys.base_prefix:
        pytest.skip("the runnable blocks run .venv/bin/python: run the suite with a virtualenv")
    root = tmp_path_factory.mktemp("fresh-clone")
    _copy_of_the_repository(root)
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    made = subprocess.run(
        ["make", "-o", ".venv/.installed", "demo"],  # -o: .venv counts as installed
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    assert len(list((root / "runs").glob("demo-*"))) == 1
    return root, env


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda block: block.where)
def test_each_runnable_block_runs_as_written_after_make_demo(
    block: Block, demo_tree: tuple[Path, dict[str, str]]
) -> None:
    root, env = demo_tree
    completed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, f"{block.where}:\n{completed.stderr[-3000:]}"
    assert completed.stdout.strip(), f"{block.where} printed nothing"
    assert "Traceback" not in completed.stderr


def test_there_are_runnable_blocks_to_run() -> None:
    assert any(block.where.startswith("README.md:") for block in runnable_blocks())
