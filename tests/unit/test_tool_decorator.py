"""``@polyloop.tool``: a thin spelling of ``ToolSpec.from_function`` (issue 25, design 0208)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import pytest

from polyloop import tool
from polyloop.agent import spec_of
from polyloop.errors import PolyloopTypeError, PolyloopValueError
from polyloop.tools import Reconciliation, ToolContext, ToolSpec
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


def test_there_is_no_approval_option_until_approvals_exist() -> None:
    """``needs_approval`` arrives with approvals (issue 22); until then it is not accepted
    (an option that did nothing would be worse than none)."""
    assert "needs_approval" not in inspect.signature(tool).parameters
    with pytest.raises(TypeError):
        tool(needs_approval=True)  # type: ignore[call-overload]
