"""The cluster guide's first example runs as written: a complete script, executed here on a
``ray.cluster_utils.Cluster`` of two nodes on 127.0.0.1 (issue 26 item 4).

The block is the first ``python runnable`` block of the guide
(``research-wiki/guides/running-on-a-cluster.md``), written to a fresh directory and run with
this interpreter, as a reader would run it. Ray starts
only in a loopback-only network namespace (issue 27): elsewhere this test skips with the command
that runs it (and fails in CI, whose whole suite runs in such a namespace).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme_blocks import INFO_STRING, fenced_blocks
from tools.netns import NetAudit

from _infra import skip_unless_available, skip_unless_loopback_namespace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "research-wiki" / "guides" / "running-on-a-cluster.md"
THIS_MODULE = ".venv/bin/python -m pytest -q tests/unit/test_cluster_guide.py"


def _first_runnable() -> str:
    blocks = [b for b in fenced_blocks(GUIDE.read_text(encoding="utf-8")) if b.info == INFO_STRING]
    assert blocks, f"{GUIDE.name} has no `{INFO_STRING}` block: its first example must be one"
    return blocks[0].code


def test_the_first_example_is_complete_and_stays_on_loopback() -> None:
    """No placeholder and no address but loopback, read from the text itself."""
    code = _first_runnable()
    for placeholder in ("MyParser", "make_shared_store", "MySink", "TEXTS", "...", "HEAD_IP"):
        assert placeholder not in code, placeholder
    assert 'os.environ["RAY_USAGE_STATS_ENABLED"] = "0"' in code
    assert 'os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"' in code
    assert code.index("RAY_USAGE_STATS_ENABLED") < code.index("import ray")
    assert "ray.cluster_utils import Cluster" in code
    assert "reason.value" in code or ".value if" in code  # the stop reason's value is printed


def _ray_starts(code: str) -> list[tuple[str, ast.Call]]:
    """Every call in ``code`` that starts or joins a Ray node: ``Cluster(...)``,
    ``<cluster>.add_node(...)`` and ``ray.init(...)``."""
    starts = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("Cluster", "add_node", "init"):
            starts.append((name, node))
    return starts


def _literal_keyword(call: ast.Call, name: str) -> object:
    for keyword in call.keywords:
        if keyword.arg == name:
            return ast.literal_eval(keyword.value)
    return None


def test_every_ray_node_of_the_first_example_is_given_the_loopback_address() -> None:
    """The spec's rule (scale-out: "every node must be started with
    node_ip_address="127.0.0.1""), read from the calls themselves, not from a variable a later
    edit could change: the head's ``head_node_args``, each ``add_node`` and the driver's
    ``ray.init``."""
    starts = _ray_starts(_first_runnable())
    assert sorted(name for name, _ in starts) == ["Cluster", "add_node", "init"], starts
    for name, call in starts:
        if name == "Cluster":
            head = _literal_keyword(call, "head_node_args")
            assert isinstance(head, dict), "Cluster(head_node_args=...) must be a literal dict"
            assert head.get("node_ip_address") == "127.0.0.1", head
        elif name == "add_node":
            assert _literal_keyword(call, "node_ip_address") == "127.0.0.1"
        else:
            assert _literal_keyword(call, "_node_ip_address") == "127.0.0.1"


def test_the_first_example_runs_twenty_runs_on_two_loopback_nodes(tmp_path: Path) -> None:
    skip_unless_available(
        importlib.util.find_spec("ray") is not None,
        what="Ray (the ray extra)",
        how_to_install="pip install -e '.[ray]' (make install)",
    )
    skip_unless_loopback_namespace(what="the cluster guide's example", command=THIS_MODULE)
    script = tmp_path / "cluster_example.py"
    script.write_text(_first_runnable(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # The project's audit hook in the script and in every Python process Ray starts from it
    # (they inherit PYTHONPATH): it records each reach for an address off loopback.
    audit = NetAudit()
    try:
        env.update(audit.environment([p for p in [env.get("PYTHONPATH")] if p]))
        process = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        attempts = [str(a) for a in audit.attempts()]
        armed = audit.armed_pids()
    finally:
        audit.close()
    assert process.returncode == 0, f"--- stdout\n{process.stdout}--- stderr\n{process.stderr}"
    lines = process.stdout.splitlines()
    assert lines[0] == "nodes: ['127.0.0.1', '127.0.0.1']"
    runs = lines[1:]
    assert len(runs) == 20
    assert all(": final_answer, " in line for line in runs), runs
    assert "StopReason." not in process.stdout
    answers = {line.split()[1].rstrip(":"): line.rsplit(", ", 1)[1] for line in runs}
    assert answers == {f"square-{n}": f"{n} squared is {n * n}" for n in range(20)}
    assert len(list((tmp_path / "runs").glob("square-*.jsonl"))) == 20
    assert len(armed) > 2, f"the audit hook ran in {len(armed)} processes only"
    assert attempts == [], "the example reached off loopback:\n" + "\n".join(attempts)
