"""Rehearsal of a downstream project certifying its own store with ``polyloop[testing]``.

It builds polyloop's wheel from this checkout, installs ``polyloop[testing]`` from it into a
fresh virtual environment (no system site-packages, nothing from this repo's environment),
writes a small out-of-tree project with a SQLite-backed ``RunStore`` and a
``TestMyStore(RunStoreContract)`` file, and runs pytest there:

* the correct store passes every checkable contract test, and the two "cannot be verified at
  this layer" tests skip;
* a store broken on purpose (it drops intents) fails, and the failure shows pytest's
  rewritten assertion (both sides of ``in``), which is what the ``pytest11`` entry point buys;
* with plugin autoloading disabled the output degrades to a bare ``AssertionError``, and the
  documented one-line fallback in ``conftest.py`` restores it.

One wheel and one environment serve every test here; the whole module takes well under a
minute on a warm package cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import polyloop.testing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]

STORE_MODULE = '''\
"""A RunStore on SQLite: one table, one row per record, decoded on read."""

import asyncio
import json
import sqlite3
from contextlib import closing

from polyloop.ports import RunLog
from polyloop.serialization import (
    decode_intent,
    decode_model_call_result,
    decode_run_finished,
    decode_run_started,
    decode_step_completed,
    encode,
)
from polyloop.types import Intent, ModelCallResult, RunFinished, RunStarted, StepCompleted

_DECODERS = {
    "run_started": decode_run_started,
    "intent": decode_intent,
    "model_call_result": decode_model_call_result,
    "step_completed": decode_step_completed,
    "run_finished": decode_run_finished,
}


class SqliteRunStore:
    def __init__(self, path):
        self._path = str(path)
        with closing(sqlite3.connect(self._path)) as db, db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                "run_id TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL)"
            )

    def parameters(self):
        return {"kind": "sqlite"}

    def _insert(self, kind, record):
        payload = json.dumps(encode(record), ensure_ascii=False)
        with closing(sqlite3.connect(self._path)) as db, db:
            db.execute(
                "INSERT INTO records (run_id, kind, payload) VALUES (?, ?, ?)",
                (record.run_id, kind, payload),
            )

    def _select(self, run_id):
        with closing(sqlite3.connect(self._path)) as db:
            return db.execute(
                "SELECT kind, payload FROM records WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()

    async def write_run_started(self, record: RunStarted) -> None:
        await asyncio.to_thread(self._insert, "run_started", record)

    async def write_intent(self, record: Intent) -> None:
        await asyncio.to_thread(self._insert, "intent", record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        await asyncio.to_thread(self._insert, "model_call_result", record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        await asyncio.to_thread(self._insert, "step_completed", record)

    async def write_run_finished(self, record: RunFinished) -> None:
        await asyncio.to_thread(self._insert, "run_finished", record)

    async def read_log(self, run_id: str) -> RunLog:
        rows = await asyncio.to_thread(self._select, run_id)
        started, finished = None, None
        intents, results, steps = [], [], []
        for kind, payload in rows:
            record = _DECODERS[kind](json.loads(payload))
            if kind == "run_started":
                started = record
            elif kind == "intent":
                intents.append(record)
            elif kind == "model_call_result":
                results.append(record)
            elif kind == "step_completed":
                steps.append(record)
            else:
                finished = record
        return RunLog(
            started=started,
            intents=tuple(intents),
            model_results=tuple(results),
            steps=tuple(steps),
            finished=finished,
        )
'''

CORRECT_WRITE_INTENT = """\
    async def write_intent(self, record: Intent) -> None:
        await asyncio.to_thread(self._insert, "intent", record)
"""

BROKEN_WRITE_INTENT = """\
    async def write_intent(self, record: Intent) -> None:
        return None  # broken on purpose: the intent never reaches the table
"""

TEST_MODULE = """\
import pytest

from polyloop.testing import RunStoreContract
from sqlite_runstore import SqliteRunStore


class TestMyStore(RunStoreContract):
    offers_leases = False  # SqliteRunStore has no acquire_lease (no run leases)

    @pytest.fixture
    def store(self, tmp_path):
        return SqliteRunStore(tmp_path / "runs.db")
"""

PYPROJECT = """\
[project]
name = "sqlite-runstore"
version = "0.0.1"
requires-python = ">=3.11"
dependencies = ["polyloop"]

[tool.pytest.ini_options]
pythonpath = ["src"]
testpaths = ["tests"]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
addopts = "--strict-markers -p no:cacheprovider"
filterwarnings = ["error"]
"""

FALLBACK_CONFTEST = """\
import pytest

pytest.register_assert_rewrite("polyloop.testing")
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Downstream:
    project: Path
    python: Path

    def use_store(self, *, broken: bool) -> None:
        source = STORE_MODULE
        if broken:
            assert CORRECT_WRITE_INTENT in source
            source = source.replace(CORRECT_WRITE_INTENT, BROKEN_WRITE_INTENT)
        (self.project / "src" / "sqlite_runstore" / "__init__.py").write_text(source)

    def use_fallback_conftest(self, *, present: bool) -> None:
        conftest = self.project / "tests" / "conftest.py"
        if present:
            conftest.write_text(FALLBACK_CONFTEST)
        else:
            conftest.unlink(missing_ok=True)

    def pytest(self, *args: str, autoload: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("PYTEST", "PYTHON", "VIRTUAL_ENV"))
        }
        if not autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            args = ("-p", "pytest_asyncio.plugin", *args)
        return subprocess.run(
            [str(self.python), "-m", "pytest", "-rfs", *args],
            cwd=self.project,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )


def _run(*command: str | Path, cwd: Path | None = None) -> None:
    completed = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert completed.returncode == 0, f"{command}\n{completed.stdout}\n{completed.stderr}"


def _build_wheel(work: Path) -> Path:
    # Build from a copy of the sources, so the checkout gets no build/ or *.egg-info debris
    # and a concurrent build elsewhere cannot interfere.
    source = work / "polyloop-src"
    shutil.copytree(
        REPO_ROOT / "src" / "polyloop",
        source / "src" / "polyloop",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copy2(REPO_ROOT / "pyproject.toml", source / "pyproject.toml")
    readme = REPO_ROOT / "README.md"
    if readme.exists():
        shutil.copy2(readme, source / "README.md")
    else:  # the README is not this test's subject; the build only needs the file to exist
        (source / "README.md").write_text("# polyloop\n")
    dist = work / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", dist, source)
    (wheel,) = dist.glob("polyloop-*.whl")
    return wheel


@pytest.fixture(scope="module")
def downstream(tmp_path_factory: pytest.TempPathFactory) -> Downstream:
    work = tmp_path_factory.mktemp("rehearsal")
    wheel = _build_wheel(work)
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        f"{wheel}[testing]",
    )
    project = work / "sqlite-runstore"
    (project / "src" / "sqlite_runstore").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "tests" / "test_my_store.py").write_text(TEST_MODULE)
    return Downstream(project=project, python=python)


def _checkable_and_skipped() -> tuple[int, int]:
    methods = [name for name in dir(polyloop.testing.RunStoreContract) if name.startswith("test_")]
    unverifiable = {
        "test_atomicity_under_crash_is_not_checkable_here",
        "test_prefix_durability_is_not_checkable_here",
        # SqliteRunStore has no write_settlement nor write_approval_request (the optional
        # SettlingRunStore capability).
        "test_settlements_round_trip_in_write_order",
        "test_approval_requests_and_decisions_round_trip_in_write_order",
    }
    return len(methods) - len(unverifiable), len(unverifiable)


def test_a_correct_store_passes_the_suite(downstream: Downstream) -> None:
    downstream.use_store(broken=False)
    downstream.use_fallback_conftest(present=False)
    result = downstream.pytest()
    passed, skipped = _checkable_and_skipped()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{passed} passed, {skipped} skipped" in result.stdout
    assert "cannot be verified at this layer. Promise:" in result.stdout


def test_a_broken_store_fails_with_rewritten_assertions(downstream: Downstream) -> None:
    downstream.use_store(broken=True)
    downstream.use_fallback_conftest(present=False)
    result = downstream.pytest()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED tests/test_my_store.py::TestMyStore::test_written_intent_is_readable" in (
        result.stdout
    )
    # The rewritten assertion shows the intent that was written and the empty tuple read back.
    assert "assert Intent(run_id='r1', kind=<IntentKind.MODEL_CALL" in result.stdout
    assert "where () = RunLog(" in result.stdout


def test_without_autoload_output_degrades_and_the_fallback_restores_it(
    downstream: Downstream,
) -> None:
    downstream.use_store(broken=True)
    downstream.use_fallback_conftest(present=False)
    degraded = downstream.pytest(autoload=False)
    assert degraded.returncode == 1, degraded.stdout + degraded.stderr
    assert "test_written_intent_is_readable" in degraded.stdout
    assert "where () = RunLog(" not in degraded.stdout

    downstream.use_fallback_conftest(present=True)
    restored = downstream.pytest(autoload=False)
    assert restored.returncode == 1, restored.stdout + restored.stderr
    assert "where () = RunLog(" in restored.stdout
