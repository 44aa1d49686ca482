"""The exceptions the adapter raises. Each names the URL, the model, the cause and a fix.

Every failure of a call is one of six classes (design 0202). All derive from
``polyloop.errors.SeamError`` (a ``PolyloopError``: the family of seam failures, design 0221)
and from the ``httpx`` class a caller would already catch, so ``except httpx.TimeoutException``
or ``except httpx.HTTPStatusError`` keep working:

===============================  =========================================  ====================
class                            httpx base                                 when
===============================  =========================================  ====================
``GatewayHTTPError``             ``HTTPStatusError``                        a status outside 2xx
``GatewayContextLengthError``    (a ``GatewayHTTPError``)                   HTTP 400 naming the
                                                                            context length
``GatewayResponseError``         (none; a ``PolyloopValueError``)           a 2xx body that is
                                                                            not a reply
``GatewayTimeoutError``          ``TimeoutException``                       connect, read, write
                                                                            or pool timeout
``GatewayConnectError``          ``ConnectError``                           nobody answered at
                                                                            host and port
``GatewayTransportError``        ``TransportError``                         the connection broke
                                                                            mid-request
===============================  =========================================  ====================

Every message has the form ``POST <url> (model <model>): <what happened>; try: <fix>``. The
URL is ``{base_url}/chat/completions``, which ``GatewaySettings`` guarantees carries no user
info, query or fragment, so no credential can reach a message (query parameters the client
adds itself are never shown). The failure text of a model call is ``"<class>: <message>"`` in
the run log, so it is never empty.
"""

from __future__ import annotations

import re

import httpx

from polyloop.errors import ContextLengthExceededError, PolyloopValueError, SeamError

__all__ = [
    "EXCERPT_LIMIT",
    "GatewayConnectError",
    "GatewayContextLengthError",
    "GatewayHTTPError",
    "GatewayResponseError",
    "GatewayTimeoutError",
    "GatewayTransportError",
    "excerpt_of",
    "names_context_length",
    "translated_transport_error",
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


def _where(method: str, url: str, model: str) -> str:
    return f"{method} {url} (model {model!r})"


_STATUS_FIXES = {
    400: "the server refused the request as malformed: read its explanation in the body; "
    "check the sampling fields in GatewaySettings.sampling against what the server supports",
    401: "check the credentials on the httpx.AsyncClient (an Authorization header or auth=)",
    403: "the credentials are valid but not allowed this model or endpoint; check the key's "
    "permissions",
    404: "check GatewaySettings.base_url (the API root, usually ending in /v1) and that the "
    "server serves this model name (GET <base_url>/models lists them)",
    408: "the server timed out reading the request; check the server and the network",
    413: "the request body is too large for the server or a proxy in front of it",
    422: "the server could not process the request body: read its explanation in the body",
    429: "rate limited: lower the concurrency, or put a gateway with retries and backoff in "
    "front of the model (the adapter never retries)",
}


def _status_fix(status: int) -> str:
    if status in _STATUS_FIXES:
        return _STATUS_FIXES[status]
    if 300 <= status < 400:
        return "the endpoint redirects: point GatewaySettings.base_url at the final API root"
    if status >= 500:
        return (
            "the server failed: check its log; retries belong in a gateway in front of the "
            "model (the adapter never retries)"
        )
    return "read the server's explanation in the body"


_CONTEXT_FIX = (
    "shorten the prompt, set Budget.max_prompt_tokens below the model's context so the run "
    "stops before sending, or serve the model with a larger context (llama.cpp: --n_ctx)"
)


class GatewayHTTPError(httpx.HTTPStatusError, SeamError):
    """The endpoint answered with a status outside 2xx.

    It is an ``httpx.HTTPStatusError``, so code that already catches that keeps working, but
    unlike the one ``raise_for_status()`` builds, its message carries the URL, the model, the
    status code, the start of the body (where servers explain what went wrong: "model not
    found", "context length exceeded") and what to try for that status. The library records a
    failed model call as ``"<class name>: <message>"``, so this text is what a trajectory shows.

    ``status_code`` is the HTTP status; ``body_excerpt`` the first ``EXCERPT_LIMIT`` (500)
    characters of the body; ``body_truncated`` tells whether there was more; ``url`` and
    ``model`` say where the request went. The body beyond the excerpt is never read, so
    ``response.text`` is not available on ``response``. The message names
    ``{base_url}/chat/completions``, not ``request.url``, so query parameters the client adds
    (``params=``, where some providers expect a key) never reach a log.
    """

    status_code: int
    body_excerpt: str
    body_truncated: bool
    url: str
    model: str

    def __init__(
        self,
        *,
        url: str,
        request: httpx.Request,
        response: httpx.Response,
        body_excerpt: str,
        body_truncated: bool,
        model: str = "",
    ) -> None:
        message = (
            f"{_where(request.method, url, model)} answered HTTP {response.status_code} "
            f"{response.reason_phrase}; body: {_quoted_excerpt(body_excerpt, body_truncated)}; "
            f"try: {self._fix(response.status_code)}"
        )
        super().__init__(message, request=request, response=response)
        self.status_code = response.status_code
        self.body_excerpt = body_excerpt
        self.body_truncated = body_truncated
        self.url = url
        self.model = model

    @staticmethod
    def _fix(status: int) -> str:
        return _status_fix(status)


class GatewayContextLengthError(GatewayHTTPError, ContextLengthExceededError):
    """HTTP 400 whose body says the prompt is longer than the model's context (design 0201).

    A ``GatewayHTTPError`` (status and body excerpt as usual) and a
    ``polyloop.errors.ContextLengthExceededError``, so the run stops with
    ``StopReason.CONTEXT_LENGTH_EXCEEDED`` instead of ``LLM_ERROR``.
    """

    @staticmethod
    def _fix(status: int) -> str:
        return _CONTEXT_FIX


class GatewayResponseError(PolyloopValueError, SeamError):
    """A 2xx response whose body is not a Chat Completions reply the adapter can read.

    ``problem`` names what is missing or wrong, as a path into the JSON body (for example
    ``"'choices' is missing"`` or ``"choices[0].message.content is an array, not a string or
    null"``). ``body_excerpt`` holds the first ``EXCERPT_LIMIT`` characters of the body, so a
    proxy's error page or an ``{"error": ...}`` object sent with status 200 is visible.
    """

    problem: str
    body_excerpt: str
    body_truncated: bool
    url: str
    model: str

    def __init__(
        self,
        *,
        url: str,
        problem: str,
        body_excerpt: str,
        body_truncated: bool,
        model: str = "",
    ) -> None:
        super().__init__(
            f"{_where('POST', url, model)} returned a body that is not a Chat Completions "
            f"reply: {problem}; body: {_quoted_excerpt(body_excerpt, body_truncated)}; try: "
            "check that base_url is an OpenAI-compatible API root (not a web page or another "
            "API) and that no proxy answers in its place"
        )
        self.problem = problem
        self.body_excerpt = body_excerpt
        self.body_truncated = body_truncated
        self.url = url
        self.model = model


class GatewayTimeoutError(httpx.TimeoutException, SeamError):
    """The request hit one of the ``httpx.AsyncClient``'s timeouts.

    ``phase`` is ``"connect"``, ``"read"``, ``"write"`` or ``"pool"``; ``seconds`` the limit
    that expired (``None`` if the client did not say). The original httpx exception is the
    ``__cause__``.
    """

    phase: str
    seconds: float | None
    url: str
    model: str

    def __init__(
        self, *, url: str, model: str, phase: str, seconds: float | None, request: httpx.Request
    ) -> None:
        limit = "its limit" if seconds is None else f"{seconds:g} s"
        what = {
            "connect": "connecting to the server",
            "read": "waiting for the reply (no byte arrived)",
            "write": "sending the request",
            "pool": "waiting for a free connection in the client's pool",
        }.get(phase, phase)
        fix = (
            "check that the server is up and reachable at that host and port"
            if phase == "connect"
            else "lower the concurrency or raise the client's connection limits"
            if phase == "pool"
            else "raise the httpx.AsyncClient's timeout, or make replies end sooner (a smaller "
            "max_tokens, stop sequences in GatewaySettings.sampling); with "
            "GatewaySettings(stream=True) a timeout also stops the server generating"
        )
        super().__init__(
            f"{_where('POST', url, model)}: timed out after {limit} {what}; try: {fix}",
            request=request,
        )
        self.phase = phase
        self.seconds = seconds
        self.url = url
        self.model = model


class GatewayConnectError(httpx.ConnectError, SeamError):
    """No connection could be made (refused, unknown host, unreachable network)."""

    url: str
    model: str

    def __init__(self, *, url: str, model: str, cause: str, request: httpx.Request) -> None:
        super().__init__(
            f"{_where('POST', url, model)}: could not connect ({cause}); try: check that the "
            "server is running and listening on that host and port, and that "
            "GatewaySettings.base_url names it",
            request=request,
        )
        self.url = url
        self.model = model


class GatewayTransportError(httpx.TransportError, SeamError):
    """The connection broke after it was made (the server hung up, a malformed response)."""

    url: str
    model: str

    def __init__(self, *, url: str, model: str, cause: str, request: httpx.Request) -> None:
        super().__init__(
            f"{_where('POST', url, model)}: the connection failed mid-request ({cause}); try: "
            "check the server's log (it may have crashed, restarted or run out of memory) and "
            "any proxy between it and this client",
            request=request,
        )
        self.url = url
        self.model = model


def _cause(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _timeout_seconds(request: httpx.Request, phase: str) -> float | None:
    limits = request.extensions.get("timeout")
    if isinstance(limits, dict):
        value = limits.get(phase)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


_TIMEOUT_PHASES: tuple[tuple[type[httpx.TimeoutException], str], ...] = (
    (httpx.ConnectTimeout, "connect"),
    (httpx.ReadTimeout, "read"),
    (httpx.WriteTimeout, "write"),
    (httpx.PoolTimeout, "pool"),
)


def translated_transport_error(
    exc: httpx.TransportError, *, url: str, model: str, request: httpx.Request
) -> httpx.TransportError:
    """The adapter's exception for an httpx transport error (raise it ``from exc``)."""
    if isinstance(exc, httpx.TimeoutException):
        phase = next((name for cls, name in _TIMEOUT_PHASES if isinstance(exc, cls)), "read")
        return GatewayTimeoutError(
            url=url,
            model=model,
            phase=phase,
            seconds=_timeout_seconds(request, phase),
            request=request,
        )
    if isinstance(exc, httpx.ConnectError):
        return GatewayConnectError(url=url, model=model, cause=_cause(exc), request=request)
    return GatewayTransportError(url=url, model=model, cause=_cause(exc), request=request)
