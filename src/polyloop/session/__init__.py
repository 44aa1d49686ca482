"""Run and resume one agent run: the package that weaves the logic layer together.

``run(definition, request)`` starts a run under a new run id; ``resume(definition, request)``
continues one after a crash or a kill; ``run_or_resume`` does whichever is due;
``continue_cancelled`` continues a run cancelled by mistake under a new id, ``continue_run`` one
that stopped cancelled, on an action timeout or a failed model call (a retry, design 0243);
``run_fork`` continues a fork of a run's first *k* steps under new settings (``fork`` only
makes the fork's log). Each returns a ``RunResult`` whose ``RunFinished`` record is durable
before it returns. ``replay`` drives a recorded run through today's settings without calling or
executing anything and says where it diverges (design 0240).

One step, in order (the write-ahead discipline; every arrow is awaited before the next):

1. assemble the prompt; if it is longer than ``Budget.max_prompt_chars`` stop with
   ``PROMPT_TOO_LARGE``, if its estimated tokens exceed ``Budget.max_prompt_tokens`` stop with
   ``PROMPT_TOKEN_LIMIT``, if the call could take the run's cost past ``Budget.max_cost`` stop
   with ``COST_BUDGET`` (no intent, no step, nothing truncated);
2. write the model-call ``Intent`` (durable), call the model, write its ``ModelCallResult``
   with the call's duration (a raised exception becomes a failed result, a step and
   ``LLM_ERROR``, or ``CONTEXT_LENGTH_EXCEEDED`` for a ``ContextLengthExceededError``);
3. parse the reply; an ``InvalidDecision`` or a ``FinalAnswer`` never reaches the executor; a
   parser that raises is contained: a step naming the breach, then ``PARSER_ERROR``;
4. for an ``Action``: write the action ``Intent`` (durable, with the tool's replay policy,
   ``NEVER`` for code actions), then execute it. An exception from the executor is not caught:
   it leaves ``run()`` as is and the log ends at "action intent, no step" (except a child-run
   tool's ``ChildRunOpenError``, which stops the run left open, and ``TreeLimitError``, which
   finishes it ``TREE_LIMIT``; design 0245);
5. write ``StepCompleted`` (the outcome and the step record in one record; with
   ``RunRequest.pricing``, the step's ``cost``);
6. emit one ``Event``; a sink failure is logged and counted, never fatal, never re-emitted;
7. check the stop conditions (``polyloop._stopping``).

Native tool calls (design 0100): when the decision parser claims ``native_tool_calls = True``,
every ``ModelCall`` carries ``RunRequest.tools.schema_for_model()`` in ``tools``, and each step's
``StepRecord.tool_calls`` (the parser's ``ParsedReply.tool_calls``) puts the calls on the
assistant turn of history and answers each with a ``Role.TOOL`` message.

Cancellation: a ``CancelledError`` is re-raised unchanged after a ``RunFinished`` with
``StopReason.CANCELLED`` is written, waiting at most ``cancel_grace_seconds`` for that write.

The rooms of the package, each importing only those below it (an import-linter contract):

==================  ===========================================================================
module              its one reason to change
==================  ===========================================================================
``_driver``         the run's course: lease, start, resume, continuation, loop, cancellation,
                    finish
``_continuation``   copying a cancelled run's log to a new id
``_leasing``        holding the run's lease around a call; saying so when there is none
``_settling``       settling an execution in doubt: a reconciler's answer, ``resolve``
``_resume``         from a stored log to the entry phase (the ``ResumeAction`` -> phase table)
``_step``           one step as explicit phases (model intent ... step record)
``_events``         the step's event and its best-effort delivery
``_decisions``      the parser's verdict on a reply; the flags of the tool an action calls
``_state``          what the run knows about itself: steps, counters, prompt, open execution
``_config``         ``AgentDefinition``, ``RunRequest``, the parameter snapshot (the one
                    authority on its keys) and the drift comparison
``_seams``          what an object must offer to serve as a seam
``_waits``          bounded waits on a seam; elapsed milliseconds
==================  ===========================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from polyloop import _recovery
from polyloop._common import claim_public_names as _claim_public_names
from polyloop._recovery import LogBreach, ResumeAction, ResumePlan

# The ``noqa: F401`` imports are compatibility: the single-module session of 0.1.0 had these
# public names of other public modules in its namespace (its own imports), so code may import
# them from here. They stay importable but are not in ``__all__``: import them from their
# own modules (``tests/unit/test_public_api.py`` freezes the list).
from polyloop.errors import (  # noqa: F401
    AssemblyError,
    ContextLengthExceededError,
    LogCorruptError,
    ParameterDriftError,
    PolyloopTypeError,
    PolyloopValueError,
    RunIdentityError,
    RunLeaseHeldError,
    RunLeaseLostError,
    SeamTimeoutError,
)
from polyloop.ports import (  # noqa: F401
    Action,
    ActionExecutor,
    DecisionParser,
    Event,
    EventKind,
    EventSink,
    FinalAnswer,
    InvalidDecision,
    LeasingRunStore,
    ModelCall,
    ModelClient,
    ParsedReply,
    RunLease,
    RunLog,
    RunStore,
    StepTiming,
    ToolCall,
)
from polyloop.session._config import AgentDefinition, Pricing, RunRequest, full_snapshot
from polyloop.session._continuation import CONTINUABLE, copy_prefix
from polyloop.session._driver import RunDriver as _RunDriver
from polyloop.session._leasing import checked_lease_wait, held_lease
from polyloop.session._replay import Divergence, ReplayReport, replay_log
from polyloop.session._settling import approve, reject, resolve
from polyloop.sinks import NullEventSink  # noqa: F401
from polyloop.tools import RegistryExecutor, ToolRegistry  # noqa: F401
from polyloop.types import (  # noqa: F401
    ActionOutcome,
    ActionStatus,
    Budget,
    Context,
    ForkOrigin,
    Injection,
    Intent,
    IntentKind,
    Message,
    ModelCallResult,
    ModelReply,
    ReplayPolicy,
    RunFinished,
    RunResult,
    RunStarted,
    StepCompleted,
    StepRecord,
    StopReason,
    SyntheticObservations,
)

__all__ = [
    "AgentDefinition",
    "AssemblyError",
    "Divergence",
    "LogBreach",
    "LogCorruptError",
    "ParameterDriftError",
    "Pricing",
    "ReplayReport",
    "ResumeAction",
    "ResumePlan",
    "RunIdentityError",
    "RunLeaseHeldError",
    "RunLeaseLostError",
    "RunRequest",
    "approve",
    "check_log",
    "check_tree",
    "continue_cancelled",
    "continue_run",
    "fork",
    "plan_resume",
    "reject",
    "replay",
    "resolve",
    "resume",
    "run",
    "run_fork",
    "run_or_resume",
    "stop_reason_of",
]

logger = logging.getLogger("polyloop.session")


async def run(
    definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float = 0.0
) -> RunResult:
    """Start the run ``request.run_id`` and drive it until it stops.

    Raises ``RunIdentityError`` if the run id already has a log (use ``resume``), and
    ``PolyloopTypeError`` (a ``TypeError``) before any model call if a seam's
    ``parameters()`` reports a non-``str``.
    Exceptions from the executor propagate unchanged; a parser that raises stops the run with
    ``StopReason.PARSER_ERROR`` instead (design 0161). ``CancelledError`` is
    re-raised after the ``CANCELLED`` finish record is written.

    When the store is a ``LeasingRunStore`` the run's lease is taken first (before the log
    is read) and released when this returns or raises; every record is written through it.
    A run leased by someone else raises ``RunLeaseHeldError`` after waiting up to
    ``lease_wait_seconds`` (default: refuse at once), having read and written nothing. A
    lease lost mid-run (expired, taken over) raises ``RunLeaseLostError`` from the write
    that found it lost, and nothing more is written. See design 0120.
    """
    driver = _RunDriver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.start()


def check_log(log: RunLog, run_id: str) -> LogBreach | None:
    """The first record of ``log`` (the stored log of ``run_id``) that the library could not
    have written, with its line, or ``None``: the structural check ``resume`` runs before it
    trusts any record (``polyloop._recovery.check_log``; design 0160).

    Public here for tools that judge logs without resuming them: ``python -m polyloop verify``
    and the soak scoreboard both call it, so they cannot disagree about a log's structure.
    ``resume`` may additionally pin a dangling action intent to the policy of the action its
    stored reply asks for, which needs the agent's parser; this function does not.
    """
    return _recovery.check_log(log, run_id)


def check_tree(logs: Mapping[str, RunLog]) -> tuple[str, ...]:
    """Every broken link between the runs of ``logs`` (run id to stored log), one line each;
    ``()`` when every tree of runs in them is whole (``polyloop._recovery.check_tree``;
    design 0245): each child's parent is there and names it back (a step recording it, or
    the open call whose key its id comes from), each step's child is there and names it as
    its parent. ``python -m polyloop verify`` runs it over a place's logs."""
    return _recovery.check_tree(logs)


def plan_resume(log: RunLog, run_id: str) -> ResumePlan:
    """What ``resume`` would do with ``log``, the stored log of ``run_id``, decided by the very
    planning code ``resume`` calls first (pure: no store, model or environment is touched).

    The plan is the whole verdict for ``FRESH`` (``resume`` raises ``RunIdentityError``),
    ``CORRUPT`` (``LogCorruptError``), ``ALREADY_FINISHED`` (the stored result is returned),
    ``STOP_UNKNOWN`` (``RESUME_STATE_UNKNOWN``), ``REDO_MODEL_CALL`` and ``REPLAY_LAST_ACTION``.
    Two things ``resume`` adds need the agent's definition and are not in the plan: the drift
    guard (``ParameterDriftError``), and, when steps exist, re-checking whether the last stored
    step should already have stopped the run (a final answer or a completing tool found by
    re-parsing its stored reply, a budget reached) before the plan is followed. Used by
    ``python -m polyloop show`` to say what resume would do.
    """
    return _recovery.plan_resume(log, run_id)


def stop_reason_of(log: RunLog, run_id: str) -> StopReason | None:
    """How the run ``run_id`` stands according to its stored ``log``, without resuming it.

    ======================================  ===============================================
    the log                                 result
    ======================================  ===============================================
    has a ``RunFinished``                   its stop reason
    unfinished, an execution in doubt that  ``StopReason.RESUME_STATE_UNKNOWN``: what
    nothing settles (``STOP_UNKNOWN``)      ``resume`` returns without writing a finish
                                            (design 0206); a tool's reconciler, asked on
                                            resume, may still settle it
    anything else (empty, corrupt, a run    ``None`` (a run left ``RETRIES_EXHAUSTED`` is one:
    ``resume`` would continue)              resume tries its action in doubt again, design
                                            0227)
    ======================================  ===============================================

    For tools that judge logs (the soak, dashboards): since a run in doubt is left open,
    ``log.finished`` alone no longer says how such a run ended.
    """
    if log.finished is not None:
        return log.finished.result.stop_reason
    plan = _recovery.plan_resume(log, run_id)
    if plan.action is ResumeAction.AWAITING_APPROVAL:
        return StopReason.AWAITING_APPROVAL
    return StopReason.RESUME_STATE_UNKNOWN if plan.action is ResumeAction.STOP_UNKNOWN else None


async def resume(
    definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float = 0.0
) -> RunResult:
    """Continue the run ``request.run_id`` from its log.

    A finished run returns its stored result and does nothing else; when the settings differ
    from the ones it recorded, a ``FinishedRunDriftWarning`` names the keys and says to pick a
    new run id to run with them (design 0217). Otherwise the parameter
    snapshot is recomputed (``ParameterDriftError`` lists every drifted key), the history is
    rebuilt from the stored steps (so the next prompt is byte-identical to the one an
    uninterrupted run would send), and the unsettled execution, if any, is handled by its
    recorded replay policy. ``RunResult.steps`` holds the whole trajectory, earlier processes
    included; ``event_delivery_failures`` counts this process's failures only.

    Raises ``RunIdentityError`` when the run id has no log, ``LogCorruptError`` (naming the
    line) when the log breaks a rule of ``polyloop._recovery.check_log``, finished runs
    included, or when a dangling action intent's replay policy is not the one the library gives
    the action its stored reply asks for (design 0160). Nothing is written then.

    One resumer at a time: with a ``LeasingRunStore`` (all shipped stores) the run's lease is
    taken before the log is read and released when this returns or raises, exactly as in
    ``run()`` (``RunLeaseHeldError`` after ``lease_wait_seconds``; ``RunLeaseLostError`` when
    the lease is lost mid-run, with nothing written after the loss). With a store that offers
    no leases, keeping to one resumer per run id stays the caller's duty (design 0052, 0120).
    """
    driver = _RunDriver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.resume()


async def continue_cancelled(
    definition: AgentDefinition,
    request: RunRequest,
    *,
    cancelled_run_id: str,
    lease_wait_seconds: float = 0.0,
) -> RunResult:
    """Continue a run that was cancelled by mistake (Ctrl-C), under the new id ``request.run_id``.

    Cancellation stays exact: the run ``cancelled_run_id`` keeps its ``CANCELLED`` finish and
    ``resume`` of it keeps returning that result. This copies every record of it except the
    finish to the new run id (whose log must be empty) and resumes the new run from there,
    exactly as after a crash at that point: the history is rebuilt, the parameter snapshot must
    not have drifted (``ParameterDriftError``), and an execution the cancellation left in flight
    (``RunResult.unknown_outcome`` of the cancelled run) is handled by its recorded replay
    policy, so a ``NEVER`` action is never repeated (the new run stops with
    ``RESUME_STATE_UNKNOWN``). Design 0163.

    Raises ``RunIdentityError`` when ``cancelled_run_id`` has no log, is unfinished (use
    ``resume``) or finished for another reason, or when ``request.run_id`` is already used;
    ``LogCorruptError`` when the cancelled run's log fails ``check_log``. If this call is itself
    interrupted while copying, the new run id holds a valid prefix: ``resume`` it.
    """
    driver = _RunDriver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.continue_cancelled(cancelled_run_id)


async def continue_run(
    definition: AgentDefinition,
    request: RunRequest,
    *,
    from_run_id: str,
    lease_wait_seconds: float = 0.0,
) -> RunResult:
    """Continue the stopped run ``from_run_id`` under the new id ``request.run_id``: a retry
    that keeps what the stopped run did (design 0242; ``polyloop.batch`` retries with it).

    ``continue_cancelled`` generalised to the stops a retry may continue from
    (``_continuation.CONTINUABLE``): ``CANCELLED``; ``ACTION_TIMEOUT`` (the timed-out action's
    intent is copied unanswered, so its replay policy decides: a ``NEVER`` action is never
    repeated, the new run stops with ``RESUME_STATE_UNKNOWN``); and ``LLM_ERROR`` (the failed
    step, which executed nothing, is not copied: the model call is made again as a new step,
    and does not count twice against ``Budget.max_steps``). Every other record is copied in
    write order, so every recorded step and effect is kept and none is executed again; the
    stopped run keeps its finish, and the new run's ``RunStarted.continues`` names it.

    Raises ``RunIdentityError`` when ``from_run_id`` has no log, is unfinished (``resume`` it)
    or stopped for another reason, or when ``request.run_id`` is already used;
    ``LogCorruptError`` when the stopped run's log fails ``check_log``;
    ``ParameterDriftError`` when the settings changed. A copy cut short by a crash is
    completed by ``resume`` (or ``run_or_resume``) of the new id.
    """
    driver = _RunDriver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.continue_cancelled(from_run_id, CONTINUABLE)


async def fork(
    store: RunStore,
    source_run_id: str,
    *,
    at: int,
    new_run_id: str,
    definition: AgentDefinition | None = None,
    request: RunRequest | None = None,
    lease_wait_seconds: float = 0.0,
) -> ForkOrigin:
    """Make the log of a fork: a new run ``new_run_id`` whose first records are a copy of the
    run ``source_run_id``'s steps ``0 .. at-1`` (design 0239). Nothing is called or executed,
    and the source is only read.

    The fork's ``RunStarted`` records its origin (``ForkOrigin``: the source, ``at``, how many
    records were copied, their digest, and the source's own origins when it is a fork) and the
    settings the fork runs under: ``definition`` and ``request`` (both, ``request.run_id``
    being ``new_run_id``) give its parameter snapshot and context; without them it keeps the
    source's. Every copied record gets the new run id (and its line a checksum of its own)
    and loses its resume mark (the source's ``resume_stopped`` records, nothing but marks,
    are not copied), written under the new run's lease. Continue the fork with ``resume`` (or
    ``run_or_resume``) under those settings: it goes on live from step ``at``; or do both at
    once with ``run_fork``.

    Raises ``RunIdentityError`` when the source has no log or ``new_run_id`` already has one,
    ``LogCorruptError`` when the source fails ``check_log``, ``PolyloopValueError`` when ``at``
    is not between 0 and the number of steps the source completed, ``ForkError`` when the
    source's step ``at`` has an action in doubt that is not ``SAFE`` or waits for an approval
    (settle or decide it first, or fork earlier), and what taking the lease raises
    (``RunLeaseHeldError``).
    """
    if (definition is None) != (request is None):
        raise PolyloopValueError(
            "fork: pass both definition and request (the fork's settings) or neither (the "
            "source's settings)"
        )
    settings = None
    if definition is not None and request is not None:
        if request.run_id != new_run_id:
            raise PolyloopValueError(
                f"fork: request.run_id {request.run_id!r} must be the new run id {new_run_id!r}"
            )
        settings = (
            full_snapshot(definition, request),
            request.context if request.record_context else None,
        )
    wait = checked_lease_wait(lease_wait_seconds)
    async with held_lease(store, new_run_id, wait) as writer:
        return await copy_prefix(store, writer, source_run_id, new_run_id, at, settings=settings)


async def run_fork(
    definition: AgentDefinition,
    request: RunRequest,
    *,
    source_run_id: str,
    at: int,
    lease_wait_seconds: float = 0.0,
) -> RunResult:
    """Fork the run ``source_run_id`` at step ``at`` as ``request.run_id`` under these
    settings (another model, prompt, tools, budget) and drive the fork until it stops.

    The fork's steps ``0 .. at-1`` are the source's, copied (``fork``): no model call and no
    tool call is made for them, and an effect they record is never executed again; the fork's
    parameter snapshot is these settings, so its resumes are guarded against drift from them,
    not from the source's. From step ``at`` on it is a run like any other: a resume after a
    kill continues it. Idempotent: when ``request.run_id`` already holds this fork (an earlier
    call, or ``python -m polyloop fork``), it is resumed, its copy completed first if it was
    interrupted. Raises what ``fork`` and ``resume`` raise; ``RunIdentityError`` when
    ``request.run_id`` holds anything else.
    """
    driver = _RunDriver(definition, request, lease_wait_seconds=lease_wait_seconds)
    return await driver.fork(source_run_id, at)


async def replay(
    definition: AgentDefinition, request: RunRequest, *, log: RunLog | None = None
) -> ReplayReport:
    """Drive the recorded run ``request.run_id`` through these settings offline and report
    the first step where anything differs (design 0240).

    The recorded model replies stand in for the model and the recorded outcomes for the
    tools: nothing is sent, nothing is executed, nothing is written. Compared, step by step:
    the assembled prompt (its digest and first differing message, against the prompt rebuilt
    from the log), the parsed decision, the called tool's schema and replay policy, the stop
    reason. ``log`` is the recorded log (default: read from ``definition.store``). The
    definition's model client, executor and store are never called. Raises
    ``LogCorruptError`` for a log that fails ``check_log`` (an empty one included).
    """
    if log is None:
        log = await definition.store.read_log(request.run_id)
    return replay_log(definition, request, log)


async def run_or_resume(
    definition: AgentDefinition, request: RunRequest, *, lease_wait_seconds: float = 0.0
) -> RunResult:
    """Bring the run ``request.run_id`` to an end, whatever state it is in; idempotent.

    * no log: start it (``run``);
    * an unfinished log: continue it (``resume``, with its drift guard and recovery table);
    * a finished log: return the stored result, doing nothing else.

    This is the entry point for anything that may execute the same run more than once without
    knowing how far an earlier attempt got: a distributed engine re-executing the task of a
    dead worker, a duplicate submission, a retry loop. If another caller starts the run between
    this call's read and its start (``run`` raises ``RunIdentityError`` for the exclusive
    start), the call resumes instead. See ``research-wiki/design/0141-run-or-resume.md``.

    With a ``LeasingRunStore``, ``run``/``resume`` hold the run's lease (design 0120): a
    concurrent duplicate gets ``RunLeaseHeldError`` after ``lease_wait_seconds``.

    Raises what ``run`` and ``resume`` raise (``ParameterDriftError``, ``LogCorruptError``,
    an executor's exception); ``RunIdentityError`` only when the id's first record was torn by a
    crash (the store holds an entry that is neither empty nor readable as a run).
    """
    log = await definition.store.read_log(request.run_id)
    if log.is_empty:
        try:
            return await run(definition, request, lease_wait_seconds=lease_wait_seconds)
        except RunIdentityError:
            logger.info(
                "run %s: started by another caller between our read and our start; resuming",
                request.run_id,
            )
    return await resume(definition, request, lease_wait_seconds=lease_wait_seconds)


# The public names are documented, pickled and printed as ``polyloop.session.<name>``: where
# they live inside the package is not part of the API (design 0221). Last, so that every
# name of ``__all__`` is defined.
_claim_public_names(__name__, globals())
