"""A run's finish record repeats its steps without encoding them again, byte for byte.

``polyloop.stores._records.StepLines`` (design 0214) keeps the text of each step as its
``StepCompleted`` line was encoded and splices those texts into the run's ``RunFinished``.
Every shipped lease writes through it. The promise pinned here: every line it returns is
exactly ``encode_line``'s (checksums included), for text that stresses the encoder (non-ASCII,
surrogates, the splice keys themselves inside strings), and it falls back to encoding in full
whenever the finish's steps are not the very objects it kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest

from polyloop import serialization
from polyloop.session import run
from polyloop.stores import JsonlRunStore
from polyloop.stores._records import StepLines, decode_line, encode_line
from polyloop.types import (
    ActionOutcome,
    ActionStatus,
    NativeToolCall,
    RunFinished,
    RunResult,
    StepCompleted,
    StepRecord,
    StopReason,
    Usage,
)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.bench._common import Workload  # noqa: E402

pytestmark = pytest.mark.unit

RUN = "r1"
TRICKY = [
    "plain",
    'quotes " and the keys themselves: "step": {} "steps": [] , "step": {',
    "non-ASCII: caf\u00e9 \u4e2d\u6587 \U0001f600",
    "surrogates: \ud83d\ude00 alone \ud800 and \udfff",
    "control \x00 \x1f and backslash \\",
]


def _step(index: int, text: str) -> StepRecord:
    return StepRecord(
        step_idx=index,
        raw_output=text,
        content_chars=len(text),
        thinking_chars=0,
        action=text,
        parse_ok=True,
        parse_error=None,
        observation=text,
        observation_is_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=100 + index,
        call_id=None,
        step_wall_ms=index,
        action_status=ActionStatus.EXECUTED,
        usage=Usage(prompt_tokens=3, completion_tokens=4) if index % 2 else None,
        model_ms=1,
        action_ms=2,
        tool_calls=(NativeToolCall(id=f"c{index}", name="t", arguments=text),),
    )


def _completed(step: StepRecord) -> StepCompleted:
    outcome = ActionOutcome(
        status=ActionStatus.EXECUTED,
        observation=step.observation,
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    )
    return StepCompleted(
        run_id=RUN, result_id=f"a{step.step_idx}", action_outcome=outcome, step=step
    )


def _finished(steps: tuple[StepRecord, ...], answer: str) -> RunFinished:
    result = RunResult(
        run_id=RUN, stop_reason=StopReason.FINAL_ANSWER, final_answer=answer, steps=steps
    )
    return RunFinished(run_id=RUN, result=result)


@pytest.mark.parametrize("answer", TRICKY)
def test_every_line_is_encode_lines_and_the_finish_is_spliced(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = StepLines()
    steps = tuple(_step(index, text) for index, text in enumerate(TRICKY))
    for step in steps:
        record = _completed(step)
        assert lines.encode(record, StepCompleted, "w") == encode_line(record, StepCompleted, "w")
    record = _finished(steps, answer)
    expected = encode_line(record, RunFinished, "w")
    encoded_steps = [0]
    real = serialization._step_record_fields

    def counted(step: StepRecord) -> dict[str, object]:
        encoded_steps[0] += 1
        return real(step)

    monkeypatch.setattr(serialization, "_step_record_fields", counted)
    assert lines.encode(record, RunFinished, "w") == expected
    assert encoded_steps[0] == 0, "the finish encoded its steps again"
    assert decode_line(expected[:-1], run_id=RUN, line_number=1) == record


def test_a_finish_with_other_step_objects_is_encoded_in_full() -> None:
    """Equal steps that are not the objects kept (a resumed run rebuilds them from its log),
    fewer steps, or a step kept twice: the full encoding, the same bytes."""
    lines = StepLines()
    steps = tuple(_step(index, "x") for index in range(3))
    for step in steps:
        lines.encode(_completed(step), StepCompleted, "w")
    copies = tuple(dataclasses.replace(step) for step in steps)
    for variant in (copies, steps[:2], (*steps, steps[2])):
        record = _finished(variant, "done")
        assert lines.encode(record, RunFinished, "w") == encode_line(record, RunFinished, "w")


def test_a_wrong_record_is_refused_as_encode_line_refuses_it() -> None:
    lines = StepLines()
    step = _step(0, "x")
    with pytest.raises(TypeError) as ours:
        lines.encode(step, StepCompleted, "Lease.write_step_completed")
    with pytest.raises(TypeError) as theirs:
        encode_line(step, StepCompleted, "Lease.write_step_completed")
    assert str(ours.value) == str(theirs.value)


def test_a_session_run_stores_exactly_the_canonical_lines(tmp_path: Path) -> None:
    """Through a lease, as the session writes: every stored line re-encodes to itself, the
    finish included (the benchmark's workload, 30 steps; on the JSONL store, whose lease
    encodes through ``StepLines`` on every write, as the PostgreSQL store's does)."""
    workload = Workload.build()
    store = JsonlRunStore(directory=tmp_path)
    result = asyncio.run(run(workload.definition(store), workload.request(RUN, 30)))
    assert len(result.steps) == 30
    log = asyncio.run(store.read_log(RUN))
    assert log.finished is not None
    stored = [encode_line(entry.record, type(entry.record), "w") for entry in log.entries]
    written = (tmp_path / f"{RUN}.jsonl").read_bytes().splitlines(keepends=True)
    assert stored == written
