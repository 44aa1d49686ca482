"""``ModelClientContract`` wired to the public scripted model client.

``polyloop.testing.ScriptedModelClient`` ships in the wheel as a test double for users, so it
is certified like any other model client. The real ``GatewayModelClient`` is wired in
``tests/integration/`` (it needs a loopback HTTP server). Here the suspending variant (a real
``delay``) runs the cancellation assertion and the quick variant (the default, no delay) pins
the documented skip. ``failing_call`` is a call with no messages, which the client refuses at
input validation: its own guard, not a signal the suite invented. A third wiring fails through
the script instead (an exception entry), and a fourth certifies the native tool-call claim.
"""

from __future__ import annotations

import pytest
from _doubles import PAUSE_SECONDS

from polyloop.ports import ModelCall, ModelClient
from polyloop.testing import (
    ModelClientContract,
    NativeToolCallModelClientContract,
    RecordFactory,
    ScriptedModelClient,
)
from polyloop.types import ModelReply, NativeToolCall

pytestmark = pytest.mark.contract

_SCRIPT = ("DO look around", "I am done.")
_LOOKUP = {"name": "lookup", "description": "Look a word up.", "parameters": {"type": "object"}}


class _RefusesAnEmptyPrompt:
    """``failing_call`` for every wiring that fails by the client's own input validation."""

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m-fails", messages=())


class TestScriptedModelClient(_RefusesAnEmptyPrompt, ModelClientContract):
    @pytest.fixture
    def model_client(self) -> ModelClient:
        return ScriptedModelClient(_SCRIPT, delay=PAUSE_SECONDS)


class TestQuickScriptedModelClient(_RefusesAnEmptyPrompt, ModelClientContract):
    @pytest.fixture
    def model_client(self) -> ModelClient:
        return ScriptedModelClient(_SCRIPT)


class TestScriptedModelClientFailingByScript(ModelClientContract):
    """The failure is an entry of the script: call index 2 raises, 0 and 1 answer."""

    @pytest.fixture
    def model_client(self) -> ModelClient:
        return ScriptedModelClient(
            [*_SCRIPT, ConnectionError("the endpoint went away")], delay=PAUSE_SECONDS
        )

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=2, result_id="m-fails")


class TestNativeScriptedModelClient(_RefusesAnEmptyPrompt, NativeToolCallModelClientContract):
    """Claims native tool calls and answers call 0 with a call of ``lookup``."""

    @pytest.fixture
    def model_client(self) -> ModelClient:
        lookup = NativeToolCall(id="tc-0", name="lookup", arguments='{"word": "loop"}')
        return ScriptedModelClient(
            [ModelReply(call_id="call-0", content="", tool_calls=(lookup,)), "It means a cycle."],
            native_tool_calls=True,
            delay=PAUSE_SECONDS,
        )

    @pytest.fixture
    def tool_call_sample(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m0", tools=[_LOOKUP])
