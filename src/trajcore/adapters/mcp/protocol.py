"""What trajcore's MCP client and server agree on, and how MCP values become trajcore values.

Pure functions over the SDK's types; no I/O. The rules they keep:

- A tool becomes a ``ToolSpec`` with its input schema kept whole (every keyword, ``$schema``
  included) and checked by ``JSONSchemaValidator``: the schema against its draft's metaschema
  when listed, every keyword of the arguments before a call is sent. A tool whose name or schema
  trajcore cannot take (an invalid schema, a reference outside it) is a ``WireError`` naming the
  tool and the field, never dropped.
- The caller's ``ToolContext`` travels in the request's ``_meta`` under ``CONTEXT_META_KEY``
  (``{"trajectory_id": ..., "slot": ...}``); servers that do not know the key ignore it.
- A result becomes a ``ToolResult``: its text blocks joined by newlines (one block is kept
  verbatim); without text, its structured content as JSON text; images, audio, blobs and resource
  links are named in brackets, never dropped silently. ``isError`` makes it a ``TOOL_ERROR``
  whose error is that text. Our own server (``trajcore.adapters.mcp.server``) also puts the
  trajcore outcome and error in the result's ``_meta`` under ``OUTCOME_META_KEY``, so ``REJECTED``
  and ``TIMEOUT`` survive the trip; other servers' results never carry it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

import mcp_types as types

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.errors import ConfigError, WireError
from trajcore.domain.json_values import JSON, JSONObject, check_json
from trajcore.domain.tools import ToolCall, ToolContext, ToolOutcome, ToolResult, ToolSpec

__all__ = [
    "CONTEXT_META_KEY",
    "OUTCOME_META_KEY",
    "context_from_meta",
    "context_meta",
    "outcome_meta",
    "tool_result",
    "tool_spec",
]

CONTEXT_META_KEY: Final = "trajcore/context"
"""Request ``_meta`` key of the caller's context: ``{"trajectory_id": str, "slot": str | null}``."""

OUTCOME_META_KEY: Final = "trajcore/outcome"
"""Result ``_meta`` key of trajcore's outcome: ``{"outcome": "rejected", "error": "..."}``."""

_VALIDATOR: Final = JSONSchemaValidator()

ANONYMOUS_TRAJECTORY: Final = "mcp-client"
"""The trajectory id our server gives a call that carries no trajcore context."""


def tool_spec(
    tool: types.Tool, index: int, validator: JSONSchemaValidator = _VALIDATOR
) -> ToolSpec:
    """``tool`` (the ``index``-th of a listing) as a ``ToolSpec``, its schema kept whole and
    checked by ``validator`` (the server's: its ``annotations`` pass).

    Raises:
        WireError: at ``$.tools[index].<field>`` for a name or schema trajcore cannot take.
    """
    schema: object = tool.input_schema
    where = f"$.tools[{index}]"
    problem = check_json(schema)
    if problem:
        raise WireError(f"{where}.inputSchema", f"tool {tool.name!r}: {problem}")
    assert isinstance(schema, dict)  # pydantic gave a dict; check_json proved it JSON
    try:
        return ToolSpec(
            name=tool.name,
            description=tool.description or "",
            parameters=schema,
            validator=validator,
        )
    except ConfigError as exc:
        field = (
            "name" if exc.field == "name" else f"inputSchema{exc.field.removeprefix('parameters')}"
        )
        named = f"tool {tool.name!r}: "
        reason = exc.reason if exc.reason.startswith(named) else named + exc.reason
        if "is not a keyword of this JSON Schema draft" in reason:
            reason += "; a key of the server's own, not to be enforced, goes in its annotations"
        raise WireError(f"{where}.{field}", reason) from None


def context_meta(context: ToolContext) -> JSONObject:
    """The request ``_meta`` entry carrying ``context``."""
    return {CONTEXT_META_KEY: {"trajectory_id": context.trajectory_id, "slot": context.slot}}


def context_from_meta(meta: Mapping[str, object] | None) -> ToolContext:
    """The caller's context from a request's ``_meta``; ``ANONYMOUS_TRAJECTORY`` when absent.

    Raises:
        WireError: at ``$._meta["trajcore/context"]`` when the entry is there but malformed.
    """
    entry = None if meta is None else meta.get(CONTEXT_META_KEY)
    if entry is None:
        return ToolContext(trajectory_id=ANONYMOUS_TRAJECTORY)
    where = f'$._meta["{CONTEXT_META_KEY}"]'
    if not isinstance(entry, Mapping):
        raise WireError(where, "expected an object with trajectory_id and slot")
    trajectory, slot = entry.get("trajectory_id"), entry.get("slot")
    if not isinstance(trajectory, str) or not trajectory:
        raise WireError(f"{where}.trajectory_id", "expected a non-empty string")
    if slot is not None and not isinstance(slot, str):
        raise WireError(f"{where}.slot", "expected a string or null")
    return ToolContext(trajectory_id=trajectory, slot=slot)


def outcome_meta(result: ToolResult) -> JSONObject:
    """The result ``_meta`` entry carrying ``result``'s trajcore outcome and error."""
    return {OUTCOME_META_KEY: {"outcome": result.outcome.value, "error": result.error}}


def tool_result(call: ToolCall, answer: types.CallToolResult) -> ToolResult:
    """``answer`` to ``call`` as a ``ToolResult`` (see the module's rules)."""
    text = _content_text(answer.content, answer.structured_content)
    declared = _declared_outcome(answer.meta)
    if declared is not None:
        outcome, error = declared
        if outcome is ToolOutcome.OK and not answer.is_error:
            return ToolResult.success(call, text)
        if outcome is not ToolOutcome.OK:
            return ToolResult.failure(call, outcome, error or _one_line(text))
    if answer.is_error:
        return ToolResult.failure(
            call, ToolOutcome.TOOL_ERROR, _one_line(text) or f"{call.name} failed (isError)"
        )
    return ToolResult.success(call, text)


def _declared_outcome(meta: Mapping[str, object] | None) -> tuple[ToolOutcome, str | None] | None:
    entry = None if meta is None else meta.get(OUTCOME_META_KEY)
    if not isinstance(entry, Mapping):
        return None
    try:
        outcome = ToolOutcome(entry.get("outcome"))
    except ValueError:
        return None
    error = entry.get("error")
    return outcome, error if isinstance(error, str) else None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _content_text(blocks: Sequence[types.ContentBlock], structured: object) -> str:
    parts: list[str] = []
    has_text = False
    for block in blocks:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, types.ImageContent | types.AudioContent):
            kind = "image" if isinstance(block, types.ImageContent) else "audio"
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data)} base64 characters]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
                has_text = True
            else:
                mime = resource.mime_type or "application/octet-stream"
                parts.append(f"[resource {resource.uri}: {mime}, not text]")
        else:
            parts.append(f"[resource link: {block.name} <{block.uri}>]")
    if not has_text and structured is not None:
        value: JSON = _structured(structured)
        parts.insert(0, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return "\n".join(parts)


def _structured(value: object) -> JSON:
    problem = check_json(value)
    if problem:
        return f"[structured content that is not JSON: {problem}]"
    return value  # type: ignore[return-value]  # check_json proved it a JSON value
