"""No class over 350 lines and no function over 80 in ``src/polyloop``, docstrings not counted.

The limits are issue 20's: past them a definition has more than one reason to change. The
measuring rule, stated once (``_measured`` is it):

* A definition's span is ``end_lineno - lineno + 1`` of its ``def``/``async def``/``class``
  node: from the ``def`` or ``class`` line (decorators above it are not counted) to its last
  line, with the blank lines and comments inside it.
* From the span, every line of documentation inside it is taken away. Documentation is a
  statement that is nothing but a string literal: the definition's docstring, the docstrings
  of the functions and classes nested in it (a class's methods), and attribute docstrings (the
  string under a class attribute or an enum member, as ``ResumeAction`` has). Such a statement
  runs nothing, so documenting more never breaks the limit. An f-string statement is code.
* A nested definition counts in its parent's length and is also measured on its own, under
  its qualified name (``Class.method``, ``outer.<locals>.inner``). A lambda is part of the
  definition around it.

A failure names ``file:line``, the qualified name, the length and the limit.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "polyloop"
FUNCTION_LIMIT = 80
CLASS_LIMIT = 350

_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Measured:
    """One definition's length under the rule in the module docstring."""

    where: str  # "src/polyloop/<file>.py:<line>", the line of the def or class keyword
    qualified_name: str
    is_class: bool
    length: int


def _is_documentation(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _documentation_lines(definition: _Definition) -> int:
    """The lines of every string-literal statement inside ``definition``, its docstring too."""
    return sum(
        node.end_lineno - node.lineno + 1
        for node in ast.walk(definition)
        if _is_documentation(node) and node.end_lineno is not None
    )


def _measured(path: Path, source: str) -> Iterator[Measured]:
    """Every function and class in ``source`` (nested ones too), measured."""
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)

    def visit(node: ast.AST, prefix: str) -> Iterator[Measured]:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _Definition):
                yield from visit(child, prefix)
                continue
            name = prefix + child.name
            assert child.end_lineno is not None
            span = child.end_lineno - child.lineno + 1
            is_class = isinstance(child, ast.ClassDef)
            yield Measured(
                where=f"{where}:{child.lineno}",
                qualified_name=name,
                is_class=is_class,
                length=span - _documentation_lines(child),
            )
            yield from visit(child, f"{name}." if is_class else f"{name}.<locals>.")

    yield from visit(ast.parse(source, filename=str(path)), "")


def _all_measured() -> list[Measured]:
    return [
        measured
        for path in sorted(SRC.rglob("*.py"))
        for measured in _measured(path, path.read_text(encoding="utf-8"))
    ]


def _over(*, is_class: bool, limit: int) -> list[str]:
    kind = "class" if is_class else "function"
    return [
        f"{m.where}: {kind} {m.qualified_name} is {m.length} lines, over the limit of {limit} "
        "(docstrings not counted); split it along its real seams"
        for m in _all_measured()
        if m.is_class is is_class and m.length > limit
    ]


def test_no_function_in_src_is_over_80_lines() -> None:
    over = _over(is_class=False, limit=FUNCTION_LIMIT)
    assert not over, "\n".join(over)


def test_no_class_in_src_is_over_350_lines() -> None:
    over = _over(is_class=True, limit=CLASS_LIMIT)
    assert not over, "\n".join(over)


def test_the_check_sees_the_whole_package() -> None:
    # A wrong SRC would make the two tests above pass on nothing.
    names = {m.qualified_name for m in _all_measured()}
    assert len(list(SRC.rglob("*.py"))) > 20
    assert {"plan_resume", "GatewayModelClient.call", "check_log"} <= names


SAMPLE = '''\
class Sample:
    """A docstring
    of three lines.
    """

    limit: int = 3
    """An attribute docstring."""

    @property
    def method(self) -> int:
        """Its docstring."""
        # a comment counts

        def inner() -> str:
            """Nested."""
            return f"{self.limit}"

        return len(inner())


async def free() -> None:
    f"an f-string statement is code"
'''


def test_the_rule_takes_away_documentation_only() -> None:
    measured = {m.qualified_name: m for m in _measured(Path("sample.py"), SAMPLE)}
    assert {name: m.length for name, m in measured.items()} == {
        "Sample": 18 - 3 - 1 - 1 - 1,
        "Sample.method": 9 - 1 - 1,
        "Sample.method.<locals>.inner": 3 - 1,
        "free": 2,
    }
    assert measured["Sample.method"].where == "sample.py:10", "the def line, not the decorator"
    assert measured["Sample"].is_class
    assert not measured["free"].is_class
