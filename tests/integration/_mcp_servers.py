"""Where the MCP servers the tests drive are, and the skip (or, in CI, failure) when one is not.

* ``odd``: ``_mcp_odd_server.py`` beside this file, written with the SDK's server API;
* ``git``: ``mcp-server-git`` from PyPI (the dev extra), run as ``python -m mcp_server_git``;
* ``filesystem``: ``@modelcontextprotocol/server-filesystem`` from npm, installed by
  ``.ci/run`` into ``.mcp-servers/`` (gitignored) before the network namespace, run as
  ``node <its dist/index.js>`` (never ``npx``, which would reach the registry);
* ``everything``: ``@modelcontextprotocol/server-everything`` from npm, installed the same way:
  its ``trigger-long-running-operation`` is the call the in-doubt tests kill it in the middle
  of (design 0227), over stdio and streamable HTTP (on 127.0.0.1 only: ``_loopback_only.mjs``
  is preloaded, since the server itself listens on every interface).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from _infra import in_ci, skip_unless_available

if importlib.util.find_spec("mcp") is None:  # the mcp extra; the dev extra pins it
    if in_ci():
        raise ImportError("CI must run the MCP tests, but the mcp SDK is not installed")
    pytest.skip('the mcp SDK is not installed; pip install -e ".[mcp]"', allow_module_level=True)

from polyloop.mcp import McpServer

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
ODD_SERVER = HERE / "_mcp_odd_server.py"
FILESYSTEM_PACKAGE = "@modelcontextprotocol/server-filesystem"
FILESYSTEM_VERSION = "2026.8.31"  # .ci/run installs this version (a unit test checks it)
FILESYSTEM_ENTRY = ROOT / ".mcp-servers" / "node_modules" / FILESYSTEM_PACKAGE / "dist" / "index.js"
NPM_INSTALL = (
    f"npm install --prefix .mcp-servers --no-audit --no-fund "
    f"{FILESYSTEM_PACKAGE}@{FILESYSTEM_VERSION} (with Debian's nodejs and npm)"
)
EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = "2026.8.31"  # .ci/run installs this version (a unit test checks it)
EVERYTHING_ENTRY = ROOT / ".mcp-servers" / "node_modules" / EVERYTHING_PACKAGE / "dist" / "index.js"
LOOPBACK_ONLY = HERE / "_loopback_only.mjs"
EVERYTHING_INSTALL = (
    f"npm install --prefix .mcp-servers --no-audit --no-fund "
    f"{EVERYTHING_PACKAGE}@{EVERYTHING_VERSION} (with Debian's nodejs and npm)"
)


def odd_server(ledger: Path, *, variant: int = 1, trusted: bool = True) -> McpServer:
    return McpServer.stdio(
        sys.executable, [str(ODD_SERVER), str(ledger), "--variant", str(variant)], trusted=trusted
    )


def git_server(repository: Path, *, trusted: bool = True) -> McpServer:
    skip_unless_available(
        importlib.util.find_spec("mcp_server_git") is not None,
        what="mcp-server-git (a real MCP server from PyPI)",
        how_to_install='pip install -e ".[dev]" (it pins mcp-server-git)',
    )
    return McpServer.stdio(
        sys.executable, ["-m", "mcp_server_git", "--repository", str(repository)], trusted=trusted
    )


def filesystem_server(root: Path, *, trusted: bool = True) -> McpServer:
    node = shutil.which("node")
    skip_unless_available(
        node is not None,
        what="node (for the npm MCP filesystem server)",
        how_to_install=NPM_INSTALL,
    )
    skip_unless_available(
        FILESYSTEM_ENTRY.is_file(),
        what=f"{FILESYSTEM_PACKAGE} in .mcp-servers/",
        how_to_install=NPM_INSTALL,
    )
    assert node is not None
    return McpServer.stdio(node, [str(FILESYSTEM_ENTRY), str(root)], trusted=trusted)


def everything_command() -> list[str]:
    """``node <server-everything's dist/index.js>`` (add ``stdio`` or ``streamableHttp``)."""
    node = shutil.which("node")
    skip_unless_available(
        node is not None,
        what="node (for the npm MCP everything server)",
        how_to_install=EVERYTHING_INSTALL,
    )
    skip_unless_available(
        EVERYTHING_ENTRY.is_file(),
        what=f"{EVERYTHING_PACKAGE} in .mcp-servers/",
        how_to_install=EVERYTHING_INSTALL,
    )
    assert node is not None
    return [node, "--import", LOOPBACK_ONLY.as_uri(), str(EVERYTHING_ENTRY)]


def agent_run(
    replies: list[str], tools: object, run_id: str, store: object, **request: object
) -> tuple[object, object]:
    """An ``AgentDefinition`` and ``RunRequest`` whose model speaks ``replies`` (JSON tool calls
    and a final answer, ``JsonToolCallParser``'s form) to ``tools`` (a ``ToolRegistry``)."""
    from polyloop.parsers import JsonToolCallParser
    from polyloop.session import AgentDefinition, RunRequest
    from polyloop.testing import ScriptedModelClient
    from polyloop.types import Budget, Context, Message, ReplayPolicy, Role, TextBlock

    definition = AgentDefinition(
        model_client=ScriptedModelClient(replies, parameters={"kind": "mcp-script"}),
        decision_parser=JsonToolCallParser(),
        store=store,  # type: ignore[arg-type]
    )
    run_request = RunRequest(
        run_id=run_id,
        context=Context(
            run_level=(Message(role=Role.USER, content=(TextBlock(text="use the tools"),)),)
        ),
        model_replay_policy=ReplayPolicy.SAFE,
        budget=Budget(max_steps=len(replies) + 2, max_actions=len(replies) + 2),
        tools=tools,  # type: ignore[arg-type]
        **request,  # type: ignore[arg-type]
    )
    return definition, run_request
