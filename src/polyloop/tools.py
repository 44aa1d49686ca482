"""Tools: one registry that drives what the model sees, what is accepted and what runs.

A ``ToolRegistry`` is the single source of four things that must never disagree:

1. the model-visible schema (``schema_for_model``),
2. the existence check (``spec_for`` / the first rule of ``validate``),
3. argument validation (``validate``),
4. dispatch (``executor()`` -> ``RegistryExecutor``).

``restrict_to`` narrows all four at once, because it returns a new registry and everything
above is derived from the registry instance. If they could disagree, the model would be told
about a tool that validation then calls unknown, or validation would accept a name that
dispatch cannot find.

Specs are deep-frozen at construction (see ``polyloop._common.frozen``): neither the
caller's later edits to the dict it passed nor an edit reached through
``spec_for(...).parameters`` can change the schema the model sees or the one validation uses.
``schema_for_model`` thaws a fresh plain copy on every call, so callers may mutate what they
get.

Validation checks the arguments deeply against the spec's schema with the library's one JSON
Schema check (``polyloop._common.JsonSchema``, shared with structured output; design 0223):
nested objects and arrays, ``enum``, ``const`` and the combinators are enforced, keywords it
does not interpret (``format``, ranges, ``description``...) are shown to the model only.

A tool's name matches ``TOOL_NAME_PATTERN`` (1 to 64 ASCII letters, digits, ``_`` and ``-``:
the rule OpenAI applies to function names, and the strictest of the providers'); anything else
is refused at construction (design 0233), so no two tools can have names a person cannot tell
apart (a Cyrillic ``r\\u0435fund`` beside ``refund``). ``safe_tool_name`` maps any text to such a
name deterministically, for names polyloop does not choose (an MCP server's).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import json
import logging
import re
import types
import typing
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypedDict, Unpack

from polyloop._common import (
    JSON_TYPE_CHECKS,
    JsonSchema,
    SchemaProblem,
    describe_exception,
    described_value,
    frozen,
    frozen_str_mapping,
    is_async_callable,
    is_plain_function,
    json_type_of,
    thawed,
)
from polyloop.errors import (
    ChildRunOpenError,
    PolyloopTypeError,
    PolyloopValueError,
    RunLeaseHeldError,
    RunLeaseLostError,
    ToolEnvironmentError,
    ToolOutcomeUnknown,
    ToolValidationError,
    TreeLimitError,
)
from polyloop.ports import Action, ToolCall, ToolContext
from polyloop.types import ActionOutcome, ActionStatus, ReplayPolicy, SettlementVerdict

if TYPE_CHECKING:
    from polyloop.ports import ActionExecutor

__all__ = [
    "TOOL_NAME_PATTERN",
    "Reconciler",
    "Reconciliation",
    "RegistryExecutor",
    "ToolContext",
    "ToolEnvironmentError",
    "ToolHandler",
    "ToolOptions",
    "ToolOutcomeUnknown",
    "ToolRegistry",
    "ToolSpec",
    "ToolValidationError",
    "safe_tool_name",
]

TOOL_NAME_PATTERN: Final = r"^[a-zA-Z0-9_-]{1,64}$"
"""What a tool name may be (design 0233): the pattern OpenAI requires of a function name, which
every provider polyloop's adapter speaks to accepts. ASCII only, so two different names always
look different."""
_TOOL_NAME: Final = re.compile(TOOL_NAME_PATTERN)
_TOOL_NAME_MAX: Final = 64
_UNSAFE_RUN: Final = re.compile(r"[^a-zA-Z0-9_-]+")


def _first_unsafe(name: str) -> str:
    """The first character of ``name`` the pattern refuses, named so a person can see it (a
    homoglyph prints like the letter it imitates)."""
    for char in name:
        if not _TOOL_NAME.fullmatch(char):
            label = unicodedata.name(char, "unnamed character")
            return f"{char!r} (U+{ord(char):04X} {label})"
    return ""


def tool_name_problem(name: str) -> str | None:
    """Why ``name`` is not a provider-safe tool name (``TOOL_NAME_PATTERN``), or ``None``."""
    if _TOOL_NAME.fullmatch(name):
        return None
    if not name:
        return "is empty"
    if len(name) > _TOOL_NAME_MAX:
        return f"is {len(name)} characters long (at most {_TOOL_NAME_MAX})"
    return f"contains {_first_unsafe(name)}"


def safe_tool_name(text: str) -> str:
    """A provider-safe tool name for ``text`` (design 0233): ``text`` itself when it matches
    ``TOOL_NAME_PATTERN``; otherwise each run of other characters becomes ``_`` and an
    8-hex-digit digest of ``text`` is appended (cut to fit 64 characters), so two texts that
    print alike (``r\\u0435fund``, ``refund``) never map to one name and a text maps the same way in
    every process."""
    if _TOOL_NAME.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:8]
    stem = _UNSAFE_RUN.sub("_", text).strip("_") or "tool"
    return f"{stem[: _TOOL_NAME_MAX - len(digest) - 1]}_{digest}"


logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- JSON helpers

_JSON_TYPES: Final = frozenset(
    {"string", "integer", "number", "boolean", "null", "object", "array"}
)


def _check_json_like(path: str, value: object) -> None:
    """Refuse anything ``json.dumps`` could not serialise, naming where it sits."""
    if value is None or isinstance(value, str | int | float | bool):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PolyloopTypeError(
                    f"{path} has the key {key!r} of type {type(key).__name__}; JSON object "
                    "keys must be strings"
                )
            _check_json_like(f"{path}[{key!r}]", item)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_like(f"{path}[{index}]", item)
        return
    raise PolyloopTypeError(
        f"{path} is a {type(value).__name__}, which JSON cannot represent; use only dicts, "
        "lists, strings, numbers, booleans and None in a tool's parameters schema"
    )


def _declared_types(path: str, declared: object) -> frozenset[str]:
    names: tuple[object, ...]
    if isinstance(declared, str):
        names = (declared,)
    elif isinstance(declared, list | tuple) and declared:
        names = tuple(declared)
    else:
        raise PolyloopTypeError(
            f"{path} must be a JSON type name or a non-empty list of them, got {declared!r}"
        )
    unknown = [name for name in names if not isinstance(name, str) or name not in _JSON_TYPES]
    if unknown:
        raise PolyloopValueError(
            f"{path} names unknown JSON type(s) {', '.join(map(repr, unknown))}; use "
            f"{', '.join(sorted(_JSON_TYPES))}"
        )
    return frozenset(str(name) for name in names)


def _check_schema_shape(owner: str, schema: Mapping[str, object]) -> None:
    """Refuse a parameters schema whose top-level keywords have a shape validation would
    misread (design 0012): a top-level ``type`` without ``object``, ``properties`` not a
    mapping of schemas, an unknown type name of a property, ``required`` not a list of names,
    ``additionalProperties`` neither a bool nor a schema, ``patternProperties`` not a mapping.

    Deeper levels are not refused: a keyword there whose value has a shape the check cannot
    read is not enforced (``JsonSchema``), so a server's unusual schema still loads.
    """
    path = f"{owner}.parameters"
    if "type" in schema:
        top = _declared_types(f"{path}['type']", schema["type"])
        if "object" not in top:
            raise PolyloopValueError(
                f"{path}['type'] is {schema['type']!r}; tool arguments are always a JSON "
                "object, so the top-level type must be 'object' (or be left out)"
            )
    properties = schema.get("properties", MappingProxyType({}))
    if not isinstance(properties, Mapping):
        raise PolyloopTypeError(
            f"{path}['properties'] must be a mapping of parameter name to schema"
        )
    for key, subschema in properties.items():
        if isinstance(subschema, bool):
            continue
        if not isinstance(subschema, Mapping):
            raise PolyloopTypeError(
                f"{path}['properties'][{key!r}] must be a schema object (a mapping) or a bool"
            )
        if "type" in subschema:
            _declared_types(f"{path}['properties'][{key!r}]['type']", subschema["type"])
    required = schema.get("required", ())
    if not isinstance(required, list | tuple) or not all(isinstance(k, str) for k in required):
        raise PolyloopTypeError(f"{path}['required'] must be a list of parameter names (strings)")
    additional = schema.get("additionalProperties", True)
    if not isinstance(additional, bool | Mapping):
        raise PolyloopTypeError(
            f"{path}['additionalProperties'] must be a bool or a schema object, got {additional!r}"
        )
    pattern_properties = schema.get("patternProperties")
    if pattern_properties is not None and not isinstance(pattern_properties, Mapping):
        raise PolyloopTypeError(
            f"{path}['patternProperties'] must be a mapping of pattern to schema"
        )


def _refusal_text(tool: str, problem: SchemaProblem) -> str:
    """``tool 'x': the parameter 'items[2].name' has the wrong type: expected string, got
    integer 7``: where, what was expected and what came, never the value itself."""
    place = problem.dotted
    if problem.kind == "missing":
        return f"tool {tool!r}: the required parameter {place!r} is missing"
    if problem.kind == "undeclared":
        parent = SchemaProblem(problem.path[:-1], "undeclared").dotted
        owner = f"the object {parent!r}" if parent else "this tool"
        return (
            f"tool {tool!r}: the parameter {place!r} is undeclared; {owner} accepts only "
            f"{problem.expected}"
        )
    if problem.kind == "type":
        return (
            f"tool {tool!r}: the parameter {place!r} has the wrong type: expected "
            f"{problem.expected}, got {problem.got}"
        )
    return f"tool {tool!r}: {problem.worded(_parameter_place)}"


def _parameter_place(problem: SchemaProblem) -> str:
    return f"the parameter {problem.dotted!r}" if problem.path else "the arguments"


# --------------------------------------------------------------------------- specs

_OWN_SNAPSHOT_KEYS: Final = frozenset(
    {"schema", "replay_policy", "completes_run", "needs_approval"}
)


def _checked_origin(owner: str, origin: object) -> Mapping[str, str]:
    """``ToolSpec.origin`` checked (``str`` to ``str``, keys free of the snapshot's own)."""
    checked = frozen_str_mapping(owner, "origin", origin)
    for key in checked:
        if not key.strip() or key in _OWN_SNAPSHOT_KEYS:
            raise PolyloopValueError(
                f"{owner}.origin has the key {key!r}; origin keys enter the snapshot as "
                "tool.<name>.<key>, so they must be non-blank and none of "
                f"{', '.join(sorted(_OWN_SNAPSHOT_KEYS))}"
            )
    return checked


class ToolHandler(Protocol):
    """The implementation of one tool: an async callable from arguments to observation text.

    * Return the observation as a ``str`` (anything else is a programming error:
      ``RegistryExecutor`` raises ``TypeError`` instead of guessing a rendering).
    * Raise ``ToolEnvironmentError`` when the environment is broken; the run then stops.
    * Raise ``ToolOutcomeUnknown`` when you cannot tell whether the call took effect (the
      request was sent and its answer lost: a timeout after sending, a dropped connection);
      the execution is in doubt and its replay policy settles it (design 0227).
    * Raise ``ToolValidationError`` to refuse the arguments *before doing anything* (a check
      the schema cannot express); the action is ``NOT_EXECUTED``, so a ``completes_run`` tool
      that refuses does not complete the run.
    * Raise anything else when the action itself failed; the model sees the error text. The
      action counts as ``EXECUTED``: for a ``completes_run`` tool that ends the run.
    * Let ``asyncio.CancelledError`` propagate.

    ``arguments`` is the call's mapping as the parser produced it, already validated against
    the spec's schema. The argument is positional, so a plain ``async def`` with any parameter
    name satisfies this Protocol.

    A handler that wants the execution's ``ToolContext`` (its idempotency key, design 0205)
    says so with an attribute ``takes_context = True`` and is then called as
    ``handler(arguments, context)``; handlers built by ``ToolSpec.from_function`` do this for a
    function with a parameter annotated ``ToolContext``.
    """

    async def __call__(self, arguments: Mapping[str, object], /) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    """A reconciler's answer on an execution in doubt (design 0206). Build it with
    ``Reconciliation.executed(observation)``, ``.not_executed()`` or ``.unknown(reason)``."""

    verdict: SettlementVerdict
    observation: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.verdict, SettlementVerdict):
            raise PolyloopTypeError(
                "Reconciliation.verdict must be a SettlementVerdict; build one with "
                "Reconciliation.executed(...), .not_executed() or .unknown(reason)"
            )
        if self.verdict in (SettlementVerdict.APPROVED, SettlementVerdict.REJECTED):
            raise PolyloopValueError(
                f"Reconciliation.verdict {self.verdict.value} is a person's decision on a call "
                "that waits for approval (design 0210); a reconciler answers executed, "
                "not_executed or unknown"
            )
        executed = self.verdict is SettlementVerdict.EXECUTED
        if executed != isinstance(self.observation, str):
            raise PolyloopTypeError(
                "Reconciliation.observation is the str the tool's system reports, set exactly "
                f"for executed; got {type(self.observation).__name__} for {self.verdict.value}"
            )
        if self.verdict is SettlementVerdict.UNKNOWN and not (
            isinstance(self.reason, str) and self.reason.strip()
        ):
            raise PolyloopValueError(
                "Reconciliation.unknown(reason) needs a non-empty reason: it goes on record and "
                "tells a person why the run is still in doubt"
            )

    @classmethod
    def executed(cls, observation: str) -> Reconciliation:
        """It happened; ``observation`` (what the tool's system reports) becomes the step's
        observation, and the run goes on without executing anything."""
        return cls(verdict=SettlementVerdict.EXECUTED, observation=observation)

    @classmethod
    def not_executed(cls) -> Reconciliation:
        """It did not happen: the action executes now, with the same idempotency key."""
        return cls(verdict=SettlementVerdict.NOT_EXECUTED)

    @classmethod
    def unknown(cls, reason: str) -> Reconciliation:
        """Nobody can tell yet: the run stops with ``resume_state_unknown``, ``reason`` on
        record; a later resume asks again, or a person resolves it."""
        return cls(verdict=SettlementVerdict.UNKNOWN, reason=reason)


class Reconciler(Protocol):
    """Asks the tool's own system what became of an execution in doubt (design 0206).

    Called on resume, for a ``NEVER`` action whose intent is durable and whose result was lost
    with a process, with the execution's ``ToolContext`` (its idempotency key, which the tool
    handed to its system) and the call's arguments. It must not perform the action itself.
    Return a ``Reconciliation``; a reconciler that raises, returns something else or outlives
    ``RunRequest.reconcile_timeout_seconds`` counts as ``unknown``, and the reason is reported
    and put on record.
    """

    async def __call__(
        self, context: ToolContext, arguments: Mapping[str, object], /
    ) -> Reconciliation: ...


class ToolOptions(TypedDict, total=False):
    """The options a user sets per tool, defined once for ``ToolSpec.from_function`` and
    ``@tool`` (design 0224): both take them as keyword arguments, so an option added here
    reaches both. The replay policy is not among them because the two spell it differently
    (``replay_policy=ReplayPolicy.SAFE`` here, ``@tool(replay="safe")`` there).
    """

    name: str | None
    """The tool's name as the model sees it; default: the function's name."""
    description: str | None
    """What the model reads about the tool; default: the function's docstring."""
    completes_run: bool
    """``True``: the run ends once the tool has executed. Default ``False``."""
    reconcile: Reconciler | None
    """Asks the tool's system what became of an execution in doubt (design 0206)."""
    needs_approval: bool | Callable[[Mapping[str, object]], bool]
    """``True``, or a predicate over the call's arguments: the call waits for a person's
    decision before it runs (design 0210). Default ``False``."""


_TOOL_OPTIONS: Final = frozenset(ToolOptions.__optional_keys__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """One tool: what the model is told about it, how its calls are checked, and what runs.

    ``parameters`` is a JSON Schema object for the arguments. It is copied and deep-frozen at
    construction: the caller's dict can be edited afterwards without effect, and the stored
    one cannot be edited at all. ``handler`` may be ``None`` for a registry that only renders
    schemas; ``ToolRegistry.executor()`` refuses such specs. A handler written as a plain
    ``def`` function or method is refused here with ``PolyloopTypeError`` (declare it
    ``async def``), so a synchronous handler never gets to run its side effect.

    ``replay_policy`` defaults to ``NEVER`` and ``completes_run`` to ``False``: forgetting to
    declare either costs one extra stop that someone sees, never a duplicated side effect or
    a run that cannot end. ``completes_run=True`` means an ``EXECUTED`` call of this tool
    completes the run (read by the session, not by the executor).

    Specs compare by value (the handler by identity) and are unhashable, because
    ``parameters`` is a mapping.
    """

    name: str
    description: str
    parameters: Mapping[str, object]
    handler: ToolHandler | None = None
    replay_policy: ReplayPolicy = ReplayPolicy.NEVER
    completes_run: bool = False
    reconcile: Reconciler | None = None
    """Asks the tool's system what became of an in-doubt execution (``Reconciler``; design
    0206). Not in the parameter snapshot: adding one to settle runs already in doubt is the
    point, and it never changes what an execution does."""
    needs_approval: bool | Callable[[Mapping[str, object]], bool] = False
    """Whether a call waits for a person's approval before it executes (design 0210): ``True``
    for every call, or a synchronous predicate over the call's (validated) arguments, e.g.
    ``lambda args: args["amount"] > 100``. In the parameter snapshot when not ``False``
    (``tool.<name>.needs_approval``: ``always``, or ``predicate:<qualified name>``)."""
    origin: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Facts about where the tool comes from that a resume must find unchanged, ``str`` to
    ``str`` (``polyloop.mcp`` puts an MCP server's name, version, the tool's annotations and
    the reason for its replay policy here, design 0211). Each entry enters the parameter
    snapshot as ``tool.<name>.<key>``, so the drift guard refuses a resume against a changed
    origin and names the key; empty (the default) adds nothing. A key must not be one of the
    snapshot's own (``schema``, ``replay_policy``, ``completes_run``, ``needs_approval``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise PolyloopTypeError(
                f"ToolSpec.name (the tool name) must be a str, got {type(self.name).__name__}: "
                "it is sent to the model inside the tool schema"
            )
        if not self.name.strip():
            raise PolyloopValueError(
                f"ToolSpec.name (the tool name) must not be empty or blank, got {self.name!r}: "
                "the model could never call a tool it cannot see"
            )
        problem = tool_name_problem(self.name)
        if problem is not None:
            raise PolyloopValueError(
                f"ToolSpec.name (the tool name, a str) {self.name!a} {problem}: a tool name "
                f"must match {TOOL_NAME_PATTERN} (1-64 ASCII letters, digits, '_' or '-'; "
                "OpenAI's rule for function names, which keeps two tools from looking alike); "
                f"rename it, e.g. {safe_tool_name(self.name)!r} (with @tool: @tool(name=...) or "
                "rename the function)"
            )
        owner = f"ToolSpec(name={self.name!r})"
        if not isinstance(self.description, str):
            raise PolyloopTypeError(
                f"{owner}.description (the tool description) must be a str, got "
                f"{type(self.description).__name__}"
            )
        if not isinstance(self.parameters, Mapping):
            raise PolyloopTypeError(
                f"{owner}.parameters must be a mapping (a JSON Schema object such as "
                f"{{'type': 'object', 'properties': {{...}}}}), got "
                f"{type(self.parameters).__name__}"
            )
        _check_json_like(f"{owner}.parameters", self.parameters)
        _check_schema_shape(owner, self.parameters)
        if self.handler is not None and not callable(self.handler):
            raise PolyloopTypeError(
                f"{owner}.handler must be an async callable taking the arguments mapping, or "
                f"None; got {type(self.handler).__name__}"
            )
        if self.handler is not None and is_plain_function(self.handler):
            raise PolyloopTypeError(
                f"{owner}.handler {getattr(self.handler, '__qualname__', '')!r} is a plain "
                "function; declare it `async def` (the executor awaits it, and a plain function "
                "would run its side effect before the mistake showed)"
            )
        if not isinstance(self.replay_policy, ReplayPolicy):
            raise PolyloopTypeError(
                f"{owner}.replay_policy must be ReplayPolicy.SAFE, ReplayPolicy.IDEMPOTENT or "
                f"ReplayPolicy.NEVER, got {self.replay_policy!r}"
            )
        if not isinstance(self.needs_approval, bool) and not (
            callable(self.needs_approval) and not is_async_callable(self.needs_approval)
        ):
            raise PolyloopTypeError(
                f"{owner}.needs_approval must be True, False or a plain (not async) function "
                "of the call's arguments returning a bool; got "
                f"{type(self.needs_approval).__name__}"
            )
        if self.reconcile is not None and not (
            callable(self.reconcile) and not is_plain_function(self.reconcile)
        ):
            raise PolyloopTypeError(
                f"{owner}.reconcile must be an `async def` (context, arguments) -> "
                f"Reconciliation, or None; got {type(self.reconcile).__name__}"
            )
        if not isinstance(self.completes_run, bool):
            raise PolyloopTypeError(
                f"{owner}.completes_run must be a bool, got {type(self.completes_run).__name__}"
            )
        object.__setattr__(self, "parameters", frozen(self.parameters))
        object.__setattr__(self, "origin", _checked_origin(owner, self.origin))

    @classmethod
    def from_function(
        cls,
        function: Callable[..., Awaitable[str]],
        *,
        replay_policy: ReplayPolicy = ReplayPolicy.NEVER,
        **options: Unpack[ToolOptions],
    ) -> ToolSpec:
        """A spec built from a typed ``async def``: its name (or ``name``), its docstring (or
        ``description``) and a JSON Schema derived from its annotations (design 0114).

        ``str``, ``int``, ``float``, ``bool``, ``Literal[...]`` of JSON scalars, ``Enum``s of
        strings or of integers, ``list[X]``, ``dict[str, X]``, ``Optional[X]``, dataclasses and
        ``TypedDict``s map to their JSON Schema (nested freely); ``Annotated[X, "text"]`` adds
        ``"text"`` as the property's description. Parameters without a default are required;
        a JSON scalar default is shown to the model as ``default``. Undeclared keys are refused
        (``additionalProperties: false``).

        The handler checks every argument against its annotation, nested values included,
        converts it (an enum value to its member, an object to its dataclass, ``3.0`` to ``3``
        for an ``int``) and awaits ``function(**arguments)``; a value that does not fit is a
        ``ToolValidationError`` naming the parameter (the action is ``NOT_EXECUTED``). Inside a
        registry, ``validate`` checks the same schema deeply first and refuses such a call
        before the handler is called (design 0223).

        A parameter annotated ``ToolContext`` (any name, at most one) is not part of the schema:
        it receives the execution's context, idempotency key included (design 0205); the
        function can report how far it has got with ``await ctx.report_progress(n, total)``,
        which reaches the run's event sink if it has ``emit_progress`` (design 0211 amendment).

        Raises ``PolyloopTypeError`` naming the parameter for an annotation outside that list,
        a missing annotation, ``*args``/``**kwargs``/positional-only parameters, a return
        annotation other than ``str``, or a function that is not ``async def``;
        ``PolyloopValueError`` when there is neither a docstring nor ``description``, and
        ``PolyloopTypeError`` naming the options for a keyword that is not one of them.

        The per-tool options (``name``, ``description``, ``completes_run``, ``reconcile``,
        ``needs_approval``) are ``ToolOptions``, the same ones ``@tool`` takes.
        """
        unknown = sorted(set(options) - _TOOL_OPTIONS)
        if unknown:
            raise PolyloopTypeError(
                f"ToolSpec.from_function: unknown option {', '.join(map(repr, unknown))}; "
                f"the options are replay_policy, {', '.join(sorted(_TOOL_OPTIONS))}"
            )
        return _spec_from_function(function, replay_policy=replay_policy, **options)

    def asks_approval(self, arguments: Mapping[str, object]) -> bool:
        """Whether a call with ``arguments`` waits for approval (``needs_approval``).

        A predicate that raises, or returns anything but a ``bool``, counts as ``True``: when
        the rule itself is broken, a person decides (the error is logged)."""
        rule = self.needs_approval
        if isinstance(rule, bool):
            return rule
        try:
            verdict = rule(arguments)
        except Exception:  # a broken rule must not let the call through: ask a person
            logger.warning(
                "tool %r: its needs_approval predicate raised; the call waits for approval",
                self.name,
                exc_info=True,
            )
            return True
        return verdict if isinstance(verdict, bool) else True


# --------------------------------------------------------------------------- registry


class ToolRegistry:
    """An immutable, ordered set of ``ToolSpec`` with unique names.

    ``ToolRegistry()`` (no tools) is a normal configuration for agents whose actions are code
    rather than tool calls. Registries compare equal when they hold equal specs in the same
    order, and are unhashable (specs hold mappings). Registration order is the order of
    ``names()`` and ``schema_for_model()``, and survives ``restrict_to``.
    """

    __slots__ = ("_by_name", "_schemas", "_specs")

    _specs: tuple[ToolSpec, ...]
    _by_name: Mapping[str, ToolSpec]
    _schemas: Mapping[str, JsonSchema]

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        if isinstance(specs, str | bytes) or not isinstance(specs, Iterable):
            raise PolyloopTypeError(
                f"ToolRegistry(specs) must be an iterable of ToolSpec, got {type(specs).__name__}"
            )
        items = tuple(specs)
        by_name: dict[str, ToolSpec] = {}
        schemas: dict[str, JsonSchema] = {}
        for index, spec in enumerate(items):
            if not isinstance(spec, ToolSpec):
                raise PolyloopTypeError(
                    f"ToolRegistry specs[{index}] must be a ToolSpec, got {type(spec).__name__}"
                )
            if spec.name in by_name:
                raise PolyloopValueError(
                    f"ToolRegistry: duplicate tool name {spec.name!r} (specs[{index}]); which "
                    "spec the model sees and which one runs would depend on order, so names "
                    "must be unique"
                )
            by_name[spec.name] = spec
            schemas[spec.name] = JsonSchema(spec.parameters)
        object.__setattr__(self, "_specs", items)
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))
        object.__setattr__(self, "_schemas", MappingProxyType(schemas))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ToolRegistry is immutable; use restrict_to() to derive a new one")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ToolRegistry is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolRegistry):
            return NotImplemented
        return self._specs == other._specs

    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose: it holds mappings

    def __repr__(self) -> str:
        return f"ToolRegistry(names={self.names()!r})"

    # ------------------------------------------------------------------ queries

    def names(self) -> tuple[str, ...]:
        """Tool names in registration order."""
        return tuple(self._by_name)

    def spec_for(self, name: str) -> ToolSpec | None:
        """The spec called ``name``, or ``None`` if this registry has no such tool.

        Asking about an unknown name is a normal question (a code action has no tool), so it
        answers ``None`` instead of raising.
        """
        return self._by_name.get(name) if isinstance(name, str) else None

    def schema_for_model(self) -> list[dict[str, object]]:
        """``[{"name", "description", "parameters"}, ...]`` in registration order.

        A fresh tree of plain dicts and lists on every call, ready for ``json.dumps``;
        mutating it never reaches the registry. The library never renders it into the prompt
        itself: put it into the request's context, or use a parser that claims native tool
        calls, and the session offers it on every ``ModelCall.tools`` (design 0100).
        """
        return [
            {
                "name": spec.name,
                "description": spec.description,
                "parameters": thawed(spec.parameters),
            }
            for spec in self._specs
        ]

    def validate(self, call: ToolCall) -> None:
        """Raise ``ToolValidationError`` unless ``call`` may be dispatched.

        Checked in this order, stopping at the first problem:

        1. the tool exists in *this* registry;
        2. ``arguments`` is a mapping with string keys;
        3. the arguments fit the spec's ``parameters`` schema, deeply (design 0223; the
           keywords are ``polyloop._common.JsonSchema``'s), level by level and, at each
           level, in the order of this table (an object's values, or an array's items, last):

           ===========================  ===============================================
           rule                         refusal (``key``: the top-level parameter)
           ===========================  ===============================================
           ``type`` (a name or a list)  ``the parameter 'items[2].n' has the wrong type:
                                        expected integer, got string "2"``
           ``enum``, ``const``          ``the parameter 'mode' must be one of "fast",
                                        "slow", got string "medium"``
           ``anyOf``, ``oneOf``,        ``the parameter 'note' fits none of its allowed
           ``allOf``, local ``$ref``    forms: ...`` (or the one form of the value's type
                                        says what is wrong inside it)
           ``required``, schema order   ``the required parameter 'opts.depth' is missing``
           ``additionalProperties:      ``the parameter 'opts.x' is undeclared; the object
           false`` (not with            'opts' accepts only 'depth'`` (``this tool`` at
           ``patternProperties``)       the top level)
           ``properties``, a schema     each value, as ``'opts.depth'``
           ``additionalProperties``
           ``items`` (one schema)       each item, as ``'items[2]'``
           ===========================  ===============================================

        ``bool`` is neither an integer nor a number; a float with no fractional part
        (``3.0``) is an integer; ``null`` is ``None``. Keywords the check does not interpret
        (``format``, ranges, lengths, patterns, ``description``, ``default``, ``$schema``)
        and type names JSON Schema does not define are passed to the model and never
        refused; an empty schema accepts any arguments. Messages describe a bad value by
        its JSON type and at most 40 characters of it.
        """
        if not isinstance(call, ToolCall):
            raise PolyloopTypeError(
                f"validate() takes a polyloop.ports.ToolCall, got {type(call).__name__}"
            )
        name = call.name
        if not isinstance(name, str):
            raise ToolValidationError(
                f"a tool call's name must be a string, got {described_value(name)}", tool=None
            )
        schema = self._schemas.get(name)
        if schema is None:
            raise ToolValidationError(self._unknown_tool_message(name), tool=name)
        arguments = call.arguments
        if not isinstance(arguments, Mapping):
            raise ToolValidationError(
                f"the arguments of tool {name!r} must be a mapping (a JSON object) of parameter "
                f"name to value, got {json_type_of(arguments)}",
                tool=name,
            )
        for key in arguments:
            if not isinstance(key, str):
                raise ToolValidationError(
                    f"tool {name!r}: parameter names must be strings, got {described_value(key)}",
                    tool=name,
                )
        found = schema.problems(arguments, first_only=True)
        if found:
            problem = found[0]
            top = problem.path[0] if problem.path else None
            raise ToolValidationError(
                _refusal_text(name, problem), tool=name, key=top if isinstance(top, str) else None
            )

    def _unknown_tool_message(self, name: str) -> str:
        if not self._specs:
            return f"tool {name!r} does not exist: no tools are available in this run"
        known = ", ".join(repr(n) for n in self._by_name)
        return f"tool {name!r} does not exist; the available tools are {known}"

    # ------------------------------------------------------------------ derivation

    def restrict_to(self, names: Iterable[str]) -> ToolRegistry:
        """A new registry with only ``names``, in *registration* order.

        The order of ``names`` is ignored on purpose: it is often a ``set``, whose order
        changes between processes, and the schema order must not. A name this registry does
        not have raises ``ValueError`` (silently dropping it would hide a tool the caller
        believes is available). The original registry is unchanged.
        """
        if isinstance(names, str | bytes) or not isinstance(names, Iterable):
            raise PolyloopTypeError(
                "restrict_to() takes a collection of tool names such as ['read', 'write'], "
                f"got {type(names).__name__}"
            )
        wanted = set(names)
        unknown = sorted(repr(n) for n in wanted if n not in self._by_name)
        if unknown:
            raise PolyloopValueError(
                f"restrict_to(): {', '.join(unknown)} not in the registry; registered tools "
                f"are {', '.join(repr(n) for n in self._by_name) or 'none'}"
            )
        return ToolRegistry(spec for spec in self._specs if spec.name in wanted)

    def executor(self) -> RegistryExecutor:
        """The ``ActionExecutor`` that dispatches tool calls through this registry.

        Raises ``ValueError`` naming every spec without a handler: finding that out at the
        first call of the missing tool would be one step too late.
        """
        return RegistryExecutor(self)


# --------------------------------------------------------------------------- executor

_NOT_A_TOOL_CALL: Final = (
    "not executed: this executor only dispatches tool calls, and this action carries none. "
    "Reply with a call to one of the available tools"
)


def _outcome(status: ActionStatus, observation: str) -> ActionOutcome:
    return ActionOutcome(
        status=status,
        observation=observation,
        observation_is_synthetic=False,
        env_reported_completion=False,
        observation_truncated_chars=0,
    )


def _executor_parameters(registry: ToolRegistry) -> Mapping[str, str]:
    parameters = {"kind": "registry"}
    for spec in registry._specs:
        schema: dict[str, object] = {
            "name": spec.name,
            "description": spec.description,
            "parameters": thawed(spec.parameters),
        }
        canonical = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        parameters[f"tool.{spec.name}.schema"] = f"sha256:{digest}"
        parameters[f"tool.{spec.name}.replay_policy"] = spec.replay_policy.value
        parameters[f"tool.{spec.name}.completes_run"] = "true" if spec.completes_run else "false"
        rule = spec.needs_approval
        if rule is not False:  # only when set, so that older runs keep their snapshot
            label = getattr(rule, "__qualname__", type(rule).__name__)
            parameters[f"tool.{spec.name}.needs_approval"] = (
                "always" if rule is True else f"predicate:{label}"
            )
        for key, value in spec.origin.items():  # empty for every spec but polyloop.mcp's
            parameters[f"tool.{spec.name}.{key}"] = value
    return MappingProxyType(parameters)


class RegistryExecutor:
    """Dispatches ``Action``s that carry a ``ToolCall`` to the handler of that tool.

    How ``execute`` fills ``ActionOutcome.status`` and ``observation``:

    * no ``tool_call`` (a code or text action) -> ``NOT_EXECUTED``, an explanation;
    * ``ToolRegistry.validate`` refuses the call (at any depth of its arguments, design 0223)
      -> ``NOT_EXECUTED``, the validation message (arguments that cannot even be checked,
      such as a mapping whose iteration raises, are refused the same way: validation never
      raises out of ``execute``);
    * the handler returns a ``str`` -> ``EXECUTED``, that string;
    * the handler raises ``ToolValidationError`` (it refused the arguments before acting)
      -> ``NOT_EXECUTED``, ``"not executed: <message>"``;
    * the handler raises ``ToolEnvironmentError`` -> ``ENV_ERROR``, ``"<Class>: <text>"``;
    * the handler raises ``ToolOutcomeUnknown`` -> raised out of ``execute`` untouched: no
      outcome, the execution is in doubt and the session settles it by its replay policy
      (design 0227);
    * the handler raises any other ``Exception`` -> ``EXECUTED``, ``"<Class>: <text>"``; the
      traceback goes to the ``polyloop.tools`` logger, never to the model;
    * the handler raises ``ChildRunOpenError`` (a child run it ran stopped left open, design
      0245) -> raised out of ``execute``: the session stops the parent the same way;
    * the handler raises ``TreeLimitError`` (a child run past ``max_depth``/``max_children``,
      design 0245) -> raised out of ``execute``: the session finishes the run ``tree_limit``;
    * the handler raises ``RunLeaseHeldError`` or ``RunLeaseLostError`` (a run it drives, such
      as a child run, is held by another holder, design 0245) -> raised out of ``execute``:
      the call's outcome is unknown here, so the log keeps it open and ``run()`` raises it.

    ``observation_is_synthetic`` is always ``False``, ``observation_truncated_chars`` ``0`` and
    ``env_reported_completion`` ``False`` (tool-based completion is ``ToolSpec.completes_run``,
    read by the session).

    Raised out of ``execute`` (the library does not catch these; ``run()`` propagates them):
    ``asyncio.CancelledError`` and other ``BaseException``s untouched, and ``TypeError`` when
    a handler breaks the ``ToolHandler`` contract: it returns a non-``str``, or it is a plain
    (non-async) callable that returns. ``ToolSpec`` refuses plain ``def`` functions at
    construction (issue 12), so this remains only for callables whose kind cannot be read
    from their definition (a class with a synchronous ``__call__``, a builtin). The handler
    ran in that case, so recovery's "intent without result" verdict is the truth.
    """

    __slots__ = ("_parameters", "_registry")

    def __init__(self, registry: ToolRegistry) -> None:
        if not isinstance(registry, ToolRegistry):
            raise PolyloopTypeError(
                f"RegistryExecutor(registry) needs a ToolRegistry, got {type(registry).__name__}"
            )
        missing = [spec.name for spec in registry._specs if spec.handler is None]
        if missing:
            raise PolyloopValueError(
                "cannot build an executor: no handler on tool(s) "
                f"{', '.join(repr(n) for n in missing)}; set ToolSpec.handler, or "
                "restrict_to() the tools that have one"
            )
        self._registry = registry
        self._parameters = _executor_parameters(registry)

    @property
    def registry(self) -> ToolRegistry:
        """The registry this executor dispatches through (``RunRequest`` checks that it
        equals the request's ``tools``)."""
        return self._registry

    def parameters(self) -> Mapping[str, str]:
        """``{"kind": "registry"}`` plus, per tool ``<name>``, ``tool.<name>.schema`` (sha256
        of the model-visible entry), ``tool.<name>.replay_policy`` and
        ``tool.<name>.completes_run``, ``tool.<name>.needs_approval`` when set, and
        ``tool.<name>.<key>`` for each entry of the spec's ``origin`` (design 0211). Handler
        code cannot be fingerprinted and is not here."""
        return self._parameters

    async def execute(self, action: Action) -> ActionOutcome:
        """Run one action; see the class docstring for the status of each case."""
        call = action.tool_call
        if call is None:
            return _outcome(ActionStatus.NOT_EXECUTED, _NOT_A_TOOL_CALL)
        try:
            self._registry.validate(call)
        except ToolValidationError as exc:
            return _outcome(ActionStatus.NOT_EXECUTED, f"not executed: {exc}")
        except Exception as exc:  # noqa: BLE001 - arguments are untrusted parser output: a
            # check that trips over them (a mapping whose iteration raises) refuses the call
            # instead of raising after the action's intent is durable.
            return _outcome(
                ActionStatus.NOT_EXECUTED,
                f"not executed: the arguments could not be checked ({describe_exception(exc)})",
            )
        spec = self._registry._by_name[call.name]
        handler = spec.handler
        assert handler is not None  # guaranteed by __init__
        takes_context = getattr(handler, "takes_context", False) is True
        if takes_context and action.context is None:
            return _outcome(
                ActionStatus.NOT_EXECUTED,
                f"not executed: tool {spec.name!r} needs the execution's ToolContext (its "
                "idempotency key), which the library puts on the Action inside a run",
            )
        pending: object = None
        result: object = None
        try:
            pending = (
                handler(call.arguments, action.context)  # type: ignore[call-arg]
                if takes_context
                else handler(call.arguments)
            )
            if inspect.isawaitable(pending):
                result = await pending
        except (ChildRunOpenError, TreeLimitError, RunLeaseHeldError, RunLeaseLostError):
            # A child run left open: the session stops the parent the same way; a tree limit:
            # the session finishes the parent tree_limit; a child run
            # (or the run) held by another holder: not the tool's failure, the call's outcome
            # is unknown here, so it stays open on record (design 0245).
            raise
        except ToolValidationError as exc:
            return _outcome(ActionStatus.NOT_EXECUTED, f"not executed: {exc}")
        except ToolOutcomeUnknown:
            raise  # no outcome to record: the session settles it by policy (design 0227)
        except ToolEnvironmentError as exc:
            logger.warning("tool %r reported a broken environment", spec.name, exc_info=exc)
            return _outcome(ActionStatus.ENV_ERROR, describe_exception(exc))
        except Exception as exc:
            # Not swallowed: a tool's own failure is, by contract, an executed action whose
            # observation is the error; the traceback goes to logging.
            logger.warning(
                "tool %r raised; recorded as an executed action with the error as observation",
                spec.name,
                exc_info=exc,
            )
            return _outcome(ActionStatus.EXECUTED, describe_exception(exc))
        if not inspect.isawaitable(pending):
            raise PolyloopTypeError(
                f"the handler of tool {spec.name!r} returned {type(pending).__name__} instead "
                "of an awaitable; a ToolHandler must be an async callable"
            )
        if not isinstance(result, str):
            raise PolyloopTypeError(
                f"the handler of tool {spec.name!r} returned {type(result).__name__}; a "
                "ToolHandler must return the observation as a str"
            )
        return _outcome(ActionStatus.EXECUTED, result)


if TYPE_CHECKING:

    def _conforms_to_the_seam(executor: RegistryExecutor) -> ActionExecutor:
        return executor  # mypy proves RegistryExecutor satisfies the ActionExecutor Protocol


# --------------------------------------------------------------------------- specs from functions
#
# ``ToolSpec.from_function`` derives a JSON Schema from a typed ``async def`` and wraps the
# function in a handler that checks and converts each argument to its annotated type (an enum
# member, a dataclass instance) before calling it. Design record 0114 lists the mapping.

_Convert = Callable[[object, str], object]


def _refusal(path: str, message: str) -> ToolValidationError:
    """A value that does not fit its annotation; the handler adds the tool's name."""
    return ToolValidationError(f"{path} {message}", tool=None)


def _keep(value: object, path: str) -> object:
    return value


def _to_int(value: object, path: str) -> object:
    return int(value) if isinstance(value, float) else value  # 3.0 passed as an integer


def _to_float(value: object, path: str) -> object:
    return float(value) if isinstance(value, int) else value


def _to_list(value: object, path: str) -> object:
    return list(value) if isinstance(value, list | tuple) else value


def _to_dict(value: object, path: str) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def _checked(json_type: str, convert: _Convert = _keep) -> _Convert:
    check = JSON_TYPE_CHECKS[json_type]

    def run(value: object, path: str) -> object:
        if not check(value):
            raise _refusal(path, f"must be {json_type}, got {described_value(value)}")
        return convert(value, path)

    return run


_SCALARS: Final[Mapping[type, tuple[str, _Convert]]] = MappingProxyType(
    {
        str: ("string", _checked("string")),
        bool: ("boolean", _checked("boolean")),
        int: ("integer", _checked("integer", _to_int)),
        float: ("number", _checked("number", _to_float)),
    }
)
_LITERAL_TYPES: Final = (str, bool, int, float, type(None))


def _json_name(value: object) -> str:
    return json_type_of(value)


def _nullable(schema: dict[str, object]) -> dict[str, object]:
    declared = schema.get("type")
    if isinstance(declared, str) and set(schema) <= {"type", "enum", "description"}:
        widened = dict(schema, type=[declared, "null"])
        enum_values = schema.get("enum")
        if isinstance(enum_values, list):
            widened["enum"] = [*enum_values, None]
        return widened
    return {"anyOf": [schema, {"type": "null"}]}


class _SchemaBuilder:
    """Maps one function's annotations to JSON Schema and converters, naming the parameter
    whose annotation has no mapping."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._open: set[type] = set()

    def refuse(self, where: str, hint: object, why: str) -> PolyloopTypeError:
        return PolyloopTypeError(
            f"{self.owner}: {where} is annotated {_hint_name(hint)}, {why}; use str, int, "
            "float, bool, Literal[...], an Enum, list[...], dict[str, ...], Optional[...], a "
            "dataclass or a TypedDict (or build the ToolSpec by hand)"
        )

    def build(self, where: str, hint: object) -> tuple[dict[str, object], _Convert]:
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is typing.Annotated:
            schema, convert = self.build(where, args[0])
            notes = [note for note in args[1:] if isinstance(note, str)]
            if notes:
                schema = dict(schema, description=notes[0])
            return schema, convert
        if isinstance(hint, type) and hint in _SCALARS:
            json_type, convert = _SCALARS[hint]
            return {"type": json_type}, convert
        if origin is typing.Literal:
            return self._literal(where, hint, args)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return self._enum(where, hint)
        if origin in (typing.Union, types.UnionType):
            return self._optional(where, hint, args)
        if hint is list or origin is list:
            return self._list(where, args)
        if hint is dict or origin is dict:
            return self._dict(where, hint, args)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self._dataclass(where, hint)
        if isinstance(hint, type) and typing.is_typeddict(hint):
            return self._typeddict(where, hint)
        raise self.refuse(where, hint, "which has no JSON Schema mapping")

    def _literal(
        self, where: str, hint: object, values: tuple[object, ...]
    ) -> tuple[dict[str, object], _Convert]:
        if not all(isinstance(v, _LITERAL_TYPES) for v in values):
            raise self.refuse(where, hint, "whose values are not all JSON scalars")
        names = sorted({_json_name(v) for v in values})
        allowed = list(values)

        def convert(value: object, path: str) -> object:
            for option in allowed:
                if value == option and type(value) is type(option):
                    return option
            raise _refusal(path, f"must be one of {allowed!r}, got {described_value(value)}")

        return {"type": names[0] if len(names) == 1 else names, "enum": allowed}, convert

    def _enum(self, where: str, hint: type[enum.Enum]) -> tuple[dict[str, object], _Convert]:
        values = [member.value for member in hint]
        names = {_json_name(v) for v in values}
        if not values or not names <= {"string", "integer"} or len(names) != 1:
            raise self.refuse(where, hint, "whose values are not all strings or all integers")
        by_value = {member.value: member for member in hint}

        def convert(value: object, path: str) -> object:
            if isinstance(value, bool) or value not in by_value:
                raise _refusal(path, f"must be one of {values!r}, got {described_value(value)}")
            return by_value[value]

        return {"type": names.pop(), "enum": values}, convert

    def _optional(
        self, where: str, hint: object, args: tuple[object, ...]
    ) -> tuple[dict[str, object], _Convert]:
        others = [arg for arg in args if arg is not type(None)]
        if len(others) != 1 or len(others) == len(args):
            raise self.refuse(where, hint, "a union other than Optional[X] (X | None)")
        schema, inner = self.build(where, others[0])

        def convert(value: object, path: str) -> object:
            return None if value is None else inner(value, path)

        return _nullable(schema), convert

    def _list(self, where: str, args: tuple[object, ...]) -> tuple[dict[str, object], _Convert]:
        if not args:
            return {"type": "array"}, _checked("array", _to_list)
        items, inner = self.build(f"{where} (its items)", args[0])

        def convert(value: object, path: str) -> object:
            assert isinstance(value, list | tuple)
            return [inner(item, f"{path}[{index}]") for index, item in enumerate(value)]

        return {"type": "array", "items": items}, _checked("array", convert)

    def _dict(
        self, where: str, hint: object, args: tuple[object, ...]
    ) -> tuple[dict[str, object], _Convert]:
        if not args:
            return {"type": "object"}, _checked("object", _to_dict)
        if args[0] is not str:
            raise self.refuse(where, hint, "but JSON object keys are always strings")
        values, inner = self.build(f"{where} (its values)", args[1])

        def convert(value: object, path: str) -> object:
            assert isinstance(value, Mapping)
            return {key: inner(item, f"{path}[{key!r}]") for key, item in value.items()}

        return {"type": "object", "additionalProperties": values}, _checked("object", convert)

    def _fields(
        self, where: str, hint: type, names: dict[str, object], required: set[str]
    ) -> tuple[dict[str, object], dict[str, _Convert]]:
        if hint in self._open:
            raise self.refuse(where, hint, "which refers to itself")
        self._open.add(hint)
        properties: dict[str, object] = {}
        converters: dict[str, _Convert] = {}
        for name, field_hint in names.items():
            properties[name], converters[name] = self.build(
                f"{where} (its field {name!r})", field_hint
            )
        self._open.discard(hint)
        schema: dict[str, object] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = [name for name in names if name in required]
        schema["additionalProperties"] = False
        return schema, converters

    def _object_converter(
        self, converters: Mapping[str, _Convert], required: set[str], make: Callable[..., object]
    ) -> _Convert:
        def convert(value: object, path: str) -> object:
            assert isinstance(value, Mapping)
            missing = [name for name in converters if name in required and name not in value]
            if missing:
                raise _refusal(path, f"is missing the field {missing[0]!r}")
            unknown = [key for key in value if key not in converters]
            if unknown:
                raise _refusal(path, f"has the undeclared field {unknown[0]!r}")
            return make(
                **{key: converters[key](item, f"{path}.{key}") for key, item in value.items()}
            )

        return _checked("object", convert)

    def _dataclass(self, where: str, hint: type) -> tuple[dict[str, object], _Convert]:
        hints = _resolved_hints(self, where, hint)
        fields = [f for f in dataclasses.fields(hint) if f.init]
        required = {
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        schema, converters = self._fields(
            where, hint, {f.name: hints[f.name] for f in fields}, required
        )
        return schema, self._object_converter(converters, required, hint)

    def _typeddict(self, where: str, hint: type) -> tuple[dict[str, object], _Convert]:
        hints = _resolved_hints(self, where, hint)
        required = set(getattr(hint, "__required_keys__", hints))
        schema, converters = self._fields(where, hint, hints, required)
        return schema, self._object_converter(converters, required, dict)


def _resolved_hints(builder: _SchemaBuilder, where: str, target: object) -> dict[str, object]:
    try:
        return typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError) as exc:
        unresolved = _unresolved_annotation(target, exc)
        if unresolved is not None:
            raise PolyloopTypeError(f"{builder.owner}: {unresolved}") from exc
        raise builder.refuse(
            where, target, f"whose annotations cannot be resolved ({exc})"
        ) from exc


def _unresolved_annotation(target: object, exc: Exception) -> str | None:
    """Which annotation of ``target`` names what ``exc`` (a ``NameError`` from
    ``typing.get_type_hints``) could not find, said as a scope problem: under
    ``from __future__ import annotations`` an annotation is a string resolved later in the
    module's globals, so a local class or a name imported only under ``TYPE_CHECKING`` is not
    there. ``None`` when no single annotation can be blamed (the generic message stands)."""
    missing = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    if not isinstance(missing, str):
        return None
    owners = [target] if inspect.isfunction(target) else list(getattr(target, "__mro__", ()))
    for owner in owners:
        annotations = getattr(owner, "__annotations__", None)
        if not isinstance(annotations, dict):
            continue
        for key, annotation in annotations.items():
            if isinstance(annotation, str) and re.search(rf"\b{re.escape(missing)}\b", annotation):
                kind = "field" if isinstance(owner, type) else "parameter"
                what = "the return value" if key == "return" else f"{kind} {key!r}"
                return (
                    f"{what} is annotated {annotation!r}, and {missing!r} cannot be resolved "
                    f"where {owner.__qualname__} is defined: under `from __future__ import "
                    "annotations` an annotation is looked up in the module's globals, so a name "
                    "defined inside a function or imported only under TYPE_CHECKING is not "
                    f"found. Import {missing} at module level, or drop the future import from "
                    "that module"
                )
    return None


def _hint_name(hint: object) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


class _KeywordHandler:
    """The ``ToolHandler`` of a spec built by ``ToolSpec.from_function``: checks and converts
    each argument, then awaits ``function(**arguments)``. Equal when it wraps the same
    function for the same tool."""

    __slots__ = ("_context_parameter", "_converters", "_tool", "function")

    def __init__(
        self,
        function: Callable[..., Any],
        tool: str,
        converters: Mapping[str, _Convert],
        context_parameter: str | None = None,
    ) -> None:
        self.function = function
        self._tool = tool
        self._converters = MappingProxyType(dict(converters))
        self._context_parameter = context_parameter

    @property
    def takes_context(self) -> bool:
        """Whether the function declares a ``ToolContext`` parameter (``ToolHandler`` docs)."""
        return self._context_parameter is not None

    async def __call__(
        self, arguments: Mapping[str, object], context: ToolContext | None = None, /
    ) -> str:
        keywords: dict[str, object] = {}
        if self._context_parameter is not None:
            keywords[self._context_parameter] = context
        for key, value in arguments.items():
            convert = self._converters.get(key)
            if convert is None:
                raise ToolValidationError(
                    f"tool {self._tool!r}: the parameter {key!r} is undeclared",
                    tool=self._tool,
                    key=key,
                )
            try:
                keywords[key] = convert(value, f"the parameter {key!r}")
            except ToolValidationError as exc:
                raise ToolValidationError(
                    f"tool {self._tool!r}: {exc}", tool=self._tool, key=key
                ) from None
        result: str = await self.function(**keywords)
        return result

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _KeywordHandler):
            return NotImplemented
        return self.function is other.function and self._tool == other._tool

    def __hash__(self) -> int:
        return hash((id(self.function), self._tool))

    def __repr__(self) -> str:
        label = getattr(self.function, "__qualname__", self.function)
        return f"<handler of tool {self._tool!r}: {label!r}>"


def _spec_from_function(
    function: Callable[..., Awaitable[str]],
    *,
    replay_policy: ReplayPolicy,
    name: str | None = None,
    description: str | None = None,
    completes_run: bool = False,
    reconcile: Reconciler | None = None,
    needs_approval: bool | Callable[[Mapping[str, object]], bool] = False,
) -> ToolSpec:
    label = getattr(function, "__qualname__", type(function).__name__)
    owner = f"ToolSpec.from_function({label})"
    if not (inspect.isfunction(function) or inspect.ismethod(function)) or not (
        inspect.iscoroutinefunction(function)
    ):
        raise PolyloopTypeError(
            f"{owner}: the tool must be an `async def` function or method (its parameters "
            f"become the tool's schema), got {type(function).__name__}"
        )
    tool = function.__name__ if name is None else name
    if description is None:
        description = inspect.getdoc(function)
        if not description or not description.strip():
            raise PolyloopValueError(
                f"{owner}: the tool has no docstring, and the docstring is the description the "
                "model reads; write one, or pass description=..."
            )
    builder = _SchemaBuilder(owner)
    hints = _resolved_hints(builder, "the function", function)
    properties: dict[str, object] = {}
    converters: dict[str, _Convert] = {}
    required: list[str] = []
    context_parameter: str | None = None
    for parameter in inspect.signature(function).parameters.values():
        where = f"parameter {parameter.name!r}"
        if hints.get(parameter.name) is ToolContext:
            if context_parameter is not None:
                raise PolyloopTypeError(
                    f"{owner}: {where} and {context_parameter!r} are both annotated "
                    "ToolContext; declare one parameter for the execution's context"
                )
            context_parameter = parameter.name
            continue
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise PolyloopTypeError(
                f"{owner}: {where} is {parameter.kind.description}; a tool's parameters are "
                "the named keys of one JSON object, so use plain or keyword-only parameters"
            )
        if parameter.name not in hints:
            raise PolyloopTypeError(
                f"{owner}: {where} has no type annotation; annotate it (str, int, float, bool, "
                "Literal, an Enum, list, dict, Optional, a dataclass or a TypedDict)"
            )
        schema, converters[parameter.name] = builder.build(where, hints[parameter.name])
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        elif isinstance(parameter.default, str | int | float | bool | None):
            schema = dict(schema, default=parameter.default)
        properties[parameter.name] = schema
    returned = hints.get("return", str)
    if returned is not str:
        raise PolyloopTypeError(
            f"{owner}: the return annotation is {_hint_name(returned)}; a tool returns its "
            "observation as a str (render anything else into text yourself)"
        )
    parameters: dict[str, object] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    parameters["additionalProperties"] = False
    return ToolSpec(
        name=tool,
        description=description,
        parameters=parameters,
        handler=_KeywordHandler(function, tool, converters, context_parameter),
        replay_policy=replay_policy,
        completes_run=completes_run,
        reconcile=reconcile,
        needs_approval=needs_approval,
    )
