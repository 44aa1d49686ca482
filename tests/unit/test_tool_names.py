"""Tool names are provider-safe (issue 36, point 5; design 0233): ``ToolSpec`` and ``@tool``
refuse a name outside ``TOOL_NAME_PATTERN`` with an error naming the rule, the field and the
fix; ``safe_tool_name`` maps any text to such a name deterministically; ``approvals`` shows a
name outside the pattern (a log written before the rule) with its non-ASCII escaped, so a
Cyrillic ``r\\u0435fund`` cannot pass for ``refund``."""

from __future__ import annotations

import re

import pytest

from polyloop import tool
from polyloop.errors import PolyloopValueError
from polyloop.inspect._text import approval_lines, shown_tool_name
from polyloop.inspect._view import ApprovalView
from polyloop.tools import TOOL_NAME_PATTERN, ToolSpec, safe_tool_name

pytestmark = pytest.mark.unit

HOMOGLYPH = "r\u0435fund"  # a Cyrillic small ie (U+0435): prints like "refund"
SCHEMA = {"type": "object", "properties": {}}


def test_the_pattern_is_openais() -> None:
    assert TOOL_NAME_PATTERN == r"^[a-zA-Z0-9_-]{1,64}$"


@pytest.mark.parametrize("name", ["refund", "read_file", "git-status", "A" * 64, "x1"])
def test_a_provider_safe_name_is_accepted(name: str) -> None:
    assert ToolSpec(name=name, description="d", parameters=SCHEMA).name == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        (HOMOGLYPH, "contains '\u0435' (U+0435 CYRILLIC SMALL LETTER IE)"),
        ("files.read", "contains '.' (U+002E FULL STOP)"),
        ("fs/read", "contains '/' (U+002F SOLIDUS)"),
        ("a,b", "contains ',' (U+002C COMMA)"),
        ("two words", "contains ' ' (U+0020 SPACE)"),
        ("x" * 65, "is 65 characters long (at most 64)"),
    ],
)
def test_any_other_name_is_refused_naming_the_rule_the_field_and_the_fix(
    name: str, problem: str
) -> None:
    with pytest.raises(PolyloopValueError) as caught:
        ToolSpec(name=name, description="d", parameters=SCHEMA)
    message = str(caught.value)
    assert message.startswith("ToolSpec.name (the tool name, a str) ")
    assert problem in message
    assert TOOL_NAME_PATTERN in message
    assert f"rename it, e.g. {safe_tool_name(name)!r}" in message
    assert HOMOGLYPH not in message  # the value is shown escaped (ascii), never as a lookalike


def test_at_tool_refuses_a_homoglyph_function_name_and_says_how_to_rename() -> None:
    namespace: dict[str, object] = {}
    exec(
        f'async def {HOMOGLYPH}(order: str) -> str:\n    """Refund."""\n    return order\n',
        namespace,
    )
    with pytest.raises(PolyloopValueError, match=r"@tool: @tool\(name=\.\.\.\) or rename"):
        tool(namespace[HOMOGLYPH])  # type: ignore[arg-type]
    with pytest.raises(PolyloopValueError, match=r"'files\.read' contains '\.'"):
        tool(name="files.read")(namespace[HOMOGLYPH])  # type: ignore[arg-type]


def test_safe_tool_name_keeps_a_safe_name_and_maps_others_apart_and_alike_everywhere() -> None:
    assert safe_tool_name("refund") == "refund"
    mapped = safe_tool_name(HOMOGLYPH)
    assert re.fullmatch(TOOL_NAME_PATTERN, mapped)
    assert mapped != "refund"
    assert mapped.startswith("r_fund_")
    assert safe_tool_name(HOMOGLYPH) == mapped  # deterministic: a resume maps it the same way
    assert safe_tool_name("files.read") != safe_tool_name("files/read")
    long = safe_tool_name("server_" + "x" * 100)
    assert len(long) == 64
    assert re.fullmatch(TOOL_NAME_PATTERN, long)
    assert re.fullmatch(TOOL_NAME_PATTERN, safe_tool_name("ééé"))


def _request(name: str) -> ApprovalView:
    return ApprovalView(
        step_idx=1,
        result_id="s1-action",
        tool=name,
        tool_call_id=None,
        arguments='{"order": "A-1"}',
        digest="sha256:00",
        requested_at="2026-12-01T00:00:00Z",
        expires_at=None,
        line=4,
    )


def test_approvals_shows_a_name_outside_the_pattern_escaped_and_says_why() -> None:
    assert shown_tool_name("refund") == "refund"
    lines = approval_lines(_request(HOMOGLYPH), None)
    joined = "\n".join(lines)
    assert HOMOGLYPH not in joined
    assert "tool 'r\\u0435fund' (not a provider-safe name" in joined
    plain = "\n".join(approval_lines(_request("refund"), None))
    assert "tool refund," in plain or plain.split("\n")[0].endswith("tool refund")
