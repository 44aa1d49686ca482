"""The review scenario's vocabulary: phases, the tools of each phase, verdicts, checkpoints.

Everything here is a constant. The other modules of the package (and the policy, which runs
inside the loopback policy server) read these names, so a rename happens in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "ALL_TOOLS",
    "CATEGORIES",
    "CHECKPOINTS",
    "COMPLETING_TOOLS",
    "NAME",
    "PHASES",
    "PHASE_TOOLS",
    "VERDICT_LEVELS",
    "Checkpoint",
    "ReviewScenarioError",
]

NAME: Final = "review"

PHASES: Final = ("plan", "execute", "summarize")
"""The three phases of one task, in the order they run. Each is its own polyloop run."""

ALL_TOOLS: Final = ("read_document", "grep_document", "write_note", "submit_finding")
"""Registration order of the full registry; ``restrict_to`` keeps this order."""

PHASE_TOOLS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "plan": ("read_document", "grep_document", "write_note"),
        "execute": ("read_document", "grep_document", "write_note"),
        # Summarize concludes from the evidence already on disk: no search, no new notes.
        "summarize": ("read_document", "submit_finding"),
    }
)

COMPLETING_TOOLS: Final = frozenset({"submit_finding"})
"""Tools with ``completes_run=True`` (what the scoreboard accepts as completion evidence)."""

VERDICT_LEVELS: Final = ("compliant", "non_compliant", "doubtful")
"""The only strings ``submit_finding`` accepts as ``verdict``; matched exactly (no trimming,
no case folding), so a finding file always holds one of these three values."""


class ReviewScenarioError(ValueError):
    """The review scenario cannot be assembled as asked (unknown phase, damaged corpus, a
    workspace left over from an earlier attempt). The message names the input and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """One compliance clause a task checks the documents against.

    ``category`` selects how the corpus generator plants the facts and how the scripted policy
    looks for them; the model-facing text is ``render()``. The legal basis is fictional on
    purpose and says so.
    """

    checkpoint_id: str
    category: str
    title: str
    clause: str
    guidance: str
    legal_basis: tuple[str, ...]
    severity: str

    def render(self) -> str:
        """The checkpoint as the goal message shows it."""
        return "\n".join(
            (
                f"Checkpoint {self.checkpoint_id} (category: {self.category}; "
                f"severity: {self.severity})",
                f"Title: {self.title}",
                f"Clause: {self.clause}",
                f"How to judge: {self.guidance}",
                f"Legal basis: {'; '.join(self.legal_basis)}",
                f"Allowed verdicts: {', '.join(VERDICT_LEVELS)}",
            )
        )


CATEGORIES: Final = ("bid_security", "bid_period", "regional_restriction", "payment_terms")

CHECKPOINTS: Final[Mapping[str, Checkpoint]] = MappingProxyType(
    {
        "bid_security": Checkpoint(
            checkpoint_id="CP-01",
            category="bid_security",
            title="Bid security within 2% of the budget",
            clause=(
                "The bid security required from each bidder must not exceed 2% of the "
                "procurement budget."
            ),
            guidance=(
                "Find the procurement budget in the procurement notice and every statement of "
                "the bid security amount in the tender documents. If the tender states "
                "different amounts, the verdict is doubtful."
            ),
            legal_basis=("Model Procurement Rules (synthetic), rule 12",),
            severity="high",
        ),
        "bid_period": Checkpoint(
            checkpoint_id="CP-02",
            category="bid_period",
            title="At least 20 days to prepare bids",
            clause=(
                "At least 20 calendar days must pass from the issue date of the tender "
                "documents to the bid submission deadline."
            ),
            guidance=(
                "Take the issue date and the deadline from the procurement notice and check "
                "that the tender documents state the same deadline. If the two documents give "
                "different deadlines, the verdict is doubtful."
            ),
            legal_basis=("Model Procurement Rules (synthetic), rule 7",),
            severity="high",
        ),
        "regional_restriction": Checkpoint(
            checkpoint_id="CP-03",
            category="regional_restriction",
            title="No regional restriction on bidders",
            clause=(
                "The tender must not require bidders to be registered in, or to keep an "
                "office in, a particular region."
            ),
            guidance=(
                "Read the qualification requirements. A mandatory local office is "
                "non-compliant; a stated preference for a local office is doubtful; an "
                "explicit statement that the place of registration is not restricted is "
                "compliant."
            ),
            legal_basis=("Model Procurement Rules (synthetic), rule 3",),
            severity="medium",
        ),
        "payment_terms": Checkpoint(
            checkpoint_id="CP-04",
            category="payment_terms",
            title="Payment within 30 days of acceptance",
            clause="The purchaser must pay the supplier within 30 days after final acceptance.",
            guidance=(
                "Find the payment clause in the contract terms. A period longer than 30 days "
                "is non-compliant; a schedule left open until after the award is doubtful."
            ),
            legal_basis=("Model Procurement Rules (synthetic), rule 21",),
            severity="medium",
        ),
    }
)
