"""What a person reads cannot be forged: log text made visible before it is shown (issue 22,
item 6; design 0180).

A log holds what tools, web pages and models wrote, and the inspector prints it to a terminal.
Printed raw, ``ESC[2J`` clears the operator's screen, ``ESC]0;...BEL`` retitles the window, a
carriage return or a backspace overwrites what a line said, and a bidi override (U+202E)
shows text in another order than it has. So every text taken from a log is passed through
``visible`` (``visible_json`` for ``--json``) before it is printed, and ``main`` writes
through ``VisibleStream``, which applies ``visible`` once more to everything, as a last guard.

The rule. A character is *hidden* when its Unicode general category is

* ``Cc``: the C0 controls U+0000-U+001F (ESC, CR, BEL, BS, NUL, TAB, LF, ...), DEL U+007F and
  the C1 controls U+0080-U+009F (CSI U+009B, OSC U+009D, NEL U+0085, ...);
* ``Cf``: format characters, which are invisible or reorder text: the bidi embeddings,
  overrides and isolates (U+202A-U+202E, U+2066-U+2069), the bidi marks (U+200E, U+200F,
  U+061C), the zero-width space, joiners and word joiner (U+200B-U+200D, U+2060), the byte
  order mark U+FEFF, the soft hyphen U+00AD, the tag characters U+E0000-U+E007F;
* ``Zl`` and ``Zp``: U+2028 and U+2029, which some renderers break lines at;
* ``Cs``: a lone surrogate (a log can hold one; a UTF-8 terminal cannot even be sent it).

``visible`` writes each hidden character as an escape, in Python's notation: ``\\t``, ``\\n``,
``\\r`` by name, any other as ``\\xHH`` (up to U+00FF), ``\\uHHHH`` or ``\\UHHHHHHHH``, hex in
lower case. ESC is the four characters ``\\x1b``, U+202E the six characters ``\\u202e``. Every
other character, and every backslash, is left as it is: so ``visible`` returns printable text
unchanged, JSON arguments keep their own escapes readable (``{"path": "C:\\\\tmp"}``), and the
only ambiguity left is that a text which literally spells an escape (the four characters
``\\x1b``) prints like the character itself. Where that matters, the transcript says how many
characters of a text were escaped (``count_hidden``), and the log itself holds the exact text.

Two exceptions, both layout. ``newlines=True`` keeps ``\\n`` in the multi-line texts that
``show`` and ``diff`` print as indented blocks, and in the HTML page; everywhere else (run
ids, names, one-line fields, the cells of ``ls``) a newline is escaped too, so a text cannot
start a line of its own. ``tabs=True`` keeps tabs; only the HTML page asks for it (a browser
lays a tab out inside its ``<pre>``). On a terminal a tab is escaped: its width depends on the
column and the terminal's tab stops, so it would make ``--width`` and the indentation lie.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Final, Protocol

__all__ = [
    "HIDDEN_CATEGORIES",
    "VisibleStream",
    "Writer",
    "count_hidden",
    "escape",
    "is_hidden",
    "visible",
    "visible_json",
]

HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""The Unicode general categories whose characters ``visible`` escapes (see the module)."""

_NAMED: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_SUSPECT: Final = re.compile(r"[^ -~]")
"""Every character but printable ASCII: the only ones that can be hidden (and most are not)."""


def is_hidden(char: str) -> bool:
    """Whether the one character ``char`` is a control, format or separator character (or a
    lone surrogate) that ``visible`` escapes."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def escape(char: str) -> str:
    """The escape ``visible`` writes for ``char``: ``\\t``, ``\\n``, ``\\r``, or ``\\xHH``,
    ``\\uHHHH``, ``\\UHHHHHHHH`` (lower-case hex)."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escaped(match: re.Match[str]) -> str:
    char = match[0]
    return escape(char) if is_hidden(char) else char


def _escaped_but_tabs(match: re.Match[str]) -> str:
    char = match[0]
    return escape(char) if char != "\t" and is_hidden(char) else char


def _visible_line(text: str, tabs: bool) -> str:
    if text.isprintable():  # the common case, at C speed: nothing hidden
        return text
    return _SUSPECT.sub(_escaped_but_tabs if tabs else _escaped, text)


def visible(text: str, *, newlines: bool = False, tabs: bool = False) -> str:
    """``text`` with every hidden character written as its escape (see the module docstring);
    ``newlines`` keeps ``\\n`` and ``tabs`` keeps ``\\t`` as they are. Printable text is
    returned unchanged."""
    if not newlines:
        return _visible_line(text, tabs)
    return "\n".join(_visible_line(line, tabs) for line in text.split("\n"))


def count_hidden(text: str, *, newlines: bool = False, tabs: bool = False) -> int:
    """How many characters of ``text`` ``visible`` escapes (with the same options)."""
    lines = text.split("\n") if newlines else [text]
    return sum(
        1
        for line in lines
        if not line.isprintable()
        for char in _SUSPECT.findall(line)
        if not (tabs and char == "\t") and is_hidden(char)
    )


def _json_escape(match: re.Match[str]) -> str:
    char = match[0]
    if char == "\n" or not is_hidden(char):
        return char
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def visible_json(value: object, *, indent: int | None = 2) -> str:
    """``json.dumps(value, indent=indent, ensure_ascii=False)``, with every hidden character
    that it leaves raw written as its JSON ``\\u`` escape instead.

    ``json.dumps`` escapes U+0000-U+001F in strings, but with ``ensure_ascii=False`` it leaves
    DEL, the C1 controls, the bidi characters, U+2028/U+2029 and lone surrogates raw. Written
    as escapes, they decode to the very same value, so a program reading the output gets the
    exact text, and a terminal showing it gets no control character. Other non-ASCII text stays
    readable. The only newlines left are the layout's (``indent``). (A high surrogate right
    before a low one reads back as the one character the pair spells, as from any JSON.)
    """
    return _SUSPECT.sub(_json_escape, json.dumps(value, indent=indent, ensure_ascii=False))


class Writer(Protocol):
    """Where the command line prints: a text stream, or a ``VisibleStream`` around one."""

    def write(self, text: str, /) -> int: ...


class VisibleStream:
    """A text stream that writes ``visible(text, newlines=True)`` to ``stream``: the last guard,
    so that a text a renderer forgot to make visible still reaches the terminal without a
    control character (its newlines are kept: a renderer's own escaping keeps them in place)."""

    def __init__(self, stream: Writer) -> None:
        self._stream = stream

    def write(self, text: str, /) -> int:
        self._stream.write(visible(text, newlines=True))
        return len(text)
