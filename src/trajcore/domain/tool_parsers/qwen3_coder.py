"""Qwen3-Coder tool calls: XML-like tags with one parameter per tag and text values.

The format of the Qwen3-Coder chat template::

    <tool_call>
    <function=write_file>
    <parameter=path>
    src/app.py
    </parameter>
    <parameter=overwrite>
    true
    </parameter>
    </function>
    </tool_call>

Rules this parser keeps, beyond those in ``base``:

- A value is the text between ``<parameter=KEY>`` and the ``</parameter>`` that closes it, less
  exactly one newline at each end (the template writes one on each side). Values are free
  text (a file's content), so markup inside a value is text unless it is structural:

  * a ``</parameter>`` closes the value only when what follows it (after whitespace) is
    ``</function>``, ``</tool_call>``, the end of the text, or ``<parameter=NAME>`` for a NAME
    the tool has (any NAME without a tool list) -- vLLM's rule;
  * ``<parameter=NAME>`` and ``</parameter>`` pairs inside a value nest: a literal opener (one
    that cannot start the next parameter) must be closed before the value's own closer counts;
  * a value whose closer is missing ends at a ``<parameter=NAME>`` that can start the next
    parameter (a NAME the tool has, not given yet and not the current one; any such NAME
    without tools), or, when no closer balances it, at the first ``</function>`` followed by
    ``</tool_call>``, ``<tool_call>`` or the end;
  * ``<tool_call>`` and ``<function=`` inside an open function are text: a literal call in a
    file's content is never run, and the real call is not lost.

  When the nesting never balances, the value ends at the first ``</parameter>`` with a
  structural follower or the first such ``</function>``, whichever comes first. Outside
  values (in a function's header, between parameters) a ``<tool_call>`` does start the next
  call, so a call cut off there is one problem and the next call is read.
- Values are typed by the tool's schema with ``value_types.type_value`` (``anyOf``/``oneOf``/
  ``$ref`` understood; ``5`` becomes 5 for an integer, ``None``/``null`` become null where null
  is allowed, ``{...}`` an object where an object is allowed); without a spec for the tool, or
  for a parameter the schema does not name, a value stays text.
- A call whose function was cut off is reported as truncated, naming the part: the name, a
  parameter (``@ arguments.path``) or the function. A repeated parameter is a problem, not a
  silent overwrite. A function name that is not a tool name (``<function=x`` with no ``>``)
  is a problem that ends at the function's ``</function>``.
- Seed-OSS (``seed_oss``) writes the same calls in ``<seed:tool_call>`` blocks, with its
  reasoning in ``<seed:think>`` (``<think>`` when the text has no ``<seed:think>`` tag);
  everything here holds for it with those tags.
- Some Qwen3-Coder outputs omit the ``<tool_call>`` wrapper; bare ``<function=...>`` blocks are
  read the same way when the text has no ``<tool_call>`` at all (a stray ``</tool_call>``
  after one is part of the call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

import attrs

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers.base import (
    JSONFault,
    Marker,
    TurnBuilder,
    join_content,
)
from trajcore.domain.tool_parsers.family import FamilyParser
from trajcore.domain.tool_parsers.value_types import type_value
from trajcore.domain.tools import ToolCall, ToolSpec

__all__ = ["Qwen3CoderParser"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


_TAG_NAME = re.compile(r"[^<>\n]{0,200}")
_SPACE = re.compile(r"\s*")


def _property_schemas(spec: ToolSpec | None) -> Mapping[str, JSON] | None:
    """The property schemas of ``spec`` (``None`` without a spec: names are then not checked)."""
    if spec is None:
        return None
    properties = spec.parameters.get("properties")
    return properties if isinstance(properties, dict) else {}


def _value_text(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


@attrs.define
class _Scan:
    """One completion being read; the markers keep the whole scan one pass over the text."""

    text: str
    wrapped: bool
    open_tag: str
    close_tag: str
    param_open: Marker
    param_close: Marker
    function_end: Marker
    block_open: Marker
    block_close: Marker

    @classmethod
    def of(cls, text: str, *, wrapped: bool, open_tag: str, close_tag: str) -> _Scan:
        return cls(
            text=text,
            wrapped=wrapped,
            open_tag=open_tag,
            close_tag=close_tag,
            param_open=Marker(text, PARAMETER),
            param_close=Marker(text, PARAMETER_END),
            function_end=Marker(text, FUNCTION_END),
            block_open=Marker(text, open_tag),
            block_close=Marker(text, close_tag),
        )

    def skip_space(self, pos: int) -> int:
        found = _SPACE.match(self.text, pos)
        return found.end() if found else pos

    def tag_name(self, start: int) -> tuple[str | None, int]:
        """The NAME of ``<...=NAME>`` whose NAME starts at ``start``, and the index after ``>``.

        ``(None, len(text))`` when the text ends inside the name; ``(None, -1)`` when the name
        is broken off by ``<`` or a newline (or runs past 200 characters).
        """
        found = _TAG_NAME.match(self.text, start)
        end = found.end() if found else start
        if end >= len(self.text):
            return None, len(self.text)
        if self.text[end] != ">":
            return None, -1
        return self.text[start:end].strip(), end + 1

    def function_end_is_structural(self, at: int) -> bool:
        if not self.wrapped:
            return True
        after = self.skip_space(at + len(FUNCTION_END))
        tags = (self.close_tag, self.open_tag)
        return after >= len(self.text) or self.text.startswith(tags, after)

    def closer_is_structural(self, after: int, known: Mapping[str, JSON] | None) -> bool:
        """Whether a ``</parameter>`` ending at ``after`` is followed by structure."""
        text = self.text
        at = self.skip_space(after)
        if at >= len(text) or text.startswith(FUNCTION_END, at):
            return True
        if self.wrapped and text.startswith(self.close_tag, at):
            return True
        if text.startswith(PARAMETER, at):
            name, _ = self.tag_name(at + len(PARAMETER))
            return name is not None and (known is None or name in known)
        return False

    def value_end(
        self, start: int, key: str, given: JSONObject, known: Mapping[str, JSON] | None
    ) -> tuple[int, int] | None:
        """Where the value opening at ``start`` ends and where scanning goes on, or ``None``."""
        depth = 0
        # Where the value ends if no nesting-balanced closer is found: the first closer with a
        # structural follower, or the first structural </function> (a missing closer),
        # whichever comes first.
        fallback: tuple[int, int] | None = None
        pos = start
        end_of_text = len(self.text)
        while True:
            opener = self.param_open.next_at(pos)
            closer = self.param_close.next_at(pos)
            function_end = self.function_end.next_at(pos)
            nearest = min(opener, closer, function_end)
            if nearest >= end_of_text:
                return fallback
            if nearest == closer:
                after = closer + len(PARAMETER_END)
                structural = self.closer_is_structural(after, known)
                if structural and fallback is None:
                    fallback = (closer, after)
                if depth > 0:
                    depth -= 1
                elif structural:
                    return closer, after
                pos = after
            elif nearest == opener:
                name, _ = self.tag_name(opener + len(PARAMETER))
                if name is not None:
                    starts_next = name != key and name not in given
                    if depth == 0 and starts_next and (known is None or name in known):
                        return opener, opener
                    depth += 1
                pos = opener + len(PARAMETER)
            else:
                structural = self.function_end_is_structural(function_end)
                if depth == 0 and structural and fallback is None:
                    fallback = (function_end, function_end)
                pos = function_end + len(FUNCTION_END)

    def skip_function(self, pos: int) -> int:
        """Where a refused call ends: after the next ``</function>``, or at the next block.

        (A refused call has no value being read, so a ``<tool_call>`` here is the next call.)
        """
        found = self.function_end.next_at(pos)
        end = found + len(FUNCTION_END) if found < len(self.text) else len(self.text)
        if self.wrapped:
            end = min(end, self.block_open.next_at(pos))
        return end


def read_function(builder: TurnBuilder, scan: _Scan, start: int, call_start: int) -> int:
    """Read the ``<function=NAME>...</function>`` at ``start``; return the index after it.

    ``call_start`` is where the attempted call began (its ``<tool_call>``, when wrapped), for
    the problem's ``raw`` text.
    """
    text = scan.text

    def refuse(end: int, reason: str, name: str | None = None) -> int:
        builder.refuse(text[call_start:end], reason, name=name)
        return end

    name, after_name = scan.tag_name(start + len(FUNCTION))
    if name is None:
        if after_name >= len(text):
            partial = text[start + len(FUNCTION) :].strip()
            return refuse(len(text), "truncated call @ name", partial or None)
        return refuse(scan.skip_function(start), "expected '>' after the function name @ name")
    if not name:
        return refuse(scan.skip_function(start), "missing name @ name")
    spec = builder.spec(name)
    known = _property_schemas(spec)
    root = spec.parameters if spec is not None else None
    arguments: JSONObject = {}
    pos = after_name
    while True:
        pos = scan.skip_space(pos)
        if pos >= len(text):
            return refuse(len(text), "truncated call @ function", name)
        if text.startswith(FUNCTION_END, pos):
            end = pos + len(FUNCTION_END)
            builder.accept(text[call_start:end], name, arguments)
            return end
        if scan.wrapped and text.startswith(scan.close_tag, pos):
            builder.accept(text[call_start:pos], name, arguments)
            return pos
        if scan.wrapped and text.startswith(scan.open_tag, pos):
            return refuse(pos, "truncated call @ function", name)
        if not text.startswith(PARAMETER, pos):
            # Text between parameters that is not markup: skip to the next tag.
            following = text.find("<", pos + 1)
            pos = len(text) if following < 0 else following
            continue
        key, value_start = scan.tag_name(pos + len(PARAMETER))
        if key is None:
            if value_start >= len(text):
                return refuse(len(text), "truncated call @ arguments", name)
            return refuse(
                scan.skip_function(pos), "expected '>' after the parameter name @ arguments", name
            )
        if not key:
            return refuse(scan.skip_function(pos), "missing parameter name @ arguments", name)
        found = scan.value_end(value_start, key, arguments, known)
        if found is None:
            return refuse(len(text), f"truncated call @ arguments.{key}", name)
        value_end, pos = found
        if key in arguments:
            return refuse(scan.skip_function(pos), f"repeated parameter @ arguments.{key}", name)
        value_text = _value_text(text[value_start:value_end])
        if known is None:
            arguments[key] = value_text
            continue
        converted = type_value(value_text, known.get(key), root)
        if isinstance(converted, JSONFault):
            reason = f"{converted.reason} @ arguments.{key}"
            return refuse(scan.skip_function(pos), reason, name)
        arguments[key] = converted


def read_block(builder: TurnBuilder, scan: _Scan, start: int) -> int:
    """Read the ``<tool_call>`` block at ``start``; return the index after it."""
    text = scan.text
    body_start = start + len(scan.open_tag)
    at = scan.skip_space(body_start)
    if text.startswith(FUNCTION, at):
        end = read_function(builder, scan, at, start)
        after = scan.skip_space(end)
        close_tag = scan.close_tag
        return after + len(close_tag) if text.startswith(close_tag, after) else end
    close = scan.block_close.next_at(body_start)
    stop = min(close, scan.block_open.next_at(body_start))
    closed = stop == close and stop < len(text)
    body = text[body_start:stop].strip()
    end = stop + len(scan.close_tag) if closed else stop
    if not body:
        reason = "empty tool call @ call" if closed else "truncated call @ call"
    elif not closed and FUNCTION.startswith(body):
        reason = "truncated call @ function"
    else:
        reason = "expected <function=NAME> @ function"
    builder.refuse(text[start:end], reason)
    return end


_TAGS = {
    "qwen3_coder": (OPEN, CLOSE, "<think>", "</think>"),
    "seed_oss": ("<seed:tool_call>", "</seed:tool_call>", "<seed:think>", "</seed:think>"),
}


@attrs.frozen
class Qwen3CoderParser(FamilyParser):
    """Parser for Qwen3-Coder's ``<function=NAME><parameter=KEY>VALUE</parameter></function>``.

    Attributes:
        family: ``qwen3_coder`` (calls in ``<tool_call>``, reasoning in ``<think>``) or
            ``seed_oss`` (ByteDance Seed-OSS: the same calls in ``<seed:tool_call>``, reasoning
            in ``<seed:think>``).
    """

    family: str = attrs.field(default="qwen3_coder", validator=attrs.validators.in_(_TAGS))

    @property
    def name(self) -> str:
        return self.family

    def reasoning_tags(self, text: str) -> tuple[str, str]:
        _, _, think, think_end = _TAGS[self.family]
        if think not in text and think_end not in text:
            return super().reasoning_tags(text)
        return think, think_end

    def holds_calls(self, text: str) -> bool:
        return _TAGS[self.family][0] in text or FUNCTION in text

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        open_tag, close_tag, _, _ = _TAGS[self.family]
        rest = text
        wrapped = open_tag in rest
        scan = _Scan.of(rest, wrapped=wrapped, open_tag=open_tag, close_tag=close_tag)
        opens = scan.block_open if wrapped else Marker(rest, FUNCTION)
        segments: list[str] = []
        pos = 0
        while (start := opens.next_at(pos)) < len(rest):
            segments.append(rest[pos:start])
            if wrapped:
                pos = read_block(builder, scan, start)
            else:
                pos = read_function(builder, scan, start, start)
                after = scan.skip_space(pos)
                if rest.startswith(close_tag, after):
                    pos = after + len(close_tag)
        segments.append(rest[pos:])
        return join_content(segments)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content``, then one XML block per call; strings verbatim, other values as JSON."""
        open_tag, close_tag, _, _ = _TAGS[self.family]
        parts = [content] if content else []
        for call in calls:
            lines = [open_tag, f"{FUNCTION}{call.name}>"]
            for key, value in call.arguments.items():
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                lines.extend((f"{PARAMETER}{key}>", text, PARAMETER_END))
            lines.extend((FUNCTION_END, close_tag))
            parts.append("\n".join(lines))
        return "\n".join(parts)
