"""Proof that every contract test method really runs somewhere in this repository.

A contract method that no wiring ever executes can reference a factory method that does not
exist, or assert something no implementation satisfies, and nobody finds out until the first
downstream adopts the suite and takes the blame. So this module runs the whole contract
wiring (``tests/contract`` and ``tests/integration``, contract subclasses only) in a child
pytest with a recording plugin (``_census.py``) and requires:

* the run is green;
* every method of every base that this layer can check **passed** in at least one wiring,
  with the base's own body (a wiring that overrides a method does not count);
* the methods that this layer cannot check, listed explicitly below, are skipped in every
  wiring with a reason that starts with the "cannot be verified at this layer." marker, and
  no other method uses that marker, except the methods that check an optional capability
  (``CAPABILITY_TESTS``): they skip with that marker exactly where the seam lacks it, and both
  of their branches run here;
* the only other skip is the cancellation tests' "finished before it could be cancelled".
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from _census import BASE_NAMES, Census, run_census

import polyloop.testing as suite
from polyloop.testing._support import FINISHED_BEFORE_CANCEL, UNVERIFIABLE_PREFIX

pytestmark = pytest.mark.contract

UNVERIFIABLE_HERE = {
    "RunStoreContract": {
        "test_atomicity_under_crash_is_not_checkable_here",
        "test_prefix_durability_is_not_checkable_here",
    },
    "ActionExecutorContract": {
        "test_status_trigger_conditions_are_asserted_against_the_library_not_here",
        "test_failure_is_expressed_as_a_return_value_asserted_in_the_library_not_here",
        "test_the_observation_substitution_is_asserted_in_the_library_not_here",
    },
    "EventSinkContract": {
        "test_a_raising_sink_is_compliant_so_this_layer_asserts_nothing",
        "test_the_no_re_emission_guarantee_is_asserted_in_the_library_not_here",
        "test_the_audit_trail_is_asserted_against_the_log_not_here",
    },
    "RunLeaseContract": {"test_a_dead_holder_frees_the_run_is_not_checkable_here"},
    "DecisionParserContract": set(),
    "ModelClientContract": set(),
    "NativeToolCallParserContract": set(),
    "NativeToolCallModelClientContract": set(),
}
"""The unconditional skips, by base. Changing this set is a change of the public suite."""

CAPABILITY_TESTS = {
    ("RunStoreContract", "test_settlements_round_trip_in_write_order"),
    ("RunStoreContract", "test_approval_requests_and_decisions_round_trip_in_write_order"),
    ("RunLeaseContract", "test_settlements_through_a_lease_are_fenced"),
    ("RunLeaseContract", "test_approval_requests_through_a_lease_are_fenced"),
    ("RunLeaseContract", "test_a_lease_checks_whether_it_is_still_current"),
    ("ActionExecutorContract", "test_an_executor_passes_the_same_key_on_every_replay"),
    ("EventSinkContract", "test_emit_progress_accepts_progress_reports"),
}
"""Methods that check an optional capability (``write_settlement`` and
``write_approval_request``, the ``SettlingRunStore`` of designs 0206 and 0210; a lease's
``check_current``, the ``CheckedLease`` of design 0245; an executor's
idempotency keys; a sink's ``emit_progress``, the ``ProgressSink`` of design 0211's
amendment): skipped with the "cannot be verified at this layer." reason where the
store, lease or executor lacks it, passed where it has it; both branches must be seen."""

INFRASTRUCTURE_SKIP = "is not available here; install it with"
"""Part of the reason of a skip for missing infrastructure (``tests/_infra.py``), which a
machine without PostgreSQL gives the Postgres wiring; under ``CI=true`` it is a failure."""

CANCELLATION_TESTS = {
    ("ActionExecutorContract", "test_cancellation_propagates_and_is_not_swallowed"),
    ("ModelClientContract", "test_cancellation_propagates_and_is_not_swallowed"),
}
"""Cancellation tests that must be seen both passing and skipped (both branches exercised)."""

CANCELLATION_SKIP_ALLOWED = CANCELLATION_TESTS | {
    ("NativeToolCallModelClientContract", "test_cancellation_propagates_and_is_not_swallowed"),
}
"""Where the "finished before it could be cancelled" skip may appear."""


def _contract_methods(base_name: str) -> set[str]:
    base = getattr(suite, base_name)
    return {name for name in dir(base) if name.startswith("test_")}


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Census:
    out = tmp_path_factory.mktemp("census") / "census.json"
    return run_census(["tests/contract", "tests/integration"], out, "-m", "contract or integration")


def test_the_contract_wiring_runs_green(census: Census) -> None:
    failed = [row["nodeid"] for row in census.rows if row["outcome"] == "failed"]
    assert census.collection_errors == ()
    assert failed == [], census.output
    assert census.returncode == 0, census.output


def test_the_explicit_list_names_real_methods() -> None:
    for base_name in BASE_NAMES:
        missing = UNVERIFIABLE_HERE[base_name] - _contract_methods(base_name)
        assert missing == set(), f"{base_name} has no method(s) {sorted(missing)}"


def test_every_checkable_contract_method_passes_in_some_wiring(census: Census) -> None:
    passed_in: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in census.rows:
        if row["outcome"] == "passed" and row["defined_by_base"]:
            passed_in[(row["base"], row["method"])].append(row["wiring"])
    never_passed = [
        f"{base_name}.{method}"
        for base_name in BASE_NAMES
        for method in sorted(_contract_methods(base_name) - UNVERIFIABLE_HERE[base_name])
        if not passed_in[(base_name, method)]
    ]
    assert never_passed == []


def test_the_unverifiable_promises_skip_everywhere_with_their_reason(census: Census) -> None:
    for base_name in BASE_NAMES:
        for method in UNVERIFIABLE_HERE[base_name]:
            rows = [r for r in census.rows if (r["base"], r["method"]) == (base_name, method)]
            assert rows, f"{base_name}.{method} never ran"
            for row in rows:
                assert row["outcome"] == "skipped", row
                assert row["reason"].startswith(UNVERIFIABLE_PREFIX), row
                assert "Promise: " in row["reason"], row
                assert "Why not here: " in row["reason"], row
                assert "Check it yourself: " in row["reason"], row


def test_no_other_method_claims_it_cannot_be_verified(census: Census) -> None:
    claimed = {
        (row["base"], row["method"])
        for row in census.rows
        if row["outcome"] == "skipped" and row["reason"].startswith(UNVERIFIABLE_PREFIX)
    }
    listed = {(base, method) for base, methods in UNVERIFIABLE_HERE.items() for method in methods}
    assert claimed - CAPABILITY_TESTS == listed


def test_both_branches_of_the_capability_tests_are_exercised(census: Census) -> None:
    for base_name, method in CAPABILITY_TESTS:
        rows = [r for r in census.rows if (r["base"], r["method"]) == (base_name, method)]
        assert {row["outcome"] for row in rows} == {"passed", "skipped"}, (base_name, method)
        for row in rows:
            if row["outcome"] == "skipped" and INFRASTRUCTURE_SKIP not in row["reason"]:
                assert row["reason"].startswith(UNVERIFIABLE_PREFIX), row
                assert "Promise: " in row["reason"], row
                assert "Why not here: " in row["reason"], row
                assert "Check it yourself: " in row["reason"], row


def test_the_only_other_skip_is_the_cancellation_skip(census: Census) -> None:
    other_skips = {
        (row["base"], row["method"], row["reason"])
        for row in census.rows
        if row["outcome"] == "skipped"
        and not row["reason"].startswith(UNVERIFIABLE_PREFIX)
        and INFRASTRUCTURE_SKIP not in row["reason"]
    }
    assert {(base, method) for base, method, _ in other_skips} <= CANCELLATION_SKIP_ALLOWED
    assert {reason for _, _, reason in other_skips} <= {FINISHED_BEFORE_CANCEL}


def test_both_branches_of_the_cancellation_tests_are_exercised(census: Census) -> None:
    for base_name, method in CANCELLATION_TESTS:
        outcomes = {
            row["outcome"]
            for row in census.rows
            if (row["base"], row["method"]) == (base_name, method)
        }
        assert outcomes == {"passed", "skipped"}, (base_name, method, outcomes)


def test_the_census_recorded_an_outcome_for_every_item(census: Census) -> None:
    assert [row["nodeid"] for row in census.rows if row["outcome"] is None] == []
