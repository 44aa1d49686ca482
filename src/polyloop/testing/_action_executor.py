"""``ActionExecutorContract``: what any action executor must do.

The known shapes are far apart. One hands a block of code to an open container session and
always reports "executed"; another looks a tool up in a registry and reports "not executed"
when the tool is unknown or its arguments are invalid. Every test here holds for both, which
is why the actions come from the implementer (``action_samples``) and never from the suite:
a code snippet handed to a tool dispatcher is correctly refused, and a suite that hard-coded
one would fail a correct implementation.

Which status leads to which stop reason, and where a rejected action's observation comes
from, are decided by the library and tested there; the skips below say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from polyloop.errors import PolyloopTypeError
from polyloop.ports import Action, ActionExecutor, ToolContext
from polyloop.testing._records import RecordFactory
from polyloop.testing._support import (
    ContractBase,
    cancel_midway,
    string_mapping_problems,
    unverifiable,
)
from polyloop.types import ActionOutcome, ActionStatus

__all__ = ["ActionExecutorContract"]


def _sample(samples: Any, name: str) -> Action:
    action = getattr(samples, name, None)
    if not isinstance(action, Action):
        raise PolyloopTypeError(
            f"action_samples.{name} must be a polyloop.ports.Action, got {action!r}; the "
            "`action_samples` fixture returns an object with the attributes "
            "`executes_cleanly` and `executes_but_errors`"
        )
    return action


class ActionExecutorContract(ContractBase):
    """Contract suite for the action seam. Override ``action_executor`` and
    ``action_samples``::

        class TestMyExecutor(ActionExecutorContract):
            @pytest.fixture
            def action_executor(self):
                return MyExecutor(...)

            @pytest.fixture
            def action_samples(self, records):
                return SimpleNamespace(
                    executes_cleanly=records.action(text="print(1)"),
                    executes_but_errors=records.action(text="1 / 0"),
                )
    """

    @pytest.fixture
    def action_executor(self) -> ActionExecutor:
        """The executor under test. Override it and return your instance."""
        raise NotImplementedError(
            f"{type(self).__name__} inherits ActionExecutorContract but does not override "
            "the `action_executor` fixture. Define `@pytest.fixture def action_executor(self, "
            "...)` in your subclass and return an instance of your ActionExecutor "
            "implementation."
        )

    @pytest.fixture
    def action_samples(self) -> Any:
        """Two actions in your executor's own action language. Override it.

        Return any object with two attributes, both ``polyloop.ports.Action``:

        * ``executes_cleanly``: runs to completion and the action itself succeeds;
        * ``executes_but_errors``: runs to completion but the action itself fails (the code
          raises, the command exits non-zero, the tool reports an error).

        Both must end with ``ActionStatus.EXECUTED``: an action's own error is an ordinary
        observation, and that is what the suite asserts. A sample that comes back
        ``NOT_EXECUTED`` turns a test red for a reason that has nothing to do with
        correctness.

        Neither may have real external effects (deleting files, sending requests, spending
        money): the suite executes them for real, several times, and cancels one midway, at
        which point how much of it happened is unknown. Observations may differ between
        executions; statuses may not.

        An executor with no notion of a failing action (one that refuses every bad action
        up front) still supplies ``executes_but_errors``: an action whose observation carries
        an error message while its status stays ``EXECUTED``. If even that cannot exist,
        exempt the test that uses it in your subclass and write down why.
        """
        raise NotImplementedError(
            f"{type(self).__name__} inherits ActionExecutorContract but does not override "
            "the `action_samples` fixture. Return an object with two attributes, both "
            "polyloop.ports.Action in your executor's action language: `executes_cleanly` "
            "(runs and succeeds) and `executes_but_errors` (runs, and the action itself "
            "fails); both must come back with ActionStatus.EXECUTED and neither may have "
            "real external side effects. See the fixture's docstring."
        )

    @pytest.fixture
    def idempotency_keys_seen(self) -> Callable[[], Sequence[str]] | None:
        """For an executor that hands ``Action.idempotency_key`` to its tool's system (design
        0205): a callable returning every key that system received so far, in order, one per
        execution of an action (duplicates included). Override it to certify that your
        executor passes the key; leave it (``None``) for an executor that passes none."""
        return None

    async def test_an_executor_passes_the_same_key_on_every_replay(
        self,
        action_executor: ActionExecutor,
        action_samples: Any,
        idempotency_keys_seen: Callable[[], Sequence[str]] | None,
    ) -> None:
        """The key the library puts on the action reaches the tool's system unchanged: the same
        key for a replay of one execution, another key for another execution.

        With ``ReplayPolicy.IDEMPOTENT`` the library replays an execution in doubt and relies
        on the tool's system to deduplicate by this key; an executor that dropped it, or
        derived its own per call, would turn every replay into a second effect.
        """
        if idempotency_keys_seen is None:
            pytest.skip(
                unverifiable(
                    promise="an executor that claims idempotency keys passes "
                    "Action.idempotency_key to its tool's system unchanged, the same on every "
                    "replay of one execution.",
                    why_not_here="this executor's contract subclass does not say what its "
                    "tool's system received (the suite cannot see past execute()).",
                    check_it_yourself="override the `idempotency_keys_seen` fixture to return "
                    "a callable listing the keys your system received; an executor that passes "
                    "no key leaves it, and its tools must not be declared IDEMPOTENT.",
                )
            )
        sample = _sample(action_samples, "executes_cleanly")
        first = ToolContext(idempotency_key="polyloop:r:contract:a0", run_id="contract", step_idx=0)
        other = ToolContext(idempotency_key="polyloop:r:contract:a1", run_id="contract", step_idx=1)
        before = len(idempotency_keys_seen())
        for context in (first, first, other):
            outcome = await action_executor.execute(dataclasses.replace(sample, context=context))
            assert outcome.status is ActionStatus.EXECUTED
        seen = list(idempotency_keys_seen())[before:]
        assert seen == [first.idempotency_key, first.idempotency_key, other.idempotency_key], (
            "the keys the tool's system received are not the keys on the actions (the same "
            f"key twice for a replay, then another): got {seen}"
        )

    # ------------------------------------------------------------ the returned outcome

    async def test_returns_all_five_fields(
        self, action_executor: ActionExecutor, action_samples: Any
    ) -> None:
        """The outcome is an ``ActionOutcome`` with all five fields filled with real values.

        They fill five columns of the step record. A value left at some default is
        indistinguishable from a real one in the trajectory afterwards.
        """
        outcome = await action_executor.execute(_sample(action_samples, "executes_cleanly"))
        assert isinstance(outcome, ActionOutcome)
        assert isinstance(outcome.status, ActionStatus)
        assert isinstance(outcome.observation, str)
        assert isinstance(outcome.observation_is_synthetic, bool)
        assert isinstance(outcome.env_reported_completion, bool)
        assert isinstance(outcome.observation_truncated_chars, int)
        assert not isinstance(outcome.observation_truncated_chars, bool)

    async def test_completion_signal_is_a_plain_boolean(
        self, action_executor: ActionExecutor, action_samples: Any
    ) -> None:
        """``env_reported_completion`` is ``True`` or ``False``; there is no "unknown".

        An environment without a completion signal always reports ``False``, which is not a
        fault. Treating a missing signal as an environment error would end every run of such
        an environment at its first step.
        """
        outcome = await action_executor.execute(_sample(action_samples, "executes_cleanly"))
        assert outcome.env_reported_completion in (True, False)

    async def test_a_clean_action_is_executed(
        self, action_executor: ActionExecutor, action_samples: Any
    ) -> None:
        """An action that runs and succeeds comes back ``EXECUTED``.

        ``NOT_EXECUTED`` would make the library replace its observation with the synthetic
        rejection text, and ``ENV_ERROR`` would stop the run.
        """
        outcome = await action_executor.execute(_sample(action_samples, "executes_cleanly"))
        assert outcome.status is ActionStatus.EXECUTED

    async def test_action_error_is_a_normal_observation_not_an_env_error(
        self, action_executor: ActionExecutor, action_samples: Any, records: RecordFactory
    ) -> None:
        """An action that fails on its own is ``EXECUTED`` with the error as its observation.

        The model reads the error and corrects itself. Reporting it as an environment error
        would stop a run exactly where the model could have recovered, and nothing in the
        trajectory would show that it could have. Only a broken environment (unreachable,
        speaking the wrong protocol) is ``ENV_ERROR``.
        """
        outcome = await action_executor.execute(_sample(action_samples, "executes_but_errors"))
        assert outcome.status == records.action_status.EXECUTED
        assert outcome.observation != ""

    async def test_cancellation_propagates_and_is_not_swallowed(
        self, action_executor: ActionExecutor, action_samples: Any
    ) -> None:
        """Cancelling an execution midway raises ``asyncio.CancelledError`` out of it.

        A swallowed cancellation does not look like a failed cancel: it looks like nothing,
        while container leases, connections and temporary directories leak. If the
        execution finishes within one event-loop tick, there is nothing to cancel and the
        test skips; that is not a breach.
        """
        await cancel_midway(action_executor.execute(_sample(action_samples, "executes_cleanly")))

    # ------------------------------------------------------------ parameters()

    async def test_parameters_map_strings_to_strings(self, action_executor: ActionExecutor) -> None:
        """``parameters()`` is a mapping of ``str`` to ``str``; it enters the run's parameter
        snapshot, which is string-to-string, and the library refuses anything else."""
        assert string_mapping_problems(action_executor.parameters()) == []

    async def test_parameters_are_stable_across_calls(
        self, action_executor: ActionExecutor, action_samples: Any
    ) -> None:
        """``parameters()`` reports configuration, not state: executing an action does not
        change it. A leased port or a session id in it would make every ``resume`` refuse
        the run as drifted."""
        before = dict(action_executor.parameters())
        await action_executor.execute(_sample(action_samples, "executes_cleanly"))
        assert dict(action_executor.parameters()) == before

    # ------------------------------------------------------------ checked by the library

    async def test_status_trigger_conditions_are_asserted_against_the_library_not_here(
        self,
    ) -> None:
        """When each status applies (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="EXECUTED when the action ran (even if it failed), NOT_EXECUTED when "
                "it never entered execution, ENV_ERROR when the environment itself broke.",
                why_not_here="no generic input can force an arbitrary executor into the "
                "last two states; probing with an 'almost certainly unknown tool' would fail "
                "executors that have no tools and always execute.",
                check_it_yourself="build actions in your own action language that reach "
                "NOT_EXECUTED and ENV_ERROR and assert the statuses in your unit tests. The "
                "library's own tests guard what follows: ENV_ERROR always stops the run with "
                "StopReason.ENV_ERROR, and NOT_EXECUTED never stops it.",
            )
        )

    async def test_failure_is_expressed_as_a_return_value_asserted_in_the_library_not_here(
        self,
    ) -> None:
        """Environment failure is returned, not raised (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="when the environment breaks, execute() returns an outcome with "
                "ActionStatus.ENV_ERROR instead of raising; an exception raised anyway is "
                "not caught by the library and leaves run()/resume() unchanged.",
                why_not_here="the suite cannot break your environment portably (cutting the "
                "network is neither portable nor meaningful for executors without one).",
                check_it_yourself="build an action that really meets a broken environment "
                "(a closed session, a dead worker) and assert ENV_ERROR in your unit tests. "
                "The library's tests guard the other half: after a raise, the log stops at "
                "'action intent, no step' and resume reports RESUME_STATE_UNKNOWN. "
                "asyncio.CancelledError is the one exception that must pass through; the "
                "cancellation test covers it.",
            )
        )

    async def test_the_observation_substitution_is_asserted_in_the_library_not_here(
        self,
    ) -> None:
        """Who supplies a rejected action's observation (unconditional skip)."""
        pytest.skip(
            unverifiable(
                promise="for a NOT_EXECUTED action the library puts its configured "
                "synthetic observation into history, while the executor's own observation is "
                "still stored unchanged in the StepCompleted record, where it is the log's "
                "only explanation of the rejection.",
                why_not_here="the substitution happens in the library and shows only after "
                "a whole run.",
                check_it_yourself="nothing to check on your side; filling `observation` "
                "with a useful rejection message is all that is asked. The library's tests "
                "guard the substitution.",
            )
        )
