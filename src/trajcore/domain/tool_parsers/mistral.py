"""Mistral tool calls: ``[TOOL_CALLS]`` followed by a JSON array, or by ``name[ARGS]{json}``.

Two generations of the format, both read by this parser::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

The first is written by models with tokenizers before v11 (Mistral 7B v0.3, Nemo, Small 3.1),
the second by v11 and later (Small 3.2, Devstral, Magistral). ``render`` writes the second unless
the parser is built with ``render_style="array"``.

Rules this parser keeps, beyond those in ``base``:

- Text before the first ``[TOOL_CALLS]`` is content. Each ``[TOOL_CALLS]`` starts a segment
  that runs to the next one; a segment beginning with ``[`` is an array of calls, any other a
  single ``name[ARGS]{json}`` call, or ``name[CALL_ID]id[ARGS]{json}`` (v13). When the tokenizer
  dropped ``[ARGS]`` while decoding, ``name{json}`` is read the same way.
- The id the model wrote (the array's ``"id"``, v3 and v7; ``[CALL_ID]id``, v13) is the call's
  id, by ``base``'s rules: kept when it fits the id rule and is new in the turn, generated when
  absent or repeated, a problem ``... @ id`` when malformed. Results then answer the model with
  its own id, as Mistral's encoder writes them.
- A segment whose text, before any ``[ARGS]`` or ``{``, holds a JSON array of objects (``[{``)
  is the array form with stray text around it: the array is the calls, and the text before
  and after it is content (never a call named after that text).
- In an array, elements are read one at a time, so the complete calls before a cut-off element
  are kept and the cut-off one is one problem.
- Reasoning is ``[THINK]...[/THINK]`` when the text has ``[/THINK]`` or ``[THINK]``, else
  ``<think>...</think>``.
- Text after a call's JSON, up to the next ``[TOOL_CALLS]``, is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar, Literal

import attrs

from trajcore.domain.tool_parsers.base import (
    TOOL_NAME,
    JSONFault,
    TurnBuilder,
    join_content,
    load_json,
    load_json_prefix,
    skip_space,
)
from trajcore.domain.tool_parsers.family import (
    FamilyParser,
    accept_json_value,
    refuse_broken_json,
)
from trajcore.domain.tools import ToolCall

__all__ = ["MistralParser"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
THINK = "[THINK]"
THINK_END = "[/THINK]"

_ARRAY_OF_OBJECTS = re.compile(r"\[\s*\{")


def _late_array(segment: str) -> int:
    """Where a ``[{...`` array starts after stray text, before any ``[ARGS]`` or ``{``; or -1."""
    found = _ARRAY_OF_OBJECTS.search(segment)
    if found is None:
        return -1
    start = found.start()
    if "{" in segment[:start] or ARGS in segment[:start]:
        return -1
    return start


def _fault(text: str) -> JSONFault:
    fault = load_json(text)
    return fault if isinstance(fault, JSONFault) else JSONFault(reason="invalid JSON")


def read_array(builder: TurnBuilder, segment: str, start: int) -> str:
    """Read the calls of a JSON array opening at ``segment[start]``; return trailing content."""
    pos = start + 1
    first = True
    while True:
        pos = skip_space(segment, pos)
        if pos >= len(segment):
            if first:
                builder.refuse(segment[start:], "truncated JSON @ call")
            return ""
        if segment[pos] == "]":
            return segment[pos + 1 :]
        if not first:
            if segment[pos] != ",":
                return segment[pos:]
            pos = skip_space(segment, pos + 1)
        first = False
        decoded = load_json_prefix(segment, pos)
        if decoded is None:
            raw = segment[pos:]
            refuse_broken_json(builder, raw, raw, _fault(raw), "arguments")
            return ""
        value, end = decoded
        accept_json_value(builder, segment[pos:end], value, id_key="id")
        pos = end


def read_named_call(builder: TurnBuilder, segment: str, *, last: bool) -> str:
    """Read one ``name[ARGS]{json}`` segment; return trailing content."""
    raw = TOOL_CALLS + segment
    marker = segment.find(ARGS)
    if marker >= 0:
        head, args_start = segment[:marker], marker + len(ARGS)
    else:
        brace = segment.find("{")
        head, args_start = (segment, len(segment)) if brace < 0 else (segment[:brace], brace)
    # Names hold no "[": what follows one is a [CALL_ID] or a marker the model did not finish.
    name = head.split("[", 1)[0].strip()
    id_marker = head.find(CALL_ID)
    call_id = None if id_marker < 0 else head[id_marker + len(CALL_ID) :].strip()
    if not name:
        reason = "truncated call @ name" if last and not segment.strip() else "missing name @ name"
        builder.refuse(raw, reason)
        return ""
    if not TOOL_NAME.fullmatch(name):
        builder.refuse(raw, f"invalid tool name {name[:80]!r} (1-64 of [A-Za-z0-9_.-]) @ name")
        return ""
    pos = skip_space(segment, args_start)
    if pos >= len(segment):
        reason = "truncated call @ arguments" if last else "missing arguments @ arguments"
        builder.refuse(raw, reason, name=name)
        return ""
    decoded = load_json_prefix(segment, pos)
    if decoded is None:
        builder.refuse(raw, f"{_fault(segment[pos:]).reason} @ arguments", name=name)
        return ""
    arguments, end = decoded
    builder.accept(raw, name, arguments, call_id=call_id)
    return segment[end:]


@attrs.frozen
class MistralParser(FamilyParser):
    """Parser for Mistral's ``[TOOL_CALLS]`` formats (array, and ``name[ARGS]{json}``).

    Attributes:
        render_style: ``"args"`` writes ``[TOOL_CALLS]name[ARGS]{json}`` per call (tokenizer v11
            and later); ``"array"`` writes one ``[TOOL_CALLS][...]`` array (earlier tokenizers).
    """

    name: ClassVar[str] = "mistral"
    call_markers = (TOOL_CALLS,)

    render_style: Literal["args", "array"] = attrs.field(
        default="args", validator=attrs.validators.in_(("args", "array"))
    )

    def reasoning_tags(self, text: str) -> tuple[str, str]:
        if THINK_END in text or THINK in text:
            return THINK, THINK_END
        return super().reasoning_tags(text)

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        first = text.find(TOOL_CALLS)
        segments = text[first + len(TOOL_CALLS) :].split(TOOL_CALLS)
        content = [text[:first]]
        for i, segment in enumerate(segments):
            start = skip_space(segment, 0)
            if segment.startswith("[", start) and not segment.startswith((ARGS, CALL_ID), start):
                content.append(read_array(builder, segment, start))
            elif (array := _late_array(segment)) >= 0:
                content.append(segment[:array])
                content.append(read_array(builder, segment, array))
            else:
                content.append(read_named_call(builder, segment, last=i == len(segments) - 1))
        return join_content(content)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content`` followed by the calls in ``render_style``; the content alone if none."""
        if not calls:
            return content
        if self.render_style == "array":
            array = [{"name": call.name, "arguments": call.arguments} for call in calls]
            return f"{content}{TOOL_CALLS}{json.dumps(array, ensure_ascii=False)}"
        return content + "".join(
            f"{TOOL_CALLS}{call.name}{ARGS}{json.dumps(call.arguments, ensure_ascii=False)}"
            for call in calls
        )
