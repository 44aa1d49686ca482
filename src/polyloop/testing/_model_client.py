"""``ModelClientContract``: what any model client must do.

This layer does not reach a real model (that is an end-to-end concern). It checks the shape
of the reply and how failure is expressed, which a controlled setting can verify: a client
in front of a stub transport, or a client whose ``failing_call`` fails at input validation.
Known shapes range from a thin HTTP adapter to a client that books every call in a ledger;
all of them return a ``ModelReply`` and raise on failure.
"""

from __future__ import annotations

import inspect

import pytest

from polyloop.ports import ModelCall, ModelClient
from polyloop.testing._records import RecordFactory
from polyloop.testing._support import ContractBase, cancel_midway, string_mapping_problems
from polyloop.types import ModelReply

__all__ = ["ModelClientContract"]

_GOVERNANCE_PARAMETERS = frozenset({"retries", "max_retries", "backoff", "timeout", "rate_limit"})


class ModelClientContract(ContractBase):
    """Contract suite for the model seam. Override ``model_client`` and ``failing_call``::

    class TestMyClient(ModelClientContract):
        @pytest.fixture
        def model_client(self):
            return MyClient(transport=StubTransport())

        @pytest.fixture
        def failing_call(self, records):
            return records.model_call(call_index=0, result_id="m0", messages=())
    """

    @pytest.fixture
    def model_client(self) -> ModelClient:
        """The client under test. Override it and return your instance.

        Within one test the same instance may receive the failing call and then a normal
        one, so it must keep working after a failure.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits ModelClientContract but does not override the "
            "`model_client` fixture. Define `@pytest.fixture def model_client(self, ...)` in "
            "your subclass and return an instance of your ModelClient implementation (in "
            "front of a stub or local transport: the suite makes several calls)."
        )

    @pytest.fixture
    def failing_call(self) -> ModelCall:
        """A ``ModelCall`` that your client must fail on. Override it.

        The suite cannot invent one: only the implementation knows how it fails (an unknown
        model name, a prompt its validation refuses, an unsupported content block). A
        suite-invented secret signal would be a protocol no implementation agreed to, and a
        correct client that ignores it would be failed for succeeding.

        * ``call(failing_call)`` must **raise**; the exception type is yours to choose.
        * It must cost nothing and leave no external effect: fail before or while sending,
          ideally at input validation.
        * The client instance is shared with the other calls of the test, so it must keep
          serving after the failure.

        Every compliant client can fail: failure is an exception, never an empty reply. If
        you cannot build a failing call, your client either turns failures into empty
        replies (the breach this test exists to catch) or has no failure path yet; the usual
        fix is to raise on invalid input.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits ModelClientContract but does not override the "
            "`failing_call` fixture. Return a polyloop.ports.ModelCall on which your client's "
            "call() raises (any exception type), cheaply and without external side effects, "
            "for example one your input validation refuses. See the fixture's docstring."
        )

    # ------------------------------------------------------------ the reply

    async def test_returns_three_fields(
        self, model_client: ModelClient, records: RecordFactory
    ) -> None:
        """The reply is a ``ModelReply`` with string ``content`` and ``thinking`` and a
        ``call_id`` that is ``None`` or a string.

        The library counts the characters of content and thinking itself and never takes
        usage figures from the provider: relays recompute usage with their own tokenizer and
        drop details such as reasoning tokens.
        """
        reply = await model_client.call(records.model_call(call_index=0, result_id="m0"))
        assert isinstance(reply, ModelReply)
        assert isinstance(reply.content, str)
        assert isinstance(reply.thinking, str)
        assert reply.call_id is None or isinstance(reply.call_id, str)

    async def test_call_id_is_never_an_empty_string(
        self, model_client: ModelClient, records: RecordFactory
    ) -> None:
        """``call_id`` may be ``None`` but never ``""``.

        It is the only join key between a trajectory and the provider's bill; ``""`` would
        join silently and wrongly, where ``None`` honestly says "no id was given".
        """
        reply = await model_client.call(records.model_call(call_index=0, result_id="m0"))
        assert reply.call_id != ""

    async def test_failure_is_expressed_as_an_exception(
        self, model_client: ModelClient, failing_call: ModelCall
    ) -> None:
        """A call that fails raises; it never comes back as a reply.

        The library turns the exception into a failed ``ModelCallResult`` and stops with
        ``StopReason.LLM_ERROR``. An empty reply instead would be indistinguishable from a
        model that really answered "", and the two belong to different analyses.
        """
        with pytest.raises(Exception):  # noqa: B017 - the exception type belongs to the implementation
            await model_client.call(failing_call)

    async def test_the_client_keeps_working_after_a_failed_call(
        self, model_client: ModelClient, failing_call: ModelCall, records: RecordFactory
    ) -> None:
        """After a failed call, the same instance serves the next call normally.

        A run stops at the failure, but the client object usually outlives the run (one
        client per batch); a client that is broken by one failure fails every later run.
        """
        with pytest.raises(Exception):  # noqa: B017 - the exception type belongs to the implementation
            await model_client.call(failing_call)
        reply = await model_client.call(records.model_call(call_index=1, result_id="m1"))
        assert isinstance(reply, ModelReply)

    async def test_cancellation_propagates_and_is_not_swallowed(
        self, model_client: ModelClient, records: RecordFactory
    ) -> None:
        """Cancelling a call midway raises ``asyncio.CancelledError`` out of it.

        A swallowed cancellation leaks the in-flight request and its connection. A client
        that answers within one event-loop tick (a stub without a real wait) cannot swallow
        anything and is skipped rather than passed or failed: an admission test that is red
        only sometimes teaches everyone to ignore red.
        """
        await cancel_midway(model_client.call(records.model_call(call_index=0, result_id="m0")))

    async def test_signature_carries_no_retry_or_rate_limit_parameters(
        self, model_client: ModelClient
    ) -> None:
        """``call`` takes no retry, backoff, timeout or rate-limit parameter.

        Governing model calls (retries, backoff, limits, fallbacks) belongs to the gateway in
        front of the model. The Protocol's signature is itself a promise, which is why a
        parameter name is worth asserting.
        """
        names = set(inspect.signature(model_client.call).parameters)
        assert names.isdisjoint(_GOVERNANCE_PARAMETERS), sorted(names & _GOVERNANCE_PARAMETERS)

    # ------------------------------------------------------------ parameters()

    async def test_parameters_map_strings_to_strings(self, model_client: ModelClient) -> None:
        """``parameters()`` is a mapping of ``str`` to ``str``; it enters the run's parameter
        snapshot, which is string-to-string, and the library refuses anything else."""
        assert string_mapping_problems(model_client.parameters()) == []

    async def test_parameters_are_stable_across_calls(
        self, model_client: ModelClient, records: RecordFactory
    ) -> None:
        """``parameters()`` reports the model identity, not state: making a call does not
        change it. A call counter or a last response id in it would make every ``resume``
        refuse the run as drifted."""
        before = dict(model_client.parameters())
        await model_client.call(records.model_call(call_index=0, result_id="m0"))
        assert dict(model_client.parameters()) == before
