"""polyloop: execute one agent run under budgets, with a write-ahead log and exact resume.

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

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "errors",
    "parsers",
    "ports",
    "serialization",
    "session",
    "sinks",
    "tools",
    "types",
]
