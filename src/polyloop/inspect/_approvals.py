"""``approvals``, ``approve`` and ``reject``: where a person looks at, and decides on, the calls
that wait for approval (issue 22, item 5; design 0210).

``python -m polyloop approvals DIR|URL|LOG [--json]`` lists every call waiting for a decision
(a run whose plan is ``AWAITING_APPROVAL``): the run id, the tool, the canonical arguments
exactly as digested (made visible: a log can hold escape sequences, and a person is about to
approve from this output; ``--json`` gives the exact text), the digest, when it was asked and
until when, and the two commands that decide it. Nothing else is printed under the arguments'
name. A request in a child run of a tree (design 0245) also shows its tree path, from the
root down (``tree: root > root.a1 > root.a1.a1``; ``tree_path`` in ``--json``): approve or
reject it in the child, then resume the root, which re-attaches down to it. It reads what
``load_target`` reads (JSONL logs, ``jsonl://``, a ``postgres://`` URL).

``python -m polyloop approve LOG --digest D --by NAME [--note TEXT]`` and ``reject LOG --digest
D --by NAME --reason TEXT`` (both with ``--run-id RUN`` and ``--lease-wait SECONDS``; ``LOG`` a
log, a directory, or a ``postgres://`` URL with ``--run-id``) open the store that keeps the
run (``_resolve.locate_run``) and call ``polyloop.session.approve``/``reject``: one
``Settlement`` record under the run's lease, bound to the call's digest. They print one line
(what was recorded, what to do next). A refusal (``ResolutionError.reason``, a held lease, a
corrupt log) is one line naming the reason and the fix, exit status 2, nothing written: the
same path as ``resolve`` (``write_decision``).
"""

from __future__ import annotations

import argparse
from typing import Final, TypeVar

from polyloop.errors import InspectError
from polyloop.inspect._load import display_target, load_target
from polyloop.inspect._resolve import (
    LOG_HELP,
    RUN_ID_HELP,
    check_lease_wait,
    locate_run,
    write_decision,
)
from polyloop.inspect._safe import Writer, visible, visible_json
from polyloop.inspect._text import approval_lines
from polyloop.inspect._view import RunView
from polyloop.ports import RunStore
from polyloop.session import approve, reject
from polyloop.types import Settlement, SettlementVerdict

__all__ = ["add_approval_parsers", "cmd_approvals", "cmd_approve", "cmd_reject"]

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

_LIST: Final = "python -m polyloop approvals {where}"

_FIXES: Final[dict[str, str]] = {
    "no_log": "check the run id: python -m polyloop ls {where} lists the runs there",
    "not_awaiting": (
        "there is nothing to decide; " + _LIST + " lists the calls that wait, python -m "
        "polyloop show {log} says what resume will do"
    ),
    "wrong_digest": "pass the digest that " + _LIST + " prints for this run",
    "conflicting_decision": (
        "a decision is final; python -m polyloop show {log} shows it, and resume acts on it"
    ),
    "expired": (
        "nothing can approve it any more: resume the run with its agent "
        "(polyloop.session.run_or_resume), which records it rejected as expired"
    ),
    "store_cannot_settle": "use a store that has write_settlement (the shipped ones do)",
}


def _decision_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "log",
        metavar="LOG",
        help=LOG_HELP,
    )
    cmd.add_argument(
        "--digest",
        required=True,
        metavar="D",
        help="the digest of the call (python -m polyloop approvals prints it): the decision "
        "binds to exactly that call",
    )
    cmd.add_argument(
        "--by", required=True, metavar="NAME", help="who decides (recorded with the decision)"
    )


def _common_tail(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--run-id", metavar="RUN", help=RUN_ID_HELP)
    cmd.add_argument(
        "--lease-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long to wait for the run's lease when another process holds it (default 0)",
    )


def add_approval_parsers(commands: argparse._SubParsersAction[_Parser]) -> None:
    """Add the ``approvals``, ``approve`` and ``reject`` subcommands to ``commands``."""
    listing = commands.add_parser(
        "approvals",
        help="the calls that wait for a person's approval",
        description="List every call that waits for approval: run, tool, the canonical "
        "arguments exactly as digested, digest, asked at, expires at, and the commands that "
        "decide it. Reads a directory of logs, a log, jsonl://PATH, or a PostgresRunStore "
        "(a postgres:// URL; the password from PGPASSWORD or ~/.pgpass).",
    )
    listing.add_argument(
        "target",
        help="a <run_id>.jsonl log, a directory of logs, jsonl:///path/to/runs, or "
        "postgresql://user@host:port/dbname",
    )
    listing.add_argument("--json", action="store_true", help="a JSON array instead of text")

    approve_cmd = commands.add_parser(
        "approve",
        help="approve the call a run waits on (writes one decision record)",
        description="Record a person's approval of the call a run waits on, bound to its "
        "digest; then resume the run with its agent (polyloop.session.run_or_resume), which "
        "executes the call under its replay policy.",
    )
    _decision_arguments(approve_cmd)
    approve_cmd.add_argument("--note", default="", metavar="TEXT", help="why (recorded too)")
    _common_tail(approve_cmd)

    reject_cmd = commands.add_parser(
        "reject",
        help="reject the call a run waits on (writes one decision record)",
        description="Record a person's rejection of the call a run waits on, bound to its "
        "digest; then resume the run with its agent (polyloop.session.run_or_resume): the call "
        "never executes, the model reads the reason and the run goes on.",
    )
    _decision_arguments(reject_cmd)
    reject_cmd.add_argument(
        "--reason", required=True, metavar="TEXT", help="why (the model reads it; recorded)"
    )
    _common_tail(reject_cmd)


def _pending(views: tuple[RunView, ...]) -> list[RunView]:
    return [view for view in views if view.awaiting is not None]


def tree_path(views: tuple[RunView, ...], run_id: str) -> list[str]:
    """The runs from the root of ``run_id``'s tree down to it (design 0245), by the parent
    each run's start names; ``[run_id]`` for a root. A parent missing from ``views`` ends the
    path there (the path starts at the highest run the place holds)."""
    parents = {
        view.run_id: view.log.started.parent.run_id
        for view in views
        if view.log.started is not None and view.log.started.parent is not None
    }
    path = [run_id]
    while path[-1] in parents and parents[path[-1]] not in path:
        path.append(parents[path[-1]])
    return path[::-1]


def _record(view: RunView, path: list[str]) -> dict[str, object]:
    assert view.awaiting is not None
    request = view.awaiting.request
    approve_line, reject_line = view.awaiting.commands
    return {
        "run_id": view.run_id,
        "result_id": request.result_id,
        "step": request.step_idx,
        "tool": request.tool,
        "tool_call_id": request.tool_call_id,
        "arguments": request.arguments,
        "digest": request.digest,
        "requested_at": request.requested_at,
        "expires_at": request.expires_at,
        "source": view.source,
        "tree_path": path,
        "approve": approve_line,
        "reject": reject_line,
    }


def _origin_lines(view: RunView, tool: str) -> list[str]:
    """Where the tool comes from when its name is not its own (design 0233): an MCP tool
    offered under ``safe_tool_name`` of the server's name shows the server's name, escaped
    with ``ascii`` (a person sees both, and a lookalike cannot pass for another name)."""
    prefix = f"action_executor.tool.{tool}."
    original = view.snapshot.get(f"{prefix}mcp.tool")
    if original is None or original == tool:
        return []
    server = view.snapshot.get(f"{prefix}mcp.server", "")
    return [f"  offered as {tool} for the MCP tool {original!a} of server {server}"]


def cmd_approvals(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    """``approvals``: list the calls waiting for approval (exit 1 when a log is unreadable)."""
    loaded = load_target(args.target)
    pending = _pending(loaded.runs)
    if args.json:
        paths = [tree_path(loaded.runs, view.run_id) for view in pending]
        print(visible_json([_record(v, p) for v, p in zip(pending, paths, strict=True)]), file=out)
    else:
        for view in pending:
            assert view.awaiting is not None
            lines = [f"run {view.run_id}  ({view.source})"]
            path = tree_path(loaded.runs, view.run_id)
            if len(path) > 1:  # a child run: the root a person resumes after deciding
                lines.append(f"  tree: {' > '.join(path)} (resume the root, {path[0]})")
            lines += approval_lines(view.awaiting.request, None, indent="  ")
            lines += _origin_lines(view, view.awaiting.request.tool)
            if view.awaiting.note:
                lines.append(f"  note: {view.awaiting.note}")
            lines += [
                f"  {verb}: {line}"
                for verb, line in zip(("approve", "reject"), view.awaiting.commands, strict=True)
            ]
            for line in lines:  # each element is one line of the screen (as in _text)
                print(visible(line), file=out)
            print("", file=out)
        print(
            visible(
                f"{len(pending)} {'call waits' if len(pending) == 1 else 'calls wait'} "
                f"for approval in {display_target(args.target)}"
            ),
            file=out,
        )
    for problem in loaded.unreadable:
        print(visible(f"polyloop: unreadable log: {problem.message}"), file=err)
    return 1 if loaded.unreadable else 0


def _check(args: argparse.Namespace) -> None:
    if not args.by.strip():
        raise InspectError("--by needs a name: who decides is recorded with the decision")
    if not args.digest.strip():
        raise InspectError("--digest needs the call's digest (python -m polyloop approvals)")
    check_lease_wait(args.lease_wait)


def _recorded(run_id: str, decision: Settlement, log: str) -> str:
    verdict = decision.verdict.value
    if decision.verdict is SettlementVerdict.APPROVED:
        then = "it executes the call under its replay policy"
    else:
        then = "the call never executes; the model reads the reason and the run goes on"
    why = f", reason {decision.note!r}" if decision.verdict is SettlementVerdict.REJECTED else ""
    return (
        f"recorded: run {run_id!r}, {decision.result_id} {verdict} (digest {decision.digest}, "
        f"by {decision.by}, at {decision.at}{why}); next: resume the run with its agent "
        f"(polyloop.session.run_or_resume): {then}; python -m polyloop show {log} shows it"
    )


def _decide(args: argparse.Namespace, out: Writer, verdict: SettlementVerdict) -> int:
    _check(args)
    place = locate_run(args.log, args.run_id)
    run_id = place.run_id

    async def decide(store: RunStore) -> Settlement:
        if verdict is SettlementVerdict.APPROVED:
            return await approve(
                store,
                run_id,
                digest=args.digest,
                by=args.by,
                note=args.note,
                lease_wait_seconds=args.lease_wait,
            )
        return await reject(
            store,
            run_id,
            digest=args.digest,
            by=args.by,
            reason=args.reason,
            lease_wait_seconds=args.lease_wait,
        )

    decision = write_decision(place, decide, _FIXES)
    print(visible(_recorded(run_id, decision, place.show)), file=out)
    return 0


def cmd_approve(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    """``approve``: record the approval of the call with ``--digest``; say what next."""
    del err
    return _decide(args, out, SettlementVerdict.APPROVED)


def cmd_reject(args: argparse.Namespace, out: Writer, err: Writer) -> int:
    """``reject``: record the rejection of the call with ``--digest``; say what next."""
    del err
    if not args.reason.strip():
        raise InspectError("--reason needs a text: the model reads why its call was rejected")
    return _decide(args, out, SettlementVerdict.REJECTED)
