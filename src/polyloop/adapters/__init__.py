"""A model client for any OpenAI-compatible Chat Completions endpoint, over httpx.

Needs the ``gateway`` extra (``pip install 'polyloop[gateway]'``); ``import polyloop`` never
imports this module. The endpoint can be OpenAI itself, a LiteLLM proxy, vLLM, llama.cpp's
server, Ollama or OpenRouter::

    import httpx
    from polyloop.adapters import GatewayModelClient, GatewaySettings

    settings = GatewaySettings(
        base_url="http://127.0.0.1:8000/v1",
        model="qwen2.5-7b-instruct",
        sampling={"temperature": 0.0, "seed": 7},
    )
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {api_key}"}, timeout=120.0
    ) as http:
        model_client = GatewayModelClient(client=http, settings=settings)
        ...  # put model_client in an AgentDefinition

The adapter sends one request per model call and never retries; put retries and fallbacks in
a gateway in front of the model. A gateway that deduplicates requests by an idempotency key
can be sent each call's key: ``GatewaySettings(..., idempotency_key_header="Idempotency-Key")``
(off by default). Design records 0030-0033, 0100, 0202, 0203 and 0207 explain the choices.

``GatewayConnection(settings, api_key=...)`` builds the ``httpx.AsyncClient`` for you and
closes it with itself (``polyloop.Agent`` uses it for a model string; design 0208).
"""

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.adapters._client import GatewayModelClient
from polyloop.adapters._connection import GatewayConnection
from polyloop.adapters._errors import (
    GatewayConnectError,
    GatewayContextLengthError,
    GatewayHTTPError,
    GatewayResponseError,
    GatewayTimeoutError,
    GatewayTransportError,
)
from polyloop.adapters._forwarding import REQUEST_SHAPE_FIELDS
from polyloop.adapters._settings import (
    RESERVED_HEADERS,
    SAMPLING_FIELDS,
    TOOL_CHOICES,
    GatewaySettings,
    SamplingValue,
)

__all__ = [
    "REQUEST_SHAPE_FIELDS",
    "RESERVED_HEADERS",
    "SAMPLING_FIELDS",
    "TOOL_CHOICES",
    "GatewayConnectError",
    "GatewayConnection",
    "GatewayContextLengthError",
    "GatewayHTTPError",
    "GatewayModelClient",
    "GatewayResponseError",
    "GatewaySettings",
    "GatewayTimeoutError",
    "GatewayTransportError",
    "SamplingValue",
]

# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names.
_claim_public_names(__name__, globals())
