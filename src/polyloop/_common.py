"""Helpers shared by several polyloop modules. Internal: not part of the public API.

The module is private (``polyloop._common``) but its names are public, so that ``types``,
``ports``, ``tools``, ``session`` and the adapters can share one implementation of each check
without any module importing another module's private names (design 0110).

It sits just above ``polyloop.errors`` (it raises ``PolyloopTypeError`` and
``PolyloopValueError``) and below ``polyloop.types``; it imports nothing else from polyloop and
nothing third-party (contract ``r4c-common-is-low``).

The error rule every check here follows (design 0110): a value of the wrong *type* raises
``PolyloopTypeError`` (a ``TypeError``); a value of the right type that is not allowed raises
``PolyloopValueError`` (a ``ValueError``). Messages name the field as ``<owner>.<name>``.
"""

from __future__ import annotations

import enum
import inspect
import math
import typing
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType, MemberDescriptorType
from typing import Final, TypeVar, overload

from polyloop.errors import PolyloopTypeError, PolyloopValueError

__all__ = [
    "JSON_TYPE_CHECKS",
    "check_seconds",
    "claim_public_names",
    "describe_exception",
    "frozen",
    "frozen_str_mapping",
    "is_async_callable",
    "is_plain_function",
    "is_private_module",
    "json_type_of",
    "require_bool",
    "require_enum",
    "require_int",
    "require_nonempty_str",
    "require_str",
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
    its ``__post_init__`` (design 0214, second and third pass).

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
