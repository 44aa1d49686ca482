"""polyloop: execute one agent run under budgets, with a write-ahead log and exact resume.

The short path is ``from polyloop import Agent, tool`` (``polyloop.agent``, design 0208): an
agent from a model string or client, tools by decorator and a typed output, built from the
explicit objects below and run with ``polyloop.session.run_or_resume``. ``Pricing``
(``polyloop.session.Pricing``) and ``ModelPrices`` (``polyloop.types``; design 0236) state
what the model's tokens cost.

``import polyloop`` gives the public core modules: ``errors``, ``types``, ``ports``,
``tools``, ``sinks``, ``parsers``, ``session`` and ``serialization`` (so
``polyloop.session.run`` works after it; import names from those modules, e.g.
``from polyloop.session import run``). The optional
parts are imported explicitly, so that importing the core never drags in their dependencies:

* ``polyloop.stores``   - ``JsonlRunStore`` and ``VolatileRunStore``
* ``polyloop.adapters`` - ``GatewayModelClient`` (needs the ``gateway`` extra: httpx)
* ``polyloop.testing``  - the contract suite (needs the ``testing`` extra: pytest)
"""

from polyloop import errors, parsers, ports, serialization, session, sinks, tools, types
from polyloop._common import claim_public_names as _claim_public_names
from polyloop.agent import Agent, tool
from polyloop.session import Pricing
from polyloop.types import ModelPrices

__version__ = "0.2.0"

__all__ = [
    "Agent",
    "ModelPrices",
    "Pricing",
    "__version__",
    "errors",
    "parsers",
    "ports",
    "serialization",
    "session",
    "sinks",
    "tool",
    "tools",
    "types",
]

# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names.
_claim_public_names(__name__, globals())
