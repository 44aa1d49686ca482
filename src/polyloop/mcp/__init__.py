"""MCP servers as tools, with replay policies taken from their annotations (design 0211).

Needs the ``mcp`` extra (``pip install "polyloop[mcp]"``, the official ``mcp`` SDK); this is
the only package that imports it, and ``import polyloop`` does not load it.

==============================  ===========================================================
what                            rule
==============================  ===========================================================
connecting                      ``McpServer.stdio(command, args)`` or ``.http(url)``;
                                ``async with McpToolset(*servers)`` opens every connection
                                (the handshake and each ``tools/list`` page bounded by
                                ``connect_timeout_seconds``) and closes them all on the way
                                out; ``McpConnectionError`` names the server that failed and
                                its address (never a header, ``env`` value or password)
tools                           ``toolset.specs()``: one ``ToolSpec`` per listed tool,
                                ``parameters`` its ``inputSchema``, the handler a
                                ``tools/call``; a name two servers offer is an error naming
                                both, or ``<server>_<tool>`` with ``prefix=True``; a name
                                outside ``polyloop.tools.TOOL_NAME_PATTERN`` is offered as
                                ``safe_tool_name`` of it, the server's name kept in
                                ``tool.<name>.mcp.tool`` (design 0233)
replay policy                   ``_policy.classify``: trusted ``readOnlyHint`` -> ``SAFE``
                                (with ``destructiveHint`` too: ``NEVER``, cautious),
                                trusted ``idempotentHint`` -> ``IDEMPOTENT``, else and every
                                untrusted tool -> ``NEVER``; ``overrides`` win
idempotency key                 every ``tools/call`` carries ``ToolContext.idempotency_key``
                                in ``_meta["polyloop/idempotencyKey"]``
snapshot (drift guard)          per tool ``tool.<name>.``: ``schema`` (the hash of name,
                                description and ``inputSchema``), ``replay_policy``,
                                ``replay_policy_reason``, ``mcp.server``,
                                ``mcp.server_version``, ``mcp.tool``, ``mcp.annotations``
                                (canonical JSON); a resume against a changed server names
                                the changed key
results                         ``_results.observation_of``: text, images and resources by
                                type and size, ``structuredContent`` as JSON without text;
                                ``isError`` -> ``McpToolError`` -> an executed action that
                                failed (the model reads it)
a server that dies mid-call     ``ToolOutcomeUnknown`` naming the server: the call is in
                                doubt, settled by its replay policy (design 0227); never a
                                hang; so is a call unanswered in ``call_timeout_seconds``
                                and a JSON-RPC error other than ``-32601``/``-32602``. The
                                next call connects again (``_connection``); a server that is
                                not back within ``connect_timeout_seconds``, or came back
                                changed, is ``ToolEnvironmentError`` -> ``ENV_ERROR``
progress                        a server's progress notifications reach the run's event
                                sink as ``ToolProgress`` (``origin`` ``"mcp:<server>"``), in
                                order, before the call returns, when the sink has
                                ``emit_progress`` (``ports.ProgressSink``);
                                ``McpToolset(on_progress=...)`` also receives ``McpProgress``
==============================  ===========================================================
"""

from __future__ import annotations

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.errors import McpConnectionError, McpToolError
from polyloop.mcp._policy import IDEMPOTENCY_META_KEY, classify
from polyloop.mcp._toolset import McpProgress, McpServer, McpToolset, ToolClassification

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "McpConnectionError",
    "McpProgress",
    "McpServer",
    "McpToolError",
    "McpToolset",
    "ToolClassification",
    "classify",
]

# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names.
_claim_public_names(__name__, globals())
