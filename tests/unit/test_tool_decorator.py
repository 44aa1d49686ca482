"""``@polyloop.tool``: a thin spelling of ``ToolSpec.from_function`` (issue 25, design 0208)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import pytest

from polyloop import tool
from polyloop.agent import spec_of
from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.tools import Reconciliation, ToolContext, ToolOptions, ToolSpec
from polyloop.types import ReplayPolicy

pytestmark = pytest.mark.unit


async def test_a_bare_decorator_keeps_the_function_and_defaults_to_never() -> None:
    async def lookup(query: str, limit: int = 3) -> str:
        """Look something up."""
        return f"{query}:{limit}"

    decorated = tool(lookup)

    assert decorated is lookup
    assert inspect.iscoroutinefunction(decorated)
    assert await decorated("x") == "x:3"  # still the function, callable as before
    spec = spec_of(lookup)
    assert spec == ToolSpec.from_function(lookup)  # the same spec from_function builds
    assert spec.replay_policy is ReplayPolicy.NEVER
    assert spec.completes_run is False
    assert spec.parameters["required"] == ("query",)  # specs are deep-frozen


@pytest.mark.parametrize(
    ("replay", "policy"),
    [
        ("never", ReplayPolicy.NEVER),
        ("idempotent", ReplayPolicy.IDEMPOTENT),
        ("safe", ReplayPolicy.SAFE),
        (ReplayPolicy.SAFE, ReplayPolicy.SAFE),
    ],
)
def test_replay_takes_the_policy_by_name_or_as_the_enum(
    replay: str | ReplayPolicy, policy: ReplayPolicy
) -> None:
    @tool(replay=replay)  # type: ignore[arg-type]
    async def read(path: str) -> str:
        """Read a file."""
        return path

    assert spec_of(read).replay_policy is policy


def test_name_description_and_completes_run_go_into_the_spec() -> None:
    @tool(name="submit_report", description="Submit the report.", completes_run=True)
    async def submit(text: str) -> str:
        """Not this text."""
        return "ok"

    spec = spec_of(submit)
    assert (spec.name, spec.description, spec.completes_run) == (
        "submit_report",
        "Submit the report.",
        True,
    )


async def test_a_tool_context_parameter_and_a_reconciler_pass_through() -> None:
    async def settle(context: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        return Reconciliation.not_executed()

    @tool(replay="idempotent", reconcile=settle)
    async def pay(amount: int, ctx: ToolContext) -> str:
        """Pay an amount."""
        return f"{amount} with {ctx.idempotency_key}"

    spec = spec_of(pay)
    assert spec.reconcile is settle
    assert "ctx" not in spec.parameters["properties"]
    assert spec.handler is not None
    context = ToolContext(idempotency_key="run-1.a0", run_id="run-1", step_idx=0)
    assert await spec.handler({"amount": 5}, context) == "5 with run-1.a0"  # type: ignore[call-arg]


def test_an_unknown_replay_name_is_refused_naming_the_three() -> None:
    with pytest.raises(PolyloopValueError) as caught:

        @tool(replay="sometimes")  # type: ignore[arg-type]
        async def ping() -> str:
            """Ping."""
            return "pong"

    message = str(caught.value)
    assert "replay='sometimes'" in message
    assert "ping" in message
    for name in ("'never'", "'idempotent'", "'safe'"):
        assert name in message


def test_a_policy_passed_positionally_is_refused_with_the_spelling() -> None:
    with pytest.raises(PolyloopTypeError, match=r"did you mean @tool\(replay='safe'\)"):
        tool("safe")  # type: ignore[call-overload]


def test_errors_of_from_function_surface_at_definition_naming_the_parameter() -> None:
    with pytest.raises(PolyloopTypeError, match="parameter 'query' has no type annotation"):

        @tool
        async def search(query) -> str:  # type: ignore[no-untyped-def]
            """Search."""
            return ""

    with pytest.raises(PolyloopTypeError, match="async def"):

        @tool
        def blocking(query: str) -> str:  # type: ignore[type-var]
            """Not async."""
            return query


def test_decorating_twice_is_refused() -> None:
    async def twice() -> str:
        """Twice."""
        return ""

    tool(twice)
    with pytest.raises(PolyloopValueError, match="already decorated"):
        tool(replay="safe")(twice)


def test_spec_of_an_undecorated_function_says_how_to_make_it_a_tool() -> None:
    async def plain(x: int) -> str:
        """Plain."""
        return ""

    with pytest.raises(PolyloopTypeError, match=r"@polyloop\.tool.*ToolSpec\.from_function"):
        spec_of(plain)


def test_needs_approval_true_reaches_the_spec() -> None:
    """Issue 36: ``@tool(needs_approval=True)`` raised ``TypeError``."""

    @tool(needs_approval=True)
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return ""

    spec = spec_of(refund)
    assert spec.needs_approval is True
    assert spec.asks_approval({"order": "A-17", "amount": 1}) is True
    assert spec == ToolSpec.from_function(refund, needs_approval=True)


def test_a_needs_approval_predicate_reaches_the_spec() -> None:
    def over_100(arguments: Mapping[str, object]) -> bool:
        return int(str(arguments["amount"])) > 100

    @tool(replay="idempotent", needs_approval=over_100)
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return ""

    spec = spec_of(refund)
    assert spec.needs_approval is over_100
    assert spec.replay_policy is ReplayPolicy.IDEMPOTENT
    assert spec.asks_approval({"order": "A-17", "amount": 250}) is True
    assert spec.asks_approval({"order": "A-17", "amount": 50}) is False


async def _settle(context: ToolContext, arguments: Mapping[str, object], /) -> Reconciliation:
    return Reconciliation.not_executed()


_ONE_VALUE_PER_OPTION: dict[str, object] = {
    "name": "renamed",
    "description": "Described here.",
    "completes_run": True,
    "reconcile": _settle,
    "needs_approval": True,
}


def test_every_option_of_from_function_is_an_option_of_tool() -> None:
    """One definition (design 0224): ``ToolOptions`` is what both take, so the keyword
    parameters of ``from_function`` besides the replay policy are exactly its keys."""
    keyword = {
        name
        for name, parameter in inspect.signature(ToolSpec.from_function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert keyword == {"replay_policy"}
    assert set(ToolOptions.__optional_keys__) == set(_ONE_VALUE_PER_OPTION)


@pytest.mark.parametrize("option", sorted(_ONE_VALUE_PER_OPTION))
def test_each_option_is_forwarded_to_from_function(option: str) -> None:
    value = _ONE_VALUE_PER_OPTION[option]

    async def act(x: int) -> str:
        """Act."""
        return ""

    decorated = tool(**{option: value})(act)  # type: ignore[call-overload]

    spec = spec_of(decorated)
    assert spec == ToolSpec.from_function(act, **{option: value})  # type: ignore[arg-type]
    assert spec != ToolSpec.from_function(act)


def test_an_unknown_option_is_refused_naming_the_options() -> None:
    async def act(x: int) -> str:
        """Act."""
        return ""

    with pytest.raises(PolyloopTypeError, match=r"'needs_aproval'.*needs_approval"):
        tool(needs_aproval=True)(act)  # type: ignore[call-overload]
    with pytest.raises(PolyloopTypeError, match=r"'needs_aproval'.*needs_approval"):
        ToolSpec.from_function(act, needs_aproval=True)  # type: ignore[call-arg]


def test_replay_policy_is_spelled_replay_on_the_decorator() -> None:
    async def act(x: int) -> str:
        """Act."""
        return ""

    with pytest.raises(PolyloopTypeError, match=r"replay="):
        tool(replay_policy=ReplayPolicy.SAFE)(act)  # type: ignore[call-overload]
