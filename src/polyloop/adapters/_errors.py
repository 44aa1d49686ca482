"""The two exceptions the adapter raises itself. Everything else httpx raises passes through."""

from __future__ import annotations

import re

import httpx

from polyloop.errors import ContextLengthExceededError, PolyloopError, PolyloopValueError

__all__ = [
    "EXCERPT_LIMIT",
    "GatewayContextLengthError",
    "GatewayHTTPError",
    "GatewayResponseError",
    "excerpt_of",
    "names_context_length",
]

EXCERPT_LIMIT = 500
"""At most this many characters of a response body are kept on an exception."""


def excerpt_of(text: str) -> tuple[str, bool]:
    """The first ``EXCERPT_LIMIT`` characters of ``text``, and whether anything was cut."""
    return text[:EXCERPT_LIMIT], len(text) > EXCERPT_LIMIT


_CONTEXT_LENGTH = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|n_ctx|too many tokens", re.IGNORECASE
)


def names_context_length(status_code: int, body_excerpt: str) -> bool:
    """True for an HTTP 400 whose body says the prompt does not fit the model's context.

    OpenAI says "maximum context length is N tokens", vLLM "maximum context length",
    llama.cpp's servers "exceeds the available context size" or "... n_ctx ...", others
    "context window" or "too many tokens" (design 0201).
    """
    return status_code == 400 and _CONTEXT_LENGTH.search(body_excerpt) is not None


def _quoted_excerpt(excerpt: str, truncated: bool) -> str:
    suffix = f" (first {EXCERPT_LIMIT} characters)" if truncated else ""
    return f"{excerpt!r}{suffix}"


class GatewayHTTPError(httpx.HTTPStatusError, PolyloopError):
    """The endpoint answered with a status outside 2xx.

    It is an ``httpx.HTTPStatusError``, so code that already catches that keeps working, but
    unlike the one ``raise_for_status()`` builds, its message carries the status code *and*
    the start of the body, where servers explain what went wrong ("model not found",
    "context length exceeded"). The library records a failed model call as
    ``"<class name>: <message>"``, so this text is what a trajectory shows.

    ``status_code`` is the HTTP status; ``body_excerpt`` the first ``EXCERPT_LIMIT`` (500)
    characters of the body; ``body_truncated`` tells whether there was more. The body beyond
    the excerpt is never read, so ``response.text`` is not available on ``response``. The
    message names ``{base_url}/chat/completions``, not ``request.url``, so query parameters
    the client adds (``params=``, where some providers expect a key) never reach a log.
    """

    status_code: int
    body_excerpt: str
    body_truncated: bool

    def __init__(
        self,
        *,
        url: str,
        request: httpx.Request,
        response: httpx.Response,
        body_excerpt: str,
        body_truncated: bool,
    ) -> None:
        message = (
            f"{request.method} {url} answered HTTP {response.status_code} "
            f"{response.reason_phrase}; body: {_quoted_excerpt(body_excerpt, body_truncated)}"
        )
        super().__init__(message, request=request, response=response)
        self.status_code = response.status_code
        self.body_excerpt = body_excerpt
        self.body_truncated = body_truncated


class GatewayResponseError(PolyloopValueError):
    """A 2xx response whose body is not a Chat Completions reply the adapter can read.

    ``problem`` names what is missing or wrong, as a path into the JSON body (for example
    ``"'choices' is missing"`` or ``"choices[0].message.content is an array, not a string or
    null"``). ``body_excerpt`` holds the first ``EXCERPT_LIMIT`` characters of the body, so a
    proxy's error page or an ``{"error": ...}`` object sent with status 200 is visible.
    """

    problem: str
    body_excerpt: str
    body_truncated: bool

    def __init__(self, *, url: str, problem: str, body_excerpt: str, body_truncated: bool) -> None:
        super().__init__(
            f"POST {url} returned a body that is not a Chat Completions reply: {problem}; "
            f"body: {_quoted_excerpt(body_excerpt, body_truncated)}"
        )
        self.problem = problem
        self.body_excerpt = body_excerpt
        self.body_truncated = body_truncated


class GatewayContextLengthError(GatewayHTTPError, ContextLengthExceededError):
    """HTTP 400 whose body says the prompt is longer than the model's context (design 0201).

    A ``GatewayHTTPError`` (status and body excerpt as usual) and a
    ``polyloop.errors.ContextLengthExceededError``, so the run stops with
    ``StopReason.CONTEXT_LENGTH_EXCEEDED`` instead of ``LLM_ERROR``.
    """
