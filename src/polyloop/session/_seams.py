"""What an object must offer to serve as a seam, checked once, at construction.

=================  ==============  ===========================================================
field              Protocol        methods (``async``: the library awaits it; else it calls it)
=================  ==============  ===========================================================
model_client       ModelClient     async ``call``, ``parameters``
decision_parser    DecisionParser  ``parse``, ``parameters``
store              RunStore        async ``write_run_started``, ``write_intent``,
                                   ``write_model_call_result``, ``write_step_completed``,
                                   ``write_run_finished``, ``read_log``; ``parameters``
event_sink         EventSink       async ``emit``, ``parameters``
action_executor    ActionExecutor  async ``execute``, ``parameters``
=================  ==============  ===========================================================

A check reads definitions only; it never calls a seam. ``seam_snapshot`` does call
``parameters()`` (every time), so the parameter snapshot is what a seam reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from polyloop._common import (
    frozen_str_mapping,
    is_async_callable,
    is_plain_function,
)
from polyloop.errors import PolyloopTypeError
from polyloop.ports import ActionExecutor, DecisionParser, EventSink, ModelClient, RunStore
from polyloop.types import RECORDS

__all__ = [
    "DEFINITION_SEAMS",
    "check_seam",
    "claimed_max_output_tokens",
    "claims_native_tool_calls",
    "seam_snapshot",
]

_SYNC: Final = "sync"
_ASYNC: Final = "async"
_SEAM_METHODS: Final[Mapping[str, tuple[str, tuple[tuple[str, str], ...]]]] = {
    "model_client": ("ModelClient", (("call", _ASYNC), ("parameters", _SYNC))),
    "decision_parser": ("DecisionParser", (("parse", _SYNC), ("parameters", _SYNC))),
    "store": (
        "RunStore",
        (
            # The seam's write methods: those the record table marks required (design 0220).
            *(
                (kind.write_method, _ASYNC)
                for kind in RECORDS.kinds
                if kind.required and kind.write_method is not None
            ),
            ("read_log", _ASYNC),
            ("parameters", _SYNC),
        ),
    ),
    "event_sink": ("EventSink", (("emit", _ASYNC), ("parameters", _SYNC))),
    "action_executor": ("ActionExecutor", (("execute", _ASYNC), ("parameters", _SYNC))),
}
"""Per seam field: the Protocol's name and its methods, each ``async`` or ``sync``."""

DEFINITION_SEAMS: Final = ("model_client", "decision_parser", "store", "event_sink")
"""The seams of ``AgentDefinition``, in snapshot order; the executor belongs to the request."""

_SEAM_OWNERS: Final = {"action_executor": "RunRequest"}


def _seams_satisfied_by(value: object) -> list[str]:
    return [
        f"{protocol} (the `{field}` field)"
        for field, (protocol, methods) in _SEAM_METHODS.items()
        if all(callable(getattr(value, name, None)) for name, _ in methods)
    ]


def check_seam(field: str, value: object) -> None:
    """Refuse, at construction, an object that cannot serve as the seam ``field``.

    A missing or non-callable method is a ``PolyloopTypeError`` naming the field, the method
    and, when the object fits another seam, that seam (a parser passed as the model client).
    A method written with plain ``def`` where the seam awaits it (or ``async def`` where the
    seam calls it synchronously) is refused too. Callables whose kind cannot be read from
    their definition (mocks, builtins) are accepted as they are.
    """
    protocol, methods = _SEAM_METHODS[field]
    owner = f"{_SEAM_OWNERS.get(field, 'AgentDefinition')}.{field}"
    shape = ", ".join(f"{'async ' if kind == _ASYNC else ''}{name}()" for name, kind in methods)
    for name, kind in methods:
        method = getattr(value, name, None)
        if not callable(method):
            fits = _seams_satisfied_by(value)
            hint = f"; it looks like a {' or a '.join(fits)}" if fits else ""
            raise PolyloopTypeError(
                f"{owner} must be a {protocol} (methods: {shape}); the "
                f"{type(value).__name__} given has no method {name}(){hint}"
            )
        if kind == _ASYNC and is_plain_function(method):
            raise PolyloopTypeError(
                f"{owner}: {type(value).__name__}.{name} must be declared `async def`: the "
                f"library awaits it (a plain def would run and then fail at the await)"
            )
        if kind == _SYNC and is_async_callable(method):
            raise PolyloopTypeError(
                f"{owner}: {type(value).__name__}.{name} must be a plain `def`, not "
                "`async def`: the library calls it synchronously"
            )


def claims_native_tool_calls(seam: object) -> bool:
    """Whether a seam object declares ``native_tool_calls = True`` (design 0100)."""
    return getattr(seam, "native_tool_calls", False) is True


def claimed_max_output_tokens(client: object) -> int | None:
    """The model client's ``max_output_tokens`` (the most tokens one reply can have; the
    gateway adapter's ``max_completion_tokens`` or ``max_tokens`` sampling value), ``None``
    when it states none. The cost budget's check before a call prices that many completion
    tokens (design 0236). ``PolyloopTypeError`` for anything but ``None`` or an int >= 1."""
    value = getattr(client, "max_output_tokens", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PolyloopTypeError(
            f"AgentDefinition.model_client: {type(client).__name__}.max_output_tokens must be "
            f"None or an int >= 1 (the most tokens one reply can have), got {value!r}"
        )
    return value


def seam_snapshot(
    seam: ModelClient | DecisionParser | RunStore | EventSink | ActionExecutor, prefix: str
) -> dict[str, str]:
    """``<prefix>.<key>`` for every entry of ``seam.parameters()`` (called now).

    Raises ``PolyloopTypeError`` naming the seam when a key or value is not a ``str``.
    """
    parameters = seam.parameters()
    checked = frozen_str_mapping(prefix, "parameters()", parameters)
    return {f"{prefix}.{key}": value for key, value in checked.items()}
