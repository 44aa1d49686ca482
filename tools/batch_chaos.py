"""Kill a batch driver with SIGKILL at random moments and check what the store holds after.

``kill_storm(place, ...)`` writes ``items`` tasks to a JSONL file and runs
``python -m polyloop batch run`` on them (the scripted agent of ``tests/_batch_agents.py``:
each run calls a ``never``-replay tool that appends the item's key to a ledger file, then
answers; every ``fail_every``-th item's first attempt fails its second model call, so it is
retried). Each start is killed (SIGKILL) a random moment after the ledger has grown, so the
kill lands while runs are in flight; after ``kills`` kills the command is run once more to its
end. Then ``score`` reads the store:

* every item has a row (0 items lost), its last attempt ``final_answer`` or in doubt
  (``resume_state_unknown``: a kill between a ``never`` action's intent and its result; a
  figure, not a failure, scale-out.md), and exactly one of its runs ends in ``final_answer``;
* every earlier attempt of an item stopped as ``llm_error`` (its retry) or ``cancelled``;
* no key is twice in the ledger (0 ``never`` effects executed twice);
* every log passes ``polyloop.session.check_log``;
* the report the last driver wrote equals the one rebuilt from the store
  (``python -m polyloop batch PLACE --batch-id ID --json``).

Used by ``tests/integration/test_batch_kills.py`` (CI-sized) and by
``python -m tools.bench.batch --chaos`` (the figure in ``research-wiki/reference/reliability.md``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AGENT = "tests._batch_agents:make_agent"


@dataclass
class Storm:
    """What a kill storm did and found (``problems`` empty: every check held)."""

    items: int
    kills: int = 0
    starts: int = 0
    in_doubt: int = 0
    retried: int = 0
    ledger_lines: int = 0
    runs: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def write_items(path: Path, items: int, fail_every: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for index in range(items):
            flag = " fail-once" if fail_every and index % fail_every == 0 else ""
            out.write(json.dumps({"id": f"i{index}", "prompt": f"i{index}{flag}"}) + "\n")


def _command(place: str, items: Path, batch_id: str, concurrency: int, report: Path) -> list[str]:
    return [
        sys.executable, "-m", "polyloop", "batch", "run", "--items", str(items), "--agent",
        AGENT, "--batch-id", batch_id, "--store", place, "--concurrency", str(concurrency),
        "--key-field", "id", "--backoff", "0", "--quiet", "--lease-seconds", "0.5",
        "--report-dir", str(report),
    ]  # fmt: skip


def _environment(ledger: Path, delay: float) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "POLYLOOP_BATCH_LEDGER": str(ledger),
        "POLYLOOP_BATCH_DELAY": str(delay),
    }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _one_start(command: list[str], env: dict[str, str], ledger: Path, rng: random.Random) -> bool:
    """Start the command, kill it once the ledger grew and a random moment passed; ``True``
    when it was killed, ``False`` when it ended first (then it must have exited 0 or 1)."""
    before = _size(ledger)
    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 3
    while _size(ledger) == before and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.15))
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return True


def kill_storm(
    place: str,
    work: Path,
    *,
    items: int,
    kills: int,
    concurrency: int = 4,
    fail_every: int = 7,
    delay: float = 0.05,
    seed: int = 0,
) -> Storm:
    """Run the batch under ``kills`` SIGKILLs, then to its end, and ``score`` the store."""
    began = time.monotonic()
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    item_file, ledger, report = work / "items.jsonl", work / "ledger.txt", work / "report"
    write_items(item_file, items, fail_every)
    batch_id = f"storm{seed}"
    command = _command(place, item_file, batch_id, concurrency, report)
    env = _environment(ledger, delay)
    storm = Storm(items=items)
    while storm.kills < kills:
        storm.starts += 1
        if _one_start(command, env, ledger, rng):
            storm.kills += 1
        elif storm.starts > kills * 3:
            break  # the batch keeps ending before a kill lands: make it bigger
    storm.starts += 1
    final = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if final.returncode not in (0, 1):
        storm.problems.append(f"the last start exited {final.returncode}: {final.stderr[-2000:]}")
    asyncio.run(score(storm, place, batch_id, report, ledger, env))
    storm.seconds = time.monotonic() - began
    return storm


def _rebuilt(place: str, batch_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    shown = subprocess.run(
        [sys.executable, "-m", "polyloop", "batch", place, "--batch-id", batch_id, "--json"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]


async def score(
    storm: Storm, place: str, batch_id: str, report: Path, ledger: Path, env: dict[str, str]
) -> None:
    """The checks of the module docstring, appended to ``storm.problems``."""
    from polyloop.batch._cli import _opened, _run_ids
    from polyloop.session import check_log

    rebuilt = _rebuilt(place, batch_id, env)
    written = [json.loads(line) for line in (report / "report.jsonl").read_text().splitlines()]
    by_key = lambda rows: sorted(rows, key=lambda row: row["key"])  # noqa: E731
    if by_key(written) != by_key(rebuilt):
        storm.problems.append("the written report differs from the one rebuilt from the store")
    keys = {f"i{index}" for index in range(storm.items)}
    if {row["key"] for row in rebuilt} != keys:
        storm.problems.append(f"items lost: {sorted(keys - {row['key'] for row in rebuilt})[:5]}")
    effects = _ledger(ledger)
    storm.ledger_lines = sum(effects.values())
    twice = [key for key, count in effects.items() if count > 1]
    if twice:
        storm.problems.append(f"never effects executed twice: {twice[:5]}")
    async with _opened(place, pool_size=2) as store:
        run_ids = await _run_ids(store, place, batch_id)
        storm.runs = len(run_ids)
        finals: Counter[str] = Counter()
        for run_id in run_ids:
            log = await store.read_log(run_id)
            breach = check_log(log, run_id)
            if breach is not None:
                storm.problems.append(f"{run_id}: {breach}")
            _judge_run(storm, run_id, log, rebuilt, finals)
    storm.in_doubt = sum(row["stop_reason"] == "resume_state_unknown" for row in rebuilt)
    storm.retried = sum(row["attempts"] > 1 for row in rebuilt)
    done = {row["key"] for row in rebuilt if row["stop_reason"] == "final_answer"}
    if any(finals[key] != 1 for key in done) or any(finals[k] > 1 for k in finals):
        storm.problems.append("an item has more or fewer than one final_answer run")


def _ledger(ledger: Path) -> Counter[str]:
    return Counter(ledger.read_text().split()) if ledger.exists() else Counter()


def _judge_run(
    storm: Storm, run_id: str, log: Any, rows: list[dict[str, Any]], finals: Counter[str]
) -> None:
    from polyloop.batch import parse_run_id

    parsed = parse_run_id(run_id.split("--")[0], run_id)
    if parsed is None:
        storm.problems.append(f"{run_id}: not a run id of the batch")
        return
    key, attempt = parsed
    last = next((row for row in rows if row["key"] == key), None)
    reason = None if log.finished is None else log.finished.result.stop_reason.value
    if reason == "final_answer":
        finals[key] += 1
    if last is None or last["attempts"] == attempt:
        return
    if reason not in ("llm_error", "cancelled"):
        storm.problems.append(f"{run_id}: an earlier attempt ended as {reason}, not retryable")
