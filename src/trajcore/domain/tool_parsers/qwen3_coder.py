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
  structural follower or the first such ``</function>``, whichever comes first, and the next
  parameter is read from there. A value that nests nothing before its end (the ordinary
  case) is read by a walk over that value alone; from the first value that does, where values
  end is found over an index of the text's tags (``_Tags``, built then), in one pass however
  many values look to its end for their balance. Outside
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

import bisect
import heapq
import json
import re
from collections.abc import Callable, Mapping, Sequence

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


_OPENER, _CLOSER, _FUNCTION_END = 0, 1, 2


# Names given in a function, at most this many, key the skip pointers shared between functions.
_SHARED_GIVEN = 8


@attrs.define
class _Tags:
    """Every ``<parameter=``, ``</parameter>`` and ``</function>`` of a text, found once, with
    the shape of the nesting walk worked out in advance, so that reading every value of the
    text is linear in its length however the values end.

    A value's walk counts nesting from 0: a named opener adds one, a closer takes one away
    (never below 0). The tags it meets at depth 0 are exactly those whose running sum of +1/-1
    (their level) is at or below the level of every tag since the walk began, so each tag
    links to the next tag at or below its level (``below``), and a walk from any tag follows
    these links, never visiting the tags nested deeper. What a walk looks for along them is
    found with skip pointers (``first``): a tag found not to be wanted is passed in one step
    by every later walk that wants no more than that one did.

    Attributes:
        positions: where each tag starts, in order.
        kinds: ``_OPENER``, ``_CLOSER`` or ``_FUNCTION_END`` for each tag.
        names: an opener's NAME; for a closer the NAME of a ``<parameter=NAME>`` right after
            it; else ``None``.
        ends: a closer followed by the end, ``</function>`` or (in blocks) the block's end;
            a ``</function>`` that is structural.
        below: the index of the next tag at or below this tag's level; -1 when none is.
        skips: the skip pointers, by what they were looking for.
        steps: the tags looked at and the skip pointers followed so far (what the tests of
            linear time count).
    """

    positions: list[int]
    kinds: list[int]
    names: list[str | None]
    ends: list[bool]
    below: list[int]
    skips: dict[object, dict[int, int]] = attrs.Factory(dict)
    steps: int = 0

    def at_or_after(self, pos: int) -> int:
        """The index of the first tag at or after ``pos`` (``-1`` when none is)."""
        index = bisect.bisect_left(self.positions, pos)
        return index if index < len(self.positions) else -1

    def first(
        self,
        index: int,
        wanted: Callable[[int], bool],
        following: Callable[[int], int],
        *skips: dict[int, int],
    ) -> int:
        """The first tag from ``index`` on (along ``following``) that is ``wanted``, or -1.

        Each of ``skips`` is told the answer for every tag passed; one may be given to any
        later search that wants no tag that the searches which filled it did not want.
        """
        passed: list[int] = []
        while index >= 0:
            self.steps += 1
            jump = next((s[index] for s in skips if index in s), None)
            if jump is None:
                if wanted(index):
                    break
                jump = following(index)
            passed.append(index)
            index = jump
        for seen in passed:
            for s in skips:
                s[seen] = index
        return index

    def next_tag(self, index: int) -> int:
        return index + 1 if index + 1 < len(self.positions) else -1

    def next_level(self, index: int) -> int:
        return self.below[index]


@attrs.define
class _Function:
    """What the values of one function are read with: the tool's parameter names (``None``:
    any), and the skip pointers of its own values (what ends a value only shrinks from one
    parameter to the next, as the names given grow)."""

    known: Mapping[str, JSON] | None
    known_key: frozenset[str] | None = attrs.field(init=False)
    ends: dict[int, int] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        self.known_key = None if self.known is None else frozenset(self.known)


@attrs.define
class _Scan:
    """One completion being read; the markers and the tag index keep it one pass over the
    text."""

    text: str
    wrapped: bool
    open_tag: str
    close_tag: str
    function_end: Marker
    block_open: Marker
    block_close: Marker
    _tags: _Tags | None = attrs.field(init=False, default=None)
    # the first ``</parameter>`` at or after ``_closer_from`` (-1: none; ``_closer_from`` -1:
    # not looked for yet): the plain walks move forward, so they look for each closer once
    _closer_from: int = attrs.field(init=False, default=-1)
    _closer_at: int = attrs.field(init=False, default=-1)

    @property
    def indexed(self) -> bool:
        """Whether the tag index is built (values are then read over it)."""
        return self._tags is not None

    @property
    def tags(self) -> _Tags:
        """The text's tag index, built on first use (the first value the plain walk leaves
        undecided); from then on every value of the scan is read over it."""
        if self._tags is None:
            self._tags = self._index()
        return self._tags

    @classmethod
    def of(cls, text: str, *, wrapped: bool, open_tag: str, close_tag: str) -> _Scan:
        return cls(
            text=text,
            wrapped=wrapped,
            open_tag=open_tag,
            close_tag=close_tag,
            function_end=Marker(text, FUNCTION_END),
            block_open=Marker(text, open_tag),
            block_close=Marker(text, close_tag),
        )

    def _index(self) -> _Tags:
        text = self.text
        found: list[list[tuple[int, int]]] = [
            [(m.start(), kind) for m in re.finditer(re.escape(tag), text)]
            for tag, kind in (
                (PARAMETER, _OPENER),
                (PARAMETER_END, _CLOSER),
                (FUNCTION_END, _FUNCTION_END),
            )
        ]
        positions: list[int] = []
        kinds: list[int] = []
        names: list[str | None] = []
        ends: list[bool] = []
        levels: list[int] = []
        level = 0
        for pos, kind in heapq.merge(*found):
            name: str | None = None
            end = False
            step = 0
            if kind == _OPENER:
                name, _ = self.tag_name(pos + len(PARAMETER))
                if name is None:
                    continue  # a broken opener is text, and nests nothing
                step = 1
            elif kind == _CLOSER:
                name, end = self.closer_follower(pos + len(PARAMETER_END))
                step = -1
            else:
                end = self.function_end_is_structural(pos)
            positions.append(pos)
            kinds.append(kind)
            names.append(name)
            ends.append(end)
            levels.append(level)
            level += step
        below = [-1] * len(levels)
        lower: list[int] = []  # tags after this one, each at or below the level of the next
        for index in range(len(levels) - 1, -1, -1):
            while lower and levels[lower[-1]] > levels[index]:
                lower.pop()
            below[index] = lower[-1] if lower else -1
            lower.append(index)
        return _Tags(positions=positions, kinds=kinds, names=names, ends=ends, below=below)

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

    def closer_follower(self, after: int) -> tuple[str | None, bool]:
        """What follows a ``</parameter>`` ending at ``after``: the NAME of a
        ``<parameter=NAME>`` (with ``False``), or whether it is structure whatever the tool."""
        text = self.text
        at = self.skip_space(after)
        if at >= len(text) or text.startswith(FUNCTION_END, at):
            return None, True
        if self.wrapped and text.startswith(self.close_tag, at):
            return None, True
        if text.startswith(PARAMETER, at):
            return self.tag_name(at + len(PARAMETER))[0], False
        return None, False

    def value_end(
        self, start: int, key: str, given: JSONObject, function: _Function
    ) -> tuple[int, int] | None:
        """Where the value opening at ``start`` ends and where scanning goes on, or ``None``.

        Until a value needs it, the tag index is not built: a value that meets no
        ``<parameter=`` of its own before its end (no nesting: the ordinary case) is read by
        ``plain_value_end`` without it.
        """
        if not self.indexed:
            found = self.plain_value_end(start, key, given, function.known)
            if found is not None:
                return found
        return self.indexed_value_end(start, key, given, function)

    def plain_value_end(
        self, start: int, key: str, given: JSONObject, known: Mapping[str, JSON] | None
    ) -> tuple[int, int] | None:
        """Where the value opening at ``start`` ends when its walk never leaves depth 0, or
        ``None`` when that walk cannot decide (a named opener nests, or no closer follows).

        The walk from ``start`` looks at each ``</parameter>`` and the openers before it: a
        closer with a structural follower ends the value, an opener of a name that can start
        the next parameter ends it before the opener, a broken opener is text. Openers are
        looked for only up to the next closer, and each closer once over the scan
        (``next_closer``: values are read forward), so the walks read the text about once
        however many values they decide; a ``</function>`` before the end decides nothing
        here (it is only a fallback).
        """
        text = self.text
        pos = start
        closer = self.next_closer(pos)
        while True:
            opener = text.find(PARAMETER, pos, len(text) if closer < 0 else closer)
            if opener >= 0:
                name, _ = self.tag_name(opener + len(PARAMETER))
                if name is None:
                    pos = opener + len(PARAMETER)
                    continue
                if name != key and name not in given and (known is None or name in known):
                    return opener, opener
                return None
            if closer < 0:
                return None
            after = closer + len(PARAMETER_END)
            name, hard = self.closer_follower(after)
            if hard or (name is not None and (known is None or name in known)):
                return closer, after
            pos = after
            closer = self.next_closer(pos)

    def next_closer(self, pos: int) -> int:
        """The first ``</parameter>`` at or after ``pos`` (-1 when none is): found again only
        when ``pos`` is before where the last one was looked for from, or past what it found."""
        at = self._closer_at
        if self._closer_from < 0 or pos < self._closer_from or 0 <= at < pos:
            at = self.text.find(PARAMETER_END, pos)
            self._closer_from, self._closer_at = pos, at
        return at

    def indexed_value_end(
        self, start: int, key: str, given: JSONObject, function: _Function
    ) -> tuple[int, int] | None:
        """``value_end`` over the tag index (built here when it is not yet)."""
        tags = self.tags
        known = function.known

        def structural(index: int) -> bool:
            name = tags.names[index]
            return tags.ends[index] or (name is not None and (known is None or name in known))

        def may_end(index: int) -> bool:
            # a structural closer, or an opener of a name the tool has
            name = tags.names[index]
            if tags.kinds[index] == _CLOSER:
                return structural(index)
            return tags.kinds[index] == _OPENER and (known is None or name in known)

        def next_may_end(index: int) -> int:
            return tags.first(index, may_end, tags.next_level, by_tool)

        def ends_value(index: int) -> bool:
            # at depth 0, of the tags that may end a value: all but an opener of a name that
            # cannot start the next parameter
            name = tags.names[index]
            return tags.kinds[index] == _CLOSER or (name != key and name not in given)

        by_tool = tags.skips.setdefault(("may end", function.known_key), {})
        shared: tuple[dict[int, int], ...] = (function.ends,)
        if len(given) < _SHARED_GIVEN:
            taken = frozenset(given) | {key}
            shared += (tags.skips.setdefault(("ends", function.known_key, taken), {}),)
        first = tags.at_or_after(start)
        end = tags.first(
            next_may_end(first),
            ends_value,
            lambda index: next_may_end(tags.below[index]),
            *shared,
        )
        if end >= 0:
            pos = tags.positions[end]
            if tags.kinds[end] == _OPENER:
                return pos, pos
            return pos, pos + len(PARAMETER_END)
        # No balanced end: the first closer with a structural follower (at any depth), or the
        # first structural </function> at depth 0, whichever comes first.
        closer = tags.first(
            first,
            lambda i: tags.kinds[i] == _CLOSER and structural(i),
            tags.next_tag,
            tags.skips.setdefault(("closer", function.known_key), {}),
        )
        function_end = tags.first(
            first,
            lambda i: tags.kinds[i] == _FUNCTION_END and tags.ends[i],
            tags.next_level,
            tags.skips.setdefault("function end", {}),
        )
        if closer >= 0 and (function_end < 0 or closer < function_end):
            pos = tags.positions[closer]
            return pos, pos + len(PARAMETER_END)
        if function_end >= 0:
            pos = tags.positions[function_end]
            return pos, pos
        return None

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
    function: _Function | None = None  # made when a value of the function needs the index
    root = spec.parameters if spec is not None else None
    arguments: JSONObject = {}
    pos = after_name
    while True:
        pos = scan.skip_space(pos)
        # (the tags tested here start differently, so the order of the tests is free: the
        # parameter, the most frequent, first)
        if not text.startswith(PARAMETER, pos):
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
        # (``scan.value_end``, unfolded)
        found = None if scan.indexed else scan.plain_value_end(value_start, key, arguments, known)
        if found is None:
            if function is None:
                function = _Function(known=known)
            found = scan.indexed_value_end(value_start, key, arguments, function)
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


def read_text(builder: TurnBuilder, scan: _Scan) -> str:
    """Read every call of the scan's text into ``builder``; return the content around them."""
    text = scan.text
    opens = scan.block_open if scan.wrapped else Marker(text, FUNCTION)
    segments: list[str] = []
    pos = 0
    while (start := opens.next_at(pos)) < len(text):
        segments.append(text[pos:start])
        if scan.wrapped:
            pos = read_block(builder, scan, start)
        else:
            pos = read_function(builder, scan, start, start)
            after = scan.skip_space(pos)
            if text.startswith(scan.close_tag, after):
                pos = after + len(scan.close_tag)
    segments.append(text[pos:])
    return join_content(segments)


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
        wrapped = open_tag in text
        return read_text(
            builder, _Scan.of(text, wrapped=wrapped, open_tag=open_tag, close_tag=close_tag)
        )

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
