"""``polyloop.testing.ScriptedModelClient``: every promise of its docstring.

The seam contract it keeps is certified in ``tests/contract/test_model_client_double.py``;
this file pins what the docstring adds: which entry answers which call, what each kind of entry
does, what happens past the end of the script, what is recorded and when, and the validation.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from _session_doubles import CodeExecutor, definition, request

from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.ports import ModelCall
from polyloop.session import resume, run
from polyloop.stores import VolatileRunStore
from polyloop.testing import RecordFactory, ScriptedModelClient
from polyloop.types import ModelReply, NativeToolCall, ReplayPolicy, StopReason

pytestmark = pytest.mark.unit

RECORDS = RecordFactory()


def call_at(index: int, *, run_id: str = "r1") -> ModelCall:
    return RECORDS.model_call(call_index=index, result_id=f"m{index}", run_id=run_id)


# --------------------------------------------------------------------------- which entry


async def test_a_text_entry_answers_the_call_with_its_call_index() -> None:
    model = ScriptedModelClient(["zero", "one", "two"], thinking="hmm")
    assert await model.call(call_at(2)) == ModelReply(
        call_id="call-2", content="two", thinking="hmm"
    )
    assert (await model.call(call_at(0))).content == "zero"
    assert (await model.call(call_at(0, run_id="r2"))).content == "zero", "one client, two runs"


async def test_the_call_id_prefix_can_change_or_go() -> None:
    assert (await ScriptedModelClient(["a"], call_id_prefix="c").call(call_at(0))).call_id == "c0"
    assert (await ScriptedModelClient(["a"], call_id_prefix=None).call(call_at(0))).call_id is None


async def test_arrival_order_ignores_the_call_index() -> None:
    model = ScriptedModelClient(["first", "second"], index_by="arrival")
    replies = [await model.call(call_at(7)), await model.call(call_at(0))]
    assert [(r.call_id, r.content) for r in replies] == [("call-0", "first"), ("call-1", "second")]


async def test_a_model_reply_entry_is_returned_as_it_is() -> None:
    scripted = ModelReply(
        call_id="provider-9",
        content="",
        tool_calls=(NativeToolCall(id="t1", name="lookup", arguments="{}"),),
        finish_reason="tool_calls",
    )
    model = ScriptedModelClient([scripted], thinking="ignored for a whole reply")
    assert await model.call(call_at(0)) is scripted


async def test_an_exception_entry_is_raised_each_time_it_answers() -> None:
    boom = ConnectionError("the endpoint went away")
    model = ScriptedModelClient(["ok", boom], when_exhausted="repeat_last")
    assert (await model.call(call_at(0))).content == "ok"
    for index in (1, 2):
        with pytest.raises(ConnectionError) as raised:
            await model.call(call_at(index))
        assert raised.value is boom


# --------------------------------------------------------------------------- past the end


async def test_past_the_end_raises_by_default_naming_the_position_and_the_length() -> None:
    model = ScriptedModelClient(["only"])
    with pytest.raises(PolyloopValueError, match=r"call_index 1: the script has 1 reply;"):
        await model.call(call_at(1))
    assert (await model.call(call_at(0))).content == "only", "still serving"
    empty = ScriptedModelClient([], index_by="arrival")
    with pytest.raises(PolyloopValueError, match=r"call number \(arrival\) 0: .* 0 replies"):
        await empty.call(call_at(0))


async def test_past_the_end_repeats_the_last_entry_or_cycles_when_asked() -> None:
    repeating = ScriptedModelClient(["a", "b"], when_exhausted="repeat_last")
    cycling = ScriptedModelClient(["a", "b"], when_exhausted="cycle")
    assert [(await repeating.call(call_at(i))).content for i in range(4)] == ["a", "b", "b", "b"]
    assert [(await cycling.call(call_at(i))).content for i in range(4)] == ["a", "b", "a", "b"]
    assert (await cycling.call(call_at(3))).call_id == "call-3", "the position, not the entry"


# --------------------------------------------------------------------------- refusal, records


async def test_a_call_without_messages_is_refused_recorded_and_uses_no_entry() -> None:
    model = ScriptedModelClient(["first"], index_by="arrival")
    empty = RECORDS.model_call(call_index=0, result_id="m0", messages=())
    with pytest.raises(PolyloopValueError, match="messages is empty"):
        await model.call(empty)
    assert (await model.call(call_at(0))).content == "first"
    assert model.calls == [empty, call_at(0)]


async def test_a_call_is_recorded_before_it_is_answered() -> None:
    release = asyncio.Event()

    class Held(ScriptedModelClient):
        async def before_reply(self, call: ModelCall) -> None:
            await release.wait()

    model = Held(["late"])
    task = asyncio.ensure_future(model.call(call_at(0)))
    await asyncio.sleep(0)
    assert model.calls == [call_at(0)], "in flight, already recorded"
    assert not task.done()
    release.set()
    assert (await task).content == "late"


async def test_the_delay_suspends_the_call_so_a_cancellation_lands() -> None:
    model = ScriptedModelClient(["slow"], delay=30.0)
    task = asyncio.ensure_future(model.call(call_at(0)))
    await asyncio.sleep(0)
    assert task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(model.calls) == 1


def test_replies_is_a_copy_of_the_script() -> None:
    script = ["a", "b"]
    model = ScriptedModelClient(script)
    script.append("c")
    assert model.replies == ("a", "b")


# --------------------------------------------------------------------------- identity


async def test_parameters_are_given_or_the_default_and_do_not_change() -> None:
    assert dict(ScriptedModelClient(["a"]).parameters()) == {"kind": "scripted"}
    given = {"model": "scripted-v2"}
    model = ScriptedModelClient(["a"], parameters=given)
    given["model"] = "changed later"
    await model.call(call_at(0))
    assert dict(model.parameters()) == {"model": "scripted-v2"}


def test_native_tool_calls_is_the_class_attribute_unless_given() -> None:
    assert ScriptedModelClient(["a"]).native_tool_calls is False
    assert ScriptedModelClient(["a"], native_tool_calls=True).native_tool_calls is True

    class Native(ScriptedModelClient):
        native_tool_calls = True

    assert Native(["a"]).native_tool_calls is True
    assert Native(["a"], native_tool_calls=False).native_tool_calls is False


def test_repr_names_the_script_length_and_the_modes() -> None:
    assert repr(ScriptedModelClient(["a", "b"], when_exhausted="cycle")) == (
        "ScriptedModelClient(2 replies, index_by='call_index', when_exhausted='cycle')"
    )


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("arguments", "error", "words"),
    [
        ({"replies": "one reply"}, PolyloopTypeError, "not one string"),
        ({"replies": [TimeoutError]}, PolyloopTypeError, r"replies\[0\] .* not the class"),
        ({"replies": ["a", 3]}, PolyloopTypeError, r"replies\[1\] must be a str"),
        ({"replies": ["a"], "index_by": "order"}, PolyloopValueError, "index_by"),
        ({"replies": ["a"], "when_exhausted": "loop"}, PolyloopValueError, "when_exhausted"),
        ({"replies": [], "when_exhausted": "cycle"}, PolyloopValueError, "at least one reply"),
        ({"replies": ["a"], "thinking": None}, PolyloopTypeError, "thinking"),
        ({"replies": ["a"], "call_id_prefix": 1}, PolyloopTypeError, "call_id_prefix"),
        ({"replies": ["a"], "delay": True}, PolyloopTypeError, "delay"),
        ({"replies": ["a"], "delay": -1}, PolyloopValueError, "delay"),
        ({"replies": ["a"], "delay": math.inf}, PolyloopValueError, "delay"),
        ({"replies": ["a"], "parameters": [("k", "v")]}, PolyloopTypeError, "parameters"),
        ({"replies": ["a"], "parameters": {"k": 1}}, PolyloopTypeError, "'k': 1"),
        ({"replies": ["a"], "native_tool_calls": 1}, PolyloopTypeError, "native_tool_calls"),
    ],
)
def test_construction_refuses_what_it_cannot_replay(
    arguments: dict[str, object], error: type[Exception], words: str
) -> None:
    replies = arguments.pop("replies")
    with pytest.raises(error, match=words):
        ScriptedModelClient(replies, **arguments)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- in a run


async def test_a_run_gets_one_entry_per_step_and_a_resume_the_same_entries() -> None:
    store = VolatileRunStore()
    first = ScriptedModelClient(["code:a", "code:b", "final:done"])
    req = request(executor=CodeExecutor(), model_policy=ReplayPolicy.SAFE)
    result = await run(definition(first, store=store), req)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert [s.action for s in result.steps] == ["a", "b", None]
    assert [c.call_index for c in first.calls] == [0, 1, 2]
    again = ScriptedModelClient(first.replies)
    assert await resume(definition(again, store=store), req) == result
    assert again.calls == [], "a finished run is not called again"


async def test_a_run_that_outlives_its_script_stops_with_llm_error_naming_it() -> None:
    store = VolatileRunStore()
    model = ScriptedModelClient(["code:a"])
    result = await run(definition(model, store=store), request(executor=CodeExecutor()))
    assert result.stop_reason is StopReason.LLM_ERROR
    log = await store.read_log("run-1")
    failure = log.model_results[-1].failure
    assert failure is not None
    assert "no reply is scripted for call_index 1" in failure
