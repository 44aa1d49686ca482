"""``polyloop._common.trusted``: records the library builds from validated parts, without
re-running their checks (design 0214, second pass). The object must be indistinguishable
from the validated one, and an incomplete field list must not slip through."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

import pytest
from _session_doubles import (
    CONTEXT,
    CodeExecutor,
    RecordingSink,
    ScriptedModel,
    definition,
    request,
)

from _trees import Ledger, Tree, TreeModel
from polyloop import _assembly, _recovery
from polyloop._common import trusted
from polyloop.errors import PolyloopTypeError
from polyloop.ports import Action, FinalAnswer, LogEntry, ParsedReply
from polyloop.session import run, run_or_resume
from polyloop.stores import VolatileRunStore
from polyloop.types import (
    ActionOutcome,
    Intent,
    IntentKind,
    ModelReply,
    NativeToolCall,
    ReplayPolicy,
    StopReason,
)

pytestmark = pytest.mark.unit

_FIELDS: dict[str, object] = {
    "run_id": "run-1",
    "kind": IntentKind.MODEL_CALL,
    "call_index": 3,
    "result_id": "m3",
    "replay_policy": ReplayPolicy.SAFE,
    "idempotency_key": _recovery.idempotency_key("run-1", "m3"),
    "resumed": None,
}


def test_a_trusted_record_equals_the_validated_one_field_by_field() -> None:
    built = trusted(Intent, **_FIELDS)
    checked = Intent(**_FIELDS)  # type: ignore[arg-type]
    assert type(built) is Intent
    assert built == checked
    assert hash(built) == hash(checked)
    assert repr(built) == repr(checked)
    assert {name: getattr(built, name) for name in _FIELDS} == _FIELDS


@pytest.mark.parametrize(
    "fields",
    [
        {k: v for k, v in _FIELDS.items() if k != "resumed"},  # a default left out
        {**_FIELDS, "extra": 1},
        {**{k: v for k, v in _FIELDS.items() if k != "resumed"}, "resume": None},  # misspelt
    ],
)
def test_a_trusted_record_needs_exactly_its_fields(fields: dict[str, object]) -> None:
    with pytest.raises(PolyloopTypeError, match=r"trusted\(Intent\) needs exactly the fields"):
        trusted(Intent, **fields)


def test_the_action_handed_to_the_executor_is_built_from_every_field_of_action() -> None:
    """``StepRunner._with_context`` builds ``Action(text=, tool_call=, context=)`` directly
    instead of ``dataclasses.replace`` (design 0214, second pass): a new ``Action`` field must
    be added there too, or the executor would get the field's default instead."""
    assert [f.name for f in dataclasses.fields(Action)] == ["text", "tool_call", "context"]


@pytest.mark.parametrize(
    ("script", "kinds"),
    [
        (["code:a", "nonsense", "final:42"], ["action", "parse_error", "final"]),
        (["code:envfail"], ["action"]),
        ([RuntimeError("down")], ["model_failed"]),
    ],
)
async def test_the_steps_and_intents_a_run_builds_pass_their_own_checks(
    script: list[object], kinds: list[str]
) -> None:
    """Built without re-validation, they must still be records their ``__post_init__``
    accepts unchanged: every kind of step (an action, an env failure, an unparsable reply, a
    failed model call, a final answer) is rebuilt through validation and compared."""
    agent = definition(ScriptedModel(script))
    result = await run(agent, request(executor=CodeExecutor()))
    seen = [
        "action"
        if s.action is not None
        else "parse_error"
        if not s.parse_ok
        else "model_failed"
        if s.call_id is None and not s.raw_output
        else "final"
        for s in result.steps
    ]
    assert seen == kinds
    log = await agent.store.read_log("run-1")
    for step in result.steps:
        assert dataclasses.replace(step) == step  # replace() runs __post_init__
    for record in (*log.intents, *log.steps):
        assert dataclasses.replace(record) == record
    assert tuple(c.step for c in log.steps) == result.steps  # decoded (validated) from the log


class _Recording(CodeExecutor):
    """A ``CodeExecutor`` that keeps every ``Action`` it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: list[Action] = []

    async def execute(self, action: Action) -> ActionOutcome:
        self.actions.append(action)
        return await super().execute(action)


async def test_every_object_a_step_hands_out_passes_its_own_checks() -> None:
    """Design 0214, third pass: the session builds each ``ModelCall`` (and the history
    messages in it), ``ModelCallResult``, ``StepCompleted``, ``Action``, ``ToolContext`` and
    ``Event`` without running their ``__post_init__``. Each one a model client, an executor,
    a sink or the log gets is rebuilt through validation here and must come out equal, with
    read-only mappings where the validated one has them."""
    model = ScriptedModel(["code:a", "nonsense", "code:b", "final:42"])
    sink = RecordingSink()
    agent = definition(model, sink=sink)
    executor = _Recording()
    result = await run(agent, request(executor=executor, model_binding={"temperature": "0"}))
    assert len(result.steps) == len(model.calls) == len(sink.events) == 4
    assert len(executor.actions) == 2
    for call in model.calls:
        assert dataclasses.replace(call) == call
        assert isinstance(call.binding, MappingProxyType)
        for message in call.messages:
            assert dataclasses.replace(message) == message
            for block in message.content:
                assert dataclasses.replace(block) == block
    for event in sink.events:
        assert dataclasses.replace(event) == event
        assert isinstance(event.model_binding, MappingProxyType)
    for action in executor.actions:
        assert dataclasses.replace(action) == action
        assert action.context is not None
        assert dataclasses.replace(action.context) == action.context
    log = await agent.store.read_log("run-1")
    for record in (*log.model_results, *log.steps):
        assert dataclasses.replace(record) == record
    # The prompt each call got is the one a fresh assembly of its steps gives.
    last = model.calls[-1]
    assert last.messages == _assembly.assemble(
        context=CONTEXT,
        injections={},
        steps=result.steps[:-1],
        observation_template="Observation: {observation}",
    )


@dataclasses.dataclass(frozen=True)
class _NoSlots:
    first: int
    second: str = "x"

    def __post_init__(self) -> None:
        raise AssertionError("trusted() must not run __post_init__")


def test_a_class_without_slots_is_built_too() -> None:
    built = trusted(_NoSlots, first=1, second="y")
    assert (built.first, built.second) == (1, "y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.first = 2  # type: ignore[misc]


def test_fields_named_like_the_builders_own_locals_are_set_as_given() -> None:
    """The generated builder's own names cannot shadow a field: ``LogEntry`` has a field
    named ``record``, and a class may have fields named ``_new`` or ``_cls``."""
    entry = trusted(LogEntry, line=1, record="X")  # type: ignore[arg-type]
    assert entry.record == "X"

    @dataclasses.dataclass(frozen=True, slots=True)
    class Odd:
        _new: int
        _cls: int
        build: int

    odd = trusted(Odd, _new=1, _cls=2, build=3)
    assert (odd._new, odd._cls, odd.build) == (1, 2, 3)


def test_a_class_with_a_field_taking_the_builders_prefix_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Clash:
        __trusted_x__: int

    with pytest.raises(PolyloopTypeError, match="builder's own"):
        trusted(Clash, __trusted_x__=1)


class _DuplicateIdsParser:
    """A parser that passes two tool calls with one id through (a parser bug)."""

    def parse(self, reply: ModelReply) -> ParsedReply:
        call = NativeToolCall(id="same", name="noop", arguments="{}")
        return ParsedReply(
            history_text=reply.content,
            decision=FinalAnswer(text="done"),
            tool_calls=(call, call),
        )

    def parameters(self) -> dict[str, str]:
        return {"kind": "duplicate-ids"}


async def test_a_parser_handing_two_calls_one_id_is_a_contained_breach() -> None:
    """The step record is built without its checks, so the duplicate ids are refused where the
    parser answers (``ParsedReply``): the step is a parser error (design 0161) and the log,
    which would otherwise hold a step no read can decode, stays readable."""
    agent = dataclasses.replace(
        definition(ScriptedModel(["anything"])), decision_parser=_DuplicateIdsParser()
    )
    result = await run(agent, request())
    assert result.stop_reason is StopReason.PARSER_ERROR
    assert "twice" in (result.steps[0].parse_error or "")
    log = await agent.store.read_log("run-1")
    assert log.steps[0].step == result.steps[0]


async def test_a_tree_of_runs_hands_out_records_that_pass_their_own_checks(
    tmp_path: Path,
) -> None:
    """Design 0245: a step that ran a child run carries the ``ChildRun`` its tool reported;
    built without re-validation, every step and record of every run of the tree still passes
    its ``__post_init__`` unchanged, and the decoded log holds the same steps."""
    store = VolatileRunStore()
    tree = Tree(TreeModel(), store, Ledger(tmp_path / "l.txt"), steps=40)
    await run_or_resume(tree.definition, tree.request("root"))
    for run_id in ("root", "root.a1", "root.a3.a3"):
        log = await store.read_log(run_id)
        assert log.finished is not None
        for step in log.finished.result.steps:
            assert dataclasses.replace(step) == step
            if step.child is not None:
                assert dataclasses.replace(step.child) == step.child
        for record in (*log.intents, *log.steps):
            assert dataclasses.replace(record) == record
        assert log.started is not None
        assert dataclasses.replace(log.started) == log.started
    root = (await store.read_log("root")).finished
    assert root is not None
    assert [s.child.run_id for s in root.result.steps if s.child] == ["root.a1", "root.a3"]
