"""The review scenario's context: what a model is told in each phase, and the fixed texts.

``build_context`` returns two messages:

* run level: one ``SYSTEM`` message with the reviewer's role, the current phase's
  instructions, the action format and the phase's tool schemas. It is the same for every task
  of a phase, so a provider's prefix cache can share it across a batch.
* goal level: one ``USER`` message with the task: project, checkpoint, and the list of
  documents with their line counts. Never the document bodies: text reaches the model only
  through the tools, which is what keeps prompts growing step by step (and lets the
  prompt-limit fault class trip on a single large observation).

Plan and execute end with a final answer, and their instructions spell out the
``{"final_answer": ...}`` closing. Summarize ends only with ``submit_finding``; its prompt does
not mention a final answer at all and says there is no search tool.

Both messages pass the leak gate (``assert_no_residue`` with the task's ``LeakGate``: the
generator's ground truth and the redactor's learned originals) before the context is returned;
residue there refuses the run before anything is sent.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

from polyloop.tools import ToolRegistry
from polyloop.types import Context, Message, Role, SyntheticObservations, TextBlock
from tools.soak.review.domain import PHASE_TOOLS, PHASES, ReviewScenarioError
from tools.soak.review.redaction import assert_no_residue
from tools.soak.review.tasks import ReviewTask

__all__ = [
    "EVIDENCE_NOTE",
    "OBSERVATION_PREFIX",
    "OBSERVATION_TEMPLATE",
    "PLAN_NOTE",
    "PROMPT_FINGERPRINT",
    "SYNTHETIC_OBSERVATIONS",
    "build_context",
    "goal_text",
    "run_level_text",
]

PLAN_NOTE: Final = "plan.md"
EVIDENCE_NOTE: Final = "evidence.md"

OBSERVATION_PREFIX: Final = "Observation:\n"
OBSERVATION_TEMPLATE: Final = OBSERVATION_PREFIX + "{observation}"

SYNTHETIC_OBSERVATIONS: Final = SyntheticObservations(
    action_rejected=(
        "[rejected before it ran: that tool is not available in this phase, or its arguments "
        "break the tool's rules; check the tool list and the argument descriptions]"
    ),
    env_failed="[the workspace is unavailable; the action did not run]",
    model_call_failed="[the model call failed; this step produced nothing]",
)

_ROLE: Final = (
    "You are a procurement compliance reviewer. A review checks one checkpoint (a rule that "
    "public tenders must follow) against the documents of one tender, in three phases that "
    "run one after another as separate conversations: plan, execute and summarize. The phases "
    "share a workspace: a note written in one phase can be read in the next.\n\n"
    "Personal and organisational data in the documents has been pseudonymised: "
    "organisations, people, telephone numbers, e-mail addresses and credit codes appear as "
    'placeholders such as "Example Company C" or "Example Phone B". Treat them as ordinary '
    "names. Amounts, dates, project numbers and places are the documents' real values."
)

_PHASE_INSTRUCTIONS: Final = {
    "plan": (
        "Current phase: plan.\n"
        "Search and read the documents to find where the facts the checkpoint depends on are "
        f"stated. Write a plan to the note {PLAN_NOTE} listing each location to verify, one "
        'per line, in the form "- <doc_id> line <n>: <text of the line>". Do not judge yet.'
    ),
    "execute": (
        "Current phase: execute.\n"
        f"Read {PLAN_NOTE}. Verify each listed location against the document itself, and "
        f"write the verified lines word for word to the note {EVIDENCE_NOTE}, one per line, "
        'in the form "<doc_id> line <n>: <text of the line>". If the plan is missing, find '
        "the locations yourself first."
    ),
    "summarize": (
        "Current phase: summarize.\n"
        f"Read {EVIDENCE_NOTE} and decide the verdict from the evidence on file. There is no "
        "search tool in this phase and you cannot write notes: conclude from what the earlier "
        "phases recorded. If the evidence does not settle the question, the verdict is "
        "doubtful."
    ),
}

_ACTION_FORMAT: Final = (
    "Act by replying with exactly one JSON object, optionally inside a ```json fence:\n"
    '{"tool": "<tool name>", "arguments": {<parameters>}}\n'
    "The tool's output comes back as the next message."
)

_CLOSING: Final = {
    "plan": (
        f"When {PLAN_NOTE} is written, finish the phase by replying "
        '{"final_answer": "<one sentence on what the plan covers>"}.'
    ),
    "execute": (
        f"When {EVIDENCE_NOTE} is written, finish the phase by replying "
        '{"final_answer": "<one sentence on what the evidence shows>"}.'
    ),
    "summarize": (
        "Submit exactly one finding with submit_finding; that call ends the review, and "
        "nothing else does."
    ),
}

PROMPT_FINGERPRINT: Final = (
    "sha256:"
    + hashlib.sha256(
        json.dumps(
            [_ROLE, _PHASE_INSTRUCTIONS, _ACTION_FORMAT, _CLOSING, OBSERVATION_TEMPLATE],
            sort_keys=True,
        ).encode("utf-8")
    ).hexdigest()
)
"""Fingerprint of every fixed prompt text (recorded in each run's parameter snapshot)."""


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ReviewScenarioError(f"phase {phase!r} is unknown; use one of {', '.join(PHASES)}")


def run_level_text(phase: str, tools: ToolRegistry) -> str:
    """The system message of ``phase``, with the schemas of ``tools``."""
    _check_phase(phase)
    schemas = json.dumps(tools.schema_for_model(), indent=2, sort_keys=True)
    return "\n\n".join(
        (
            _ROLE,
            _PHASE_INSTRUCTIONS[phase],
            _ACTION_FORMAT,
            _CLOSING[phase],
            f"Tools available in this phase:\n{schemas}",
        )
    )


def goal_text(task: ReviewTask) -> str:
    """The task message: the same in all three phases of a task."""
    listing = "\n".join(f"- {doc.doc_id}: {doc.line_count} lines" for doc in task.documents)
    return "\n".join(
        (
            f"Review task {task.task_id}",
            f"Project: {task.project_title}",
            f"Project number: {task.project_number}",
            "",
            task.checkpoint.render(),
            "",
            "Documents (read them with the tools; they are not included here):",
            listing,
            "",
            f"Workspace notes: {PLAN_NOTE} (written in the plan phase), {EVIDENCE_NOTE} "
            "(written in the execute phase).",
        )
    )


def build_context(*, task: ReviewTask, phase: str, tools: ToolRegistry) -> Context:
    """The context of one phase run; raises ``RedactionResidueError`` on residue and
    ``ReviewScenarioError`` when ``tools`` are not exactly the phase's tools."""
    _check_phase(phase)
    if tools.names() != PHASE_TOOLS[phase]:
        raise ReviewScenarioError(
            f"the {phase} phase offers exactly {PHASE_TOOLS[phase]}, got {tools.names()}; "
            f"pass registry.restrict_to(PHASE_TOOLS[{phase!r}])"
        )
    system, goal = run_level_text(phase, tools), goal_text(task)
    for number, text in enumerate((system, goal)):
        assert_no_residue(
            text, where=f"{task.task_id} {phase} context message {number}", known=task.gate
        )
    return Context(
        run_level=(Message(role=Role.SYSTEM, content=(TextBlock(text=system),)),),
        goal_level=(Message(role=Role.USER, content=(TextBlock(text=goal),)),),
    )
