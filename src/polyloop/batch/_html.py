"""The batch index page: the report as one static HTML table, every run linked (design 0242).

``python -m polyloop batch PLACE --batch-id ID --html OUT.html`` writes ``OUT.html`` (this page)
and ``OUT.runs.html`` (the inspector's viewer of PLACE, ``python -m polyloop html``); each
attempt's run id links to its section there (``#run-<run id>``). Every text is HTML-escaped;
the page has no script and no reference outside the two files.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from polyloop.batch._ids import attempt_run_id
from polyloop.batch._report import BatchTotals, ItemReport

__all__ = ["index_page"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}"
    ".failed{background:#fff2f2}.num{text-align:right}"
)


def _cell(text: object, cls: str = "") -> str:
    attribute = f' class="{cls}"' if cls else ""
    return f"<td{attribute}>{html.escape(str(text))}</td>"


def _runs(batch_id: str, row: ItemReport, viewer: str) -> str:
    links = []
    for attempt in range(1, row.attempts + 1):
        run_id = attempt_run_id(batch_id, row.key, attempt)
        target = html.escape(f"{viewer}#run-{run_id}", quote=True)
        links.append(f'<a href="{target}">{html.escape(run_id)}</a>')
    return "<td>" + "<br>".join(links) + "</td>"


def index_page(batch_id: str, totals: BatchTotals, rows: Sequence[ItemReport], viewer: Path) -> str:
    """The page for ``rows`` (rebuilt from the store), linking into the viewer file ``viewer``
    (named relative to the page: both are written to one directory)."""
    reasons = ", ".join(
        f"{html.escape(k or 'unfinished')} {v}" for k, v in sorted(totals.by_stop_reason.items())
    )
    head = (
        "<tr><th>key</th><th>runs (attempts)</th><th>stop reason</th><th>steps</th>"
        "<th>tokens</th><th>wall ms</th><th>final answer</th></tr>"
    )
    body = []
    for row in rows:
        body.append(
            f'<tr data-key="{html.escape(row.key, quote=True)}"'
            + (' class="failed">' if row.failed else ">")
            + _cell(row.key)
            + _runs(batch_id, row, viewer.name)
            + _cell(row.stop_reason or "unfinished")
            + _cell(row.steps, "num")
            + _cell(row.tokens, "num")
            + _cell(row.wall_ms, "num")
            + _cell(row.final_answer or "")
            + "</tr>"
        )
    title = html.escape(f"batch {batch_id}")
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>"
        f"<p>{totals.items} items ({reasons}); {totals.failed} failed, {totals.retried} "
        f"retried, {totals.attempts} runs, {totals.steps} steps, {totals.tokens} tokens</p>"
        f'<table id="items"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
        "</body></html>\n"
    )
