"""Cost everywhere a person looks (issue 37 item 4, design 0236): ``ls`` (and ``--json``),
``show``, the HTML viewer, ``--pricing`` for logs that recorded none, the logging sink and the
OpenTelemetry sink."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

import pytest
from _session_doubles import CodeExecutor, definition, request
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from polyloop.inspect import main
from polyloop.otel import OtelEventSink
from polyloop.ports import ModelCall
from polyloop.session import Pricing, run
from polyloop.sinks import LoggingEventSink
from polyloop.stores import JsonlRunStore
from polyloop.types import Budget, ModelReply, Usage

pytestmark = pytest.mark.unit

PRICES = {"metered": {"input": "2.50", "cached_input": "1.25", "output": "10"}}
STEP_COST = Decimal("0.003")  # 1000 prompt (400 cached) + 100 completion tokens


class Metered:
    """Answers ``code:x`` reporting 1000 prompt (400 cached) and 100 completion tokens; a
    ``None`` in ``silent`` (by call index) reports no usage."""

    def __init__(self, silent: frozenset[int] = frozenset()) -> None:
        self.silent = silent

    async def call(self, call: ModelCall) -> ModelReply:
        usage = (
            None
            if call.call_index in self.silent
            else Usage(prompt_tokens=1000, completion_tokens=100, cached_tokens=400)
        )
        return ModelReply(call_id=f"c{call.call_index}", content="code:x", usage=usage)

    def parameters(self) -> Mapping[str, str]:
        return {"model": "metered"}


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def _write_run(
    directory: Path,
    run_id: str,
    *,
    priced: bool,
    silent: frozenset[int] = frozenset(),
    sink: object | None = None,
) -> None:
    agent = definition(Metered(silent), store=JsonlRunStore(directory=directory), sink=sink)  # type: ignore[arg-type]
    await run(
        agent,
        request(
            run_id,
            executor=CodeExecutor(),
            budget=Budget(max_steps=3, max_actions=3),
            pricing=Pricing.from_mapping(PRICES) if priced else None,
        ),
    )


async def test_ls_show_and_html_state_the_recorded_cost(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    await _write_run(runs, "priced", priced=True)
    await _write_run(runs, "partial", priced=True, silent=frozenset({1}))
    await _write_run(runs, "unpriced", priced=False)

    code, out, _ = _cli("ls", str(runs), "--json")
    assert code == 0
    costs = {entry["run_id"]: entry["cost"] for entry in json.loads(out)}
    assert costs == {"priced": "0.009", "partial": ">=0.006", "unpriced": None}

    code, out, _ = _cli("ls", str(runs))
    rows = {row.split()[0]: row.split() for row in out.splitlines()[1:]}
    assert out.splitlines()[0].split()[6:9] == ["model", "calls", "cost"]
    assert rows["priced"][6:8] == ["3", "0.009"]  # ... "0 ms", 3 model calls, the cost
    assert rows["partial"][6:8] == ["3", ">=0.006"]

    code, out, _ = _cli("show", str(runs / "priced.jsonl"))
    assert "ms of step wall time, cost 0.009" in out
    assert out.count("cost 0.003") == 3
    _, out, _ = _cli("show", str(runs / "partial.jsonl"))
    assert ", cost at least 0.006" in out

    page = tmp_path / "runs.html"
    assert _cli("html", str(runs), "-o", str(page))[0] == 0
    html = page.read_text(encoding="utf-8")
    assert "cost 0.003" in html
    assert "cost 0.009" in html
    assert "cost at least 0.006" in html


async def test_pricing_on_the_command_line_prices_a_log_that_recorded_none(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    await _write_run(runs, "unpriced", priced=False)
    prices = tmp_path / "prices.toml"
    prices.write_text('[metered]\ninput = "2.50"\ncached_input = "1.25"\noutput = "10"\n')
    _, out, _ = _cli("ls", str(runs), "--json", "--pricing", str(prices))
    assert json.loads(out)[0]["cost"] == "0.009"
    _, out, _ = _cli("show", str(runs / "unpriced.jsonl"), "--pricing", str(prices))
    assert ", cost 0.009" in out
    other = tmp_path / "other.json"
    other.write_text('{"gpt-x": {"input": 1, "output": 1}}')
    _, out, _ = _cli("ls", str(runs), "--json", "--pricing", str(other))
    assert json.loads(out)[0]["cost"] is None  # a model the file does not price: unknown
    code, _, err = _cli("ls", str(runs), "--pricing", str(tmp_path / "missing.toml"))
    assert code == 2
    assert "--pricing" in err


async def test_the_logging_sink_shows_each_steps_cost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polyloop.events")
    await _write_run(tmp_path, "logged", priced=True, sink=LoggingEventSink())
    lines = [r.getMessage() for r in caplog.records if r.name == "polyloop.events"]
    assert len(lines) == 3
    assert all("-> executed [cost 0.003]: ran x" in line for line in lines)


async def test_the_otel_model_span_carries_the_cost_beside_the_usage(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = OtelEventSink(tracer_provider=provider)
    agent = definition(Metered(frozenset({2})), store=JsonlRunStore(directory=tmp_path), sink=sink)  # type: ignore[arg-type]
    await sink.run(
        agent,
        request(
            "traced",
            executor=CodeExecutor(),
            budget=Budget(max_steps=3, max_actions=3),
            pricing=Pricing.from_mapping(PRICES),
        ),
    )
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    attributes = [dict(span.attributes or {}) for span in chats]
    assert [a.get("polyloop.usage.cost") for a in attributes] == ["0.003", "0.003", None]
    assert attributes[0]["gen_ai.usage.input_tokens"] == 1000
    assert "gen_ai.usage.input_tokens" not in attributes[2]
