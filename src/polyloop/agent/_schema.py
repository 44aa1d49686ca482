"""Checking a JSON value against a JSON Schema: the subset structured output enforces.

Enforced: ``type`` (a name or a list of names; ``3.0`` is an integer, a boolean is not a
number), ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties`` (``false``
or a schema; not checked when ``patternProperties`` is present), ``items``, ``anyOf``,
``oneOf``, ``allOf`` and local ``$ref`` (``#/$defs/...``, ``#/definitions/...``, any JSON
pointer into the schema). Everything else (``format``, ranges, lengths, patterns) is shown to
the model and not enforced. Each problem names where it is (``the field 'address.zip'``,
``the field 'items[2]'``, or ``the answer`` itself) and what was expected (design 0208).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

from polyloop._common import JSON_TYPE_CHECKS, json_type_of
from polyloop.errors import PolyloopValueError

__all__ = ["check_refs", "problems_of"]

_MAX_DEPTH: Final = 200
"""Schema levels one check descends at most (a ``$ref`` cycle that consumes no data)."""


def described(value: object) -> str:
    """``string 'forty'``, ``integer 3``, ``null``, ``object``, ``array of 2``: for messages."""
    kind = json_type_of(value)
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"{kind} {json.dumps(shown, ensure_ascii=False)}"
    if isinstance(value, bool | int | float):
        return f"{kind} {json.dumps(value)}"
    if isinstance(value, list | tuple):
        return f"an array of {len(value)}"
    if isinstance(value, Mapping):
        return "an object"
    return kind


def where(path: str) -> str:
    return f"the field {path!r}" if path else "the answer"


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _same(value: object, option: object) -> bool:
    """JSON equality: ``1 == 1.0``, but a boolean equals only a boolean."""
    if isinstance(value, bool) or isinstance(option, bool):
        return isinstance(value, bool) and isinstance(option, bool) and value is option
    return value == option


def _resolve(root: Mapping[str, object], ref: str) -> object:
    if not ref.startswith("#"):
        raise PolyloopValueError(
            f"the schema's $ref {ref!r} points outside the schema; only local references "
            "('#/$defs/Name') are supported: inline the referenced schema"
        )
    node: object = root
    for raw in filter(None, ref[1:].split("/")):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, Sequence) and not isinstance(node, str) and part.isdigit():
            index = int(part)
            if index >= len(node):
                raise PolyloopValueError(f"the schema's $ref {ref!r} points to nothing")
            node = node[index]
        else:
            raise PolyloopValueError(f"the schema's $ref {ref!r} points to nothing")
    return node


def check_refs(root: Mapping[str, object]) -> None:
    """Refuse a schema with a ``$ref`` that does not resolve (before any model sees it)."""
    pending: list[object] = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str):
                _resolve(root, ref)
            pending.extend(node.values())
        elif isinstance(node, list | tuple):
            pending.extend(node)


class _Checker:
    """One check of one value; ``root`` resolves ``$ref``."""

    def __init__(self, root: Mapping[str, object]) -> None:
        self._root = root

    def problems(self, schema: object, value: object, path: str, depth: int = 0) -> list[str]:
        if depth > _MAX_DEPTH:
            return [f"{where(path)} is nested too deeply for its schema"]
        if isinstance(schema, bool):
            return [] if schema else [f"{where(path)} is not allowed"]
        if not isinstance(schema, Mapping):
            return []
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.problems(_resolve(self._root, ref), value, path, depth + 1)
        early = self._kind(schema, value, path)
        if early:
            return early
        found = self._alternatives(schema, value, path, depth)
        if found:
            return found
        for part in schema.get("allOf", ()) if isinstance(schema.get("allOf"), list) else ():
            found += self.problems(part, value, path, depth + 1)
        if isinstance(value, Mapping):
            found += self._object(schema, value, path, depth)
        elif isinstance(value, list | tuple) and "items" in schema:
            for index, item in enumerate(value):
                found += self.problems(schema["items"], item, f"{path}[{index}]", depth + 1)
        return found

    def _kind(self, schema: Mapping[str, object], value: object, path: str) -> list[str]:
        declared = schema.get("type")
        names = [declared] if isinstance(declared, str) else declared
        if isinstance(names, list) and names:
            known = [name for name in names if isinstance(name, str) and name in JSON_TYPE_CHECKS]
            if known and not any(JSON_TYPE_CHECKS[name](value) for name in known):
                return [f"{where(path)} must be {' or '.join(known)}, got {described(value)}"]
        if "const" in schema and not _same(value, schema["const"]):
            expected = json.dumps(schema["const"], ensure_ascii=False)
            return [f"{where(path)} must be {expected}, got {described(value)}"]
        options = schema.get("enum")
        if isinstance(options, list) and not any(_same(value, option) for option in options):
            listed = ", ".join(json.dumps(option, ensure_ascii=False) for option in options)
            return [f"{where(path)} must be one of {listed}, got {described(value)}"]
        return []

    def _alternatives(
        self, schema: Mapping[str, object], value: object, path: str, depth: int
    ) -> list[str]:
        for keyword in ("anyOf", "oneOf"):
            options = schema.get(keyword)
            if not isinstance(options, list) or not options:
                continue
            results = [self.problems(option, value, path, depth + 1) for option in options]
            fitting = sum(not result for result in results)
            if keyword == "oneOf" and fitting > 1:
                return [f"{where(path)} fits more than one of its allowed forms"]
            if fitting:
                continue
            # The one form whose type the value has says best what is wrong inside it.
            typed = [
                result
                for option, result in zip(options, results, strict=True)
                if not self._kind(_declared_type_only(option), value, path)
            ]
            if len(typed) == 1:
                return typed[0]
            return [f"{where(path)} fits none of its allowed forms: {'; '.join(results[0])}"]
        return []

    def _object(
        self, schema: Mapping[str, object], value: Mapping[object, object], path: str, depth: int
    ) -> list[str]:
        found: list[str] = []
        properties = schema.get("properties")
        declared = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        for name in required if isinstance(required, list) else ():
            if isinstance(name, str) and name not in value:
                found.append(f"{where(_child(path, name))} is missing")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            child = _child(path, str(key))
            if key in declared:
                found += self.problems(declared[key], item, child, depth + 1)
            elif "patternProperties" in schema:
                continue
            elif extra is False:
                allowed = ", ".join(repr(name) for name in declared) or "none"
                found.append(f"{where(child)} is not expected (the fields are {allowed})")
            elif isinstance(extra, Mapping):
                found += self.problems(extra, item, child, depth + 1)
        return found


def _declared_type_only(option: object) -> Mapping[str, object]:
    if isinstance(option, Mapping) and "type" in option:
        return {"type": option["type"]}
    return {}


def problems_of(schema: Mapping[str, object], value: object) -> list[str]:
    """Every problem of ``value`` against ``schema`` (empty: it fits), in document order."""
    return _Checker(schema).problems(schema, value, "")
