"""The MCP policy table (design 0211), the result mapping and ``ToolSpec.origin``, without a
server: the table pinned row by row, every content kind described, the origin's snapshot keys."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pathlib
import re

import pytest

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import ReplayPolicy

pytestmark = pytest.mark.unit

if importlib.util.find_spec("mcp") is None:  # the mcp extra; the dev extra pins it
    if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:  # as tests/_infra.py
        raise ImportError("CI must run the MCP tests, but the mcp SDK is not installed")
    pytest.skip('the mcp SDK is not installed; pip install -e ".[mcp]"', allow_module_level=True)

from mcp.types import (  # noqa: E402 - only once the SDK is known to be there
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from polyloop.mcp import classify  # noqa: E402
from polyloop.mcp._results import observation_of  # noqa: E402

SAFE, IDEMPOTENT, NEVER = ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT, ReplayPolicy.NEVER
READ_ONLY = {"readOnlyHint": True}
IDEMPOTENT_WRITE = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True}
PLAIN_WRITE = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False}

# (annotations, trusted, override) -> policy: the design record's table, row by row.
TABLE = [
    (READ_ONLY, True, None, SAFE),
    ({"readOnlyHint": True, "idempotentHint": False}, True, None, SAFE),
    ({"readOnlyHint": True, "idempotentHint": True}, True, None, SAFE),
    # contradictory (read-only yet destructive): the cautious reading, design 0211
    ({"readOnlyHint": True, "destructiveHint": True}, True, None, NEVER),
    ({"readOnlyHint": True, "destructiveHint": True, "idempotentHint": True}, True, None, NEVER),
    ({"readOnlyHint": True, "destructiveHint": False}, True, None, SAFE),
    (IDEMPOTENT_WRITE, True, None, IDEMPOTENT),
    ({"idempotentHint": True, "destructiveHint": False}, True, None, IDEMPOTENT),
    (PLAIN_WRITE, True, None, NEVER),
    ({"destructiveHint": True}, True, None, NEVER),
    ({}, True, None, NEVER),
    (None, True, None, NEVER),
    ({"readOnlyHint": "true"}, True, None, NEVER),  # only a JSON true counts
    ({"idempotentHint": 1}, True, None, NEVER),
    (READ_ONLY, False, None, NEVER),
    (IDEMPOTENT_WRITE, False, None, NEVER),
    ({}, False, None, NEVER),
    (PLAIN_WRITE, True, SAFE, SAFE),
    (READ_ONLY, True, NEVER, NEVER),
    (READ_ONLY, False, IDEMPOTENT, IDEMPOTENT),
]


@pytest.mark.parametrize(("annotations", "trusted", "override", "policy"), TABLE)
def test_the_policy_is_the_tables(
    annotations: dict[str, object] | None,
    trusted: bool,
    override: ReplayPolicy | None,
    policy: ReplayPolicy,
) -> None:
    chosen, reason = classify(annotations, trusted=trusted, override=override)
    assert chosen is policy
    expected_start = "override" if override else ("trusted" if trusted else "untrusted")
    assert reason.startswith(expected_start)


@pytest.mark.parametrize("hints", [READ_ONLY, IDEMPOTENT_WRITE, PLAIN_WRITE, {}, None])
def test_an_untrusted_server_never_yields_safe(hints: dict[str, object] | None) -> None:
    assert classify(hints, trusted=False) == (NEVER, "untrusted server: annotations not used")


def test_the_design_record_gives_the_same_table() -> None:
    """The record's table names the same policy for each row kind as the code."""
    record = next(
        pathlib.Path(__file__).resolve().parents[2].glob("research-wiki/design/0211-*.md")
    )
    text = record.read_text(encoding="utf-8")
    rows = re.findall(r"^\s*\| (yes|no|any) \| (given|none) \| (.+?) \| `?(\w+)`? \|", text, re.M)
    assert ("no", "none", "any (never read)", "NEVER") in rows
    assert ("yes", "none", "`readOnlyHint: true`, `destructiveHint: true`", "NEVER") in rows
    assert ("yes", "none", "`readOnlyHint: true`", "SAFE") in rows
    assert ("yes", "none", "not read-only, `idempotentHint: true`", "IDEMPOTENT") in rows
    assert ("yes", "none", "anything else", "NEVER") in rows


PNG = base64.b64encode(b"\x89PNG" + bytes(96)).decode()


def result(*blocks: object, structured: object = None, error: bool = False) -> CallToolResult:
    return CallToolResult(content=list(blocks), structured_content=structured, is_error=error)  # type: ignore[arg-type]


def test_every_content_kind_is_described_never_dropped() -> None:
    observation = observation_of(
        result(
            TextContent(text="two files"),
            ImageContent(data=PNG, mime_type="image/png"),
            AudioContent(data=PNG, mime_type="audio/wav"),
            EmbeddedResource(
                resource=TextResourceContents(
                    uri="file:///a.txt", mime_type="text/plain", text="abc"
                )
            ),
            EmbeddedResource(resource=BlobResourceContents(uri="file:///b.bin", blob=PNG)),
            ResourceLink(uri="file:///c.md", name="c.md", mime_type="text/markdown"),
        )
    )
    assert observation.splitlines() == [
        "two files",
        "[image: image/png, 100 bytes]",
        "[audio: audio/wav, 100 bytes]",
        "[resource: file:///a.txt, text/plain, 3 characters]",
        "[resource: file:///b.bin, unknown type, 100 bytes]",
        "[resource link: file:///c.md, text/markdown, c.md]",
    ]


def test_structured_content_is_the_observation_when_there_is_no_text() -> None:
    assert json.loads(observation_of(result(structured={"n": 2}))) == {"n": 2}
    assert observation_of(result(TextContent(text="n is 2"), structured={"n": 2})) == "n is 2"
    assert observation_of(result()) == "(no content)"


def test_an_origin_enters_the_snapshot_under_the_tools_name() -> None:
    spec = ToolSpec(
        name="t",
        description="d",
        parameters={},
        handler=_handler,
        origin={"mcp.server": "odd", "replay_policy_reason": "why"},
    )
    parameters = ToolRegistry([spec]).executor().parameters()
    assert parameters["tool.t.mcp.server"] == "odd"
    assert parameters["tool.t.replay_policy_reason"] == "why"
    plain = ToolSpec(name="t", description="d", parameters={}, handler=_handler)
    assert set(ToolRegistry([plain]).executor().parameters()) == {
        "kind",
        "tool.t.schema",
        "tool.t.replay_policy",
        "tool.t.completes_run",
    }


@pytest.mark.parametrize("key", ["schema", "replay_policy", "completes_run", "needs_approval", " "])
def test_an_origin_may_not_take_the_snapshots_own_keys(key: str) -> None:
    with pytest.raises(PolyloopValueError, match=r"ToolSpec\(name='t'\)\.origin has the key"):
        ToolSpec(name="t", description="d", parameters={}, origin={key: "x"})


def test_an_origin_maps_str_to_str() -> None:
    with pytest.raises(PolyloopTypeError, match=r"origin must map str to str"):
        ToolSpec(name="t", description="d", parameters={}, origin={"n": 1})  # type: ignore[dict-item]


async def _handler(arguments: object) -> str:
    return "ok"


@pytest.mark.parametrize("server", ["filesystem", "everything"])
def test_ci_installs_the_npm_server_versions_the_tests_pin(server: str) -> None:
    root = pathlib.Path(__file__).resolve().parents[2]
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    helper = (root / "tests" / "integration" / "_mcp_servers.py").read_text(encoding="utf-8")
    pinned = re.search(rf'{server.upper()}_VERSION = "([^"]+)"', helper)
    assert pinned is not None
    assert f"mcp_{server}_version={pinned.group(1)}\n" in ci


def test_a_read_only_destructive_tool_says_why_it_is_never() -> None:
    chosen, reason = classify({"readOnlyHint": True, "destructiveHint": True}, trusted=True)
    assert (chosen, reason) == (
        NEVER,
        "trusted server: readOnlyHint and destructiveHint both true (contradictory: cautious)",
    )


@pytest.mark.parametrize(
    ("code", "answered"),
    [
        (-32601, True),  # method not found: refused before it ran
        (-32602, True),  # invalid params (unknown tool, bad arguments): refused before it ran
        (-32000, False),  # the SDK's "Connection closed", "SSE stream ended without a response"
        (-32603, False),  # the SDK's "Server returned an error response" (HTTP 5xx), or a
        # server's internal error: did the tool run? unknown
        (-32600, False),  # the SDK's "Session terminated"
        (-32700, False),  # the SDK's "Failed to parse ..."
        (-32001, False),  # a server-defined code: says nothing about whether it ran
        (1, False),
    ],
)
def test_only_a_refusal_before_running_is_the_servers_answer(code: int, answered: bool) -> None:
    from polyloop.mcp._connection import answered_by_server

    assert answered_by_server(code) is answered


@pytest.mark.parametrize("where", ["headers", "env"])
def test_a_header_or_env_value_of_the_wrong_type_is_named_by_key_and_type_only(
    where: str,
) -> None:
    from polyloop.mcp import McpServer

    secret = b"Bearer sk-SECRET-123"

    def build() -> object:
        if where == "headers":
            return McpServer.http("http://127.0.0.1:1/mcp", headers={"Authorization": secret})  # type: ignore[dict-item]
        return McpServer.stdio("python", env={"API_TOKEN": secret})  # type: ignore[dict-item]

    with pytest.raises(PolyloopTypeError) as caught:
        build()
    message = str(caught.value)
    assert "sk-SECRET" not in message
    assert "bytes" in message
    assert ("'Authorization'" if where == "headers" else "'API_TOKEN'") in message


def test_describe_keeps_no_credentials_of_a_url() -> None:
    from polyloop.mcp import McpServer

    server = McpServer.http(
        "https://user:pw-SECRET@mcp.example:8443/mcp?token=q-SECRET#f", headers={"A": "h-SECRET"}
    )
    assert server.describe() == "http: https://mcp.example:8443/mcp"
    stdio = McpServer.stdio("node", ["index.js", "/srv"], env={"TOKEN": "e-SECRET"})
    assert stdio.describe() == "stdio: node index.js /srv"
    assert "SECRET" not in repr(server) + repr(stdio)


def test_a_non_str_stdio_argument_is_named_by_its_index() -> None:
    from polyloop.mcp import McpServer

    with pytest.raises(
        PolyloopTypeError, match=r"McpServer.stdio args\[1\] must be a str, got int"
    ):
        McpServer.stdio("python", ["-m", 3])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "300", True])
def test_call_timeout_seconds_is_checked(bad: object) -> None:
    from polyloop.mcp import McpServer

    with pytest.raises((PolyloopTypeError, PolyloopValueError), match="call_timeout_seconds"):
        McpServer.stdio("python", call_timeout_seconds=bad)  # type: ignore[arg-type]
    assert McpServer.stdio("python").call_timeout_seconds == 300.0
    assert McpServer.stdio("python", call_timeout_seconds=None).call_timeout_seconds is None
