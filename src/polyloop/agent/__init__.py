"""The short path: ``Agent``, tools by decorator, typed structured output (design 0208).

::

    from polyloop import Agent, tool

    @tool(replay="safe")
    async def add(a: int, b: int) -> str:
        \"\"\"Add two integers.\"\"\"
        return str(a + b)

    agent = Agent("openai:gpt-4o-mini", tools=[add])
    result = agent.run_sync("What is 2 + 3?", run_id="sum-1")  # run it again: it resumes
    print(result.stop_reason.value, result.output)

An ``Agent`` builds the explicit objects and runs them: ``agent.definition()`` is the
``AgentDefinition`` and ``agent.request(prompt, run_id)`` the ``RunRequest``, so every
guarantee, the parameter snapshot and the drift guard are those of
``polyloop.session.run_or_resume``. ``tool`` is a spelling of ``ToolSpec.from_function``;
``OutputParser`` is how a dataclass, ``TypedDict``, JSON Schema or pydantic model becomes
the run's answer (a ``final_result`` tool, validated, recorded as JSON).

``import polyloop`` imports this module (standard library and polyloop only); the gateway
adapter, and httpx with it, is imported when a model string needs it, and the stores when an
``Agent`` is built without a store object.

The rooms, each importing only those below it (import-linter ``r16-agent-rooms``):
``_facade`` (the ``Agent``) > ``_child`` (a child run as a tool, design 0245) > ``_result``
(``AgentResult``, ``CallInDoubt``, the summary) | ``_output`` (output types, ``OutputParser``)
| ``_model`` (model strings) > ``_schema`` (the JSON Schema check) | ``_tool`` (``@tool``).
"""

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.agent._child import (
    CHILD_TASK_PARAMETERS,
    DEFAULT_CHILD_LEASE_WAIT,
    child_run_id,
    child_tool,
    tree_totals,
)
from polyloop.agent._facade import DEFAULT_STORE_DIRECTORY, Agent, new_run_id
from polyloop.agent._model import DEFAULT_BASE_URL, DEFAULT_READ_TIMEOUT_SECONDS, MODEL_PREFIX
from polyloop.agent._output import FINAL_RESULT_TOOL, OutputParser
from polyloop.agent._result import AgentResult, CallInDoubt
from polyloop.agent._tool import ReplayName, spec_of, tool

__all__ = [
    "CHILD_TASK_PARAMETERS",
    "DEFAULT_BASE_URL",
    "DEFAULT_CHILD_LEASE_WAIT",
    "DEFAULT_READ_TIMEOUT_SECONDS",
    "DEFAULT_STORE_DIRECTORY",
    "FINAL_RESULT_TOOL",
    "MODEL_PREFIX",
    "Agent",
    "AgentResult",
    "CallInDoubt",
    "OutputParser",
    "ReplayName",
    "child_run_id",
    "child_tool",
    "new_run_id",
    "spec_of",
    "tool",
    "tree_totals",
]

# Documented, printed and pickled as ``polyloop.agent.<name>``: the room is not API (design
# 0221).
_claim_public_names(__name__, globals())
