"""The inspector's command line as issue 36 (point 8; design 0234) asks: ``ls`` and ``verify``
take a directory of run directories and several places; durations read in human units;
counts are plural only when they should be; ``ls --json`` carries the final answer and the
tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest

from polyloop.inspect import main
from polyloop.inspect._load import load_target
from polyloop.inspect._text import ls_lines, render_show
from polyloop.inspect._units import duration_words, plural
from polyloop.parsers import JsonToolCallParser
from polyloop.session import AgentDefinition, RunRequest, run
from polyloop.stores import JsonlRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import Context, Message, ModelReply, ReplayPolicy, Usage

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-1.8"
SIX = ("r1-total", "r2-question", "r3-sloppy", "r4-budget", "r5-kill-safe", "r6-kill-never")


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def demo_tree(root: Path, *names: str) -> Path:
    """``runs/`` as ``make demo`` leaves it, once per name: ``runs/<name>/`` holding the six
    logs, the store's ``.leases/`` and the demo's ``world/`` (a JSON Lines ledger that is not
    a run log)."""
    runs = root / "runs"
    for name in names:
        directory = runs / name
        directory.mkdir(parents=True)
        for run_id in SIX:
            shutil.copy(FIXTURES / f"{run_id}.jsonl", directory / f"{run_id}.jsonl")
        (directory / ".leases").mkdir()
        (directory / ".leases" / "r1-total.lock").write_text("", encoding="utf-8")
        (directory / "world").mkdir()
        (directory / "world" / "ledger.jsonl").write_text(
            '{"arguments": {"item": "apple"}, "pid": 1, "run_id": "r1-total", "tool": "lookup"}\n',
            encoding="utf-8",
        )
    return runs


def test_ls_and_verify_read_a_directory_of_run_directories(tmp_path: Path) -> None:
    runs = demo_tree(tmp_path, "demo-1", "demo-2")
    code, out, err = cli("verify", str(runs))
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "verified 12 logs: 0 breached"
    assert "ledger" not in out
    assert ".leases" not in out
    code, out, err = cli("ls", str(runs))
    assert (code, err) == (0, "")
    rows = out.splitlines()[1:]
    assert len(rows) == 12
    assert [row.split()[-1] for row in rows[:6]] == [
        str(runs / "demo-1" / f"{run_id}.jsonl") for run_id in SIX
    ]
    code, out, _ = cli("ls", "--json", str(runs))
    assert {Path(r["source"]).parent.name for r in json.loads(out)} == {"demo-1", "demo-2"}


def test_a_damaged_log_below_is_reported_not_passed_over(tmp_path: Path) -> None:
    runs = demo_tree(tmp_path, "demo-1")
    (runs / "demo-1" / "broken.jsonl").write_text('{"record": "run_sta\nx\n', encoding="utf-8")
    code, out, _ = cli("verify", str(runs))
    assert code == 1
    assert "BREACH" in out
    assert "broken.jsonl" in out
    code, _, err = cli("ls", str(runs))
    assert code == 1
    assert "unreadable log" in err
    assert "broken.jsonl" in err


def test_an_empty_tree_is_refused_saying_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "runs" / "demo-1" / "world").mkdir(parents=True)
    code, _, err = cli("ls", str(tmp_path / "runs"))
    assert code == 2
    assert "no run logs (*.jsonl files) in this directory or below it" in err


def test_ls_and_verify_take_several_places_in_order(tmp_path: Path) -> None:
    runs = demo_tree(tmp_path, "a")
    one = str(FIXTURES / "r2-question.jsonl")
    code, out, _ = cli("ls", one, str(runs / "a"))
    assert code == 0
    sources = [row.split()[-1] for row in out.splitlines()[1:]]
    assert sources == [one, *(str(runs / "a" / f"{run_id}.jsonl") for run_id in SIX)]
    code, out, _ = cli("verify", "--quiet", one, str(runs))
    assert (code, out.splitlines()[-1]) == (0, "verified 7 logs: 0 breached")
    code, _, err = cli("ls", one, str(tmp_path / "missing"))
    assert code == 2
    assert "missing" in err


@pytest.mark.parametrize(
    ("ms", "words"),
    [
        (0, "0 ms"),
        (999, "999 ms"),
        (1000, "1.0 s"),
        (4260, "4.2 s"),
        (59_999, "59.9 s"),
        (60_000, "1 min 0 s"),
        (254_187, "4 min 14 s"),
        (7_500_000, "2 h 5 min"),
        (273_600_000, "3 d 4 h"),
    ],
)
def test_durations_read_in_human_units(ms: int, words: str) -> None:
    assert duration_words(ms) == words


def test_plurals() -> None:
    assert [plural(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert plural(1, "model call") == "1 model call"


def test_ls_show_verify_and_html_say_durations_and_counts_in_words(tmp_path: Path) -> None:
    [view] = load_target(str(FIXTURES / "r2-question.jsonl")).runs
    slow = dataclasses.replace(view, duration_ms=254_187)
    assert "4 min 14 s" in ls_lines([slow])[1]
    assert "254187" not in ls_lines([slow])[1]
    summary = next(
        line for line in render_show(slow, full=False, limit=None).splitlines()
        if line.startswith("summary:")
    )  # fmt: skip
    assert summary == ("summary: 2 steps, 1 action, 2 model calls, 4 min 14 s of step wall time")
    _, out, _ = cli("verify", str(FIXTURES / "r2-question.jsonl"))
    assert out.splitlines()[-1] == "verified 1 log: 0 breached"
    page = tmp_path / "one.html"
    _, out, _ = cli("html", str(FIXTURES / "r2-question.jsonl"), "-o", str(page))
    assert out.strip() == f"wrote {page} (1 run)"
    assert "1 action ·" in page.read_text(encoding="utf-8")


async def _noop() -> str:
    """Do nothing."""
    return ""


def test_ls_json_carries_the_final_answer_and_the_tokens(tmp_path: Path) -> None:
    replies = [
        ModelReply(
            call_id="c0",
            content='{"final_answer": "4"}',
            usage=Usage(prompt_tokens=120, completion_tokens=7, cached_tokens=100),
        )
    ]
    definition = AgentDefinition(
        model_client=ScriptedModelClient(replies),
        decision_parser=JsonToolCallParser(),
        store=JsonlRunStore(directory=tmp_path),
    )
    request = RunRequest(
        run_id="sum",
        context=Context(goal_level=(Message.user("2 + 2?"),)),
        model_replay_policy=ReplayPolicy.SAFE,
        tools=ToolRegistry([ToolSpec.from_function(_noop)]),
    )
    result = asyncio.run(run(definition, request))
    _, out, _ = cli("ls", "--json", str(tmp_path))
    [listed] = json.loads(out)
    assert listed["final_answer"] == result.final_answer == "4"
    totals = result.totals
    assert listed["tokens"] == {
        "prompt": totals.prompt_tokens,
        "completion": totals.completion_tokens,
        "cached": totals.cached_tokens,
        "steps_without_usage": totals.steps_without_usage,
    } == {"prompt": 120, "completion": 7, "cached": 100, "steps_without_usage": 0}  # fmt: skip
    assert list(listed).index("tokens") == list(listed).index("final_answer") + 1


def test_a_one_record_log_is_one_record(tmp_path: Path) -> None:
    first = (FIXTURES / "r2-question.jsonl").read_bytes().split(b"\n", 1)[0] + b"\n"
    (tmp_path / "r2-question.jsonl").write_bytes(first)
    code, out, _ = cli("verify", str(tmp_path / "r2-question.jsonl"))
    assert code == 0
    assert out.splitlines() == [
        f"ok      {tmp_path / 'r2-question.jsonl'} (1 record)",
        "verified 1 log: 0 breached",
    ]
