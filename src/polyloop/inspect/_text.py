"""Plain-text renderings: ``show`` (a transcript), ``ls`` (one line per run) and ``diff``.

What a person reads cannot be forged (issue 22, item 6): every text from a log goes through
``polyloop.inspect._safe.visible``. A renderer builds a list in which each element is one line
of the screen, and ``_joined`` makes each element visible with its newlines escaped, so no
text can start a line of its own. A multi-line text (a reply, an observation, an answer) is a
block (``_block``): its first line follows its label, and each further line is indented past
the label, deeper than any line of the layout (which starts in column 0, 2, 4 or 6), so a text
that spells ``step 3  [action]`` on a line of its own shows it indented inside its block. A
block whose text had characters escaped says how many in its label (``[2 control chars
escaped]``), so its reader can tell an escape from a text that spells one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from polyloop._common import money_text
from polyloop._recovery import child_run_id
from polyloop._stopping import Counters
from polyloop.inspect._safe import count_hidden, visible, visible_json
from polyloop.inspect._units import duration_words, plural
from polyloop.inspect._view import (
    ApprovalView,
    Awaiting,
    InDoubt,
    RunView,
    SettlementView,
    StepKind,
    StepView,
)
from polyloop.session import ResumeAction
from polyloop.tools import tool_name_problem
from polyloop.types import IntentKind, RunTotals

__all__ = [
    "SNAPSHOT_HIGHLIGHTS",
    "Divergence",
    "approval_lines",
    "awaiting_lines",
    "clip",
    "diff_runs",
    "expiry_words",
    "ls_json",
    "ls_lines",
    "ls_usage",
    "render_diff",
    "render_show",
    "shown_tool_name",
]

SNAPSHOT_HIGHLIGHTS = (
    "request.max_steps",
    "request.max_actions",
    "request.max_consecutive_parse_failures",
    "request.max_prompt_chars",
    "request.model_replay_policy",
    "request.tools",
    "store.kind",
)
"""Snapshot keys ``show`` prints without ``--full`` (plus every ``model_client.*`` key)."""


def clip(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` characters with a note of how much was left out."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [+{len(text) - limit} chars; --full shows all]"


def _block(label: str, text: str, limit: int | None, indent: str = "    ") -> list[str]:
    """``text`` under ``label``: made visible (its newlines kept), its first line after the
    label and every further line indented past the label."""
    shown = clip(text, limit)
    label = visible(label)
    escaped = count_hidden(shown, newlines=True)
    if escaped:
        label += f" [{escaped} control chars escaped]"
    body = visible(shown, newlines=True).split("\n")
    if len(body) > 1 and not body[-1]:
        body.pop()  # a text's last newline ends it, it starts no line
    pad = " " * (len(label) + 2)
    lines = [f"{indent}{label}: {body[0]}"]
    lines += [f"{indent}{pad}{line}" for line in body[1:]]
    return lines


def _snapshot_lines(view: RunView, full: bool) -> list[str]:
    snapshot = view.snapshot
    if full:
        keys = sorted(snapshot)
    else:
        keys = [k for k in sorted(snapshot) if k.startswith("model_client.")]
        keys += [k for k in SNAPSHOT_HIGHLIGHTS if k in snapshot]
    lines = [f"snapshot: {len(snapshot)} keys" + ("" if full else " (--full lists all)")]
    lines += [f"  {key} = {snapshot[key]!r}" for key in keys]
    return lines


def _context_lines(view: RunView, limit: int | None) -> list[str]:
    """The run's question and instructions as ``RunStarted`` recorded them (schema 1.8)."""
    if view.context is None:
        return ["context: not on record (record_context=False, or a log older than schema 1.8)"]
    lines = []
    for label, messages in (
        ("question", view.context.goal_level),
        ("instructions", view.context.run_level),
    ):
        for message in messages:
            text = "\n".join(block.text for block in message.content)
            lines += _block(f"{label} [{message.role.value}]", text, limit, indent="")
    return lines


_TOOL_PREFIX = "action_executor.tool."
_POLICY_SUFFIX = ".replay_policy"


def _tool_policy_lines(view: RunView) -> list[str]:
    """Each registry tool's replay policy from the snapshot, with the reason and the MCP
    server where the snapshot has them (design 0211)."""
    snapshot = view.snapshot
    lines: list[str] = []
    for key in sorted(snapshot):
        if not (key.startswith(_TOOL_PREFIX) and key.endswith(_POLICY_SUFFIX)):
            continue
        base = key.removesuffix(_POLICY_SUFFIX)
        line = f"  {base.removeprefix(_TOOL_PREFIX)}: {snapshot[key]}"
        server = snapshot.get(f"{base}.mcp.server")
        if server is not None:  # made visible with the line, by _joined
            version = snapshot.get(f"{base}.mcp.server_version", "")
            line += f"  [MCP server {server}{' ' + version if version else ''}]"
        reason = snapshot.get(f"{base}.replay_policy_reason")
        if reason is not None:
            line += f"  ({reason})"
        lines.append(line)
    return ["tool replay policies:", *lines] if lines else []


def _step_lines(step: StepView, limit: int | None) -> list[str]:
    head = f"step {step.idx}"
    facts = []
    if step.prompt_chars is not None:
        facts.append(f"prompt {step.prompt_chars} chars")
    if step.wall_ms is not None:
        facts.append(duration_words(step.wall_ms))
    if step.call_id is not None:
        facts.append(f"call {step.call_id}")
    facts.append("lines " + ",".join(str(n) for n in step.lines))
    lines = [f"{head}  [{step.kind.value}]  " + "  ".join(facts)]
    model = [
        f"model {duration_words(step.model_ms)}" if step.model_ms is not None else "",
        step.usage or "",
        f"cost {money_text(step.cost)}" if step.cost is not None else "",
        f"finish {step.finish_reason}" if step.finish_reason else "",
        f"action {duration_words(step.action_ms)}" if step.action_ms is not None else "",
    ]
    if any(model):
        lines.append("    " + ", ".join(part for part in model if part))
    if step.thinking:
        lines += _block("thinking", step.thinking, limit)
    if step.reply is not None:
        if step.reply or not step.tool_calls:  # a tool-call-only reply has no text to show
            lines += _block("reply", step.reply, limit)
        if step.history_text is not None and step.history_text != step.reply:
            lines += _block("history", step.history_text, limit)
    for call_id, name, arguments in step.tool_calls:
        lines += _block(f"tool call {name} (id {call_id})", arguments, limit)
    if step.failure is not None:
        lines += _block("model call failed", step.failure, limit)
    if step.kind is StepKind.PARSE_FAILURE and step.parse_error is not None:
        lines += _block("parse failure", step.parse_error, limit)
    if step.kind is StepKind.FINAL_ANSWER:
        lines.append("    decision: final answer")
    if step.approval is not None:
        lines += approval_lines(step.approval, limit)
    if step.action is not None or step.action_policy is not None:
        action = (
            step.action
            if step.action is not None
            else "announced; its text is logged with its step (the reply above holds it)"
        )
        facts = [f"replay policy {step.action_policy}"] if step.action_policy else []
        if step.idempotency_key is not None:
            facts.append(f"idempotency key {step.idempotency_key}")
        policy = f"  ({', '.join(facts)})" if facts else ""
        lines += _block("action", action + policy, limit)
    for settlement in step.settlements:
        lines += settlement_lines(settlement, limit)
    if step.kind is StepKind.REJECTED:
        lines.append(
            "    decision: the call was rejected and never executed; the model read why "
            "(the observation)"
        )
    if step.action_status is not None:
        done = ", environment reported completion" if step.env_reported_completion else ""
        settled = f", settled by {step.settled_by}" if step.settled_by else ""
        lines.append(f"    status: {step.action_status}{done}{settled}")
    if step.observation is not None and step.kind is not StepKind.FINAL_ANSWER:
        flags = []
        if step.observation_is_synthetic:
            flags.append("synthetic")
        if step.observation_truncated_chars:
            flags.append(f"{step.observation_truncated_chars} chars cut by the executor")
        label = "observation" + (f" ({', '.join(flags)})" if flags else "")
        lines += _block(label, step.observation, limit)
    if step.pending:
        lines.append(f"    incomplete: {step.pending}")
    return lines


def _cost_words(view: RunView) -> str:
    """``", cost 0.0125"`` (``"at least"`` when a completed step's cost is unknown); ``""``
    when no step has a cost (design 0236)."""
    text = view.cost_text
    if text is None:
        return ""
    return f", cost at least {text[2:]}" if text.startswith(">=") else f", cost {text}"


def _joined(lines: Iterable[str]) -> str:
    """The lines as one text, each made visible with its newlines escaped: one line each."""
    return "\n".join(visible(line) for line in lines)


def settlement_lines(
    settlement: SettlementView, limit: int | None, indent: str = "    "
) -> list[str]:
    """A settlement: its verdict, who and when, its line; then its note and observation. An
    approval decision is a ``decision on`` the call, with the digest it binds to."""
    what = "decision on" if settlement.digest is not None else "settlement of"
    lines = [
        f"{indent}{what} {settlement.result_id} (line {settlement.line}): "
        f"{settlement.verdict.replace('_', ' ')}, by {settlement.who} at {settlement.at}"
    ]
    if settlement.digest is not None:
        lines.append(f"{indent}  digest: {settlement.digest}")
    if settlement.note:
        label = "reason" if settlement.verdict in ("unknown", "rejected") else "note"
        lines += _block(label, settlement.note, limit, indent=indent + "  ")
    if settlement.observation is not None:
        lines += _block("observation", settlement.observation, limit, indent=indent + "  ")
    return lines


def approval_lines(request: ApprovalView, limit: int | None, indent: str = "    ") -> list[str]:
    """A request for approval: the tool, its canonical arguments exactly as digested (made
    visible; never cut, a person decides on all of them), the digest, when asked and until
    when."""
    del limit  # the arguments a person approves are shown in full
    call = f", call id {request.tool_call_id}" if request.tool_call_id is not None else ""
    lines = [
        f"{indent}approval requested for {request.result_id} (line {request.line}): tool "
        f"{shown_tool_name(request.tool)}{call}"
    ]
    lines += _block("arguments", request.arguments, None, indent=indent + "  ")
    lines.append(f"{indent}  digest: {request.digest}")
    lines.append(f"{indent}  asked at: {request.requested_at}")
    lines.append(f"{indent}  {expiry_words(request.expires_at)}")
    return lines


def expiry_words(expires_at: str | None) -> str:
    """When a request for approval expires, in words (``None``: it has no expiry)."""
    if expires_at is None:
        return "expires: no expiry set (it waits until a person decides)"
    return f"expires at: {expires_at}"


def shown_tool_name(name: str) -> str:
    """A tool name as a person reads it when deciding (design 0233): as it is when it matches
    ``polyloop.tools.TOOL_NAME_PATTERN`` (ASCII: no two look alike), else escaped with
    ``ascii`` and marked, so ``refund`` spelled with a Cyrillic small ie (U+0435) in a log written
    before the rule reads ``'r\\u0435fund'``, never like ``refund``."""
    if tool_name_problem(name) is None:
        return name
    return f"{name!a} (not a provider-safe name; its non-ASCII characters escaped)"


def awaiting_lines(awaiting: Awaiting) -> list[str]:
    """What an unfinished run waits for, and the commands that decide it."""
    request = awaiting.request
    lines = [
        f"awaiting approval: step {request.step_idx}'s call of tool {request.tool} "
        f"({request.result_id}, digest {request.digest}); nothing of it has executed"
    ]
    if awaiting.note:
        lines.append(f"  note: {awaiting.note}")
    lines.append("  decide with one of (NAME: who decides; TEXT: why, the model reads it):")
    lines += [f"    {command}" for command in awaiting.commands]
    lines.append(
        f"  then resume the run with its agent ({_RESUME_CALLS}): approved, it executes the "
        "call; rejected, the model reads the reason"
    )
    return lines


_RESUME_CALLS = (
    "agent.run with the same run_id for a polyloop.Agent; polyloop.session.run_or_resume or "
    "resume otherwise"
)
"""How a person resumes a run, in the in-doubt and awaiting panels: the log does not say
whether a ``polyloop.Agent`` made it, so both ways are named (designs 0230, 0231)."""


def in_doubt_lines(doubt: InDoubt, limit: int | None) -> list[str]:
    """What an unfinished run is in doubt about, and how a person settles it."""
    what = "action" if doubt.settleable else "model call"
    lines = [
        f"in doubt: step {doubt.step_idx}'s {what} {doubt.result_id} (replay policy "
        f"{doubt.replay_policy}) has an intent and no result: it may or may not have happened"
    ]
    if doubt.idempotency_key is not None:
        lines.append(
            f"  idempotency key: {doubt.idempotency_key} (look it up in the tool's own system)"
        )
    else:
        lines.append("  idempotency key: none recorded (an intent written before schema 1.7)")
    for call_id, name, arguments in doubt.tool_calls:
        lines += _block(f"asked for: tool {name} (id {call_id})", arguments, limit, indent="  ")
    if not doubt.tool_calls and doubt.reply is not None:
        lines += _block("the reply that asked for it", doubt.reply, limit, indent="  ")
    if doubt.last_answer is not None:
        answer = doubt.last_answer
        lines.append(
            f"  last answer: {answer.verdict.replace('_', ' ')}, by {answer.who} at {answer.at} "
            f"(line {answer.line})"
        )
    if doubt.note:
        lines.append(f"  note: {doubt.note}")
    if doubt.commands:
        lines.append("  settle it with one of (TEXT: what the tool's system says happened):")
        lines += [f"    {command}" for command in doubt.commands]
        lines.append(f"  then resume the run with its agent ({_RESUME_CALLS})")
    return lines


def tree_lines(view: RunView) -> list[str]:
    """Where the run sits in its tree (design 0245): its parent, and each child its steps ran
    with the child's stop reason and its subtree's steps and tokens (``StepRecord.child``);
    nothing for a run outside any tree."""
    lines = []
    started = view.log.started
    link = None if started is None else started.parent
    if link is not None:
        lines.append(f"parent: {link.run_id}, step {link.step_idx} (depth {link.depth})")
    for completed in view.log.steps:
        child = completed.step.child
        if child is not None:
            lines.append(
                f"child: {child.run_id} (step {completed.step.step_idx}): "
                f"{child.stop_reason.value}, {child.steps} steps and {child.tokens} tokens "
                "in its subtree"
            )
    return lines


def tree_view_lines(views: Sequence[RunView], run_id: str) -> list[str]:
    """The tree of runs under ``run_id`` as far as ``views`` hold it (design 0245), one line a
    run, indented by depth: its id, its stop reason (``unfinished`` while open), its own steps
    and the steps and tokens of its whole subtree (what its budget counted). A child a step
    names that ``views`` lack is listed as ``not in this place``; a child still open under an
    open call (awaiting approval, in doubt, interrupted) is listed under its parent too."""
    by_id = {view.run_id: view for view in views}
    lines: list[str] = []

    def walk(current: str, depth: int) -> None:
        pad = "  " * depth
        view = by_id.get(current)
        if view is None:
            lines.append(f"{pad}{current}  (not in this place)")
            return
        totals = Counters()
        for completed in view.log.steps:
            totals = totals.after(completed.step)
        lines.append(
            f"{pad}{current}  {view.status}  {view.completed_steps} steps; subtree "
            f"{totals.steps} steps, {totals.tokens} tokens"
        )
        for completed in view.log.steps:
            if completed.step.child is not None:
                walk(completed.step.child.run_id, depth + 1)
        recorded = {c.step.step_idx for c in view.log.steps}
        open_calls = [
            i.idempotency_key
            for i in view.log.intents
            if i.kind is IntentKind.ACTION and i.call_index not in recorded and i.idempotency_key
        ]
        for key in open_calls:  # a child still open below an open call
            if child_run_id(key) in by_id:
                walk(child_run_id(key), depth + 1)

    walk(run_id, 0)
    return lines


def render_show(view: RunView, *, full: bool, limit: int | None) -> str:
    """The transcript of one run (``limit``: characters per text field; ``None``: all)."""
    lines = [f"run {view.run_id}  ({view.source}, {view.line_count} lines)"]
    if view.torn_bytes:
        lines.append(
            f"note: an unterminated last line of {view.torn_bytes} bytes is ignored "
            "(a write that never completed)"
        )
    if view.fork is not None:
        origin = view.fork
        copied = {0: "its start only", 1: "step 0 copied"}.get(
            origin.step_idx, f"steps 0-{origin.step_idx - 1} copied"
        )
        lines.append(
            f"forked from: {view.forked_from} ({copied}, {origin.records} records, prefix "
            f"{origin.digest})"
        )
    lines += _snapshot_lines(view, full)
    lines += _context_lines(view, limit)
    count = len(view.resumes)
    resumes = f", {plural(count, 'resume')}" if count else ""
    lines += _tool_policy_lines(view)
    lines += tree_lines(view)
    lines.append(
        f"summary: {plural(view.completed_steps, 'step')}, {plural(view.actions, 'action')}, "
        f"{plural(view.model_calls, 'model call')}, {duration_words(view.duration_ms)} of step "
        f"wall time{resumes}{_cost_words(view)}"
    )
    for step in view.steps:
        lines.append("")
        if step.resumed is not None:
            lines.append(
                f"  {step.resumed.words} (mark on {step.resumed.carrier}, line {step.resumed.line})"
            )
        lines += _step_lines(step, limit)
    shown = {step.idx for step in view.steps}
    for resume in view.resumes:  # one that entered after the last step only wrote the finish
        if resume.step_idx not in shown:
            lines += ["", f"  {resume.words} (mark on {resume.carrier}, line {resume.line})"]
    loose = [s for s in view.settlements if s.step_idx not in shown]
    if loose:
        lines += ["", "settlements that name no step of this log (verify names the breach):"]
        for settlement in loose:
            lines += settlement_lines(settlement, limit, indent="  ")
    lines.append("")
    if view.stop_reason is not None:
        detail = "" if view.stop_detail is None else f" ({view.stop_detail})"
        lines.append(f"stop reason: {view.stop_reason}{detail}")
        if view.plan.action is ResumeAction.CORRUPT:
            lines.append(
                f"warning: the log breaks a structural rule ({view.plan.detail}); "
                "python -m polyloop verify checks every log"
            )
        if view.final_answer is not None:
            lines += _block("final answer", view.final_answer, limit, indent="")
        if view.event_delivery_failures:
            lines.append(f"event deliveries that failed: {view.event_delivery_failures}")
    else:
        if view.in_doubt is not None:
            lines += in_doubt_lines(view.in_doubt, limit)
        if view.awaiting is not None:
            lines += awaiting_lines(view.awaiting)
        lines.append(f"unfinished: {view.resume}")
    return _joined(lines)


# --------------------------------------------------------------------------- ls


def ls_usage(view: RunView) -> dict[str, object]:
    """What a run used, for ``ls --json``: ``tokens``, summed over its steps as
    ``RunResult.totals`` sums them (``prompt``, ``completion``, ``cached``, and
    ``steps_without_usage``: a total is complete exactly when that is 0); ``null`` for a run
    without a step. The one place ``ls --json`` reports what a run used: another figure of
    it belongs beside ``tokens``, here."""
    if not view.log.steps:
        return {"tokens": None}
    totals = RunTotals.of(completed.step for completed in view.log.steps)
    return {
        "tokens": {
            "prompt": totals.prompt_tokens,
            "completion": totals.completion_tokens,
            "cached": totals.cached_tokens,
            "steps_without_usage": totals.steps_without_usage,
        }
    }


def ls_record(view: RunView) -> dict[str, object]:
    """The ``ls --json`` object of one run: its counts, its final answer (``null`` when it
    has none), what it used (``ls_usage``), and where an unfinished run stands."""
    return {
        "run_id": view.run_id,
        "status": view.status,
        "stop_reason": view.stop_reason,
        "steps": view.completed_steps,
        "actions": view.actions,
        "model_calls": view.model_calls,
        "duration_ms": view.duration_ms,
        "final_answer": view.final_answer,
        **ls_usage(view),
        "resume": None if view.finished else view.plan.action.value,
        "in_doubt": None if view.in_doubt is None else view.in_doubt.result_id,
        "awaiting_approval": None if view.awaiting is None else view.awaiting.request.digest,
        "settlements": len(view.settlements),
        "source": view.source,
        "cost": view.cost_text,
        **_tree_record(view),
    }


def _tree_record(view: RunView) -> dict[str, object]:
    """``parent`` and ``children`` (design 0245) for a run of a tree; nothing otherwise, so
    that a listing without trees is what it always was."""
    started = view.log.started
    link = None if started is None else started.parent
    children = [c.step.child.run_id for c in view.log.steps if c.step.child is not None]
    if link is None and not children:
        return {}
    return {"parent": None if link is None else link.run_id, "children": children}


def _tree_cell(view: RunView) -> str:
    record = _tree_record(view)
    if not record:
        return ""
    children = record["children"]
    assert isinstance(children, list)
    counted = f"{len(children)} child{'ren' if len(children) != 1 else ''}"
    parent = record["parent"]
    return counted if parent is None else f"{counted}, under {parent}"


def ls_lines(views: Sequence[RunView]) -> list[str]:
    """One aligned line per run: id, stop reason (``unfinished`` for a run without a finish;
    the column was headed "status" before issue 26), steps, actions, duration (in words,
    ``duration_words``), model calls, a ``cost`` column when some run has a cost
    (``RunView.cost_text``), the result id of the execution an unfinished run is in doubt about,
    or of the call it waits for approval on (``python -m polyloop approvals`` lists those), and
    the log (two runs of one id in two directories stay apart). A place that holds trees of
    runs (design 0245) gets a last column, ``tree``: each run's child count and, for a child,
    its parent."""
    header: tuple[str, ...] = (
        "run",
        "stop reason",
        "steps",
        "actions",
        "duration",
        "model calls",
        "cost",
        "in doubt",
        "approval",
        "log",
    )
    # The cost column (design 0236) only when some run has a cost, the tree column (design
    # 0245) only when some run is part of a tree: a table of other runs looks as it always did.
    costs = any(view.cost is not None for view in views)
    trees = any(_tree_record(view) for view in views)
    if trees:
        header = (*header, "tree")
    rows: list[tuple[str, ...]] = [header]
    for view in views:
        rows.append(
            (
                visible(view.run_id),
                visible(view.status),
                str(view.completed_steps),
                str(view.actions),
                duration_words(view.duration_ms),
                str(view.model_calls),
                view.cost_text or "",
                "" if view.in_doubt is None else visible(view.in_doubt.result_id),
                ""
                if view.awaiting is None
                else visible(f"{view.awaiting.request.result_id} waits"),
                visible(view.source),
            )
            + ((visible(_tree_cell(view)),) if trees else ())
        )
    if not costs:
        rows = [row[:6] + row[7:] for row in rows]
    columns = len(rows[0])
    numbers_end = 7 if costs else 6  # steps ... model calls (and cost) are right-aligned
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    out = []
    for row in rows:
        cells = [
            cell.rjust(width) if 2 <= i < numbers_end else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def ls_json(views: Iterable[RunView]) -> str:
    """The ``ls --json`` array: exact values, with no control character raw (``visible_json``)."""
    return visible_json([ls_record(view) for view in views])


# --------------------------------------------------------------------------- diff


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """Where two runs part: the first step and field that differ (``None``: no step differs),
    plus the snapshot keys that differ."""

    step: int | None
    field: str
    left: str
    right: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    stop_reasons: tuple[str, str]

    @property
    def identical(self) -> bool:
        return (
            self.step is None
            and not (self.added or self.removed or self.changed)
            and self.stop_reasons[0] == self.stop_reasons[1]
        )


_COMPARED: tuple[tuple[str, str], ...] = (
    ("prompt_chars", "prompt size (chars; the log keeps sizes, not prompt text)"),
    ("reply", "reply"),
    ("failure", "model call failure"),
    ("parse_error", "parse failure"),
    ("action", "action"),
    ("action_status", "action status"),
    ("observation", "observation"),
)


def diff_runs(left: RunView, right: RunView) -> Divergence:
    """Compare two runs step by step (prompt size, reply, decision, observation, in that order
    inside a step) and their snapshots key by key."""
    a, b = left.snapshot, right.snapshot
    added = tuple(sorted(b.keys() - a.keys()))
    removed = tuple(sorted(a.keys() - b.keys()))
    changed = tuple(sorted(k for k in a.keys() & b.keys() if a[k] != b[k]))
    reasons = (left.status, right.status)
    for idx in range(max(len(left.steps), len(right.steps))):
        if idx >= len(left.steps) or idx >= len(right.steps):
            has = "left" if idx < len(left.steps) else "right"
            return Divergence(
                step=idx,
                field="existence",
                left="present" if has == "left" else "absent",
                right="present" if has == "right" else "absent",
                added=added,
                removed=removed,
                changed=changed,
                stop_reasons=reasons,
            )
        one, two = left.steps[idx], right.steps[idx]
        compared = _COMPARED
        if StepKind.INCOMPLETE in (one.kind, two.kind) and one.kind is not two.kind:
            # An incomplete step has no step record: only its reply can be compared.
            compared = (("reply", "reply"), ("kind", "completion"))
        for name, label in compared:
            x, y = getattr(one, name), getattr(two, name)
            if name == "kind":
                x, y = _completion(one), _completion(two)
            if x != y:
                return Divergence(
                    step=idx,
                    field=label,
                    left="(none)" if x is None else str(x),
                    right="(none)" if y is None else str(y),
                    added=added,
                    removed=removed,
                    changed=changed,
                    stop_reasons=reasons,
                )
    return Divergence(
        step=None,
        field="",
        left="",
        right="",
        added=added,
        removed=removed,
        changed=changed,
        stop_reasons=reasons,
    )


def _completion(step: StepView) -> str:
    return f"incomplete: {step.pending}" if step.pending else f"complete ({step.kind.value})"


def render_diff(left: RunView, right: RunView, found: Divergence, limit: int | None) -> str:
    lines = [f"--- {left.run_id}  ({left.source})", f"+++ {right.run_id}  ({right.source})"]
    if found.step is None:
        same = min(len(left.steps), len(right.steps))
        agree = "the 1 step agrees" if same == 1 else f"the {same} steps agree"
        lines.append(f"steps: {agree} (prompt size, reply, action, observation)")
    else:
        lines.append(f"first divergence: step {found.step}, {found.field}")
        lines += _block("-", found.left, limit, indent="  ")
        lines += _block("+", found.right, limit, indent="  ")
    if found.stop_reasons[0] != found.stop_reasons[1]:
        lines.append(f"end: {found.stop_reasons[0]} vs {found.stop_reasons[1]}")
    else:
        lines.append(f"end: both {found.stop_reasons[0]}")
    if found.added or found.removed or found.changed:
        lines.append("snapshot keys that differ:")
        a, b = left.snapshot, right.snapshot
        lines += [f"  only in {right.run_id}: {key} = {b[key]!r}" for key in found.added]
        lines += [f"  only in {left.run_id}: {key} = {a[key]!r}" for key in found.removed]
        lines += [
            f"  changed: {key}: {clip(a[key], limit)!r} -> {clip(b[key], limit)!r}"
            for key in found.changed
        ]
    else:
        lines.append("snapshot: identical")
    return _joined(lines)
