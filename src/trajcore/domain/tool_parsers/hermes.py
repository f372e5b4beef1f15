"""Hermes-style tool calls: a JSON object between ``<tool_call>`` and ``</tool_call>``.

The format of NousResearch Hermes 2/3 and of Qwen2.5/Qwen3 chat templates::

    Let me look.
    <tool_call>
    {"name": "read_file", "arguments": {"path": "README.md"}}
    </tool_call>

Rules this parser keeps, beyond those in ``base``:

- Each ``<tool_call>`` opens one attempted call. A call the model did not close (it ran out of
  tokens, or opened the next call first) ends at the next ``<tool_call>`` or at the end of the
  text; its JSON is accepted when complete and reported as truncated when not.
- The body must be one JSON object with a string ``name`` and an object ``arguments``. Models
  trained on Llama-style data write ``parameters`` instead; without an ``arguments`` key,
  ``parameters`` is read as the arguments (as ``llama3_json`` does). With neither key the call
  has no arguments (``{}``). Arguments given as a string are refused, not decoded, so a model
  that writes them that way learns from the error.
- The scan is ``str.find`` over the text and one ``json`` decode per call: the speed target for
  this parser is 10 MB/s of model text on a small machine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from trajcore.domain.messages import ToolCall, ToolSpec
from trajcore.domain.tool_parsers.base import (
    Block,
    JSONFault,
    TurnBuilder,
    fault_part,
    join_content,
    json_type,
    load_json,
    name_in_broken_json,
    scan_blocks,
    split_reasoning,
)
from trajcore.domain.turns import ParsedTurn

__all__ = ["HermesParser", "read_json_call"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def read_json_call(
    builder: TurnBuilder, raw: str, body: str, *, closed: bool, arguments_key: str = "arguments"
) -> None:
    """Read one ``{"name": ..., "<arguments_key>": {...}}`` call into ``builder``.

    An empty body is a truncated call when the block was cut off and an empty call when it was
    closed.
    """
    if not body.strip():
        builder.refuse(raw, "truncated JSON @ call" if not closed else "empty tool call @ call")
        return
    value = load_json(body)
    if isinstance(value, JSONFault):
        part = fault_part(body, arguments_key)
        builder.refuse(raw, f"{value.reason} @ {part}", name=name_in_broken_json(body))
        return
    if not isinstance(value, dict):
        builder.refuse(raw, f"expected a JSON object, got {json_type(value)} @ call")
        return
    if arguments_key not in value and "parameters" in value:
        arguments_key = "parameters"
    builder.accept(
        raw, value.get("name"), value.get(arguments_key, {}), arguments_key=arguments_key
    )


@attrs.frozen
class HermesParser:
    """Parser for ``<tool_call>{json}</tool_call>`` (Hermes, Qwen2.5, Qwen3).

    Attributes:
        family: The registry name it answers to: ``hermes``, or ``qwen`` (the same format under
            the name the seed environments use).
    """

    family: str = attrs.field(default="hermes", validator=attrs.validators.in_(("hermes", "qwen")))

    @property
    def name(self) -> str:
        return self.family

    def parse(
        self, text: str, *, tools: Sequence[ToolSpec] | None = None, id_prefix: str = "call"
    ) -> ParsedTurn:
        """Parse one completion; see ``ToolCallParser.parse``. Never raises."""
        reasoning, rest = split_reasoning(text)
        builder = TurnBuilder.start(tools, id_prefix)
        if OPEN not in rest:
            return builder.turn(content=rest.strip(), reasoning=reasoning)
        segments: list[str] = []
        for piece in scan_blocks(rest, OPEN, CLOSE):
            if isinstance(piece, Block):
                read_json_call(builder, piece.raw, piece.body, closed=piece.closed)
            else:
                segments.append(piece)
        return builder.turn(content=join_content(segments), reasoning=reasoning)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then one ``<tool_call>`` block per call, as Qwen's template writes them."""
        parts = [content] if content else []
        parts.extend(
            f"{OPEN}\n"
            + json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
            + f"\n{CLOSE}"
            for call in calls
        )
        return "\n".join(parts)
