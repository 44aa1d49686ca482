"""The e2e tests' reply judge fails empty and echoed replies with the likely cause (runs in CI)."""

from __future__ import annotations

import pytest
from _reply_judge import judge_reply

pytestmark = pytest.mark.unit

WHERE = "m at http://127.0.0.1:8080/v1"


@pytest.mark.parametrize(("content", "thinking"), [("", ""), ("  \n", ""), ("\n\n", " ")])
def test_an_empty_reply_fails_naming_the_chat_template(content: str, thinking: str) -> None:
    verdict = judge_reply(prompt="2 + 2 =", content=content, thinking=thinking, where=WHERE)
    assert verdict is not None
    assert verdict.startswith(f"{WHERE} returned an empty reply")
    assert "chat template" in verdict
    assert "--chat_format gemma" in verdict


def test_a_reply_equal_to_the_prompt_fails_naming_the_chat_template() -> None:
    verdict = judge_reply(prompt="Count: 1\n", content="Count: 1", thinking="", where=WHERE)
    assert verdict is not None
    assert "returned the prompt itself" in verdict
    assert "chat template" in verdict


@pytest.mark.parametrize(("content", "thinking"), [("4", ""), ("", "it is four")])
def test_a_real_answer_passes(content: str, thinking: str) -> None:
    assert judge_reply(prompt="2 + 2 =", content=content, thinking=thinking, where=WHERE) is None
