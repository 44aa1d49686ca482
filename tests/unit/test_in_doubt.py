"""Settling what is in doubt (issue 21; designs 0205, 0206): idempotency keys, the
``IDEMPOTENT`` policy, reconcilers and a person's resolution, driven through the public API.

"The process died inside the tool" is staged with a handler that performs its effect and then
raises a ``BaseException`` (``Died``): nothing in the library catches it, so the log ends at
"action intent, no step" exactly as after a kill (the kill itself is exercised against a real
HTTP service in ``tests/integration/test_in_doubt_kill.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Mapping

import pytest
from _session_doubles import ScriptedModel, definition, request

from polyloop.errors import ResolutionError
from polyloop.session import (
    check_log,
    continue_cancelled,
    plan_resume,
    resolve,
    resume,
    run,
    run_or_resume,
)
from polyloop.stores import VolatileRunStore
from polyloop.tools import Reconciliation, ToolContext, ToolRegistry, ToolSpec
from polyloop.types import (
    ActionStatus,
    Intent,
    IntentKind,
    ReplayPolicy,
    RunStarted,
    SettlementSource,
    SettlementVerdict,
    StopReason,
)

pytestmark = pytest.mark.unit

KEY = re.compile(r"[A-Za-z0-9._:-]{1,255}")


class Died(BaseException):
    """Stands for the process dying: no ``except Exception`` in the library catches it."""


class Service:
    """The tool's own system: a ledger of effects by idempotency key."""

    def __init__(self, *, deduplicates: bool) -> None:
        self.deduplicates = deduplicates
        self.effects: list[str] = []  # one entry per effect that happened
        self.keys_seen: list[str] = []  # every call's key, duplicates included
        self.die_after_effect = 0  # how many upcoming calls die after their effect

    def call(self, key: str) -> str:
        self.keys_seen.append(key)
        if not (self.deduplicates and key in self.effects):
            self.effects.append(key)
        if self.die_after_effect:
            self.die_after_effect -= 1
            raise Died
        return f"done {key}"


def pay_tool(service: Service, policy: ReplayPolicy, reconciler: object = None) -> ToolSpec:
    async def pay(ctx: ToolContext, amount: int) -> str:
        """Move money."""
        assert amount > 0
        return service.call(ctx.idempotency_key)

    return ToolSpec.from_function(pay, replay_policy=policy, reconcile=reconciler)  # type: ignore[arg-type]


SCRIPT = ['tool:pay {"amount": 5}', "final:paid"]


def pay_request(spec: ToolSpec, run_id: str = "run-1", **extra: object):  # type: ignore[no-untyped-def]
    return request(run_id, tools=ToolRegistry([spec]), **extra)


SAFE_MODEL = {"model_policy": ReplayPolicy.SAFE}
"""For the continuation tests: the model call a cancellation interrupts may be made again."""


async def died_once(store: VolatileRunStore, spec: ToolSpec, service: Service) -> None:
    service.die_after_effect = 1
    with pytest.raises(Died):
        await run(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))


# --------------------------------------------------------------------------- keys


async def test_every_execution_gets_a_recorded_key_that_fits_a_header() -> None:
    service = Service(deduplicates=False)
    spec = pay_tool(service, ReplayPolicy.NEVER)
    store = VolatileRunStore()
    result = await run(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    log = await store.read_log("run-1")
    keys = {intent.result_id: intent.idempotency_key for intent in log.intents}
    assert set(keys) == {"m0", "a0", "m1"}
    assert all(key is not None and KEY.fullmatch(key) for key in keys.values())
    assert len(set(keys.values())) == 3, "every execution has its own key"
    assert service.keys_seen == [keys["a0"]], "the handler got the key its intent records"
    assert "run-1" in str(keys["a0"]), "a person finds the key by the run id"


async def test_keys_differ_between_runs_and_survive_any_run_id() -> None:
    service = Service(deduplicates=False)
    spec = pay_tool(service, ReplayPolicy.NEVER)
    store = VolatileRunStore()
    odd_id = "run with spaces/and:colons " + "x" * 300
    for run_id in ("run-a", "run-b", odd_id):
        await run(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec, run_id))
    assert len(set(service.keys_seen)) == 3
    assert all(KEY.fullmatch(key) for key in service.keys_seen)


async def test_model_calls_get_their_key_too() -> None:
    model = ScriptedModel(SCRIPT)
    store = VolatileRunStore()
    await run(
        definition(model, store=store),
        pay_request(pay_tool(Service(deduplicates=False), ReplayPolicy.NEVER)),
    )
    log = await store.read_log("run-1")
    by_id = {intent.result_id: intent.idempotency_key for intent in log.intents}
    assert [call.idempotency_key for call in model.calls] == [by_id["m0"], by_id["m1"]]


async def test_a_tool_context_parameter_is_not_part_of_the_schema() -> None:
    spec = pay_tool(Service(deduplicates=False), ReplayPolicy.NEVER)
    assert set(spec.parameters["properties"]) == {"amount"}  # type: ignore[arg-type]


async def test_outside_a_run_a_tool_that_needs_its_context_is_not_executed() -> None:
    from polyloop.ports import Action, ToolCall

    service = Service(deduplicates=False)
    executor = ToolRegistry([pay_tool(service, ReplayPolicy.NEVER)]).executor()
    outcome = await executor.execute(
        Action(text="pay", tool_call=ToolCall(name="pay", arguments={"amount": 1}))
    )
    assert outcome.status is ActionStatus.NOT_EXECUTED
    assert "ToolContext" in outcome.observation
    assert service.effects == []


# --------------------------------------------------------------------------- IDEMPOTENT


async def test_an_idempotent_action_in_doubt_is_replayed_with_the_same_key() -> None:
    service = Service(deduplicates=True)
    spec = pay_tool(service, ReplayPolicy.IDEMPOTENT)
    store = VolatileRunStore()
    await died_once(store, spec, service)
    assert plan_resume(await store.read_log("run-1"), "run-1").action.value == "replay_last_action"
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.keys_seen) == 2
    assert len(set(service.keys_seen)) == 1, "the replay passed the same key"
    assert len(service.effects) == 1, "the service deduplicated the replay"


async def test_a_never_action_in_doubt_without_reconciler_stays_in_doubt_and_unfinished() -> None:
    service = Service(deduplicates=False)
    spec = pay_tool(service, ReplayPolicy.NEVER)
    store = VolatileRunStore()
    await died_once(store, spec, service)
    agent = definition(ScriptedModel(SCRIPT), store=store)
    for _ in range(2):  # every resume returns the same verdict and executes nothing
        result = await run_or_resume(agent, pay_request(spec))
        assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
        assert result.unknown_outcome == "a0"
    log = await store.read_log("run-1")
    assert log.finished is None, "left open, so that it can still be settled"
    assert len(service.effects) == 1


# --------------------------------------------------------------------------- reconcilers


def asking(service: Service, *, answer: str = "ask", raises: bool = False):  # type: ignore[no-untyped-def]
    asked: list[tuple[ToolContext, Mapping[str, object]]] = []

    async def reconcile(ctx: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        asked.append((ctx, arguments))
        if raises:
            raise ConnectionError("the payments API is down")
        if answer == "unknown":
            return Reconciliation.unknown("the ledger is being rebuilt")
        if ctx.idempotency_key in service.effects:
            return Reconciliation.executed(f"found {ctx.idempotency_key} in the ledger")
        return Reconciliation.not_executed()

    return reconcile, asked


async def test_a_reconciler_that_finds_the_effect_settles_the_step_without_executing() -> None:
    service = Service(deduplicates=False)
    reconcile, asked = asking(service)
    spec = pay_tool(service, ReplayPolicy.NEVER, reconcile)
    store = VolatileRunStore()
    await died_once(store, spec, service)
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.effects) == 1, "nothing executed twice"
    ((ctx, arguments),) = asked
    assert ctx.idempotency_key == service.effects[0]
    assert ctx.step_idx == 0
    assert arguments == {"amount": 5}
    log = await store.read_log("run-1")
    (settlement,) = log.settlements
    assert settlement.verdict is SettlementVerdict.EXECUTED
    assert settlement.source is SettlementSource.RECONCILER
    outcome = log.steps[0].action_outcome
    assert outcome is not None
    assert outcome.settled_by == "reconciler"
    assert result.steps[0].observation == f"found {service.effects[0]} in the ledger"


async def test_a_reconciler_that_finds_nothing_lets_the_action_run_with_the_same_key() -> None:
    service = Service(deduplicates=False)
    reconcile, asked = asking(service)
    store = VolatileRunStore()

    # This time the process dies before the effect: the handler raises first.
    async def pay(ctx: ToolContext, amount: int) -> str:
        """Move money."""
        if not asked:
            raise Died
        return service.call(ctx.idempotency_key)

    spec = ToolSpec.from_function(pay, replay_policy=ReplayPolicy.NEVER, reconcile=reconcile)
    with pytest.raises(Died):
        await run(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(asked) == 1
    assert service.effects == [asked[0][0].idempotency_key], "executed once, with its key"


@pytest.mark.parametrize("how", ["unknown", "raises"])
async def test_a_reconciler_without_an_answer_leaves_the_run_in_doubt_with_the_reason(
    how: str,
) -> None:
    service = Service(deduplicates=False)
    reconcile, asked = asking(service, answer=how, raises=how == "raises")
    spec = pay_tool(service, ReplayPolicy.NEVER, reconcile)
    store = VolatileRunStore()
    await died_once(store, spec, service)
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    log = await store.read_log("run-1")
    (settlement,) = log.settlements
    assert settlement.verdict is SettlementVerdict.UNKNOWN
    expected = "being rebuilt" if how == "unknown" else "ConnectionError: the payments API is down"
    assert expected in settlement.note
    assert log.finished is None
    again = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert again.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert len(asked) == 2, "a later resume asks again"
    assert len(service.effects) == 1


@pytest.mark.parametrize("verdict", [SettlementVerdict.APPROVED, SettlementVerdict.REJECTED])
def test_a_reconciliation_never_carries_a_decision_on_an_approval(
    verdict: SettlementVerdict,
) -> None:
    with pytest.raises(ValueError, match=rf"verdict {verdict.value} is a person's decision"):
        Reconciliation(verdict=verdict)


async def test_a_reconciler_that_answers_with_an_approval_leaves_the_run_in_doubt() -> None:
    """Design 0210: approved/rejected decide on a call that waits for approval, not on one in
    doubt. A reconciler that tries it raises inside itself, so it is an unknown answer."""
    service = Service(deduplicates=False)

    async def reconcile(ctx: ToolContext, arguments: Mapping[str, object]) -> Reconciliation:
        return Reconciliation(verdict=SettlementVerdict.APPROVED)

    spec = pay_tool(service, ReplayPolicy.NEVER, reconcile)
    store = VolatileRunStore()
    await died_once(store, spec, service)
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    (settlement,) = (await store.read_log("run-1")).settlements
    assert settlement.verdict is SettlementVerdict.UNKNOWN
    assert "is a person's decision" in settlement.note
    assert len(service.effects) == 1


# --------------------------------------------------------------------------- resolutions


async def in_doubt_store() -> tuple[VolatileRunStore, ToolSpec, Service]:
    service = Service(deduplicates=False)
    spec = pay_tool(service, ReplayPolicy.NEVER)
    store = VolatileRunStore()
    await died_once(store, spec, service)
    await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    return store, spec, service


async def test_a_person_who_says_it_happened_settles_the_step_and_the_run_goes_on() -> None:
    store, spec, service = await in_doubt_store()
    settlement = await resolve(
        store,
        "run-1",
        result_id="a0",
        executed=True,
        observation="paid 5",
        by="alice",
        note="checked the bank statement",
    )
    assert settlement.source is SettlementSource.PERSON
    assert settlement.by == "alice"
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.steps[0].observation == "paid 5"
    assert len(service.effects) == 1
    log = await store.read_log("run-1")
    outcome = log.steps[0].action_outcome
    assert outcome is not None
    assert outcome.settled_by == "person:alice"


async def test_a_person_who_says_it_did_not_happen_lets_it_run_with_its_key() -> None:
    store, spec, service = await in_doubt_store()
    service.effects.clear()  # say the bank rolled it back
    await resolve(store, "run-1", result_id="a0", executed=False, by="bob")
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.effects) == 1
    assert service.keys_seen[0] == service.keys_seen[1], "the same execution, the same key"


async def test_resolve_refuses_what_it_cannot_settle_and_writes_nothing() -> None:
    store, spec, _ = await in_doubt_store()
    with pytest.raises(ResolutionError, match="'a0', not 'a1'") as wrong:
        await resolve(store, "run-1", result_id="a1", executed=False, by="bob")
    assert wrong.value.reason == "wrong_result_id"
    with pytest.raises(ResolutionError) as none:
        await resolve(store, "nope", result_id="a0", executed=False, by="bob")
    assert none.value.reason == "no_log"
    assert (await store.read_log("run-1")).settlements == ()
    await resolve(store, "run-1", result_id="a0", executed=True, observation="ok", by="bob")
    with pytest.raises(ResolutionError) as twice:
        await resolve(store, "run-1", result_id="a0", executed=False, by="carol")
    assert twice.value.reason == "nothing_in_doubt"
    await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    with pytest.raises(ResolutionError) as finished:
        await resolve(store, "run-1", result_id="a0", executed=False, by="carol")
    assert finished.value.reason == "finished"
    assert len((await store.read_log("run-1")).settlements) == 1


async def test_a_model_call_in_doubt_cannot_be_resolved_by_hand() -> None:
    store = VolatileRunStore()
    model = ScriptedModel([Died(), "final:x"])  # type: ignore[list-item]
    with pytest.raises(Died):
        await run(definition(model, store=store), request("run-1"))
    log = await store.read_log("run-1")
    assert [i.kind for i in log.intents] == [IntentKind.MODEL_CALL]
    with pytest.raises(ResolutionError) as refused:
        await resolve(store, "run-1", result_id="m0", executed=False, by="bob")
    assert refused.value.reason == "model_call"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"executed": True}, TypeError),  # no observation
        ({"executed": False, "observation": "x"}, ValueError),
        ({"executed": "yes"}, TypeError),
        ({"executed": False, "by": ""}, ValueError),
    ],
)
async def test_resolve_checks_its_arguments_before_anything(
    arguments: dict[str, object], error: type[Exception]
) -> None:
    store, _, _ = await in_doubt_store()
    keywords: dict[str, object] = {"by": "bob", **arguments}
    with pytest.raises(error):
        await resolve(store, "run-1", result_id="a0", **keywords)  # type: ignore[arg-type]
    assert (await store.read_log("run-1")).settlements == ()


async def test_a_retry_after_not_executed_that_dies_is_in_doubt_again_never_retried_blindly() -> (
    None
):
    """The verdict "not executed" licenses one attempt: the retry is announced again before
    it runs, so a retry that dies too is in doubt again, not retried on the old verdict."""
    store, spec, service = await in_doubt_store()
    service.effects.clear()  # the first attempt left no effect
    await resolve(store, "run-1", result_id="a0", executed=False, by="bob")
    assert plan_resume(await store.read_log("run-1"), "run-1").action.value == "retry_settled"
    service.die_after_effect = 1
    with pytest.raises(Died):
        await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert len(service.effects) == 1
    log = await store.read_log("run-1")
    assert [i.result_id for i in log.intents].count("a0") == 2, "the retry was announced"
    plan = plan_resume(log, "run-1")
    assert plan.action.value == "stop_unknown"
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.RESUME_STATE_UNKNOWN
    assert len(service.effects) == 1, "not executed a second time"
    await resolve(store, "run-1", result_id="a0", executed=True, observation="paid", by="bob")
    result = await resume(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.effects) == 1
    assert service.keys_seen[-1] == service.keys_seen[0], "every attempt had the same key"


class _HoldsSecondCall(ScriptedModel):
    """Answers the first call, then holds every later one until cancelled."""

    async def before_reply(self, call):  # type: ignore[no-untyped-def]
        await super().before_reply(call)
        if call.call_index >= 1:
            self.started.set()
            await asyncio.Event().wait()


async def _cancelled_after_a_payment(store: VolatileRunStore, spec: ToolSpec) -> None:
    model = _HoldsSecondCall(SCRIPT)
    task = asyncio.ensure_future(
        run(definition(model, store=store), pay_request(spec, **SAFE_MODEL))
    )
    await asyncio.wait_for(model.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_continuation_whose_copy_was_cut_short_finishes_the_copy_before_anything() -> None:
    """A continue_cancelled that died mid-copy leaves a prefix of the cancelled run; resuming
    it copies the rest first instead of redoing the payment under a new key (review of issue
    21: the prefix looked like "reply, nothing followed")."""
    service = Service(deduplicates=False)
    spec = pay_tool(service, ReplayPolicy.NEVER)
    store = VolatileRunStore()
    await _cancelled_after_a_payment(store, spec)
    assert len(service.effects) == 1
    source = await store.read_log("run-1")
    lease = await store.acquire_lease("run-2")
    for entry in source.entries[:3]:  # RunStarted, the model intent, its result: then "died"
        record = dataclasses.replace(entry.record, run_id="run-2")
        if isinstance(record, RunStarted):
            await lease.write_run_started(dataclasses.replace(record, continues="run-1"))
        elif isinstance(record, Intent):
            await lease.write_intent(record)
        else:
            await lease.write_model_call_result(record)  # type: ignore[arg-type]
    await lease.release()
    result = await resume(
        definition(ScriptedModel(SCRIPT), store=store), pay_request(spec, "run-2", **SAFE_MODEL)
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert len(service.effects) == 1, "the payment the cancelled run made is not made again"
    assert check_log(await store.read_log("run-2"), "run-2") is None


async def test_a_continuation_copies_the_settlements_of_the_cancelled_run() -> None:
    """A cancelled run with a step settled by a person continues; its copy passes check_log."""
    service = Service(deduplicates=False)
    spec = pay_tool(service, ReplayPolicy.NEVER)
    store = VolatileRunStore()
    service.die_after_effect = 1
    with pytest.raises(Died):
        await run(definition(ScriptedModel(SCRIPT), store=store), pay_request(spec, **SAFE_MODEL))
    await resolve(store, "run-1", result_id="a0", executed=True, observation="paid", by="ann")
    model = _HoldsSecondCall(SCRIPT)
    task = asyncio.ensure_future(
        resume(definition(model, store=store), pay_request(spec, **SAFE_MODEL))
    )
    await asyncio.wait_for(model.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    done = await continue_cancelled(
        definition(ScriptedModel(SCRIPT), store=store),
        pay_request(spec, "run-2", **SAFE_MODEL),
        cancelled_run_id="run-1",
    )
    assert done.stop_reason is StopReason.FINAL_ANSWER
    copied = await store.read_log("run-2")
    assert len(copied.settlements) == 1
    assert check_log(copied, "run-2") is None
    assert len(service.effects) == 1
