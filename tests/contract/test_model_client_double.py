"""``ModelClientContract`` wired to the scripted model-client double from ``_doubles.py``.

The real ``GatewayModelClient`` is wired in ``tests/integration/`` (it needs a loopback HTTP
server). Here the suspending variant runs the cancellation assertion and the quick variant
pins the documented skip. ``failing_call`` is a call with no messages, which the double
refuses at input validation: its own guard, not a signal the suite invented.
"""

from __future__ import annotations

import pytest
from _doubles import ScriptedModelClient

from polyloop.ports import ModelCall, ModelClient
from polyloop.testing import ModelClientContract, RecordFactory

pytestmark = pytest.mark.contract

_SCRIPT = ("DO look around", "I am done.")


class TestScriptedModelClient(ModelClientContract):
    @pytest.fixture
    def model_client(self) -> ModelClient:
        return ScriptedModelClient(_SCRIPT)

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m-fails", messages=())


class TestQuickScriptedModelClient(ModelClientContract):
    @pytest.fixture
    def model_client(self) -> ModelClient:
        return ScriptedModelClient(_SCRIPT, pause_seconds=0)

    @pytest.fixture
    def failing_call(self, records: RecordFactory) -> ModelCall:
        return records.model_call(call_index=0, result_id="m-fails", messages=())
