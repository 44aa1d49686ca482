"""The HTML viewer in a real headless Chromium (issue 16): ``python -m polyloop html`` on the
demo's logs plus an unfinished run, loaded as a ``file://`` page.

The browser is Debian's ``chromium``, started by the test with the prescribed flags and a
fresh profile, driven over the DevTools protocol on its loopback debugging port
(``tests/integration/_cdp.py``). The page must load with no console error, no uncaught
exception and no error log entry; every step of every demo run must be rendered visibly; the
unfinished run must show its resume plan and, parked at a ``NEVER`` action, what is in doubt
and the ``resolve`` commands (issue 21); the page's one script must work (expand all opens
every collapsible part). The page references nothing outside itself, so nothing is fetched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _cdp import Browser, chromium_path

from _infra import skip_unless_available

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
UNFINISHED = ROOT / "tests" / "fixtures" / "logs-0.1.0" / "u2-dangling-never-action.jsonl"


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """The page for the demo's six runs and one unfinished run; steps per section id."""
    runs = tmp_path_factory.mktemp("viewer") / "runs"
    demo = subprocess.run(
        [sys.executable, "-m", "tools.demo", "--runs-dir", str(runs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "python -m polyloop html" in demo.stdout  # the demo names the viewer command
    shutil.copy(UNFINISHED, runs)
    page = runs.parent / "viewer.html"
    html = subprocess.run(
        [sys.executable, "-m", "polyloop", "html", str(runs), "-o", str(page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert html.returncode == 0, html.stderr
    steps = {}
    for log in sorted(runs.glob("*.jsonl")):
        records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
        finish = [r for r in records if r["record"] == "run_finished"]
        completed = sum(1 for r in records if r["record"] == "step_completed")
        if finish:
            assert len(finish[0]["result"]["steps"]) == completed
        steps[f"run-{log.stem}"] = completed
    assert len(steps) == 7
    return page, steps


def test_the_viewer_loads_cleanly_and_shows_every_step_and_the_resume_plan(
    viewer: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    binary = chromium_path()
    skip_unless_available(
        binary is not None,
        what="headless Chromium (/usr/bin/chromium)",
        how_to_install="apt-get install -y chromium",
    )
    assert binary is not None
    page, steps = viewer
    with Browser(binary, tmp_path / "profile") as browser:
        browser.call("Runtime.enable")
        browser.call("Log.enable")
        browser.call("Page.enable")
        browser.call("Page.navigate", url=page.as_uri())
        browser.wait_for_event("Page.loadEventFired")

        assert browser.evaluate("document.title") == "polyloop runs (7)"
        rows = browser.evaluate(
            "[...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)"
        )
        demo_runs = ["r1-total", "r2-question", "r3-sloppy", "r4-budget", "r5-kill-safe"]
        # The unfinished fixture is a prefix of the demo's r6, so its rows carry that run id.
        assert sorted(rows) == sorted([*demo_runs, "r6-kill-never", "r6-kill-never"])
        rendered = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section.run')].map(s => "
            "[s.id, [...s.querySelectorAll('li.step:not(.incomplete)')]"
            ".filter(li => li.getClientRects().length > 0).length]))"
        )
        assert rendered == steps  # every completed step of every run, visibly rendered

        badges = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section.run')].map(s => "
            "[s.id, s.querySelector('h2 .badge').textContent]))"
        )
        assert badges["run-r4-budget"] == "step_budget"
        assert badges["run-u2-dangling-never-action"] == "unfinished"

        plans = browser.evaluate(
            "[...document.querySelectorAll('.resume-plan')].map(p => "
            "[p.closest('section').id, p.innerText, p.getClientRects().length > 0])"
        )
        # Two runs are in doubt: the copied 0.1.0 log and the demo's killed NEVER run, which
        # resume now leaves open to be settled (design 0206).
        by_section = {section: (text, visible) for section, text, visible in plans}
        assert set(by_section) == {"run-u2-dangling-never-action", "run-r6-kill-never"}
        text, visible = by_section["run-u2-dangling-never-action"]
        assert visible
        assert "resume would stop the run as resume_state_unknown" in text
        assert "step 3's action has no result and must not be repeated (never)" in text

        # The run is parked at a NEVER action: the page says what is in doubt and how a
        # person settles it (issue 21).
        doubts = browser.evaluate(
            "[...document.querySelectorAll('.in-doubt')].map(d => [d.closest('section').id, "
            "d.dataset.resultId, d.innerText, d.getClientRects().length > 0])"
        )
        assert len(doubts) == 2
        section, result_id, text, visible = next(
            d for d in doubts if d[0] == "run-u2-dangling-never-action"
        )
        assert (section, result_id, visible) == ("run-u2-dangling-never-action", "a3", True)
        assert "python -m polyloop resolve" in text
        assert "--result-id a3 --not-executed --by NAME" in text

        closed_before = browser.evaluate("document.querySelectorAll('details:not([open])').length")
        assert closed_before > 0
        browser.evaluate(
            "document.querySelector('#run-r1-total button[data-open=\"1\"]').click(); true"
        )
        closed_after = browser.evaluate(
            "document.querySelectorAll('#run-r1-total details:not([open])').length"
        )
        assert closed_after == 0

        # Nothing but the page itself was loaded.
        resources = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        assert resources == []
        assert browser.problems() == []
