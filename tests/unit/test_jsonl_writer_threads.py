"""JSONL store: the writer threads that run its barriers keep the promises of the executor
they replaced (design 0214).

The store runs every write that may ``fsync`` on threads of its own instead of the loop's
default executor. What the default executor gave for free is pinned here: a write whose caller
was cancelled still completes when the interpreter exits right after (``asyncio.run`` used to
wait for the executor), a forked child writes with threads of its own, and a write that fails
in its thread reaches its caller as the store's error.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import polyloop
from polyloop.errors import StoreUnavailableError
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl as jsonl_module
from polyloop.types import Intent, IntentKind, ReplayPolicy, RunStarted

pytestmark = pytest.mark.unit

RUN = "r1"
STARTED = RunStarted(run_id=RUN, parameter_snapshot={"k": "v"})
INTENT = Intent(
    run_id=RUN,
    kind=IntentKind.MODEL_CALL,
    call_index=0,
    result_id="m0",
    replay_policy=ReplayPolicy.NEVER,
)

_PREAMBLE = """
import asyncio, os, sys, time
from polyloop.stores import JsonlRunStore
from polyloop.stores import _jsonl
from polyloop.types import Intent, IntentKind, ReplayPolicy, RunStarted
STARTED = RunStarted(run_id="r1", parameter_snapshot={"k": "v"})
INTENT = Intent(run_id="r1", kind=IntentKind.MODEL_CALL, call_index=0, result_id="m0",
                replay_policy=ReplayPolicy.NEVER)
store = JsonlRunStore(directory=sys.argv[1])
"""

_CANCELLED_THEN_EXIT = """
real = _jsonl._write_all_bytes

def slow(descriptor, data):
    time.sleep(0.5)
    real(descriptor, data)

async def main():
    await store.write_run_started(STARTED)
    _jsonl._write_all_bytes = slow
    write = asyncio.ensure_future(store.write_intent(INTENT))
    await asyncio.sleep(0.05)  # the intent is in its thread, sleeping before its bytes
    write.cancel()
    try:
        await write
    except asyncio.CancelledError:
        print("cancelled")

asyncio.run(main())
# The interpreter exits here, with the intent's bytes not yet written.
"""

_FORKED_CHILD_WRITES = """
asyncio.run(store.write_run_started(STARTED))  # the parent's writer thread exists now
pid = os.fork()
if pid == 0:
    try:
        asyncio.run(asyncio.wait_for(store.write_intent(INTENT), 10))
    except BaseException:
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit code", os.waitstatus_to_exitcode(status))
"""


def _run_child(script: str, directory: Path) -> subprocess.CompletedProcess[str]:
    source = str(Path(polyloop.__file__).resolve().parents[1])
    command = [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _PREAMBLE + script]
    return subprocess.run(
        [*command, str(directory)],
        env={**os.environ, "PYTHONPATH": source},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_a_cancelled_write_completes_when_the_interpreter_exits_right_after(
    tmp_path: Path,
) -> None:
    """The caller was told ``CancelledError``; the write was already in its thread, and
    ``asyncio.run`` returned. The bytes still land before the process ends (the exit hook
    lets queued and running writes finish), as they did with the loop's default executor."""
    child = await asyncio.to_thread(_run_child, _CANCELLED_THEN_EXIT, tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "cancelled"
    log = await JsonlRunStore(directory=tmp_path).read_log(RUN)
    assert log.intents == (INTENT,)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork exists only on POSIX")
async def test_a_forked_child_writes_with_threads_of_its_own(tmp_path: Path) -> None:
    """Threads do not survive ``fork``: without starting afresh, the child would queue its
    write for a thread that exists only in the parent and wait forever."""
    child = await asyncio.to_thread(_run_child, _FORKED_CHILD_WRITES, tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "child exit code 0"
    log = await JsonlRunStore(directory=tmp_path).read_log(RUN)
    assert log.intents == (INTENT,)


async def test_a_failure_in_the_thread_reaches_the_caller_and_frees_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread's ``OSError`` is the caller's ``StoreUnavailableError``; the run's lock is
    free again, so the next write goes through."""
    store = JsonlRunStore(directory=tmp_path)
    await store.write_run_started(STARTED)
    real = jsonl_module._write_all_bytes
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def full_once(descriptor: int, data: bytes) -> None:
        if failures:
            raise failures.pop()
        real(descriptor, data)

    monkeypatch.setattr(jsonl_module, "_write_all_bytes", full_once)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.write_intent(INTENT)
    assert caught.value.errno == errno.ENOSPC
    await asyncio.wait_for(store.write_intent(INTENT), timeout=5)
    assert (await store.read_log(RUN)).intents == (INTENT,)
