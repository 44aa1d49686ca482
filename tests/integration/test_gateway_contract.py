"""``ModelClientContract`` wired to the real ``GatewayModelClient`` over loopback HTTP.

The stub answers every call after a short latency, so the contract's cancellation test finds
a request in flight. ``failing_call`` carries a binding the adapter refuses before sending
anything (``gateway.model`` would override the model identity): a failure that costs nothing
and leaves nothing behind, as the contract asks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from _openai_stub import OpenAIStub, chat_reply

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import ModelCall, ModelClient
from polyloop.testing import ModelClientContract, RecordFactory

pytestmark = pytest.mark.integration


class TestGatewayModelClient(ModelClientContract):
    @pytest.fixture
    async def model_client(self) -> AsyncIterator[ModelClient]:
        async with (
            OpenAIStub(default=chat_reply("hello", call_id="chatcmpl-1"), latency=0.05) as stub,
            httpx.AsyncClient(timeout=10) as http,
        ):
            yield GatewayModelClient(
                client=http,
                settings=GatewaySettings(base_url=stub.base_url, model="stub-model"),
            )

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(
            call_index=0, result_id="m-refused", binding={"gateway.model": "other"}
        )
