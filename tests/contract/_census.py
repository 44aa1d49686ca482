"""A pytest plugin that records, for every contract test that runs, how it ended.

Loaded with ``-p _census`` into a child pytest process by ``run_census``. It keeps only the
items that belong to a subclass of one of the contract bases (everything else is
deselected, which keeps the child fast and stops it from recursing into the test that
launched it), and writes one JSON row per item to the file named by ``POLYLOOP_CENSUS_OUT``:

``{"nodeid", "wiring", "base", "method", "defined_by_base", "outcome", "reason"}``

``outcome`` is ``"passed"``, ``"skipped"`` or ``"failed"`` (a failure or error in any phase
wins). ``defined_by_base`` is false when the wiring class overrides the method (an
exemption), in which case that run says nothing about the contract method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

OUT_VARIABLE = "POLYLOOP_CENSUS_OUT"
REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_NAMES = (
    # The extended bases come first: a wiring of one belongs to it, not to the base it extends.
    "NativeToolCallModelClientContract",
    "NativeToolCallParserContract",
    "ActionExecutorContract",
    "DecisionParserContract",
    "EventSinkContract",
    "ModelClientContract",
    "RunLeaseContract",
    "RunStoreContract",
)

_rows: dict[str, dict[str, Any]] = {}
_collection_errors: list[str] = []


def _contract_base(cls: type) -> type | None:
    import polyloop.testing as suite

    for name in BASE_NAMES:
        base = getattr(suite, name)
        if issubclass(cls, base):
            return base
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        cls = getattr(item, "cls", None)
        base = _contract_base(cls) if cls is not None else None
        if cls is None or base is None:
            drop.append(item)
            continue
        method = getattr(item, "originalname", item.name)
        defined_by = next(klass for klass in cls.__mro__ if method in vars(klass))
        _rows[item.nodeid] = {
            "nodeid": item.nodeid,
            "wiring": f"{item.path.name}::{item.parent.name if item.parent else cls.__name__}",
            "base": base.__name__,
            "method": method,
            # The base itself or a base it extends, never the wiring (an exemption).
            "defined_by_base": issubclass(base, defined_by),
            "outcome": None,
            "reason": "",
        }
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _collection_errors.append(f"{report.nodeid}: {report.longreprtext}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _rows.get(report.nodeid)
    if row is None:
        return
    if report.failed:
        row["outcome"] = "failed"
        row["reason"] += f"[{report.when}] {report.longreprtext}\n"
    elif report.skipped and row["outcome"] != "failed":
        row["outcome"] = "skipped"
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        row["reason"] = reason.removeprefix("Skipped: ")
    elif report.when == "call" and row["outcome"] is None:
        row["outcome"] = "passed"


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get(OUT_VARIABLE)
    if out:
        payload = {"rows": list(_rows.values()), "collection_errors": _collection_errors}
        Path(out).write_text(json.dumps(payload, indent=1), encoding="utf-8")


# --------------------------------------------------------------------------- driver


@dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    rows: tuple[dict[str, Any], ...]
    collection_errors: tuple[str, ...]
    returncode: int
    output: str


def run_census(paths: list[str], out: Path, *extra: str) -> Census:
    """Run pytest on ``paths`` (relative to the repo root) in a child process with this
    plugin, and return what it recorded."""
    env = dict(os.environ)
    env[OUT_VARIABLE] = str(out)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH", "")]))
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", *paths),
            *("-p", "_census", "-p", "no:cacheprovider", "-q", "--no-header", "-rN", *extra),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if not out.exists():
        raise AssertionError(
            f"the child pytest wrote no census (exit {completed.returncode}):\n"
            f"{completed.stdout}\n{completed.stderr}"
        )
    payload = json.loads(out.read_text(encoding="utf-8"))
    return Census(
        rows=tuple(payload["rows"]),
        collection_errors=tuple(payload["collection_errors"]),
        returncode=completed.returncode,
        output=completed.stdout + completed.stderr,
    )
