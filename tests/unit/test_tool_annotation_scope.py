"""A tool whose annotation names something its module's globals lack (issue 36, point 6).

Under ``from __future__ import annotations`` (this module has it) every annotation is a string
resolved later in the module's globals, so a class defined inside a function, or a name
imported only there, cannot be found. The refusal must name the parameter and the annotation
and say it is a scope problem, not blame the type.
"""

from __future__ import annotations

import pytest

from polyloop import tool
from polyloop.errors import PolyloopTypeError
from polyloop.tools import ToolSpec

pytestmark = pytest.mark.unit


def test_a_locally_imported_context_type_is_named_with_its_parameter_and_the_fix() -> None:
    def build() -> ToolSpec:
        from polyloop.ports import ToolContext

        async def charge(ctx: ToolContext, amount: int) -> str:
            """Charge an amount."""
            return f"{ctx.action_id} {amount}"

        return ToolSpec.from_function(charge)

    with pytest.raises(PolyloopTypeError) as caught:
        build()
    message = str(caught.value)
    assert "parameter 'ctx' is annotated 'ToolContext'" in message
    assert "cannot be resolved where" in message
    assert "build.<locals>.charge is defined" in message
    assert "from __future__ import annotations" in message
    assert "Import ToolContext at module level" in message
    assert "<function" not in message


def test_a_local_class_in_a_generic_annotation_is_blamed_through_the_decorator() -> None:
    class Point:
        pass

    with pytest.raises(PolyloopTypeError, match=r"parameter 'points' is annotated 'list\[Point\]'"):

        @tool
        async def plot(points: list[Point]) -> str:
            """Plot the points."""
            return str(len(points))


def test_a_local_return_annotation_is_named_as_the_return_value() -> None:
    class Rendered(str):
        pass

    async def render(text: str) -> Rendered:
        """Render the text."""
        return Rendered(text)

    with pytest.raises(PolyloopTypeError, match="the return value is annotated 'Rendered'"):
        ToolSpec.from_function(render)
