"""``html``: one self-contained static page that lists runs and shows each as a step timeline.

The page needs nothing but itself: styles and the one small script are inline, there is no
network reference of any kind (no ``src``/``href`` to another document, no font, no image),
and it works as a ``file://`` page. Every text from a log is HTML-escaped, after
``polyloop.inspect._safe.visible`` has written its control, bidi and other invisible format
characters as escapes (its newlines and tabs are kept: inside the page's ``<pre>`` they can
only lay the text out), so a log can neither inject markup nor reorder or hide what the page
says, and the file holds no raw ESC for a terminal that shows it. Collapsible parts are
``<details>`` elements, so the page is fully usable with scripting off; the script only adds
"expand all / collapse all" buttons.

Structure (the browser test in ``tests/integration/test_inspect_browser.py`` relies on it):
``table#runs`` lists the runs (a row per run, ``data-run`` holds the run id, a link to
``#run-<file>``); each run is a ``section.run`` with ``id="run-<file>"`` (``<file>``: the log's
file name without ``.jsonl``) and ``data-run="<run id>"``, holding one
``li.step`` per step (``data-step`` is its index), a ``.badge`` with the stop reason or
``unfinished`` (the first badge of its ``h2``), and for an unfinished run a
``div.resume-plan``. A run in doubt (unfinished, its plan ``STOP_UNKNOWN``) also has a second
badge ``in doubt`` (in its ``h2`` and its ``table#runs`` row) and a ``div.in-doubt``
(``data-result-id``: the execution) with its idempotency key and, for an action, the
``python -m polyloop resolve`` commands in ``pre.resolve-command`` elements. Every settlement
is a ``div.settlement`` in its step (``data-verdict``, ``data-source``, ``data-line``); a step
whose outcome came from one has a ``.badge.settled`` in its heading. A step whose call was
rejected is ``li.step.rejected`` (its kind badge says ``rejected``) with a
``div.rejected-call`` and the rejection the model read as its observation (design 0231).

Since issue 26 (design 0215) a section reads from the top what a person looks for first:
a finished run's ``div.final-answer`` or an unfinished run's ``div.resume-plan`` (with its
in-doubt or awaiting panel) comes right under the heading; a fork's ``div.fork`` says where
it came from (its source, the step, the chain; design 0239); then ``div.context`` with the
run's question (``details.context-part[data-level="goal"]``) and instructions
(``[data-level="run"]``) as ``RunStarted`` recorded them, or a ``div.context.absent`` that says
why there is nothing (``record_context=False``, or a log older than schema 1.8); then the
``svg.run-timeline`` (``polyloop.inspect._overview``: one ``a.step-col`` per step, a
``g.resume-mark`` per resume); then the snapshot and the steps. Each ``li.step`` has
``id="<section id>-step-<n>"``; a step a resume entered at holds a ``div.resume-mark``
(``data-plan``, ``data-epoch``, ``data-line``) and has the class ``resumed``; a resume that
stopped again, open, has its mark from its ``resume_stopped`` record (``data-plan``
``stop_unknown``, ``awaiting_approval`` or, for ``retries_exhausted``, ``replay_last_action``;
schema 1.9). A run of
near-identical steps shows its first step and folds the rest into ``li.fold`` (``data-first``,
``data-last``) holding a ``<details>`` with their ``li.step`` cards. A reply that is empty
because the model only called tools gets no "reply" row. A ``#run-...`` (or step) anchor shows
that run alone at the top of the page (CSS ``:target``; ``a.all-runs`` goes back), and the
script opens the folds around a step anchor's target. A run of a tree (design 0245) has a
``div.tree`` under its heading: ``a.tree-parent`` to its parent's section and an
``a.tree-child`` to each child's (with the child's stop reason, steps and tokens).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import PurePath

from polyloop._common import money_text
from polyloop.inspect._load import Unreadable
from polyloop.inspect._overview import fold_groups, signature, timeline_svg, trouble
from polyloop.inspect._safe import visible
from polyloop.inspect._text import SNAPSHOT_HIGHLIGHTS, expiry_words, shown_tool_name
from polyloop.inspect._units import duration_words, plural
from polyloop.inspect._view import (
    ApprovalView,
    Awaiting,
    InDoubt,
    ResumeView,
    RunView,
    SettlementView,
    StepKind,
    StepView,
)
from polyloop.types import Message

__all__ = ["render_html"]

_STYLE = """
:root { --fg:#1d2330; --muted:#5d6678; --line:#d9dde5; --bg:#f6f7f9; --card:#fff; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg);
       margin: 0; padding: 1.2rem 2rem 3rem; }
h1 { font-size: 1.3rem; margin: 0 0 .8rem; }
h2 { font-size: 1.1rem; margin: 0; }
table { border-collapse: collapse; background: var(--card); width: 100%; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid var(--line); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
a { color: #1f5fbf; }
section.run { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
              padding: 1rem 1.2rem; margin-top: 1.4rem; }
.meta { color: var(--muted); font-size: .9em; }
.badge { display: inline-block; padding: .05rem .5rem; border-radius: 999px; font-size: .85em;
         font-weight: 600; border: 1px solid transparent; white-space: nowrap; }
.badge.good { background: #e3f5e7; color: #17652c; border-color: #a8dbb4; }
.badge.limit { background: #fff3d6; color: #7a5300; border-color: #f0d48a; }
.badge.bad { background: #fde4e4; color: #9b1c1c; border-color: #f2aaaa; }
.badge.open { background: #e6eefc; color: #1f4f9b; border-color: #a9c2ef; }
.badge.kind { background: #eef0f4; color: var(--muted); font-weight: 500; }
ol.timeline { list-style: none; padding: 0; margin: .8rem 0 0; }
li.step { border-left: 3px solid var(--line); padding: .3rem 0 .6rem .9rem; margin: 0; }
li.step.incomplete { border-left-color: #6f94d8; }
li.step.model_failure, li.step.parse_failure { border-left-color: #e0a0a0; }
li.step.final_answer { border-left-color: #7cc08c; }
li.step.rejected { border-left-color: #c9a0e0; }
.badge.settled { background: #f3e8fa; color: #6a3d8a; }
.stephead { font-weight: 600; }
details { margin: .25rem 0; }
summary { cursor: pointer; color: var(--muted); }
pre { white-space: pre-wrap; word-break: break-word; background: #f3f4f7; margin: .2rem 0;
      padding: .45rem .6rem; border-radius: 4px; font: 12.5px/1.4 ui-monospace, monospace; }
.resume-plan { border: 1px solid #a9c2ef; background: #eef4ff; border-radius: 6px;
               padding: .6rem .8rem; margin-top: .8rem; }
.in-doubt { border: 1px solid #f2aaaa; background: #fff4f4; border-radius: 6px;
            padding: .6rem .8rem; margin-top: .8rem; }
.settlement { border-left: 3px solid #c9a0e0; padding: .1rem 0 .1rem .6rem; margin: .3rem 0; }
code { font: 12.5px ui-monospace, monospace; }
.unreadable { border: 1px solid #f2aaaa; background: #fff4f4; padding: .6rem .8rem; }
button { font: inherit; font-size: .85em; margin-left: .4rem; }
.final-answer { border: 1px solid #a8dbb4; background: #f1faf3; border-radius: 6px;
                padding: .4rem .8rem; margin-top: .8rem; }
.context { border: 1px solid var(--line); border-radius: 6px; padding: .3rem .8rem;
           margin-top: .8rem; }
.context.absent { color: var(--muted); }
.fork { color: var(--muted); margin: .3rem 0; }
.context .role { color: var(--muted); font-size: .85em; }
svg.run-timeline { display: block; max-width: 100%; height: auto; margin-top: .8rem; }
svg.run-timeline a.step-col:hover rect[fill="transparent"] { fill: #e6eefc; }
.legend { color: var(--muted); font-size: .85em; }
.legend i { display: inline-block; width: .8em; height: .8em; margin: 0 .25em 0 .6em;
            vertical-align: -.05em; }
li.step.resumed { border-left-color: #7b3fb5; }
li.step.trouble { border-left-color: #e06060; }
.resume-mark { border: 1px dashed #7b3fb5; background: #f6f0fc; color: #4b2577;
               border-radius: 4px; padding: .2rem .5rem; margin: .2rem 0 .3rem; }
li.fold { list-style: none; margin: 0; padding: .1rem 0 .4rem .9rem;
          border-left: 3px dotted var(--line); }
li.fold > details > summary { font-weight: 600; }
a.all-runs { display: none; font-size: .9em; }
body:has(section.run:target, li.step:target) section.run:not(:target):not(:has(:target)),
body:has(section.run:target, li.step:target) #runs,
body:has(section.run:target, li.step:target) h1 { display: none; }
body:has(section.run:target, li.step:target) a.all-runs { display: inline; }
body:has(section.run:target, li.step:target) section.run { margin-top: 0; }
"""

_SCRIPT = """
document.querySelectorAll("button[data-toggle]").forEach(function (button) {
  button.addEventListener("click", function () {
    var section = document.getElementById(button.getAttribute("data-toggle"));
    var open = button.getAttribute("data-open") === "1";
    section.querySelectorAll("details").forEach(function (d) { d.open = open; });
  });
});
function revealTarget() {
  var id = location.hash.slice(1);
  try { id = decodeURIComponent(id); } catch (e) { /* a malformed escape: use it as is */ }
  var target = id && document.getElementById(id);
  if (!target) { return; }
  for (var d = target.closest("details"); d; d = d.parentElement.closest("details")) {
    d.open = true;
  }
  target.scrollIntoView();
}
window.addEventListener("hashchange", revealTarget);
revealTarget();
"""

_OPEN_BELOW = 300
"""Observations up to this many characters are shown open; longer ones start collapsed."""
_GOOD = {"task_completed", "final_answer"}
_LIMIT = {"step_budget", "action_budget", "parse_failures", "prompt_too_large", "cancelled"}


def _e(text: object) -> str:
    return html.escape(visible(str(text), newlines=True, tabs=True), quote=True)


def _badge(status: str) -> str:
    if status == "unfinished":
        tone = "open"
    elif status in _GOOD:
        tone = "good"
    elif status in _LIMIT:
        tone = "limit"
    else:
        tone = "bad"
    return f'<span class="badge {tone}">{_e(status)}</span>'


def _text_block(label: str, text: str, *, open_: bool = False, note: str = "") -> str:
    opened = " open" if open_ else ""
    extra = f" <span class='meta'>{_e(note)}</span>" if note else ""
    return (
        f"<details{opened}><summary>{_e(label)} ({len(text)} chars){extra}</summary>"
        f"<pre>{_e(text)}</pre></details>"
    )


def _observation_turn(view: RunView, step: StepView) -> str:
    template = view.snapshot.get("request.observation_template")
    observation = step.observation or ""
    if template is None:
        return observation
    try:
        return template.format(observation=observation)
    except (KeyError, IndexError, ValueError):
        return observation


def _prompt_block(view: RunView, position: int, step: StepView) -> str:
    if step.prompt_chars is None:
        return ""
    if position == 0:
        body = (
            f"The first prompt: {step.prompt_chars} characters of context (run-level, "
            "injections, goal-level). The log keeps prompt sizes, not prompt text."
        )
        if view.context is not None:
            body = (
                f"The first prompt: {step.prompt_chars} characters: the run's instructions and "
                "question, shown at the top of this run as the log recorded them, and any "
                "injections (whose text is never recorded)."
            )
        return (
            f"<details><summary>prompt ({step.prompt_chars} chars)</summary>"
            f"<pre>{_e(body)}</pre></details>"
        )
    previous = view.steps[position - 1]
    turns = [
        f"[assistant] {previous.history_text or ''}",
        f"[user] {_observation_turn(view, previous)}",
    ]
    body = f"= the prompt of step {previous.idx} followed by its two turns:\n\n" + "\n\n".join(
        turns
    )
    return (
        f"<details><summary>prompt ({step.prompt_chars} chars; the log keeps sizes, the "
        f"turns below are rebuilt from step {previous.idx})</summary><pre>{_e(body)}</pre>"
        "</details>"
    )


def _resume_mark_html(step: StepView) -> str:
    return "" if step.resumed is None else _mark_html(step.resumed)


def _mark_html(resumed: ResumeView) -> str:
    epoch = "" if resumed.epoch is None else str(resumed.epoch)
    return (
        f'<div class="resume-mark" data-plan="{_e(resumed.plan)}" data-epoch="{epoch}" '
        f'data-line="{resumed.line}"><b>Resumed here</b> {_e(resumed.words)} '
        f"<span class='meta'>(the mark is on the {_e(resumed.carrier)}, line "
        f"{resumed.line}; the process before it stopped without finishing)</span></div>"
    )


def _step_head(step: StepView, anchor: str) -> str:
    """A step card's opening tag (classes, index, id), resume mark and heading line."""
    facts = []
    if step.wall_ms is not None:
        facts.append(duration_words(step.wall_ms))
    if step.model_ms is not None:
        facts.append(f"model {duration_words(step.model_ms)}")
    if step.action_ms is not None:
        facts.append(f"action {duration_words(step.action_ms)}")
    if step.usage is not None:
        facts.append(step.usage)
    if step.cost is not None:
        facts.append(f"cost {money_text(step.cost)}")
    if step.finish_reason:
        facts.append(f"finish {step.finish_reason}")
    if step.call_id is not None:
        facts.append(f"call {step.call_id}")
    facts.append("lines " + ", ".join(str(n) for n in step.lines))
    problem = trouble(step)
    settled = (
        f'<span class="badge settled">settled by {_e(step.settled_by)}</span> '
        if step.settled_by
        else ""
    )
    classes = " ".join(
        c
        for c in (
            step.kind.value,
            "resumed" if step.resumed is not None else "",
            "trouble" if problem is not None else "",
        )
        if c
    )
    return (
        f'<li class="step {classes}" data-step="{step.idx}" id="{_e(anchor)}-step-{step.idx}">'
        f"{_resume_mark_html(step)}"
        f'<div class="stephead">step {step.idx} <span class="badge kind">'
        f"{_e(step.kind.value.replace('_', ' '))}</span> {settled}"
        f'<span class="meta">{_e(" · ".join(facts))}</span></div>'
    )


def _step_html(view: RunView, position: int, step: StepView, anchor: str) -> str:
    parts = [_step_head(step, anchor), _prompt_block(view, position, step)]
    if step.thinking:
        parts.append(_text_block("thinking", step.thinking))
    # A reply that is empty because the model only called tools has nothing to show.
    if step.reply is not None and (step.reply or not step.tool_calls):
        parts.append(_text_block("reply", step.reply, open_=step.kind is StepKind.INCOMPLETE))
        if step.history_text is not None and step.history_text != step.reply:
            parts.append(_text_block("history text (what the parser kept)", step.history_text))
    for call_id, name, arguments in step.tool_calls:
        parts.append(_text_block(f"native tool call {name}", arguments, note=f"id {call_id}"))
    if step.failure is not None:
        parts.append(_text_block("model call failed", step.failure, open_=True))
    if step.kind is StepKind.PARSE_FAILURE and step.parse_error is not None:
        parts.append(_text_block("parse failure", step.parse_error, open_=True))
    facts = [f"replay policy {step.action_policy}"] if step.action_policy else []
    if step.idempotency_key is not None:
        facts.append(f"idempotency key {step.idempotency_key}")
    if step.action is not None:
        parts.append(
            _text_block("tool call / action", step.action, open_=True, note=" · ".join(facts))
        )
    elif step.action_policy is not None:
        parts.append(
            f"<div>action announced <span class='meta'>({_e(', '.join(facts))})</span></div>"
        )
    if step.approval is not None:
        parts.append(_approval_html(step.approval))
    parts += [_settlement_html(settlement) for settlement in step.settlements]
    if step.kind is StepKind.REJECTED:
        parts.append(
            "<div class='rejected-call'>decision: <b>rejected</b>: the call never executed; "
            "the model read why (the observation)</div>"
        )
    if step.action_status is not None:
        done = " · environment reported completion" if step.env_reported_completion else ""
        if step.settled_by:
            done += f" · settled by {step.settled_by}"
        parts.append(f"<div>status: <b>{_e(step.action_status)}</b>{_e(done)}</div>")
    if step.observation is not None and step.kind is not StepKind.FINAL_ANSWER:
        flags = []
        if step.observation_is_synthetic:
            flags.append("synthetic")
        if step.observation_truncated_chars:
            flags.append(f"{step.observation_truncated_chars} chars cut by the executor")
        parts.append(
            _text_block(
                "observation",
                step.observation,
                open_=len(step.observation) <= _OPEN_BELOW,
                note=", ".join(flags),
            )
        )
    if step.kind is StepKind.FINAL_ANSWER:
        parts.append("<div>decision: <b>final answer</b></div>")
    if step.pending:
        parts.append(f"<div class='meta'>incomplete: {_e(step.pending)}</div>")
    parts.append("</li>")
    return "".join(parts)


def _settlement_html(settlement: SettlementView) -> str:
    """One settlement: verdict, who, when, its line; the note (or reason) and observation."""
    label = "reason" if settlement.verdict in ("unknown", "rejected") else "note"
    note = f"<div>{label}: {_e(settlement.note)}</div>" if settlement.note else ""
    what = "settlement of"
    if settlement.digest is not None:
        what = "decision on"
        note = f"<div>digest <code>{_e(settlement.digest)}</code></div>{note}"
    observation = (
        _text_block("observation from the settlement", settlement.observation, open_=True)
        if settlement.observation is not None
        else ""
    )
    return (
        f'<div class="settlement" data-verdict="{_e(settlement.verdict)}" '
        f'data-source="{_e(settlement.source)}" data-line="{settlement.line}">'
        f"{what} {_e(settlement.result_id)}: "
        f"<b>{_e(settlement.verdict.replace('_', ' '))}</b>, by {_e(settlement.who)} at "
        f"{_e(settlement.at)} <span class='meta'>(line {settlement.line})</span>"
        f"{note}{observation}</div>"
    )


def _approval_html(request: ApprovalView) -> str:
    """A request for approval: tool, the canonical arguments as digested, digest, asked and
    expires at, its line."""
    call = f", call id {request.tool_call_id}" if request.tool_call_id is not None else ""
    return (
        f'<div class="approval-request" data-digest="{_e(request.digest)}" '
        f'data-line="{request.line}">approval requested for {_e(request.result_id)}: tool '
        f"<b>{_e(shown_tool_name(request.tool))}</b>{_e(call)} "
        f"<span class='meta'>(line {request.line})</span>"
        f"{_text_block('arguments', request.arguments, open_=True)}"
        f"<div>digest <code>{_e(request.digest)}</code></div>"
        f"<div>asked at {_e(request.requested_at)} · "
        f"{_e(expiry_words(request.expires_at))}</div></div>"
    )


def _awaiting_html(awaiting: Awaiting) -> str:
    """What an unfinished run waits for, and the commands that decide it."""
    request = awaiting.request
    parts = [
        f'<div class="awaiting-approval" data-digest="{_e(request.digest)}"><b>Awaiting '
        f"approval</b> <span class='meta'>step {request.step_idx}'s call of tool "
        f"{_e(request.tool)} ({_e(request.result_id)})</span><br>Nothing of it has executed."
    ]
    if awaiting.note:
        parts.append(f"<div class='meta'>{_e(awaiting.note)}</div>")
    parts.append("<div>Decide with one of (NAME: who decides; TEXT: why):</div>")
    parts += [f'<pre class="approval-command">{_e(c)}</pre>' for c in awaiting.commands]
    parts.append(f"<div>then resume the run with its agent ({_RESUME_CALLS}).</div></div>")
    return "".join(parts)


_RESUME_CALLS = (
    "<code>agent.run</code> with the same run id for a <code>polyloop.Agent</code>; "
    "<code>polyloop.session.run_or_resume</code> or <code>resume</code> otherwise"
)
"""How a person resumes a run (the log does not say whether a ``polyloop.Agent`` made it)."""


def _in_doubt_html(doubt: InDoubt) -> str:
    """What an unfinished run is in doubt about, and the commands that settle it."""
    what = "action" if doubt.settleable else "model call"
    key = (
        f"idempotency key <code>{_e(doubt.idempotency_key)}</code> (look it up in the tool's "
        "own system)"
        if doubt.idempotency_key is not None
        else "no idempotency key recorded (an intent written before schema 1.7)"
    )
    parts = [
        f'<div class="in-doubt" data-result-id="{_e(doubt.result_id)}"><b>In doubt</b> '
        f"<span class='meta'>step {doubt.step_idx}'s {what} {_e(doubt.result_id)}, replay "
        f"policy {_e(doubt.replay_policy)}</span><br>It has an intent and no result: it may or "
        f"may not have happened. {key}."
    ]
    for call_id, name, arguments in doubt.tool_calls:
        parts.append(_text_block(f"asked for: tool {name}", arguments, open_=True, note=call_id))
    if not doubt.tool_calls and doubt.reply is not None:
        parts.append(_text_block("the reply that asked for it", doubt.reply, open_=True))
    if doubt.last_answer is not None:
        parts.append(f"<div>last answer: {_settlement_html(doubt.last_answer)}</div>")
    if doubt.note:
        parts.append(f"<div class='meta'>{_e(doubt.note)}</div>")
    if doubt.commands:
        parts.append(
            "<div>Settle it with one of (TEXT: what the tool's system says happened):</div>"
        )
        parts += [f'<pre class="resolve-command">{_e(c)}</pre>' for c in doubt.commands]
        parts.append(f"<div>then resume the run with its agent ({_RESUME_CALLS}).</div>")
    parts.append("</div>")
    return "".join(parts)


def _doubt_badge(view: RunView) -> str:
    if view.awaiting is not None:
        return ' <span class="badge open">awaiting approval</span>'
    return "" if view.in_doubt is None else ' <span class="badge bad">in doubt</span>'


def _snapshot_html(view: RunView) -> str:
    rows = "".join(
        f"<tr><td>{_e(key)}</td><td><pre>{_e(view.snapshot[key])}</pre></td></tr>"
        for key in sorted(view.snapshot)
    )
    highlights = [
        f"{key} = {view.snapshot[key]}"
        for key in (
            *sorted(k for k in view.snapshot if k.startswith("model_client.")),
            *SNAPSHOT_HIGHLIGHTS,
        )
        if key in view.snapshot
    ]
    summary = "; ".join(highlights)
    return (
        f"<details><summary>parameter snapshot ({len(view.snapshot)} keys) "
        f"<span class='meta'>{_e(summary)}</span></summary>"
        f"<table>{rows}</table></details>"
    )


def _anchor(view: RunView) -> str:
    """The section id: ``run-`` and the log's file name without ``.jsonl`` (unique in a
    directory even when two files hold the same run id)."""
    name = PurePath(view.source).name
    return "run-" + (name[: -len(".jsonl")] if name.endswith(".jsonl") else name)


def _message_text(message: Message) -> str:
    text = "\n".join(block.text for block in message.content)
    calls = "".join(f"\n[tool call {c.name} {c.id}] {c.arguments}" for c in message.tool_calls)
    answers = f" (answers {message.tool_call_id})" if message.tool_call_id else ""
    return f"[{message.role.value}{answers}] {text}{calls}"


def _context_part(level: str, label: str, messages: Sequence[Message]) -> str:
    body = "\n\n".join(_message_text(m) for m in messages)
    preview = " ".join(body.split())
    preview = preview if len(preview) <= 90 else preview[:90] + "..."
    count = f"{len(messages)} message{'s' if len(messages) != 1 else ''}, {len(body)} chars"
    opened = " open" if level == "goal" or len(body) <= _OPEN_BELOW * 2 else ""
    return (
        f'<details class="context-part" data-level="{level}"{opened}><summary><b>{label}</b> '
        f"<span class='role'>({count})</span> <span class='meta'>{_e(preview)}</span></summary>"
        f"<pre>{_e(body)}</pre></details>"
    )


def _fork_html(view: RunView) -> str:
    """Where a fork came from (design 0239): its source, the step, the chain."""
    if view.fork is None or view.forked_from is None:
        return ""
    return (
        f'<div class="fork">Forked from {_e(view.forked_from)}: its steps before '
        f"{view.fork.step_idx} are the source's, copied ({view.fork.records} records, "
        f"prefix <code>{_e(view.fork.digest)}</code>); nothing was called or executed for "
        "them.</div>"
    )


def _context_html(view: RunView) -> str:
    """The run's question and instructions, as ``RunStarted`` recorded them (design 0215)."""
    context = view.context
    if context is None:
        return (
            '<div class="context absent">The question and the instructions are not on record: '
            "the run was started with <code>record_context=False</code>, or by a polyloop "
            "older than schema 1.8 (the log then keeps prompt sizes, not prompt text).</div>"
        )
    parts = ['<div class="context">']
    if context.goal_level:
        parts.append(_context_part("goal", "question (goal level)", context.goal_level))
    if context.run_level:
        parts.append(_context_part("run", "instructions (run level)", context.run_level))
    if not context.goal_level and not context.run_level:
        parts.append("<span class='meta'>the run's context was empty</span>")
    parts.append("</div>")
    return "".join(parts)


def _legend(view: RunView) -> str:
    failures = sum(1 for step in view.steps if trouble(step) is not None)
    model = sum(step.model_ms or 0 for step in view.steps)
    action = sum(step.action_ms or 0 for step in view.steps)
    tokens = [step.tokens for step in view.steps if step.tokens is not None]
    used = (
        f" · {sum(t[0] for t in tokens)} prompt + {sum(t[1] for t in tokens)} completion tokens"
        if tokens
        else ""
    )
    cost = view.cost_text
    if cost is not None:
        used += f" · cost {'at least ' + cost[2:] if cost.startswith('>=') else cost}"
    return (
        "<div class='legend'><i style='background:#4a7bd0'></i>model "
        f"{duration_words(model)}<i style='background:#e58a2b'></i>action "
        f"{duration_words(action)}"
        f"<i style='background:#b7bdc9'></i>rest of the step{_e(used)} · "
        f"<b style='color:#7b3fb5'>R</b> {len(view.resumes)} resume"
        f"{'s' if len(view.resumes) != 1 else ''} · <b style='color:#c62828'>!</b> "
        f"{failures} step{'s' if failures != 1 else ''} with trouble</div>"
    )


def _steps_html(view: RunView, anchor: str) -> str:
    """Every step's card; a group of near-identical steps shows its first and folds the rest."""
    position = {step.idx: i for i, step in enumerate(view.steps)}
    parts = []
    for group in fold_groups(view.steps):
        first, rest = group[0], group[1:]
        parts.append(_step_html(view, position[first.idx], first, anchor))
        if rest:
            cards = "".join(_step_html(view, position[s.idx], s, anchor) for s in rest)
            what = " ".join(w.replace("_", " ") for w in signature(first) if w)
            parts.append(
                f'<li class="fold" data-first="{rest[0].idx}" data-last="{rest[-1].idx}">'
                f"<details><summary>{len(rest)} more steps like step {first.idx} "
                f"<span class='meta'>(steps {rest[0].idx}-{rest[-1].idx}: {_e(what)})</span>"
                f'</summary><ol class="timeline">{cards}</ol></details></li>'
            )
    return "".join(parts)


def _top_html(view: RunView) -> str:
    """What a person looks for first: the final answer, or what resume would do."""
    if view.finished:
        if view.final_answer is None:
            return ""
        return (
            f'<div class="final-answer">'
            f"{_text_block('final answer', view.final_answer, open_=True)}</div>"
        )
    plan = (
        f'<div class="resume-plan"><b>Resume plan</b> '
        f'<span class="meta">({_e(view.plan.action.value)})</span><br>{_e(view.resume)}'
        "</div>"
    )
    if view.in_doubt is not None:
        plan += _in_doubt_html(view.in_doubt)
    if view.awaiting is not None:
        plan += _awaiting_html(view.awaiting)
    return plan


def _tree_html(view: RunView) -> str:
    """Links to the run's parent and to each child its steps ran (design 0245): in-page
    anchors, ``#run-<run id>`` (a JSONL log's file name is its run id)."""
    started = view.log.started
    link = None if started is None else started.parent
    parts = []
    if link is not None:
        parts.append(
            f'parent <a class="tree-parent" href="#run-{_e(link.run_id)}">{_e(link.run_id)}</a>'
            f" (step {link.step_idx}, depth {link.depth})"
        )
    for completed in view.log.steps:
        child = completed.step.child
        if child is not None:
            parts.append(
                f'child <a class="tree-child" href="#run-{_e(child.run_id)}">'
                f"{_e(child.run_id)}</a> (step {completed.step.step_idx}: "
                f"{_e(child.stop_reason.value)}, {child.steps} steps, {child.tokens} tokens)"
            )
    return f"<div class='meta tree'>{' · '.join(parts)}</div>" if parts else ""


def _run_html(view: RunView) -> str:
    anchor = _anchor(view)
    shown = {step.idx for step in view.steps}
    loose = "".join(_settlement_html(s) for s in view.settlements if s.step_idx not in shown)
    if loose:
        loose = (
            "<div class='unreadable'><b>Settlements that name no step of this log</b> "
            f"<span class='meta'>(python -m polyloop verify names the breach)</span>{loose}</div>"
        )
    # A resume that entered after the last step (it only wrote the finish) has no card.
    loose += "".join(_mark_html(r) for r in view.resumes if r.step_idx not in shown)
    torn = (
        f"<div class='meta'>an unterminated last line of {view.torn_bytes} bytes is ignored "
        "(a write that never completed)</div>"
        if view.torn_bytes
        else ""
    )
    resumes = f" · {len(view.resumes)} resumed" if view.resumes else ""
    timeline = timeline_svg(view, anchor)
    if timeline:
        timeline += _legend(view)
    return (
        f'<section class="run" id="{_e(anchor)}" data-run="{_e(view.run_id)}">'
        f'<a class="all-runs" href="#">&larr; all runs</a>'
        f"<h2>{_e(view.run_id)} {_badge(view.status)}{_doubt_badge(view)}"
        f'<button type="button" data-toggle="{_e(anchor)}" data-open="1">expand all</button>'
        f'<button type="button" data-toggle="{_e(anchor)}" data-open="0">collapse all</button>'
        f"</h2>"
        f"<div class='meta'>{_e(view.source)} · {plural(view.completed_steps, 'step')} · "
        f"{plural(view.actions, 'action')} · {plural(view.model_calls, 'model call')} · "
        f"{duration_words(view.duration_ms)} of step wall time"
        f"{resumes}</div>{_tree_html(view)}{torn}{_top_html(view)}{_fork_html(view)}"
        f"{_context_html(view)}"
        f"{timeline}"
        f'{_snapshot_html(view)}<ol class="timeline">{_steps_html(view, anchor)}</ol>{loose}'
        "</section>"
    )


def render_html(runs: Sequence[RunView], *, unreadable: Sequence[Unreadable] = ()) -> str:
    """The whole page for ``runs`` (and a list of the logs that could not be read)."""
    rows = "".join(
        f'<tr data-run="{_e(v.run_id)}"><td><a href="#{_e(_anchor(v))}">{_e(v.run_id)}</a>'
        f"<div class='meta'>{_e(PurePath(v.source).name)}</div></td>"
        f"<td>{_badge(v.status)}{_doubt_badge(v)}</td><td class='num'>{v.completed_steps}</td>"
        f"<td class='num'>{v.actions}</td><td class='num'>{duration_words(v.duration_ms)}</td>"
        f"<td class='num'>{v.model_calls}</td></tr>"
        for v in runs
    )
    problems = ""
    if unreadable:
        items = "".join(f"<li>{_e(u.message)}</li>" for u in unreadable)
        problems = f'<div class="unreadable"><b>Unreadable logs</b><ul>{items}</ul></div>'
    sections = "".join(_run_html(view) for view in runs)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>polyloop runs ({len(runs)})</title><style>{_STYLE}</style></head><body>"
        f"<h1>polyloop runs <span class='meta'>({len(runs)})</span></h1>{problems}"
        '<table id="runs"><thead><tr><th>run</th><th>stop reason</th><th class="num">steps</th>'
        '<th class="num">actions</th><th class="num">duration</th>'
        '<th class="num">model calls</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>{sections}"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
