"""Every exception polyloop raises, under one root, ``PolyloopError``, in families a caller can
catch (design 0221).

This is the lowest module of the package (below ``types``): it imports nothing, so every layer
can raise these. The modules that raised them in 0.1.0 re-export them under the same names
(``polyloop.session.RunIdentityError`` is ``polyloop.errors.RunIdentityError``).

The families (middle classes, never raised themselves; catch one to catch all its members):

==================  =========================================================================
family              catches
==================  =========================================================================
``StoreError``      a store failed or refused to serve a run: its disk or database failed
                    (``StoreUnavailableError``), its tables are of another schema
                    (``StoreSchemaError``), the run's lease is held elsewhere or was lost
                    (``RunLeaseHeldError``, ``RunLeaseLostError``), a batched statement answered
                    the wrong count (``BatchAnswerError``). Every failure of the
                    shipped stores' methods is one (design 0221)
``RunStateError``   the run's state forbids the call: the id is used or unknown
                    (``RunIdentityError``, ``RunAlreadyStartedError``), the settings drifted
                    (``ParameterDriftError``), there is nothing to settle
                    (``ResolutionError``), a fork point is in doubt or awaits a person
                    (``ForkError``), a child run stopped left open
                    (``ChildRunOpenError``, caught by the parent's session), a child run
                    would pass ``max_depth``/``max_children`` (``TreeLimitError``, caught
                    by the parent's session)
``LogCorruptError`` a log the library cannot have written (``LogChecksumError`` too). An
                    unreadable record is a ``DecodeError`` (a ``PolyloopValueError``): catch
                    ``(LogCorruptError, DecodeError)`` for "this log cannot be used"
``SeamError``       a seam, or what it reaches, failed: a seam call outlived its bound
                    (``SeamTimeoutError``), a model endpoint refused a prompt as too long
                    (``ContextLengthExceededError``), the gateway adapter's errors, and
                    ``ToolError``
``ToolError``       (a ``SeamError``) a tool or a tool server failed or refused:
                    ``ToolEnvironmentError``, ``ToolOutcomeUnknown``, ``ToolValidationError``,
                    ``McpConnectionError``, ``McpToolError``
``EngineError``     a distributed engine cannot run the work: ``EngineNotConnectedError``,
                    ``EngineCapacityError``
==================  =========================================================================

Every class, with its bases (a family only ever adds a base; every earlier base is still an
ancestor, so every ``except`` that caught a class catches it still):

=========================== ======================================= ==============================
class                       bases                                   raised when
=========================== ======================================= ==============================
``PolyloopError``           ``Exception``                           never directly; catch it to
                                                                    catch all polyloop raises
``PolyloopTypeError``       ``PolyloopError``, ``TypeError``        a value of the wrong type
``PolyloopValueError``      ``PolyloopError``, ``ValueError``       a right-typed, disallowed value
``DecodeError``             ``PolyloopValueError``                  a stored payload is unreadable
``AssemblyError``           ``PolyloopValueError``                  a prompt cannot be assembled
``OutputValidationError``   ``PolyloopValueError``                  a final answer does not fit
                                                                    the ``Agent``'s output type
                                                                    (design 0208)
``StoreError``              ``PolyloopError``                       never directly: the family of
                                                                    a store's failures
``StoreUnavailableError``   ``StoreError``, ``OSError``             a store's disk, files or
                                                                    database failed under a read
                                                                    or write (disk full, server
                                                                    down; issue 24)
``StoreSchemaError``        ``StoreError``                          a database store's tables are
                                                                    of a newer schema version
``RunLeaseHeldError``       ``StoreError``                          another holder has the run's
                                                                    lease (``run``/``resume``
                                                                    refused, nothing written)
``RunLeaseLostError``       ``StoreError``                          a write through a lease that
                                                                    was released, expired or taken
                                                                    over (nothing written)
``BatchAnswerError``        ``StoreError``, ``RuntimeError``        a store's batched statement
                                                                    answered more or fewer items
                                                                    than it was given (a store
                                                                    bug; design 0218)
``RunStateError``           ``PolyloopError``                       never directly: the family of
                                                                    refusals by the run's state
``RunIdentityError``        ``RunStateError``                       ``run()`` on a used id, or
                                                                    ``resume()`` on an unknown one
``RunAlreadyStartedError``  ``RunStateError``,                      ``write_run_started`` on a run
                            ``FileExistsError``                     id that has records (the
                                                                    stores' exclusive start)
``ParameterDriftError``     ``RunStateError``                       settings changed since start
``ResolutionError``         ``RunStateError``                       ``resolve()`` refused: nothing
                                                                    in doubt, another execution,
                                                                    a finished run (design 0206)
``ForkError``               ``RunStateError``                       ``fork()`` refused: the step at
                                                                    the fork point is in doubt or
                                                                    awaits approval (design 0239)
``ChildRunOpenError``       ``RunStateError``                       a child run stopped left open
                                                                    (awaiting approval, in doubt):
                                                                    its parent stops the same way
                                                                    (design 0245; never escapes a
                                                                    run)
``TreeLimitError``          ``RunStateError``                       a child-run call would pass
                                                                    ``max_depth``/``max_children``:
                                                                    its parent finishes
                                                                    ``tree_limit`` (design 0245;
                                                                    never escapes a run)
``LogCorruptError``         ``PolyloopError``                       a log the library cannot have
                                                                    written
``LogChecksumError``        ``LogCorruptError``, ``DecodeError``    a stored line's checksum does
                                                                    not match (design 0162)
``SeamError``               ``PolyloopError``                       never directly: the family of
                                                                    seam failures
``SeamTimeoutError``        ``SeamError``, ``TimeoutError``         a seam call outlived its bound
                                                                    (design 0164; never escapes)
``ContextLengthExceededError`` ``SeamError``                        a model endpoint refused the
                                                                    prompt as too long
``ToolError``               ``SeamError``                           never directly: the family of
                                                                    tool failures
``ToolEnvironmentError``    ``ToolError``                           a handler reports a broken env
``ToolOutcomeUnknown``      ``ToolError``                           an executor cannot tell whether
                                                                    a call took effect (design 0227)
``ToolValidationError``     ``PolyloopValueError``, ``ToolError``   a tool call is refused
``McpConnectionError``      ``ToolError``                           ``polyloop.mcp`` cannot connect
                                                                    to a server or list its tools
                                                                    (design 0211)
``McpToolError``            ``ToolError``                           an MCP tool's result says
                                                                    ``isError``, or the server
                                                                    answered an error: an executed
                                                                    action that failed
``EngineError``             ``PolyloopError``                       never directly: the family of
                                                                    a distributed engine's errors
``EngineNotConnectedError`` ``EngineError``                         ``polyloop.ray`` used before
                                                                    ``ray.init``
``EngineCapacityError``     ``EngineError``, ``TimeoutError``       ``polyloop.ray`` found no
                                                                    actor or node to run on for
                                                                    its bound (issue 27)
``InspectError``            ``PolyloopError``                       ``python -m polyloop`` cannot
                                                                    read its input
``EventLoopRunningError``   ``PolyloopError``, ``RuntimeError``     ``Agent.run_sync`` called where
                                                                    an event loop already runs
=========================== ======================================= ==============================

A class belongs to one family, except ``ToolValidationError`` (a refused value and a tool's
refusal) and ``LogChecksumError`` (corruption and an unreadable line), which were already
two things. ``DecodeError`` is not a ``LogCorruptError``: it is also what decoding any payload
raises, and ``LogChecksumError``'s bases (``LogCorruptError`` before ``DecodeError``) would
have no consistent order. A store reading a corrupt log raises ``DecodeError`` (or
``LogChecksumError``), not a ``StoreError``: the store works, the log does not.

Two warning categories live here too, each a ``PolyloopError`` and a ``UserWarning``, issued
through ``warnings``, never raised: ``UnleasedStoreWarning``, once per store object, the first
time a run uses a store that offers no leases and does not say ``offers_leases = False``
(``polyloop.session``, design 0120); and ``FinishedRunDriftWarning``, each time ``resume`` (or
``run_or_resume``, ``Agent.run``) hands back a finished run's stored result under settings that
differ from the ones the run recorded (design 0217), at the caller's line and shown every time
under Python's default filter (``logging.captureWarnings(True)`` sends it to the logs).

``RunAlreadyStartedError`` is also a ``FileExistsError`` (with ``errno`` ``EEXIST``), the
builtin the stores raised before it existed: code that catches ``FileExistsError`` keeps
working, and a store of your own may still raise a plain ``FileExistsError`` (the library, and
``polyloop.testing``, accept both).

``ContextLengthExceededError`` is raised by model clients when an endpoint refuses a prompt as
longer than the model's context; the session gives it its own stop reason.

The rule for new code: a wrong *type* raises ``PolyloopTypeError`` (a ``TypeError``), a wrong
*value* raises ``PolyloopValueError`` (a ``ValueError``) or a subclass, and a failed *state*
(identity, drift, corruption, a lost lease) gets its own ``PolyloopError`` subclass here, in
the family a caller would catch it with (a new store failure is a ``StoreError``).
The gateway adapter's six errors (``polyloop.adapters.GatewayHTTPError``,
``GatewayContextLengthError``, ``GatewayResponseError``, ``GatewayTimeoutError``,
``GatewayConnectError``, ``GatewayTransportError``; design 0202) are ``SeamError``s; they live
in the adapter because each also subclasses an ``httpx`` exception, and this module imports
nothing third-party.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

__all__ = [
    "AssemblyError",
    "BatchAnswerError",
    "ChildRunOpenError",
    "ContextLengthExceededError",
    "DecodeError",
    "EngineCapacityError",
    "EngineError",
    "EngineNotConnectedError",
    "EventLoopRunningError",
    "FinishedRunDriftWarning",
    "ForkError",
    "InspectError",
    "LogChecksumError",
    "LogCorruptError",
    "McpConnectionError",
    "McpToolError",
    "OutputValidationError",
    "ParameterDriftError",
    "PolyloopError",
    "PolyloopTypeError",
    "PolyloopValueError",
    "ResolutionError",
    "RunAlreadyStartedError",
    "RunIdentityError",
    "RunLeaseHeldError",
    "RunLeaseLostError",
    "RunStateError",
    "SeamError",
    "SeamTimeoutError",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "ToolEnvironmentError",
    "ToolError",
    "ToolOutcomeUnknown",
    "ToolValidationError",
    "TreeLimitError",
    "UnleasedStoreWarning",
]


class PolyloopError(Exception):
    """The root of every exception polyloop raises."""


class PolyloopTypeError(PolyloopError, TypeError):
    """A value of the wrong type: the message names the field, the type found and the fix."""


class PolyloopValueError(PolyloopError, ValueError):
    """A value of the right type that is not allowed: the message names the field and the fix."""


# --------------------------------------------------------------------------- the families (0221)


class StoreError(PolyloopError):
    """A store failed, or refused to serve the run, for a reason of its own (design 0221).

    Never raised itself: ``except StoreError`` catches ``StoreUnavailableError`` (its disk,
    files or database failed), ``StoreSchemaError`` (its tables are of another schema),
    ``RunLeaseHeldError`` and ``RunLeaseLostError`` (another holder has the run). Every failure
    of a shipped store's methods (``JsonlRunStore``, ``VolatileRunStore``,
    ``PostgresRunStore`` and their leases) is one; a taken run id
    (``RunAlreadyStartedError``, a ``RunStateError``) and an unreadable log (``DecodeError``,
    ``LogCorruptError``) are not: the store works, the run or its log forbids the call.
    """


class RunStateError(PolyloopError):
    """The run's state forbids the call; nothing was written (design 0221).

    Never raised itself: ``except RunStateError`` catches ``RunIdentityError`` (``run()`` on a
    used id, ``resume()`` on an unknown one), ``RunAlreadyStartedError`` (a store's exclusive
    start), ``ParameterDriftError`` (the settings changed since the start) and
    ``ResolutionError`` (nothing to settle), ``ForkError`` (a fork point in doubt or awaiting
    a person), ``ChildRunOpenError`` (a child run left open, which the parent's session
    turns into its own stop) and ``TreeLimitError`` (a child run past ``max_depth`` or
    ``max_children``, which the parent's session turns into its ``tree_limit`` finish).
    Calling again does not help; calling something else (``resume`` for ``run``, a new run
    id, the original settings) does.
    """


class SeamError(PolyloopError):
    """A seam, or what it reaches, failed: a model endpoint, a tool, a tool server (design 0221).

    Never raised itself: ``except SeamError`` catches ``SeamTimeoutError``,
    ``ContextLengthExceededError``, the gateway adapter's errors (``polyloop.adapters``) and
    every ``ToolError``. Inside a run the session turns these into typed outcomes (a failed
    model call, an ``ENV_ERROR``, an observation); they reach a caller who uses a seam directly
    (a ``GatewayModelClient``, an ``McpToolset``, a tool handler).
    """


class ChildRunOpenError(RunStateError):
    """A child run stopped left open: ``awaiting_approval``, ``resume_state_unknown`` or
    ``retries_exhausted`` (design 0245).

    Raised by the handler of a child-run tool (``polyloop.agent.child_tool``), let through by
    ``RegistryExecutor`` and caught by the session, which stops the parent with the same stop
    reason, left open too: the parent's action intent stays unanswered, so resuming the parent
    replays the call, which re-attaches to the child. It never escapes ``run``/``resume``.
    ``stop_reason`` is the child's stop reason's value, ``result`` the child's ``RunResult``
    (its ``pending_approval`` is the request a person answers).
    """

    def __init__(self, message: str, *, stop_reason: str, result: object) -> None:
        super().__init__(message)
        self.stop_reason = stop_reason
        self.result = result


class TreeLimitError(RunStateError):
    """A child-run call would pass its tool's ``max_depth`` or ``max_children`` (design 0245).

    Raised by the handler of a child-run tool (``polyloop.agent.child_tool``) before anything
    of the child runs, let through by ``RegistryExecutor`` and caught by the session, which
    finishes the parent with ``StopReason.TREE_LIMIT``: its ``RunResult.stop_detail`` is this
    message (which limit, which call); the call's action intent stays unanswered (nothing was
    started). It never escapes ``run``/``resume``. ``limit`` is ``"max_depth"`` or
    ``"max_children"``, ``tool`` the tool's name.
    """

    def __init__(self, message: str, *, limit: str, tool: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.tool = tool


class ToolError(SeamError):
    """A tool or a tool server failed or refused a call (design 0221).

    Never raised itself: ``except ToolError`` catches ``ToolEnvironmentError``,
    ``ToolValidationError``, ``McpConnectionError`` and ``McpToolError``.
    """


class EngineError(PolyloopError):
    """A distributed engine cannot run the work (design 0221).

    Never raised itself: ``except EngineError`` catches ``EngineNotConnectedError`` and
    ``EngineCapacityError``.
    """


class DecodeError(PolyloopValueError):
    """A payload cannot be turned back into a record.

    The message names the record type and field path and says what was expected. Stores prefix
    it with where the payload came from (run id and line number) and then set ``line`` to that
    1-based line number (``None`` when no line is known, e.g. from ``decode_*`` directly).
    """

    line: int | None = None


class AssemblyError(PolyloopValueError):
    """The prompt cannot be assembled or measured as asked (bad template, unknown block)."""


class ToolValidationError(PolyloopValueError, ToolError):
    """A tool call was refused before it ran: unknown tool, or arguments that break the schema.

    The message names the tool, the offending key and what was expected, in words a person or
    a model can act on (``RegistryExecutor`` stores it as the observation of the
    ``NOT_EXECUTED`` action; the session shows the model its configured rejection text).
    ``tool`` and ``key`` carry the same facts for programs; either is ``None`` when it does
    not apply (``key`` for an unknown tool, ``tool`` when the call's name is not a string).
    """

    def __init__(self, message: str, *, tool: str | None, key: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool
        self.key = key


class ToolEnvironmentError(ToolError):
    """Raised by a tool handler to say "the environment is broken", not "this action failed".

    ``RegistryExecutor`` turns it into ``ActionStatus.ENV_ERROR``, which stops the run with
    ``StopReason.ENV_ERROR``. Any *other* exception from a handler is the action's own failure:
    the action counts as ``EXECUTED`` and the error text is what the model observes.
    """


class ToolOutcomeUnknown(ToolError):
    """Raised by a tool handler (or any ``ActionExecutor``) to say "I cannot tell whether this
    call took effect": the request may have reached the tool's system and acted before the
    answer was lost (a connection dropped after the request was sent, a read timed out, an MCP
    server died mid-call). Design 0227.

    It is neither an executed failure (which the model reads and may answer by calling again)
    nor a broken environment (``ToolEnvironmentError``, which finishes the run). The execution
    is *in doubt*, exactly as after a crash inside the tool, and its replay policy settles it
    in the same run: ``SAFE`` is tried again, ``IDEMPOTENT`` again with the same idempotency
    key (a bounded number of attempts, then the run stops ``retries_exhausted``, left open), a
    ``NEVER`` call goes to its tool's reconciler, and without one the run stops
    ``resume_state_unknown``, open, for ``polyloop.session.resolve``. ``RegistryExecutor``
    passes it on untouched; the message is the reason put on record.
    """


class ContextLengthExceededError(SeamError):
    """A model client's way of saying "the endpoint refused this prompt as too long".

    A ``ModelClient`` raises a subclass of it (the gateway adapter's
    ``GatewayContextLengthError`` is one) when the endpoint answered that the prompt does not
    fit the model's context window. The session records the failed call with
    ``ModelCallResult.context_length_exceeded`` and stops the run with
    ``StopReason.CONTEXT_LENGTH_EXCEEDED`` instead of the generic ``LLM_ERROR``, because the
    remedy differs: a shorter prompt, a token budget (``Budget.max_prompt_tokens``) or a
    model with a larger context, not a retry (design 0201).
    """


class RunIdentityError(RunStateError):
    """The run id is in the wrong state for the call: ``run()`` on an id that already has a
    log (use ``resume()``), or ``resume()`` on an id that has none (use ``run()``)."""


class RunAlreadyStartedError(RunStateError, FileExistsError):
    """``write_run_started`` found records under the run id already: the start is exclusive.

    Raised by the shipped stores (``JsonlRunStore``, ``VolatileRunStore``, ``PostgresRunStore``)
    and their leases, from the plain method and through a lease alike; nothing was written.
    ``run_id`` names the run. It is a ``FileExistsError`` (``errno`` is ``errno.EEXIST``) so
    that callers catching the builtin keep working; ``run()`` turns either into
    ``RunIdentityError``. Start a new run with a new run id, or ``resume()`` this one.
    """

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.errno = errno.EEXIST  # OSError's own field; the text stays the message alone
        self.run_id = run_id


class ParameterDriftError(RunStateError):
    """``resume`` found settings that differ from those the run started with.

    ``added`` are keys present now but not at the start, ``removed`` the reverse, ``changed``
    maps a key to ``(at_start, now)``. Nothing was written. Resume with the original settings,
    or start a new run id with the new ones.
    """

    def __init__(
        self,
        run_id: str,
        *,
        added: Sequence[str],
        removed: Sequence[str],
        changed: Mapping[str, tuple[str, str]],
    ) -> None:
        self.run_id = run_id
        self.added = tuple(added)
        self.removed = tuple(removed)
        self.changed = dict(changed)
        lines = [f"run {run_id!r}: the parameter snapshot drifted since the run started;"]
        lines += [f"  added   {key}" for key in self.added]
        lines += [f"  removed {key}" for key in self.removed]
        lines += [f"  changed {key}: {old!r} -> {new!r}" for key, (old, new) in changed.items()]
        lines.append("resume with the original settings, or start a new run id with run()")
        super().__init__("\n".join(lines))


class LogCorruptError(PolyloopError):
    """The log cannot have been written by the library: resume refuses to touch the run.

    Raised by ``resume()`` for a ``ResumeAction.CORRUPT`` plan. The message says which record
    breaks which rule and, when the store keeps positions, on which line; ``line`` holds that
    1-based line number (``None`` when unknown). Nothing is written; inspect the log (see
    ``research-wiki/reference/log-format.md``) before doing anything else with the run.
    """

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class InspectError(PolyloopError):
    """``python -m polyloop`` cannot read what it was pointed at.

    A missing file, a log line that does not decode (the message names the file and line), a
    directory without logs, a store URL whose scheme no shipped store has. The command line
    prints the message as one line and exits non-zero; it never shows a traceback for these.
    """


class EngineNotConnectedError(EngineError):
    """A distributed engine was asked to run work before this process connected to it.

    ``polyloop.ray.run_on_ray`` raises it when this process has not connected to Ray (with
    ``ray.init(address=..., _node_ip_address="127.0.0.1")`` on a loopback cluster): it never
    starts a cluster (or chooses an address) on its own. Connect first, then call again.
    """


class EngineCapacityError(EngineError, TimeoutError):
    """A distributed engine had nowhere to run work for longer than its bound.

    ``polyloop.ray.run_on_ray`` raises it when, for ``capacity_wait_seconds``, none of its
    actors answered (none could be placed, or every node that held one is gone), or no alive
    node offered the CPUs one task needs. The message names what is missing (nodes, CPUs) and
    what was done so far; the runs still in flight stop where they are and continue (from
    their logs) on the next call, once the cluster has room again (issue 27).
    """


class RunLeaseHeldError(StoreError):
    """The run's lease is held by someone else (design 0120).

    Raised by ``LeasingRunStore.acquire_lease`` (and so by ``run()``/``resume()``) when another
    process, or another lease in this one, holds the run id and did not release it within the
    caller's ``wait_seconds``. Nothing was read or written. Retry later, wait longer
    (``lease_wait_seconds``), or leave the run to its current holder. ``run_id`` names the run.
    """

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunLeaseLostError(StoreError):
    """A write through a run lease that is no longer the run's current lease (design 0120).

    The lease was released, expired, or another holder took the run over; the store refused
    the write inside the write itself, so nothing of this record (and nothing after it) is in
    the log. The holder must stop working on the run: its next step would act on a log that
    someone else may be extending. ``run_id`` names the run, ``epoch`` the lost lease's epoch.
    """

    def __init__(self, message: str, *, run_id: str, epoch: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.epoch = epoch


class LogChecksumError(LogCorruptError, DecodeError):
    """A stored line whose checksum does not match its bytes, or is missing where the line's
    schema version requires one (design 0162), or a line that claims an older schema version
    than its log's first record (schema 1.7; the older version's weaker checks would hide an
    edit): the line was changed after it was written.

    Both a ``LogCorruptError`` (the log cannot be trusted; ``line`` names the line) and a
    ``DecodeError`` (the line cannot be turned back into a record), so every reader that
    already handles unreadable lines handles it too.
    """


class StoreSchemaError(StoreError):
    """A database store found its tables at a schema version newer than this library's
    (design 0121): upgrade polyloop to use that database. Or, opened not to create them
    (``PostgresRunStore.open(..., create_tables=False)``, as the inspector opens it), it found
    none, or tables without a schema version. Nothing was changed either way."""


class StoreUnavailableError(StoreError, OSError):
    """A store could not read or write because what it stands on failed (issue 24): a full
    disk, a file it cannot write or read, a database server that is down or restarting, a
    broken connection.

    Raised by the shipped stores (``JsonlRunStore``, ``PostgresRunStore``) and their leases
    from every write, ``read_log`` and ``acquire_lease`` (and by ``PostgresRunStore.open``);
    ``run()`` and ``resume()`` let it through. The message names the store, the run, the record
    and, for a store of files, the file, then gives the OS's or the driver's words; that error
    is ``__cause__``. ``store``, ``run_id`` (``None`` when no run was involved), ``record`` (a
    record's tag such as ``"step_completed"``, or ``"log"`` for a read, ``"lease"``, ``"schema"``)
    and ``path`` (``None`` for a database) carry the same facts; ``errno`` and ``strerror`` are
    the cause's when it is an ``OSError`` (``errno.ENOSPC`` for a full disk).

    A write that raised it may or may not have been stored. The log stays readable (a line the
    failure tore is not a record) and the run resumes from what is stored once the store
    works again. It is also an ``OSError``, as the JSONL store raised the builtin before: code
    that catches ``OSError`` keeps working. A lost lease, a taken run id and an unreadable line
    keep their own types (``RunLeaseLostError``, ``RunAlreadyStartedError``, ``DecodeError``).
    """

    def __init__(
        self,
        message: str,
        *,
        store: str = "",
        run_id: str | None = None,
        record: str = "",
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.store = store
        self.run_id = run_id
        self.record = record
        self.path = path

    def __str__(self) -> str:
        # The message alone: OSError would print "[Errno n] strerror" once both are set.
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable (a Ray worker sends it to the driver), errno and strerror included.
        state = {**self.__dict__, "errno": self.errno, "strerror": self.strerror}
        return (type(self), self.args, state)


class ResolutionError(RunStateError):
    """``polyloop.session.resolve`` refused to settle an execution (design 0206); nothing was
    written. ``reason`` says why, one of: ``"no_log"`` (the run id has no records),
    ``"finished"`` (the run has a ``RunFinished``), ``"nothing_in_doubt"`` (no action of the
    run is in doubt), ``"model_call"`` (what is in doubt is a model call: only an action can be
    settled), ``"wrong_result_id"`` (another execution is the one in doubt; the message names
    it), ``"store_cannot_settle"`` (the store has no ``write_settlement``)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ForkError(RunStateError):
    """``polyloop.session.fork`` refused the fork point (design 0239); nothing was written.
    ``reason`` says why: ``"in_doubt"`` (the source's step at the fork point has an action
    whose outcome is unknown and whose replay policy is not ``SAFE``: it may have acted, and
    the fork could act again; settle a ``NEVER`` one first, resume the source for an
    ``IDEMPOTENT`` one) or ``"awaiting_approval"`` (a call of that
    step waits for a person; decide it first). Fork at an earlier step, or settle or decide
    the step and fork then."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class OutputValidationError(PolyloopValueError):
    """A final answer does not fit the ``polyloop.Agent``'s ``output_type`` (design 0208).

    ``problems`` lists what is wrong, each naming the field and what was expected. Inside a
    run it never escapes: the structured-output parser turns it into an ``InvalidDecision`` the
    model is told about. ``Agent.run`` raises it only for a recorded answer that no longer fits:
    a run that finished under another output type, returned again under its run id.
    """

    def __init__(self, message: str, *, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class EventLoopRunningError(PolyloopError, RuntimeError):
    """``Agent.run_sync`` was called where an event loop is already running (a notebook, an
    async framework): it would have to block that loop. Nothing was run; ``await
    agent.run(...)`` there instead."""


class SeamTimeoutError(SeamError, TimeoutError):
    """A seam call did not return within its bound (``RunRequest.model_call_timeout_seconds``,
    ``action_timeout_seconds`` or ``event_timeout_seconds``; design 0164).

    The session turns it into a typed outcome and never lets it escape a run: a timed-out
    model call is a failed call (``LLM_ERROR``, this error's text is the failure), a timed-out
    action is an execution in doubt settled by its replay policy like ``ToolOutcomeUnknown``
    (design 0227), a timed-out event is a counted delivery failure. ``seconds`` is the bound.
    """

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class FinishedRunDriftWarning(PolyloopError, UserWarning):
    """A finished run was asked for again with settings that differ from the ones it recorded.

    The run is not run again: its stored result comes back, as the seed's rule says (a finished
    run reports its result). What changed would otherwise be ignored in silence, so the warning
    names every key that differs (``added``, ``removed``, ``changed`` as in
    ``ParameterDriftError``) and says to pick a new run id to run with the new settings
    (design 0217).
    """

    def __init__(
        self,
        run_id: str,
        *,
        added: Sequence[str],
        removed: Sequence[str],
        changed: Sequence[str],
    ) -> None:
        self.run_id = run_id
        self.added = tuple(added)
        self.removed = tuple(removed)
        self.changed = tuple(changed)
        keys = sorted((*self.added, *self.removed, *self.changed))
        super().__init__(
            f"run {run_id!r} is finished, so its stored result is returned and nothing runs; "
            f"the settings now differ from the ones it finished with in {', '.join(keys)}. "
            "To run with the new settings, pick a new run id"
        )


class UnleasedStoreWarning(PolyloopError, UserWarning):
    """A run used a store that offers no ``acquire_lease``, so nothing stops a second resumer.

    Issued once per store object. A store wrapper that forwards the ``RunStore`` methods but
    not ``acquire_lease`` turns leases off silently; forward it (``polyloop.stores``'
    ``ForwardingRunStore`` does) or keep to one resumer per run id (design 0120).
    """


class McpConnectionError(ToolError):
    """``polyloop.mcp`` cannot connect to an MCP server, or cannot list its tools (design 0211).

    Raised by ``McpToolset.__aenter__`` (every connection it opened is closed again). The
    message names the server and says what failed; a stdio server's last stderr lines are
    quoted. Never raised inside a run: a server that dies there is an outcome in doubt
    (``ToolOutcomeUnknown``, design 0227).
    """


class McpToolError(ToolError):
    """An MCP tool call that executed and failed (design 0211).

    Raised by the handler of an MCP tool when the result says ``isError`` (the message is the
    result's text) or the server refused the call with JSON-RPC error ``-32601`` or
    ``-32602`` (its code and message; any other code is an outcome in doubt, a
    ``ToolOutcomeUnknown``, designs 0211 amendment 2 and 0227); ``RegistryExecutor`` records an
    executed action whose observation is that text, which the model reads.
    """


class BatchAnswerError(StoreError, RuntimeError):
    """A store's batched statement answered more or fewer items than its batch held: a bug of
    the store, never of the caller (``polyloop.stores._group_commit``, design 0218).

    Every caller of that batch gets it; the message names the statement and both counts.
    """
