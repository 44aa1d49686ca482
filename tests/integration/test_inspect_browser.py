"""The HTML viewer in a real headless Chromium (issue 16): ``python -m polyloop html`` on the
demo's logs plus an unfinished run, loaded as a ``file://`` page.

The browser is Debian's ``chromium``, started by the test with the prescribed flags and a
fresh profile, driven over the DevTools protocol on its loopback debugging port
(``tests/integration/_cdp.py``). The page must load with no console error, no uncaught
exception and no error log entry; every step of every demo run must be rendered visibly; the
unfinished run must show its resume plan and, parked at a ``NEVER`` action, what is in doubt
and the ``resolve`` commands (issue 21); the page's one script must work (expand all opens
every collapsible part). The page references nothing outside itself, so nothing is fetched.

Issue 26 item 6 (design 0215): a long run written by the library (``tests/_viewer_runs.py``:
24 steps of native tool calls, killed inside a model call and resumed) is added to the
directory. Its section must show its question and instructions, its resume mark (on the card
and in the timeline), the timeline with one column per step, its near-identical steps folded
(hidden until their fold is opened), and no empty "reply" row; the demo's resumed ``r5`` must
show its resume mark. Opened at ``#run-<file>`` the page shows that run alone at the top
(before, such an anchor left a blank screen), and at a folded step's anchor the fold opens.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from _cdp import CHROMIUM_FLAGS, Browser, chromium_path

from _decided_runs import REASON, write_decided_runs
from _infra import skip_unless_available
from _viewer_runs import CRASH_STEP, QUESTION, STEPS, SURVEY_RUN, write_survey_run

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
    import asyncio

    asyncio.run(write_survey_run(runs))
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
    assert len(steps) == 8
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

        assert browser.evaluate("document.title") == "polyloop runs (8)"
        rows = browser.evaluate(
            "[...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run)"
        )
        demo_runs = ["r1-total", "r2-question", "r3-sloppy", "r4-budget", "r5-kill-safe"]
        # The unfinished fixture is a prefix of the demo's r6, so its rows carry that run id.
        assert sorted(rows) == sorted([*demo_runs, "r6-kill-never", "r6-kill-never", SURVEY_RUN])
        # Every completed step of every run is on the page, visibly rendered unless it sits in
        # a closed fold of near-identical steps.
        rendered = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('section.run')].map(s => "
            "[s.id, [...s.querySelectorAll('li.step:not(.incomplete)')].filter(li => "
            "li.checkVisibility() || li.closest('li.fold details:not([open])')).length]))"
        )
        assert rendered == steps

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


def _browser_or_skip() -> str:
    binary = chromium_path()
    skip_unless_available(
        binary is not None,
        what="headless Chromium (/usr/bin/chromium)",
        how_to_install="apt-get install -y chromium",
    )
    assert binary is not None
    return binary


def _open(browser: Browser, url: str) -> None:
    browser.call("Runtime.enable")
    browser.call("Log.enable")
    browser.call("Page.enable")
    browser.call(
        "Emulation.setDeviceMetricsOverride", width=1200, height=900, deviceScaleFactor=1,
        mobile=False,
    )  # fmt: skip
    browser.call("Page.navigate", url=url)
    browser.wait_for_event("Page.loadEventFired")


def test_the_viewer_shows_context_resume_marks_timeline_and_folded_steps(
    viewer: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    page, _ = viewer
    with Browser(_browser_or_skip(), tmp_path / "profile") as browser:
        _open(browser, page.as_uri())
        section = f"document.getElementById('run-{SURVEY_RUN}')"
        question = browser.evaluate(
            f"{section}.querySelector('.context-part[data-level=goal]').innerText"
        )
        assert QUESTION in question
        assert "You compare prices" in browser.evaluate(
            f"{section}.querySelector('.context-part[data-level=run]').innerText"
        )
        marks = browser.evaluate(
            f"[...{section}.querySelectorAll('div.resume-mark')].map(m => [m.closest('li')"
            ".dataset.step, m.dataset.plan, m.dataset.epoch, m.checkVisibility(), "
            "m.innerText])"
        )
        assert [m[:4] for m in marks] == [[str(CRASH_STEP), "redo_model_call", "2", True]]
        assert "Resumed here" in marks[0][4]
        demo_mark = browser.evaluate(
            "[...document.querySelectorAll('#run-r5-kill-safe div.resume-mark')]"
            ".map(m => [m.dataset.plan, m.checkVisibility()])"
        )
        assert demo_mark == [["replay_last_action", True]]
        # The demo's r6 was resumed and stopped again in doubt: since schema 1.9 that resume
        # is on record (resume_stopped, design 0231), on its card and in the legend.
        r6 = browser.evaluate(
            "(() => { const s = document.getElementById('run-r6-kill-never'); return [[...s"
            ".querySelectorAll('div.resume-mark')].map(m => [m.dataset.plan, m.checkVisibility()"
            ", m.innerText.includes('stopped again as resume_state_unknown')]), s.innerText"
            ".includes('1 resume')]; })()"
        )
        assert r6 == [[["stop_unknown", True, True]], True]
        timeline = browser.evaluate(
            f"(() => {{ const svg = {section}.querySelector('svg.run-timeline'); "
            "const box = svg.getBoundingClientRect(); return [svg.querySelectorAll('a.step-col')"
            ".length, svg.querySelectorAll('g.resume-mark').length, box.width > 200, "
            "box.height > 50, svg.compareDocumentPosition("
            f"{section}.querySelector('ol.timeline')) & Node.DOCUMENT_POSITION_FOLLOWING]; }})()"
        )
        assert timeline == [STEPS, 1, True, True, 4]  # drawn above the cards
        answer_first = browser.evaluate(
            f"{section}.querySelector('.final-answer').compareDocumentPosition("
            f"{section}.querySelector('.context')) & Node.DOCUMENT_POSITION_FOLLOWING"
        )
        assert answer_first == 4
        folds = browser.evaluate(
            f"[...{section}.querySelectorAll('li.fold')].map(f => [f.dataset.first, "
            "f.dataset.last, [...f.querySelectorAll('li.step')].filter(li => "
            "li.checkVisibility()).length])"
        )
        assert folds
        assert all(visible == 0 for _, _, visible in folds)
        hidden = sum(int(last) - int(first) + 1 for first, last, _ in folds)
        shown = browser.evaluate(
            f"[...{section}.querySelectorAll('li.step')].filter(li => li.checkVisibility()).length"
        )
        assert shown == STEPS - hidden
        browser.evaluate(f"{section}.querySelector('li.fold summary').click(); true")
        opened = browser.evaluate(
            f"[...{section}.querySelector('li.fold').querySelectorAll('li.step')].every(li => "
            "li.checkVisibility())"
        )
        assert opened
        summaries = browser.evaluate(
            f"[...{section}.querySelectorAll('summary')].map(s => s.textContent)"
        )
        assert not [s for s in summaries if s.startswith("reply (0 chars)")]
        assert browser.problems() == []


def test_a_run_anchor_shows_that_run_at_the_top_and_a_step_anchor_opens_its_fold(
    viewer: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    page, _ = viewer
    with Browser(_browser_or_skip(), tmp_path / "profile") as browser:
        _open(browser, f"{page.as_uri()}#run-r5-kill-safe")
        seen = browser.evaluate(
            "(() => { const s = document.getElementById('run-r5-kill-safe'); "
            "const hit = document.elementFromPoint(400, 200); "
            "return [s.getBoundingClientRect().top < 100, s.contains(hit), "
            "[...document.querySelectorAll('section.run')].filter(x => "
            "x.getClientRects().length > 0).map(x => x.id), "
            "document.getElementById('runs').getClientRects().length, "
            "document.documentElement.scrollHeight - window.scrollY > 400]; })()"
        )
        assert seen == [True, True, ["run-r5-kill-safe"], 0, True]
        folded = browser.evaluate(f"document.querySelector('#run-{SURVEY_RUN} li.fold li.step').id")
        browser.call("Page.navigate", url=f"{page.as_uri()}#{folded}")
        time.sleep(0.3)  # a fragment navigation fires hashchange, not load
        target = browser.evaluate(
            f"(() => {{ const li = document.getElementById('{folded}'); "
            "const box = li.getBoundingClientRect(); return [li.checkVisibility(), "
            "box.top > -2 && box.top < innerHeight]; })()"
        )
        assert target == [True, True]
        browser.evaluate("document.querySelector('a.all-runs').click(); true")
        time.sleep(0.3)
        assert (
            browser.evaluate(
                "[...document.querySelectorAll('section.run')].filter(x => "
                "x.getClientRects().length > 0).length"
            )
            == 8
        )
        assert browser.problems() == []


def _distinct_rows(png: bytes) -> int:
    """How many different scanlines a PNG written by Chromium has (8-bit RGB or RGBA): a
    blank page has one or two, a page with text has hundreds."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, data, width, channels = 8, b"", 0, 0
    while position < len(png):
        (length,) = struct.unpack(">I", png[position : position + 4])
        kind = png[position + 4 : position + 8]
        body = png[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            width, _, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8, depth
            assert colour in (2, 6), colour
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            data += body
        position += 12 + length
    raw = zlib.decompress(data)
    stride = 1 + width * channels
    return len({raw[i : i + stride] for i in range(0, len(raw), stride)})


def test_a_screenshot_of_a_run_anchor_is_not_blank(
    viewer: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """Issue 26: ``chromium --headless --screenshot page.html#run-...`` drew an empty page (the
    capture missed the scrolled-to section); the anchor now shows its run alone at the top."""
    page, _ = viewer
    shot = tmp_path / "anchor.png"
    done = subprocess.run(
        [
            _browser_or_skip(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,900",
            f"--screenshot={shot}",
            f"{page.as_uri()}#run-r5-kill-safe",
        ],
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert _distinct_rows(shot.read_bytes()) > 100


def test_a_rejected_call_a_settlement_and_a_resume_stopped_in_doubt_read_as_such(
    tmp_path: Path,
) -> None:
    """Issue 36 point 4 (design 0231), in the browser: the runs of ``tests/_decided_runs.py``."""
    import asyncio

    runs = tmp_path / "runs"
    runs.mkdir()
    asyncio.run(write_decided_runs(runs))
    page = tmp_path / "decided.html"
    made = subprocess.run(
        [sys.executable, "-m", "polyloop", "html", str(runs), "-o", str(page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    with Browser(_browser_or_skip(), tmp_path / "profile") as browser:
        _open(browser, page.as_uri())
        rejected = browser.evaluate(
            "(() => { const li = document.querySelector('#run-rejected li.step[data-step=\"0\"]');"
            " return [li.classList.contains('rejected'), li.querySelector('.badge.kind')"
            ".textContent, li.checkVisibility(), li.innerText.includes('decision: rejected'), "
            "li.innerText.includes('a person rejected this call: ' + "
            f"{json.dumps(REASON)}), li.innerText.includes('final answer')]; }})()"
        )
        assert rejected == [True, "rejected", True, True, True, False]
        settled = browser.evaluate(
            "(() => { const li = document.querySelector('#run-settled li.step[data-step=\"0\"]');"
            " const s = li.querySelector('div.settlement'); return [s.dataset.verdict, "
            "s.dataset.source, s.checkVisibility(), li.querySelector('.badge.settled')"
            ".textContent]; })()"
        )
        assert settled == ["executed", "person", True, "settled by person:al"]
        doubt = browser.evaluate(
            "(() => { const s = document.getElementById('run-doubt'); return [[...s"
            ".querySelectorAll('div.resume-mark')].map(m => [m.dataset.plan, "
            "m.checkVisibility()]), s.querySelectorAll('svg g.resume-mark').length, "
            "s.querySelector('.in-doubt').checkVisibility()]; })()"
        )
        assert doubt == [[["stop_unknown", True]], 1, True]
        assert browser.problems() == []
