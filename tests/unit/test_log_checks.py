"""check_log: a log whose records contradict each other is refused, naming the line (issue 15).

Defect 5 of issue 15: recovery trusted one line over everything else. Editing a dangling
intent's ``replay_policy`` from ``never`` to ``safe`` made ``resume`` execute a ``NEVER`` tool
a second time, and a finished log was handed back unchecked (two finish records read as a
clean run). These tests fail on 0.1.0 (commit 14eff8d) and pass now.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tools.demo._agent import ConsoleSink
from tools.demo._scenarios import definition_for, request_for, scenario_named
from tools.demo._world import Shop, World

from polyloop._recovery import LogBreach, ResumeAction, check_log, plan_resume
from polyloop.errors import LogCorruptError
from polyloop.ports import LogEntry, RunLog
from polyloop.session import resume
from polyloop.stores import JsonlRunStore
from polyloop.stores._records import assemble_log, decode_line, encode_line
from polyloop.testing import RecordFactory
from polyloop.types import (
    Intent,
    IntentKind,
    ModelCallResult,
    ReplayPolicy,
    RunFinished,
    StepCompleted,
    StopReason,
)

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs-0.1.0"
RUN = "r1"
SAFE, NEVER = ReplayPolicy.SAFE, ReplayPolicy.NEVER
SNAPSHOT = {
    "request.model_replay_policy": "safe",
    "action_executor.kind": "registry",
    "action_executor.tool.add.replay_policy": "safe",
    "action_executor.tool.note.replay_policy": "never",
}


RECORDS = RecordFactory()


def intent(kind: IntentKind, idx: int, policy: ReplayPolicy) -> Intent:
    if kind is IntentKind.MODEL_CALL:
        return RECORDS.model_call_intent(
            run_id=RUN, call_index=idx, result_id=f"m{idx}", replay_policy=policy
        )
    return RECORDS.action_intent(
        run_id=RUN, call_index=idx, result_id=f"a{idx}", replay_policy=policy
    )


def result(idx: int) -> ModelCallResult:
    reply = RECORDS.reply(call_id=f"c{idx}", content="go")
    return RECORDS.model_call_result(run_id=RUN, result_id=f"m{idx}", reply=reply)


def step(idx: int) -> StepCompleted:
    return RECORDS.step_completed(
        run_id=RUN,
        result_id=f"a{idx}",
        action_outcome=RECORDS.outcome(),
        step=RECORDS.step(step_idx=idx),
    )


def finished(*steps: StepCompleted, reason: StopReason = StopReason.STEP_BUDGET) -> RunFinished:
    return RECORDS.run_finished(
        run_id=RUN,
        result=RECORDS.result(run_id=RUN, stop_reason=reason, steps=(s.step for s in steps)),
    )


def clean_records() -> list[object]:
    """Two steps with actions, then the finish: lines 1..10."""
    return [
        RECORDS.run_started(run_id=RUN, parameter_snapshot=SNAPSHOT),
        intent(IntentKind.MODEL_CALL, 0, SAFE),
        result(0),
        intent(IntentKind.ACTION, 0, SAFE),
        step(0),
        intent(IntentKind.MODEL_CALL, 1, SAFE),
        result(1),
        intent(IntentKind.ACTION, 1, NEVER),
        step(1),
        finished(step(0), step(1)),
    ]


async def log_of(records: list[object]) -> RunLog:
    """The records as a store hands them back: each line encoded, decoded, numbered."""
    lines = [
        encode_line(record, type(record), "test")  # type: ignore[arg-type]
        for record in records
    ]
    return assemble_log(
        decode_line(line[:-1], run_id=RUN, line_number=number)
        for number, line in enumerate(lines, start=1)
    )


async def test_a_clean_log_has_no_breach_and_entries_carry_lines() -> None:
    log = await log_of(clean_records())
    assert [entry.line for entry in log.entries] == list(range(1, 11))
    assert check_log(log, RUN) is None
    assert plan_resume(log, RUN).action is ResumeAction.ALREADY_FINISHED


async def test_a_cancelled_result_may_lack_only_the_last_logged_step() -> None:
    records = clean_records()
    records[-1] = finished(step(0), reason=StopReason.CANCELLED)
    assert check_log(await log_of(records), RUN) is None
    records[-1] = finished(reason=StopReason.CANCELLED)
    breach = check_log(await log_of(records), RUN)
    assert breach is not None
    assert breach.line == 10


def _swap(records: list[object], i: int, j: int) -> list[object]:
    out = list(records)
    out[i], out[j] = out[j], out[i]
    return out


@pytest.mark.parametrize(
    ("mutate", "line", "words"),
    [
        # two finish records: 0.1.0 read this as a clean run
        (lambda r: [*r, r[-1]], 11, "second RunFinished"),
        (lambda r: [*r, intent(IntentKind.MODEL_CALL, 2, SAFE)], 11, "follows the RunFinished"),
        # records out of write order
        (lambda r: _swap(r, 2, 3), 3, "no model call result"),
        (lambda r: _swap(r, 3, 4), 4, "action result but no action intent"),
        (lambda r: _swap(r, 4, 5), 5, "step 1, but step 0 is next"),
        (lambda r: [r[1], r[0], *r[2:]], 1, "RunStarted record is missing"),
        # duplicate intents for one result id
        (lambda r: [*r[:4], r[3], *r[4:]], 5, "two intents announce result 'a0'"),
        (lambda r: [*r[:2], r[1], *r[2:]], 3, "two intents announce result 'm0'"),
        # a result or a step with no intent
        (lambda r: [r[0], r[2], *r[3:]], 2, "no model-call intent"),
        (lambda r: [*r[:3], r[4], *r[5:]], 4, "action result but no action intent"),
        # a second start
        (lambda r: [*r[:5], r[0], *r[5:]], 6, "second RunStarted"),
        # the finish record's result contradicts the steps
        (lambda r: [*r[:-1], finished(step(0))], 10, "do not match"),
        # an intent's replay policy against the snapshot
        (
            lambda r: [*r[:5], intent(IntentKind.MODEL_CALL, 1, NEVER), *r[6:]],
            6,
            "request.model_replay_policy = 'safe'",
        ),
    ],
)
async def test_contradicting_logs_name_the_first_breaking_line(
    mutate: object, line: int, words: str
) -> None:
    records = mutate(clean_records())  # type: ignore[operator]
    log = await log_of(records)
    breach = check_log(log, RUN)
    assert isinstance(breach, LogBreach)
    assert breach.line == line, breach
    assert words in breach.detail
    assert str(breach).startswith(f"line {line}: ")
    plan = plan_resume(log, RUN)
    assert plan.action is ResumeAction.CORRUPT
    assert plan.breach == breach


async def test_an_action_policy_the_snapshot_does_not_declare_is_a_breach() -> None:
    snapshot = {**SNAPSHOT, "action_executor.tool.add.replay_policy": "never"}
    records = clean_records()
    records[0] = RECORDS.run_started(run_id=RUN, parameter_snapshot=snapshot)
    breach = check_log(await log_of(records), RUN)
    assert breach is not None
    assert breach.line == 4
    assert "declares no tool with that policy" in breach.detail


async def test_the_caller_can_pin_an_action_intent_to_its_policy() -> None:
    log = await log_of(clean_records())
    assert check_log(log, RUN, action_policies={0: SAFE, 1: NEVER}) is None
    breach = check_log(log, RUN, action_policies={1: SAFE})
    assert breach is not None
    assert breach.line == 8
    assert "stored reply asks for has policy 'safe'" in breach.detail


async def test_a_dangling_intent_is_allowed_only_as_the_last_execution() -> None:
    records = clean_records()[:-1]
    assert check_log(await log_of([*records, intent(IntentKind.MODEL_CALL, 2, SAFE)]), RUN) is None
    # Step 1's action intent (line 8) is never answered, yet step 2 starts after it.
    dangling_then_more = [*records[:8], intent(IntentKind.MODEL_CALL, 2, SAFE)]
    breach = check_log(await log_of(dangling_then_more), RUN)
    assert breach is not None
    assert breach.line == 9
    assert "step 1 is next" in breach.detail


def test_a_store_without_entries_is_checked_in_canonical_order_without_lines() -> None:
    records = clean_records()
    log = RunLog(
        started=records[0],  # type: ignore[arg-type]
        intents=(records[1], records[3], records[5], records[7]),  # type: ignore[arg-type]
        model_results=(records[2], records[6]),  # type: ignore[arg-type]
        steps=(records[4], records[8]),  # type: ignore[arg-type]
        finished=records[9],  # type: ignore[arg-type]
    )
    assert check_log(log, RUN) is None
    broken = dataclasses.replace(log, finished=finished(step(0)))
    breach = check_log(broken, RUN)
    assert breach is not None
    assert breach.line is None
    assert str(breach).startswith("no line known: ")


def test_entries_take_no_part_in_equality() -> None:
    started = RECORDS.run_started(run_id=RUN, parameter_snapshot={})
    with_entries = RunLog(started=started, entries=(LogEntry(line=1, record=started),))
    assert with_entries == RunLog(started=started)


# --------------------------------------------------------------------------- through resume()


def _copy_fixture(name: str, directory: Path, edit: tuple[bytes, bytes] | None = None) -> None:
    source = FIXTURES / f"{name}.jsonl"
    lines = source.read_bytes().split(b"\n")
    run_id = scenario_for(name)
    if edit is not None:
        old, new = edit
        assert old in lines[-2]
        lines[-2] = lines[-2].replace(old, new)
    (directory / f"{run_id}.jsonl").write_bytes(b"\n".join(lines))


def scenario_for(fixture: str) -> str:
    return {"u1-dangling-safe-action": "r5-kill-safe", "u2-dangling-never-action": "r6-kill-never"}[
        fixture
    ]


async def test_defect_5_an_edited_replay_policy_never_repeats_a_never_tool(tmp_path: Path) -> None:
    # u2 ends with the NEVER intent of write_note (line 16), whose outcome is unknown.
    _copy_fixture("u2-dangling-never-action", tmp_path, (b'"never"', b'"safe"'))
    scenario = scenario_named("r6-kill-never")
    world = World(tmp_path / "world", Shop.from_seed(7))
    store = JsonlRunStore(directory=tmp_path)
    definition = definition_for(scenario, store=store, sink=ConsoleSink())
    before = (tmp_path / "r6-kill-never.jsonl").read_bytes()
    with pytest.raises(LogCorruptError, match="line 16") as caught:
        await resume(definition, request_for(scenario, world))
    assert caught.value.line == 16
    assert "replay policy 'safe'" in str(caught.value)
    assert world.ledger() == []  # write_note was not executed again
    assert (tmp_path / "r6-kill-never.jsonl").read_bytes() == before  # nothing written


async def test_defect_5_two_finish_records_are_refused_for_a_finished_run(tmp_path: Path) -> None:
    lines = (FIXTURES / "r2-question.jsonl").read_bytes().split(b"\n")
    finish = lines[-2]
    (tmp_path / "r2-question.jsonl").write_bytes(b"\n".join([*lines[:-1], finish, b""]))
    scenario = scenario_named("r2-question")
    world = World(tmp_path / "world", Shop.from_seed(7))
    definition = definition_for(
        scenario, store=JsonlRunStore(directory=tmp_path), sink=ConsoleSink()
    )
    with pytest.raises(LogCorruptError, match="second RunFinished") as caught:
        await resume(definition, request_for(scenario, world))
    assert caught.value.line == len(lines)
