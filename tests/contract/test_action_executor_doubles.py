"""``ActionExecutorContract`` wired to two executor doubles from ``_doubles.py``.

The suspending double is where the cancellation test's assertion really runs (the registry
executor finishes within one tick). The quick double pins the other branch: an executor that
never suspends gets the documented skip, not a pass and not a failure.
"""

from __future__ import annotations

import pytest
from _doubles import ActionSamples, QuickActionExecutor, SuspendingActionExecutor

from polyloop.ports import ActionExecutor
from polyloop.testing import ActionExecutorContract, RecordFactory

pytestmark = pytest.mark.contract


class TestSuspendingActionExecutor(ActionExecutorContract):
    @pytest.fixture
    def action_executor(self) -> ActionExecutor:
        return SuspendingActionExecutor()

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        return ActionSamples(
            executes_cleanly=records.action(text="count to three"),
            executes_but_errors=records.action(text="FAIL divide by zero"),
        )


class TestQuickActionExecutor(ActionExecutorContract):
    @pytest.fixture
    def action_executor(self) -> ActionExecutor:
        return QuickActionExecutor()

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        return ActionSamples(
            executes_cleanly=records.action(text="count to three"),
            executes_but_errors=records.action(text="FAIL divide by zero"),
        )
