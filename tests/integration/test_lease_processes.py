"""Run leases across real processes: what ``RunLeaseContract`` cannot check in one process.

A holder in a child process excludes the parent; a holder that is killed frees the run at
once (the kernel drops its ``flock``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polyloop.errors import RunLeaseHeldError
from polyloop.stores import JsonlRunStore

pytestmark = pytest.mark.integration

HOLDER = """
import asyncio, sys
from polyloop.stores import JsonlRunStore

async def main():
    lease = await JsonlRunStore(directory=sys.argv[1]).acquire_lease("run-1")
    print(lease.epoch, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_killed_jsonl_holder_frees_the_run_at_once(tmp_path: Path) -> None:
    store = JsonlRunStore(directory=tmp_path)
    with subprocess.Popen(  # noqa: ASYNC220 - the test blocks on purpose; nothing else runs
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            child_epoch = int(child.stdout.readline())
            with pytest.raises(RunLeaseHeldError):
                await store.acquire_lease("run-1")
        finally:
            child.kill()
            child.wait(timeout=10)
    lease = await store.acquire_lease("run-1")
    assert lease.epoch == child_epoch + 1
    await lease.release()
