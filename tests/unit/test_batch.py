"""``polyloop.batch`` (design 0242): a batch is resumable by running it again, a retry
continues the stopped run without repeating what it did, items stream through a bounded
window, and the report equals what the store holds."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import io
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from _batch_agents import ScriptedBatchModel, make_agent, record
from polyloop import Agent, tool
from polyloop.batch import (
    COLUMNS,
    BatchProgress,
    ItemReport,
    RetryPolicy,
    attempt_run_id,
    digest_key,
    iter_batch,
    parse_run_id,
    run_batch,
    stored_rows,
)
from polyloop.batch._cli import main as batch_main
from polyloop.errors import PolyloopTypeError, PolyloopValueError, RunIdentityError
from polyloop.parsers import JsonToolCallParser
from polyloop.session import check_log, continue_run, run_or_resume
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import RunFinished, StopReason

pytestmark = pytest.mark.unit

NO_WAIT = RetryPolicy(backoff_seconds=0)


def _items(count: int, fail_every: int = 0) -> list[dict[str, str]]:
    return [
        {
            "id": f"k{i}",
            "prompt": f"k{i}" + (" fail-once" if fail_every and i % fail_every == 0 else ""),
        }
        for i in range(count)
    ]


def _key(item: dict[str, str]) -> str:
    return item["id"]


def _model(agent: Agent[Any]) -> ScriptedBatchModel:
    model = agent.definition().model_client
    assert isinstance(model, ScriptedBatchModel)
    return model


async def test_running_the_batch_again_reads_finished_runs_back_without_a_model_call() -> None:
    store = VolatileRunStore()
    agent = make_agent(store)
    items = _items(12)
    first = await run_batch(
        agent, items, batch_id="b", key=_key, progress_stream=None, retry=NO_WAIT
    )
    calls = _model(agent).calls
    assert calls == 24  # two model calls per item
    again = await run_batch(agent, items, batch_id="b", key=_key, progress_stream=None)
    assert _model(agent).calls == calls, "a finished item makes no model call"
    assert first.totals.by_stop_reason == again.totals.by_stop_reason == {"final_answer": 12}
    assert again.totals.attempts == 12


async def test_an_unfinished_item_continues_and_a_missing_one_starts() -> None:
    store = VolatileRunStore()
    agent = make_agent(store)
    items = _items(6)
    await run_batch(agent, items[:3], batch_id="b", key=_key, progress_stream=None)

    # k3 was interrupted during its second model call (a Ctrl-C): a CANCELLED finish.
    reached = asyncio.Event()

    class Hangs(ScriptedBatchModel):
        async def call(self, call: Any) -> Any:
            if call.call_index == 1:
                reached.set()
                await asyncio.Event().wait()
            return await super().call(call)

    hanging = Agent(Hangs(), tools=[record], parser=JsonToolCallParser(), store=store)
    request = hanging.request("k3", attempt_run_id("b", "k3", 1))
    task = asyncio.ensure_future(run_or_resume(hanging.definition(), request))
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    before = _model(agent).calls
    report = await run_batch(agent, items, batch_id="b", key=_key, progress_stream=None)
    assert report.totals.by_stop_reason == {"final_answer": 6}
    # k3 continued (its second call), k4 and k5 started (two calls each).
    assert _model(agent).calls - before == 1 + 4
    rows = {row.key: row for row in await stored_rows(store, "b", _ids(store))}
    assert rows["k3"].attempts == 2
    assert rows["k3"].steps == 2


def _ids(store: VolatileRunStore) -> list[str]:
    return list(store._lines)  # the volatile store's run ids (a test's view of it)


async def test_a_retry_continues_the_failed_run_and_repeats_no_effect(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    store = JsonlRunStore(directory=tmp_path / "runs")
    agent = make_agent(store)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYLOOP_BATCH_LEDGER", str(ledger))
        report = await run_batch(
            agent,
            _items(3, fail_every=2),
            batch_id="r",
            key=_key,
            progress_stream=None,
            retry=NO_WAIT,
        )
    assert report.totals.retried == 2
    assert sorted(ledger.read_text().split()) == ["k0", "k1", "k2"], "each effect once"
    failed = await store.read_log("r--k0")
    retry = await store.read_log("r--k0--2")
    assert failed.finished is not None
    assert failed.finished.result.stop_reason is StopReason.LLM_ERROR
    assert retry.started is not None
    assert retry.started.continues == "r--k0"
    assert retry.finished is not None
    assert retry.finished.result.stop_reason is StopReason.FINAL_ANSWER
    # The failed attempt's step (the effect) is kept; its failed model call is made again.
    assert [c.step.action for c in retry.steps] == [failed.steps[0].step.action, None]
    assert retry.steps[0].step == failed.steps[0].step
    assert check_log(retry, "r--k0--2") is None


async def test_retries_stop_at_max_attempts() -> None:
    store = VolatileRunStore()

    class AlwaysFails(ScriptedBatchModel):
        async def call(self, call: Any) -> Any:
            raise ConnectionError("down")

    agent = Agent(AlwaysFails(), parser=JsonToolCallParser(), store=store)
    report = await run_batch(
        agent,
        ["only"],
        batch_id="m",
        progress_stream=None,
        retry=RetryPolicy(max_attempts=3, backoff_seconds=0),
    )
    assert report.totals.by_stop_reason == {"llm_error": 1}
    assert report.totals.attempts == 3
    key = digest_key("only")
    assert sorted(_ids(store)) == [f"m--{key}", f"m--{key}--2", f"m--{key}--3"]


class _CallsThenAnswers(ScriptedBatchModel):
    """Calls ``tool`` on the first call, answers after."""

    def __init__(self, tool_name: str) -> None:
        super().__init__()
        self.tool_name = tool_name

    async def call(self, call: Any) -> Any:
        from polyloop.types import ModelReply

        if call.call_index == 0:
            content = json.dumps({"tool": self.tool_name, "arguments": {"order": "A"}})
        else:
            content = json.dumps({"final_answer": "done"})
        return ModelReply(call_id=None, content=content)


async def test_a_timed_out_never_action_is_in_doubt_and_not_retried() -> None:
    executed: list[str] = []

    @tool
    async def pay(order: str) -> str:
        """Pay an order."""
        executed.append(order)
        await asyncio.Event().wait()
        return "paid"

    store = VolatileRunStore()
    agent = Agent(
        _CallsThenAnswers("pay"), tools=[pay], parser=JsonToolCallParser(), store=store,
        action_timeout_seconds=0.01,
    )  # fmt: skip
    report = await run_batch(agent, ["pay A"], batch_id="t", progress_stream=None, retry=NO_WAIT)
    assert report.totals.by_stop_reason == {"resume_state_unknown": 1}
    assert executed == ["A"], "the never action in doubt is not executed again"
    assert report.totals.attempts == 1


async def test_retries_exhausted_is_retried_by_resuming_the_same_run() -> None:
    from polyloop.session._step import IN_DOUBT_ATTEMPTS

    calls: list[str] = []

    @tool(replay="safe")
    async def fetch(order: str) -> str:
        """Fetch an order."""
        calls.append(order)
        if len(calls) <= IN_DOUBT_ATTEMPTS:
            await asyncio.Event().wait()  # timed out: its outcome is unknown
        return "fetched"

    store = VolatileRunStore()
    agent = Agent(
        _CallsThenAnswers("fetch"), tools=[fetch], parser=JsonToolCallParser(), store=store,
        action_timeout_seconds=0.01,
    )  # fmt: skip
    report = await run_batch(agent, ["fetch A"], batch_id="x", progress_stream=None, retry=NO_WAIT)
    assert report.totals.by_stop_reason == {"final_answer": 1}
    assert len(calls) == IN_DOUBT_ATTEMPTS + 1, "the first call left it open, the retry resumed"
    assert report.totals.attempts == 1, "the same run, resumed"
    assert len(_ids(store)) == 1


async def test_continue_run_refuses_a_run_that_stopped_otherwise() -> None:
    store = VolatileRunStore()
    agent = make_agent(store)
    await run_batch(agent, ["k1"], batch_id="c", key=lambda item: item, progress_stream=None)
    with pytest.raises(RunIdentityError, match="finished as final_answer"):
        await continue_run(agent.definition(), agent.request("k1", "c--k1--2"), from_run_id="c--k1")


async def test_items_stream_through_a_bounded_window() -> None:
    store = VolatileRunStore()
    agent = make_agent(store)
    pulled = 0
    most_ahead = 0
    ended = 0

    async def source() -> AsyncIterator[str]:
        nonlocal pulled, most_ahead
        for index in range(200):
            pulled += 1
            most_ahead = max(most_ahead, pulled - ended)
            yield f"k{index}"

    async for _row in iter_batch(agent, source(), batch_id="w", key=lambda i: i, concurrency=5):
        ended += 1
    assert ended == 200
    assert most_ahead <= 5 + 1, "at most the window (and the item being pulled) is ahead"


async def test_an_item_that_raises_is_its_row_and_the_batch_goes_on() -> None:
    store = VolatileRunStore()
    agent = make_agent(store)
    rows = [
        row
        async for row in iter_batch(
            agent,
            ["k1", {"no": "prompt"}, "k2", "k1", {"x": "y"}],
            batch_id="e",
            key=lambda i: i if isinstance(i, str) else i.get("no", "bad key"),
        )
    ]
    errors = sorted(row.error or "" for row in rows)
    assert sum(row.error is None for row in rows) == 2
    assert any("has no prompt" in error for error in errors)
    assert any("earlier item" in error for error in errors), "a duplicate key is refused"
    assert any("must be 1 to 100" in error for error in errors), "a bad key is refused"
    assert any("must be 1 to 100" in error for error in errors), "a bad key is refused"


async def test_progress_reaches_the_callback_and_the_stream() -> None:
    seen: list[BatchProgress] = []
    stream = io.StringIO()
    await run_batch(
        make_agent(VolatileRunStore()),
        _items(4, fail_every=4),
        batch_id="p",
        key=_key,
        on_progress=seen.append,
        progress_stream=stream,
        retry=RetryPolicy(max_attempts=1),
    )
    assert [p.done for p in seen] == [1, 2, 3, 4]
    assert seen[-1].total == 4
    assert seen[-1].failed == 1
    assert dict(seen[-1].failed_by) == {"llm_error": 1}
    last = stream.getvalue().splitlines()[-1]
    assert last.startswith("batch: 4/4 done, 0 running, 1 failed (llm_error 1), ")
    assert last.endswith(" 0 tokens")


async def test_the_report_files_equal_the_store_and_read_as_tables(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path / "runs")
    report = await run_batch(
        make_agent(store),
        _items(5, fail_every=3),
        batch_id="f",
        key=_key,
        report_dir=tmp_path / "report",
        progress_stream=None,
        retry=NO_WAIT,
    )
    assert report.jsonl is not None
    assert report.csv is not None
    written = [json.loads(line) for line in report.jsonl.read_text().splitlines()]
    with report.csv.open(encoding="utf-8", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == list(COLUMNS)
    assert sorted(row["key"] for row in table) == sorted(row["key"] for row in written)
    run_ids = [p.name[: -len(".jsonl")] for p in (tmp_path / "runs").glob("*.jsonl")]
    stored = [_plain(row) for row in await stored_rows(store, "f", run_ids)]
    assert sorted(written, key=lambda r: r["key"]) == stored
    totals = json.loads((tmp_path / "report" / "totals.json").read_text())
    assert totals["items"] == 5
    assert totals["retried"] == 2


def _plain(row: ItemReport) -> dict[str, Any]:
    return {name: getattr(row, name) for name in COLUMNS}


def test_the_command_line_runs_and_shows_a_batch(tmp_path: Path) -> None:
    items = tmp_path / "tasks.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in _items(4, fail_every=2)))
    runs = tmp_path / "runs"
    out, err = io.StringIO(), io.StringIO()
    argv = [
        "run", "--items", str(items), "--agent", "_batch_agents:make_agent", "--batch-id",
        "cli", "--store", str(runs), "--key-field", "id", "--backoff", "0", "--quiet",
    ]  # fmt: skip
    assert batch_main(argv, out=out, err=err) == 0, err.getvalue()
    assert "4 items (final_answer 4); 0 failed, 2 retried, 6 runs" in out.getvalue()
    assert (runs / "batches" / "cli" / "report.csv").is_file()
    shown = io.StringIO()
    assert batch_main([str(runs), "--batch-id", "cli"], out=shown) == 0
    lines = shown.getvalue().splitlines()
    assert lines[0] == out.getvalue().splitlines()[0]
    assert lines[1].split() == [
        "key",
        "run_id",
        "attempts",
        "stop_reason",
        "steps",
        "tokens",
        "wall_ms",
        "answer",
    ]
    assert "cli--k0--2" in shown.getvalue()
    page = tmp_path / "cli.html"
    assert batch_main([str(runs), "--batch-id", "cli", "--html", str(page)], out=io.StringIO()) == 0
    links = re.findall(r'href="cli\.runs\.html#(run-[^"]+)"', page.read_text())
    anchors = set(re.findall(r'id="(run-[^"]+)"', (tmp_path / "cli.runs.html").read_text()))
    assert sorted(links) == sorted(f"run-{p.stem}" for p in runs.glob("*.jsonl")), "every run"
    assert set(links) <= anchors
    bad = io.StringIO()
    assert batch_main([*argv[:4], "no_such_module:f", *argv[5:]], err=bad) == 2
    assert "module 'no_such_module' cannot be imported" in bad.getvalue()
    bad = io.StringIO()
    assert batch_main([str(runs), "--batch-id", "no--pe"], out=io.StringIO(), err=bad) == 2
    assert "must be 1 to 100" in bad.getvalue()


def test_run_ids_name_batch_key_and_attempt() -> None:
    assert attempt_run_id("b", "k", 1) == "b--k"
    assert attempt_run_id("b", "k", 3) == "b--k--3"
    assert parse_run_id("b", "b--k--3") == ("k", 3)
    assert parse_run_id("b", "b--k") == ("k", 1)
    assert parse_run_id("b", "bb--k") is None
    assert parse_run_id("b", "b--k--1") is None
    assert digest_key({"a": 1, "b": 2}) == digest_key({"b": 2, "a": 1})


async def test_bad_settings_are_refused_by_name() -> None:
    agent = make_agent(VolatileRunStore())
    with pytest.raises(PolyloopValueError, match="must not|not contain"):
        await run_batch(agent, ["x"], batch_id="a--b", progress_stream=None)
    with pytest.raises(PolyloopValueError, match="concurrency"):
        await run_batch(agent, ["x"], batch_id="a", concurrency=0, progress_stream=None)
    with pytest.raises(PolyloopValueError, match="env_error.*cannot be retried"):
        RetryPolicy(on=frozenset({StopReason.ENV_ERROR}))
    with pytest.raises(PolyloopTypeError, match="max_attempts"):
        RetryPolicy(max_attempts="3")  # type: ignore[arg-type]
    with pytest.raises(PolyloopTypeError, match="Agent or an item factory"):
        await run_batch(object(), ["x"], batch_id="a", progress_stream=None)  # type: ignore[arg-type]


def test_back_off_doubles_to_its_ceiling_with_jitter_below_it() -> None:
    import random

    policy = RetryPolicy(backoff_seconds=1, backoff_max_seconds=5, jitter=0)
    assert [policy.delay(n) for n in (2, 3, 4, 5)] == [1, 2, 4, 5]
    jittered = RetryPolicy(backoff_seconds=1, backoff_max_seconds=5)
    draws = [jittered.delay(4, random.Random(seed)) for seed in range(50)]
    assert all(0 <= d <= 4 for d in draws)
    assert len(set(draws)) > 1


def test_the_batch_command_imports_neither_ray_nor_the_http_client() -> None:
    """``python -m polyloop batch`` loads ``polyloop.batch._cli`` by name (contracts r11, r12
    cannot see it): Ray is imported only for ``--ray``, httpx only for a model string."""
    import subprocess
    import sys

    code = (
        "import sys, polyloop.__main__, polyloop.batch._cli, polyloop.batch;"
        "print(sorted(m for m in ('ray', 'httpx') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


async def _log_finished_as_action_timeout(
    replay: str,
) -> tuple[VolatileRunStore, Agent[Any], list[str]]:
    """A store holding run ``old``: its action's intent unanswered and a finish with
    ``action_timeout``, as logs written before design 0227 end (a cancelled run's records,
    rewritten with that finish)."""
    executed: list[str] = []
    hang = asyncio.Event()

    @tool(replay=replay)  # type: ignore[call-overload]
    async def pay(order: str) -> str:
        """Pay an order."""
        executed.append(order)
        if len(executed) == 1:
            hang.set()
            await asyncio.Event().wait()
        return "paid"

    first = VolatileRunStore()
    agent = Agent(_CallsThenAnswers("pay"), tools=[pay], parser=JsonToolCallParser(), store=first)
    task = asyncio.ensure_future(run_or_resume(agent.definition(), agent.request("pay A", "old")))
    await hang.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    old = VolatileRunStore()
    for entry in (await first.read_log("old")).entries:
        record = entry.record
        if isinstance(record, RunFinished):
            result = dataclasses.replace(record.result, stop_reason=StopReason.ACTION_TIMEOUT)
            record = dataclasses.replace(record, result=result)
        await old.write_record(record)
    again = Agent(_CallsThenAnswers("pay"), tools=[pay], parser=JsonToolCallParser(), store=old)
    return old, again, executed


@pytest.mark.parametrize(
    ("replay", "reason", "runs"),
    [("never", "resume_state_unknown", 1), ("safe", "final_answer", 2)],
)
async def test_continue_run_of_an_older_action_timeout_lets_the_replay_policy_decide(
    replay: str, reason: str, runs: int
) -> None:
    store, agent, executed = await _log_finished_as_action_timeout(replay)
    result = await continue_run(
        agent.definition(), agent.request("pay A", "new"), from_run_id="old"
    )
    assert result.stop_reason.value == reason
    assert len(executed) == runs, "a never action is not run again; a safe one is replayed"
    log = await store.read_log("new")
    assert log.started is not None
    assert log.started.continues == "old"
    assert check_log(log, "new") is None


async def test_on_a_terminal_the_progress_is_one_line_rewritten_in_place() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    await run_batch(
        make_agent(VolatileRunStore()), _items(3), batch_id="tty", key=_key,
        progress_stream=terminal,
    )  # fmt: skip
    shown = terminal.getvalue()
    assert shown.startswith("\rbatch: ")
    assert shown.count("\n") == 1, "one line, ended once the batch ends"
    assert shown.rstrip("\n").split("\r")[-1].startswith("batch: 3/3 done, 0 running, 0 failed")


async def test_a_callback_that_raises_stops_the_batch_and_cancels_its_runs() -> None:
    store = VolatileRunStore()

    def fails(progress: BatchProgress) -> None:
        raise RuntimeError("the program's callback broke")

    with pytest.raises(RuntimeError, match="callback broke"):
        await run_batch(
            make_agent(store), _items(20), batch_id="cb", key=_key, concurrency=4,
            on_progress=fails, progress_stream=None,
        )  # fmt: skip
    logs = [await store.read_log(run_id) for run_id in _ids(store)]
    assert len(logs) <= 5, "only the window had started"
    assert all(log.finished is not None for log in logs), "each run in flight wrote its finish"


async def test_a_key_function_that_raises_for_one_item_is_its_row_not_the_batch_end() -> None:
    # Found in review: only PolyloopTypeError/ValueError were caught, so a plain KeyError from
    # `key=lambda i: i["id"]` on one item ended the batch and cancelled the items in flight.
    store = VolatileRunStore()
    items = [{"id": "a", "prompt": "a"}, {"prompt": "b"}, {"id": "c", "prompt": "c"}]
    rows = [row async for row in iter_batch(make_agent(store), items, batch_id="kf", key=_key)]
    assert sorted(row.key for row in rows if row.error is None) == ["a", "c"]
    [bad] = [row for row in rows if row.error is not None]
    assert bad.error == "KeyError: 'id'"
    assert bad.run_id == ""
    assert sorted(_ids(store)) == ["kf--a", "kf--c"]


async def test_no_two_batches_or_keys_can_share_a_run_id_through_a_dash() -> None:
    # Found in review: batch 'b-' with key 'x' and batch 'b' with key '-x' were both run
    # 'b---x' (the second batch read the first one's run back as its own item), and key 'a-'
    # had its retry at 'b--a---2', which parse_run_id did not find: the rebuilt report showed
    # the failed first attempt.
    for bad in ("b-", "-b"):
        with pytest.raises(PolyloopValueError, match="not end with '-'"):
            [row async for row in iter_batch(make_agent(VolatileRunStore()), ["x"], batch_id=bad)]
    store = VolatileRunStore()
    rows = [
        row
        async for row in iter_batch(
            make_agent(store), ["-x", "a-", "ok-1"], batch_id="b", key=lambda item: item
        )
    ]
    assert sorted(row.key for row in rows if row.error is None) == ["ok-1"]
    assert all("not end with '-'" in (row.error or "") for row in rows if row.key != "ok-1")
    assert _ids(store) == ["b--ok-1"]


async def test_a_later_attempt_on_record_is_walked_to_under_a_stricter_policy() -> None:
    # Found in review: run again with fewer attempts (`--max-attempts 1` after 3), the walk
    # stopped at the failed first attempt: the row said llm_error while the store held the
    # retry that answered (or left it unfinished for ever), and the report was not the store's.
    store = VolatileRunStore()
    agent = make_agent(store)
    first = await run_batch(
        agent, _items(2, fail_every=2), batch_id="w", key=_key, progress_stream=None,
        retry=NO_WAIT,
    )  # fmt: skip
    assert first.totals.retried == 1
    calls = _model(agent).calls
    rows = [
        row
        async for row in iter_batch(
            agent, _items(2, fail_every=2), batch_id="w", key=_key,
            retry=RetryPolicy(max_attempts=1),
        )
    ]  # fmt: skip
    assert _model(agent).calls == calls, "both items read back"
    [k0] = [row for row in rows if row.key == "k0"]
    assert (k0.run_id, k0.attempts, k0.stop_reason) == ("w--k0--2", 2, "final_answer")
    assert sorted(rows, key=lambda row: row.key) == await stored_rows(store, "w", _ids(store))


async def test_a_run_left_open_as_retries_exhausted_has_the_row_its_log_gives() -> None:
    # Found in review: the engine's row said 'retries_exhausted' while the row rebuilt from
    # the store (`python -m polyloop batch PLACE`) said '' (the run is open, unfinished): the
    # report written as items end was not the store's.
    @tool(replay="safe")
    async def fetch(order: str) -> str:
        """Fetch an order."""
        await asyncio.Event().wait()  # every try times out: its outcome stays unknown
        return "fetched"

    store = VolatileRunStore()
    agent = Agent(
        _CallsThenAnswers("fetch"), tools=[fetch], parser=JsonToolCallParser(), store=store,
        action_timeout_seconds=0.01,
    )  # fmt: skip
    rows = [
        row
        async for row in iter_batch(
            agent, ["fetch A"], batch_id="o", retry=RetryPolicy(max_attempts=1)
        )
    ]
    assert rows == await stored_rows(store, "o", _ids(store))
    assert rows[0].stop_reason == ""
    assert (await store.read_log(rows[0].run_id)).finished is None


async def test_an_items_child_runs_are_no_items_and_never_taken_for_one(tmp_path: Path) -> None:
    # Found in review: the child runs of an item's run (design 0245) are '<run id>.a1', so
    # they have the batch's prefix: the report rebuilt from the store listed each as an item
    # ('x.a1', 'x.a1.a1'...), and an item keyed 'x.a1' was given item x's child run as its
    # own (read back, no run of its own).
    from _trees import Ledger, Tree, TreeModel

    store = VolatileRunStore()
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "ledger.txt"), steps=40)

    @contextlib.asynccontextmanager
    async def trees(item: str, run_id: str) -> AsyncIterator[tuple[Any, Any]]:
        yield tree.definition, tree.request(run_id)

    [row] = [row async for row in iter_batch(trees, ["x"], batch_id="t", key=lambda i: i)]
    assert (row.run_id, row.stop_reason) == ("t--x", "final_answer")
    assert len(_ids(store)) == 7, "the item's tree: its run and six child runs"
    assert await stored_rows(store, "t", _ids(store)) == [row]
    [taken] = [row async for row in iter_batch(trees, ["x.a1"], batch_id="t", key=lambda i: i)]
    assert taken.error is not None
    assert "is taken by a child run of run 't--x'" in taken.error
    assert (taken.stop_reason, taken.steps) == ("", 0)


async def test_cancelling_the_batch_cancels_each_run_in_flight_which_a_rerun_continues() -> None:
    """Ctrl-C on ``run_batch`` (the spec's cancellation guarantee, at the batch's layer): the
    ``CancelledError`` reaches the caller, every run in flight has written its ``cancelled``
    finish first, and running the batch again continues those runs (their first model call is
    not made again) and starts the rest."""
    store = VolatileRunStore()
    in_flight = 3
    hung: list[str] = []
    all_hung = asyncio.Event()

    class HangsOnItsSecondCall(ScriptedBatchModel):
        async def call(self, call: Any) -> Any:
            if call.call_index == 1:
                hung.append(call.run_id)
                if len(hung) == in_flight:
                    all_hung.set()
                await asyncio.Event().wait()
            return await super().call(call)

    hanging = Agent(
        HangsOnItsSecondCall(), tools=[record], parser=JsonToolCallParser(), store=store
    )
    items = _items(6)
    batch = asyncio.ensure_future(
        run_batch(
            hanging, items, batch_id="b", key=_key, concurrency=in_flight, progress_stream=None
        )
    )
    await all_hung.wait()
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    started = sorted(set(hung))
    assert len(started) == in_flight
    for run_id in started:
        log = await store.read_log(run_id)
        assert log.finished is not None, run_id
        assert log.finished.result.stop_reason is StopReason.CANCELLED
    assert len(_ids(store)) == in_flight  # nothing started beyond the window

    agent = make_agent(store)
    report = await run_batch(agent, items, batch_id="b", key=_key, progress_stream=None)
    assert report.totals.by_stop_reason == {"final_answer": 6}
    # The three cancelled runs continue at their second call; the other three make two each.
    assert _model(agent).calls == in_flight * 1 + 3 * 2
