"""IBM Granite 3.x tool calls: a marker, then a JSON array of ``{"name", "arguments"}`` objects.

The format of the Granite 3.0 (``<|tool_call|>``, a special token) and Granite 3.1+
(``<tool_call>``, plain text) chat templates::

    Let me check.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]

Rules this parser keeps, beyond those in ``base``:

- The calls start at the first marker (either spelling); the text before it is content. Text
  without a marker is content only, even when it holds a JSON array.
- After the marker comes one JSON array; its elements are read one at a time as in the
  ``mistral`` array form (the complete calls before a cut-off element are kept, the cut-off
  one is a problem), and the text after the array is content. Anything after the marker that
  is not an array (a bare object, prose) is one problem (``expected a JSON array of calls``):
  the format has no other shape, and a guess would hide a model that drifted from it.
- ``render`` writes the Granite 3.0 form (``<|tool_call|>`` and the array).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

import attrs

from trajcore.domain.tool_parsers.base import TurnBuilder, join_content
from trajcore.domain.tool_parsers.family import FamilyParser
from trajcore.domain.tool_parsers.mistral import read_array
from trajcore.domain.tools import ToolCall

__all__ = ["GraniteParser"]

SPECIAL_MARKER = "<|tool_call|>"
TEXT_MARKER = "<tool_call>"


@attrs.frozen
class GraniteParser(FamilyParser):
    """Parser for Granite's ``<|tool_call|>[...]`` (and ``<tool_call>[...]``) calls."""

    name: ClassVar[str] = "granite"
    call_markers = (SPECIAL_MARKER, TEXT_MARKER)

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        marker_at = min(at for at in (text.find(SPECIAL_MARKER), text.find(TEXT_MARKER)) if at >= 0)
        marker = SPECIAL_MARKER if text.startswith(SPECIAL_MARKER, marker_at) else TEXT_MARKER
        segment = text[marker_at + len(marker) :]
        start = len(segment) - len(segment.lstrip())
        if segment.startswith("[", start):
            after = read_array(builder, segment, start)
        else:
            reason = "truncated call @ call" if not segment.strip() else None
            builder.refuse(
                text[marker_at:].strip(),
                reason or "expected a JSON array of calls @ call",
            )
            after = ""
        return join_content([text[:marker_at], after])

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then ``<|tool_call|>`` and the calls' array; the content alone if none."""
        if not calls:
            return content
        array = [{"name": call.name, "arguments": call.arguments} for call in calls]
        return f"{content}{SPECIAL_MARKER}{json.dumps(array, ensure_ascii=False)}"
