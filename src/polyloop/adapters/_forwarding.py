"""Which model-binding entries become request-body fields (design record 0032)."""

from __future__ import annotations

from collections.abc import Mapping

from polyloop.adapters._settings import SAMPLING_FIELDS
from polyloop.errors import PolyloopValueError

__all__ = ["BINDING_PREFIX", "REQUEST_SHAPE_FIELDS", "forwarded_binding"]

BINDING_PREFIX = "gateway."
"""A binding key with this prefix is sent as the top-level body field named by the rest."""

REQUEST_SHAPE_FIELDS: frozenset[str] = frozenset(
    {
        "function_call",
        "functions",
        "messages",
        "model",
        "n",
        "parallel_tool_calls",
        "response_format",
        "stream",
        "stream_options",
        "tool_choice",
        "tools",
    }
)
"""Body fields the adapter owns: they decide what is sent or what shape the reply takes.

``messages`` come from the run's context and history, ``model`` from ``GatewaySettings``;
``stream``, ``n``, ``tools``, ``response_format`` and their legacy or companion spellings
would make the server answer in a form this adapter does not translate; ``tools``,
``tool_choice`` and ``parallel_tool_calls`` come from the run's registry and
``GatewaySettings`` (design 0100).
"""


def _refusal_fix(field: str) -> str:
    if field == "model":
        return "the model is GatewaySettings.model, part of the model identity; remove the key"
    if field == "messages":
        return "the messages come from the run's context and history; remove the key"
    if field in SAMPLING_FIELDS:
        return (
            "it is a sampling field and belongs to the model identity; set it in "
            "GatewaySettings.sampling so parameters() records it, and remove the key"
        )
    return (
        "it changes the shape of the request or the reply, which the adapter translates "
        "itself; remove the key"
    )


def forwarded_binding(binding: Mapping[str, str]) -> dict[str, str]:
    """The request-body fields a model binding asks for, with the prefix stripped.

    ``{"book": "b7", "gateway.user": "tenant-7"}`` gives ``{"user": "tenant-7"}``: a key with
    the ``gateway.`` prefix is sent as the top-level field named by everything after the
    prefix (dots included, nothing is parsed further), with its value verbatim. A key without
    the prefix is the project's own coordinate: it is already in the parameter snapshot, so it
    is neither sent nor refused.

    ``ValueError`` naming the key and the fix, before anything is sent, for: nothing after the
    prefix; a field in ``REQUEST_SHAPE_FIELDS`` or ``SAMPLING_FIELDS``; an empty or
    whitespace-only value (most servers treat it like "not set", so an isolation key such as
    ``prompt_cache_key`` would silently stop isolating). Keys are visited in sorted order, so
    a binding with several bad keys always reports the same one.
    """
    forwarded: dict[str, str] = {}
    for key in sorted(binding):
        if not key.startswith(BINDING_PREFIX):
            continue
        field = key[len(BINDING_PREFIX) :]
        value = binding[key]
        if not field:
            raise PolyloopValueError(
                f"model binding key {key!r} has nothing after the {BINDING_PREFIX!r} prefix; "
                "write the request-body field name after it (for example 'gateway.user') or "
                "remove the key"
            )
        if field in REQUEST_SHAPE_FIELDS or field in SAMPLING_FIELDS:
            raise PolyloopValueError(
                f"model binding key {key!r} may not set the request-body field {field!r}: "
                f"{_refusal_fix(field)}"
            )
        if not value.strip():
            raise PolyloopValueError(
                f"model binding key {key!r} has the blank value {value!r}; servers treat an "
                "empty value like a missing one, so give it a real value or remove the key"
            )
        forwarded[field] = value
    return forwarded
