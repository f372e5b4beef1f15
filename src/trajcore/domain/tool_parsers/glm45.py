"""GLM-4.5/4.6 tool calls: the name, then key/value tag pairs, inside ``<tool_call>``.

The format of the GLM-4.5 and GLM-4.6 chat templates::

    I will check.
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

Rules this parser keeps, beyond those in ``base``:

- Each ``<tool_call>`` opens one attempted call, which ends at its ``</tool_call>``; a call the
  model did not close (it ran out of tokens, or opened the next call first) is a problem
  (``truncated call @ ...``), never run half-read.
- The name is the first line of the body, up to a newline or the first tag, stripped.
- Each ``<arg_key>KEY</arg_key>`` is followed, after whitespace, by ``<arg_value>VALUE
  </arg_value>``. A value is the text between its tags, verbatim; it is typed by the tool's
  schema exactly as Qwen3-Coder values are (``value_types.type_value``); without a spec for
  the tool, or for a key the schema does not name, it stays text. A key without its closing
  tag, a key without a value, a repeated key and other text between the pairs are problems.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

import attrs

from trajcore.domain.json_values import JSONObject
from trajcore.domain.tool_parsers.base import TOOL_NAME, Block, JSONFault, TurnBuilder, skip_space
from trajcore.domain.tool_parsers.family import FamilyParser, blocks_content
from trajcore.domain.tool_parsers.value_types import type_value
from trajcore.domain.tools import ToolCall

__all__ = ["Glm45Parser"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
KEY = "<arg_key>"
KEY_END = "</arg_key>"
VALUE = "<arg_value>"
VALUE_END = "</arg_value>"


def read_pairs(body: str, start: int, *, closed: bool) -> dict[str, str] | str:
    """The raw ``{key: text}`` pairs of a call body from ``start``, or the reason they fail."""
    pairs: dict[str, str] = {}
    pos = start
    while True:
        pos = skip_space(body, pos)
        if pos >= len(body):
            return pairs if closed else "truncated call @ arguments"
        if not body.startswith(KEY, pos):
            if not closed and KEY.startswith(body[pos:]):
                return "truncated call @ arguments"
            return f"unexpected text {body[pos : pos + 24]!r} @ arguments"
        key_start = pos + len(KEY)
        key_end = body.find(KEY_END, key_start)
        next_key = body.find(KEY, key_start)
        if key_end < 0 or (0 <= next_key < key_end) or "<arg_value>" in body[key_start:key_end]:
            return "missing </arg_key> @ arguments" if closed else "truncated call @ arguments"
        key = body[key_start:key_end].strip()
        if not key:
            return "missing parameter name @ arguments"
        pos = skip_space(body, key_end + len(KEY_END))
        if not body.startswith(VALUE, pos):
            if pos >= len(body) and not closed:
                return f"truncated call @ arguments.{key}"
            return f"missing <arg_value> @ arguments.{key}"
        value_start = pos + len(VALUE)
        value_end = body.find(VALUE_END, value_start)
        if value_end < 0:
            reason = "truncated call" if not closed else "missing </arg_value>"
            return f"{reason} @ arguments.{key}"
        if key in pairs:
            return f"repeated parameter @ arguments.{key}"
        pairs[key] = body[value_start:value_end]
        pos = value_end + len(VALUE_END)


def read_call(builder: TurnBuilder, block: Block) -> None:
    """Read one ``<tool_call>NAME<arg_key>...</tool_call>`` block."""
    raw, body = block.raw, block.body
    name_start = len(body) - len(body.lstrip())
    name_end = len(body)
    for stop in ("\n", "<"):
        found = body.find(stop, name_start)
        if 0 <= found < name_end:
            name_end = found
    name = body[name_start:name_end].strip()
    if not name:
        cut = not block.closed and name_end == len(body)
        reason = "truncated call @ name" if cut else "missing name @ name"
        builder.refuse(raw, reason)
        return
    if not TOOL_NAME.fullmatch(name):
        builder.refuse(raw, f"invalid tool name {name[:80]!r} (1-64 of [A-Za-z0-9_.-]) @ name")
        return
    pairs = read_pairs(body, name_end, closed=block.closed)
    if isinstance(pairs, str):
        builder.refuse(raw, pairs, name=name)
        return
    if not block.closed:
        builder.refuse(raw, "truncated call @ call", name=name)
        return
    spec = builder.spec(name)
    arguments: JSONObject = {}
    properties = spec.parameters.get("properties") if spec is not None else None
    for key, text in pairs.items():
        if spec is None or not isinstance(properties, dict):
            arguments[key] = text
            continue
        value = type_value(text, properties.get(key), spec.parameters)
        if isinstance(value, JSONFault):
            builder.refuse(raw, f"{value.reason} @ arguments.{key}", name=name)
            return
        arguments[key] = value
    builder.accept(raw, name, arguments)


@attrs.frozen
class Glm45Parser(FamilyParser):
    """Parser for GLM-4.5/4.6's ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V...``."""

    name: ClassVar[str] = "glm45"
    call_markers = (OPEN,)

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        return blocks_content(builder, text, OPEN, CLOSE, read_call)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then one block per call; strings verbatim, other values as JSON."""
        parts = [content] if content else []
        for call in calls:
            lines = [f"{OPEN}{call.name}"]
            for key, value in call.arguments.items():
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                lines.append(f"{KEY}{key}{KEY_END}\n{VALUE}{text}{VALUE_END}")
            lines.append(CLOSE)
            parts.append("\n".join(lines))
        return "\n".join(parts)
