"""polyloop.mcp against two real MCP servers nobody here wrote, over stdio (design 0211):
``mcp-server-git`` (PyPI) and ``@modelcontextprotocol/server-filesystem`` (npm, on Debian's
node). Every tool listed and classified as its annotations say, trusted and untrusted; an agent
run that reads and writes through them; a SIGKILL during ``git_commit`` resumed without
repeating it. In CI a missing server or node fails these tests (``tests/_infra.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _mcp_servers import agent_run, filesystem_server, git_server

from polyloop.mcp import McpToolset
from polyloop.session import check_log, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import ReplayPolicy, StopReason

pytestmark = pytest.mark.integration

SAFE, IDEMPOTENT, NEVER = ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT, ReplayPolicy.NEVER

# The policy table of design 0211 applied to each server's annotations (as the spec brief
# lists them): read-only -> SAFE, idempotent -> IDEMPOTENT, anything else -> NEVER.
FILESYSTEM_POLICIES = {
    "read_file": SAFE,
    "read_text_file": SAFE,
    "read_media_file": SAFE,
    "read_multiple_files": SAFE,
    "list_directory": SAFE,
    "list_directory_with_sizes": SAFE,
    "list_allowed_directories": SAFE,
    "directory_tree": SAFE,
    "search_files": SAFE,
    "get_file_info": SAFE,
    "write_file": IDEMPOTENT,  # destructive and idempotent
    "create_directory": IDEMPOTENT,  # idempotent, not destructive
    "edit_file": NEVER,  # destructive, not idempotent
    "move_file": NEVER,
}
GIT_POLICIES = {
    "git_status": SAFE,
    "git_log": SAFE,
    "git_diff": SAFE,
    "git_diff_staged": SAFE,
    "git_diff_unstaged": SAFE,
    "git_show": SAFE,
    "git_branch": SAFE,
    "git_add": IDEMPOTENT,
    "git_reset": IDEMPOTENT,  # destructive and idempotent
    "git_commit": NEVER,
    "git_create_branch": NEVER,
    "git_checkout": NEVER,
}
HERE = Path(__file__).parent
CHILD = HERE / "_mcp_git_child.py"
STARTUP_SECONDS = 60.0


def git(repository: Path, *args: str) -> str:
    completed = subprocess.run(
        ["git", "-C", str(repository), *args], capture_output=True, text=True, check=True
    )
    return completed.stdout


def make_repository(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "polyloop tests")
    git(path, "config", "user.email", "tests@polyloop.invalid")
    (path / "README").write_text("first\n", encoding="utf-8")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "first")
    return path


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
async def test_every_filesystem_tool_is_classified_as_its_annotations_say(
    tmp_path: Path, trusted: bool
) -> None:
    async with McpToolset(filesystem_server(tmp_path, trusted=trusted)) as toolset:
        policies = {spec.name: spec.replay_policy for spec in toolset.specs()}
        table = toolset.table()
    expected = FILESYSTEM_POLICIES if trusted else dict.fromkeys(FILESYSTEM_POLICIES, NEVER)
    assert policies == expected, table


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
async def test_every_git_tool_is_classified_as_its_annotations_say(
    tmp_path: Path, trusted: bool
) -> None:
    repository = make_repository(tmp_path / "repo")
    async with McpToolset(git_server(repository, trusted=trusted)) as toolset:
        policies = {spec.name: spec.replay_policy for spec in toolset.specs()}
        table = toolset.table()
    expected = GIT_POLICIES if trusted else dict.fromkeys(GIT_POLICIES, NEVER)
    assert policies == expected, table


async def test_an_agent_reads_and_writes_through_both_servers(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    repository = make_repository(files / "repo")
    note = repository / "note.txt"
    replies = [
        json.dumps({"tool": "write_file", "arguments": {"path": str(note), "content": "hi\n"}}),
        json.dumps({"tool": "read_text_file", "arguments": {"path": str(note)}}),
        json.dumps(
            {"tool": "git_add", "arguments": {"repo_path": str(repository), "files": ["note.txt"]}}
        ),
        json.dumps(
            {
                "tool": "git_commit",
                "arguments": {"repo_path": str(repository), "message": "add a note"},
            }
        ),
        json.dumps({"tool": "git_log", "arguments": {"repo_path": str(repository)}}),
        json.dumps({"final_answer": "committed"}),
    ]
    servers = (filesystem_server(files), git_server(repository))
    async with McpToolset(*servers) as toolset:
        definition, request = agent_run(replies, toolset.registry(), "run-rw", VolatileRunStore())
        result = await run(definition, request)  # type: ignore[arg-type]
    assert result.stop_reason is StopReason.FINAL_ANSWER, [s.observation for s in result.steps]
    observations = [step.observation for step in result.steps]
    assert "hi" in observations[1]
    assert "add a note" in observations[4]
    assert note.read_text(encoding="utf-8") == "hi\n"
    assert git(repository, "log", "--format=%s").splitlines() == ["add a note", "first"]


def test_a_sigkill_during_git_commit_is_resumed_without_repeating_it(tmp_path: Path) -> None:
    """The child runs ``git_add`` then ``git_commit``; a pre-commit hook holds the commit, the
    test SIGKILLs the child inside it (the execution is in doubt), lets the orphaned server
    finish, and resumes: the reconciler (``git log``) finds the commit, so it is not made again."""
    repository = make_repository(tmp_path / "repo")
    (repository / "change.txt").write_text("change\n", encoding="utf-8")
    started, done = tmp_path / "hook-started", tmp_path / "hook-done"
    hook = repository / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch '{started}'\nsleep 2\ntouch '{done}'\n", encoding="utf-8")
    hook.chmod(0o755)
    runs = tmp_path / "runs"
    git_server(repository)  # skips (fails in CI) when the server is missing
    command = [sys.executable, str(CHILD), str(runs), "run-kill", str(repository)]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, cwd=HERE)
    deadline = time.monotonic() + STARTUP_SECONDS
    while not started.exists():
        assert child.poll() is None, "the child ended before its commit started"
        assert time.monotonic() < deadline, "the commit did not start"
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + STARTUP_SECONDS
    while not done.exists():  # the orphaned server finishes the commit it was making
        assert time.monotonic() < deadline, "the interrupted commit never finished"
        time.sleep(0.05)
    while git(repository, "log", "-1", "--format=%s").strip() != "the change":
        assert time.monotonic() < deadline, "the interrupted commit never landed"
        time.sleep(0.05)
    started.unlink()
    resumed = subprocess.run(
        command, capture_output=True, text=True, cwd=HERE, timeout=STARTUP_SECONDS
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split()[-2:] == ["DONE", "final_answer"], resumed.stdout
    assert git(repository, "log", "--format=%s").splitlines() == ["the change", "first"]
    assert not started.exists(), "the commit ran again on resume"
    run_log = asyncio.run(JsonlRunStore(directory=runs).read_log("run-kill"))
    assert [s.verdict.value for s in run_log.settlements] == ["executed"]
    assert check_log(run_log, "run-kill") is None
