"""Helpers shared by several polyloop modules. Internal: not part of the public API.

The module is private (``polyloop._common``) but its names are public, so that ``types``,
``ports``, ``tools``, ``session`` and the adapters can share one implementation of each check
without any module importing another module's private names (design 0110).

It sits just above ``polyloop.errors`` (it raises ``PolyloopTypeError`` and
``PolyloopValueError``) and below ``polyloop.types``; it imports nothing else from polyloop and
nothing third-party (contract ``r4c-common-is-low``).

It also holds the library's one JSON Schema check (``JsonSchema``, design 0223), which tool
arguments (``polyloop.tools``) and structured answers (``polyloop.agent``) share.

The error rule every check here follows (design 0110): a value of the wrong *type* raises
``PolyloopTypeError`` (a ``TypeError``); a value of the right type that is not allowed raises
``PolyloopValueError`` (a ``ValueError``). Messages name the field as ``<owner>.<name>``.
"""

from __future__ import annotations

import decimal
import enum
import inspect
import json
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, MemberDescriptorType
from typing import Any, Final, TypeVar, overload

from polyloop.errors import PolyloopTypeError, PolyloopValueError

__all__ = [
    "EXACT_MONEY",
    "JSON_TYPE_CHECKS",
    "PER_MILLION",
    "JsonSchema",
    "SchemaProblem",
    "check_bound",
    "check_seconds",
    "claim_public_names",
    "describe_exception",
    "described_value",
    "frozen",
    "frozen_str_mapping",
    "is_async_callable",
    "is_plain_function",
    "is_private_module",
    "json_equal",
    "json_type_of",
    "money_text",
    "require_bool",
    "require_enum",
    "require_int",
    "require_money",
    "require_nonempty_str",
    "require_str",
    "resolve_ref",
    "thawed",
    "trusted",
    "tuple_of",
]

_K = TypeVar("_K")
_V = TypeVar("_V")
_R = TypeVar("_R")


# --------------------------------------------------------------------------- field checks


def require_str(owner: str, name: str, value: object) -> None:
    """``PolyloopTypeError`` unless ``value`` is a ``str``."""
    if not isinstance(value, str):
        raise PolyloopTypeError(f"{owner}.{name} must be a str, got {type(value).__name__}")


def require_nonempty_str(owner: str, name: str, value: object) -> None:
    """``require_str``, then ``PolyloopValueError`` for ``""``."""
    require_str(owner, name, value)
    if value == "":
        raise PolyloopValueError(f"{owner}.{name} must be a non-empty string")


def require_bool(owner: str, name: str, value: object) -> None:
    """``PolyloopTypeError`` unless ``value`` is a ``bool``."""
    if not isinstance(value, bool):
        raise PolyloopTypeError(f"{owner}.{name} must be a bool, got {type(value).__name__}")


def require_int(owner: str, name: str, value: object, *, minimum: int) -> None:
    """``PolyloopTypeError`` unless ``value`` is an ``int`` (``bool`` is refused);
    ``PolyloopValueError`` when it is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolyloopTypeError(f"{owner}.{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise PolyloopValueError(f"{owner}.{name} must be >= {minimum}, got {value}")


EXACT_MONEY: Final = decimal.Context(
    prec=200, traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow]
)
"""Decimal arithmetic for costs: tokens times a price is exact, and an inexact result (prices
with more than about 190 digits) raises instead of being rounded."""

PER_MILLION: Final = decimal.Decimal(1_000_000)


def require_money(
    owner: str, name: str, value: object, *, positive: bool = False
) -> decimal.Decimal:
    """``value`` as a finite ``Decimal`` >= 0 (> 0 with ``positive``), or raise naming ``name``.

    A ``Decimal``, an ``int`` or a decimal string (``"2.50"``) is taken; a ``float`` is refused
    (most decimal prices have no exact binary form), so is a ``bool``.
    """
    where = f"{owner}.{name}"
    if isinstance(value, float):
        raise PolyloopTypeError(
            f"{where} must be a Decimal, an int or a decimal string, got float {value!r}; a "
            f"float cannot hold most prices exactly: write Decimal({str(value)!r}) or "
            f"{str(value)!r}"
        )
    if isinstance(value, bool) or not isinstance(value, decimal.Decimal | int | str):
        raise PolyloopTypeError(
            f"{where} must be a Decimal, an int or a decimal string, got {type(value).__name__}"
        )
    try:
        amount = decimal.Decimal(value.strip() if isinstance(value, str) else value)
    except decimal.InvalidOperation:
        raise PolyloopValueError(
            f"{where} must be a decimal number such as '2.50', got {value!r}"
        ) from None
    if not amount.is_finite() or amount < 0 or (positive and amount == 0):
        bound = "> 0" if positive else ">= 0"
        raise PolyloopValueError(f"{where} must be finite and {bound}, got {value!r}")
    return amount


def money_text(amount: decimal.Decimal) -> str:
    """``amount`` in plain positional notation, trailing zeros removed (``"0.0125"``, ``"10"``):
    how costs and prices are written in logs and the parameter snapshot."""
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def check_bound(value: object, *, named: str) -> float | None:
    """``value`` as a ``float`` if it is a finite number of seconds > 0, ``None`` if it is
    ``None`` (no bound), else raise: the one check of every time bound (a model call's, an
    action's, an approval's expiry, an HTTP read). ``named`` is how the message names the
    argument (``"RunRequest.action_timeout_seconds"``, ``"Agent(action_timeout_seconds=...)"``):
    ``PolyloopTypeError`` "<named> must be a number of seconds or None (no bound), got <type>"
    for a non-number or a ``bool``; ``PolyloopValueError`` "<named> must be finite and > 0, or
    None for no bound; got <repr>" for NaN, an infinity, 0 or less."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(
            f"{named} must be a number of seconds or None (no bound), got {type(value).__name__}"
        )
    if not math.isfinite(value) or value <= 0:
        raise PolyloopValueError(
            f"{named} must be finite and > 0, or None for no bound; got {value!r}"
        )
    return float(value)


def check_seconds(value: object, *, where: str, field: str, zero_means: str) -> float:
    """``value`` as a ``float`` if it is a finite number of seconds >= 0, else raise.

    One check for every "how long to wait" argument (a store's ``acquire_lease(wait_seconds=)``,
    the session's ``lease_wait_seconds``), so they all word a bad value the same way:

    ==========================  =====================  ===========================================
    value                       raises                 message
    ==========================  =====================  ===========================================
    not an ``int``/``float``,   ``PolyloopTypeError``  ``<where>: <field> must be a number of
    or a ``bool``                                      seconds (0 <zero_means>), got <type>``
    NaN, an infinity, or < 0    ``PolyloopValueError`` ``<where>: <field> must be finite and >= 0
                                                       (0 <zero_means>), got <repr>``
    anything else               nothing                (returns ``float(value)``)
    ==========================  =====================  ===========================================

    ``where`` names the call (``"JsonlRunStore.acquire_lease"``); ``""`` leaves the prefix out
    (for a field whose name says where it belongs, such as ``lease_wait_seconds``). ``field`` is
    the argument's name. ``zero_means`` is what 0 asks for, worded to follow "0" (``"for no
    wait"``, ``"to refuse a held run at once"``).
    """
    prefix = f"{where}: " if where else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolyloopTypeError(
            f"{prefix}{field} must be a number of seconds (0 {zero_means}), got "
            f"{type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0:
        raise PolyloopValueError(
            f"{prefix}{field} must be finite and >= 0 (0 {zero_means}), got {value!r}"
        )
    return float(value)


def require_enum(owner: str, name: str, value: object, enum_cls: type[enum.Enum]) -> None:
    """``PolyloopTypeError`` unless ``value`` is a member of ``enum_cls``; the message lists
    the members."""
    if not isinstance(value, enum_cls):
        raise PolyloopTypeError(
            f"{owner}.{name} must be a {enum_cls.__name__} member, got {value!r}; "
            f"use one of {', '.join(f'{enum_cls.__name__}.{m.name}' for m in enum_cls)}"
        )


def tuple_of(owner: str, name: str, value: object, item_type: type) -> tuple[object, ...]:
    """``value`` (any iterable but a string) as a tuple whose items are all ``item_type``;
    ``PolyloopTypeError`` naming the first offending index otherwise."""
    if type(value) is tuple:
        items: tuple[object, ...] = value  # the common case, without the ABC check
    elif isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise PolyloopTypeError(
            f"{owner}.{name} must be a sequence of {item_type.__name__}, got {type(value).__name__}"
        )
    else:
        items = tuple(value)
    for index, item in enumerate(items):
        if not isinstance(item, item_type):
            raise PolyloopTypeError(
                f"{owner}.{name}[{index}] must be a {item_type.__name__}, got {type(item).__name__}"
            )
    return items


def frozen_str_mapping(owner: str, name: str, value: object) -> Mapping[str, str]:
    """A read-only copy of ``value`` after checking it maps ``str`` to ``str``.

    A non-mapping, a non-``str`` key or a non-``str`` value is a wrong type:
    ``PolyloopTypeError`` naming the entry's key (a non-``str`` key by its type) and the
    types, suggesting ``str()``; never the value, which may be a credential (an HTTP header,
    an environment variable).
    """
    if type(value) is not MappingProxyType and not isinstance(value, Mapping):
        raise PolyloopTypeError(
            f"{owner}.{name} must be a mapping of str to str, got {type(value).__name__}"
        )
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            entry = repr(key) if isinstance(key, str) else "with a non-str key"
            raise PolyloopTypeError(
                f"{owner}.{name} must map str to str; entry {entry} is "
                f"{type(key).__name__} -> {type(item).__name__} (convert values with str())"
            )
    return MappingProxyType(dict(value))


# --------------------------------------------------------------------------- freezing


@overload
def frozen(value: Mapping[_K, _V]) -> Mapping[_K, _V]: ...
@overload
def frozen(value: object) -> object: ...
def frozen(value: object) -> object:
    """Return a deep, read-only copy of JSON-like data.

    Mappings become ``types.MappingProxyType`` views over a *new* dict whose values are frozen
    in turn; lists and tuples become tuples of frozen items; everything else (strings, numbers,
    ``None``, and arbitrary objects such as ``Injection``) is returned as is. Freezing only the
    outer layer is not enough: the edit that actually happens is reaching one level in
    (``spec.parameters["properties"]["path"]["type"] = ...``).

    The mapping overload's value type is approximate: list values come back as tuples.
    """
    if isinstance(value, Mapping):
        return MappingProxyType({key: frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(frozen(item) for item in value)
    return value


def thawed(value: object) -> object:
    """Inverse of ``frozen`` for JSON-like data: fresh dicts and lists all the way down."""
    if isinstance(value, Mapping):
        return {key: thawed(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [thawed(item) for item in value]
    return value


# --------------------------------------------------------------------------- exceptions


def describe_exception(exc: BaseException) -> str:
    """``"<Class>: <text>"`` (or just the class name): the form failures take in the log, for
    tool errors and for failed model calls alike.

    Never raises: an exception whose ``__str__`` raises (or returns a non-``str``) is described
    by its class and what went wrong while reading its text (issue 15, defect 3).
    """
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception as broken:  # noqa: BLE001 - describing a failure must never fail itself
        return f"{name}: <its text could not be read: str() raised {type(broken).__name__}>"
    return f"{name}: {text}" if text else name


# --------------------------------------------------------------------------- callables


def is_async_callable(value: object) -> bool:
    """True for an ``async def`` function or method, a ``functools.partial`` of one, and an
    object whose class defines ``async def __call__``."""
    if inspect.iscoroutinefunction(value):
        return True
    call = getattr(type(value), "__call__", None)  # noqa: B004 - the class attribute itself
    return inspect.isfunction(call) and inspect.iscoroutinefunction(call)


def is_plain_function(value: object) -> bool:
    """True for a function or bound method written with plain ``def`` (not ``async def``, not
    a generator). Other callables (builtins, mocks, partials) answer False: their behaviour
    cannot be read from their definition."""
    function = getattr(value, "__func__", value)
    return (
        inspect.isfunction(function)
        and not inspect.iscoroutinefunction(function)
        and not inspect.isgeneratorfunction(function)
        and not inspect.isasyncgenfunction(function)
    )


# --------------------------------------------------------------------------- public homes


def is_private_module(module_name: str) -> bool:
    """True when a component of the dotted ``module_name`` starts with ``_`` (a room such as
    ``polyloop.stores._jsonl``, or ``polyloop._recovery``): not a place a user imports from."""
    return any(part.startswith("_") for part in module_name.split("."))


def claim_public_names(module_name: str, namespace: Mapping[str, object]) -> None:
    """Give every class and function a public module exports from a private room that module
    as its ``__module__`` (design 0221; trio's ``fixup_module_metadata``).

    Called once, as the last statement of each public package's ``__init__``, as
    ``claim_public_names(__name__, globals())``: after it ``JsonlRunStore.__module__`` is
    ``"polyloop.stores"``, so docs, reprs, tracebacks and pickles (Ray's included) name the
    import path a user writes, and ``getattr(import_module(obj.__module__), obj.__qualname__)``
    is the object itself. Only names in ``__all__`` whose object is a top-level class or
    function exported under its own name are claimed; a name exported under another name
    keeps its home (its pickle path would not resolve). A name that is already public is left
    alone, so a name two public modules export keeps the first home claimed: the package that
    defines it (``polyloop.agent.tool``), never the one that re-exports it (``polyloop.tool``),
    since a package finishes its own ``__init__`` before its importer's ends.
    """
    exported = namespace.get("__all__", ())
    if not isinstance(exported, list | tuple):
        raise PolyloopTypeError(f"{module_name}.__all__ must be a list, got {exported!r}")
    for name in exported:
        value = namespace[name]
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if value.__qualname__ == name and is_private_module(value.__module__):
            if inspect.isclass(value):
                _resolve_own_annotations(value)
            value.__module__ = module_name


def _resolve_own_annotations(cls: type) -> None:
    """Turn ``cls``'s own string annotations into the objects they name, while its
    ``__module__`` is still the room that defines it.

    ``typing.get_type_hints`` (and pydantic, cattrs, ... through it) evaluates a class's string
    annotations (``from __future__ import annotations``) in the globals of
    ``sys.modules[cls.__module__]``; once that is the public package, a name the room imported
    for an annotation only (``Mapping``, ``ClassVar``) would no longer resolve. A class whose
    annotations name something imported only for type checkers is left as it was: resolving
    it failed before the claim too.
    """
    own = inspect.get_annotations(cls)
    if not own:
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except NameError:  # an annotation names a TYPE_CHECKING-only import: unresolvable anyway
        return
    cls.__annotations__ = {name: hints.get(name, annotation) for name, annotation in own.items()}


# --------------------------------------------------------------------------- JSON values


def _is_json_integer(value: object) -> bool:
    # bool is an int subclass in Python but not an integer in JSON; a float with no fractional
    # part (3.0, or 1e2 as json.loads reads it) is an integer since JSON Schema draft-06.
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


JSON_TYPE_CHECKS: Final[Mapping[str, Callable[[object], bool]]] = MappingProxyType(
    {
        "string": lambda value: isinstance(value, str),
        "integer": _is_json_integer,
        "number": lambda value: isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": lambda value: isinstance(value, bool),
        "null": lambda value: value is None,
        "object": lambda value: isinstance(value, Mapping),
        "array": lambda value: isinstance(value, list | tuple),
    }
)
"""Per JSON Schema type name, whether a decoded value is of that type (JSON's rules, not
Python's: ``True`` is no integer, ``3.0`` is one). Shared by tool-argument validation and the
``Agent``'s output checks, so the two can never disagree."""


# --------------------------------------------------------------------------- JSON Schema
#
# The one JSON Schema check of the library (design 0223): tool arguments
# (``ToolRegistry.validate``) and a structured answer (``polyloop.agent``) go through it.


_MAX_SCHEMA_DEPTH: Final = 200
"""Schema levels one check descends at most (a ``$ref`` cycle that consumes no data)."""

_SHOWN_CHARS: Final = 40
_SHOWN_OPTIONS: Final = 10
_ABSENT: Final = object()


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One way a JSON value misses its schema; the caller words where it is.

    ``path`` leads from the checked value to the bad part (``("items", 2, "name")``; ``()``
    is the value itself), ``dotted`` spells it (``items[2].name``). ``kind`` is one of
    ``type``, ``const``, ``enum``, ``missing``, ``undeclared``, ``none_fits``, ``many_fit``,
    ``not_allowed`` and ``too_deep``; ``expected`` is what would fit, in words (``integer or
    null``, the allowed names), ``got`` the bad value described (``described_value``), never
    the value itself. ``within`` holds, for ``none_fits``, the problems of the first form.
    """

    path: tuple[str | int, ...]
    kind: str
    expected: str = ""
    got: str = ""
    within: tuple[SchemaProblem, ...] = ()

    @property
    def dotted(self) -> str:
        """``items[2].name``; empty for the value itself."""
        text = ""
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
        return text

    def worded(self, where: Callable[[SchemaProblem], str]) -> str:
        """``<where> <what is wrong>``, e.g. ``the field 'age' must be integer, got string
        "x"``; ``where`` words a problem's place (the problems ``within`` included)."""
        tails = {
            "type": f"must be {self.expected}, got {self.got}",
            "const": f"must be {self.expected}, got {self.got}",
            "enum": f"must be one of {self.expected}, got {self.got}",
            "missing": "is missing",
            "undeclared": f"is not expected (the fields are {self.expected})",
            "many_fit": "fits more than one of its allowed forms",
            "not_allowed": "is not allowed",
            "too_deep": "is nested too deeply for its schema",
        }
        tail = tails.get(self.kind)
        if tail is None:  # none_fits
            inner = "; ".join(problem.worded(where) for problem in self.within)
            tail = f"fits none of its allowed forms: {inner}"
        return f"{where(self)} {tail}"


def described_value(value: object) -> str:
    """A value for a message, its JSON type first: ``string "forty"``, ``integer 3``,
    ``boolean true``, ``null``, ``an array of 2``, ``an object``, ``Python bytes``. Never long
    (a string is cut at 40 characters, an integer of hundreds of digits is counted, not shown)
    and never raises."""
    kind = json_type_of(value)
    if isinstance(value, str):
        shown = value if len(value) <= _SHOWN_CHARS else value[: _SHOWN_CHARS - 3] + "..."
        return f"{kind} {json.dumps(shown, ensure_ascii=False)}"
    if isinstance(value, bool):
        return f"{kind} {'true' if value else 'false'}"
    if isinstance(value, int) and value.bit_length() > 128:
        return f"{kind} of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, int | float):
        return f"{kind} {json.dumps(value)}"
    if isinstance(value, list | tuple):
        return f"an array of {len(value)}"
    if isinstance(value, Mapping):
        return "an object"
    return kind


def _shown_options(options: Sequence[object]) -> str:
    shown = [_shown_json(option) for option in options[:_SHOWN_OPTIONS]]
    more = len(options) - _SHOWN_OPTIONS
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _shown_json(value: object) -> str:
    try:
        text = json.dumps(thawed(value), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return described_value(value)
    return text if len(text) <= _SHOWN_CHARS else described_value(value)


def json_equal(left: object, right: object) -> bool:
    """JSON equality: ``1 == 1.0``, a boolean equals only a boolean, a list equals a tuple of
    equal items, a mapping any mapping with equal entries."""
    if type(left) is str or type(right) is str:  # the common case, decided at once
        return left == right
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, Mapping) or isinstance(right, Mapping):
        return (
            isinstance(left, Mapping)
            and isinstance(right, Mapping)
            and left.keys() == right.keys()
            and all(json_equal(item, right[key]) for key, item in left.items())
        )
    if isinstance(left, list | tuple) or isinstance(right, list | tuple):
        return (
            isinstance(left, list | tuple)
            and isinstance(right, list | tuple)
            and len(left) == len(right)
            and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
        )
    return bool(left == right)


def resolve_ref(root: Mapping[str, object], ref: str) -> object:
    """The part of ``root`` a local ``$ref`` (``#/$defs/Name``, any JSON pointer) points to;
    ``PolyloopValueError`` for a reference outside the schema or to nothing."""
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
        elif isinstance(node, list | tuple) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PolyloopValueError(f"the schema's $ref {ref!r} points to nothing")
    return node


def _names(declared: object) -> tuple[str, ...]:
    """The known JSON type names a ``type`` keyword lists (unknown ones are not enforced)."""
    names = (declared,) if isinstance(declared, str) else declared
    if not isinstance(names, list | tuple):
        return ()
    return tuple(name for name in names if isinstance(name, str) and name in JSON_TYPE_CHECKS)


_KIND_OF_TYPE: Final[dict[type, str]] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
    dict: "object",
    MappingProxyType: "object",
    list: "array",
    tuple: "array",
}
"""The JSON type of the exact Python types decoded JSON and frozen arguments are made of: one
dictionary lookup instead of ``json_type_of``'s ``isinstance`` checks (subclasses take that
slower path and get the same answer)."""


def _fits(names: frozenset[str], kind: str, value: object) -> bool:
    """Whether a value of JSON type ``kind`` is one of ``names`` (``JSON_TYPE_CHECKS``'
    rules: an integer is a number, a float without a fractional part an integer)."""
    if kind in names:
        return True
    if kind == "integer":
        return "number" in names
    return "integer" in names and isinstance(value, float) and value.is_integer()


class _Node:
    """One schema, compiled: the keywords it enforces, read once."""

    __slots__ = (
        "all_of",
        "alternatives",
        "const",
        "enum",
        "extra",
        "items",
        "never",
        "object_rules",
        "properties",
        "ref",
        "required",
        "type_names",
        "types",
        "value_rules",
    )

    def __init__(self) -> None:
        self.never = False
        self.ref: _Node | None = None
        self.type_names: tuple[str, ...] = ()  # as declared, for messages
        self.types: frozenset[str] = frozenset()
        self.const: object = _ABSENT
        self.enum: tuple[object, ...] | None = None
        self.alternatives: tuple[tuple[bool, tuple[_Node, ...]], ...] = ()  # (one_of, options)
        self.all_of: tuple[_Node, ...] = ()
        self.value_rules = False  # any of the four above
        self.object_rules = False  # any of the three below
        self.properties: dict[str, _Node] = {}
        self.required: tuple[str, ...] = ()
        self.extra: _Node | bool = True  # False: undeclared keys refused
        self.items: _Node | None = None

    def referenced(self) -> _Node:
        """The schema a ``$ref`` form stands for (this one without a reference)."""
        node = self
        for _ in range(_MAX_SCHEMA_DEPTH):
            if node.ref is None:
                break
            node = node.ref
        return node


class JsonSchema:
    """A JSON Schema compiled once, to check many values (design 0223).

    Enforced: ``type`` (a name or a list of names; ``3.0`` is an integer, a boolean is
    neither an integer nor a number; ``object`` is any mapping, ``array`` a list or tuple),
    ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties`` (``false`` or
    a schema; not checked when ``patternProperties`` is present), ``items`` (one schema for
    every item), ``anyOf``, ``oneOf``, ``allOf``, boolean schemas and local ``$ref``
    (``#/$defs/...``, ``#/definitions/...``, any JSON pointer into the schema; the reference
    replaces its siblings, as in draft-07). Every other keyword (``format``, ranges,
    lengths, patterns, ``description``, ``default``, ``$schema``...) and every type name
    JSON Schema does not define is shown to the model and not enforced; a keyword whose
    value has a shape this check cannot read is not enforced either. A ``$ref`` that does
    not resolve enforces nothing, unless ``refs_must_resolve`` refuses it here with
    ``PolyloopValueError``.
    """

    __slots__ = ("_compiled", "_refs_must_resolve", "_root", "_top")

    def __init__(
        self, schema: Mapping[str, object] | bool, *, refs_must_resolve: bool = False
    ) -> None:
        self._root = schema if isinstance(schema, Mapping) else {}
        self._refs_must_resolve = refs_must_resolve
        self._compiled: dict[int, _Node] = {}
        self._top = self._compile(schema)
        self._compiled.clear()  # the ids only mean something while the schema is walked

    def problems(self, value: object, *, first_only: bool = False) -> list[SchemaProblem]:
        """Every problem of ``value``, in document order: at each level the value's type,
        ``const`` and ``enum`` (a misfit there is the level's only problem), the alternatives,
        then for an object the missing fields (in ``required`` order), the undeclared ones,
        and each value in turn; for an array each item. Empty: it fits. ``first_only`` stops
        at the first."""
        found: list[SchemaProblem] = []
        _check(self._top, value, (), found, first_only, 0)
        return found

    def _compile(self, schema: object) -> _Node:
        key = id(schema)
        node = self._compiled.get(key)
        if node is not None:
            return node
        node = self._compiled[key] = _Node()
        if schema is False:
            node.never = True
        if not isinstance(schema, Mapping):
            return node
        ref = schema.get("$ref")
        if isinstance(ref, str):
            try:
                target = resolve_ref(self._root, ref)
            except PolyloopValueError:
                if self._refs_must_resolve:
                    raise
                return node
            node.ref = self._compile(target)
            return node
        node.type_names = _names(schema.get("type"))
        node.types = frozenset(node.type_names)
        node.const = schema.get("const", _ABSENT)
        options = schema.get("enum")
        if isinstance(options, list | tuple):
            node.enum = tuple(options)
        for keyword, one_of in (("anyOf", False), ("oneOf", True)):
            options = schema.get(keyword)
            if isinstance(options, list | tuple) and options:
                compiled = tuple(self._compile(option) for option in options)
                node.alternatives += ((one_of, compiled),)
        parts = schema.get("allOf")
        if isinstance(parts, list | tuple):
            node.all_of = tuple(self._compile(part) for part in parts)
        node.value_rules = bool(
            node.const is not _ABSENT or node.enum is not None or node.alternatives or node.all_of
        )
        self._compile_containers(node, schema)
        return node

    def _compile_containers(self, node: _Node, schema: Mapping[str, object]) -> None:
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            node.properties = {
                key: self._compile(sub) for key, sub in properties.items() if isinstance(key, str)
            }
        required = schema.get("required")
        if isinstance(required, list | tuple):
            node.required = tuple(name for name in required if isinstance(name, str))
        extra = schema.get("additionalProperties", True)
        if "patternProperties" not in schema and (extra is False or isinstance(extra, Mapping)):
            node.extra = False if extra is False else self._compile(extra)
        node.object_rules = bool(node.properties or node.required or node.extra is not True)
        items = schema.get("items")
        if isinstance(items, Mapping | bool):
            node.items = self._compile(items)


_Path = tuple[object, ...]
"""Where a check is, as nested pairs ``((((), "items"), 2), "name")``: one small tuple per
level, flattened only when a problem is found (``_flat``)."""


def _flat(path: _Path) -> tuple[str | int, ...]:
    """The path as a tuple; a key longer than ``_SHOWN_CHARS`` is cut (a key the value brought
    may be huge, or hold what must not be repeated in a message)."""
    parts: list[str | int] = []
    while path:
        path, part = path  # type: ignore[assignment]
        if not isinstance(part, int):
            part = str(part)
            if len(part) > _SHOWN_CHARS:
                part = part[: _SHOWN_CHARS - 3] + "..."
        parts.append(part)
    return tuple(reversed(parts))


def _check(
    node: _Node, value: Any, path: _Path, found: list[SchemaProblem], first: bool, depth: int
) -> None:
    """Append the problems of ``value`` against ``node`` to ``found`` (see ``problems``)."""
    while node.ref is not None and depth <= _MAX_SCHEMA_DEPTH:
        node, depth = node.ref, depth + 1
    if depth > _MAX_SCHEMA_DEPTH:
        found.append(SchemaProblem(_flat(path), "too_deep"))
        return
    if node.never:
        found.append(SchemaProblem(_flat(path), "not_allowed"))
        return
    kind = _KIND_OF_TYPE.get(type(value)) or json_type_of(value)
    types = node.types
    if types and kind not in types and not _fits(types, kind, value):
        expected = " or ".join(node.type_names)
        found.append(SchemaProblem(_flat(path), "type", expected, described_value(value)))
        return
    if node.value_rules and not _fits_value_rules(node, value, kind, path, found, first, depth):
        return
    if kind == "object":
        if node.object_rules:
            _check_object(node, value, path, found, first, depth)
    elif kind == "array" and node.items is not None:
        items = node.items
        for index, item in enumerate(value):
            _check(items, item, (path, index), found, first, depth + 1)
            if first and found:
                return


def _fits_value_rules(
    node: _Node,
    value: object,
    kind: str,
    path: _Path,
    found: list[SchemaProblem],
    first: bool,
    depth: int,
) -> bool:
    """``const``, ``enum``, the alternatives and ``allOf``: whether the check goes on into
    the value's fields or items (a misfit of the first three is the level's only problem)."""
    if node.const is not _ABSENT and not json_equal(value, node.const):
        shown = _shown_json(node.const)
        found.append(SchemaProblem(_flat(path), "const", shown, described_value(value)))
        return False
    if node.enum is not None and not any(json_equal(value, option) for option in node.enum):
        shown = _shown_options(node.enum)
        found.append(SchemaProblem(_flat(path), "enum", shown, described_value(value)))
        return False
    for one_of, options in node.alternatives:
        if _check_alternatives(one_of, options, value, kind, path, found, first, depth):
            return False
    for part in node.all_of:
        _check(part, value, path, found, first, depth + 1)
        if first and found:
            return False
    return True


def _check_alternatives(
    one_of: bool,
    options: tuple[_Node, ...],
    value: object,
    kind: str,
    path: _Path,
    found: list[SchemaProblem],
    first: bool,
    depth: int,
) -> bool:
    """Whether ``value`` fits none (or, for ``oneOf``, more than one) of ``options``; the
    problem is appended to ``found``."""
    results: list[list[SchemaProblem]] = []
    for option in options:
        result: list[SchemaProblem] = []
        _check(option, value, path, result, first, depth + 1)
        results.append(result)
    fitting = sum(not result for result in results)
    if one_of and fitting > 1:
        found.append(SchemaProblem(_flat(path), "many_fit"))
        return True
    if fitting:
        return False
    # The one form whose type the value has says best what is wrong inside it.
    typed = [
        result
        for option, result in zip(options, results, strict=True)
        if not option.referenced().types or _fits(option.referenced().types, kind, value)
    ]
    if len(typed) == 1:
        found.extend(typed[0])
    else:
        found.append(SchemaProblem(_flat(path), "none_fits", within=tuple(results[0])))
    return True


def _check_object(
    node: _Node,
    value: Mapping[Any, object],
    path: _Path,
    found: list[SchemaProblem],
    first: bool,
    depth: int,
) -> None:
    for name in node.required:
        if name not in value:
            found.append(SchemaProblem(_flat((path, name)), "missing"))
            if first:
                return
    declared = node.properties
    extra = node.extra
    if extra is False:
        for key in value:
            if key not in declared:
                allowed = _shown_names(tuple(declared))
                found.append(SchemaProblem(_flat((path, key)), "undeclared", allowed))
                if first:
                    return
    for key, item in value.items():
        child = declared.get(key)
        if child is None:
            if extra is True or extra is False:
                continue
            child = extra
        _check(child, item, (path, key), found, first, depth + 1)
        if first and found:
            return


def _shown_names(names: tuple[str, ...]) -> str:
    if not names:
        return "none"
    shown = ", ".join(repr(name) for name in names[:20])
    return shown + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def json_type_of(value: object) -> str:
    """The JSON type name of a decoded value (``integer`` for ``3``, ``number`` for ``3.5``);
    ``Python <class>`` for a value JSON has no type for."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return f"Python {type(value).__name__}"


def trusted(cls: type[_R], /, **fields: object) -> _R:
    """An instance of the frozen dataclass ``cls`` holding ``fields``, built without running
    its ``__post_init__`` (design 0214).

    Only for a record the library builds itself, every value of which it made or took from an
    object that was already validated (an ``Intent`` from the run's request and the
    library's own ids): its checks could not fail, and running them again on every step
    cost CPU. Never for anything a user, an adapter or a decoded log hands in: those keep
    their validation. Every field must be given (no defaults are filled in); a missing or
    unknown one raises ``PolyloopTypeError`` naming the class.

    The work is done by a builder made once per class (``_builder``), so a call costs about
    what a plain class's ``__init__`` does.
    """
    build = trusted_builder(cls)
    try:
        return build(**fields)
    except TypeError:  # a missing or unknown keyword: the builder only sets fields
        names = cls.__dataclass_fields__  # type: ignore[attr-defined]
        raise PolyloopTypeError(
            f"trusted({cls.__name__}) needs exactly the fields {sorted(names)}, got "
            f"{sorted(fields)}"
        ) from None


def trusted_builder(cls: type[_R], /) -> Callable[..., _R]:
    """``trusted``'s builder for ``cls``: ``trusted_builder(C)(**fields)`` is
    ``trusted(C, **fields)`` without the lookup, for the few places that build a record on
    every step (bind it once, at import). A missing or unknown field raises Python's own
    ``TypeError`` (naming ``build_<class>``), not ``PolyloopTypeError``."""
    build = _BUILDERS.get(cls)
    if build is None:
        build = _BUILDERS[cls] = _builder(cls)
    return build  # type: ignore[return-value]


_BUILDERS: dict[type, Callable[..., object]] = {}
"""``trusted``'s builders, one per class it was asked for (a cache: a builder depends on
nothing but its class)."""


def _builder(cls: type) -> Callable[..., object]:
    """A function taking exactly ``cls``'s fields as required keywords, returning a new
    ``cls`` holding them, without ``__init__`` or ``__post_init__``.

    Its source is written out here, as ``dataclasses`` writes a class's ``__init__``: one
    line per field, ``__trusted_set_<field>__(__trusted_record__, <field>)``, where the setter
    is the field's slot descriptor's ``__set__`` (which a frozen class's ``__setattr__`` does
    not guard), or ``object.__setattr__`` bound to the name for a field without a slot. Only
    field names enter the source: they are Python identifiers (``dataclasses`` requires them),
    and the builder's own names are ``__trusted_...__``, which no field may take (refused).
    The class's name is set on the function afterwards, never written into the source.
    """
    names = list(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    taken = [name for name in names if name.startswith("__trusted_")]
    if taken:
        raise PolyloopTypeError(
            f"trusted({cls.__name__}) cannot build a class with a field named {taken[0]!r}: "
            "names starting with __trusted_ are the builder's own"
        )
    namespace: dict[str, object] = {"__trusted_new__": object.__new__, "__trusted_cls__": cls}
    for name in names:
        slot = cls.__dict__.get(name)
        namespace[f"__trusted_set_{name}__"] = (
            slot.__set__ if isinstance(slot, MemberDescriptorType) else _object_setter(name)
        )
    lines = [
        f"def build(*, {', '.join(names)}):",
        "    __trusted_record__ = __trusted_new__(__trusted_cls__)",
    ]
    lines += [f"    __trusted_set_{name}__(__trusted_record__, {name})" for name in names]
    lines.append("    return __trusted_record__")
    exec("\n".join(lines), namespace)  # source built from field names only
    build: Callable[..., object] = namespace["build"]  # type: ignore[assignment]
    build.__name__ = build.__qualname__ = f"build_{cls.__name__}"
    return build


def _object_setter(name: str) -> Callable[[object, object], None]:
    def set_field(record: object, value: object) -> None:
        object.__setattr__(record, name, value)

    return set_field
