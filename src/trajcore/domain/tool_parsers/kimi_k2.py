"""Kimi K2 tool calls: a section of calls, each with an id that names the function.

The format of Moonshot's Kimi K2 chat template (markers abbreviated here: the real ones are
``<|tool_calls_section_begin|>``, ``<|tool_call_begin|>``, ``<|tool_call_argument_begin|>``,
``<|tool_call_end|>`` and ``<|tool_calls_section_end|>``)::

    Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>

Rules this parser keeps, beyond those in ``base``:

- Each ``<|tool_call_begin|>`` opens one attempted call, which ends at its ``<|tool_call_end|>``
  or, cut off, at the next call, at the section's end or at the end of the text. The section
  markers are removed from the content; text before and after the section is content. A text
  with neither a section nor a call opener is content as written, stray markers included.
- The call id is ``functions.NAME:INDEX`` (the ``functions.`` prefix is optional). The name is
  read from it; an id without ``:INDEX`` is a problem (``malformed call id @ name``), and so is
  a bare counter (``0``) that names no function: the tool is never guessed from the arguments.
- The arguments are the JSON object after ``<|tool_call_argument_begin|>``; broken JSON is a
  problem with its fault, not arguments passed on as text.
- ``render`` writes ids ``functions.NAME:i`` with ``i`` the call's index in the turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar

import attrs

from trajcore.domain.tool_parsers.base import Block, TurnBuilder
from trajcore.domain.tool_parsers.family import (
    FamilyParser,
    Sections,
    read_json_arguments,
    sectioned_content,
)
from trajcore.domain.tools import ToolCall

__all__ = ["KimiK2Parser"]

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
_SECTIONS = Sections(begin=SECTION_BEGIN, end=SECTION_END, call_begin=CALL_BEGIN, call_end=CALL_END)

_CALL_ID = re.compile(r"(?:functions\.)?(.+):(\d+)")


def read_call(builder: TurnBuilder, block: Block) -> None:
    """Read one ``ID <|tool_call_argument_begin|> {json}`` call."""
    raw = block.raw
    call_id, marker, arguments_text = block.body.partition(ARGUMENT_BEGIN)
    call_id = call_id.strip()
    found = _CALL_ID.fullmatch(call_id)
    name = found.group(1).strip() if found else None
    if not marker:
        if block.closed:
            builder.refuse(raw, f"missing {ARGUMENT_BEGIN} @ call", name=name)
        else:
            builder.refuse(raw, "truncated call @ arguments", name=name)
        return
    if found is None:
        reason = (
            f"call id {call_id[:80]!r} names no function @ name"
            if call_id.isdigit()
            else f"malformed call id {call_id[:80]!r} (expected functions.NAME:INDEX) @ name"
        )
        builder.refuse(raw, reason)
        return
    read_json_arguments(builder, raw, name, arguments_text, closed=block.closed)


@attrs.frozen
class KimiK2Parser(FamilyParser):
    """Parser for Kimi K2's ``<|tool_call_begin|>functions.NAME:i ...`` sections."""

    name: ClassVar[str] = "kimi_k2"
    call_markers = (CALL_BEGIN, SECTION_BEGIN)

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        return sectioned_content(builder, text, _SECTIONS, read_call)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then one section with the calls; the content alone if none."""
        if not calls:
            return content
        inner = "".join(
            f"{CALL_BEGIN}functions.{call.name}:{i}{ARGUMENT_BEGIN}"
            f"{json.dumps(call.arguments, ensure_ascii=False)}{CALL_END}"
            for i, call in enumerate(calls)
        )
        return f"{content}{SECTION_BEGIN}{inner}{SECTION_END}"
