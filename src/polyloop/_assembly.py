"""Prompt assembly: turn a context, injections and the steps so far into the messages to send.

The prompt is built from four segments, always in this order:

1. ``context.run_level`` - the same across a batch of runs (role text, demonstrations);
2. the injection slot - one ``USER`` message per ``Injection``, channels sorted by name,
   entries in caller order, content verbatim;
3. ``context.goal_level`` - the per-task text;
4. the history - per step, an ``ASSISTANT`` message with ``step.raw_output`` and then a
   ``USER`` message with the observation rendered through the observation template. A step
   whose assistant turn carried native tool calls (``step.tool_calls``) puts them on the
   assistant message and answers each call with a ``TOOL`` message holding the rendered
   observation and the call's id, in call order, instead of the ``USER`` message
   (design 0100).

The order runs from what changes least to what changes most, so a provider's prefix cache
keeps hitting, and because history is only ever appended to, the prompt of step n+1 begins
with exactly the prompt of step n. Nothing else is added: no system message, no headings,
no separators; an empty injection slot (no channels, or only empty ones) leaves no trace.

Pure functions over immutable values; no I/O.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from polyloop._common import trusted_builder
from polyloop.errors import AssemblyError, PolyloopTypeError, PolyloopValueError
from polyloop.types import Context, Injection, Message, Role, StepRecord, TextBlock

__all__ = [
    "AssemblyError",
    "assemble",
    "check_observation_template",
    "checked_injections",
    "history_message_pair",
    "history_messages",
    "injected_entry_ids",
    "injection_messages",
    "own_history_pair",
    "prompt_chars",
]

# Built without ``__post_init__`` (``polyloop._common.trusted``; design 0214).
_new_message = trusted_builder(Message)
_new_text_block = trusted_builder(TextBlock)


_PLACEHOLDER = "observation"


# --------------------------------------------------------------------------- template


@lru_cache(maxsize=128)
def _template_problem(template: str) -> str | None:
    """Why ``template`` is unusable, or ``None``. Cached: the session renders every step."""
    try:
        fields = [
            (name, spec, conversion)
            for _literal, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        return (
            f"the observation template {template!r} cannot be rendered ({exc}); write every "
            "literal brace twice ('{{' and '}}') so that only {observation} is a field"
        )
    for name, spec, conversion in fields:
        if name != _PLACEHOLDER or spec or conversion is not None:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            return (
                f"the observation template {template!r} cannot be rendered: it has the field "
                f"{shown}, and the only field allowed is a bare {{observation}}; write other "
                "literal braces twice ('{{' and '}}')"
            )
    if not fields:
        return (
            f"the observation template {template!r} has no {{observation}} placeholder; "
            "without it every step's observation would vanish from the prompt. Put "
            "{observation} where the observation text belongs"
        )
    return None


def check_observation_template(template: str) -> None:
    """Raise ``AssemblyError`` unless ``template`` is a usable observation template.

    Usable means: it contains the placeholder ``{observation}`` at least once, that is the
    only replacement field (no format spec, no conversion, no other names, no ``{}``), and
    every other brace is doubled (``{{`` renders as ``{``). A template without the
    placeholder would silently replace every observation with the same fixed text.
    ``TypeError`` if ``template`` is not a ``str``.
    """
    if not isinstance(template, str):
        raise PolyloopTypeError(
            f"the observation template must be a str, got {type(template).__name__}"
        )
    problem = _template_problem(template)
    if problem is not None:
        raise AssemblyError(problem)


# --------------------------------------------------------------------------- injections


def checked_injections(
    injections: object, where: str = "injections"
) -> dict[str, tuple[Injection, ...]]:
    """The injections as ``{channel: (entry, ...)}``, refusing what is not one.

    The one check of an injection mapping (``RunRequest`` calls it with ``where`` set to its
    field's name): a ``Mapping`` from non-empty ``str`` channel names to sequences (not
    ``str``/``bytes``) of ``Injection``. Raises ``PolyloopTypeError`` for a wrong type and
    ``PolyloopValueError`` for an empty channel name, naming ``where`` and the offending key.
    Entries keep the caller's order; a declared empty channel maps to ``()``.
    """
    if not isinstance(injections, Mapping):
        raise PolyloopTypeError(
            f"{where} must be a mapping of channel names to sequences of Injection, got "
            f"{type(injections).__name__}"
        )
    checked: dict[str, tuple[Injection, ...]] = {}
    for channel, entries in injections.items():
        if not isinstance(channel, str):
            raise PolyloopTypeError(
                f"{where}: channel names must be str, got {channel!r} ({type(channel).__name__})"
            )
        if not channel:
            raise PolyloopValueError(f"{where}: a channel name must not be empty")
        if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
            raise PolyloopTypeError(
                f"{where}[{channel!r}] must be a sequence of Injection (use () for a declared "
                f"empty channel), got {type(entries).__name__}"
            )
        for index, entry in enumerate(entries):
            if not isinstance(entry, Injection):
                raise PolyloopTypeError(
                    f"{where}[{channel!r}][{index}] must be an Injection, got "
                    f"{type(entry).__name__}"
                )
        checked[channel] = tuple(entries)
    return checked


def _channels(
    injections: Mapping[str, Sequence[Injection]],
) -> list[tuple[str, tuple[Injection, ...]]]:
    """Channels sorted by name, each with its entries checked and in caller order."""
    return sorted(checked_injections(injections).items(), key=lambda pair: pair[0])


def injection_messages(injections: Mapping[str, Sequence[Injection]]) -> tuple[Message, ...]:
    """One ``USER`` message per entry, content verbatim, channels in name order.

    Channel order is the sorted order of names, never the mapping's iteration order (which
    depends on how the caller built it). Empty channels and an empty mapping yield nothing.
    """
    return tuple(
        Message(role=Role.USER, content=(TextBlock(text=entry.content),))
        for _channel, entries in _channels(injections)
        for entry in entries
    )


def injected_entry_ids(
    injections: Mapping[str, Sequence[Injection]],
) -> Mapping[str, tuple[str, ...]]:
    """``{channel: (entry_id, ...)}`` in exactly the order ``injection_messages`` uses.

    A declared channel with no entries maps to ``()``; an absent channel has no key. The two
    are different configurations and the parameter snapshot must tell them apart. Returns a
    fresh dict whose keys are in sorted order.
    """
    return {
        channel: tuple(entry.entry_id for entry in entries)
        for channel, entries in _channels(injections)
    }


# --------------------------------------------------------------------------- history


def history_message_pair(step: StepRecord, observation_template: str) -> tuple[Message, ...]:
    """The messages one step contributes to history: the assistant turn, then the observation.

    The assistant turn is ``step.raw_output`` verbatim (the parser's ``history_text``, which
    may already be shortened; the library never cuts it), carrying ``step.tool_calls``. The
    observation is ``observation_template.format(observation=step.observation)``: one ``USER``
    message for a step without native tool calls (a pair, as the name says), otherwise one
    ``TOOL`` message per call, each with that text and the call's id, in call order (so a turn
    with n calls contributes 1 + n messages). The session can append these to a cached prompt
    instead of rebuilding the whole history every step.
    """
    check_observation_template(observation_template)
    if not isinstance(step, StepRecord):
        raise PolyloopTypeError(f"history steps must be StepRecord, got {type(step).__name__}")
    observation = (TextBlock(text=observation_template.format(observation=step.observation)),)
    assistant = Message(
        role=Role.ASSISTANT,
        content=(TextBlock(text=step.raw_output),),
        tool_calls=step.tool_calls,
    )
    if not step.tool_calls:
        return (assistant, Message(role=Role.USER, content=observation))
    return (
        assistant,
        *(
            Message(role=Role.TOOL, content=observation, tool_call_id=call.id)
            for call in step.tool_calls
        ),
    )


def own_history_pair(
    step: StepRecord, observation_template: str
) -> tuple[tuple[Message, ...], int]:
    """``history_message_pair(step, observation_template)`` and its ``prompt_chars``, for the
    session's own steps (design 0214).

    Only for a ``StepRecord`` the session holds (built by it or decoded from its log, so
    validated) and the run's ``RunRequest.observation_template`` (checked when the request
    was made): the template and the step are not checked again. A step without native tool
    calls, the common case, gets its two messages built without their ``__post_init__``
    (every value is a validated ``str``); a step with tool calls goes through
    ``history_message_pair`` unchanged, which also refuses duplicate call ids.
    """
    if step.tool_calls:
        pair = history_message_pair(step, observation_template)
        return pair, prompt_chars(pair)
    observation = observation_template.format(observation=step.observation)
    raw_output = step.raw_output
    pair = (
        _new_message(
            role=Role.ASSISTANT,
            content=(_new_text_block(text=raw_output),),
            tool_calls=(),
            tool_call_id=None,
        ),
        _new_message(
            role=Role.USER,
            content=(_new_text_block(text=observation),),
            tool_calls=(),
            tool_call_id=None,
        ),
    )
    return pair, len(raw_output) + len(observation)


def history_messages(steps: Sequence[StepRecord], observation_template: str) -> tuple[Message, ...]:
    """The history segment: ``history_message_pair`` of every step, in step order."""
    check_observation_template(observation_template)
    return tuple(
        message for step in steps for message in history_message_pair(step, observation_template)
    )


# --------------------------------------------------------------------------- whole prompt


def assemble(
    *,
    context: Context,
    injections: Mapping[str, Sequence[Injection]],
    steps: Sequence[StepRecord],
    observation_template: str,
) -> tuple[Message, ...]:
    """The full prompt: run-level, injections, goal-level, history (see the module docstring).

    The template is checked first, so a bad template fails before any message is built.
    Messages from ``context`` are passed through unchanged, including any system message the
    caller put there; the library adds none of its own.
    """
    check_observation_template(observation_template)
    if not isinstance(context, Context):
        raise PolyloopTypeError(
            f"context must be a polyloop.types.Context, got {type(context).__name__}"
        )
    return (
        *context.run_level,
        *injection_messages(injections),
        *context.goal_level,
        *history_messages(steps, observation_template),
    )


def prompt_chars(messages: Iterable[Message]) -> int:
    """Total characters of every block of every message: the size ``max_prompt_chars`` limits.

    A native tool call on an assistant turn counts the characters of its ``name`` and its
    ``arguments`` (what the model wrote); ids, roles and the run's tool schemas are protocol
    framing and are not counted (design 0100). A block type without a known size raises
    ``AssemblyError`` rather than counting as zero, which would let an over-limit prompt
    through to the provider.
    """
    total = 0
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            total += len(call.name) + len(call.arguments)
        for block in message.content:
            if not isinstance(block, TextBlock):
                raise AssemblyError(
                    f"message {index} has a content block of type {type(block).__name__}, "
                    "which has no size metric; prompt_chars cannot measure it and refuses to "
                    "count it as zero"
                )
            total += len(block.text)
    return total
