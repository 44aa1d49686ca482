"""From the stored corpus to review tasks: load, pseudonymise in memory, gate, freeze.

``build_tasks`` is the only way a document reaches the rest of the scenario, and it hands out
redacted text only. The originals are read from disk, passed through one shared ``Redactor``
in two passes (learn every value the rules detect in every loaded text, then replace), and
each redacted text is checked by the leak gate before any task is returned: a residue refuses
startup, before a single model call is made. Redacted text is never written anywhere.

The gate (``LeakGate``) knows two sets of originals, kept apart: the corpus generator's ground
truth for every loaded task (``corpus.sensitive_values``, which no redaction rule influences)
and what the redactor learned. The first is what makes the gate independent of the redactor:
a weakened or deleted rule leaves its values in the text, and the ground truth finds them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from tools.soak.review.corpus import (
    ensure_corpus,
    load_manifest,
    read_corpus_document,
    sensitive_values,
)
from tools.soak.review.domain import CHECKPOINTS, Checkpoint
from tools.soak.review.redaction import (
    REDACTION_CATEGORIES,
    KnownOriginals,
    LeakGate,
    Redactor,
    assert_no_residue,
)

__all__ = ["ReviewDocument", "ReviewTask", "build_tasks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewDocument:
    """One pseudonymised document: its id and its lines (without line breaks)."""

    doc_id: str
    lines: tuple[str, ...] = field(repr=False)

    @property
    def line_count(self) -> int:
        return len(self.lines)

    @property
    def char_count(self) -> int:
        return sum(len(line) + 1 for line in self.lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewTask:
    """One checkpoint to review against one project's documents (all text pseudonymised).

    ``gate`` holds, apart, the generator's ground truth of every sensitive value in the
    loaded tasks and the snapshot of every original the redactor saw while building the task
    list; the executor and the context builder scan with it. ``expected_verdict`` comes from the
    corpus manifest, is used only by the programmatic success check, and never enters a
    prompt. ``corpus_digest`` fingerprints the redacted documents (it is recorded in the
    run's parameter snapshot, so resuming against changed documents is refused).
    """

    task_id: str
    index: int
    checkpoint: Checkpoint
    project_title: str
    project_number: str
    documents: tuple[ReviewDocument, ...] = field(repr=False)
    expected_verdict: str = field(repr=False)
    gate: LeakGate = field(repr=False, compare=False)
    corpus_digest: str
    redaction_counts: Mapping[str, int] = field(repr=False)

    def document(self, doc_id: str) -> ReviewDocument | None:
        return next((doc for doc in self.documents if doc.doc_id == doc_id), None)

    def document_lines(self) -> dict[str, tuple[str, ...]]:
        return {doc.doc_id: doc.lines for doc in self.documents}


def _lines(text: str) -> tuple[str, ...]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start another one
    return tuple(lines)


def _digest(documents: tuple[ReviewDocument, ...]) -> str:
    hasher = hashlib.sha256()
    for doc in documents:
        hasher.update(doc.doc_id.encode("utf-8") + b"\0")
        hasher.update("\n".join(doc.lines).encode("utf-8") + b"\0")
    return "sha256:" + hasher.hexdigest()


def _ground_truth(seed: int, indices: list[int]) -> KnownOriginals:
    """Every sensitive value the generator planted in the tasks ``indices`` (value ->
    category), recomputed from the seed - never from the stored text or the redactor."""
    truth: dict[str, str] = {}
    for index in indices:
        for category, values in sensitive_values(seed, index).items():
            for value in values:
                truth.setdefault(value, category)
    return KnownOriginals(truth)


def build_tasks(*, seed: int, limit: int | None, data_dir: Path) -> list[ReviewTask]:
    """The first ``limit`` tasks (all when ``None``) of the corpus for ``seed``.

    Generates the corpus under ``data_dir`` first if it is absent. Deterministic: the same
    seed gives the same tasks, texts and aliases in every process, and a smaller ``limit``
    gives a prefix of the larger list (aliases are assigned in first-seen order, task by
    task). Raises ``RedactionResidueError`` if pseudonymisation left anything behind -
    judged by the shared rules, by what the redactor learned and by the generator's ground
    truth of every loaded task - and ``ReviewScenarioError`` if the stored corpus does not
    match its manifest.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    root = ensure_corpus(Path(data_dir), seed)
    records = load_manifest(root, seed)[:limit]
    originals = [
        (
            record,
            {doc_id: read_corpus_document(root, record, doc_id) for doc_id in record.documents},
        )
        for record in records
    ]
    redactor = Redactor()
    for record, texts in originals:
        redactor.learn(record.project_title)
        for text in texts.values():
            redactor.learn(text)
    staged = []
    for record, texts in originals:
        title = redactor.redact(record.project_title).text
        counts = dict.fromkeys(REDACTION_CATEGORIES, 0)
        redacted: list[ReviewDocument] = []
        for doc_id, text in texts.items():
            redaction = redactor.redact(text)
            for category, n in redaction.counts.items():
                counts[category] += n
            redacted.append(ReviewDocument(doc_id=doc_id, lines=_lines(redaction.text)))
        staged.append((record, title, tuple(redacted), counts))
    gate = LeakGate(
        ground_truth=_ground_truth(seed, [record.index for record, _ in originals]),
        learned=redactor.known_originals(),
    )
    tasks = []
    for record, title, documents, counts in staged:
        assert_no_residue(title, where=f"{record.task_id} project title", known=gate)
        for doc in documents:
            assert_no_residue(
                "\n".join(doc.lines), where=f"{record.task_id}/{doc.doc_id}", known=gate
            )
        tasks.append(
            ReviewTask(
                task_id=record.task_id,
                index=record.index,
                checkpoint=CHECKPOINTS[record.category],
                project_title=title,
                project_number=record.project_number,
                documents=documents,
                expected_verdict=record.expected_verdict,
                gate=gate,
                corpus_digest=_digest(documents),
                redaction_counts=MappingProxyType(counts),
            )
        )
    return tasks
