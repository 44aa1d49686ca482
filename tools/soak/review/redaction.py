"""Pseudonymisation of the review corpus, and the leak gate that checks it.

Two halves share one rule set (``RULES``):

* ``Redactor`` replaces every sensitive value the rules detect (organisation names, contact
  names, telephone numbers, e-mail addresses, 18-character unified social credit codes) with a
  stable alias such as ``Example Company C``. It also remembers each original, and sweeps a
  text for remembered originals the rules would miss where they stand (a contact name in a
  table cell has no "Contact person:" label in front of it).
* ``assert_no_residue`` is the gate: a second pass over a finished text (a redacted document,
  a rendered prompt, an observation about to be returned). It raises
  ``RedactionResidueError`` if the shared rules still detect anything, or if any value of its
  ``known`` originals appears literally.

What the gate can and cannot catch depends on ``known``. The rules are shared with the
redactor, so the rules half catches slips of the replacement step, never a rule that is
missing or too weak - the redactor and the gate are blind to the same values. The redactor's
own learned originals (``Redactor.known_originals``) share that blindness: a value no rule
detected was never learned. The one source that does not depend on the rules is the corpus
generator's ground truth (``corpus.sensitive_values``: every value it planted). So at run time
the gate is a ``LeakGate`` holding both sets, kept apart: the ground truth makes it
independent of the redactor (delete a rule, and startup fails on the values that rule used to
catch), and the learned set adds whatever the rules found beyond it.

Aliases always have the shape ``Example <Kind> <LETTERS>``. The fixed, obviously fake prefix
is what lets both halves skip aliases (they are masked before any rule runs), which makes
redaction idempotent and keeps the gate from flagging its own placeholders ("Example Hospital
B" would otherwise look like a hospital name). Amounts, dates, project numbers, places and
street addresses are kept: the audit judgement depends on the first three, and addresses have
no reliable end marker (a known, accepted gap: once the organisation is renamed an address
points at a renamed entity).

Everything happens in memory. Originals live in the ``Redactor``, the ``KnownOriginals``
snapshot it hands out and the ``LeakGate`` only as long as the process does; nothing here writes
a file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "ALIAS_PATTERN",
    "REDACTION_CATEGORIES",
    "RULES",
    "DetectionRule",
    "KnownOriginals",
    "LeakGate",
    "Redaction",
    "RedactionResidueError",
    "Redactor",
    "ResidueHit",
    "assert_no_residue",
]

REDACTION_CATEGORIES: Final = (
    "credit_code",
    "email",
    "phone",
    "company",
    "hospital",
    "bureau",
    "person",
)
"""Every category the rules detect, in priority order (an earlier one wins a tie)."""

_ALIAS_KIND: Final[Mapping[str, str]] = MappingProxyType(
    {
        "credit_code": "Code",
        "email": "Email",
        "phone": "Phone",
        "company": "Company",
        "hospital": "Hospital",
        "bureau": "Bureau",
        "person": "Person",
    }
)

ALIAS_PATTERN: Final = re.compile(
    r"\bExample (?:Code|Email|Phone|Company|Hospital|Bureau|Person) [A-Z]{1,4}\b"
)
"""What every alias looks like. Text matching it is masked before detection."""

_MASK_CHAR: Final = "\x00"  # in no rule's character classes, so no match can cross a mask


@dataclass(frozen=True, slots=True)
class DetectionRule:
    """One detector: ``category`` and a pattern whose ``value`` group (or whole match) is the
    sensitive value.

    ``anchors``, when given, are literals every match contains; the pattern then runs only on
    the lines that contain one of them, which is what makes scanning a whole corpus cheap.
    That is sound because no pattern can match across a line break (none of their character
    classes or separators admits ``\n``).
    """

    category: str
    pattern: re.Pattern[str]
    anchors: tuple[str, ...] = ()

    def spans(self, text: str) -> Iterable[tuple[int, int]]:
        group = "value" if "value" in self.pattern.groupindex else 0
        for begin, end in self._windows(text):
            for match in self.pattern.finditer(text, begin, end):
                yield match.start(group), match.end(group)

    def _windows(self, text: str) -> list[tuple[int, int]]:
        if not self.anchors:
            return [(0, len(text))]
        lines: set[tuple[int, int]] = set()
        for anchor in self.anchors:
            found = text.find(anchor)
            while found != -1:
                begin = text.rfind("\n", 0, found) + 1
                end = text.find("\n", found)
                end = len(text) if end == -1 else end
                lines.add((begin, end))
                found = text.find(anchor, end)
        return sorted(lines)


_CODE_CHAR: Final = "[0-9A-HJ-NP-RTUWXY]"  # the 31 characters a credit code may use
_ORG_WORD: Final = r"[A-Z][A-Za-z0-9&'-]*"
_PERSON_LABELS: Final = (
    "Contact person",
    "Contact",
    "Project manager",
    "Legal representative",
    "Authorised representative",
    "Procurement officer",
    "Mr",
    "Ms",
    "Dr",
)
_NOT_A_LEADING_WORD: Final = r"(?!(?:The|A|An|Of|For|To|By|And|In|On|At|With|From)\b)"

RULES: Final = (
    DetectionRule(
        "credit_code",
        re.compile(
            rf"(?<![0-9A-Za-z]){_CODE_CHAR}{{2}}[0-9]{{6}}{_CODE_CHAR}{{10}}(?![0-9A-Za-z])"
        ),
    ),
    DetectionRule(
        "email",
        re.compile(
            r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
        ),
        ("@",),
    ),
    DetectionRule(
        "phone",
        re.compile(
            r"(?<![\w+-])(?:"
            r"\+86 [0-9]{2,3} [0-9]{4} [0-9]{4}"
            r"|\(0[0-9]{2,3}\) [0-9]{4} [0-9]{4}"
            r"|0[0-9]{2,3}-[0-9]{7,8}"
            r"|1[3-9][0-9] [0-9]{4} [0-9]{4}"
            r"|1[3-9][0-9]{9}"
            r")(?![\w-])"
        ),
    ),
    DetectionRule(
        "company",
        re.compile(rf"\b{_NOT_A_LEADING_WORD}(?:{_ORG_WORD} ){{1,6}}Co\., Ltd\."),
        ("Co., Ltd.",),
    ),
    DetectionRule(
        "hospital",
        re.compile(rf"\b{_NOT_A_LEADING_WORD}(?:{_ORG_WORD} (?:and )?){{1,6}}Hospital\b"),
        ("Hospital",),
    ),
    DetectionRule(
        "bureau",
        re.compile(
            rf"\b{_NOT_A_LEADING_WORD}(?:{_ORG_WORD} ){{1,6}}(?:Bureau|Commission|Trading Centre)\b"
        ),
        ("Bureau", "Commission", "Trading Centre"),
    ),
    DetectionRule(
        "person",
        re.compile(
            r"\b(?:" + "|".join(_PERSON_LABELS) + r")\.?:? "
            r"(?P<value>[A-Z][a-z]+ [A-Z][a-z]+)\b"
        ),
        _PERSON_LABELS,
    ),
)
"""The one detection rule set, shared by ``Redactor`` and ``assert_no_residue``."""

_PRIORITY: Final[Mapping[str, int]] = MappingProxyType(
    {category: index for index, category in enumerate(REDACTION_CATEGORIES)}
)
_ALNUM_RUN: Final = re.compile(r"[A-Za-z0-9]+")


def _mask_aliases(text: str) -> str:
    """``text`` with every alias overwritten by mask characters (offsets are unchanged)."""
    return ALIAS_PATTERN.sub(lambda match: _MASK_CHAR * len(match.group(0)), text)


def _rule_spans(masked: str) -> list[tuple[int, int, str]]:
    return [(start, end, rule.category) for rule in RULES for start, end in rule.spans(masked)]


def _non_overlapping(spans: Iterable[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Leftmost first, then the longest, then the higher-priority category; no overlaps."""
    ordered = sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]), _PRIORITY[s[2]]))
    chosen: list[tuple[int, int, str]] = []
    end_of_last = -1
    for span in ordered:
        if span[0] >= end_of_last:
            chosen.append(span)
            end_of_last = span[1]
    return chosen


def _label(number: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA, ... (bijective base 26)."""
    letters = ""
    number += 1
    while number:
        number, remainder = divmod(number - 1, 26)
        letters = chr(ord("A") + remainder) + letters
    return letters


# --------------------------------------------------------------------------- known originals


class KnownOriginals:
    """An immutable set of originals (value -> category) that can be searched for quickly.

    A text is searched by its alphanumeric runs: a value is a candidate only where its first
    run occurs, and a hit needs the whole value there, not followed by another letter or digit
    (so the contact "Wang Li" is not found inside "Wang Lifen"). A set intersection rules out
    most texts before any position is examined.
    """

    __slots__ = ("_by_first_run", "_categories")

    def __init__(self, originals: Mapping[str, str]) -> None:
        self._categories: Mapping[str, str] = MappingProxyType(dict(originals))
        by_first_run: dict[str, list[tuple[str, int]]] = {}
        for value in self._categories:
            run = _ALNUM_RUN.search(value)
            if run is None:
                raise ValueError(
                    f"a known original must contain a letter or digit, got {len(value)} "
                    "characters without one"
                )
            by_first_run.setdefault(run.group(0), []).append((value, run.start()))
        self._by_first_run: Mapping[str, tuple[tuple[str, int], ...]] = MappingProxyType(
            {
                key: tuple(sorted(items, key=lambda item: -len(item[0])))
                for key, items in by_first_run.items()
            }
        )

    def __len__(self) -> int:
        return len(self._categories)

    def __contains__(self, value: object) -> bool:
        return value in self._categories

    def category_of(self, value: str) -> str:
        return self._categories[value]

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """``(start, end, category)`` of every occurrence of a known original in ``text``."""
        present = set(_ALNUM_RUN.findall(text)) & self._by_first_run.keys()
        if not present:
            return []
        runs = re.compile(
            r"(?<![A-Za-z0-9])(?:"
            + "|".join(re.escape(run) for run in sorted(present, key=len, reverse=True))
            + r")(?![A-Za-z0-9])"
        )
        hits: list[tuple[int, int, str]] = []
        for run in runs.finditer(text):
            for value, offset in self._by_first_run[run.group(0)]:
                start = run.start() - offset
                end = start + len(value)
                if start < 0 or not text.startswith(value, start):
                    continue
                if value[-1].isalnum() and end < len(text) and text[end].isalnum():
                    continue
                hits.append((start, end, self._categories[value]))
                break
        return hits


@dataclass(frozen=True, slots=True, kw_only=True)
class LeakGate:
    """The originals the gate sweeps for, from two sources kept apart.

    ``ground_truth``: every sensitive value the corpus generator planted in the loaded tasks
    (independent of the redaction rules). ``learned``: every original the redactor detected
    (``Redactor.known_originals``). A hit from either is residue; neither set is ever
    printed.
    """

    ground_truth: KnownOriginals
    learned: KnownOriginals

    def __contains__(self, value: object) -> bool:
        return value in self.ground_truth or value in self.learned

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """``(start, end, category)`` of every occurrence of an original of either set."""
        return [*self.ground_truth.find(text), *self.learned.find(text)]


# --------------------------------------------------------------------------- redactor


@dataclass(frozen=True, slots=True, kw_only=True)
class Redaction:
    """The result of ``Redactor.redact``: the pseudonymised ``text``, how many replacements
    were made per category (``counts``) and how many distinct originals they covered
    (``distinct``). Both mappings have every category of ``REDACTION_CATEGORIES`` as a key."""

    text: str
    counts: Mapping[str, int]
    distinct: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Redactor:
    """Replaces sensitive values by stable aliases, in memory.

    One instance gives one alias per distinct original across every text it sees, so an
    organisation named in two documents (or two tasks) is the same "Example Company C" in
    both; a model reading them meets the same entities the original text has. Call ``learn``
    on every text first when a value may appear unlabelled in one text before it appears
    labelled in another (``redact`` also learns, but cannot go back to texts it already
    returned). ``restore`` maps aliases back (the round trip is exact for texts that contain
    no ``Example <Kind> <LETTERS>`` phrase of their own).
    """

    __slots__ = ("_alias_of", "_category_of", "_known", "_next_label", "_original_of")

    def __init__(self) -> None:
        self._alias_of: dict[str, str] = {}
        self._original_of: dict[str, str] = {}
        self._category_of: dict[str, str] = {}
        self._next_label: Counter[str] = Counter()
        self._known: KnownOriginals | None = None

    def __repr__(self) -> str:
        return f"Redactor(<{len(self._alias_of)} originals>)"

    def _alias_for(self, value: str, category: str) -> str:
        alias = self._alias_of.get(value)
        if alias is None:
            alias = f"Example {_ALIAS_KIND[category]} {_label(self._next_label[category])}"
            self._next_label[category] += 1
            self._alias_of[value] = alias
            self._original_of[alias] = value
            self._category_of[value] = category
            self._known = None
        return alias

    def learn(self, text: str) -> None:
        """Register every value the rules detect in ``text``, without producing output."""
        self._learn_spans(_mask_aliases(text))

    def _learn_spans(self, masked: str) -> list[tuple[int, int, str]]:
        spans = _rule_spans(masked)
        for start, end, category in spans:
            self._alias_for(masked[start:end], category)
        return spans

    def known_originals(self) -> KnownOriginals:
        """A snapshot of every original seen so far (for ``assert_no_residue``)."""
        if self._known is None:
            self._known = KnownOriginals(self._category_of)
        return self._known

    def alias_of(self, value: str) -> str | None:
        """The alias of an original, or ``None`` if this redactor never saw it."""
        return self._alias_of.get(value)

    def redact(self, text: str) -> Redaction:
        """``text`` with every detected or known original replaced by its alias."""
        masked = _mask_aliases(text)
        rule_spans = self._learn_spans(masked)
        spans = _non_overlapping([*rule_spans, *self.known_originals().find(masked)])
        counts: Counter[str] = Counter()
        distinct: dict[str, set[str]] = {}
        pieces: list[str] = []
        position = 0
        for start, end, category in spans:
            value = masked[start:end]
            # A known original keeps the category it was learned with, whatever found it now.
            category = self._category_of.get(value, category)
            pieces.append(text[position:start])
            pieces.append(self._alias_for(value, category))
            counts[category] += 1
            distinct.setdefault(category, set()).add(value)
            position = end
        pieces.append(text[position:])
        return Redaction(
            text="".join(pieces),
            counts=MappingProxyType({c: counts[c] for c in REDACTION_CATEGORIES}),
            distinct=MappingProxyType({c: len(distinct.get(c, ())) for c in REDACTION_CATEGORIES}),
        )

    def restore(self, text: str) -> str:
        """Aliases of this redactor back to their originals; anything else is unchanged."""
        return ALIAS_PATTERN.sub(
            lambda match: self._original_of.get(match.group(0), match.group(0)), text
        )


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidueHit:
    """Where un-pseudonymised text was found. Deliberately without the text itself."""

    category: str
    offset: int
    length: int


class RedactionResidueError(RuntimeError):
    """The leak gate found original sensitive text where only pseudonymised text may be.

    Raised before the text goes anywhere (a prompt, a run log). The message and ``hits`` give
    the place, the category and the length of each finding, never the text: an error message
    travels into logs and reports, so printing the residue would be the very leak the gate
    exists to stop.
    """

    def __init__(self, *, where: str, hits: tuple[ResidueHit, ...]) -> None:
        self.where = where
        self.hits = hits
        per_category = Counter(hit.category for hit in hits)
        summary = ", ".join(f"{n} {category}" for category, n in sorted(per_category.items()))
        first = hits[0]
        super().__init__(
            f"{where}: the leak gate found {len(hits)} un-pseudonymised value(s) ({summary}); "
            f"the first is a {first.category} of {first.length} characters at offset "
            f"{first.offset} (shown masked: {'*' * min(first.length, 16)}). Nothing was sent. "
            "Fix the redaction rules or the source of this text; never bypass the gate"
        )


def assert_no_residue(
    text: str, *, where: str, known: KnownOriginals | LeakGate | None = None
) -> None:
    """Raise ``RedactionResidueError`` if ``text`` still holds sensitive values.

    Checks, on ``text`` with aliases masked: every detection rule of ``RULES`` (anything that
    looks like an organisation name, a labelled contact name, a phone number, an e-mail
    address or a credit code is residue), and, when ``known`` is given, every original it
    holds (found wherever it stands, labelled or not). Only a ``LeakGate`` with the
    generator's ground truth makes the check independent of the rules (see the module
    docstring). ``where`` names the text in the error (a document id, "observation of
    grep_document", "context message 1").
    """
    if not isinstance(text, str):
        raise TypeError(
            f"assert_no_residue({where}): text must be a str, got {type(text).__name__}"
        )
    masked = _mask_aliases(text)
    spans = _rule_spans(masked)
    if known is not None:
        spans.extend(known.find(masked))
    if spans:
        hits = tuple(
            ResidueHit(category=category, offset=start, length=end - start)
            for start, end, category in _non_overlapping(spans)
        )
        raise RedactionResidueError(where=where, hits=hits)
