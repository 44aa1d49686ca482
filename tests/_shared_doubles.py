"""What the tests of every directory (unit, contract, integration, e2e) share about their doubles.

``tests/`` is on ``sys.path`` in every pytest run (the root ``conftest.py`` lives here, and
pytest's default ``prepend`` import mode puts its directory on the path), so any test module
can write ``from _shared_doubles import TEXTS``. Child processes started by file path
(``tests/integration/_kill_child.py``, ``_resume_racer.py``, ``_paused_holder.py``,
``_native_agent.py``) only have their own directory on the path and define their own texts.

The seam doubles themselves are public, so tests, the soak and bench tools and downstream
users all take them from the library rather than from here:

* ``polyloop.testing.ScriptedModelClient``: a model client that replays a script (a thin
  subclass where a test needs a hook: ``tests/unit/_session_doubles.ScriptedModel``);
* ``polyloop.sinks.NullEventSink``: a sink that drops every event;
* ``polyloop.testing.RecordFactory``: valid records and call shells in one short call.

The directory-local doubles stay where their tests are: ``tests/contract/_doubles.py`` (the
minimal compliant seams the contract wiring certifies), ``tests/unit/_session_doubles.py``
(the tiny action language of the session tests) and
``tests/integration/soak/_soak_support.py``.
"""

from __future__ import annotations

from typing import Final

from polyloop.types import SyntheticObservations

__all__ = ["TEXTS"]

TEXTS: Final = SyntheticObservations(
    action_rejected="[rejected]", env_failed="[env failed]", model_call_failed="[model failed]"
)
"""The synthetic observations of the test agents: short, bracketed, easy to assert on."""
