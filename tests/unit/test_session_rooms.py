"""The session package's seams that have no older test: where resume enters a step, and
that a run on a store without leases says so (design 0204)."""

from __future__ import annotations

import warnings

import pytest
from _session_doubles import ScriptedModel, definition, request

from _shared_doubles import PlainStore
from polyloop.errors import PolyloopError, UnleasedStoreWarning
from polyloop.session import ResumeAction, run
from polyloop.session._resume import ENTRY_PHASE
from polyloop.session._step import Phase
from polyloop.stores import VolatileRunStore
from polyloop.types import (
    StopReason,
)

pytestmark = pytest.mark.unit

_DECIDED_BEFORE_ANY_PHASE = {
    ResumeAction.FRESH,  # refused: nothing to resume
    ResumeAction.CORRUPT,  # refused: LogCorruptError
    ResumeAction.ALREADY_FINISHED,  # the stored result
    ResumeAction.STOP_UNKNOWN,  # RESUME_STATE_UNKNOWN, nothing executed
    ResumeAction.AWAITING_APPROVAL,  # AWAITING_APPROVAL again, nothing called or executed
}


def test_every_resume_plan_either_ends_before_the_step_or_names_its_entry_phase() -> None:
    """A new ``ResumeAction`` without an entry phase would fail only at run time."""
    assert set(ENTRY_PHASE) | _DECIDED_BEFORE_ANY_PHASE == set(ResumeAction)
    assert not set(ENTRY_PHASE) & _DECIDED_BEFORE_ANY_PHASE


def test_resume_enters_each_open_step_after_what_the_log_already_holds() -> None:
    """The phase a resume enters at is the first whose record is not in the log."""
    assert ENTRY_PHASE == {
        ResumeAction.CONTINUE: Phase.MODEL_INTENT,  # nothing of the step exists
        ResumeAction.REDO_MODEL_CALL: Phase.MODEL_CALL,  # model intent, no result
        ResumeAction.CONTINUE_AFTER_MODEL_CALL: Phase.REPLY,  # model result, nothing after
        ResumeAction.REPLAY_LAST_ACTION: Phase.ACTION,  # action intent, no result
        ResumeAction.RECORD_SETTLED: Phase.STEP_RECORD,  # in doubt, settled as executed
        ResumeAction.RETRY_SETTLED: Phase.ACTION_INTENT,  # settled as not executed: again
        ResumeAction.RUN_APPROVED: Phase.ACTION_INTENT,  # request and approval, no intent yet
        ResumeAction.RECORD_REJECTED: Phase.STEP_RECORD,  # rejected: recorded, never executed
    }
    assert list(Phase) == [
        Phase.MODEL_INTENT,
        Phase.MODEL_CALL,
        Phase.REPLY,
        Phase.APPROVAL,
        Phase.ACTION_INTENT,
        Phase.ACTION,
        Phase.STEP_RECORD,
    ]


class _ForwardsAllButLeases(PlainStore):
    """The wrapper a hidden concurrency test wrote: every RunStore method, no acquire_lease."""


class _UnleasedOnPurpose(_ForwardsAllButLeases):
    offers_leases = False


async def _finish(store: object, run_id: str) -> StopReason:
    result = await run(definition(ScriptedModel(["final:done"]), store=store), request(run_id))
    return result.stop_reason


async def test_a_store_that_drops_leases_is_named_once_per_store_object() -> None:
    store = _ForwardsAllButLeases()
    with pytest.warns(UnleasedStoreWarning, match=r"_ForwardsAllButLeases offers no acquire_lease"):
        assert await _finish(store, "first") is StopReason.FINAL_ANSWER
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        assert await _finish(store, "second") is StopReason.FINAL_ANSWER
    assert [w for w in later if issubclass(w.category, UnleasedStoreWarning)] == []
    with pytest.warns(UnleasedStoreWarning, match="ForwardingRunStore"):
        await _finish(_ForwardsAllButLeases(), "another-store")


@pytest.mark.parametrize("store_type", [_UnleasedOnPurpose, VolatileRunStore])
async def test_a_leasing_store_or_one_that_says_it_has_none_is_not_warned_about(
    store_type: type,
) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert await _finish(store_type(), "run-1") is StopReason.FINAL_ANSWER
    assert [w for w in seen if issubclass(w.category, UnleasedStoreWarning)] == []


def test_the_warning_is_under_the_one_root() -> None:
    assert issubclass(UnleasedStoreWarning, PolyloopError)
    assert issubclass(UnleasedStoreWarning, UserWarning)


async def test_under_warnings_as_errors_the_refusal_repeats_on_every_run() -> None:
    """``-W error`` turns the warning into a refusal; it must not be a one-time refusal
    after which the same store runs unleased in silence."""
    store = _ForwardsAllButLeases()
    for run_id in ("first", "second"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnleasedStoreWarning)
            with pytest.raises(UnleasedStoreWarning):
                await _finish(store, run_id)
