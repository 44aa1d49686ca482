"""Proof that the contract suite is not vacuous: plausible mistakes turn it red.

``_breaches.py`` wires the good implementations with one deliberate mistake each. This module
runs that file in a child pytest (with the ``_census.py`` plugin) and requires that every
breach fails the contract methods it targets, that every contract method this layer can
check is targeted by some breach, that the failure output is pytest's rewritten assertion
(both sides of the comparison, not a bare ``AssertionError``), and that a forgotten fixture
errors with the guidance instead of pytest's "fixture not found".
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from _breaches import EXPECTED_FAILURES, FORGOTTEN_FIXTURES
from _census import BASE_NAMES, Census, run_census
from test_suite_coverage import UNVERIFIABLE_HERE

import polyloop.testing as suite

pytestmark = pytest.mark.contract

OPTIONAL_FIXTURES = {"second_store", "idempotency_keys_seen"}
"""Fixtures with a working default (``RunLeaseContract.second_store`` defaults to ``store``;
``ActionExecutorContract.idempotency_keys_seen`` to ``None``: an executor that passes no key)."""


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Census:
    out = tmp_path_factory.mktemp("breaches") / "census.json"
    return run_census(["tests/contract/_breaches.py"], out)


def _failed_by_wiring(census: Census) -> dict[str, set[str]]:
    failed: dict[str, set[str]] = defaultdict(set)
    for row in census.rows:
        if row["outcome"] == "failed":
            failed[row["wiring"].split("::")[-1]].add(row["method"])
    return failed


def test_the_breach_file_collects(census: Census) -> None:
    assert census.collection_errors == ()
    assert census.rows, census.output


def test_every_breach_fails_the_tests_it_targets(census: Census) -> None:
    failed = _failed_by_wiring(census)
    missed = {
        wiring: sorted(expected - failed[wiring])
        for wiring, expected in EXPECTED_FAILURES.items()
        if not expected <= failed[wiring]
    }
    assert missed == {}


def test_every_checkable_contract_method_is_targeted_by_some_breach() -> None:
    methods_of = {name: getattr(suite, name) for name in BASE_NAMES}
    targeted = set().union(*EXPECTED_FAILURES.values())
    untargeted = {
        f"{base_name}.{method}"
        for base_name, base in methods_of.items()
        for method in dir(base)
        if method.startswith("test_")
        and method not in UNVERIFIABLE_HERE[base_name]
        and method not in targeted
    }
    assert untargeted == set()


def test_breaches_never_turn_the_unverifiable_skips_red(census: Census) -> None:
    for row in census.rows:
        if row["method"] in UNVERIFIABLE_HERE[row["base"]]:
            assert row["outcome"] == "skipped", row


def test_failures_show_both_sides_of_the_comparison(census: Census) -> None:
    (row,) = [
        r
        for r in census.rows
        if r["wiring"].endswith("::TestDropsIntents")
        and r["method"] == "test_written_intent_is_readable"
    ]
    assert "assert Intent(" in row["reason"]
    assert "where () = RunLog(" in row["reason"]


def test_a_forgotten_fixture_errors_with_guidance(census: Census) -> None:
    for wiring, fixture in FORGOTTEN_FIXTURES.items():
        failing = [
            r
            for r in census.rows
            if r["wiring"].endswith(f"::{wiring}") and r["outcome"] == "failed"
        ]
        assert failing, wiring
        for row in failing:
            assert "NotImplementedError" in row["reason"], row
            assert f"override the `{fixture}` fixture" in row["reason"], row
            assert wiring in row["reason"], row


def test_a_forgotten_store_fails_every_checkable_test(census: Census) -> None:
    outcomes = {
        row["method"]: row["outcome"]
        for row in census.rows
        if row["wiring"].endswith("::TestForgotTheStore")
        and row["method"] not in UNVERIFIABLE_HERE["RunStoreContract"]
    }
    assert outcomes
    assert set(outcomes.values()) == {"failed"}


def test_every_required_fixture_has_a_forgotten_case() -> None:
    # Besides test methods, the bases define nothing but their required fixtures.
    required = {
        name
        for base_name in BASE_NAMES
        for name in vars(getattr(suite, base_name))
        if not name.startswith(("test_", "_"))
    }
    assert "store" in required
    assert set(FORGOTTEN_FIXTURES.values()) == required - OPTIONAL_FIXTURES
