"""The contract suite: certify your own implementation of a polyloop seam.

polyloop talks to the world through five seams (``polyloop.ports``): a model client, a
decision parser, an action executor, a run store and an event sink. This package ships one
test base class per seam. It contains no implementation of its own; each base states what
*any* implementation must do. Subclass the base that matches what you wrote, tell it how to
build your implementation, run pytest: all green (apart from the skips described below) means
your implementation conforms.

Install
=======

``pip install "polyloop[testing]"``. The extra brings ``pytest>=8`` and
``pytest-asyncio>=0.24`` as lower bounds only, so it never fights your own pins. Importing
``polyloop`` itself never imports pytest, and neither does importing ``polyloop.testing`` for
its doubles: ``from polyloop.testing import ScriptedModelClient`` (or ``RecordFactory``) loads
no pytest, so a script or a quick process start pays nothing for it. The contract bases need
pytest and load it on first access (``from polyloop.testing import RunStoreContract``).

Subclass and override the fixtures
==================================

.. code-block:: python

    # tests/test_my_store.py
    import pytest
    from polyloop.testing import RunStoreContract
    from myproject.storage import SqliteRunStore

    class TestSqliteRunStore(RunStoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            return SqliteRunStore(tmp_path / "runs.db")

Your subclass must be named ``Test...`` so pytest collects it. The bases are named
``...Contract`` precisely so that pytest does *not* collect them on their own (do not set
``__test__`` on your subclass, and keep pytest's default ``python_classes``). Fixtures may
take any of your own fixtures as arguments and may be async.

========================== ===================================================================
base                       fixtures you override (each default raises ``NotImplementedError``
                           saying what to return)
========================== ===================================================================
``RunStoreContract``       ``store``: a new, empty ``RunStore`` on every call; set the class
                           attribute ``offers_leases = False`` if your store has no
                           ``acquire_lease`` (else one test fails: see its message)
``RunLeaseContract``       ``store``: a new, empty ``LeasingRunStore`` (a store with run
                           leases) on every call; optionally ``second_store``: another
                           instance on the same backend (default: ``store`` itself)
``ActionExecutorContract`` ``action_executor``; ``action_samples``: an object with
                           ``executes_cleanly`` and ``executes_but_errors`` (both ``Action``,
                           both expected to come back ``EXECUTED``)
``DecisionParserContract`` ``decision_parser``; ``reply_samples``: an object with
                           ``yields_an_action`` and ``yields_invalid`` (both ``ModelReply``)
``ModelClientContract``    ``model_client``; ``failing_call``: a ``ModelCall`` on which your
                           client raises, cheaply and without side effects
``EventSinkContract``      ``event_sink``
========================== ===================================================================

A seam that claims native tool calls (``native_tool_calls = True``, design 0100) subclasses
the extended base instead, which runs every test above plus the native promises:
``NativeToolCallParserContract`` needs only ``decision_parser`` (the native reply shape is fixed
by ``polyloop.types``, so the base builds its own replies);
``NativeToolCallModelClientContract`` needs the ``ModelClientContract`` fixtures plus
``tool_call_sample``, a ``ModelCall`` with ``tools`` that your endpoint answers with a call.

Sample inputs come from you, never from the suite: only you know your action language, what
your parser accepts and how your client fails. A suite that hard-coded one vendor's code fence
would fail every JSON-tool parser for being correct. Each sample fixture's docstring lists the
invariants its value must keep. ``records`` (a ``RecordFactory``) is supplied by the suite;
you can use it in your own fixtures (``records.action(...)``, ``records.reply(...)``,
``records.model_call(...)``) and in your own tests.

A scripted model for your own tests
===================================

``ScriptedModelClient(replies, ...)`` is a ready ``ModelClient`` that replays a script
instead of calling a model: entry ``n`` answers the call with ``call_index == n`` (a string
becomes the reply's content, a ``ModelReply`` is returned as it is, an exception instance is
raised), a call past the end raises unless ``when_exhausted`` says to repeat or cycle, and
every call received is kept in ``calls``. Use it to test your parser, tools and budgets
without an endpoint; its docstring is the full contract. It is a test double, never a
default: no part of polyloop picks it for you.

The event loop is yours
=======================

Most contract tests are ``async def`` and the suite arranges no event loop: your async
fixtures (a connection pool, say) were created on your loop, and a second loop owned by the
library would make asyncio objects cross loops. Pick one:

* ``asyncio_mode = "auto"`` under ``[tool.pytest.ini_options]`` (simplest; add
  ``asyncio_default_fixture_loop_scope = "function"`` too if you run with
  ``filterwarnings = ["error"]``, or pytest-asyncio's start-up warning becomes an error); or
* pytest-asyncio's strict mode with ``@pytest.mark.asyncio`` on your subclass. Every test of
  ``RunStoreContract``, ``RunLeaseContract``, ``ActionExecutorContract``,
  ``ModelClientContract`` and ``EventSinkContract`` is ``async def``, so the class mark fits
  all of them; ``DecisionParserContract`` is entirely synchronous and needs no mark. In
  strict mode, async fixtures need ``@pytest_asyncio.fixture``.

Forgetting both fails loudly (pytest says async functions are not natively supported).

Exempting a test
================

A downstream that cannot meet one test rebinds that test *by name* in its subclass, with a
skip that says why:

.. code-block:: python

    class TestMyExecutor(ActionExecutorContract):
        ...
        async def test_action_error_is_a_normal_observation_not_an_env_error(self):
            pytest.skip("our executor refuses every failing action up front; see docs/x.md")

Class, fixture and test-method names are public promises for exactly this reason: renaming a
method would silently void such an exemption while everything still ran green.

What a skip means
=================

Two kinds of skip come from the suite itself:

* A reason starting with ``cannot be verified at this layer.`` is unconditional and appears
  for every implementation. The promise is real, but a contract suite running in one process
  against your assembled object cannot check it (crash atomicity, durability, what the
  library does with your outcome). The reason says what the promise is, why it cannot be
  checked here, and where or how to check it yourself. It is not a verdict on your code.
* A cancellation test that reports ``finished before it could be cancelled`` means your
  implementation completed within one event-loop tick, so it had no chance to swallow a
  cancellation. That is not a breach; do not add an artificial ``await`` to turn it into a
  pass. The test does bite for implementations that really wait.

Run ``pytest -rs`` to see every reason. Any other skip comes from your own code.

Markers and assertion output
============================

The suite applies no marker of its own, so ``--strict-markers`` never breaks collection of
your file. To group these tests, mark your subclass module yourself
(``pytestmark = pytest.mark.contract``) and register that marker in your configuration.

polyloop declares a ``pytest11`` plugin entry point so that pytest rewrites the ``assert``
statements of these modules, and a failure shows both sides of a comparison rather than a
bare ``AssertionError``. With ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` that entry point is not
loaded; then put this line at the top of your root ``conftest.py``, before anything imports
``polyloop.testing`` (and load pytest-asyncio yourself, for example with
``-p pytest_asyncio.plugin``)::

    pytest.register_assert_rewrite("polyloop.testing")

Design records: ``research-wiki/design/0040`` to ``0046`` (``0120`` for run leases); guide:
``research-wiki/guides/certifying-a-seam.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.testing._records import RecordFactory
from polyloop.testing._scripted import ScriptedModelClient

if TYPE_CHECKING:
    from polyloop.testing._action_executor import ActionExecutorContract
    from polyloop.testing._decision_parser import DecisionParserContract
    from polyloop.testing._event_sink import EventSinkContract
    from polyloop.testing._model_client import ModelClientContract
    from polyloop.testing._native import (
        NativeToolCallModelClientContract,
        NativeToolCallParserContract,
    )
    from polyloop.testing._run_lease import RunLeaseContract
    from polyloop.testing._run_store import RunStoreContract

__all__ = [
    "ActionExecutorContract",
    "DecisionParserContract",
    "EventSinkContract",
    "ModelClientContract",
    "NativeToolCallModelClientContract",
    "NativeToolCallParserContract",
    "RecordFactory",
    "RunLeaseContract",
    "RunStoreContract",
    "ScriptedModelClient",
]

# The contract bases import pytest, the doubles do not (design 0226): each base is imported on
# first access, through the module ``__getattr__`` below, from the room named here.
_CONTRACTS: dict[str, str] = {
    "ActionExecutorContract": "_action_executor",
    "DecisionParserContract": "_decision_parser",
    "EventSinkContract": "_event_sink",
    "ModelClientContract": "_model_client",
    "NativeToolCallModelClientContract": "_native",
    "NativeToolCallParserContract": "_native",
    "RunLeaseContract": "_run_lease",
    "RunStoreContract": "_run_store",
}


def __getattr__(name: str) -> object:
    room = _CONTRACTS.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(f"{__name__}.{room}"), name)
    # Claimed under this module's name as the eager names are (design 0221), then cached here
    # so that ``__getattr__`` runs once per name.
    _claim_public_names(__name__, {"__all__": [name], name: value})
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names. The contract
# bases are claimed the same way when first accessed (``__getattr__`` above).
_claim_public_names(
    __name__,
    {
        "__all__": ["RecordFactory", "ScriptedModelClient"],
        "RecordFactory": RecordFactory,
        "ScriptedModelClient": ScriptedModelClient,
    },
)
