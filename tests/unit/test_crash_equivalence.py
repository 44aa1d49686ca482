"""Crash equivalence: cut a real JSONL log at every record boundary and in the middle of every
record, resume, and compare with the run that was never interrupted.

What must hold for every cut:

* bytes that were complete before the cut are never rewritten;
* with only ``SAFE`` executions, the resumed trajectory and stop reason equal the
  uninterrupted ones exactly (the prompts are rebuilt byte for byte from the log);
* with ``NEVER`` executions, the resumed run either equals the uninterrupted one or stops with
  ``RESUME_STATE_UNKNOWN`` exactly when the cut leaves a ``NEVER`` intent without its result,
  and no ``NEVER`` action whose intent survived the cut is ever executed again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, Tally, definition, texts_of, tool_request

from polyloop._recovery import ResumeAction, plan_resume
from polyloop.session import RunIdentityError, resume, run
from polyloop.stores import JsonlRunStore
from polyloop.types import IntentKind, ReplayPolicy, RunResult, StepRecord

pytestmark = pytest.mark.unit

RUN_ID = "crash-1"

SAFE_SCRIPT = ['tool:echo {"text": "a"}', "?", 'tool:echo {"text": "b"}', "final:done"]
NEVER_SCRIPT = [
    'tool:echo {"text": "a"}',
    'tool:write {"text": "n"}',
    "?",
    "tool:nope",
    "final:done",
]


def comparable(steps: tuple[StepRecord, ...]) -> list[StepRecord]:
    """Steps without their timings (wall clock, model and action milliseconds), the only
    fields that may differ between runs."""
    return [
        dataclasses.replace(
            step,
            step_wall_ms=0,
            model_ms=None if step.model_ms is None else 0,
            action_ms=None if step.action_ms is None else 0,
        )
        for step in steps
    ]


def cut_points(raw: bytes) -> list[int]:
    ends = [i + 1 for i, byte in enumerate(raw) if byte == ord("\n")]
    starts = [0, *ends[:-1]]
    middles = [(start + end) // 2 for start, end in zip(starts, ends, strict=True)]
    return sorted({*ends, *middles})


async def uninterrupted(
    tmp_path: Path, script: list[str], policy: ReplayPolicy
) -> tuple[RunResult, bytes, ScriptedModel]:
    store = JsonlRunStore(directory=tmp_path / "full")
    model = ScriptedModel(script)
    result = await run(
        definition(model, store=store), tool_request(Tally(), RUN_ID, model_policy=policy)
    )
    return result, (tmp_path / "full" / f"{RUN_ID}.jsonl").read_bytes(), model


async def resume_cut(
    tmp_path: Path, raw: bytes, cut: int, script: list[str], policy: ReplayPolicy
) -> tuple[RunResult | None, bytes, Tally, ScriptedModel, JsonlRunStore]:
    directory = tmp_path / f"cut-{cut}"
    directory.mkdir()
    (directory / f"{RUN_ID}.jsonl").write_bytes(raw[:cut])
    store = JsonlRunStore(directory=directory)
    tally = Tally()
    model = ScriptedModel(script)
    try:
        result: RunResult | None = await resume(
            definition(model, store=store), tool_request(tally, RUN_ID, model_policy=policy)
        )
    except RunIdentityError:
        result = None
    return result, (directory / f"{RUN_ID}.jsonl").read_bytes(), tally, model, store


def durable_prefix(raw: bytes, cut: int) -> bytes:
    kept = raw[:cut]
    return kept[: kept.rfind(b"\n") + 1]


async def test_safe_run_resumes_to_the_same_trajectory_from_every_cut(tmp_path: Path) -> None:
    full, raw, full_model = await uninterrupted(tmp_path, SAFE_SCRIPT, ReplayPolicy.SAFE)
    full_prompts = [texts_of(c.messages) for c in full_model.calls]
    cuts = cut_points(raw)
    assert len(cuts) > 20
    for cut in cuts:
        result, after, _, model, store = await resume_cut(
            tmp_path, raw, cut, SAFE_SCRIPT, ReplayPolicy.SAFE
        )
        assert after.startswith(durable_prefix(raw, cut)), f"cut {cut}: earlier bytes changed"
        if not durable_prefix(raw, cut):
            assert result is None, "a log cut before RunStarted holds no run to resume"
            continue
        assert result is not None
        resumed_log = await store.read_log(RUN_ID)
        ids = [intent.result_id for intent in resumed_log.intents]
        assert len(ids) == len(set(ids)), f"cut {cut}: a resume wrote a second intent"
        assert result.stop_reason is full.stop_reason, f"cut {cut}"
        assert result.final_answer == full.final_answer
        assert comparable(result.steps) == comparable(full.steps), f"cut {cut}"
        for call in model.calls:
            assert texts_of(call.messages) == full_prompts[call.call_index], (
                f"cut {cut}: the resumed prompt of step {call.call_index} differs"
            )


async def test_never_actions_are_never_executed_twice_from_any_cut(tmp_path: Path) -> None:
    full, raw, _ = await uninterrupted(tmp_path, NEVER_SCRIPT, ReplayPolicy.NEVER)
    unknown_stops = 0
    for cut in cut_points(raw):
        prefix = durable_prefix(raw, cut)
        if not prefix:
            continue
        (tmp_path / f"probe-{cut}").mkdir()
        (tmp_path / f"probe-{cut}" / f"{RUN_ID}.jsonl").write_bytes(prefix)
        before = await JsonlRunStore(directory=tmp_path / f"probe-{cut}").read_log(RUN_ID)
        plan = plan_resume(before, RUN_ID)
        write_intent_survived = any(
            i.kind is IntentKind.ACTION and i.call_index == 1 for i in before.intents
        )

        result, after, tally, _, _ = await resume_cut(
            tmp_path, raw, cut, NEVER_SCRIPT, ReplayPolicy.NEVER
        )
        assert result is not None
        assert after.startswith(prefix)
        if write_intent_survived:
            assert tally.runs.get("write", 0) == 0, f"cut {cut}: the NEVER action ran again"
        if plan.action is ResumeAction.STOP_UNKNOWN:
            unknown_stops += 1
            assert result.stop_reason.value == "resume_state_unknown"
            assert comparable(result.steps) == comparable(full.steps[: len(result.steps)])
        else:
            assert result.stop_reason is full.stop_reason, f"cut {cut}: {plan.action}"
            assert comparable(result.steps) == comparable(full.steps)
    assert unknown_stops >= 3, "the scenario must exercise dangling NEVER intents"
