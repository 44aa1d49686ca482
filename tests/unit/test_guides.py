"""The guides' code keeps the contracts it teaches (issue 12: the quickstart's parser raised
``KeyError`` on ``{"x": 1}``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from polyloop.ports import Action, FinalAnswer, InvalidDecision
from polyloop.types import ModelReply

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "research-wiki" / "guides" / "quickstart-example.py"


def _quickstart() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart_example", QUICKSTART)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the example only runs under __main__
    return module


@pytest.mark.unit
@pytest.mark.parametrize(
    "content",
    [
        '{"x": 1}',
        "[1, 2]",
        '"text"',
        "null",
        "",
        "NaN",
        '{"tool": 3}',
        '{"tool": "add", "arguments": [1]}',
        '{"final_answer": ""}',
        "{" * 500,
        "[" * 100_000,
    ],
)
def test_the_quickstart_parser_never_raises_on_model_output(content: str) -> None:
    parsed = _quickstart().JsonParser().parse(ModelReply(call_id=None, content=content))
    assert isinstance(parsed.decision, InvalidDecision)
    assert parsed.decision.explanation.strip()
    assert parsed.history_text == content


@pytest.mark.unit
def test_the_quickstart_parser_still_reads_calls_and_answers() -> None:
    parser = _quickstart().JsonParser()
    call = parser.parse(ModelReply(call_id=None, content='{"tool": "add", "arguments": {"a": 1}}'))
    answer = parser.parse(ModelReply(call_id=None, content='{"final_answer": "5"}'))
    assert isinstance(call.decision, Action)
    assert call.decision.tool_call is not None
    assert call.decision.tool_call.arguments == {"a": 1}
    assert answer.decision == FinalAnswer(text="5")


@pytest.mark.integration
def test_the_quickstart_runs_crashes_and_resumes(tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, str(QUICKSTART)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    assert "crashed:" in process.stdout
    assert "final_answer: '5' after 2 steps" in process.stdout
