"""The ``{reason}`` placeholder of ``SyntheticObservations.action_rejected`` (issue 12, item 3;
design 0112): opt-in, literal, and what the model sees in the next prompt."""

from __future__ import annotations

import dataclasses

import pytest
from _session_doubles import ScriptedModel, Tally, definition, texts_of, tool_request

from polyloop.session import resume, run
from polyloop.stores import VolatileRunStore
from polyloop.types import ActionStatus, SyntheticObservations

pytestmark = pytest.mark.unit


def _texts(action_rejected: str) -> SyntheticObservations:
    return SyntheticObservations(
        action_rejected=action_rejected, env_failed="[env]", model_call_failed="[model]"
    )


def test_rejection_fills_the_placeholder_literally_and_only_when_present() -> None:
    assert _texts("[rejected] {reason}").rejection("no such tool") == "[rejected] no such tool"
    assert _texts("{reason} / {reason}").rejection("x") == "x / x"
    assert _texts("[rejected] {other} {{reason}}").rejection("x") == "[rejected] {other} {x}"
    assert _texts("[rejected]").rejection("no such tool") == "[rejected]"
    assert _texts("[rejected] {reason}").rejection("  ") == "[rejected] (no reason given)"


async def test_the_model_is_told_which_argument_it_got_wrong() -> None:
    tally = Tally()
    store = VolatileRunStore()
    model = ScriptedModel(['tool:write {"text": 5}', "final:done"])
    agent = dataclasses.replace(
        definition(model, store=store), synthetic_observations=_texts("[rejected] {reason}")
    )
    req = tool_request(tally)

    result = await run(agent, req)

    step = result.steps[0]
    assert step.action_status is ActionStatus.NOT_EXECUTED
    assert step.observation_is_synthetic
    assert step.observation.startswith("[rejected] not executed: tool 'write'")
    assert "the parameter 'text' has the wrong type" in step.observation
    second_prompt = texts_of(model.calls[1].messages)
    assert second_prompt[-1] == ("user", f"Observation: {step.observation}")
    # The stored run is whole: resuming a finished run returns the same trajectory.
    assert (await resume(agent, req)).steps == result.steps


async def test_without_the_placeholder_every_rejection_reads_the_same() -> None:
    tally = Tally()
    model = ScriptedModel(['tool:write {"text": 5}', "tool:nosuch {}", "final:done"])
    agent = dataclasses.replace(definition(model), synthetic_observations=_texts("[rejected]"))

    result = await run(agent, tool_request(tally))

    assert [s.observation for s in result.steps[:2]] == ["[rejected]", "[rejected]"]
