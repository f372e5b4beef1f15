"""Llama 3.x JSON tool calls: ``{"name": ..., "parameters": {...}}``, several joined by ``;``.

The format of the Llama 3.1/3.2/3.3 chat templates for custom (JSON) tools::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

Rules this parser keeps, beyond those in ``base``:

- The calls start after ``<|python_tag|>`` (text before it is content) or, without the tag, when
  the text (after reasoning) begins with ``{``. Any other text is content only: a JSON object in
  the middle of prose is not a call.
- From there on the model writes JSON objects separated by ``;``. Each object is one attempted
  call; its arguments are under ``parameters`` (``arguments`` is accepted as well, since models
  trained on OpenAI-style data write it). A piece that does not decode is one problem: it ends
  where its brackets balance, at a ``;`` outside its strings, or at the end of the text, and is
  truncated when it stops inside a string, object or array, invalid otherwise. A piece that does
  not start with ``{`` runs to the next ``;`` and is one problem too.
- Objects written back to back without ``;`` are read as separate calls too, and so are calls
  after a repeated ``<|python_tag|>`` (some models write one tag per call). Text after the last
  call that is neither ``;``, ``{`` nor a tag is content; a later ``<|python_tag|>`` in it
  starts calls again, so a call is never left in the content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

import attrs

from trajcore.domain.tool_parsers.base import (
    TurnBuilder,
    join_content,
    load_json_prefix,
    skip_space,
    value_extent,
)
from trajcore.domain.tool_parsers.family import FamilyParser, accept_json_value, read_json_object
from trajcore.domain.tools import ToolCall

__all__ = ["Llama3JsonParser"]

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"
ARGUMENTS = "parameters"  # the key of a call's arguments ...
ALSO_ARGUMENTS = "arguments"  # ... or this one, when the call has only it


def read_calls(builder: TurnBuilder, text: str, start: int) -> int:
    """Read the ``;``-separated calls of ``text`` from ``start``; return where content resumes."""
    pos = start
    while True:
        pos = skip_space(text, pos)
        if pos >= len(text):
            return len(text)
        if text.startswith(PYTHON_TAG, pos):
            pos += len(PYTHON_TAG)
            continue
        if text[pos] != "{":
            found = text.find(SEPARATOR, pos)
            end = len(text) if found < 0 else found
            piece = text[pos:end].rstrip()
            builder.refuse(piece, f"expected a JSON object, got {piece[:24]!r} @ call")
            pos = end + len(SEPARATOR)
            continue
        decoded = load_json_prefix(text, pos)
        if decoded is not None:
            # A value that decodes ends where ``value_extent`` would end it: read it once.
            value, end = decoded
            piece = text[pos:end]
            accept_json_value(builder, piece, value, key=ARGUMENTS, fallback=ALSO_ARGUMENTS)
        else:
            end = value_extent(text, pos)
            piece = text[pos:end]
            read_json_object(
                builder,
                piece,
                piece,
                key=ARGUMENTS,
                fallback=ALSO_ARGUMENTS,
                fault_key=_key_in_text,
            )
        pos = skip_space(text, end)
        if text.startswith(SEPARATOR, pos):
            pos += len(SEPARATOR)
        elif not text.startswith(("{", PYTHON_TAG), pos):
            return pos


def _key_in_text(piece: str) -> str:
    return "arguments" if '"arguments"' in piece and '"parameters"' not in piece else "parameters"


@attrs.frozen
class Llama3JsonParser(FamilyParser):
    """Parser for Llama 3.x JSON tool calls (``<|python_tag|>`` optional, ``;`` between calls)."""

    name: ClassVar[str] = "llama3_json"

    def holds_calls(self, text: str) -> bool:
        return PYTHON_TAG in text or text.lstrip().startswith("{")

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        tag = text.find(PYTHON_TAG)
        before, start = (text[:tag], tag + len(PYTHON_TAG)) if tag >= 0 else ("", 0)
        content = [before]
        while True:
            resume = read_calls(builder, text, start)
            tag = text.find(PYTHON_TAG, resume)
            if tag < 0:
                content.append(text[resume:])
                break
            content.append(text[resume:tag])
            start = tag + len(PYTHON_TAG)
        return join_content(content)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then ``<|python_tag|>`` and the calls joined by ``"; "``.

        With no calls this is the content alone.
        """
        if not calls:
            return content
        objects = "; ".join(
            json.dumps({"name": call.name, "parameters": call.arguments}, ensure_ascii=False)
            for call in calls
        )
        return f"{content}{PYTHON_TAG}{objects}"
