"""The replay policy of an MCP tool, from its annotations and its server's trust (design 0211).

Pure logic: no SDK import, so the table can be read and tested on its own. ``annotations`` is
the tool's ``annotations`` object as the server sent it (camelCase keys, absent hints left
out); a hint counts only when it is exactly ``true``.

=======  ========  =========================================  ==============  =============
trusted  override  annotations                                policy          reason starts
=======  ========  =========================================  ==============  =============
any      given     any                                        the override    ``override``
no       none      any (never read)                           ``NEVER``       ``untrusted``
yes      none      ``readOnlyHint: true`` and                 ``NEVER``       ``trusted``
                   ``destructiveHint: true`` (contradictory)
yes      none      ``readOnlyHint: true`` (any idempotentHint) ``SAFE``        ``trusted``
yes      none      not read-only and ``idempotentHint: true``  ``IDEMPOTENT``  ``trusted``
yes      none      anything else                              ``NEVER``       ``trusted``
=======  ========  =========================================  ==============  =============

A read-only tool that also says it is destructive contradicts itself (the specification
gives ``destructiveHint`` meaning only when ``readOnlyHint`` is false, so it would be
``SAFE`` by the letter): polyloop takes the cautious reading, ``NEVER``. A server whose
annotations contradict each other is not one whose "read-only" can be trusted to repeat a
call on resume; the cost of the caution is a resume that stops instead of repeating a read.
Otherwise ``destructiveHint`` and ``openWorldHint`` never change the policy: an idempotent
destructive tool (``write_file``) may be repeated with the same arguments, which is all
``IDEMPOTENT`` promises; the idempotency key goes with every call (``_meta``, key
``IDEMPOTENCY_META_KEY``).
An untrusted server's annotations are not read at all, so it can never make a tool ``SAFE``:
the MCP specification says clients must not make tool-use decisions on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from polyloop.types import ReplayPolicy

__all__ = ["IDEMPOTENCY_META_KEY", "classify"]

IDEMPOTENCY_META_KEY: Final = "polyloop/idempotencyKey"
"""The ``_meta`` key of a ``tools/call`` request that carries the execution's idempotency key
(``ToolContext.idempotency_key``, design 0205): the same on every replay of one execution."""


def classify(
    annotations: Mapping[str, object] | None,
    *,
    trusted: bool,
    override: ReplayPolicy | None = None,
) -> tuple[ReplayPolicy, str]:
    """The policy the table in this module's docstring gives, and the reason, in words."""
    if override is not None:
        return override, f"override: {override.value} set for this tool"
    if not trusted:
        return ReplayPolicy.NEVER, "untrusted server: annotations not used"
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:
        if hints.get("destructiveHint") is True:
            return (
                ReplayPolicy.NEVER,
                "trusted server: readOnlyHint and destructiveHint both true (contradictory: "
                "cautious)",
            )
        return ReplayPolicy.SAFE, "trusted server: readOnlyHint true"
    if hints.get("idempotentHint") is True:
        return ReplayPolicy.IDEMPOTENT, "trusted server: idempotentHint true, not read-only"
    return ReplayPolicy.NEVER, "trusted server: neither readOnlyHint nor idempotentHint true"
