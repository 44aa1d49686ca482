"""Behaviour of prompt assembly.

Two properties carry the most weight: with no injections the prompt is byte-identical to a
prompt assembled without an injection slot, and the prompt of step n+1 begins with exactly
the prompt of step n (the history is only ever appended to, so provider prefix caches hit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop._assembly import (
    AssemblyError,
    assemble,
    check_observation_template,
    history_message_pair,
    history_messages,
    injected_entry_ids,
    injection_messages,
    prompt_chars,
)
from polyloop.types import (
    ActionStatus,
    Context,
    Injection,
    Message,
    Role,
    StepRecord,
    TextBlock,
)

pytestmark = pytest.mark.unit

TEMPLATE = "Result:\n<<<\n{observation}\n>>>\n"


def msg(role: Role, text: str) -> Message:
    return Message(role=role, content=(TextBlock(text=text),))


def texts(messages: Sequence[Message]) -> list[str]:
    return [block.text for message in messages for block in message.content]


def context() -> Context:
    return Context(
        run_level=(msg(Role.USER, "You are a careful assistant."), msg(Role.ASSISTANT, "Ready.")),
        goal_level=(msg(Role.USER, "Task: count to three."),),
    )


def step(idx: int, *, raw_output: str = "1", observation: str = "ok") -> StepRecord:
    return StepRecord(
        step_idx=idx,
        raw_output=raw_output,
        content_chars=len(raw_output),
        thinking_chars=0,
        action=raw_output,
        parse_ok=True,
        parse_error=None,
        observation=observation,
        observation_is_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=0,
        call_id=None,
        step_wall_ms=0,
        action_status=ActionStatus.EXECUTED,
    )


def inj(entry_id: str, content: str) -> Injection:
    return Injection(entry_id=entry_id, content=content)


# --------------------------------------------------------------------------- segment order


def test_segments_come_in_order_run_level_injections_goal_level_history() -> None:
    messages = assemble(
        context=context(),
        injections={"skill": (inj("e1", "Look at the directory first."),)},
        steps=[step(0)],
        observation_template=TEMPLATE,
    )

    assert texts(messages) == [
        "You are a careful assistant.",
        "Ready.",
        "Look at the directory first.",
        "Task: count to three.",
        "1",
        "Result:\n<<<\nok\n>>>\n",
    ]
    assert [m.role for m in messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
    ]


def test_context_messages_are_passed_through_as_the_very_same_objects() -> None:
    ctx = context()

    messages = assemble(context=ctx, injections={}, steps=[], observation_template=TEMPLATE)

    assert messages == (*ctx.run_level, *ctx.goal_level)
    assert all(a is b for a, b in zip(messages, (*ctx.run_level, *ctx.goal_level), strict=True))


def test_the_library_never_synthesises_a_system_message() -> None:
    messages = assemble(
        context=context(),
        injections={"skill": (inj("e1", "x"),)},
        steps=[step(0), step(1)],
        observation_template=TEMPLATE,
    )

    assert all(message.role is not Role.SYSTEM for message in messages)


def test_a_system_message_the_caller_put_in_the_context_is_kept_where_it_was() -> None:
    system = msg(Role.SYSTEM, "You are terse.")
    ctx = Context(run_level=(system,), goal_level=(msg(Role.USER, "Go."),))

    messages = assemble(context=ctx, injections={}, steps=[], observation_template=TEMPLATE)

    assert messages == (system, msg(Role.USER, "Go."))


def test_assemble_refuses_a_context_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="Context"):
        assemble(
            context=(msg(Role.USER, "x"),),  # type: ignore[arg-type]
            injections={},
            steps=[],
            observation_template=TEMPLATE,
        )


# --------------------------------------------------------------------------- empty injections


@pytest.mark.parametrize("empty", [{}, {"skill": ()}, {"skill": (), "hint": []}])
def test_an_empty_injection_slot_is_byte_identical_to_no_slot(
    empty: Mapping[str, Sequence[Injection]],
) -> None:
    ctx = context()
    steps = [step(0), step(1, raw_output="2", observation="ok2")]

    with_slot = assemble(context=ctx, injections=empty, steps=steps, observation_template=TEMPLATE)
    without_slot = (*ctx.run_level, *ctx.goal_level, *history_messages(steps, TEMPLATE))

    assert with_slot == without_slot
    assert texts(with_slot) == texts(without_slot)


def test_channels_with_no_entries_produce_no_messages() -> None:
    assert injection_messages({"skill": (), "hint": ()}) == ()
    assert injection_messages({}) == ()


# --------------------------------------------------------------------------- injection slot


def test_each_injection_is_its_own_user_message_with_nothing_added() -> None:
    messages = injection_messages(
        {"skill": (inj("a", "  first\n"), inj("b", "second {observation} {{x}}"))}
    )

    assert messages == (
        msg(Role.USER, "  first\n"),
        msg(Role.USER, "second {observation} {{x}}"),
    )


def test_an_injection_with_empty_content_is_still_one_message() -> None:
    assert injection_messages({"skill": (inj("a", ""),)}) == (msg(Role.USER, ""),)


def test_channels_are_ordered_by_name_and_entries_by_caller_order() -> None:
    entries = {
        "zeta": (inj("z", "Z"),),
        "alpha": (inj("b", "B"), inj("a", "A")),
        "mid": (inj("m", "M"),),
    }

    assert texts(injection_messages(entries)) == ["B", "A", "M", "Z"]


def test_entry_ids_are_grouped_by_channel_in_sorted_channel_order() -> None:
    entries = {"zeta": (inj("z", "Z"),), "alpha": (inj("a", "A"), inj("b", "B"))}

    ids = injected_entry_ids(entries)

    assert ids == {"alpha": ("a", "b"), "zeta": ("z",)}
    assert list(ids) == ["alpha", "zeta"]


def test_a_declared_empty_channel_differs_from_a_missing_one() -> None:
    assert injected_entry_ids({"skill": ()}) == {"skill": ()}
    assert injected_entry_ids({}) == {}


def test_entry_ids_come_back_in_the_same_order_as_the_messages() -> None:
    entries = {
        "zeta": (inj("z", "Z"),),
        "alpha": (inj("a", "A"), inj("b", "B")),
        "empty": (),
    }
    id_of_content = {"A": "a", "B": "b", "Z": "z"}

    flattened = [i for ids in injected_entry_ids(entries).values() for i in ids]

    assert flattened == [id_of_content[t] for t in texts(injection_messages(entries))]


def test_injections_of_the_wrong_shape_are_refused_with_the_place_named() -> None:
    with pytest.raises(TypeError, match=r"injections\['skill'\]\[1\]"):
        injection_messages({"skill": (inj("a", "A"), "B")})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"injections\['skill'\] must be a sequence"):
        injection_messages({"skill": "AB"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="channel names must be str"):
        injected_entry_ids({1: ()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="mapping"):
        injection_messages([("skill", ())])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- history


def test_each_step_becomes_an_assistant_turn_then_an_observation_turn() -> None:
    messages = history_messages([step(0), step(1, raw_output="2", observation="ok2")], TEMPLATE)

    assert [(m.role, m.content[0].text) for m in messages] == [
        (Role.ASSISTANT, "1"),
        (Role.USER, "Result:\n<<<\nok\n>>>\n"),
        (Role.ASSISTANT, "2"),
        (Role.USER, "Result:\n<<<\nok2\n>>>\n"),
    ]
    assert all(len(m.content) == 1 for m in messages)


def test_the_assistant_turn_is_the_stored_raw_output_verbatim() -> None:
    raw = "```python\nprint(1)\n```\n  trailing  "

    assert history_messages([step(0, raw_output=raw)], TEMPLATE)[0].content[0].text == raw


def test_braces_inside_an_observation_are_pasted_verbatim() -> None:
    observation = '{"rows": [1, 2]} {observation} {0}'

    rendered = history_messages([step(0, observation=observation)], "{observation}")

    assert rendered[1].content[0].text == observation


def test_no_steps_means_no_history_messages() -> None:
    assert history_messages([], TEMPLATE) == ()


def test_history_is_the_concatenation_of_per_step_pairs() -> None:
    steps = [step(i, raw_output=f"r{i}", observation=f"o{i}") for i in range(4)]

    pairs = [message for s in steps for message in history_message_pair(s, TEMPLATE)]

    assert history_messages(steps, TEMPLATE) == tuple(pairs)


def test_history_refuses_something_that_is_not_a_step_record() -> None:
    with pytest.raises(TypeError, match="StepRecord"):
        history_messages([{"raw_output": "x"}], TEMPLATE)  # type: ignore[list-item]


# --------------------------------------------------------------------------- template


def test_a_template_without_the_placeholder_is_refused() -> None:
    with pytest.raises(AssemblyError, match="no \\{observation\\} placeholder"):
        check_observation_template("Result:\n<<<\n\n>>>")


@pytest.mark.parametrize(
    "template",
    [
        '{"result": {observation}, "extra": {oops}}',
        "{observation} and a lone }",
        "{observation} and a lone {",
        "{observation} {other}",
        "{observation} {}",
        "{observation:>20}",
        "{observation!r}",
        "{observation.upper}",
        "{observation[0]}",
    ],
)
def test_a_template_with_any_other_field_or_unescaped_brace_is_refused(template: str) -> None:
    with pytest.raises(AssemblyError, match="cannot be rendered"):
        check_observation_template(template)


@pytest.mark.parametrize(
    "template",
    [
        "{observation}",
        '{{"result": "{observation}"}}',
        "before {observation} middle {observation} after",
        "{{}} {observation} }}{{",
    ],
)
def test_templates_with_the_placeholder_and_escaped_braces_are_accepted(template: str) -> None:
    check_observation_template(template)


def test_escaped_braces_render_as_single_braces_and_every_placeholder_is_filled() -> None:
    template = '{{"result": "{observation}", "again": "{observation}"}}'

    rendered = history_messages([step(0, observation="ok")], template)[1].content[0].text

    assert rendered == '{"result": "ok", "again": "ok"}'


def test_a_template_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="observation template"):
        check_observation_template(None)  # type: ignore[arg-type]


def test_an_assembly_error_is_a_value_error() -> None:
    assert issubclass(AssemblyError, ValueError)


def test_assemble_checks_the_template_before_looking_at_anything_else() -> None:
    with pytest.raises(AssemblyError):
        assemble(
            context="not a context",  # type: ignore[arg-type]
            injections="not a mapping",  # type: ignore[arg-type]
            steps=[object()],  # type: ignore[list-item]
            observation_template="no placeholder here",
        )


def test_history_checks_the_template_even_without_steps() -> None:
    with pytest.raises(AssemblyError):
        history_messages([], "no placeholder here")
    with pytest.raises(AssemblyError):
        history_message_pair(step(0), "{bad}")


# --------------------------------------------------------------------------- size


def test_prompt_chars_counts_every_block_of_every_message() -> None:
    messages = (
        msg(Role.USER, "12345"),
        Message(role=Role.ASSISTANT, content=(TextBlock(text="ab"), TextBlock(text="cde"))),
        Message(role=Role.USER, content=()),
    )

    assert prompt_chars(messages) == 10


def test_prompt_chars_counts_characters_not_bytes() -> None:
    assert prompt_chars([msg(Role.USER, "\u00e9\u0416\U0001f600")]) == 3


def test_an_empty_prompt_measures_zero() -> None:
    assert prompt_chars(()) == 0


def test_an_unknown_block_type_fails_instead_of_counting_zero() -> None:
    class Picture:
        pass

    message = msg(Role.USER, "caption")
    # Message refuses unknown blocks at construction; a future block type would get past it.
    object.__setattr__(message, "content", (TextBlock(text="caption"), Picture()))

    with pytest.raises(AssemblyError, match="no size metric") as info:
        prompt_chars([msg(Role.USER, "x"), message])
    assert "Picture" in str(info.value)
    assert "message 1" in str(info.value)


# --------------------------------------------------------------------------- properties

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
_messages = st.lists(
    st.builds(msg, st.sampled_from([Role.USER, Role.ASSISTANT, Role.SYSTEM]), _text), max_size=3
)
_contexts = st.builds(
    lambda run, goal: Context(run_level=run, goal_level=goal), _messages, _messages
)
_injections = st.dictionaries(
    st.text(alphabet="abcxyz", min_size=1, max_size=4),
    st.lists(
        st.builds(inj, st.text(alphabet="abc123", min_size=1, max_size=4), _text), max_size=3
    ).map(tuple),
    max_size=3,
)
_steps = st.lists(st.tuples(_text, _text), max_size=6).map(
    lambda pairs: [step(i, raw_output=r, observation=o) for i, (r, o) in enumerate(pairs)]
)
_templates = st.sampled_from([TEMPLATE, "{observation}", "{{ {observation} }}", "o={observation}"])


@settings(max_examples=80, deadline=None)
@given(ctx=_contexts, injections=_injections, steps=_steps, template=_templates)
def test_each_prompt_is_an_exact_extension_of_the_previous_one(
    ctx: Context,
    injections: dict[str, tuple[Injection, ...]],
    steps: list[StepRecord],
    template: str,
) -> None:
    previous = assemble(context=ctx, injections=injections, steps=[], observation_template=template)
    for n in range(len(steps)):
        current = assemble(
            context=ctx, injections=injections, steps=steps[: n + 1], observation_template=template
        )
        assert current[: len(previous)] == previous
        assert current[len(previous) :] == history_message_pair(steps[n], template)
        assert prompt_chars(current) == prompt_chars(previous) + prompt_chars(
            history_message_pair(steps[n], template)
        )
        previous = current


@settings(max_examples=80, deadline=None)
@given(
    ctx=_contexts,
    injections=_injections,
    empty_channels=st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=4), max_size=3),
    steps=_steps,
)
def test_empty_channels_never_change_the_prompt(
    ctx: Context,
    injections: dict[str, tuple[Injection, ...]],
    empty_channels: list[str],
    steps: list[StepRecord],
) -> None:
    padded = {**{name: () for name in empty_channels}, **injections}

    plain = assemble(context=ctx, injections=injections, steps=steps, observation_template=TEMPLATE)
    with_empties = assemble(
        context=ctx, injections=padded, steps=steps, observation_template=TEMPLATE
    )
    without_slot = (*ctx.run_level, *ctx.goal_level, *history_messages(steps, TEMPLATE))
    no_entries = assemble(
        context=ctx,
        injections={name: () for name in empty_channels},
        steps=steps,
        observation_template=TEMPLATE,
    )

    assert with_empties == plain
    assert no_entries == without_slot
    assert len(plain) == len(without_slot) + sum(len(v) for v in injections.values())


@settings(max_examples=60, deadline=None)
@given(injections=_injections)
def test_entry_ids_and_messages_always_agree(injections: dict[str, tuple[Injection, ...]]) -> None:
    ids = injected_entry_ids(injections)
    order = [entry for name in sorted(injections) for entry in injections[name]]

    assert list(ids) == sorted(injections)
    assert [i for group in ids.values() for i in group] == [e.entry_id for e in order]
    assert texts(injection_messages(injections)) == [e.content for e in order]
