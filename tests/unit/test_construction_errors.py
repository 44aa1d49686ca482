"""Programming mistakes are errors at construction, not run outcomes (issue 12, item 4).

Each mistake raises a ``TypeError`` (``PolyloopTypeError``) naming the field while the
``AgentDefinition``, ``RunRequest`` or ``ToolSpec`` is built, so no run id is ever used: the
store stays empty and the model is never called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest
from _session_doubles import (
    RecordingSink,
    ScriptedModel,
    TinyParser,
    definition,
    request,
)

from polyloop.errors import PolyloopTypeError
from polyloop.ports import Action
from polyloop.session import AgentDefinition
from polyloop.stores import VolatileRunStore
from polyloop.tools import ToolSpec
from polyloop.types import ActionOutcome, ModelReply

pytestmark = pytest.mark.unit


def _parts() -> dict[str, object]:
    agent = definition(ScriptedModel(["final:a"]))
    return {f.name: getattr(agent, f.name) for f in dataclasses.fields(agent)}


def test_a_parser_passed_as_the_model_client_is_refused_naming_the_field() -> None:
    store = VolatileRunStore()
    parts = _parts() | {"model_client": TinyParser(), "store": store}
    with pytest.raises(PolyloopTypeError) as info:
        AgentDefinition(**parts)  # type: ignore[arg-type]
    message = str(info.value)
    assert "AgentDefinition.model_client must be a ModelClient" in message
    assert "no method call()" in message
    assert "DecisionParser (the `decision_parser` field)" in message


def test_a_synchronous_tool_handler_is_refused_naming_the_tool() -> None:
    calls: list[Mapping[str, object]] = []

    def lookup(arguments: Mapping[str, object]) -> str:
        calls.append(arguments)
        return "found"

    with pytest.raises(PolyloopTypeError, match=r"ToolSpec\(name='lookup'\)\.handler .*async def"):
        ToolSpec(name="lookup", description="d", parameters={}, handler=lookup)  # type: ignore[arg-type]
    assert calls == []


def test_a_store_missing_a_method_is_refused_naming_the_field_and_the_method() -> None:
    class NoReadStore:
        async def write_run_started(self, record: object) -> None: ...
        async def write_intent(self, record: object) -> None: ...
        async def write_model_call_result(self, record: object) -> None: ...
        async def write_step_completed(self, record: object) -> None: ...
        async def write_run_finished(self, record: object) -> None: ...
        def parameters(self) -> Mapping[str, str]:
            return {}

    with pytest.raises(PolyloopTypeError, match=r"AgentDefinition\.store .*no method read_log\(\)"):
        AgentDefinition(**_parts() | {"store": NoReadStore()})  # type: ignore[arg-type]


def test_an_executor_missing_execute_is_refused_naming_the_request_field() -> None:
    class NoExecute:
        def parameters(self) -> Mapping[str, str]:
            return {}

    with pytest.raises(
        PolyloopTypeError, match=r"RunRequest\.action_executor .*no method execute\(\)"
    ):
        request(executor=NoExecute())


def test_a_synchronous_seam_method_that_the_library_awaits_is_refused() -> None:
    class SyncModel:
        def call(self, call: object) -> ModelReply:
            return ModelReply(call_id=None, content="x")

        def parameters(self) -> Mapping[str, str]:
            return {}

    with pytest.raises(PolyloopTypeError, match=r"model_client: SyncModel\.call must be .*async"):
        AgentDefinition(**_parts() | {"model_client": SyncModel()})  # type: ignore[arg-type]


def test_an_async_parse_is_refused_because_parsing_is_synchronous() -> None:
    class AsyncParser(TinyParser):
        async def parse(self, reply: ModelReply):  # type: ignore[no-untyped-def,override]
            return super().parse(reply)

    with pytest.raises(PolyloopTypeError, match=r"decision_parser: .*parse must be a plain"):
        AgentDefinition(**_parts() | {"decision_parser": AsyncParser()})  # type: ignore[arg-type]


def test_a_synchronous_execute_is_refused() -> None:
    class SyncExecutor:
        def execute(self, action: Action) -> ActionOutcome:
            raise AssertionError("never called")

        def parameters(self) -> Mapping[str, str]:
            return {}

    with pytest.raises(PolyloopTypeError, match=r"RunRequest\.action_executor: .*async def"):
        request(executor=SyncExecutor())


def test_the_shipped_doubles_and_callables_of_unknown_kind_are_accepted() -> None:
    class CallableSink:
        """``emit`` is an object with an async ``__call__``: its kind cannot be read from a
        plain function definition, so it is accepted as it is."""

        class _Emit:
            async def __call__(self, event: object) -> None:
                return None

        emit = _Emit()

        def parameters(self) -> Mapping[str, str]:
            return {}

    agent = AgentDefinition(**_parts() | {"event_sink": CallableSink()})  # type: ignore[arg-type]
    assert isinstance(agent.event_sink, CallableSink)
    assert isinstance(definition(ScriptedModel([]), sink=RecordingSink()), AgentDefinition)
