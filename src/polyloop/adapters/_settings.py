"""``GatewaySettings``: what the adapter sends on every call, and therefore the model identity."""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

from polyloop.errors import PolyloopTypeError, PolyloopValueError

__all__ = [
    "RESERVED_HEADERS",
    "SAMPLING_FIELDS",
    "TOOL_CHOICES",
    "GatewaySettings",
    "SamplingValue",
]

TOOL_CHOICES: frozenset[str] = frozenset({"auto", "none", "required"})
"""The values ``GatewaySettings.tool_choice`` accepts (besides ``None``)."""

SamplingValue: TypeAlias = (
    str | int | float | bool | Sequence["SamplingValue"] | Mapping[str, "SamplingValue"] | None
)
"""A JSON value. Lists and tuples become tuples, mappings become read-only mappings."""

SAMPLING_FIELDS: frozenset[str] = frozenset(
    {
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "min_p",
        "presence_penalty",
        "reasoning_effort",
        "repetition_penalty",
        "seed",
        "stop",
        "temperature",
        "top_k",
        "top_logprobs",
        "top_p",
    }
)
"""The request-body fields ``GatewaySettings.sampling`` accepts.

They are the constant knobs that change what the model answers. Because they belong to the
model identity (``GatewayModelClient.parameters()``), a model binding may not set any of them
through ``gateway.<field>`` either. Servers ignore or reject fields they do not implement
(``top_k``, ``min_p`` and ``repetition_penalty`` are extensions of vLLM, llama.cpp and others).
"""

RESERVED_HEADERS: frozenset[str] = frozenset(
    {
        "accept",
        "accept-encoding",
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "cookie",
        "expect",
        "host",
        "keep-alive",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
    }
)
"""Header names (lower case) ``GatewaySettings.idempotency_key_header`` may not be.

The adapter and httpx set them on every request (the body's type and length, framing and
connection handling, ``Accept``, ``User-Agent``), or they carry the caller's credentials
(``Authorization``, ``Proxy-Authorization``, ``Cookie``): sending the key in one of them would
break the request or replace the credentials. Names are compared case-insensitively.
"""

_CHAT_COMPLETIONS_SUFFIX = "/chat/completions"
_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""An HTTP field name: an RFC 9110 ``token``."""


def _empty_sampling() -> Mapping[str, SamplingValue]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewaySettings:
    """The endpoint, the model and the constant sampling fields of one OpenAI-compatible model.

    ``base_url`` is the API root, for example ``"http://127.0.0.1:8000/v1"`` or
    ``"https://api.openai.com/v1"``; the adapter posts to ``{base_url}/chat/completions``.
    Trailing slashes are removed, so ``.../v1`` and ``.../v1/`` are the same settings. A
    ``base_url`` with user info (``user:pass@``), a query string or a fragment is refused:
    this value is recorded in every run's parameter snapshot, so it must never carry a
    secret. Credentials belong on the ``httpx.AsyncClient`` (``headers=`` or ``auth=``).

    ``model`` is the ``model`` field of every request, verbatim.

    ``sampling`` holds the constant fields merged into every request body (``temperature``,
    ``seed``, ``max_tokens`` ...); only the names in ``SAMPLING_FIELDS`` are accepted. Values
    are JSON values, recorded exactly as given: ``0`` and ``0.0`` are different settings,
    because they are different request bodies. The mapping is copied and frozen (lists become
    tuples), and kept sorted by key, so a caller's later edits never reach the settings.
    ``stop`` sequences and ``max_tokens`` go here too: they pass through unchanged in both modes.

    ``stream`` (default ``False``) makes every call a streaming request (``"stream": true``,
    with ``"stream_options": {"include_usage": true}`` so the endpoint still reports usage). The
    reply recorded is the same as without streaming; what changes is that a cancellation or a
    timeout closes the stream, so the server stops generating instead of finishing a reply
    nobody will read (design 0203). It is not part of the model identity (``parameters()``),
    because it does not change what the model answers: a run may be resumed with either mode.

    ``tool_choice`` and ``parallel_tool_calls`` are sent only with calls that carry tool
    schemas (``ModelCall.tools``, design 0100). ``tool_choice`` is ``"auto"`` (the default),
    ``"none"`` or ``"required"``, or ``None`` to send nothing and leave it to the server.
    ``"auto"`` is what OpenAI, vLLM and llama.cpp's ``llama-server`` assume when tools come
    without it, and Ollama ignores the field; llama-cpp-python's ``chatml-function-calling``
    format treats a missing ``tool_choice`` like ``"none"`` and never shows the model its tools,
    which is why it is sent rather than left out (design 0216). ``None`` is for a gateway that
    refuses the field (a LiteLLM route to a provider without ``tool_choice`` and without
    ``drop_params``), and resumes runs started before 0.2 with the default exactly.
    ``parallel_tool_calls`` defaults to ``False``, because polyloop runs one action per step
    and answers a reply with several calls with an ``InvalidDecision``; ``None`` sends nothing,
    for servers that refuse the field.

    ``idempotency_key_header`` (default ``None``: nothing is sent) names the HTTP request header
    in which every call sends its ``ModelCall.idempotency_key``, for gateways that deduplicate
    requests by one (``"Idempotency-Key"``, or whatever the gateway reads). The key is the same
    on every replay of a call and different for every other call (design 0205), so a gateway
    that remembers it answers a replayed call with the reply it already produced. A call whose
    key is ``None`` (one built outside a run) is sent without the header. The name must be an
    HTTP header token and not one the adapter, httpx or the caller's credentials already use
    (``RESERVED_HEADERS``). It is not part of the model identity (``parameters()``): like
    ``stream``, it does not change what the model answers, so a run may be resumed with it
    switched on or off (design 0207).
    """

    base_url: str
    model: str
    sampling: Mapping[str, SamplingValue] = field(default_factory=_empty_sampling)
    stream: bool = False
    tool_choice: str | None = "auto"
    parallel_tool_calls: bool | None = False
    idempotency_key_header: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stream, bool):
            raise PolyloopTypeError(
                f"GatewaySettings.stream must be a bool, got {type(self.stream).__name__}"
            )
        object.__setattr__(self, "base_url", _checked_base_url(self.base_url))
        _check_model(self.model)
        object.__setattr__(self, "sampling", _frozen_sampling(self.sampling))
        if self.tool_choice is not None:
            if not isinstance(self.tool_choice, str):
                raise PolyloopTypeError(
                    "GatewaySettings.tool_choice must be 'auto', 'none', 'required' or None, "
                    f"got {type(self.tool_choice).__name__}"
                )
            if self.tool_choice not in TOOL_CHOICES:
                raise PolyloopValueError(
                    f"GatewaySettings.tool_choice {self.tool_choice!r} is not one of "
                    f"{', '.join(map(repr, sorted(TOOL_CHOICES)))}; pass one of them, or None "
                    "to let the server decide"
                )
        if self.parallel_tool_calls is not None and not isinstance(self.parallel_tool_calls, bool):
            raise PolyloopTypeError(
                "GatewaySettings.parallel_tool_calls must be True, False or None (not sent), "
                f"got {type(self.parallel_tool_calls).__name__}"
            )
        if self.idempotency_key_header is not None:
            _check_header_name(self.idempotency_key_header)


def _redacted(url: str) -> str:
    """``url`` for an error message: user-info, query and fragment replaced by ``***``, since
    a base URL that carries credentials must not end up in logs through its own refusal."""
    shown = re.sub(r"(?<=://)[^/@]*@", "***@", url)
    return re.sub(r"[?#].*$", "?***", shown)


def _checked_base_url(value: object) -> str:
    example = "'http://127.0.0.1:8000/v1'"
    if not isinstance(value, str):
        raise PolyloopTypeError(
            f"GatewaySettings.base_url must be a str such as {example}, got {type(value).__name__}"
        )
    shown = _redacted(value)
    if not value.strip():
        raise PolyloopValueError(
            f"GatewaySettings.base_url must be a non-empty URL such as {example}"
        )
    if value != value.strip():
        raise PolyloopValueError(
            f"GatewaySettings.base_url {shown!r} has leading or trailing whitespace; remove it"
        )
    try:
        parts = urllib.parse.urlsplit(value)
        _ = parts.port  # parsed lazily: raises ValueError for a non-numeric or too large port
    except ValueError as exc:
        raise PolyloopValueError(
            f"GatewaySettings.base_url {shown!r} is not a valid URL ({exc}); pass one such as "
            f"{example}"
        ) from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise PolyloopValueError(
            f"GatewaySettings.base_url {shown!r} must start with 'http://' or 'https://', "
            f"for example {example}"
        )
    if not parts.hostname:
        raise PolyloopValueError(
            f"GatewaySettings.base_url {shown!r} has no host; pass one such as {example}"
        )
    if parts.username is not None or parts.password is not None:
        raise PolyloopValueError(
            "GatewaySettings.base_url must not contain user info ('user:password@'): the URL is "
            "recorded in the run's parameter snapshot. Put credentials on the httpx.AsyncClient "
            "(headers= or auth=) instead"
        )
    if "?" in value or "#" in value:
        raise PolyloopValueError(
            "GatewaySettings.base_url must not contain a query string or a fragment: "
            "the adapter appends '/chat/completions' to it, and the URL is recorded in the run's "
            "parameter snapshot. Put API keys on the httpx.AsyncClient (headers= or auth=), "
            "other query parameters in its params="
        )
    normalized = value.rstrip("/")
    if normalized.endswith(_CHAT_COMPLETIONS_SUFFIX):
        root = normalized[: -len(_CHAT_COMPLETIONS_SUFFIX)]
        raise PolyloopValueError(
            f"GatewaySettings.base_url {shown!r} already ends with '/chat/completions'; pass the "
            f"API root {root!r} instead: the adapter appends the endpoint path itself"
        )
    return normalized


def _check_header_name(value: object) -> None:
    where = "GatewaySettings.idempotency_key_header"
    if not isinstance(value, str):
        raise PolyloopTypeError(
            f"{where} must be a header name such as 'Idempotency-Key', or None to send no key, "
            f"got {type(value).__name__}"
        )
    if _HEADER_TOKEN.fullmatch(value) is None:
        raise PolyloopValueError(
            f"{where} {value!r} is not an HTTP header name (letters, digits and "
            "!#$%&'*+-.^_`|~, no spaces or colons); pass the name the gateway reads, such as "
            "'Idempotency-Key', or None to send no key"
        )
    if value.lower() in RESERVED_HEADERS:
        raise PolyloopValueError(
            f"{where} {value!r} is a header the adapter, httpx or the client's credentials "
            "already use; sending the key in it would break the request. Pass the name the "
            "gateway reads for idempotency keys, such as 'Idempotency-Key', or None to send no "
            "key"
        )


def _check_model(value: object) -> None:
    if not isinstance(value, str):
        raise PolyloopTypeError(f"GatewaySettings.model must be a str, got {type(value).__name__}")
    if not value.strip():
        raise PolyloopValueError(
            "GatewaySettings.model must be a non-empty model name as the server knows it, "
            "for example 'gpt-4o-mini' or 'qwen2.5-7b-instruct'"
        )
    if value != value.strip():
        raise PolyloopValueError(
            f"GatewaySettings.model {value!r} has leading or trailing whitespace; remove it"
        )


def _frozen_sampling(value: object) -> Mapping[str, SamplingValue]:
    if not isinstance(value, Mapping):
        raise PolyloopTypeError(
            "GatewaySettings.sampling must be a mapping of sampling field names to JSON values, "
            f"got {type(value).__name__}"
        )
    frozen: dict[str, SamplingValue] = {}
    for key in value:
        if not isinstance(key, str):
            raise PolyloopTypeError(
                f"GatewaySettings.sampling keys must be str, got {key!r} ({type(key).__name__})"
            )
        if key not in SAMPLING_FIELDS:
            raise PolyloopValueError(
                f"GatewaySettings.sampling key {key!r} is not a sampling field; use one of "
                f"{', '.join(sorted(SAMPLING_FIELDS))}. A request field that is not sampling "
                "(such as 'user') goes in the run's model_binding as 'gateway.<field>'"
            )
    for key in sorted(value):
        frozen[key] = _frozen_json(f"GatewaySettings.sampling[{key!r}]", value[key])
    return MappingProxyType(frozen)


def _frozen_json(path: str, value: object) -> SamplingValue:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PolyloopValueError(
                f"{path} is {value!r}; JSON has no NaN or infinity, use a finite number"
            )
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list | tuple):
        return tuple(_frozen_json(f"{path}[{index}]", item) for index, item in enumerate(value))
    if isinstance(value, Mapping):
        items: dict[str, SamplingValue] = {}
        for key in value:
            if not isinstance(key, str):
                raise PolyloopTypeError(f"{path} keys must be str (JSON object keys), got {key!r}")
            items[key] = _frozen_json(f"{path}[{key!r}]", value[key])
        return MappingProxyType(items)
    raise PolyloopTypeError(
        f"{path} must be a JSON value (str, int, float, bool, None, a list or tuple of those, or "
        f"a mapping with str keys), got {type(value).__name__}"
    )
