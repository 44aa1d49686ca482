"""``@tool``: a thin spelling of ``ToolSpec.from_function`` for the ``Agent`` (design 0208).

The decorator builds the spec when the function is defined, so a function whose annotations
have no JSON Schema fails at import, naming the parameter; it returns the function itself,
unchanged and still callable (and still acceptable to ``ToolSpec.from_function``), with the
spec attached for ``Agent(tools=[...])`` and ``spec_of``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, TypeAlias, TypeVar, Unpack, overload

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.tools import ToolOptions, ToolSpec
from polyloop.types import ReplayPolicy

__all__ = ["ReplayName", "spec_of", "tool"]

ToolFunction = TypeVar("ToolFunction", bound=Callable[..., Awaitable[str]])

ReplayName: TypeAlias = Literal["never", "idempotent", "safe"]
"""The replay policies by name, as ``@tool(replay=...)`` takes them."""

_SPEC_ATTRIBUTE: Final = "__polyloop_tool__"
_POLICIES: Final = {policy.value: policy for policy in ReplayPolicy}


def _policy(replay: object, label: str) -> ReplayPolicy:
    if isinstance(replay, ReplayPolicy):
        return replay
    if isinstance(replay, str) and replay in _POLICIES:
        return _POLICIES[replay]
    shown = repr(replay) if isinstance(replay, str) else type(replay).__name__
    raise PolyloopValueError(
        f"@tool(replay={shown}) on {label}: use 'never' (the default: an action whose outcome "
        "is unknown after a crash is never repeated), 'idempotent' (repeated with the same "
        "idempotency key, for a service that deduplicates by it) or 'safe' (repeating it "
        "changes nothing, e.g. a pure computation or a read)"
    )


def _label(function: object) -> str:
    return str(getattr(function, "__qualname__", type(function).__name__))


def _decorate(
    function: ToolFunction,
    replay: ReplayName | ReplayPolicy,
    options: ToolOptions,
) -> ToolFunction:
    if not callable(function):
        hint = f" (did you mean @tool(replay={function!r})?)" if isinstance(function, str) else ""
        raise PolyloopTypeError(
            f"@tool decorates an `async def` function; got {type(function).__name__}{hint}. "
            "Write @tool or @tool(replay=...) on the line above `async def`"
        )
    label = _label(function)
    if "replay_policy" in options:
        raise PolyloopTypeError(
            f"@tool(replay_policy=...) on {label}: @tool spells it replay= "
            "('never', 'idempotent' or 'safe', or a ReplayPolicy)"
        )
    if getattr(function, _SPEC_ATTRIBUTE, None) is not None:
        raise PolyloopValueError(
            f"{label} is already decorated with @tool; decorate it once, with every option"
        )
    spec = ToolSpec.from_function(function, replay_policy=_policy(replay, label), **options)
    setattr(function, _SPEC_ATTRIBUTE, spec)
    return function


@overload
def tool(function: ToolFunction, /) -> ToolFunction: ...


@overload
def tool(
    *,
    replay: ReplayName | ReplayPolicy = "never",
    **options: Unpack[ToolOptions],
) -> Callable[[ToolFunction], ToolFunction]: ...


def tool(
    function: ToolFunction | None = None,
    /,
    *,
    replay: ReplayName | ReplayPolicy = "never",
    **options: Unpack[ToolOptions],
) -> ToolFunction | Callable[[ToolFunction], ToolFunction]:
    """Make a typed ``async def`` a tool: ``@tool`` or ``@tool(replay="safe", ...)``.

    The spec is ``ToolSpec.from_function(function, replay_policy=..., **options)``, built
    now: its name is the function's (or ``name``), its description the docstring (or
    ``description``), its JSON Schema the annotations (design 0114), and a parameter annotated
    ``polyloop.tools.ToolContext`` receives the execution's idempotency key. Every error of
    ``from_function`` is raised here, at definition time, naming the parameter.

    ``replay`` is the tool's replay policy, by name or as a ``ReplayPolicy``: ``"never"`` (the
    default, for anything with a side effect: after a crash inside it the run stops with
    ``resume_state_unknown`` instead of running it again), ``"idempotent"`` (repeated with the
    same idempotency key; hand ``ToolContext.idempotency_key`` to the service) or ``"safe"``
    (repeating it changes nothing).

    The other options are ``polyloop.tools.ToolOptions``, the very ones ``from_function``
    takes (design 0224): ``name``, ``description``, ``completes_run=True`` (the run ends when
    the tool has executed), ``reconcile`` (asks the tool's system what became of an execution
    in doubt, design 0206) and ``needs_approval`` (``True`` or a predicate over the arguments:
    the call waits for a person's decision before it runs, design 0210).

    Returns the function itself, unchanged: call it as before (in tests, say). ``spec_of``
    gives its ``ToolSpec``; ``Agent(tools=[...])`` takes the function.
    """
    if function is not None:
        return _decorate(function, replay, options)

    def decorator(inner: ToolFunction) -> ToolFunction:
        return _decorate(inner, replay, options)

    return decorator


def spec_of(function: Callable[..., Any]) -> ToolSpec:
    """The ``ToolSpec`` that ``@tool`` attached to ``function``.

    ``PolyloopTypeError`` for a function that was not decorated, saying how to make it a tool.
    """
    spec = getattr(function, _SPEC_ATTRIBUTE, None)
    if isinstance(spec, ToolSpec):
        return spec
    label = _label(function)
    raise PolyloopTypeError(
        f"{label} is not a tool: decorate it with @polyloop.tool (replay 'never' unless you "
        f"say otherwise), or pass ToolSpec.from_function({label.rsplit('.', 1)[-1]}, ...)"
    )


def is_tool(value: object) -> bool:
    """Whether ``value`` carries a spec from ``@tool``."""
    return isinstance(getattr(value, _SPEC_ATTRIBUTE, None), ToolSpec)
