"""The configuration of a run: ``AgentDefinition``, ``RunRequest`` and the parameter snapshot.

This module is the one authority on snapshot keys (``research-wiki/reference/snapshot-keys.md``
lists them for readers). The snapshot is a ``str -> str`` mapping written in ``RunStarted``;
``resume`` recomputes it and refuses with ``ParameterDriftError`` when it differs from an
unfinished run's. For a *finished* run it returns the stored result and nothing runs, with a
``FinishedRunDriftWarning`` naming the keys that differ (design 0217), each time.

Left out of the snapshot, so never a drift: ``RunRequest.parent`` (where a child run sits in
its tree, design 0245), ``RunRequest.record_context`` (it changes what the
log keeps, never what the run does; a run started with it on may be resumed with it off;
design 0215), ``event_timeout_seconds`` and ``reconcile_timeout_seconds`` (they bound waits
that never change a run's course), and the run's ``context`` itself (it is the prompt, not a
setting; a fingerprint in ``request.fingerprint.<name>`` covers it where the caller wants).

==========================================  ==================================================
key                                         source
==========================================  ==================================================
``<seam>.<key>``                            each seam's ``parameters()`` (model_client,
                                            decision_parser, store, event_sink,
                                            action_executor), called every time
``synthetic_observations.<text>``           the three synthetic texts
``request.max_steps`` ... ``max_prompt_     the ``Budget`` (token and cost budgets only when
chars``, ``request.max_*_tokens``,          set)
``request.max_cost``
``request.pricing``                         the prices of the run's model
                                            (``ModelPrices.snapshot_text``), only when
                                            ``RunRequest.pricing`` is set (design 0236)
``request.model_replay_policy``             ``RunRequest.model_replay_policy``
``request.observation_template``            ``RunRequest.observation_template``
``request.cancel_grace_seconds``            ``RunRequest.cancel_grace_seconds``
``request.<bound>_timeout_seconds``         model-call and action bounds, only when set
``request.approval_expires_seconds``        how long a call may wait for approval, only when
                                            set (design 0210)
``request.tools``                           the registry's tool names, comma-joined
``request.injected_entry_ids.<channel>``    entry ids per channel, in prompt order
``request.binding.<key>``                   ``RunRequest.model_binding``
``request.fingerprint.<name>``              ``RunRequest.fingerprints``
==========================================  ==================================================
"""

from __future__ import annotations

import decimal
import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final

from polyloop import _assembly
from polyloop._common import (
    check_bound,
    frozen,
    frozen_str_mapping,
    money_text,
    require_bool,
    require_money,
    require_nonempty_str,
)
from polyloop.errors import ParameterDriftError, PolyloopTypeError, PolyloopValueError
from polyloop.ports import ActionExecutor, DecisionParser, EventSink, ModelClient, RunStore
from polyloop.session._seams import (
    DEFINITION_SEAMS,
    check_seam,
    claims_native_tool_calls,
    seam_snapshot,
)
from polyloop.sinks import NullEventSink
from polyloop.tools import RegistryExecutor, ToolRegistry
from polyloop.types import (
    Budget,
    Context,
    Injection,
    ModelPrices,
    ParentLink,
    ReplayPolicy,
    SyntheticObservations,
)

__all__ = [
    "AgentDefinition",
    "Pricing",
    "RunRequest",
    "full_snapshot",
    "run_prices",
    "snapshot_drift",
]

_SNAPSHOT_BOUNDS = (
    "model_call_timeout_seconds",
    "action_timeout_seconds",
    "approval_expires_seconds",
)
"""Seam bounds that change a run's course, so they enter the snapshot (when set)."""

_ALL_BOUNDS = (*_SNAPSHOT_BOUNDS, "event_timeout_seconds", "reconcile_timeout_seconds")


_PRICE_FIELDS: Final = ("input", "cached_input", "output")


def _model_prices_from(where: str, entry: object) -> ModelPrices:
    if not isinstance(entry, Mapping):
        raise PolyloopTypeError(
            f"{where} must be a mapping of input, cached_input and output prices per million "
            f"tokens, got {type(entry).__name__}"
        )
    unknown = sorted(str(key) for key in entry if key not in _PRICE_FIELDS)
    if unknown:
        raise PolyloopValueError(
            f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; the fields are "
            "input, cached_input (optional) and output, each per million tokens"
        )
    for required in ("input", "output"):
        if required not in entry:
            raise PolyloopValueError(
                f"{where} needs {required!r} (a price per million tokens, e.g. '2.50')"
            )
    return ModelPrices(
        input=require_money(where, "input", entry["input"]),
        output=require_money(where, "output", entry["output"]),
        cached_input=(
            None
            if entry.get("cached_input") is None
            else require_money(where, "cached_input", entry["cached_input"])
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Pricing:
    """The prices of the models a run may call, as the user states them (design 0236).

    ``models`` maps a model name (as the model client reports it in ``parameters()["model"]``;
    ``GatewaySettings.model`` for the gateway adapter) to its ``ModelPrices``. The key ``"*"``
    (``ANY_MODEL``) prices any model not named. polyloop ships no price list: prices change, and
    the user's contract is the truth. Build one with ``Pricing.from_mapping`` or
    ``Pricing.from_file`` (JSON or TOML)::

        Pricing.from_mapping({"gpt-4o": {"input": "2.50", "cached_input": "1.25",
                                         "output": "10.00"}})
    """

    models: Mapping[str, ModelPrices]

    ANY_MODEL: ClassVar[str] = "*"

    def __post_init__(self) -> None:
        if not isinstance(self.models, Mapping):
            raise PolyloopTypeError(
                f"Pricing.models must be a mapping of model name to ModelPrices, got "
                f"{type(self.models).__name__}"
            )
        if not self.models:
            raise PolyloopValueError(
                "Pricing.models is empty; name at least one model (or '*' for any model)"
            )
        for name, prices in self.models.items():
            require_nonempty_str("Pricing", "models key", name)
            if not isinstance(prices, ModelPrices):
                raise PolyloopTypeError(
                    f"Pricing.models[{name!r}] must be a ModelPrices, got "
                    f"{type(prices).__name__} (Pricing.from_mapping takes plain mappings)"
                )
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))

    def for_model(self, model: str | None) -> ModelPrices:
        """The prices of ``model`` (``None``: the client reports no model name), falling back
        to ``"*"``; ``PolyloopValueError`` naming the model and the fix when neither exists."""
        if model is not None and model in self.models:
            return self.models[model]
        if self.ANY_MODEL in self.models:
            return self.models[self.ANY_MODEL]
        named = "reports no model name" if model is None else f"is {model!r}"
        raise PolyloopValueError(
            f"Pricing has no prices for the run's model (the model client {named}); it prices "
            f"{', '.join(map(repr, sorted(self.models)))}. Add an entry for that model, or "
            "'*' for any model"
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *, where: str = "Pricing") -> Pricing:
        """Prices from plain data: ``{model: {"input": ..., "cached_input": ..., "output":
        ...}}``, each price a ``Decimal``, an ``int`` or a decimal string per million
        tokens (``cached_input`` optional). Errors name the model and the field."""
        if not isinstance(data, Mapping):
            raise PolyloopTypeError(
                f"{where} must be a mapping of model name to prices, got {type(data).__name__}"
            )
        models: dict[str, ModelPrices] = {}
        for name, entry in data.items():
            if not isinstance(name, str) or not name:
                raise PolyloopTypeError(
                    f"{where}: every key must be a non-empty model name, got {name!r}"
                )
            models[name] = _model_prices_from(f"{where}[{name!r}]", entry)
        return cls(models=models)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Pricing:
        """Prices from a ``.json`` or ``.toml`` file holding what ``from_mapping`` takes
        (TOML: one table per model, ``["gpt-4o"]``). Numbers in the file are read as
        ``Decimal``, exactly as written."""
        where = os.fspath(path)
        suffix = os.path.splitext(where)[1].lower()
        if suffix not in (".json", ".toml"):
            raise PolyloopValueError(
                f"Pricing.from_file({where!r}): the file must end in .json or .toml"
            )
        with open(where, "rb") as handle:
            raw = handle.read()
        try:
            if suffix == ".json":
                data = json.loads(raw, parse_float=decimal.Decimal)
            else:
                data = tomllib.loads(raw.decode("utf-8"), parse_float=decimal.Decimal)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PolyloopValueError(
                f"Pricing.from_file({where!r}): not valid {suffix[1:].upper()}: {exc}"
            ) from exc
        return cls.from_mapping(data, where=f"Pricing.from_file({where!r})")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentDefinition:
    """The half of a run that stays the same across runs; safe to share between concurrent runs.

    There is no default store: a run without recovery is an explicit ``VolatileRunStore()``.
    ``event_sink`` defaults to ``polyloop.sinks.NullEventSink()`` and ``synthetic_observations``
    to the stock ``SyntheticObservations()`` (design 0113); both enter the snapshot as usual.
    Construction checks that every seam object has the seam's methods, async where the library
    awaits them and synchronous where it calls them (``PolyloopTypeError`` naming the field
    otherwise: a parser passed as the model client fails here, before any run id is used). It
    does not call them; ``parameter_snapshot()`` does, every time it is
    called, so the snapshot is what the seams report, not what someone declared.
    """

    model_client: ModelClient
    decision_parser: DecisionParser
    store: RunStore
    event_sink: EventSink = field(default_factory=NullEventSink)
    synthetic_observations: SyntheticObservations = field(default_factory=SyntheticObservations)

    def __post_init__(self) -> None:
        for field_name in DEFINITION_SEAMS:
            check_seam(field_name, getattr(self, field_name))
        if not isinstance(self.synthetic_observations, SyntheticObservations):
            raise PolyloopTypeError(
                "AgentDefinition.synthetic_observations must be SyntheticObservations"
            )
        if claims_native_tool_calls(self.decision_parser) and not claims_native_tool_calls(
            self.model_client
        ):
            raise PolyloopTypeError(
                f"AgentDefinition.decision_parser ({type(self.decision_parser).__name__}) reads "
                "native tool calls, but AgentDefinition.model_client "
                f"({type(self.model_client).__name__}) does not claim to send tool schemas or "
                "return tool calls (no `native_tool_calls = True`); the model would never be "
                "offered a tool. Use a client with native tool calls (GatewayModelClient), or "
                "a text parser"
            )

    def parameter_snapshot(self) -> dict[str, str]:
        """``<seam>.<key>`` for every seam's ``parameters()``, plus the synthetic texts.

        Raises ``PolyloopTypeError`` (a ``TypeError``) naming the seam when one reports a
        non-``str`` key or value.
        """
        snapshot: dict[str, str] = {}
        for prefix in DEFINITION_SEAMS:
            snapshot.update(seam_snapshot(getattr(self, prefix), prefix))
        texts = self.synthetic_observations
        snapshot["synthetic_observations.action_rejected"] = texts.action_rejected
        snapshot["synthetic_observations.env_failed"] = texts.env_failed
        snapshot["synthetic_observations.model_call_failed"] = texts.model_call_failed
        return snapshot


# The one read-only empty mapping every request without bindings, fingerprints or
# injections shares: a run keeps its request, and three empty views of its own were three more
# objects each run's collector passes traced (design 0214).
_EMPTY: Final[Mapping[Any, Any]] = MappingProxyType({})


def _frozen_injections(value: object) -> Mapping[str, tuple[Injection, ...]]:
    checked = _assembly.checked_injections(value, "RunRequest.injections")
    frozen_injections: Mapping[str, tuple[Injection, ...]] = frozen(checked)
    return frozen_injections


def _check_grace(grace: object) -> None:
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise PolyloopTypeError("RunRequest.cancel_grace_seconds must be a number of seconds")
    if not math.isfinite(grace) or grace < 0:
        raise PolyloopValueError(
            f"RunRequest.cancel_grace_seconds must be finite and >= 0, got {grace!r}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """Everything that is specific to one run.

    ``tools`` is the registry the model sees (its schema is the caller's to render into the
    context, or, with a parser that claims native tool calls, it goes out on every
    ``ModelCall.tools``, design 0100); when ``action_executor`` was derived from a registry
    (``tools.executor()``) that registry must equal ``tools``, or the model would see one tool
    set while dispatch used another. One registry is enough: leave ``action_executor`` out and it is
    ``tools.executor()`` (a request with neither is refused: nothing could ever act). Pass
    ``action_executor`` for actions that are not tool calls (code, commands). ``budget``
    defaults to ``Budget()`` (design 0113). ``model_binding`` is passed to every model call
    and recorded in the snapshot; ``fingerprints`` (versions of materials such as a
    prompt-template hash) are recorded only.
    ``model_replay_policy`` has no default: only the caller knows whether repeating a model
    call whose outcome is unknown is acceptable.

    Construction is cheap (no I/O). Mappings are copied and frozen, so editing the caller's
    dicts afterwards changes nothing.
    """

    run_id: str
    context: Context
    model_replay_policy: ReplayPolicy
    budget: Budget = field(default_factory=Budget)
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    action_executor: ActionExecutor | None = None
    """``None`` (the default) means ``tools.executor()``, which construction puts here: on a
    constructed request this is never ``None`` (``executor`` reads it with that type)."""
    injections: Mapping[str, tuple[Injection, ...]] = field(default_factory=dict)
    model_binding: Mapping[str, str] = field(default_factory=dict)
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    observation_template: str = "{observation}"
    cancel_grace_seconds: float = 5.0
    model_call_timeout_seconds: float | None = None
    """Bound on one model call; ``None`` (the default) waits as long as the model takes, so a
    working model is never cut off. On expiry the call is cancelled and recorded as a failed
    call (``LLM_ERROR``). In the snapshot when set. Design 0164."""
    action_timeout_seconds: float | None = None
    """Bound on one ``execute``; ``None`` (the default) waits. On expiry the action is
    cancelled and its outcome is unknown: it is in doubt, settled by its replay policy
    (``SAFE``/``IDEMPOTENT`` tried again, ``NEVER`` to its reconciler or the run left open
    with ``RESUME_STATE_UNKNOWN``; design 0227). In the snapshot when set. Design 0164."""
    event_timeout_seconds: float | None = 30.0
    """Bound on one ``emit``; a sink that outlives it counts as a delivery failure and the run
    goes on. ``None`` waits forever. Not in the snapshot (events never change a run)."""
    approval_expires_seconds: float | None = None
    """How long a call that waits for approval may wait (design 0210): its request's
    ``expires_at`` is this many seconds after it is written, and a resume after that rejects
    it with the reason "expired". ``None`` (the default): it waits as long as it takes. In the
    snapshot when set."""
    reconcile_timeout_seconds: float | None = 60.0
    """Bound on one reconciler call (design 0206); one that outlives it is an ``unknown``
    answer and the run stays in doubt. ``None`` waits forever. Not in the snapshot: asking
    about an execution never changes what it did."""
    pricing: Pricing | None = None
    """The prices of the model the run calls (design 0236): every step's cost is computed
    from its reported usage at them and recorded (``StepRecord.cost``), and ``Budget.max_cost``
    needs them. The run's model is the model client's ``parameters()["model"]``; a pricing
    without it (nor ``"*"``) is refused before anything is written. The applied prices enter
    the snapshot as ``request.pricing``, so changing them refuses a resume. ``None`` (the
    default): no cost is recorded."""
    record_context: bool = True
    """Whether ``RunStarted`` records ``context`` (the run-level instructions and the
    goal-level question) so that the log shows what the run was asked (design 0215). ``False``
    for runs whose prompt text must not be kept: the log then holds, as before schema 1.8, only
    prompt sizes. Injections are never recorded either way. Not in the snapshot: it changes what
    the log keeps, not what the run does, and the record itself says which it was."""
    parent: ParentLink | None = None
    """The run that starts this one, when it is a child run of a tree (design 0245):
    recorded on ``RunStarted.parent``. Set by ``polyloop.agent.child_tool``; ``None`` (the
    default) for a root run. Not in the snapshot: it says where the run sits, not what it
    does."""

    def __post_init__(self) -> None:
        require_nonempty_str("RunRequest", "run_id", self.run_id)
        if self.parent is not None and not isinstance(self.parent, ParentLink):
            raise PolyloopTypeError(
                f"RunRequest.parent must be a polyloop.types.ParentLink or None, got "
                f"{type(self.parent).__name__}"
            )
        if not isinstance(self.budget, Budget):
            raise PolyloopTypeError("RunRequest.budget must be a Budget")
        if not isinstance(self.context, Context):
            raise PolyloopTypeError("RunRequest.context must be a Context")
        if not isinstance(self.model_replay_policy, ReplayPolicy):
            raise PolyloopTypeError(
                "RunRequest.model_replay_policy must be ReplayPolicy.SAFE or ReplayPolicy.NEVER"
            )
        if not isinstance(self.tools, ToolRegistry):
            raise PolyloopTypeError(
                "RunRequest.tools must be a ToolRegistry (ToolRegistry() for none)"
            )
        self._settle_executor()
        _assembly.check_observation_template(self.observation_template)
        binding = frozen_str_mapping("RunRequest", "model_binding", self.model_binding)
        fingerprints = frozen_str_mapping("RunRequest", "fingerprints", self.fingerprints)
        object.__setattr__(self, "model_binding", binding or _EMPTY)
        object.__setattr__(self, "fingerprints", fingerprints or _EMPTY)
        object.__setattr__(self, "injections", _frozen_injections(self.injections) or _EMPTY)
        _check_grace(self.cancel_grace_seconds)
        require_bool("RunRequest", "record_context", self.record_context)
        if self.pricing is not None and not isinstance(self.pricing, Pricing):
            raise PolyloopTypeError(
                f"RunRequest.pricing must be a polyloop.Pricing or None, got "
                f"{type(self.pricing).__name__} (Pricing.from_mapping or Pricing.from_file "
                "build one)"
            )
        if self.budget.max_cost is not None and self.pricing is None:
            raise PolyloopValueError(
                "RunRequest.budget.max_cost is set but RunRequest.pricing is None; a cost "
                "budget needs the model's prices: pass pricing=Pricing.from_file(...)"
            )
        for name in _ALL_BOUNDS:
            check_bound(getattr(self, name), named=f"RunRequest.{name}")

    @property
    def executor(self) -> ActionExecutor:
        """The executor every action of the run goes to (``action_executor``, settled)."""
        executor = self.action_executor
        if executor is None:  # only a request built around __post_init__ can get here
            raise PolyloopValueError("RunRequest.action_executor was never settled")
        return executor

    def _settle_executor(self) -> None:
        """Derive the executor from ``tools`` when none was given; check the one there is."""
        if self.action_executor is None:
            if not self.tools.names():
                raise PolyloopValueError(
                    "RunRequest needs tools=ToolRegistry([...]) (their executor is derived "
                    "from them) or an action_executor; with neither, no action could ever run"
                )
            object.__setattr__(self, "action_executor", self.tools.executor())
        check_seam("action_executor", self.action_executor)
        executor = self.action_executor
        if isinstance(executor, RegistryExecutor) and executor.registry != self.tools:
            raise PolyloopValueError(
                "RunRequest.action_executor was derived from a different registry than "
                "RunRequest.tools; build both from one registry: tools=reg, "
                "action_executor=reg.executor()"
            )

    def parameter_snapshot(self) -> dict[str, str]:
        """The request's half of the snapshot (keys listed in the snapshot reference page).

        Raises ``PolyloopTypeError`` (a ``TypeError``) when the executor's ``parameters()``
        reports a non-``str``.
        """
        budget = self.budget
        snapshot = {
            "request.max_steps": str(budget.max_steps),
            "request.max_actions": str(budget.max_actions),
            "request.max_consecutive_parse_failures": str(budget.max_consecutive_parse_failures),
            "request.max_prompt_chars": str(budget.max_prompt_chars),
            "request.model_replay_policy": self.model_replay_policy.value,
            "request.observation_template": self.observation_template,
            "request.cancel_grace_seconds": repr(float(self.cancel_grace_seconds)),
            "request.tools": ",".join(self.tools.names()),
        }
        # The token budgets enter the snapshot only when set, so runs started before they
        # existed (and runs that do not use them) keep the snapshot they had.
        if budget.max_total_tokens is not None:
            snapshot["request.max_total_tokens"] = str(budget.max_total_tokens)
        # Likewise the seam bounds (design 0164): only when set.
        for name in _SNAPSHOT_BOUNDS:
            bound = getattr(self, name)
            if bound is not None:
                snapshot[f"request.{name}"] = repr(float(bound))
        if budget.max_prompt_tokens is not None:
            snapshot["request.max_prompt_tokens"] = str(budget.max_prompt_tokens)
        if budget.max_cost is not None:
            snapshot["request.max_cost"] = money_text(budget.max_cost)
        for channel, ids in _assembly.injected_entry_ids(self.injections).items():
            snapshot[f"request.injected_entry_ids.{channel}"] = ",".join(ids)
        for key, value in self.model_binding.items():
            snapshot[f"request.binding.{key}"] = value
        for name, value in self.fingerprints.items():
            snapshot[f"request.fingerprint.{name}"] = value
        snapshot.update(seam_snapshot(self.executor, "action_executor"))
        return snapshot


def full_snapshot(definition: AgentDefinition, request: RunRequest) -> dict[str, str]:
    """The run's whole parameter snapshot, sorted by key: what ``RunStarted`` records."""
    snapshot = definition.parameter_snapshot()
    snapshot.update(request.parameter_snapshot())
    if request.pricing is not None:
        model = snapshot.get("model_client.model")
        prices = request.pricing.for_model(model)
        snapshot["request.pricing"] = prices.snapshot_text(model or Pricing.ANY_MODEL)
    return dict(sorted(snapshot.items()))


def run_prices(definition: AgentDefinition, request: RunRequest) -> ModelPrices | None:
    """The prices of the run's model (``None`` without pricing): ``request.pricing`` for the
    name the model client reports in ``parameters()["model"]``, else ``"*"``.
    ``PolyloopValueError`` when the pricing has neither."""
    if request.pricing is None:
        return None
    model = definition.model_client.parameters().get("model")
    return request.pricing.for_model(model if isinstance(model, str) else None)


def snapshot_drift(
    run_id: str, stored: Mapping[str, str], current: Mapping[str, str]
) -> ParameterDriftError | None:
    """The drift guard's verdict: every key added, removed or changed since the run started."""
    added = sorted(current.keys() - stored.keys())
    removed = sorted(stored.keys() - current.keys())
    changed = {
        key: (stored[key], current[key])
        for key in sorted(stored.keys() & current.keys())
        if stored[key] != current[key]
    }
    if added or removed or changed:
        return ParameterDriftError(run_id, added=added, removed=removed, changed=changed)
    return None
