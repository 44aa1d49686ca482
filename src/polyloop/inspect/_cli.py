"""The command line of ``python -m polyloop``: argument parsing, exit statuses, error lines
(``fork`` and ``replay`` are ``polyloop.inspect._replaying``'s).

Everything a command prints is made visible (``polyloop.inspect._safe``): the renderers escape
each text from a log, the one-line messages here (errors, unreadable logs) are escaped too, and
``main`` writes through ``VisibleStream``, so a control character that a renderer let through
still never reaches the terminal raw (issue 22, item 6; design 0180).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, NoReturn, TextIO

from polyloop.errors import InspectError, PolyloopTypeError, PolyloopValueError
from polyloop.inspect._approvals import (
    add_approval_parsers,
    cmd_approvals,
    cmd_approve,
    cmd_reject,
)
from polyloop.inspect._load import Loaded, display_target, load_target
from polyloop.inspect._replaying import add_fork_replay_parsers, cmd_fork, cmd_replay
from polyloop.inspect._resolve import add_resolve_parser, cmd_resolve
from polyloop.inspect._safe import VisibleStream, Writer, visible
from polyloop.inspect._text import (
    diff_runs,
    ls_json,
    ls_lines,
    render_diff,
    render_show,
    tree_view_lines,
)
from polyloop.inspect._units import plural
from polyloop.inspect._verify import tree_breaches, verify_target
from polyloop.inspect._view import RunView, priced_run
from polyloop.session import Pricing
from polyloop.types import StopReason

__all__ = ["EXIT_BAD_INPUT", "EXIT_FINDING", "EXIT_OK", "main"]

EXIT_OK: Final = 0
EXIT_FINDING: Final = 1
"""``verify`` found a breach, ``diff`` found a difference, or a directory held unreadable logs."""
EXIT_BAD_INPUT: Final = 2
"""Bad input (a missing file, a corrupt line, an empty directory, an unknown URL) or usage."""

DEFAULT_WIDTH: Final = 400

_TARGET_HELP = (
    "a <run_id>.jsonl log, a directory of logs (and of directories of logs, read to any "
    "depth), or a store URL (jsonl:///path/to/runs, postgresql://user@host:port/dbname; the "
    "password from PGPASSWORD or ~/.pgpass)"
)
_TARGETS_HELP = f"one or more places, each {_TARGET_HELP}"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is an ``InspectError``: one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise InspectError(f"{message} (see {self.prog} --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m polyloop",
        description="Look at what a run did: its log as a transcript, a list, a check, a "
        "comparison or a static HTML page; list the calls waiting for approval; decide "
        "(resolve what a run is in doubt about, approve or reject a call: the commands that "
        "write, one decision record each); fork a run from a step; replay recorded runs "
        "through an agent's settings, offline. Reads logs written by JsonlRunStore, and the "
        "runs of a PostgresRunStore (a postgres:// URL; needs the postgres extra); needs "
        "nothing else but the standard library.",
        epilog="Exit status: 0 fine; 1 a breach (verify), a difference (diff), a divergence "
        "(replay) or unreadable logs in a directory; 2 bad input, a bad command line, or a "
        "refused resolve, approve, reject or fork.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    show = commands.add_parser("show", help="one run as a readable transcript")
    show.add_argument("target", help=_TARGET_HELP)
    show.add_argument("--run", help="the run id to show when the target holds several runs")
    show.add_argument(
        "--full", action="store_true", help="show every text in full and every snapshot key"
    )
    show.add_argument(
        "--tree",
        action="store_true",
        help="also print the tree of runs under this one (a directory or store holding them): "
        "each run's stop reason, steps, and its subtree's steps and tokens",
    )
    show.add_argument(
        "--width",
        type=int,
        default=DEFAULT_WIDTH,
        help=f"characters shown per text field before it is cut (default {DEFAULT_WIDTH})",
    )

    ls = commands.add_parser("ls", help="one line per run")
    ls.add_argument("targets", nargs="+", metavar="target", help=_TARGETS_HELP)
    ls.add_argument(
        "--stop-reason",
        choices=[reason.value for reason in StopReason],
        help="only runs that stopped for this reason",
    )
    ls.add_argument("--unfinished", action="store_true", help="only runs without a finish")
    ls.add_argument(
        "--roots",
        action="store_true",
        help="only runs that are no run's child (the roots of trees of runs, and lone runs)",
    )
    ls.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    for command in (show, ls):
        _add_pricing(command)

    verify = commands.add_parser(
        "verify", help="decode every log and check its structure (exit 1 on a breach)"
    )
    verify.add_argument("targets", nargs="+", metavar="target", help=_TARGETS_HELP)
    verify.add_argument(
        "--quiet", action="store_true", help="print only the breaches and the summary"
    )

    diff = commands.add_parser("diff", help="where two runs diverge first")
    diff.add_argument("left", help="the first run's log (or a target holding one run)")
    diff.add_argument("right", help="the second run's log (or a target holding one run)")
    diff.add_argument("--full", action="store_true", help="show the differing texts in full")

    html = commands.add_parser("html", help="one self-contained static HTML viewer")
    html.add_argument("target", help=_TARGET_HELP)
    html.add_argument("-o", "--output", required=True, type=Path, help="the HTML file to write")
    _add_pricing(html)

    add_resolve_parser(commands)
    add_approval_parsers(commands)
    add_fork_replay_parsers(commands)
    return parser


def _add_pricing(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--pricing",
        type=Path,
        help="prices per million tokens (a JSON or TOML file, as polyloop.Pricing.from_file "
        "reads) for the steps that recorded no cost: logs older than schema 1.9, runs "
        "without pricing (design 0236)",
    )


def _priced(views: Sequence[RunView], pricing: Path | None) -> list[RunView]:
    """``views`` with their unrecorded costs computed at ``--pricing`` (``priced_run``)."""
    if pricing is None:
        return list(views)
    try:
        prices = Pricing.from_file(pricing)
    except (OSError, PolyloopTypeError, PolyloopValueError) as exc:
        raise InspectError(f"--pricing {pricing}: {exc}") from exc
    return [priced_run(view, prices) for view in views]


def _one_run(target: str, run_id: str | None) -> RunView:
    loaded = load_target(target, run_id=run_id)
    runs = loaded.runs
    target = display_target(target)  # what the messages below print: no password
    if run_id is not None:
        runs = tuple(view for view in runs if run_id in (view.run_id, Path(view.source).stem))
        if len(runs) > 1:
            sources = ", ".join(view.source for view in runs)
            raise InspectError(f"{target}: {len(runs)} logs hold run {run_id!r} ({sources})")
        if not runs:
            problem = next((u for u in loaded.unreadable if Path(u.source).stem == run_id), None)
            if problem is not None:
                raise InspectError(problem.message)
            raise InspectError(f"{target}: holds no run {run_id!r}")
    elif len(runs) + len(loaded.unreadable) > 1:
        raise InspectError(
            f"{target}: holds {len(runs) + len(loaded.unreadable)} runs; name one with --run "
            "RUN_ID, or pass its .jsonl file"
        )
    elif loaded.unreadable:
        raise InspectError(loaded.unreadable[0].message)
    return runs[0]


def _report_unreadable(loaded: Loaded, err: Writer) -> int:
    for problem in loaded.unreadable:
        print(visible(f"polyloop: unreadable log: {problem.message}"), file=err)
    return EXIT_FINDING if loaded.unreadable else EXIT_OK


def _cmd_show(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    del err
    if args.width < 1:
        raise InspectError(f"--width must be a positive number of characters, got {args.width}")
    (view,) = _priced([_one_run(args.target, args.run)], args.pricing)
    print(render_show(view, full=args.full, limit=None if args.full else args.width), file=out)
    if args.tree:
        print("", file=out)
        print("tree:", file=out)
        for line in tree_view_lines(load_target(args.target).runs, view.run_id):
            print(visible(f"  {line}"), file=out)
    return EXIT_OK


def _load_all(targets: Sequence[str]) -> Loaded:
    """Every target's runs and unreadable logs, in the order the targets were named."""
    parts = [load_target(target) for target in targets]
    return Loaded(
        runs=tuple(view for part in parts for view in part.runs),
        unreadable=tuple(problem for part in parts for problem in part.unreadable),
    )


def _cmd_ls(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    loaded = _load_all(args.targets)
    views = _priced(loaded.runs, args.pricing)
    if args.stop_reason is not None:
        views = [view for view in views if view.stop_reason == args.stop_reason]
    if args.unfinished:
        views = [view for view in views if not view.finished]
    if args.roots:
        views = [v for v in views if v.log.started is None or v.log.started.parent is None]
    if args.json:
        print(ls_json(views), file=out)
    else:
        for line in ls_lines(views):
            print(line, file=out)
    return _report_unreadable(loaded, err)


def _cmd_verify(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    del err
    verdicts = [verdict for target in args.targets for verdict in verify_target(target)]
    for verdict in verdicts:
        if not (args.quiet and verdict.ok):
            print(verdict.describe(), file=out)
    breached = sum(1 for verdict in verdicts if not verdict.ok)
    links = tree_breaches(verdicts)
    for problem in links:
        print(visible(f"BREACH  tree: {problem}"), file=out)
    tail = f", {plural(len(links), 'broken link')} between runs" if links else ""
    print(f"verified {plural(len(verdicts), 'log')}: {breached} breached{tail}", file=out)
    return EXIT_FINDING if breached or links else EXIT_OK


def _cmd_diff(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    del err
    left, right = _one_run(args.left, None), _one_run(args.right, None)
    found = diff_runs(left, right)
    print(render_diff(left, right, found, None if args.full else DEFAULT_WIDTH), file=out)
    return EXIT_OK if found.identical else EXIT_FINDING


def _cmd_html(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    from polyloop.inspect._html import render_html

    loaded = load_target(args.target)
    page = render_html(_priced(loaded.runs, args.pricing), unreadable=loaded.unreadable)
    try:
        args.output.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise InspectError(
            f"{args.output}: cannot be written ({exc.strerror or type(exc).__name__})"
        ) from exc
    print(visible(f"wrote {args.output} ({plural(len(loaded.runs), 'run')})"), file=out)
    return _report_unreadable(loaded, err)


_COMMANDS: Final[dict[str, Callable[[argparse.Namespace, Writer, Writer], int]]] = {
    "show": _cmd_show,
    "ls": _cmd_ls,
    "verify": _cmd_verify,
    "diff": _cmd_diff,
    "html": _cmd_html,
    "resolve": cmd_resolve,
    "approvals": cmd_approvals,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "fork": cmd_fork,
    "replay": cmd_replay,
}


def _error_line(text: str) -> str:
    """An error message as one visible line: its control characters escaped (a path or a
    value it quotes may hold them), then its newlines and runs of spaces made one space."""
    return " ".join(visible(text, newlines=True).split())


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run the command line; return the exit status (never raises ``InspectError``).

    What it prints to ``out`` and ``err`` holds no control character but the newlines of its
    layout: every text from a log is made visible (``polyloop.inspect._safe``).
    """
    shown = VisibleStream(sys.stdout if out is None else out)
    problems = VisibleStream(sys.stderr if err is None else err)
    try:
        args = _parser().parse_args(argv)
    except InspectError as exc:
        print(f"python -m polyloop: {_error_line(str(exc))}", file=problems)
        return EXIT_BAD_INPUT
    try:
        return _COMMANDS[args.command](args, shown, problems)
    except InspectError as exc:
        print(f"polyloop {args.command}: {_error_line(str(exc))}", file=problems)
        return EXIT_BAD_INPUT
