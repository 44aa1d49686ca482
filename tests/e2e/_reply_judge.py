"""What makes a real model's reply meaningless, and what the likely cause is.

A real endpoint that answers every call with ``""`` or with the prompt itself passes every
structural check while proving nothing about the model. Both have one usual cause on local
servers: the chat template. llama.cpp's server falls back to a generic template when it
cannot tell which one the model needs, and Gemma then answers nothing at all. ``judge_reply``
returns the failure message a test should fail with, or ``None`` for a usable reply. It is
plain Python (no pytest, no network), so ``test_reply_judge.py`` checks it in every CI run.
"""

from __future__ import annotations

TEMPLATE_HINT = (
    "the likely cause is the server's chat template: llama.cpp's server falls back to a "
    "generic template when it cannot tell the model's own, and Gemma then replies with "
    "nothing; start it with the model's template (python -m llama_cpp.server ... "
    "--chat_format gemma for the Gemma GGUF), or point the test at an endpoint that applies "
    "the right one"
)


def judge_reply(*, prompt: str, content: str, thinking: str, where: str) -> str | None:
    """``None`` when the reply says something other than the prompt; else why it fails.

    ``where`` names the endpoint and model (e.g. ``"gemma-3-270m at http://127.0.0.1:8080/v1"``)
    so the message tells the reader which server to fix.
    """
    said = (content + thinking).strip()
    if not said:
        return f"{where} returned an empty reply ({content!r}); {TEMPLATE_HINT}"
    if content.strip() == prompt.strip():
        return (
            f"{where} returned the prompt itself as its reply ({len(content)} characters); "
            f"{TEMPLATE_HINT}"
        )
    return None
