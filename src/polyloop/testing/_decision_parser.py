"""``DecisionParserContract``: what any decision parser must do.

Known shapes: one extracts Python source from a code fence, another extracts a tool name and
arguments from JSON. The library ships two optional stock parsers (``polyloop.parsers``: native
tool calls and JSON text), never a default one, because a default would pick an action language
for everybody. The replies come from the implementer (``reply_samples``): only the implementer
knows what a legal action looks like in its language. The suite checks the shape
of what comes out, never what goes in.

Parsing is pure computation, so every test here is synchronous and needs no event loop.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from polyloop.errors import PolyloopTypeError
from polyloop.ports import Action, DecisionParser, InvalidDecision, ParsedReply
from polyloop.testing._support import ContractBase, string_mapping_problems
from polyloop.types import ModelReply

__all__ = ["DecisionParserContract"]


def _sample(samples: Any, name: str) -> ModelReply:
    reply = getattr(samples, name, None)
    if not isinstance(reply, ModelReply):
        raise PolyloopTypeError(
            f"reply_samples.{name} must be a polyloop.types.ModelReply, got {reply!r}; the "
            "`reply_samples` fixture returns an object with the attributes "
            "`yields_an_action` and `yields_invalid`"
        )
    return reply


class DecisionParserContract(ContractBase):
    """Contract suite for the parsing seam. Override ``decision_parser`` and
    ``reply_samples``::

        class TestMyParser(DecisionParserContract):
            @pytest.fixture
            def decision_parser(self):
                return MyParser()

            @pytest.fixture
            def reply_samples(self, records):
                return SimpleNamespace(
                    yields_an_action=records.reply(content="```python\\nprint(1)\\n```"),
                    yields_invalid=records.reply(content="Let me think about it."),
                )
    """

    @pytest.fixture
    def decision_parser(self) -> DecisionParser:
        """The parser under test. Override it and return your instance."""
        raise NotImplementedError(
            f"{type(self).__name__} inherits DecisionParserContract but does not override "
            "the `decision_parser` fixture. Define `@pytest.fixture def decision_parser(self, "
            "...)` in your subclass and return an instance of your DecisionParser "
            "implementation."
        )

    @pytest.fixture
    def reply_samples(self) -> Any:
        """Two model replies in your parser's language. Override it.

        Return any object with two attributes, both ``polyloop.types.ModelReply``:

        * ``yields_an_action``: a reply your parser turns into an ``Action``;
        * ``yields_invalid``: a reply your parser turns into an ``InvalidDecision``.

        The suite parses each sample several times and requires equal results each time: a
        parser whose answer depends on an internal counter makes tests depend on their order,
        and pytest's order is not a promise. Parsing ``yields_an_action`` must have no external
        effect (the suite never executes the action, but a parser that sent a request would
        send it here).

        A parser that "understands everything" still supplies ``yields_invalid``: malformed
        model output happens every day, and the invalid branch must exist. Never pass off a
        reply that actually parses as an action: the suite would stay green, but green would
        then mean "this branch was not checked". If no invalid reply can exist, exempt the
        tests that use it in your subclass and write down why.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits DecisionParserContract but does not override "
            "the `reply_samples` fixture. Return an object with two attributes, both "
            "polyloop.types.ModelReply written in your parser's language: `yields_an_action` "
            "(parses to an Action) and `yields_invalid` (parses to an InvalidDecision). See "
            "the fixture's docstring."
        )

    # ------------------------------------------------------------ shape of the verdict

    def test_parse_is_synchronous(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """``parse`` returns its verdict directly, not an awaitable.

        Parsing is pure computation. An awaitable would force every caller and every test
        double to become async, and would invite I/O into parsing, which resume repeats when
        it re-parses the reply of an interrupted step.
        """
        parsed = decision_parser.parse(_sample(reply_samples, "yields_an_action"))
        if inspect.iscoroutine(parsed):
            parsed.close()  # spare the reader a second, "never awaited" warning
        assert not inspect.isawaitable(parsed)

    def test_parse_returns_a_parsed_reply(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """Both branches come back as ``polyloop.ports.ParsedReply``.

        The library reads ``history_text`` and ``decision`` from it and branches on the
        decision's class; a look-alike object fails there, far from the parser.
        """
        for name in ("yields_an_action", "yields_invalid"):
            parsed = decision_parser.parse(_sample(reply_samples, name))
            assert isinstance(parsed, ParsedReply), name

    def test_history_text_is_what_goes_back_into_the_conversation(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """``history_text`` is a string, on both branches.

        It becomes the assistant turn of the next prompt. The parser may rewrite it, and a
        rewrite may be shorter (cutting a hallucinated "output" after a code fence) or longer
        (restoring a fence a stop sequence cut off), so no length is asserted.
        """
        for name in ("yields_an_action", "yields_invalid"):
            parsed = decision_parser.parse(_sample(reply_samples, name))
            assert isinstance(parsed.history_text, str), name

    def test_invalid_decision_explanation_is_what_is_fed_back(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """The explanation of an invalid decision is a non-empty string.

        It is exactly the observation the model reads next, so it is the parser's to word:
        a parser with several distinct failure explanations keeps them distinct.
        """
        decision = decision_parser.parse(_sample(reply_samples, "yields_invalid")).decision
        assert isinstance(decision, InvalidDecision)
        assert isinstance(decision.explanation, str)
        assert decision.explanation != ""

    def test_invalid_decision_explanation_is_not_blank(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """The explanation has visible text, not only whitespace.

        ``InvalidDecision`` refuses ``""`` but accepts ``"  "``; a blank explanation is an
        observation that tells the model nothing about what to fix.
        """
        decision = decision_parser.parse(_sample(reply_samples, "yields_invalid")).decision
        assert isinstance(decision, InvalidDecision)
        assert decision.explanation.strip() != ""

    def test_action_carries_its_trace_form(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """The action sample yields an ``Action`` whose ``text`` is a string.

        ``text`` is how the action appears in the trajectory (source code, serialised
        arguments...); the implementer chooses it and the library stores it verbatim.
        """
        decision = decision_parser.parse(_sample(reply_samples, "yields_an_action")).decision
        assert isinstance(decision, Action)
        assert isinstance(decision.text, str)

    def test_unparseable_output_returns_invalid_decision_rather_than_raising(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """Unparseable output is returned as ``InvalidDecision``; ``parse`` does not raise.

        Returning it records the step, feeds the explanation back and lets the loop go on.
        An exception is not caught by the library: it ends the run and reaches the caller.
        """
        decision = decision_parser.parse(_sample(reply_samples, "yields_invalid")).decision
        assert isinstance(decision, InvalidDecision)
        assert decision.explanation != ""

    def test_parsing_the_same_reply_twice_gives_equal_verdicts(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """``parse`` is deterministic: the same reply gives an equal ``ParsedReply``.

        Resume re-parses the reply of an interrupted step; a different verdict the second
        time would continue the run from a step that never happened.
        """
        for name in ("yields_an_action", "yields_invalid"):
            reply = _sample(reply_samples, name)
            assert decision_parser.parse(reply) == decision_parser.parse(reply), name

    # ------------------------------------------------------------ parameters()

    def test_parameters_map_strings_to_strings(self, decision_parser: DecisionParser) -> None:
        """``parameters()`` is a mapping of ``str`` to ``str``; it enters the run's parameter
        snapshot, which is string-to-string, and the library refuses anything else."""
        assert string_mapping_problems(decision_parser.parameters()) == []

    def test_parameters_are_stable_across_calls(
        self, decision_parser: DecisionParser, reply_samples: Any
    ) -> None:
        """``parameters()`` reports configuration, not state: parsing does not change it, or
        every ``resume`` would refuse the run as drifted."""
        before = dict(decision_parser.parameters())
        decision_parser.parse(_sample(reply_samples, "yields_an_action"))
        decision_parser.parse(_sample(reply_samples, "yields_invalid"))
        assert dict(decision_parser.parameters()) == before
