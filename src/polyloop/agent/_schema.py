"""A structured answer checked against its JSON Schema, in the words the model reads.

The check is the library's one JSON Schema check, ``polyloop._common.JsonSchema`` (design
0223), the same that ``ToolRegistry.validate`` runs on tool arguments: its docstring lists the
keywords it enforces; everything else (``format``, ranges, lengths, patterns) is shown to the
model and not enforced. Here every problem is reported, each naming where it is (``the field
'address.zip'``, ``the field 'items[2]'``, or ``the answer`` itself) and what was expected
(design 0208); a ``$ref`` that does not resolve is refused before any model sees the schema.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyloop._common import JsonSchema, SchemaProblem, resolve_ref

__all__ = ["check_refs", "compiled", "problems_of"]


def where(problem: SchemaProblem) -> str:
    return f"the field {problem.dotted!r}" if problem.path else "the answer"


def check_refs(root: Mapping[str, object]) -> None:
    """Refuse a schema with a ``$ref`` that does not resolve (before any model sees it)."""
    pending: list[object] = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str):
                resolve_ref(root, ref)
            pending.extend(node.values())
        elif isinstance(node, list | tuple):
            pending.extend(node)


def compiled(schema: Mapping[str, object]) -> JsonSchema:
    """``schema`` compiled for ``problems_of``; ``PolyloopValueError`` for a ``$ref`` that
    does not resolve."""
    check_refs(schema)
    return JsonSchema(schema, refs_must_resolve=True)


def problems_of(schema: JsonSchema, value: object) -> list[str]:
    """Every problem of ``value`` against ``schema`` (empty: it fits), in document order."""
    return [problem.worded(where) for problem in schema.problems(value)]
