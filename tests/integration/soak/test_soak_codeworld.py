"""The code scenario's environment: tasks, sandbox, worker processes, pool, parser, executor."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from _soak_support import ROOT, ScriptedModel
from hypothesis import given, settings
from hypothesis import strategies as st
from tools.soak.codeworld import tasks as codetasks
from tools.soak.codeworld.client import WorkerError, WorkerSession
from tools.soak.codeworld.pool import PoolError, WorkerPool
from tools.soak.codeworld.sandbox import TaskSession
from tools.soak.codeworld.worker import ledger_line
from tools.soak.run_soak import BudgetGuard, execute_run
from tools.soak.scenarios import code
from tools.soak.scenarios.base import RunOutcome, ScenarioEnv

from polyloop.ports import Action, InvalidDecision, ToolCall
from polyloop.types import ActionStatus, ModelReply

pytestmark = pytest.mark.integration

assert ROOT.is_dir()


def _reply(text: str) -> ModelReply:
    return ModelReply(call_id=None, content=text)


# --------------------------------------------------------------------------- tasks


def test_a_seed_gives_at_least_thirty_deterministic_tasks() -> None:
    first = codetasks.build_tasks(7)
    assert len(first) >= 30
    assert [t.instruction for t in first] == [t.instruction for t in codetasks.build_tasks(7)]
    assert [t.instruction for t in first] != [t.instruction for t in codetasks.build_tasks(8)]
    assert {t.kind for t in first} == set(codetasks.KINDS)
    assert codetasks.build_tasks(7, limit=4) == first[:4]


@pytest.mark.parametrize("seed", [7, 11])
def test_every_reference_solution_passes_its_check_and_the_wrong_one_fails(seed: int) -> None:
    for task in codetasks.build_tasks(seed):
        plan = codetasks.solution(task)
        right = TaskSession(task, exec_timeout=5, output_limit=4000)
        assert not right.success  # nothing done yet
        assert not right.execute(plan.explore).raised
        assert not right.execute(plan.solve).raised
        assert right.completed
        assert right.success, task.task_id
        wrong = TaskSession(task, exec_timeout=5, output_limit=4000)
        wrong.execute(plan.wrong_full)
        assert wrong.completed
        assert not wrong.success, task.task_id
        buggy = TaskSession(task, exec_timeout=5, output_limit=4000)
        assert buggy.execute(plan.buggy).raised, task.task_id


def test_task_ids_round_trip_and_unknown_ids_are_refused() -> None:
    task = codetasks.build_tasks(3)[17]
    assert codetasks.task_for(3, task.task_id) == task
    for bad in ("t999", "x001", "", "t1"):
        with pytest.raises(ValueError, match="task id"):
            codetasks.task_for(3, bad)


# --------------------------------------------------------------------------- sandbox


def _session(output_limit: int = 2000) -> TaskSession:
    return TaskSession(codetasks.task_for(7, "t000"), exec_timeout=0.5, output_limit=output_limit)


def test_variables_persist_between_executions() -> None:
    session = _session()
    session.execute("answer = 6 * 7")
    assert session.execute("print(answer)").output == "42\n"
    assert session.executions == 2


def test_the_time_limit_stops_a_loop_even_inside_except_exception() -> None:
    report = _session().execute(
        "while True:\n    try:\n        pass\n    except Exception:\n        pass"
    )
    assert report.raised
    assert "TimeoutError" in report.output


def test_imports_outside_the_allowlist_and_removed_builtins_fail_as_output() -> None:
    session = _session()
    denied = session.execute("import os")
    assert denied.raised
    assert "not allowed" in denied.output
    assert not session.execute("import json\nprint(json.dumps([1]))").raised
    assert "NameError" in session.execute("open('x')").output


def test_output_is_capped_and_the_cut_is_counted() -> None:
    report = _session(output_limit=100).execute("print('x' * 250)")
    assert len(report.output) == 100
    assert report.truncated_chars == 151


def test_complete_task_records_the_answer_once() -> None:
    session = _session()
    session.execute("complete_task(answer='555')")
    assert session.completed
    assert session.answer == "555"
    assert "AppError: complete_task was already called" in session.execute("complete_task()").output


# --------------------------------------------------------------------------- parser


def test_the_first_python_block_is_the_action_and_history_stops_at_its_fence() -> None:
    reply = "Plan.\n```python\nprint(1)\n```\nOutput:\n```\n1\n```\n```python\nprint(2)\n```"
    parsed = code.CodeParser().parse(_reply(reply))
    assert parsed.decision == Action(text="print(1)")
    assert parsed.history_text == "Plan.\n```python\nprint(1)\n```"


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ("I will look at the contacts.", "no ```python"),
        ("```js\nconsole.log(1)\n```", "no ```python"),
        ("```python\n```", "empty"),
        ("```python\n   \n```", "empty"),
        ("```python\nprint(1)", "not closed"),
        ("```python\nprint(1)```", "not closed"),
    ],
)
def test_replies_without_a_runnable_block_are_explained(reply: str, needle: str) -> None:
    decision = code.CodeParser().parse(_reply(reply)).decision
    assert isinstance(decision, InvalidDecision)
    assert needle in decision.explanation


def test_a_fence_inside_the_code_does_not_end_the_block() -> None:
    parsed = code.CodeParser().parse(_reply('```python\nprint("```")\nx = 1\n```\n'))
    assert parsed.decision == Action(text='print("```")\nx = 1')


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("`python\n xy()=")), max_size=60))
def test_parse_never_raises_and_history_is_a_prefix_of_the_reply(text: str) -> None:
    parsed = code.CodeParser().parse(_reply(text))
    assert text.startswith(parsed.history_text)
    if isinstance(parsed.decision, InvalidDecision):
        assert parsed.decision.explanation


def test_parser_parameters_are_pinned() -> None:
    assert code.CodeParser().parameters() == {
        "kind": "codeworld_python_fence",
        "multi_block_policy": "first_only",
    }


# --------------------------------------------------------------------------- workers, executor


async def test_executor_outcomes_against_a_real_worker(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.tsv"
    async with WorkerPool(size=1) as pool, httpx.AsyncClient(trust_env=False) as http:
        async with pool.lease() as handle:
            session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
            await session.reset(task_id="t000", seed=7, ledger=ledger)
            executor = code.CodeExecutor(session=session)
            assert executor.parameters() == {"kind": "codeworld_session"}
            ok = await executor.execute(Action(text="print(len(apps.contacts.all()))"))
            assert (ok.status, ok.observation, ok.env_reported_completion) == (
                ActionStatus.EXECUTED,
                "12\n",
                False,
            )
            failed = await executor.execute(Action(text="apps.contacts.get(999)"))
            assert failed.status is ActionStatus.EXECUTED
            assert "AppError: contacts.get: no contact" in failed.observation
            tool = await executor.execute(
                Action(text="x", tool_call=ToolCall(name="x", arguments={}))
            )
            assert tool.status is ActionStatus.NOT_EXECUTED
            done = await executor.execute(Action(text="complete_task(answer='?')"))
            assert done.env_reported_completion
            assert executor.env_executions == 3
            assert executor.success is False
            await pool.kill(handle.pid)
            broken = await executor.execute(Action(text="print(1)"))
            assert broken.status is ActionStatus.ENV_ERROR
            assert handle.dirty
        await pool.settled()
        assert pool.restarts == 1
        assert pool.available == 1
    lines = ledger.read_text(encoding="utf-8").splitlines()
    assert lines[0] == ledger_line("t000", "print(len(apps.contacts.all()))")
    assert len(lines) == 3  # the tool call never reached the worker; the dead one wrote nothing


async def test_a_lease_is_returned_and_the_worker_restarted_when_the_holder_is_cancelled() -> None:
    async with WorkerPool(size=1) as pool, httpx.AsyncClient(trust_env=False) as http:

        async def hold() -> None:
            async with pool.lease() as handle:
                session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
                await session.reset(task_id="t001", seed=7, ledger=None)
                await session.execute("import time\ntime.sleep(30)")

        holder = asyncio.ensure_future(hold())
        await asyncio.sleep(0.5)
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert pool.leased == 0
        await pool.settled()
        assert (pool.available, pool.restarts) == (1, 1)
        async with pool.lease() as handle:
            session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
            await session.reset(task_id="t001", seed=7, ledger=None)
            assert (await session.execute("print('back')")).output == "back\n"


async def test_leases_wait_for_a_free_worker_and_a_dead_worker_is_respawned_on_lease() -> None:
    async with WorkerPool(size=1) as pool:
        async with pool.lease() as first:
            waiting = asyncio.ensure_future(_lease_pid(pool))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            old_pid = first.pid
        assert await waiting == old_pid
        await pool.kill(old_pid)
        assert await _lease_pid(pool) != old_pid
        assert pool.restarts == 1


async def _lease_pid(pool: WorkerPool) -> int:
    async with pool.lease() as handle:
        return handle.pid


async def test_a_pool_refuses_leases_when_not_running_and_stop_kills_every_worker() -> None:
    pool = WorkerPool(size=2)
    with pytest.raises(PoolError, match="not running"):
        async with pool.lease():
            pass
    async with pool:
        handles = list(pool._handles)
    assert all(not handle.alive for handle in handles)
    with pytest.raises(ValueError, match="size"):
        WorkerPool(size=0)


async def test_worker_protocol_errors_become_worker_errors() -> None:
    async with (
        WorkerPool(size=1) as pool,
        httpx.AsyncClient(trust_env=False) as http,
        pool.lease() as handle,
    ):
        session = WorkerSession(http=http, handle=handle, exec_timeout=pool.exec_timeout)
        with pytest.raises(WorkerError, match="409"):
            await session.execute("print(1)")  # no task yet
        with pytest.raises(WorkerError, match="task id"):
            await session.reset(task_id="nope", seed=7, ledger=None)


# --------------------------------------------------------------------------- grading


async def _graded_run(
    runs: Path, replies: list[str], pool: WorkerPool, http: httpx.AsyncClient
) -> tuple[RunOutcome, dict[str, Any]]:
    guard = BudgetGuard(inner=ScriptedModel(replies), limit=100)
    env = ScenarioEnv(
        runs_dir=runs,
        workspace_root=runs.parent / f"{runs.name}-workspaces",
        model_client=guard,
        execute_run=functools.partial(
            execute_run,
            runs_dir=runs,
            model_client=guard,
            calls_for=guard.calls_for,
            scenario="code",
        ),
        binding_for=lambda task_id, phase: {},
        extra={"code_pool": pool, "code_http": http},
    )
    task = code.build_tasks(seed=7, limit=1, data_dir=runs)[0]
    (outcome,) = await code.run_task(task, env)
    meta = json.loads((runs / f"{outcome.run_id}.meta.json").read_text(encoding="utf-8"))
    return outcome, meta


async def test_every_code_run_that_reached_its_worker_is_graded_by_evaluate(
    tmp_path: Path,
) -> None:
    plan = codetasks.solution(code.build_tasks(seed=7, limit=1, data_dir=tmp_path)[0])
    async with WorkerPool(size=1) as pool, httpx.AsyncClient(trust_env=False) as http:
        idle, idle_meta = await _graded_run(tmp_path / "idle", ["No code from me."], pool, http)
        solved, solved_meta = await _graded_run(
            tmp_path / "solved", [f"```python\n{plan.full}\n```"], pool, http
        )
        wrong, wrong_meta = await _graded_run(
            tmp_path / "wrong", [f"```python\n{plan.wrong_full}\n```"], pool, http
        )
    # The agent never executed a line, yet the environment was there to ask: a failed task,
    # not a run that drops out of grading.
    assert (idle.stop_reason, idle_meta["env_executions"]) == ("parse_failures", 0)
    assert idle_meta["success"] is False
    assert (solved.stop_reason, solved_meta["success"]) == ("task_completed", True)
    assert (wrong.stop_reason, wrong_meta["success"]) == ("task_completed", False)


# --------------------------------------------------------------------------- CPU limit

_BURN = (
    "import time\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 0.6:\n"
    "    pass\n"
    "print(round(time.process_time(), 2))"
)


def test_the_cpu_limit_is_per_execution_not_per_worker_lifetime() -> None:
    # A one-second margin stands in for the real one: a lifetime budget of that size (the
    # worker's start-up CPU plus one second, rounded up: at most two seconds) would kill the
    # worker with SIGXCPU during the fourth execution below. Moved before each execution, it
    # never runs out, however much CPU the worker used before.
    with subprocess.Popen(
        [sys.executable, "-m", "tools.soak.codeworld.worker", "--cpu-margin", "1"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        try:
            assert worker.stdout is not None
            port = int(worker.stdout.readline().split()[1])
            url = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=url, trust_env=False, timeout=30) as client:
                assert client.post("/reset", json={"task_id": "t000", "seed": 7}).is_success
                used = [
                    float(client.post("/execute", json={"code": _BURN}).json()["output"])
                    for _ in range(4)
                ]
                assert client.post("/evaluate", json={}).json()["executions"] == 4
            assert used[-1] > 2.0  # more CPU than any lifetime budget of this margin allowed
            assert worker.poll() is None
        finally:
            worker.kill()
