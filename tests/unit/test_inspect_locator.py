"""The inspector's one store locator (design 0222): every verb of ``python -m polyloop`` finds
its runs through one row of ``polyloop.inspect._locator.LOCATORS``, keyed by scheme.

Each row here is wrapped (or replaced) by a spy that records what the verbs ask of it: the
directory row (the real one, wrapped), the ``postgres://`` and ``postgresql://`` rows
(replaced by a place that serves a ``JsonlRunStore``'s directory under the URL's name: no
server here; ``tests/integration/test_postgres_listing.py`` and ``test_postgres_decisions.py``
run the real row against a real one), and a scheme no polyloop ships (``shelf://``), added as
one more row: a future store is one row of the table, and every verb reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import shlex
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import MappingProxyType

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.inspect import EXIT_BAD_INPUT, EXIT_OK, main
from polyloop.inspect import _locator as locator
from polyloop.inspect._locator import Locator, Place, RunPlace, StoredLog
from polyloop.inspect._view import RunView, approval_command_lines
from polyloop.ports import RunStore
from polyloop.session import run
from polyloop.stores import JsonlRunStore
from polyloop.tools import ToolRegistry, ToolSpec
from polyloop.types import StopReason

pytestmark = pytest.mark.unit

SECRET = "pa55-w0rd"


def _stage(directory: Path) -> str:
    """One run (``run-1``) waiting for approval of a call, written by a real ``JsonlRunStore``;
    the call's digest."""

    async def refund(amount: int) -> str:
        """Refund money."""
        return f"refunded {amount}"

    script = ["tool:refund " + json.dumps({"amount": 250}), "final:done"]
    spec = ToolSpec.from_function(refund, needs_approval=True)
    agent = definition(ScriptedModel(script), store=JsonlRunStore(directory=directory))
    result = asyncio.run(run(agent, request("run-1", tools=ToolRegistry([spec]))))
    assert result.stop_reason is StopReason.AWAITING_APPROVAL
    assert result.pending_approval is not None
    return result.pending_approval.digest


@contextlib.asynccontextmanager
async def _jsonl(directory: Path) -> AsyncIterator[RunStore]:
    yield JsonlRunStore(directory=directory)


@dataclasses.dataclass
class Shelf:
    """A store with a URL form that no polyloop ships: its runs are kept in ``directory`` by a
    ``JsonlRunStore``, and it names them by its URL with ``--run-id``, as a database does."""

    name: str
    directory: Path

    @property
    def shown(self) -> str:
        return self.name

    @property
    def several(self) -> bool:
        return True

    def logs(self, run_id: str | None) -> Sequence[StoredLog]:
        return [
            StoredLog(run_id=file.stem, source=f"{self.name}/{file.stem}", read=file.read_bytes)
            for file in sorted(self.directory.glob("*.jsonl"))
            if run_id in (None, file.stem)
        ]

    def hints(self, view: RunView) -> RunView:
        if view.awaiting is None:
            return view
        words = f"{shlex.quote(self.name)} --run-id {view.run_id}"
        commands = approval_command_lines(words, view.awaiting.request.digest)
        awaiting = dataclasses.replace(view.awaiting, commands=commands, note="")
        return dataclasses.replace(view, awaiting=awaiting)

    def run(self, run_id: str | None) -> RunPlace:
        assert run_id is not None
        quoted = shlex.quote(self.name)
        return RunPlace(
            run_id=run_id,
            where=self.name,
            target=quoted,
            show=f"{quoted} --run {run_id}",
            opener=lambda: _jsonl(self.directory),
        )


@dataclasses.dataclass
class Spy:
    """A place that records what a verb asks of the one it wraps."""

    inner: Place
    calls: list[str]

    @property
    def shown(self) -> str:
        self.calls.append("shown")
        return self.inner.shown

    @property
    def several(self) -> bool:
        return self.inner.several

    def logs(self, run_id: str | None) -> Sequence[StoredLog]:
        self.calls.append("logs")
        return self.inner.logs(run_id)

    def hints(self, view: RunView) -> RunView:
        self.calls.append("hints")
        return self.inner.hints(view)

    def run(self, run_id: str | None) -> RunPlace:
        self.calls.append("run")
        place = self.inner.run(run_id)
        opener = place.opener

        def opened() -> AbstractAsyncContextManager[RunStore]:
            self.calls.append("store")
            return opener()

        return dataclasses.replace(place, opener=opened)


@dataclasses.dataclass
class Table:
    """What each row was asked, by scheme, since the last ``take``."""

    calls: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def row(self, scheme: str, open_: Callable[[str], Place]) -> Locator:
        def opened(target: str) -> Place:
            calls = self.calls.setdefault(scheme, [])
            calls.append("open")
            return Spy(open_(target), calls)

        return Locator(open=opened, through="a test")

    def take(self) -> dict[str, set[str]]:
        taken = {scheme: set(calls) for scheme, calls in self.calls.items()}
        self.calls.clear()
        return taken


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    assert SECRET not in out.getvalue() + err.getvalue()
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[Table]:
    """``LOCATORS`` with its directory row wrapped and its ``postgres``/``postgresql`` rows
    and a ``shelf`` row serving ``Shelf``s; each directory a URL names is in ``shelves``."""
    spies = Table()
    rows = dict(locator.LOCATORS)
    real_path = rows[""].open
    assert real_path is not None
    rows[""] = spies.row("", real_path)
    for scheme in ("postgres", "postgresql", "shelf"):
        rows[scheme] = spies.row(scheme, lambda url: Shelf(_name(url), SHELVES[url]))
    monkeypatch.setattr(locator, "LOCATORS", MappingProxyType(rows))
    yield spies
    SHELVES.clear()


SHELVES: dict[str, Path] = {}


def _name(url: str) -> str:
    """A URL as its row names it: without the password (as ``display_url`` does)."""
    return url.replace(f":{SECRET}@", "@")


@pytest.mark.parametrize(
    ("scheme", "url"),
    [
        ("", None),
        ("postgres", f"postgres://me:{SECRET}@db.invalid/runs"),
        ("postgresql", f"postgresql://me:{SECRET}@db.invalid:5432/runs"),
        ("shelf", f"shelf://me:{SECRET}@somewhere/runs"),
    ],
)
def test_every_verb_goes_through_the_row_of_its_targets_scheme(
    tmp_path: Path, table: Table, scheme: str, url: str | None
) -> None:
    digest = _stage(tmp_path)
    target = str(tmp_path) if url is None else url
    if url is not None:
        SHELVES[url] = tmp_path
    shown = target if url is None else _name(url)
    # The words that name run-1 in a printed command: its log file, or the URL and --run-id.
    names = shlex.quote(str(tmp_path / "run-1.jsonl")) if url is None else f"{shown} --run-id run-1"
    approve = f"python -m polyloop approve {names} --digest {digest} --by NAME"

    code, out, _ = _cli("ls", target)
    assert (code, "run-1" in out) == (EXIT_OK, True)
    assert table.take() == {scheme: {"open", "logs", "hints"}}

    code, out, _ = _cli("show", target)
    assert (code, approve in out) == (EXIT_OK, True)
    assert table.take() == {scheme: {"open", "logs", "hints", "shown"}}

    code, out, _ = _cli("verify", target)
    assert (code, out.splitlines()[-1]) == (EXIT_OK, "verified 1 log: 0 breached")
    assert table.take() == {scheme: {"open", "logs"}}

    code, out, _ = _cli("diff", target, target)
    assert code == EXIT_OK
    assert table.take() == {scheme: {"open", "logs", "hints", "shown"}}

    page = tmp_path.parent / f"{tmp_path.name}.html"
    code, out, _ = _cli("html", target, "-o", str(page))
    assert (code, "run-1" in page.read_text(encoding="utf-8")) == (EXIT_OK, True)
    assert table.take() == {scheme: {"open", "logs", "hints"}}

    code, out, _ = _cli("approvals", target)
    assert code == EXIT_OK
    assert f"  approve: {approve}" in out.splitlines()
    assert out.splitlines()[-1] == f"1 call waits for approval in {shown}"
    assert table.take() == {scheme: {"open", "logs", "hints", "shown"}}

    by = ["--by", "me", "--run-id", "run-1"]
    code, _, err = _cli("resolve", target, "--result-id", "a0", "--not-executed", *by)
    assert (code, "refused [nothing_in_doubt]" in err) == (EXIT_BAD_INPUT, True), err
    assert table.take() == {scheme: {"open", "run", "store"}}

    code, out, _ = _cli("approve", target, "--digest", digest, *by)
    assert (code, out.startswith("recorded: run 'run-1'")) == (EXIT_OK, True)
    assert table.take() == {scheme: {"open", "run", "store"}}

    code, _, err = _cli("reject", target, "--digest", digest, "--reason", "no", *by)
    assert (code, "refused [conflicting_decision]" in err) == (EXIT_BAD_INPUT, True), err
    shows = shlex.quote(str(tmp_path / "run-1.jsonl")) if url is None else f"{shown} --run run-1"
    assert f"python -m polyloop show {shows} shows it" in err  # the row's words for the run
    assert table.take() == {scheme: {"open", "run", "store"}}


def test_a_scheme_without_a_row_is_refused_and_a_new_row_is_listed(table: Table) -> None:
    """The refusal lists what the table reads, so the row just added is named there too."""
    code, out, err = _cli("ls", f"nowhere://me:{SECRET}@h/db")
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert "unknown store URL scheme 'nowhere'" in err
    assert "shelf://, read through a test" in err
    assert "jsonl://" in err
    assert table.take() == {}
