"""``ScriptedModelClient``: a ``ModelClient`` that replays a script, for tests.

Standard library and polyloop only (no pytest): a soak or benchmark tool may use it outside a
test run, although importing it through ``polyloop.testing`` loads the contract suite, and
therefore pytest, too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import ModelCall
from polyloop.types import ModelReply

__all__ = ["ScriptedModelClient"]

ScriptEntry: TypeAlias = str | ModelReply | BaseException
"""One entry of a script: a reply's text, a whole reply, or an exception to raise."""

_INDEX_BY: Final = ("call_index", "arrival")
_WHEN_EXHAUSTED: Final = ("raise", "repeat_last", "cycle")
_DEFAULT_PARAMETERS: Final[Mapping[str, str]] = MappingProxyType({"kind": "scripted"})


class ScriptedModelClient:
    """A model client that answers from a fixed script: a stand-in for a model in tests.

    It satisfies ``polyloop.ports.ModelClient`` and is certified by ``ModelClientContract``
    (and, with ``native_tool_calls=True`` and a reply carrying tool calls,
    ``NativeToolCallModelClientContract``) in this repository's own suite.

    .. code-block:: python

        model = ScriptedModelClient(
            ['{"tool": "add", "arguments": {"a": 2, "b": 3}}', '{"final_answer": "5"}']
        )
        agent = AgentDefinition(model_client=model, decision_parser=JsonToolCallParser(), ...)
        result = await run(agent, request)
        assert [c.call_index for c in model.calls] == [0, 1]

    **Which entry answers a call.** With ``index_by="call_index"`` (the default) the call
    with ``ModelCall.call_index == n`` gets entry ``n`` of ``replies``: a resumed run
    receives the same reply for the same call as the interrupted attempt did, and one client
    may serve several runs. With ``index_by="arrival"`` the *n*-th call received (counting
    from 0, across all runs) gets entry ``n``, whatever its ``call_index``. The position is
    fixed when the call arrives, before any wait.

    **What an entry does.** A ``str`` becomes ``ModelReply(call_id=..., content=entry,
    thinking=thinking)``, whose ``call_id`` is ``call_id_prefix`` followed by the position
    (``"call-0"``, ``"call-1"``, ...; ``None`` when ``call_id_prefix`` is ``None``). A
    ``ModelReply`` is returned as it is: script native tool calls, usage, a finish reason or
    your own ``call_id`` that way. An exception instance is raised, the same instance each
    time its entry answers: an ``Exception`` is a failed model call (the session records it
    and stops with ``LLM_ERROR``, or ``CONTEXT_LENGTH_EXCEEDED`` for a
    ``ContextLengthExceededError``); a ``BaseException`` that is not an ``Exception`` passes
    through the session as a crash of the process would.

    **When the script runs out** (a position past the last entry), ``when_exhausted``
    decides: ``"raise"`` (the default) raises ``PolyloopValueError`` naming the position and
    the script's length, so a run that makes more calls than the test planned fails loudly
    instead of looping; ``"repeat_last"`` answers with the last entry; ``"cycle"`` starts
    again from the first. The last two need at least one entry.

    **What it refuses.** A call whose ``messages`` is empty raises ``PolyloopValueError``
    (input validation, as a real endpoint refuses an empty prompt) without using an entry:
    that is a ready ``failing_call`` for ``ModelClientContract``, and the client keeps
    serving afterwards.

    **What it records.** Every call it receives, refused or not, is appended to ``calls``
    (a ``list`` of ``ModelCall``, oldest first) before anything else happens, so a test can
    see a call that is still in flight. ``replies`` is the script as a tuple.

    **Waiting.** ``delay`` seconds (default 0: the call never suspends, which the contract's
    cancellation test reports as a skip) are awaited by ``before_reply`` after the call is
    recorded and before the entry is used. Override ``before_reply`` in a subclass to hold a
    call in flight (await an event), and call ``super().before_reply(call)`` to keep the
    delay.

    ``parameters()`` is ``parameters`` (default ``{"kind": "scripted"}``), unchanged by
    calls: pass something else to make two clients differ in a run's parameter snapshot.
    ``native_tool_calls`` is the class attribute (``False``) unless given: ``True`` claims
    native tool calls (design 0100), which a native parser such as ``NativeToolCallParser``
    requires of its client; the session then fills ``ModelCall.tools``, and ``ModelReply``
    entries with ``tool_calls`` answer them.
    """

    native_tool_calls: bool = False
    """Whether the client claims native tool calls (design 0100); see the class docstring."""

    def __init__(
        self,
        replies: Iterable[ScriptEntry],
        *,
        index_by: Literal["call_index", "arrival"] = "call_index",
        when_exhausted: Literal["raise", "repeat_last", "cycle"] = "raise",
        thinking: str = "",
        call_id_prefix: str | None = "call-",
        delay: float = 0.0,
        parameters: Mapping[str, str] | None = None,
        native_tool_calls: bool | None = None,
    ) -> None:
        if isinstance(replies, str | bytes):
            raise PolyloopTypeError(
                "ScriptedModelClient.replies must be a sequence of replies, not one string; "
                "wrap it in a list"
            )
        script = tuple(replies)
        for position, entry in enumerate(script):
            if not isinstance(entry, str | ModelReply | BaseException):
                hint = " (pass an instance, not the class)" if isinstance(entry, type) else ""
                raise PolyloopTypeError(
                    f"ScriptedModelClient.replies[{position}] must be a str, a ModelReply or "
                    f"an exception instance, got {type(entry).__name__}{hint}"
                )
        if index_by not in _INDEX_BY:
            raise PolyloopValueError(
                f"ScriptedModelClient.index_by must be 'call_index' or 'arrival', got {index_by!r}"
            )
        if when_exhausted not in _WHEN_EXHAUSTED:
            raise PolyloopValueError(
                "ScriptedModelClient.when_exhausted must be 'raise', 'repeat_last' or 'cycle', "
                f"got {when_exhausted!r}"
            )
        if when_exhausted != "raise" and not script:
            raise PolyloopValueError(
                f"ScriptedModelClient(when_exhausted={when_exhausted!r}) needs at least one "
                "reply to repeat"
            )
        if not isinstance(thinking, str):
            raise PolyloopTypeError(
                f"ScriptedModelClient.thinking must be a str, got {type(thinking).__name__}"
            )
        if call_id_prefix is not None and not isinstance(call_id_prefix, str):
            raise PolyloopTypeError(
                "ScriptedModelClient.call_id_prefix must be a str or None, got "
                f"{type(call_id_prefix).__name__}"
            )
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise PolyloopTypeError(
                f"ScriptedModelClient.delay must be a number of seconds, got {type(delay).__name__}"
            )
        if not math.isfinite(delay) or delay < 0:
            raise PolyloopValueError(
                f"ScriptedModelClient.delay must be finite and >= 0, got {delay!r}"
            )
        if native_tool_calls is not None:
            if not isinstance(native_tool_calls, bool):
                raise PolyloopTypeError(
                    "ScriptedModelClient.native_tool_calls must be a bool or None, got "
                    f"{type(native_tool_calls).__name__}"
                )
            self.native_tool_calls = native_tool_calls
        self._replies = script
        self._index_by = index_by
        self._when_exhausted = when_exhausted
        self._thinking = thinking
        self._call_id_prefix = call_id_prefix
        self._delay = float(delay)
        self._parameters = _checked_parameters(parameters)
        self._arrivals = 0
        self.calls: list[ModelCall] = []

    @property
    def replies(self) -> tuple[ScriptEntry, ...]:
        """The script, in order."""
        return self._replies

    async def call(self, call: ModelCall) -> ModelReply:
        """Record ``call``, wait in ``before_reply``, then answer with (or raise) its entry."""
        self.calls.append(call)
        if not call.messages:
            raise PolyloopValueError(
                "ScriptedModelClient: ModelCall.messages is empty, so there is no prompt to "
                "answer; assemble at least one message"
            )
        if self._index_by == "call_index":
            position = call.call_index
        else:
            position = self._arrivals
            self._arrivals += 1
        await self.before_reply(call)
        entry = self._entry(position)
        if isinstance(entry, BaseException):
            raise entry.with_traceback(None)
        if isinstance(entry, ModelReply):
            return entry
        call_id = None if self._call_id_prefix is None else f"{self._call_id_prefix}{position}"
        return ModelReply(call_id=call_id, content=entry, thinking=self._thinking)

    async def before_reply(self, call: ModelCall) -> None:
        """Runs for every accepted call, after it is recorded and before its entry is used.

        Waits ``delay`` seconds (not at all when it is 0). Override it to hold a call in
        flight; it is where a cancellation of the call lands.
        """
        if self._delay:
            await asyncio.sleep(self._delay)

    def parameters(self) -> Mapping[str, str]:
        """The ``parameters`` given at construction (default ``{"kind": "scripted"}``)."""
        return self._parameters

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self._replies)} replies, index_by="
            f"{self._index_by!r}, when_exhausted={self._when_exhausted!r})"
        )

    def _entry(self, position: int) -> ScriptEntry:
        length = len(self._replies)
        if position < length:
            return self._replies[position]
        if self._when_exhausted == "repeat_last":
            return self._replies[-1]
        if self._when_exhausted == "cycle":
            return self._replies[position % length]
        counted = "call_index" if self._index_by == "call_index" else "call number (arrival)"
        raise PolyloopValueError(
            f"ScriptedModelClient: no reply is scripted for {counted} {position}: the script "
            f"has {length} {'reply' if length == 1 else 'replies'}; add replies, or pass "
            "when_exhausted='repeat_last' or 'cycle'"
        )


def _checked_parameters(parameters: Mapping[str, str] | None) -> Mapping[str, str]:
    if parameters is None:
        return _DEFAULT_PARAMETERS
    if not isinstance(parameters, Mapping):
        raise PolyloopTypeError(
            "ScriptedModelClient.parameters must be a mapping of str to str, got "
            f"{type(parameters).__name__}"
        )
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PolyloopTypeError(
                f"ScriptedModelClient.parameters must map str to str; {key!r}: {value!r} does not"
            )
    return MappingProxyType(dict(parameters))
