"""``python -m polyloop verify`` and the soak scoreboard never disagree about a log (issue 16).

Both judge a log's structure with the same two library functions (the store's line codec and
``polyloop.session.check_log``). This test binds it on real runs of the soak's nine fault
classes and on logs broken on purpose from them: every crash prefix (what a kill at each record
leaves, torn tails included), every record dropped, duplicated or swapped with its neighbour,
a foreign run id, an edited replay policy, a renumbered step, garbage lines, and unanswered
intents before finishes whose stop reasons do or do not explain them. For each log the verdict
(breached or not) and the line of the first breach must be the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _soak_support import ROOT, write_line
from tools.soak.scoreboard import evaluate

from polyloop.inspect import EXIT_FINDING, EXIT_OK, main
from polyloop.inspect._verify import verify_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STRUCTURAL = ("lines_decode", "log_consistent")
Mutation = Callable[[list[bytes]], list[bytes] | None]


@pytest.fixture(scope="module")
def fault_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("fault-runs")
    command = [sys.executable, "-m", "tools.soak.faults", "--runs-dir", str(runs)]
    done = subprocess.run(
        [*command, "--budget-calls", "400"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return runs


def _scoreboard_verdict(runs_dir: Path, run_id: str) -> tuple[bool, int | None]:
    board = evaluate(runs_dir)
    breaches = [
        evidence
        for check in board.checks
        if check.name in STRUCTURAL
        for evidence in check.breaches
        if evidence.run_id == run_id
    ]
    lines = [int(e.where.split()[1]) for e in breaches if e.where.startswith("line ")]
    return bool(breaches), min(lines) if lines else None


def _verify_verdict(log: Path) -> tuple[bool, int | None]:
    verdict = verify_path(log)
    return not verdict.ok, verdict.line


def _lines(log: Path) -> list[bytes]:
    return log.read_bytes().split(b"\n")[:-1]


def _edit(line: bytes, **changes: Any) -> bytes:
    payload = json.loads(line)
    payload.update(changes)
    return _sealed(payload)


def _sealed(payload: dict[str, Any]) -> bytes:
    """The payload as a line whose checksum (design 0162) matches: these cases test what the
    two verdicts say about a log's *content*, as if a buggy writer had produced it."""
    return write_line(payload)


def _mutations(lines: list[bytes]) -> Iterator[tuple[str, bytes]]:
    """(name, whole file bytes) of every broken-on-purpose variant of one log."""

    def whole(parts: list[bytes], tail: bytes = b"") -> bytes:
        return b"".join(part + b"\n" for part in parts) + tail

    count = len(lines)
    for k in range(1, count):
        yield f"prefix-{k}", whole(lines[:k])
        yield f"torn-{k}", whole(lines[:k], lines[k][: len(lines[k]) // 2])
    for i in range(count):
        yield f"drop-{i}", whole(lines[:i] + lines[i + 1 :])
        yield f"duplicate-{i}", whole(lines[: i + 1] + lines[i:])
        if i + 1 < count:
            swapped = list(lines)
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            yield f"swap-{i}", whole(swapped)
        record = json.loads(lines[i])
        yield f"foreign-{i}", whole([*lines[:i], _edit(lines[i], run_id="other"), *lines[i + 1 :]])
        if record["record"] == "intent":
            flipped = "safe" if record["replay_policy"] == "never" else "never"
            edited = _edit(lines[i], replay_policy=flipped)
            yield f"policy-{i}", whole([*lines[:i], edited, *lines[i + 1 :]])
        if record["record"] == "step_completed":
            step = {**record["step"], "step_idx": record["step"]["step_idx"] + 7}
            edited = _edit(lines[i], step=step)
            yield f"renumber-{i}", whole([*lines[:i], edited, *lines[i + 1 :]])
    yield "garbage-middle", whole([*lines[:2], b"{not json", *lines[2:]])
    yield "garbage-end", whole([*lines, b"\xff\xfe"])
    finish = json.loads(lines[-1])
    if finish["record"] == "run_finished":
        # An unanswered model intent for the next step right before the finish, under every
        # stop reason: only cancelled (and resume_state_unknown for a never intent) explain it.
        steps = sum(1 for line in lines if json.loads(line)["record"] == "step_completed")
        model = next(
            json.loads(line)
            for line in lines
            if json.loads(line)["record"] == "intent" and json.loads(line)["kind"] == "model_call"
        )
        dangling = _sealed({**model, "call_index": steps, "result_id": f"m{steps}"})
        for reason in ("cancelled", "resume_state_unknown", "step_budget", "env_error"):
            result = {**finish["result"], "stop_reason": reason, "final_answer": None}
            ending = _sealed({**finish, "result": result})
            yield f"dangling-before-{reason}", whole([*lines[:-1], dangling, ending])


def test_verify_and_the_scoreboard_agree_on_fault_runs_and_broken_logs(
    fault_runs: Path, tmp_path: Path
) -> None:
    logs = sorted(p for p in fault_runs.glob("*.jsonl") if not p.name.endswith(".events.jsonl"))
    assert len(logs) >= 9, "every fault class leaves at least one run"
    judged = breached = 0
    disagreements = []
    for log in logs:
        run_id = log.name.removesuffix(".jsonl")
        cases = [("as-run", log.read_bytes()), *_mutations(_lines(log))]
        for name, content in cases:
            case_dir = tmp_path / f"{run_id}--{name}"
            case_dir.mkdir()
            case_log = case_dir / log.name
            case_log.write_bytes(content)
            by_verify = _verify_verdict(case_log)
            by_scoreboard = _scoreboard_verdict(case_dir, run_id)
            judged += 1
            breached += by_verify[0]
            if by_verify != by_scoreboard:
                disagreements.append((run_id, name, by_verify, by_scoreboard))
            if name == "as-run":
                assert not by_verify[0], (run_id, verify_path(case_log).describe())
    assert disagreements == []
    # The set is not vacuous: many logs pass and many breach, on many different lines.
    assert judged > 500
    assert 0.2 * judged < breached < 0.9 * judged


def test_the_cli_verify_exit_status_follows_the_same_verdict(
    fault_runs: Path, tmp_path: Path
) -> None:
    code = main(["verify", str(fault_runs), "--quiet"])
    assert code == EXIT_OK
    broken = tmp_path / "broken"
    broken.mkdir()
    log = next(p for p in sorted(fault_runs.glob("crash_b-*.jsonl")) if ".events." not in p.name)
    lines = _lines(log)
    # The log's last execution written twice (its resume's resume_stopped mark, design 0231,
    # may follow it: that record is not an execution).
    last = next(line for line in reversed(lines) if json.loads(line)["record"] == "intent")
    (broken / log.name).write_bytes(b"".join(line + b"\n" for line in [*lines, last]))
    assert main(["verify", str(broken)]) == EXIT_FINDING
    assert _scoreboard_verdict(broken, log.name.removesuffix(".jsonl")) == (True, len(lines) + 1)
