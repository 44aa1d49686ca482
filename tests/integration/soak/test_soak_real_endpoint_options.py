"""The soak's settings for real endpoints: sampling and client options on the command line
(recorded in every run's snapshot), per-call progress, the model-call report section, and a
report that is still written when SIGINT or SIGTERM interrupts the batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _soak_support import ROOT
from tools.soak.run_soak import describe_failure

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SOAK_BASE_URL", "SOAK_MODEL", "SOAK_API_KEY")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def test_the_real_endpoint_options_reach_the_snapshot_the_progress_and_the_report(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    report = tmp_path / "load.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.soak.run_soak",
            "--scenario",
            "code",
            "--limit",
            "2",
            "--budget-calls",
            "40",
            "--concurrency",
            "1",
            "--runs-dir",
            str(runs),
            "--report",
            str(report),
            "--failure-rate",
            "0",
            "--max-tokens",
            "96",
            "--stop",
            "\\nObservation:",
            "--stop",
            "```\\n\\n",
            "--timeout",
            "42",
            "--stream",
            "--chat-template-hint",
            "gemma",
            "--call-progress",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first = json.loads((runs / "code-t000.jsonl").read_text(encoding="utf-8").splitlines()[0])
    snapshot = first["parameter_snapshot"]
    assert json.loads(snapshot["model_client.sampling"]) == {
        "max_tokens": 96,
        "stop": ["\nObservation:", "```\n\n"],
        "temperature": 0.0,
    }
    assert snapshot["request.binding.soak.timeout_s"] == "42"
    assert snapshot["request.binding.soak.stream"] == "true"
    assert snapshot["request.binding.soak.chat_template_hint"] == "gemma"
    call_lines = [line for line in done.stderr.splitlines() if line.startswith("  call ")]
    assert call_lines, done.stderr
    assert "(code-t000 step 0)" in call_lines[0]
    assert "tok/s" in call_lines[0]
    assert call_lines[-1].startswith(f"  call {len(call_lines)} ")
    text = report.read_text(encoding="utf-8")
    assert "## Model calls" in text
    assert (
        "- settings: max_tokens 96, 2 stop sequences, timeout 42 s, stream on, "
        "chat template hint gemma" in text
    )
    assert f"- calls: {len(call_lines)}; failed: 0; empty replies: 0" in text
    assert "seconds per call: mean" in text
    # Streamed replies carried usage (stream_options.include_usage), so the totals are known.
    assert "- tokens (from " in text
    assert "PARTIAL" not in text


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_batch_still_writes_a_partial_report(
    tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    runs = tmp_path / "runs"
    report = tmp_path / "load.md"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.soak.run_soak",
            "--scenario",
            "code",
            "--limit",
            "6",
            "--budget-calls",
            "200",
            "--concurrency",
            "2",
            "--runs-dir",
            str(runs),
            "--report",
            str(report),
            "--latency",
            "0.3",
            "--jitter",
            "0",
            "--failure-rate",
            "0",
            "--call-progress",
        ],
        cwd=ROOT,
        env=_env(),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    deadline = time.monotonic() + 60
    seen: list[str] = []
    try:
        # Wait for the first finished unit, so the partial report has something in it.
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("[1/"):
                break
        process.send_signal(signum)
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    stderr = "".join(seen) + rest
    assert process.returncode == code, stderr
    assert f"INTERRUPTED by {signum.name}" in stderr
    text = report.read_text(encoding="utf-8")
    assert f"# Soak: normal load (PARTIAL: interrupted by {signum.name})" in text
    assert "units finished before the interruption: " in text
    assert "## Model calls" in text
    finished = [line for line in stderr.splitlines() if line.startswith("[")]
    assert len(finished) >= 1
    assert len(finished) < 6, "the batch was cut short"
    # Every run log the batch started is readable: the cancelled ones end with a finish record.
    for log in runs.glob("*.jsonl"):
        if log.name.endswith(".events.jsonl"):
            continue
        records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
        assert records[-1]["record"] == "run_finished", log.name


def test_a_failure_without_text_is_described_by_its_class_never_empty() -> None:
    assert describe_failure(TimeoutError()) == "TimeoutError"
    assert describe_failure(ValueError("bad")) == "ValueError: bad"
