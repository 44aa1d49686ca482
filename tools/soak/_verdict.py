"""The three-valued verdict and its evidence, shared by the scoreboard and the fault batch.

Every criterion has exactly three outcomes: ``PASSED``, ``BREACHED``, ``UNDETERMINED``. The
third is never folded into the other two: a missing file or field means "could not judge",
which is not "judged fine". Verdicts are computed from evidence, never set: a breach must
name where (run id, line or step) and what was expected versus found, and a pass must say
what it looked at, because the commonest bad pass is a check that ran on nothing - its
evidence then says "0 lines" in plain sight.

Evidence text obeys the sentinel rule of the reports: it may hold counts, enum values, run ids,
line and step numbers, and fixed wording - never text taken from a log, a model or a file
(such text is reported as its length). ``Evidence`` cannot enforce that by itself; the
sentinel tests plant a marker in every field and assert it never reaches a report.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["RUN_ID", "Evidence", "Verdict", "combine"]

RUN_ID: Final = re.compile(r"[A-Za-z0-9._-]+")
"""What a run id in a report may look like (the ``JsonlRunStore`` file-name rule)."""


class Verdict(enum.Enum):
    PASSED = "passed"
    BREACHED = "breached"
    UNDETERMINED = "undetermined"


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """Any breach wins; else any undetermined; else passed. An empty input is undetermined."""
    seen = set(verdicts)
    if Verdict.BREACHED in seen:
        return Verdict.BREACHED
    if Verdict.UNDETERMINED in seen or not seen:
        return Verdict.UNDETERMINED
    return Verdict.PASSED


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What a verdict rests on: ``run_id`` (``None`` for the whole batch), ``where`` (for
    example ``"line 7"`` or ``"step 3"``, may be empty) and ``detail`` (expected vs. found)."""

    run_id: str | None
    where: str
    detail: str

    def __post_init__(self) -> None:
        if self.run_id is not None and not RUN_ID.fullmatch(self.run_id):
            raise ValueError(
                f"Evidence.run_id must be a run id ({RUN_ID.pattern}), got one of length "
                f"{len(self.run_id)}; report foreign text as its length"
            )
        if not self.detail.strip():
            raise ValueError(
                "Evidence.detail must say what was found; empty evidence is no evidence"
            )

    def describe(self) -> str:
        scope = self.run_id if self.run_id is not None else "batch"
        return f"{scope} {self.where}: {self.detail}" if self.where else f"{scope}: {self.detail}"
