"""``GatewayModelClient`` against a real OpenAI-compatible endpoint.

Off by default: the suite deselects the ``e2e`` marker, and even with ``-m e2e`` these tests
skip unless ``POLYLOOP_E2E=1``. Configure the endpoint through the environment (``.env.example``
lists the keys):

* ``POLYLOOP_E2E_BASE_URL`` - the API root, e.g. ``http://127.0.0.1:8080/v1`` (required)
* ``POLYLOOP_E2E_MODEL`` - the model name the endpoint serves (required)
* ``POLYLOOP_E2E_API_KEY`` - sent as ``Authorization: Bearer <key>`` when set (optional)

Run: ``POLYLOOP_E2E=1 POLYLOOP_E2E_BASE_URL=... POLYLOOP_E2E_MODEL=... pytest -m e2e``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import httpx
import pytest

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import ModelCall
from polyloop.types import Message, ModelReply, Role, TextBlock

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("POLYLOOP_E2E") != "1",
        reason="needs a real model endpoint: set POLYLOOP_E2E=1, POLYLOOP_E2E_BASE_URL and "
        "POLYLOOP_E2E_MODEL (optionally POLYLOOP_E2E_API_KEY) and run with -m e2e",
    ),
]


def _required(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(f"POLYLOOP_E2E=1 but {name} is not set; see .env.example for the keys")
    return value


@pytest.fixture
def settings() -> GatewaySettings:
    return GatewaySettings(
        base_url=_required("POLYLOOP_E2E_BASE_URL"),
        model=_required("POLYLOOP_E2E_MODEL"),
        sampling={"temperature": 0.0, "max_tokens": 32},
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    api_key = os.environ.get("POLYLOOP_E2E_API_KEY", "").strip()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(120.0)) as client:
        yield client


async def test_one_real_call_returns_a_reply(
    http: httpx.AsyncClient, settings: GatewaySettings
) -> None:
    gateway = GatewayModelClient(client=http, settings=settings)
    call = ModelCall(
        messages=(
            Message(
                role=Role.USER,
                content=(TextBlock(text="Question: what is 2 + 2?\nAnswer with one number:"),),
            ),
        ),
        call_index=0,
        run_id="e2e-gateway",
        result_id="m0",
        binding={"suite": "e2e"},
    )
    reply = await gateway.call(call)
    assert isinstance(reply, ModelReply)
    assert reply.call_id is None or reply.call_id != ""
    assert (reply.content + reply.thinking).strip(), "a real model should say something"
    api_key = os.environ.get("POLYLOOP_E2E_API_KEY", "").strip()
    if api_key:
        assert not any(api_key in value for value in gateway.parameters().values())
