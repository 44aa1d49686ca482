"""The contract bases for seams that claim native tool calls (design 0100).

``NativeToolCallParserContract`` extends ``DecisionParserContract``; because the native reply
shape is fixed by ``polyloop.types`` (``ModelReply.tool_calls``), it builds its own replies and
the implementer only supplies the parser. ``NativeToolCallModelClientContract`` extends
``ModelClientContract`` and needs one more implementer-supplied call: one that carries tool
schemas and makes the implementation's endpoint answer with a tool call.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from polyloop.ports import (
    Action,
    DecisionParser,
    FinalAnswer,
    InvalidDecision,
    ModelCall,
    ModelClient,
)
from polyloop.testing._decision_parser import DecisionParserContract
from polyloop.testing._model_client import ModelClientContract
from polyloop.types import Message, ModelReply, NativeToolCall, Role, TextBlock

__all__ = ["NativeToolCallModelClientContract", "NativeToolCallParserContract"]


def _reply(
    *calls: tuple[str, str], content: str = "", finish_reason: str | None = "tool_calls"
) -> ModelReply:
    return ModelReply(
        call_id="chatcmpl-contract",
        content=content,
        tool_calls=tuple(
            NativeToolCall(id=f"call_{index}", name=name, arguments=arguments)
            for index, (name, arguments) in enumerate(calls)
        ),
        finish_reason=finish_reason,
    )


class NativeToolCallParserContract(DecisionParserContract):
    """Contract suite for a parser that reads ``ModelReply.tool_calls``. Override only
    ``decision_parser``::

        class TestMyNativeParser(NativeToolCallParserContract):
            @pytest.fixture
            def decision_parser(self):
                return MyNativeParser()

    Every test of ``DecisionParserContract`` runs too, with replies this base builds.
    """

    @pytest.fixture
    def reply_samples(self) -> Any:
        """Native replies: one well-formed call, and one whose arguments are not JSON."""
        return SimpleNamespace(
            yields_an_action=_reply(("lookup", '{"query": "polyloop"}')),
            yields_invalid=_reply(("lookup", '{"query": "polyl')),
        )

    def test_claims_native_tool_calls(self, decision_parser: DecisionParser) -> None:
        """The parser has ``native_tool_calls = True``.

        The session offers the run's tool schemas on a model call only for a parser that
        claims it; without the claim the model is never told about a tool and never calls one.
        """
        assert getattr(decision_parser, "native_tool_calls", None) is True

    def test_one_tool_call_becomes_an_action_with_its_name_and_arguments(
        self, decision_parser: DecisionParser
    ) -> None:
        """One call with JSON-object arguments is an ``Action`` whose ``ToolCall`` carries the
        call's name and the decoded arguments, so the registry can validate and dispatch it."""
        arguments = {"query": "polyloop", "limit": 3, "exact": True, "tags": ["a", "b"]}
        decision = decision_parser.parse(_reply(("lookup", json.dumps(arguments)))).decision
        assert isinstance(decision, Action)
        assert decision.tool_call is not None
        assert decision.tool_call.name == "lookup"
        assert dict(decision.tool_call.arguments) == arguments

    def test_every_tool_call_of_the_reply_goes_back_into_history(
        self, decision_parser: DecisionParser
    ) -> None:
        """``ParsedReply.tool_calls`` equals the reply's calls, whatever the verdict.

        The protocol wants every call of an assistant turn answered by a ``tool`` message
        with its id; a call missing from history makes the next request invalid, or makes a
        call vanish without the model ever hearing about it.
        """
        replies = [
            _reply(("lookup", '{"query": "x"}')),
            _reply(("lookup", "{broken")),
            _reply(("lookup", '{"query": "x"}'), ("fetch", '{"url": "u"}')),
            _reply(("lookup", '{"query": "x"}'), finish_reason="length"),
            _reply(content="The answer is 4.", finish_reason="stop"),
        ]
        for reply in replies:
            assert decision_parser.parse(reply).tool_calls == reply.tool_calls, reply

    def test_arguments_that_are_not_json_are_an_invalid_decision(
        self, decision_parser: DecisionParser
    ) -> None:
        """Arguments that do not decode as JSON never reach a tool; the model is told."""
        for raw in ('{"query": "polyl', "{'query': 'x'}", "query=x", '{"a": NaN}'):
            decision = decision_parser.parse(_reply(("lookup", raw))).decision
            assert isinstance(decision, InvalidDecision), raw
            assert decision.explanation.strip(), raw

    def test_arguments_that_are_not_a_json_object_are_an_invalid_decision(
        self, decision_parser: DecisionParser
    ) -> None:
        """Tool arguments are a JSON object of parameter name to value; an array, a string,
        a number or ``null`` is refused before any tool sees it."""
        for raw in ("[1, 2]", '"polyloop"', "3", "null", "true"):
            decision = decision_parser.parse(_reply(("lookup", raw))).decision
            assert isinstance(decision, InvalidDecision), raw

    def test_several_tool_calls_in_one_reply_are_refused_naming_each(
        self, decision_parser: DecisionParser
    ) -> None:
        """A reply with several calls is an ``InvalidDecision`` whose explanation names every
        tool called: polyloop runs one action per step, and no call may be dropped silently
        (design 0100)."""
        reply = _reply(("lookup", '{"query": "x"}'), ("fetch_page", '{"url": "u"}'))
        decision = decision_parser.parse(reply).decision
        assert isinstance(decision, InvalidDecision)
        assert "lookup" in decision.explanation
        assert "fetch_page" in decision.explanation

    def test_a_reply_cut_off_at_the_length_limit_is_not_acted_on(
        self, decision_parser: DecisionParser
    ) -> None:
        """``finish_reason "length"`` means the generation was cut off: even arguments that
        happen to decode may be incomplete, so nothing runs and the model is told."""
        reply = _reply(("lookup", '{"query": "po"}'), finish_reason="length")
        decision = decision_parser.parse(reply).decision
        assert isinstance(decision, InvalidDecision)
        assert decision.explanation.strip()

    def test_text_without_tool_calls_is_never_an_action(
        self, decision_parser: DecisionParser
    ) -> None:
        """Without a tool call there is nothing to dispatch: text is a final answer or an
        invalid decision, never an action the executor would have to guess."""
        for content in ("The answer is 4.", "", "   "):
            decision = decision_parser.parse(_reply(content=content, finish_reason="stop"))
            assert isinstance(decision.decision, FinalAnswer | InvalidDecision), content

    def test_odd_tool_calls_never_raise(self, decision_parser: DecisionParser) -> None:
        """Whatever the model put into a call, ``parse`` returns a verdict."""
        odd = [
            ("", "{}"),
            ("lookup", ""),
            ("lookup", "   "),
            ("lookup", "{}" * 3),
            ("lookup", "[" * 5000),
            ("lo\u0000okup", '{"q": "\\ud800"}'),
            ("lookup", '{"query": 1e999}'),
        ]
        for name, raw in odd:
            parsed = decision_parser.parse(_reply((name, raw)))
            assert isinstance(parsed.decision, Action | FinalAnswer | InvalidDecision)


class NativeToolCallModelClientContract(ModelClientContract):
    """Contract suite for a model client that sends ``ModelCall.tools`` through the provider's
    native function calling. Override ``model_client``, ``failing_call`` and
    ``tool_call_sample``::

        class TestMyNativeClient(NativeToolCallModelClientContract):
            ...
            @pytest.fixture
            def tool_call_sample(self, records):
                return records.model_call(
                    call_index=0, result_id="m0",
                    tools=[{"name": "lookup", "description": "...", "parameters": {...}}],
                )

    Every test of ``ModelClientContract`` runs too.
    """

    @pytest.fixture
    def tool_call_sample(self) -> ModelCall:
        """A ``ModelCall`` carrying tool schemas on which your endpoint answers with at least
        one tool call. Override it.

        The suite cannot make a model call a tool; only you know the endpoint (a stub that
        always answers with a call, a model prompted to call one). The call may be sent
        several times within one test.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits NativeToolCallModelClientContract but does not "
            "override the `tool_call_sample` fixture. Return a polyloop.ports.ModelCall with "
            "non-empty `tools` on which your endpoint answers with a tool call."
        )

    async def test_claims_native_tool_calls(self, model_client: ModelClient) -> None:
        """The client has ``native_tool_calls = True``; a parser that reads native calls is
        refused at construction next to a client that does not claim them."""
        assert getattr(model_client, "native_tool_calls", None) is True

    async def test_tool_calls_come_back_with_id_name_and_raw_arguments(
        self, model_client: ModelClient, tool_call_sample: ModelCall
    ) -> None:
        """The reply's ``tool_calls`` hold the provider's calls as ``NativeToolCall`` values:
        a non-empty id (the answer must carry it back), the tool name and the argument text
        as a string. A client that drops them leaves the run a streak of parse failures."""
        assert tool_call_sample.tools, "tool_call_sample must carry tool schemas"
        reply = await model_client.call(tool_call_sample)
        assert isinstance(reply, ModelReply)
        assert reply.tool_calls, "the endpoint answered tool_call_sample without a tool call"
        for call in reply.tool_calls:
            assert isinstance(call, NativeToolCall)
            assert call.id
            assert isinstance(call.name, str)
            assert isinstance(call.arguments, str)

    async def test_a_history_with_tool_turns_is_accepted(
        self, model_client: ModelClient, tool_call_sample: ModelCall
    ) -> None:
        """A prompt whose history holds an assistant turn with tool calls and one ``tool``
        message per call (what the session sends after a tool step) is sent and answered.

        A client that cannot express these turns fails the second step of every native run.
        """
        first = await model_client.call(tool_call_sample)
        assert first.tool_calls, "the endpoint answered tool_call_sample without a tool call"
        history = (
            Message(
                role=Role.ASSISTANT,
                content=(TextBlock(text=first.content),),
                tool_calls=first.tool_calls,
            ),
            *(
                Message(
                    role=Role.TOOL,
                    content=(TextBlock(text="observation"),),
                    tool_call_id=call.id,
                )
                for call in first.tool_calls
            ),
        )
        follow_up = ModelCall(
            messages=(*tool_call_sample.messages, *history),
            call_index=tool_call_sample.call_index + 1,
            run_id=tool_call_sample.run_id,
            result_id=f"{tool_call_sample.result_id}-next",
            binding=tool_call_sample.binding,
            tools=tool_call_sample.tools,
        )
        assert isinstance(await model_client.call(follow_up), ModelReply)
