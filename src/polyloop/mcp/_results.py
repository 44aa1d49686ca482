"""What a ``tools/call`` result becomes: the observation text the model reads (design 0211).

=======================================  ==================================================
content block                            in the observation
=======================================  ==================================================
``text``                                 its text
``image`` / ``audio``                    ``[image: image/png, 1234 bytes]`` (decoded size)
``resource`` (embedded, text)            ``[resource: <uri>, <mime>, 120 characters]``
``resource`` (embedded, blob)            ``[resource: <uri>, <mime>, 5678 bytes]``
``resource_link``                        ``[resource link: <uri>, <mime>, <name>]``
=======================================  ==================================================

Blocks are joined with a newline, in the server's order. ``structuredContent`` is added as
compact JSON only when no block is text (servers that send both put the same data in the
text, by the specification's advice); a result with neither is ``(no content)``. Nothing is
dropped silently: a block of a kind this table does not know is ``[<type> content]``. Whether
the result is an error (``isError``) is decided by the caller, not here.
"""

from __future__ import annotations

import base64
import binascii
import json

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

__all__ = ["observation_of"]


def _decoded_size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=True))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(data)} characters of data that is not base64"


def _describe(block: object) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        return f"[{block.type}: {block.mime_type}, {_decoded_size(block.data)}]"
    if isinstance(block, EmbeddedResource):
        contents = block.resource
        mime = contents.mime_type or "unknown type"
        if isinstance(contents, TextResourceContents):
            return f"[resource: {contents.uri}, {mime}, {len(contents.text)} characters]"
        if isinstance(contents, BlobResourceContents):
            return f"[resource: {contents.uri}, {mime}, {_decoded_size(contents.blob)}]"
    if isinstance(block, ResourceLink):
        return f"[resource link: {block.uri}, {block.mime_type or 'unknown type'}, {block.name}]"
    return f"[{getattr(block, 'type', type(block).__name__)} content]"


def observation_of(result: CallToolResult) -> str:
    """The observation text of ``result`` (the table in this module's docstring)."""
    parts = [_describe(block) for block in result.content]
    has_text = any(isinstance(block, TextContent) for block in result.content)
    if result.structured_content is not None and not has_text:
        parts.append(
            json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"))
        )
    return "\n".join(parts) if parts else "(no content)"
