"""``ActionExecutorContract`` wired to the library's own ``RegistryExecutor``.

Both tools take no arguments, so argument validation plays no part. ``echo`` has no await
point on purpose: the dispatcher is then the only thing that could suspend, and it does not,
so the cancellation test skips here (the suspending double in
``test_action_executor_doubles.py`` runs its assertion). Adding ``await asyncio.sleep(0)`` to
the tool would turn that skip into a pass that tests the artificial wait, not the dispatcher.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from _doubles import ActionSamples

from polyloop.ports import ActionExecutor
from polyloop.testing import ActionExecutorContract, RecordFactory
from polyloop.tools import ToolRegistry, ToolSpec

pytestmark = pytest.mark.contract

_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


async def _returns_text(arguments: Mapping[str, object], /) -> str:
    return "the tool's output"


async def _raises(arguments: Mapping[str, object], /) -> str:
    # A plain error, deliberately not ToolEnvironmentError (which would mean ENV_ERROR):
    # the tool itself failed, so the action counts as executed.
    raise ValueError("the tool failed on its own")


class TestRegistryExecutor(ActionExecutorContract):
    @pytest.fixture
    def action_executor(self) -> ActionExecutor:
        registry = ToolRegistry(
            [
                ToolSpec(
                    name="echo",
                    description="Returns a fixed text.",
                    parameters=_NO_ARGUMENTS,
                    handler=_returns_text,
                ),
                ToolSpec(
                    name="boom",
                    description="Always fails.",
                    parameters=_NO_ARGUMENTS,
                    handler=_raises,
                ),
            ]
        )
        return registry.executor()

    @pytest.fixture
    def action_samples(self, records: RecordFactory) -> ActionSamples:
        return ActionSamples(
            executes_cleanly=records.action(text="echo", tool_name="echo"),
            executes_but_errors=records.action(text="boom", tool_name="boom"),
        )
