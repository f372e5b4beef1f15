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
- A call whose body is one complete JSON object followed by ``</tool_call>`` ends there, even
  when a string inside it holds ``<tool_call>`` or ``</tool_call>`` (a command that writes the
  markup into a file): the markers inside a JSON string are text. Only a body that does not
  decode is cut at the first marker, by the rule above.
- The scan is ``str.find`` over the text and at most two ``json`` decodes per call, so a long
  turn costs little beside the model's time (``bench/domain.py`` measures it;
  docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from trajcore.domain.tool_parsers.base import Block, TurnBuilder, join_content
from trajcore.domain.tool_parsers.family import FamilyParser, blocks_content, read_json_object
from trajcore.domain.tools import ToolCall

__all__ = ["HermesParser", "read_json_call"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


def _json_block_end(text: str, body_start: int) -> int:
    """The index just after the ``</tool_call>`` that follows one complete JSON object starting
    at ``body_start`` (after blanks); ``-1`` when the body is not such an object."""
    at = body_start
    while at < len(text) and text[at] in _SPACE:
        at += 1
    if not text.startswith("{", at):
        return -1
    try:
        _, at = _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):  # broken, too deep, a number too long: scanned
        return -1
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at + len(CLOSE) if text.startswith(CLOSE, at) else -1


def _arguments_key(text: str) -> str:
    return "arguments"


def read_json_call(builder: TurnBuilder, block: Block) -> None:
    """Read one ``{"name": ..., "arguments": {...}}`` block into ``builder``.

    An empty body is a truncated call when the block was cut off and an empty call when it was
    closed.
    """
    if not block.body.strip():
        reason = "empty tool call @ call" if block.closed else "truncated JSON @ call"
        builder.refuse(block.raw, reason)
        return
    read_json_object(
        builder,
        block.raw,
        block.body,
        key="arguments",
        fallback="parameters",
        fault_key=_arguments_key,
    )


@attrs.frozen
class HermesParser(FamilyParser):
    """Parser for ``<tool_call>{json}</tool_call>`` (Hermes, Qwen2.5, Qwen3).

    Attributes:
        family: The registry name it answers to: ``hermes``, or ``qwen`` (the same format under
            the name the seed environments use).
    """

    call_markers = (OPEN,)

    family: str = attrs.field(default="hermes", validator=attrs.validators.in_(("hermes", "qwen")))

    @property
    def name(self) -> str:
        return self.family

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        # Calls whose JSON decodes whole are taken first, so markup inside their strings is
        # text; from the first that does not, the marker scan reads the rest.
        segments: list[str] = []
        done = 0
        while (start := text.find(OPEN, done)) != -1:
            end = _json_block_end(text, start + len(OPEN))
            if end == -1:
                break
            segments.append(text[done:start])
            body = text[start + len(OPEN) : end - len(CLOSE)]
            read_json_call(builder, Block(body=body, raw=text[start:end], closed=True))
            done = end
        segments.append(blocks_content(builder, text[done:], OPEN, CLOSE, read_json_call))
        return join_content(segments)

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
