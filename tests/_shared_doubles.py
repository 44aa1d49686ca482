"""What the tests of every directory (unit, contract, integration, e2e) share about their doubles.

``tests/`` is on ``sys.path`` in every pytest run (the root ``conftest.py`` lives here, and
pytest's default ``prepend`` import mode puts its directory on the path), so any test module
can write ``from _shared_doubles import TEXTS``. A child process started by its file path
(``tests/integration/_kill_child.py``, ``_payments_child.py``, ``_approval_child.py``) has only
its own directory on the path: it puts ``tests/`` there first (``sys.path.insert``), then
imports from here like a test does.

* ``TEXTS``: the test agents' synthetic observations;
* ``TinyParser`` and ``PausingModel``: the tiny reply language (``tool:``, ``code:``,
  ``final:``) of the session tests and of the child processes the kill tests SIGKILL, and
  ``killed_run``, the agent and request of such a child;
* ``Without``, ``PlainStore``, ``UnsettlingStore``: stores that lack a capability, built on
  ``polyloop.stores.ForwardingRunStore`` (the base for a store wrapper) around a
  ``VolatileRunStore``, instead of a hand-written method for each of the store's methods.

The seam doubles themselves are public, so tests, the soak and bench tools and downstream
users all take them from the library rather than from here:

* ``polyloop.testing.ScriptedModelClient``: a model client that replays a script (a thin
  subclass where a test needs a hook: ``tests/unit/_session_doubles.ScriptedModel``);
* ``polyloop.sinks.NullEventSink``: a sink that drops every event;
* ``polyloop.testing.RecordFactory``: valid records and call shells in one short call.

The directory-local doubles stay where their tests are: ``tests/contract/_doubles.py`` (the
minimal compliant seams the contract wiring certifies), ``tests/unit/_session_doubles.py``
(the session tests' agent, tools and sinks), ``tests/integration/_pg_agent.py`` (the
PostgreSQL process tests' agent) and ``tests/integration/soak/_soak_support.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from polyloop.ports import (
    Action,
    FinalAnswer,
    InvalidDecision,
    LeasingRunStore,
    ModelCall,
    ParsedReply,
    RunLease,
    RunStore,
    ToolCall,
)
from polyloop.session import AgentDefinition, RunRequest
from polyloop.sinks import NullEventSink
from polyloop.stores import ForwardingRunStore, VolatileRunStore
from polyloop.testing import ScriptedModelClient
from polyloop.tools import ToolRegistry
from polyloop.types import (
    Budget,
    Context,
    Message,
    ModelReply,
    ReplayPolicy,
    Role,
    SyntheticObservations,
    TextBlock,
)

__all__ = [
    "LEASES",
    "SETTLEMENTS",
    "TEXTS",
    "PausingModel",
    "PlainStore",
    "TinyParser",
    "UnsettlingLease",
    "UnsettlingStore",
    "Without",
    "killed_run",
]

TEXTS: Final = SyntheticObservations(
    action_rejected="[rejected]", env_failed="[env failed]", model_call_failed="[model failed]"
)
"""The synthetic observations of the test agents: short, bracketed, easy to assert on."""


# --------------------------------------------------------------------------- the tiny language


class TinyParser:
    """The tiny reply language of the test agents:

    * ``tool:<name> <json arguments>``  -> an ``Action`` with a ``ToolCall``
    * ``code:<source>``                 -> a code ``Action`` (no tool call)
    * ``final:<answer>``                -> ``FinalAnswer``
    * anything else (or arguments that are not JSON) -> ``InvalidDecision``

    ``parameters()`` is ``{"kind": kind}`` (``"tiny"`` unless given): each agent names its
    parser, as its snapshot says.
    """

    kind = "tiny"

    def __init__(self, kind: str | None = None) -> None:
        if kind is not None:
            self.kind = kind

    def parse(self, reply: ModelReply) -> ParsedReply:
        text = reply.content
        if text.startswith("tool:"):
            name, _, raw = text[5:].partition(" ")
            try:
                arguments = json.loads(raw or "{}")
            except json.JSONDecodeError as exc:
                return ParsedReply(
                    history_text=text, decision=InvalidDecision(explanation=f"bad json: {exc}")
                )
            return ParsedReply(
                history_text=text,
                decision=Action(text=text, tool_call=ToolCall(name=name, arguments=arguments)),
            )
        if text.startswith("code:"):
            return ParsedReply(history_text=text, decision=Action(text=text[5:]))
        if text.startswith("final:"):
            return ParsedReply(history_text=text, decision=FinalAnswer(text=text[6:]))
        return ParsedReply(
            history_text=text, decision=InvalidDecision(explanation="say tool:, code: or final:")
        )

    def parameters(self) -> Mapping[str, str]:
        return {"kind": self.kind}


def killed_run(
    run_id: str,
    model: PausingModel,
    parser: TinyParser,
    store: RunStore,
    tools: ToolRegistry,
    *,
    steps: int,
    prompt: str,
    rejected: str = "[rejected]",
    **options: Any,
) -> tuple[AgentDefinition, RunRequest]:
    """The agent and request of a child process a kill test SIGKILLs (``_kill_child.py``,
    ``_payments_child.py``, ``_approval_child.py``): ``steps`` steps and actions at most, the
    user's ``prompt``, the model's calls replayed (``SAFE``) on resume, ``rejected`` as the
    observation of a refused action, ``options`` for ``RunRequest``; identical in every
    process that builds it, so a resume finds no drift."""
    definition = AgentDefinition(
        model_client=model,
        decision_parser=parser,
        store=store,
        event_sink=NullEventSink(),
        synthetic_observations=SyntheticObservations(
            action_rejected=rejected, env_failed="[env]", model_call_failed="[model]"
        ),
    )
    request = RunRequest(
        run_id=run_id,
        budget=Budget(
            max_steps=steps,
            max_actions=steps,
            max_consecutive_parse_failures=3,
            max_prompt_chars=100_000,
        ),
        tools=tools,
        action_executor=tools.executor(),
        context=Context(run_level=(Message(role=Role.USER, content=(TextBlock(text=prompt),)),)),
        model_replay_policy=ReplayPolicy.SAFE,
        **options,
    )
    return definition, request


class PausingModel(ScriptedModelClient):
    """A script by call index (call ids ``c0``, ``c1``, ...), each reply after a random pause
    of up to ``pause`` seconds, so that a SIGKILL lands anywhere in a call.
    ``parameters()`` is ``{"kind": kind}``."""

    def __init__(self, script: Sequence[str], *, kind: str, pause: float) -> None:
        super().__init__(script, call_id_prefix="c", parameters={"kind": kind})
        self.pause = pause

    async def before_reply(self, call: ModelCall) -> None:
        await asyncio.sleep(random.uniform(0.0, self.pause))


# --------------------------------------------------------------------------- stores

LEASES: Final = ("acquire_lease",)
"""The ``LeasingRunStore`` capability."""

SETTLEMENTS: Final = ("write_settlement", "write_approval_request")
"""The ``SettlingRunStore`` capability (designs 0206 and 0210)."""


class Without:
    """``inner`` (a store or a lease) seen without the attributes ``hidden`` names: a store or
    lease of its own that predates a capability. Everything else is ``inner``'s own."""

    def __init__(self, inner: object, *hidden: str) -> None:
        self._inner = inner
        self._hidden = frozenset(hidden)

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(f"{type(self._inner).__name__} without {name}")
        return getattr(self._inner, name)


class PlainStore(ForwardingRunStore):
    """A ``RunStore`` and nothing more: a volatile store's seven ``RunStore`` methods, without
    leases or settlements (a store that forwards every method but ``acquire_lease``, as the
    wrapper of issue 20 did). A subclass that says ``offers_leases = False`` runs unleased on
    purpose."""

    def __init__(self) -> None:
        super().__init__(Without(VolatileRunStore(), *LEASES, *SETTLEMENTS))  # type: ignore[arg-type]


class UnsettlingStore(ForwardingRunStore):
    """A correct leasing store (the volatile store) without the optional ``write_settlement``
    and ``write_approval_request``, on the store and on its leases: a store of its own that
    predates settlements (design 0206)."""

    def __init__(self) -> None:
        super().__init__(Without(VolatileRunStore(), *SETTLEMENTS))  # type: ignore[arg-type]

    async def acquire_lease(self, run_id: str, *, wait_seconds: float = 0.0) -> RunLease:
        inner = self.inner
        assert isinstance(inner, LeasingRunStore)
        lease = await inner.acquire_lease(run_id, wait_seconds=wait_seconds)
        return cast(RunLease, UnsettlingLease(lease))


class UnsettlingLease(Without):
    """A volatile store's lease without ``write_settlement`` and ``write_approval_request``,
    nor ``check_current`` (``CheckedLease``, design 0245): a lease that predates them."""

    def __init__(self, lease: RunLease) -> None:
        super().__init__(lease, *SETTLEMENTS, "check_current")
