"""``python -m polyloop batch``: run a batch from the command line, or print its report.

::

    python -m polyloop batch run --items tasks.jsonl --agent mymodule:make_agent \\
        --batch-id eval-7 --concurrency 16 --store runs
    python -m polyloop batch runs --batch-id eval-7

``run`` reads one JSON value per line of ``--items`` (streamed), imports ``--agent``
(``module:function``), calls it with the opened store and runs the batch with what it returns
(an ``Agent``, or an ``ItemFactory``). Killed at any moment, the same command continues where
the store says the batch stands. ``PLACE --batch-id ID`` rebuilds the report from the store
alone (a directory of JSONL logs, ``jsonl://PATH`` or ``postgresql://...``): the counts, then
one row per item. Exit status: 0 every item done well (``final_answer``/``task_completed``);
1 some item failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import io
import json
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TextIO

from polyloop.batch._engine import is_agent
from polyloop.batch._ids import SEPARATOR, check_batch_id
from polyloop.batch._report import COLUMNS, BatchTotals, ItemReport, stored_rows
from polyloop.batch._retry import RetryPolicy
from polyloop.errors import PolyloopError, PolyloopValueError
from polyloop.ports import RunStore

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_BAD_INPUT: Final = 2
_PAGE: Final = 500
_SHOWN_ANSWER: Final = 60


class _Usage(PolyloopValueError):
    """A bad command line or input: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{message} (see {self.prog} --help)")


def _run_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m polyloop batch run",
        description="Run one agent over every item of a JSONL file; run the same command "
        "again to continue after a kill (finished items are read back, never run twice).",
    )
    parser.add_argument("--items", required=True, type=Path, help="one JSON value per line")
    parser.add_argument(
        "--agent",
        required=True,
        help="module:function; called with the store, returns a polyloop.Agent (prompt: a str "
        "item or the item's 'prompt') or an item factory (item, run_id) -> async context "
        "manager of (AgentDefinition, RunRequest)",
    )
    parser.add_argument("--batch-id", required=True)
    parser.add_argument("--store", required=True, help="a directory of JSONL logs, or a URL")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--key-field", help="the item field that is its key (default: a digest)")
    parser.add_argument("--max-attempts", type=int, default=3, help="attempts per item")
    parser.add_argument("--backoff", type=float, default=1.0, help="first retry's wait (s)")
    parser.add_argument("--report-dir", type=Path, help="default: STORE/batches/ID for a dir")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the items on this Ray cluster (ray.init(address=ADDRESS)); --agent's module "
        "must be importable on every node, and --store reachable from them",
    )
    parser.add_argument(
        "--node-ip-address",
        default="127.0.0.1",
        help="the address this driver advertises to Ray (default 127.0.0.1, a loopback cluster)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=15.0,
        help="a PostgreSQL store's run lease (a killed driver's runs wait this long)",
    )
    return parser


def _show_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m polyloop batch",
        description="A batch's report, rebuilt from the store: counts, then one row per item.",
    )
    parser.add_argument("place", help="a directory of JSONL logs, jsonl://PATH, or a URL")
    parser.add_argument("--batch-id", required=True)
    parser.add_argument("--json", action="store_true", help="one JSON object per item")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="OUT",
        help="also write OUT (an index page of the items) and OUT's .runs.html (every run)",
    )
    return parser


def _directory(place: str) -> Path | None:
    if "://" not in place:
        return Path(place)
    scheme, _, rest = place.partition("://")
    return Path(rest) if scheme.lower() == "jsonl" else None


@contextlib.asynccontextmanager
async def _opened(
    place: str, *, pool_size: int = 4, lease_seconds: float = 15.0
) -> AsyncIterator[RunStore]:
    directory = _directory(place)
    if directory is not None:
        from polyloop.stores import JsonlRunStore

        yield JsonlRunStore(directory=directory)
        return
    scheme = place.partition("://")[0].lower()
    if scheme not in {"postgres", "postgresql"}:
        raise _Usage(
            f"store URL scheme {scheme!r} is not one a batch runs on; give a directory, "
            "jsonl://PATH or postgresql://..."
        )
    from polyloop.stores import PostgresRunStore

    store = await PostgresRunStore.open(place, pool_size=pool_size, lease_seconds=lease_seconds)
    try:
        yield store
    finally:
        await store.close()


async def _run_ids(store: RunStore, place: str, batch_id: str) -> list[str]:
    prefix = f"{batch_id}{SEPARATOR}"
    directory = _directory(place)
    if directory is not None:
        if not directory.is_dir():
            raise _Usage(f"{directory}: no such directory")
        logs = directory.glob(f"{prefix}*.jsonl")  # the soak's *.events.jsonl are no logs
        return [p.name[: -len(".jsonl")] for p in logs if not p.name.endswith(".events.jsonl")]
    found: list[str] = []
    after: str | None = prefix
    while after is not None:
        page = await store.list_runs(after=after, limit=_PAGE)  # type: ignore[attr-defined]
        ids = [run.run_id for run in page.runs]
        found += [run_id for run_id in ids if run_id.startswith(prefix)]
        if ids and not ids[-1].startswith(prefix):
            break
        after = page.next_after
    return found


def _items(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise _Usage(f"{path}:{number}: not JSON ({exc.msg})") from None


def _count(path: Path) -> int:
    try:
        with path.open(encoding="utf-8") as lines:
            return sum(1 for line in lines if line.strip())
    except OSError as exc:
        raise _Usage(f"{path}: cannot be read ({exc.strerror})") from None


def _load(spec: str, store: RunStore) -> Any:
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise _Usage(f"--agent {spec!r} must be module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _Usage(
            f"--agent {spec!r}: module {module_name!r} cannot be imported ({exc}); it must be "
            "importable from the current directory or PYTHONPATH"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise _Usage(f"--agent {spec!r}: {module_name} has no function {name!r}")
    made = function(store)
    if not is_agent(made) and not callable(made):
        raise _Usage(
            f"--agent {spec!r} returned {type(made).__name__}; it must return a polyloop.Agent "
            "or an item factory"
        )
    return made


def _key_of(field: str | None) -> Any:
    if field is None:
        return None

    def key(item: Any) -> str:
        if not isinstance(item, dict) or field not in item:
            raise _Usage(f"--key-field {field!r}: an item has no such field")
        return str(item[field])

    return key


class _CliFactory:
    """``--agent`` over ``--store`` as an ``ItemFactory`` that pickles (for ``--ray``): on a
    worker it opens the store and calls the function once per process and event loop."""

    _made: dict[tuple[str, str, int], Any] = {}  # noqa: RUF012 - a per-process cache

    def __init__(self, agent: str, place: str, lease_seconds: float) -> None:
        self._agent, self._place, self._lease_seconds = agent, place, lease_seconds

    async def _built(self) -> Any:
        from polyloop.batch._engine import item_factory

        slot = (self._agent, self._place, id(asyncio.get_running_loop()))
        if slot not in self._made:
            opened = _opened(self._place, pool_size=4, lease_seconds=self._lease_seconds)
            store = await opened.__aenter__()  # kept for the worker's life
            self._made[slot] = item_factory(_load(self._agent, store), None)
        return self._made[slot]

    @contextlib.asynccontextmanager
    async def __call__(self, item: Any, run_id: str) -> AsyncIterator[Any]:
        factory = await self._built()
        async with factory(item, run_id) as parts:
            yield parts


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from polyloop.batch import run_batch

    total = _count(args.items)
    directory = _directory(args.store)
    report_dir = args.report_dir
    if report_dir is None:
        base = directory if directory is not None else Path("batches")
        report_dir = (base / "batches" if directory is not None else base) / args.batch_id
    pool = max(4, min(args.concurrency, 20))
    engine = None
    if args.ray is not None:
        engine = _connect(args.ray, args.node_ip_address)
        if directory is not None:
            args.store = str(directory.resolve())
    async with _opened(args.store, pool_size=pool, lease_seconds=args.lease_seconds) as store:
        agent = (
            _load(args.agent, store)
            if engine is None
            else _CliFactory(args.agent, args.store, args.lease_seconds)
        )
        report = await run_batch(
            agent,
            _items(args.items),
            batch_id=args.batch_id,
            key=_key_of(args.key_field),
            concurrency=args.concurrency,
            retry=RetryPolicy(max_attempts=args.max_attempts, backoff_seconds=args.backoff),
            report_dir=report_dir,
            progress_stream=None if args.quiet else err,
            total=total,
            lease_wait_seconds=2 * args.lease_seconds + 5,
            engine=engine,
        )
    print(_counts(report.totals), file=out)
    print(f"report: {report.jsonl} and {report.csv}", file=out)
    return EXIT_FAILED if report.totals.failed else EXIT_OK


def _connect(address: str, node_ip_address: str) -> Any:
    """Connect to the Ray cluster at ``address``; the engine (``RayActors()``)."""
    try:
        from polyloop.ray import RayActors, connect
    except ImportError as exc:
        raise _Usage(f"--ray needs the ray extra (pip install 'polyloop[ray]'): {exc}") from None
    connect(address, node_ip_address=node_ip_address)
    return RayActors()


def _counts(totals: BatchTotals) -> str:
    reasons = ", ".join(
        f"{k or 'unfinished'} {v}" for k, v in sorted(totals.by_stop_reason.items())
    )
    return (
        f"{totals.items} items ({reasons}); {totals.failed} failed, {totals.retried} retried, "
        f"{totals.attempts} runs, {totals.steps} steps, {totals.tokens} tokens"
    )


def _table(rows: Sequence[ItemReport], out: TextIO) -> None:
    shown = ("key", "run_id", "attempts", "stop_reason", "steps", "tokens", "wall_ms", "answer")
    cells = [shown]
    for row in rows:
        answer = (row.final_answer or "").replace("\n", " ")
        if len(answer) > _SHOWN_ANSWER:
            answer = answer[: _SHOWN_ANSWER - 1] + "…"
        cells.append(
            (
                row.key,
                row.run_id,
                str(row.attempts),
                row.stop_reason or "unfinished",
                str(row.steps),
                str(row.tokens),
                str(row.wall_ms),
                answer,
            )
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(shown))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


async def _show(args: argparse.Namespace, out: TextIO) -> int:
    batch_id = check_batch_id(args.batch_id)
    async with _opened(args.place, pool_size=2) as store:
        rows = await stored_rows(store, batch_id, await _run_ids(store, args.place, batch_id))
    if not rows:
        raise _Usage(f"{args.place}: no runs of batch {batch_id!r}")
    if args.json:
        for row in rows:
            print(json.dumps({c: getattr(row, c) for c in COLUMNS}, ensure_ascii=False), file=out)
        return EXIT_OK
    totals = BatchTotals()
    for row in rows:
        totals.add(row)
    print(_counts(totals), file=out)
    _table(rows, out)
    if args.html is not None:
        _write_html(args.place, batch_id, totals, rows, args.html, out)
    return EXIT_FAILED if totals.failed else EXIT_OK


def _write_html(
    place: str,
    batch_id: str,
    totals: BatchTotals,
    rows: Sequence[ItemReport],
    page: Path,
    out: TextIO,
) -> None:
    """The index page and, beside it, the inspector's viewer of the place it links into."""
    from polyloop.batch._html import index_page
    from polyloop.inspect import main as inspect_main

    viewer = page.with_suffix(".runs.html")
    status = inspect_main(["html", place, "-o", str(viewer)], out=io.StringIO(), err=out)
    if status != EXIT_OK:
        raise _Usage(f"the run viewer {viewer} could not be written (status {status})")
    page.write_text(index_page(batch_id, totals, rows, viewer), encoding="utf-8")
    print(f"batch page: {page} (runs: {viewer})", file=out)


def main(argv: Sequence[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``python -m polyloop batch ARGV...``: the exit status."""
    shown = sys.stdout if out is None else out
    problems = sys.stderr if err is None else err
    try:
        if argv[:1] == ["run"]:
            return asyncio.run(_run(_run_parser().parse_args(argv[1:]), shown, problems))
        return asyncio.run(_show(_show_parser().parse_args(argv), shown))
    except (_Usage, PolyloopError) as exc:
        print(f"python -m polyloop batch: {exc}", file=problems)
        return EXIT_BAD_INPUT
