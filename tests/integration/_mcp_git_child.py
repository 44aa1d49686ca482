"""One agent run that commits through mcp-server-git, for the SIGKILL test:
``python _mcp_git_child.py DIR RUN_ID REPOSITORY``.

The run stages ``change.txt`` (``git_add``, ``IDEMPOTENT``) and commits it (``git_commit``,
``NEVER``), then answers. ``git_commit`` gets a reconciler that asks the repository (``git
log``) whether the commit exists, the way a user adds one to an MCP tool
(``dataclasses.replace(spec, reconcile=...)``). The run is brought to an end with
``run_or_resume`` on a ``JsonlRunStore`` in ``DIR``; the child prints ``DONE <stop_reason>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _infra

from _mcp_servers import agent_run, git_server

from polyloop.mcp import McpToolset
from polyloop.session import run_or_resume
from polyloop.stores import JsonlRunStore
from polyloop.tools import Reconciliation, ToolContext, ToolRegistry

MESSAGE = "the change"


def replies(repository: Path) -> list[str]:
    where = str(repository)
    return [
        json.dumps({"tool": "git_add", "arguments": {"repo_path": where, "files": ["change.txt"]}}),
        json.dumps({"tool": "git_commit", "arguments": {"repo_path": where, "message": MESSAGE}}),
        json.dumps({"final_answer": "committed"}),
    ]


def reconciler_for(repository: Path):  # type: ignore[no-untyped-def]
    def subjects() -> list[str]:
        return subprocess.run(
            ["git", "-C", str(repository), "log", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()

    async def reconcile(context: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        """Whether a commit with the call's message exists (it must not commit itself)."""
        for line in await asyncio.to_thread(subjects):
            if line.split(" ", 1)[1] == arguments["message"]:
                return Reconciliation.executed(f"Changes committed successfully with hash {line}")
        return Reconciliation.not_executed()

    return reconcile


async def main(directory: Path, run_id: str, repository: Path) -> None:
    async with McpToolset(git_server(repository, trusted=True)) as toolset:
        specs = [
            dataclasses.replace(spec, reconcile=reconciler_for(repository))
            if spec.name == "git_commit"
            else spec
            for spec in toolset.specs()
        ]
        definition, request = agent_run(
            replies(repository), ToolRegistry(specs), run_id, JsonlRunStore(directory=directory)
        )
        result = await run_or_resume(definition, request)  # type: ignore[arg-type]
    print("DONE", result.stop_reason.value, flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))
