"""DeepSeek V3 / V3.1 tool calls, between the special tokens of their chat templates.

The tokens are written here with ASCII ``|`` and ``_``; the real ones use U+FF5C (fullwidth
vertical line) and U+2581 (lower one eighth block), as the constants below do. DeepSeek V3 (and
R1) write the call's type, the name, and the arguments in a JSON code fence::

    <|tool_calls_begin|><|tool_call_begin|>function<|tool_sep|>get_weather
    ```json
    {"city": "Paris"}
    ```<|tool_call_end|><|tool_calls_end|>

DeepSeek V3.1 drops the type and the fence::

    <|tool_calls_begin|><|tool_call_begin|>get_weather<|tool_sep|>{"city": "Paris"}
    <|tool_call_end|><|tool_calls_end|>

(one line in the real output). Both are read by one parser; ``render`` writes the V3 form under
the name ``deepseek_v3`` and the V3.1 form under ``deepseek_v31``.

Rules this parser keeps, beyond those in ``base``:

- Each ``<|tool_call_begin|>`` opens one attempted call, which ends at its ``<|tool_call_end|>``,
  or, cut off, at the next call, at ``<|tool_calls_end|>`` or at the end of the text. The
  ``calls begin/end`` wrapper is removed from the content wherever it stands.
- A ``<|tool_calls_begin|>`` after which no call opens, with text inside it, is one problem:
  ``truncated call @ call`` when the text ends there (generation was cut off), ``missing
  <|tool_call_begin|> @ call`` when the block is closed. Its markers and text are in the
  problem's ``raw``, never silently in the content.
- A call is V3 when the part before ``<|tool_sep|>`` is ``function`` and the part after does
  not start with ``{``: the name is the first line after the separator and the arguments are the
  fenced JSON (a missing closing fence is tolerated when the JSON is complete). Otherwise it is
  V3.1: the name before the separator, the JSON after it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

import attrs

from trajcore.domain.tool_parsers.base import Block, TurnBuilder
from trajcore.domain.tool_parsers.family import (
    FamilyParser,
    Sections,
    read_json_arguments,
    sectioned_content,
)
from trajcore.domain.tools import ToolCall

__all__ = ["DeepSeekV3Parser"]

CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"
FENCE_OPEN = "```json"
FENCE_CLOSE = "```"
_SECTIONS = Sections(begin=CALLS_BEGIN, end=CALLS_END, call_begin=CALL_BEGIN, call_end=CALL_END)


def read_call(builder: TurnBuilder, block: Block) -> None:
    """Read one call block in either the V3 or the V3.1 form."""
    raw, body = block.raw, block.body
    sep = body.find(SEP)
    if sep < 0:
        # Without the separator the head is the V3.1 name, or (part of) V3's type word; names
        # hold no "<", so one starts a separator the model did not finish.
        head = body.split("<", 1)[0].strip()
        name = None if "function".startswith(head) else head
        if block.closed:
            builder.refuse(raw, f"missing {SEP} @ call", name=name)
        else:
            builder.refuse(raw, "truncated call @ name", name=name)
        return
    head, tail = body[:sep].strip(), body[sep + len(SEP) :]
    if head == "function" and not tail.lstrip().startswith("{"):
        line_end = tail.find("\n")
        if line_end < 0:
            builder.refuse(raw, "truncated call @ name", name=tail.strip() or None)
            return
        name = tail[:line_end].strip()
        if not name:
            builder.refuse(raw, "missing name @ name")
            return
        rest = tail[line_end + 1 :]
        fence = rest.find(FENCE_OPEN)
        if fence >= 0:
            rest = rest[fence + len(FENCE_OPEN) :]
            close = rest.rfind(FENCE_CLOSE)
            if close >= 0:
                rest = rest[:close]
        read_json_arguments(builder, raw, name, rest, closed=block.closed)
        return
    if not head:
        builder.refuse(raw, "missing name @ name")
        return
    read_json_arguments(builder, raw, head, tail, closed=block.closed)


@attrs.frozen
class DeepSeekV3Parser(FamilyParser):
    """Parser for DeepSeek V3 and V3.1 tool calls; both forms are read.

    Attributes:
        render_style: ``"v3"`` writes ``function<|tool_sep|>NAME`` and a JSON fence;
            ``"v31"`` writes ``NAME<|tool_sep|>{json}`` (tokens spelled as in the module doc).
    """

    render_style: Literal["v3", "v31"] = attrs.field(
        default="v3", validator=attrs.validators.in_(("v3", "v31"))
    )

    @property
    def name(self) -> str:
        return "deepseek_v3" if self.render_style == "v3" else "deepseek_v31"

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        return sectioned_content(builder, text, _SECTIONS, read_call)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then the calls wrapped in ``calls begin/end``; the content alone if none."""
        if not calls:
            return content
        rendered = []
        for call in calls:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            if self.render_style == "v3":
                inner = f"function{SEP}{call.name}\n{FENCE_OPEN}\n{arguments}\n{FENCE_CLOSE}"
            else:
                inner = f"{call.name}{SEP}{arguments}"
            rendered.append(f"{CALL_BEGIN}{inner}{CALL_END}")
        return f"{content}{CALLS_BEGIN}{''.join(rendered)}{CALLS_END}"
