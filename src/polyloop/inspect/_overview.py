"""A run at a glance, for the ``html`` page: its timeline drawn as inline SVG, and which of
its steps repeat each other closely enough to fold (design 0215).

The timeline is one ``<svg class="run-timeline">`` per run, drawn from the ``RunView`` and
nothing else (no script, no external asset, no font: the page stays one self-contained file):

==================  ========================================================================
lane                what it shows, one column per step (in step order)
==================  ========================================================================
time                a bar as tall as the step's wall time (``step_wall_ms``), the model
                    call's share (``model_ms``) in blue, the action's (``action_ms``) in
                    orange, the rest in grey; heights relative to the run's slowest step
tokens              prompt + completion tokens when the endpoint reported usage, otherwise
                    the prompt size in characters (the lane's label says which)
marks               a purple line and ``R`` before a step a resume entered at
                    (``StepView.resumed``); a red ``!`` under a step that went wrong
                    (``trouble``: a failed model call, a parse failure, an action that was
                    not executed or failed, an incomplete step)
==================  ========================================================================

Each column is a link to its step's card (``#<section id>-step-<n>``) with a ``<title>``
that says the figures in words, so a reader who cannot see the colours gets the same facts.

Folding: consecutive steps with the same ``signature`` (kind, the tools called, the action's
status) and nothing of their own to show (no resume mark, settlement, approval request or
trouble) form a group; a group of at least ``FOLD_MIN`` steps shows its first step and folds
the others into one ``<details>``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from polyloop.inspect._safe import visible
from polyloop.inspect._units import duration_words, plural
from polyloop.inspect._view import RunView, StepKind, StepView

__all__ = ["FOLD_MIN", "fold_groups", "signature", "timeline_svg", "trouble"]

FOLD_MIN = 3
"""The fewest near-identical consecutive steps that are folded (the first stays visible)."""

_COLUMN_MAX = 28
_COLUMN_MIN = 6
_WIDTH_BUDGET = 1000
_LABEL = 84
_TIME_LANE = 64
_TOKEN_LANE = 30
_MARK_LANE = 16
_GAP = 8


def _e(text: object) -> str:
    return html.escape(visible(str(text), newlines=False, tabs=False), quote=True)


def trouble(step: StepView) -> str | None:
    """What went wrong in ``step``, in words, or ``None`` when nothing did."""
    if step.kind is StepKind.INCOMPLETE:
        return f"incomplete: {step.pending}" if step.pending else "incomplete"
    if step.kind is StepKind.MODEL_FAILURE:
        return "the model call failed"
    if step.kind is StepKind.PARSE_FAILURE:
        return "the reply did not parse"
    if step.action_status is not None and step.action_status != "executed":
        return f"the action's status is {step.action_status}"
    return None


def signature(step: StepView) -> tuple[str, ...]:
    """What makes two steps near-identical: their kind, the tools they called (or the first
    word of the action), and the action's status."""
    tools = tuple(name for _, name, _ in step.tool_calls)
    if not tools and step.action:
        tools = (step.action.split(maxsplit=1)[0],)
    return (step.kind.value, *tools, step.action_status or "")


def _plain(step: StepView) -> bool:
    """Whether ``step`` has nothing of its own that a fold would hide."""
    return (
        step.resumed is None
        and not step.settlements
        and step.approval is None
        and trouble(step) is None
        and step.kind is not StepKind.FINAL_ANSWER
    )


def fold_groups(steps: Sequence[StepView]) -> list[list[StepView]]:
    """``steps`` cut into consecutive groups: a group of ``FOLD_MIN`` or more steps shares one
    ``signature`` and has nothing of its own to show; every other step is a group of one."""
    groups: list[list[StepView]] = []
    for step in steps:
        last = groups[-1] if groups else None
        if (
            last is not None
            and _plain(step)
            and _plain(last[-1])
            and signature(last[-1]) == signature(step)
        ):
            last.append(step)
        else:
            groups.append([step])
    cut: list[list[StepView]] = []
    for group in groups:
        cut.extend([group] if len(group) >= FOLD_MIN else [[step] for step in group])
    return cut


def _tokens(step: StepView) -> int | None:
    return None if step.tokens is None else step.tokens[0] + step.tokens[1]


def _tooltip(step: StepView) -> str:
    parts = [f"step {step.idx} ({step.kind.value.replace('_', ' ')})"]
    if step.wall_ms is not None:
        parts.append(duration_words(step.wall_ms))
    if step.model_ms is not None:
        parts.append(f"model {duration_words(step.model_ms)}")
    if step.action_ms is not None:
        parts.append(f"action {duration_words(step.action_ms)}")
    if step.tokens is not None:
        parts.append(f"{step.tokens[0]} prompt + {step.tokens[1]} completion tokens")
    elif step.prompt_chars is not None:
        parts.append(f"prompt {step.prompt_chars} chars")
    if step.resumed is not None:
        parts.append(step.resumed.words)
    problem = trouble(step)
    if problem is not None:
        parts.append(problem)
    return " · ".join(parts)


def _bar(x: int, width: int, bottom: float, height: float, colour: str) -> str:
    if height <= 0:
        return ""
    return (
        f'<rect x="{x}" y="{bottom - height:.1f}" width="{width}" height="{height:.1f}" '
        f'fill="{colour}"/>'
    )


def _column(step: StepView, x: int, width: int, scale: tuple[float, float], anchor: str) -> str:
    """One step's column: its time bar (model, action, rest), its token bar and its marks."""
    time_scale, token_scale = scale
    bottom = _TIME_LANE
    wall = step.wall_ms or 0
    model = min(step.model_ms or 0, wall) if wall else step.model_ms or 0
    action = min(step.action_ms or 0, max(wall - model, 0)) if wall else step.action_ms or 0
    rest = max(wall - model - action, 0)
    inner = width - 2
    parts = []
    height = max(wall * time_scale, 1.0)
    model_h = height * model / wall if wall else 0.0
    action_h = height * action / wall if wall else 0.0
    rest_h = height * rest / wall if wall else height
    parts.append(_bar(x, inner, bottom, model_h, "#4a7bd0"))
    parts.append(_bar(x, inner, bottom - model_h, action_h, "#e58a2b"))
    parts.append(_bar(x, inner, bottom - model_h - action_h, rest_h, "#b7bdc9"))
    token_bottom = _TIME_LANE + _GAP + _TOKEN_LANE
    amount = _tokens(step)
    if amount is None:
        amount = step.prompt_chars or 0
    parts.append(_bar(x, inner, token_bottom, max(amount * token_scale, 1.0), "#8c95a8"))
    mark_y = token_bottom + _MARK_LANE - 3
    problem = trouble(step)
    if problem is not None:
        parts.append(
            f'<text class="fail-mark" x="{x + inner / 2:.1f}" y="{mark_y}" fill="#c62828" '
            f'text-anchor="middle" font-size="12" font-weight="700">!</text>'
        )
    link = f"#{anchor}-step-{step.idx}"
    shapes = "".join(parts)
    cls = "step-col" + (" failed" if problem is not None else "")
    return (
        f'<a href="{_e(link)}" class="{cls}" data-step="{step.idx}">'
        f"<title>{_e(_tooltip(step))}</title>"
        f'<rect x="{x}" y="0" width="{width}" height="{token_bottom}" fill="transparent"/>'
        f"{shapes}</a>"
    )


def _resume_mark(step: StepView, x: int) -> str:
    assert step.resumed is not None
    bottom = _TIME_LANE + _GAP + _TOKEN_LANE + _MARK_LANE
    return (
        f'<g class="resume-mark" data-step="{step.idx}"><title>{_e(step.resumed.words)}'
        f"</title>"
        f'<line x1="{x - 1}" y1="0" x2="{x - 1}" y2="{bottom}" stroke="#7b3fb5" '
        f'stroke-width="2" stroke-dasharray="3 2"/>'
        f'<text x="{x + 1}" y="{bottom - 3}" fill="#7b3fb5" font-size="11" '
        f'font-weight="700">R</text></g>'
    )


def timeline_svg(view: RunView, anchor: str) -> str:
    """The run's timeline (module docstring), or ``""`` for a run without steps."""
    steps = view.steps
    if not steps:
        return ""
    width = max(_COLUMN_MIN, min(_COLUMN_MAX, _WIDTH_BUDGET // len(steps)))
    slowest = max((s.wall_ms or 0) for s in steps)
    usage = any(s.tokens is not None for s in steps)
    amounts = [(_tokens(s) if usage else s.prompt_chars) or 0 for s in steps]
    scale = (
        (_TIME_LANE - 4) / slowest if slowest else 0.0,
        (_TOKEN_LANE - 2) / max(amounts) if max(amounts) else 0.0,
    )
    columns = []
    marks = []
    for position, step in enumerate(steps):
        x = _LABEL + position * width
        columns.append(_column(step, x, width, scale, anchor))
        if step.resumed is not None:
            marks.append(_resume_mark(step, x))
    total = _LABEL + len(steps) * width + 4
    height = _TIME_LANE + _GAP + _TOKEN_LANE + _MARK_LANE
    token_label = "tokens" if usage else "prompt chars"
    counted = plural(len(steps), "step")
    labels = (
        f'<text x="0" y="12" font-size="11" fill="#5d6678">time</text>'
        f'<text x="0" y="25" font-size="10" fill="#5d6678">max {duration_words(slowest)}</text>'
        f'<text x="0" y="{_TIME_LANE + _GAP + 12}" font-size="11" fill="#5d6678">'
        f"{token_label}</text>"
    )
    return (
        f'<svg class="run-timeline" role="img" width="{total}" height="{height}" '
        f'viewBox="0 0 {total} {height}" '
        f'aria-label="timeline of {counted}">'
        f"<title>{_e(f'timeline of run {view.run_id}: {counted}')}</title>"
        f"{labels}{''.join(columns)}{''.join(marks)}</svg>"
    )
