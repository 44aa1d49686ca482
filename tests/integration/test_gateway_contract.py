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
from _openai_stub import OpenAIStub, chat_reply, tool_call_reply

from polyloop.adapters import GatewayModelClient, GatewaySettings
from polyloop.ports import ModelCall, ModelClient
from polyloop.testing import (
    ModelClientContract,
    NativeToolCallModelClientContract,
    RecordFactory,
)

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


LOOKUP_SCHEMA = {
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


class TestGatewayModelClientNativeToolCalls(NativeToolCallModelClientContract):
    """The same adapter certified for native tool calls: the stub answers every request with
    a tool call and ``content: null``, as OpenAI and vLLM do."""

    @pytest.fixture
    async def model_client(self) -> AsyncIterator[ModelClient]:
        reply = tool_call_reply(("call_1", "lookup", '{"word": "loop"}'), call_id="chatcmpl-2")
        async with (
            OpenAIStub(default=reply, latency=0.05) as stub,
            httpx.AsyncClient(timeout=10) as http,
        ):
            yield GatewayModelClient(
                client=http,
                settings=GatewaySettings(base_url=stub.base_url, model="stub-model"),
            )

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(
            call_index=0, result_id="m-refused", binding={"gateway.tools": "[]"}
        )

    @pytest.fixture
    def tool_call_sample(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m0", tools=[LOOKUP_SCHEMA])
