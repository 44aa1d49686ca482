"""From ``Agent(model="openai:<name>")`` to a gateway model client (design 0208).

The gateway adapter (and with it httpx) is imported here only when a model string needs it,
so ``import polyloop`` and an ``Agent`` around your own ``ModelClient`` never load it.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError

if TYPE_CHECKING:
    from polyloop.adapters import GatewayConnection, GatewaySettings

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_READ_TIMEOUT_SECONDS",
    "MODEL_PREFIX",
    "GatewayPlan",
    "gateway_plan",
]

MODEL_PREFIX: Final = "openai:"
"""The one model-string prefix: any OpenAI-compatible Chat Completions endpoint."""

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
"""Where ``openai:`` goes when neither ``base_url=`` nor ``OPENAI_BASE_URL`` says otherwise."""

DEFAULT_READ_TIMEOUT_SECONDS: Final = 600.0
"""How long the HTTP client a model string builds waits for the next bytes of a reply when
``Agent(model_call_timeout_seconds=...)`` is not set (with it set, that bound is the read bound
too): a server that accepts the connection and never answers fails the call (``LLM_ERROR``)
instead of hanging the run (design 0225). Ten minutes, so a slow model is not cut off."""

_KEYED_HOSTS: Final = frozenset({"api.openai.com"})
"""Hosts that never answer without a key: a missing one is refused before any run."""


@dataclass(frozen=True, slots=True)
class GatewayPlan:
    """What a model string resolved to: the settings, the key (never shown by ``repr``) and the
    HTTP read bound."""

    model: str
    settings: GatewaySettings
    api_key: str | None = field(repr=False)
    read_timeout_seconds: float = DEFAULT_READ_TIMEOUT_SECONDS

    def connect(self) -> GatewayConnection:
        """A new connection (its own HTTP client), to be closed by the caller."""
        from polyloop.adapters import GatewayConnection

        return GatewayConnection(
            self.settings, api_key=self.api_key, read_timeout_seconds=self.read_timeout_seconds
        )


def _adapters_missing(model: str, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"Agent(model={model!r}) talks to its endpoint over HTTP with the gateway extra, which "
        f"is not installed ({exc.name} is missing): pip install 'polyloop[gateway]'; or pass a "
        "ModelClient of your own as model=",
        name=exc.name,
    )


def _settings(
    model: str, name: str, base_url: str, source: str, sampling: Mapping[str, object] | None
) -> GatewaySettings:
    try:
        from polyloop.adapters import GatewaySettings
    except ModuleNotFoundError as exc:
        raise _adapters_missing(model, exc) from exc
    try:
        if sampling is None:
            return GatewaySettings(base_url=base_url, model=name)
        return GatewaySettings(base_url=base_url, model=name, sampling=sampling)  # type: ignore[arg-type]
    except PolyloopTypeError as exc:
        raise PolyloopTypeError(f"Agent(model={model!r}), base URL from {source}: {exc}") from exc
    except PolyloopValueError as exc:
        raise PolyloopValueError(f"Agent(model={model!r}), base URL from {source}: {exc}") from exc


def gateway_plan(
    model: str,
    *,
    base_url: str | None,
    api_key: str | None,
    sampling: Mapping[str, object] | None,
    environ: Mapping[str, str] | None = None,
    read_timeout_seconds: float = DEFAULT_READ_TIMEOUT_SECONDS,
) -> GatewayPlan:
    """Resolve ``"openai:<name>"``: the endpoint is ``base_url``, else ``OPENAI_BASE_URL``,
    else OpenAI's; the key is ``api_key``, else ``OPENAI_API_KEY``, else none (a local server
    needs none; OpenAI's own endpoint is refused without one). Errors name the argument or the
    variable and the fix, and never show the key."""
    env = os.environ if environ is None else environ
    if not model.startswith(MODEL_PREFIX):
        raise PolyloopValueError(
            f"Agent(model={model!r}): a model string is 'openai:<model name>' (any "
            "OpenAI-compatible endpoint: OpenAI, vLLM, llama.cpp's server, Ollama, LiteLLM's "
            "proxy), for example 'openai:gpt-4o-mini'; for anything else pass a ModelClient"
        )
    name = model[len(MODEL_PREFIX) :]
    if not name.strip():
        raise PolyloopValueError(
            f"Agent(model={model!r}) names no model: write the name the server serves after "
            "'openai:', for example 'openai:gpt-4o-mini'"
        )
    if base_url is not None:
        url, source = base_url, "base_url="
    elif env.get("OPENAI_BASE_URL"):
        url, source = env["OPENAI_BASE_URL"], "OPENAI_BASE_URL"
    else:
        url, source = DEFAULT_BASE_URL, "the default"
    key, key_source = (
        (api_key, "api_key=")
        if api_key is not None
        else (env.get("OPENAI_API_KEY") or None, "OPENAI_API_KEY")
    )
    settings = _settings(model, name, url, source, sampling)
    if key is not None:
        try:
            from polyloop.adapters import GatewayConnection
        except ModuleNotFoundError as exc:
            raise _adapters_missing(model, exc) from exc
        GatewayConnection.check_api_key(key, where=key_source)
    elif urllib.parse.urlsplit(settings.base_url).hostname in _KEYED_HOSTS:
        raise PolyloopValueError(
            f"Agent(model={model!r}) talks to {settings.base_url}, which needs an API key: set "
            "OPENAI_API_KEY or pass api_key=...; for a local OpenAI-compatible server (which "
            "needs none) set OPENAI_BASE_URL or pass base_url=, for example "
            "'http://127.0.0.1:8000/v1'"
        )
    return GatewayPlan(
        model=model, settings=settings, api_key=key, read_timeout_seconds=read_timeout_seconds
    )
