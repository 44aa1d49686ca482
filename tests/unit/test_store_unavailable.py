"""A store whose disk fails raises ``StoreUnavailableError`` (issue 24), and the run survives it.

The JSONL store's file system is failed through its fault-injection point
(``_jsonl._write_all_bytes``: half the line is written, then ``ENOSPC``, as a full disk does),
through a read that fails, and through a lease directory that cannot exist. Each time ``run()``
raises ``StoreUnavailableError``, a ``PolyloopError`` (and an ``OSError``) naming the store, the
run, the record and the file, the OS's error as its cause; the log still decodes (the torn line
is not a record), passes ``check_log``, and resumes to the run's end without running a
``NEVER`` action twice. The real disk-full case (a full tmpfs) is
``tests/integration/test_jsonl_disk_full.py``; the PostgreSQL store's is
``tests/integration/test_postgres_server_crash.py``.
"""

from __future__ import annotations

import errno
import os
import pickle
from collections.abc import Mapping
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.errors import (
    PolyloopError,
    RunAlreadyStartedError,
    RunLeaseLostError,
    StoreUnavailableError,
)
from polyloop.ports import ToolContext
from polyloop.session import check_log, run, run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl as jsonl_module
from polyloop.testing import RecordFactory
from polyloop.tools import Reconciliation, ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy, StopReason

pytestmark = pytest.mark.unit

SCRIPT = ['tool:write {"text": "a"}', "final:done"]
RUN = "run-1"


def ledger_tools(ledger: dict[str, int]) -> ToolRegistry:
    """``write`` (NEVER) counts its executions; its reconciler answers from that count."""

    async def write(arguments: Mapping[str, object]) -> str:
        ledger[str(arguments["text"])] = ledger.get(str(arguments["text"]), 0) + 1
        return "written"

    async def reconcile(context: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        if ledger.get(str(arguments["text"])):
            return Reconciliation.executed("written")
        return Reconciliation.not_executed()

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return ToolRegistry(
        [
            ToolSpec(
                name="write", description="w", parameters=schema, handler=write, reconcile=reconcile
            )
        ]
    )


def disk_full_at(tag: str, occurrence: int):  # type: ignore[no-untyped-def]
    """A ``_write_all_bytes`` that, on the ``occurrence``-th line tagged ``tag``, writes the
    lines before it in the same write (a ``write_pair``'s first) and half of it, and then
    fails as a full disk does (``ENOSPC``); every other line is written."""
    real = jsonl_module._write_all_bytes
    seen = [0]
    prefix = b'{"record": "%s"' % tag.encode()

    def write(descriptor: int, data: bytes) -> None:
        start = 0
        for line in data.splitlines(keepends=True):
            if line.startswith(prefix):
                seen[0] += 1
                if seen[0] == occurrence:
                    os.write(descriptor, data[: start + len(line) // 2])
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            start += len(line)
        real(descriptor, data)

    return write


def file_bytes(path: str) -> bytes | None:
    """The file's bytes, ``None`` when there is no file."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


# The records of the two-step run, in write order: which line fails, how, and the record(s)
# the error names (a model result goes with the step's next record in one write_pair).
FAILING_WRITES = [
    ("run_started", 1, "run_started"),  # a temporary file, linked only when complete
    ("intent", 1, "intent"),  # step 0's model intent: a barrier, in a writer thread
    # step 0's result and action intent: one write, in a writer thread (the intent is a barrier)
    ("model_call_result", 1, "model_call_result and intent"),
    ("intent", 2, "model_call_result and intent"),  # the result is whole, the intent torn
    ("step_completed", 1, "step_completed"),  # after the NEVER action ran: in doubt afterwards
    ("intent", 3, "intent"),
    # step 1's result and its (final) step: one write on the loop's thread (no barrier)
    ("model_call_result", 2, "model_call_result and step_completed"),
    ("step_completed", 2, "model_call_result and step_completed"),
    ("run_finished", 1, "run_finished"),
]


@pytest.mark.parametrize(("tag", "occurrence", "named"), FAILING_WRITES)
async def test_a_full_disk_under_any_write_is_a_typed_error_and_the_run_resumes_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tag: str, occurrence: int, named: str
) -> None:
    ledger: dict[str, int] = {}
    tools = ledger_tools(ledger)
    store = JsonlRunStore(directory=tmp_path)
    log_path = str(tmp_path / f"{RUN}.jsonl")
    monkeypatch.setattr(jsonl_module, "_write_all_bytes", disk_full_at(tag, occurrence))
    with pytest.raises(PolyloopError) as caught:  # what a caller's except PolyloopError sees
        await run(
            definition(ScriptedModel(SCRIPT), store=store),
            request(RUN, tools=tools, model_policy=ReplayPolicy.SAFE),
        )
    monkeypatch.undo()

    failure = caught.value
    assert isinstance(failure, StoreUnavailableError)
    assert isinstance(failure, OSError)
    assert (failure.store, failure.run_id, failure.record, failure.path) == (
        "JsonlRunStore",
        RUN,
        named,
        log_path,
    )
    assert failure.errno == errno.ENOSPC
    assert isinstance(failure.__cause__, OSError)
    assert failure.__cause__.errno == errno.ENOSPC
    text = str(failure)
    assert text.startswith(f"JsonlRunStore: could not write the {named} record of run '{RUN}' ")
    assert log_path in text
    assert "No space left on device" in text
    assert "free some space, then resume the run" in text

    # The log decodes (the half line is no record), is one the library could have written...
    reread = JsonlRunStore(directory=tmp_path)
    log = await reread.read_log(RUN)
    if tag == "run_started":
        assert file_bytes(log_path) is None  # the start claims nothing until it is complete
        assert log.is_empty
    else:
        assert not (file_bytes(log_path) or b"").endswith(b"\n")  # torn, and ignored
        assert check_log(log, RUN) is None
    # ...and the run goes on to its end, the NEVER action executed exactly once.
    result = await run_or_resume(
        definition(ScriptedModel(SCRIPT), store=reread),
        request(RUN, tools=tools, model_policy=ReplayPolicy.SAFE),
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert ledger == {"a": 1}
    final = await reread.read_log(RUN)
    assert check_log(final, RUN) is None
    assert (file_bytes(log_path) or b"").endswith(b"\n")
    assert len(final.settlements) == (1 if (tag, occurrence) == ("step_completed", 1) else 0)


async def test_a_failed_read_is_a_typed_error_naming_the_run_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(RecordFactory().run_started(run_id=RUN, parameter_snapshot={}))

    def unreadable(path: str) -> bytes | None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    monkeypatch.setattr(jsonl_module, "_read_or_none", unreadable)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.read_log(RUN)
    path = str(tmp_path / f"{RUN}.jsonl")
    assert caught.value.record == "log"
    assert caught.value.errno == errno.EIO
    assert str(caught.value).startswith(
        f"JsonlRunStore: could not read the log of run '{RUN}' ({path}): OSError: "
    )
    assert "nothing was changed" in str(caught.value)


async def test_a_lease_that_cannot_be_taken_is_a_typed_error_from_run(tmp_path: Path) -> None:
    """The lease directory's name is taken by a file, so the lock file cannot be created."""
    (tmp_path / jsonl_module.LEASE_DIRECTORY).write_text("not a directory")
    with pytest.raises(StoreUnavailableError) as caught:
        await run(
            definition(ScriptedModel(SCRIPT), store=JsonlRunStore(directory=tmp_path)), request(RUN)
        )
    lock = os.path.join(tmp_path, jsonl_module.LEASE_DIRECTORY, f"{RUN}.lock")
    assert (caught.value.record, caught.value.path, caught.value.run_id) == ("lease", lock, RUN)
    assert str(caught.value).startswith(f"JsonlRunStore: could not take the lease of run '{RUN}'")
    assert isinstance(caught.value.__cause__, NotADirectoryError)
    assert not (tmp_path / f"{RUN}.jsonl").exists()


async def test_refusals_keep_their_own_types(tmp_path: Path) -> None:
    """A taken run id and a lost lease are refusals, not store failures."""
    store = JsonlRunStore(directory=tmp_path)
    start = RecordFactory().run_started(run_id=RUN, parameter_snapshot={})
    await store.write_run_started(start)
    with pytest.raises(RunAlreadyStartedError) as taken:
        await store.write_run_started(start)
    assert not isinstance(taken.value, StoreUnavailableError)
    lease = await store.acquire_lease(RUN)
    await lease.release()
    with pytest.raises(RunLeaseLostError):
        await lease.write_intent(
            RecordFactory().model_call_intent(run_id=RUN, call_index=0, result_id="m0")
        )


def test_the_error_is_an_os_error_with_its_own_text_and_survives_pickling() -> None:
    """``str`` is the message (not OSError's ``[Errno n] ...``), the facts are attributes, and
    it crosses a process boundary whole (a Ray worker sends it to its driver)."""
    error = StoreUnavailableError(
        "S: could not write the intent record of run 'r'",
        store="S",
        run_id="r",
        record="intent",
        path="/logs/r.jsonl",
    )
    error.errno, error.strerror = errno.ENOSPC, os.strerror(errno.ENOSPC)
    assert str(error) == "S: could not write the intent record of run 'r'"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is StoreUnavailableError
    assert str(copy) == str(error)
    assert (copy.store, copy.run_id, copy.record, copy.path) == (
        "S",
        "r",
        "intent",
        "/logs/r.jsonl",
    )
    assert (copy.errno, copy.strerror) == (errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert isinstance(copy, PolyloopError)
    assert isinstance(copy, OSError)


class _DriverError(Exception):
    """A database driver's error as psycopg and asyncpg report one: a ``sqlstate``."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("cause", "fix"),
    [
        (_DriverError("could not extend file: No space left on device", "53100"), "free some"),
        (_DriverError("terminating connection due to administrator command", "57P01"), "make"),
        (OSError(errno.ENOSPC, "No space left on device"), "free some"),
        (OSError(errno.EIO, "Input/output error"), "make"),
    ],
)
def test_a_full_disk_is_named_whether_the_os_or_the_database_reports_it(
    cause: BaseException, fix: str
) -> None:
    from polyloop.stores._writes import unavailable_error

    error = unavailable_error("PostgresRunStore", cause, run_id="r", record="intent")
    wanted = "free some space" if fix == "free some" else "make the store work again"
    assert f"{wanted}, then resume the run" in str(error)
