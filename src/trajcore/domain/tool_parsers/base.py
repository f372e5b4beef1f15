"""What every tool-call parser shares: the protocol, reasoning, JSON faults, the turn being built.

A parser turns the raw text of one sampled completion into a ``ParsedTurn``. The families differ
only in their markup; the rules they keep are the same, and live here:

- Reasoning first. A ``<think>...</think>`` block becomes the turn's reasoning. When a template put
  the opening ``<think>`` in the prompt, the completion holds only ``</think>``, and everything
  before it is reasoning. A ``<think>`` that never closes (the model ran out of tokens while
  thinking) makes the rest of the text reasoning. Tool markup inside reasoning is not a call.
- Every attempted call gets an index, counted over good and bad calls alike, and an id: the one
  the model wrote in the call (Mistral's ``"id"``, ``[CALL_ID]``) when it keeps the id rule
  (``CALL_ID``, the tool-name rule) and no other call of the turn has it yet, else
  ``f"{id_prefix}_{index}"`` (``_2``, ``_3``, ... appended if the model took that one). An id the
  model wrote that breaks the rule (not a string, empty, other characters) makes the call a
  problem ``invalid call id ... @ id``; a repeated one is replaced, since two results with one id
  could not be told apart. Ids are therefore deterministic, unique in the turn, and a problem
  names the id its call would have had. ``distinct_ids`` keeps them unique across a trajectory.
- A call that cannot be accepted becomes a ``ParseProblem`` whose reason names the part at fault
  (``truncated JSON @ arguments``, ``unknown tool 'x' @ name``, ``expected integer, got string @
  arguments.count``). Nothing the model attempted is dropped and nothing raises: JSON faults,
  recursion limits and the ``ToolCall`` validators are all turned into problems.
- A call's name must be a tool name: 1-64 characters of ``[A-Za-z0-9_.-]`` (``TOOL_NAME``, the
  rule ``ToolSpec`` keeps), with or without a tool list. Anything else (a name that swallowed
  markup, a Jinja placeholder the model copied) is a problem ``invalid tool name ... @ name``.
- Scanning is linear. Markup is found with ``str.find`` from a moving position, and the next
  occurrence of a marker is remembered (``Marker``) so that a text full of openers and no closers
  costs one pass, not one pass per opener. The few regular expressions have no nested or
  overlapping quantifiers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from trajcore.domain.errors import ToolArgumentError, TrajcoreError
from trajcore.domain.json_values import JSON, JSONObject, json_type
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn, ParseProblem

__all__ = [
    "CALL_ID",
    "TOOL_NAME",
    "Block",
    "JSONFault",
    "Marker",
    "ToolCallParser",
    "TurnBuilder",
    "describe_json_fault",
    "distinct_ids",
    "fault_part",
    "join_content",
    "load_json",
    "load_json_prefix",
    "name_in_broken_json",
    "scan_blocks",
    "skip_space",
    "split_reasoning",
    "value_extent",
]

TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""What a tool call's name must fully match (the rule ``ToolSpec.name`` keeps)."""

CALL_ID = TOOL_NAME
"""What an id the model wrote in a call must fully match to be kept (Mistral's are 9 letters and
digits)."""

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ToolCallParser(Protocol):
    """Reads the tool calls of one model family out of raw completion text, and writes them back.

    ``parse`` never raises on model text: whatever it cannot understand comes back as
    ``ParsedTurn.errors``, one ``ParseProblem`` per attempted call, with ids and indexes counted
    over all attempted calls in the order they appear. ``render`` is its inverse for valid calls:
    ``parse(render(calls, content=c)).calls == calls`` (ids ``call_0, call_1, ...``) when ``c``
    holds no markup of the family.
    """

    @property
    def name(self) -> str:
        """The registry name of the family (``hermes``, ``qwen3_coder``, ...)."""
        ...

    def parse(
        self, text: str, *, tools: Sequence[ToolSpec] | None = None, id_prefix: str = "call"
    ) -> ParsedTurn:
        """Parse one assistant completion.

        Returns the visible content (markup removed, stripped), the reasoning (or ``None``), the
        well-formed calls in order and one problem per malformed call. When ``tools`` is given,
        calls to other tools and arguments that miss a tool's schema are problems too.
        """
        ...

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """The text the model writes for ``content`` followed by ``calls`` (no reasoning)."""
        ...


# ------------------------------------------------------------------------------------ reasoning


def split_reasoning(
    text: str, *, open_: str = THINK_OPEN, close: str = THINK_CLOSE
) -> tuple[str | None, str]:
    """Split off the think block: return ``(reasoning or None, the remaining text)``.

    ``open_`` and ``close`` are the family's reasoning tags (``<think>`` and ``</think>`` unless
    told). The reasoning is stripped; an empty think block gives ``None``.
    """
    end = text.find(close)
    if end >= 0:
        head = text[:end]
        tail = text[end + len(close) :]
        start = head.find(open_)
        if start >= 0:
            reasoning = head[start + len(open_) :]
            rest = head[:start] + tail
        else:
            reasoning, rest = head, tail
    else:
        start = text.find(open_)
        if start < 0:
            return None, text
        reasoning, rest = text[start + len(open_) :], text[:start]
    reasoning = reasoning.strip()
    return (reasoning or None), rest


# ----------------------------------------------------------------------------------------- JSON


@attrs.frozen(kw_only=True)
class JSONFault:
    """Why a piece of text is not a JSON value.

    Attributes:
        reason: ``truncated JSON`` when the text stops inside a string, object or array (the
            model ran out of tokens or closed the call too early), else ``invalid JSON (...)``.
    """

    reason: str

    @property
    def truncated(self) -> bool:
        return self.reason == "truncated JSON"


_TRUNCATED = JSONFault(reason="truncated JSON")

# A JSON string (closed or running to the end of the text) or a bracket. The string pattern is the
# unrolled loop "[^"\\]*(\\.[^"\\]*)*": every step consumes a character no other branch could,
# so it cannot backtrack more than once. The group holds the string's closing quote, empty when
# the string runs to the end of the text (one whose last character is an escaped quote, "ab\",
# ends with a quote yet is still open).
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*("?)|[\[\]{}]', re.DOTALL)


def _stops_inside_a_value(text: str) -> bool:
    """Whether ``text`` ends inside a string, object or array (a cut-off JSON value)."""
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(text):
        piece = token.group()
        if piece[0] == '"':
            if not token.group(1):
                return True
        elif piece in "{[":
            depth += 1
        else:
            depth -= 1
    return depth > 0


_STRING_BRACKET_OR_SEMICOLON = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{};]', re.DOTALL)


def value_extent(text: str, start: int) -> int:
    """Where the JSON object or array opening at ``text[start]`` ends, found without decoding it.

    Returns the index after its closing bracket; or the index of a ``;`` outside any string (never
    valid JSON, so the value is broken there); or ``len(text)`` when the value never closes. One
    pass over the value, so that a scan over many broken values stays linear.
    """
    depth = 0
    for token in _STRING_BRACKET_OR_SEMICOLON.finditer(text, start):
        piece = token.group()
        if piece[0] == '"':
            if len(piece) == 1 or piece[-1] != '"':
                return len(text)
        elif piece == ";":
            return token.start()
        elif piece in "{[":
            depth += 1
        else:
            depth -= 1
            if depth <= 0:
                return token.end()
    return len(text)


def _refuse_constant(name: str) -> JSON:
    raise ValueError(f"{name} is not allowed")


def describe_json_fault(text: str, error: ValueError | RecursionError) -> JSONFault:
    """Classify why ``text`` failed to decode: truncated, or invalid with the decoder's words."""
    if isinstance(error, RecursionError):
        return JSONFault(reason="invalid JSON (nested too deeply)")
    if not text.strip() or _stops_inside_a_value(text):
        return _TRUNCATED
    if isinstance(error, json.JSONDecodeError):
        return JSONFault(reason=f"invalid JSON ({error.msg} at char {error.pos})")
    return JSONFault(reason=f"invalid JSON ({error})")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def load_json(text: str) -> JSON | JSONFault:
    """Decode ``text`` (surrounding whitespace allowed) as one JSON value, or say why not.

    NaN and Infinity are refused (tool arguments must be plain JSON).
    """
    try:
        value: JSON = _DECODER.decode(text)
    except (ValueError, RecursionError) as error:
        return describe_json_fault(text, error)
    return value


def load_json_prefix(text: str, start: int) -> tuple[JSON, int] | None:
    """Decode one JSON value beginning at ``text[start]``; return it and the index after it.

    Returns ``None`` when no value decodes there; the caller knows how far the attempt reaches
    and classifies that piece with ``load_json`` (classifying the whole rest of the text here
    would make a scan over many bad pieces quadratic).
    """
    try:
        value: JSON
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return value, end


_NAME_FIELD = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


def name_in_broken_json(text: str) -> str | None:
    """The ``"name": "..."`` value of a call whose JSON did not decode, when it can be read."""
    found = _NAME_FIELD.search(text)
    return found.group(1).strip() or None if found else None


def fault_part(text: str, arguments_key: str) -> str:
    """Which part of a JSON call ``{"name": ..., "<arguments_key>": ...}`` a fault lies in.

    A heuristic for the reason's ``@ part``: the arguments when their key was reached or the name
    was complete (the call broke off after it), the name when its key was reached, else the call
    as a whole.
    """
    if f'"{arguments_key}"' in text or name_in_broken_json(text) is not None:
        return arguments_key
    if '"name"' in text:
        return "name"
    return "call"


# -------------------------------------------------------------------------------------- markers


@attrs.define
class Marker:
    """A marker string and where it next occurs in one text, found at most once per occurrence.

    ``next_at(pos)`` returns the first index ``>= pos`` where the marker occurs, or ``len(text)``
    when it no longer does. Positions asked for never decrease in a scan, so the remembered
    answer stays right until the scan passes it; the whole scan is one pass over the text.
    """

    text: str
    marker: str
    _found: int = attrs.field(default=-1, init=False)

    def next_at(self, pos: int) -> int:
        if self._found < pos:
            found = self.text.find(self.marker, pos)
            self._found = len(self.text) if found < 0 else found
        return self._found


@attrs.frozen(kw_only=True)
class Block:
    """One ``open ... close`` region found by ``scan_blocks``.

    Attributes:
        body: The text between the markers.
        raw: The region as written, markers included.
        closed: Whether the closing marker was there (else the block ran into the next opener or
            the end of the text).
    """

    body: str
    raw: str
    closed: bool


def scan_blocks(
    text: str, open_: str, close: str, *, also_ends: Sequence[str] = ()
) -> list[str | Block]:
    """Cut ``text`` into plain segments (``str``) and ``open ... close`` blocks, in order.

    A block with no closing marker ends at the next opener, at any of ``also_ends`` (which are
    kept in the following segment) or at the end of the text. Stray closers stay in the plain
    text. Linear in the length of the text.
    """
    # Openers are looked for afresh: from a block's body, and again from a closed block's end
    # (the text between is read at most twice). Closers and other ends are remembered
    # (``Marker``), so that a text full of openers and no closers costs one pass, not one pass
    # per opener.
    opened = text.find(open_)
    if opened == -1:
        return [text]
    pieces: list[str | Block] = [text[:opened]]
    closes = Marker(text, close)
    enders = [Marker(text, end) for end in also_ends]
    while True:
        body_start = opened + len(open_)
        stop = closes.next_at(body_start)
        following = text.find(open_, body_start)
        end = len(text) if following == -1 else following
        for ender in enders:
            end = min(end, ender.next_at(body_start))
        if stop < end:
            end = stop + len(close)
            block = Block(body=text[body_start:stop], raw=text[opened:end], closed=True)
            following = text.find(open_, end)
        else:
            block = Block(body=text[body_start:end], raw=text[opened:end], closed=False)
        pieces.append(block)
        if following == -1:
            pieces.append(text[end:])
            return pieces
        pieces.append(text[end:following])
        opened = following


def skip_space(text: str, pos: int) -> int:
    """The index of the first character of ``text`` at or after ``pos`` that is not whitespace
    (``len(text)`` when none is)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def join_content(segments: Sequence[str]) -> str:
    """The visible content: the segments around the calls, each stripped, joined by newlines."""
    return "\n".join(s for s in (segment.strip() for segment in segments) if s)


# ---------------------------------------------------------------------------------- turn builder


def _tool_index(tools: Sequence[ToolSpec] | None) -> Mapping[str, ToolSpec] | None:
    if tools is None:
        return None
    return {tool.name: tool for tool in tools}


@attrs.frozen
class ParseProblemReason:
    """Why a part of a call is refused (``reason @ part``), before it becomes a problem."""

    reason: str


def distinct_ids(turn: ParsedTurn, used: set[str], *, suffix: str) -> ParsedTurn:
    """``turn`` with ids unique across a trajectory; the turn's ids are added to ``used``.

    A parser makes ids unique within one turn; a model that writes its own ids (Mistral) can
    repeat one from an earlier turn, or one trajcore generated there. Such an id, in ``used``,
    becomes ``f"{id}-{suffix}"`` (the caller passes the turn number), then ``-2``, ``-3``, ...
    until it is new: deterministic, and the results of this turn answer the new id.
    """
    mine = {call.id for call in turn.calls} | {p.call_id for p in turn.errors if p.call_id}
    if used.isdisjoint(mine):  # the usual turn: nothing to rename, nothing rebuilt
        used.update(mine)
        return turn
    renamed: dict[str, str] = {}

    def fresh(call_id: str) -> str:
        if call_id not in used:
            return call_id
        base = f"{call_id}-{suffix}"
        new, n = base, 1
        while new in used or new in mine or new in renamed.values():
            n += 1
            new = f"{base}-{n}"
        renamed[call_id] = new
        return new

    calls = [attrs.evolve(call, id=fresh(call.id)) for call in turn.calls]
    errors = [attrs.evolve(p, call_id=fresh(p.call_id)) if p.call_id else p for p in turn.errors]
    used.update(call.id for call in calls)
    used.update(p.call_id for p in errors if p.call_id)
    if not renamed:
        return turn
    return attrs.evolve(turn, calls=calls, errors=errors)


@attrs.define
class TurnBuilder:
    """Collects the attempted calls of one turn, checks them, and builds the ``ParsedTurn``.

    ``accept`` and ``refuse`` are called once per attempted call, in the order the model wrote
    them; each takes the next index. Accepting checks the name against ``tools`` (when given) and
    the arguments against the tool's schema; a call that fails becomes a problem instead.
    """

    id_prefix: str
    tools: Mapping[str, ToolSpec] | None
    calls: list[ToolCall] = attrs.field(factory=list)
    problems: list[ParseProblem] = attrs.field(factory=list)
    _attempts: int = 0
    _taken: set[str] = attrs.field(factory=set)

    @classmethod
    def start(cls, tools: Sequence[ToolSpec] | None, id_prefix: str) -> TurnBuilder:
        return cls(id_prefix=id_prefix, tools=_tool_index(tools))

    def spec(self, name: str) -> ToolSpec | None:
        """The spec of tool ``name``, when tools were given and one has that name."""
        return None if self.tools is None else self.tools.get(name)

    def _generated_id(self) -> str:
        base = f"{self.id_prefix}_{self._attempts}"
        call_id, n = base, 1
        while call_id in self._taken:  # the model wrote this id for an earlier call of the turn
            n += 1
            call_id = f"{base}_{n}"
        return call_id

    def _take(self, call_id: str | None) -> tuple[int, str]:
        """The next index and ``call_id`` (or a generated id when ``None``), both now used."""
        index = self._attempts
        call_id = call_id or self._generated_id()
        self._attempts += 1
        self._taken.add(call_id)
        return index, call_id

    def refuse(
        self, raw: str, reason: str, *, name: str | None = None, call_id: str | None = None
    ) -> None:
        """Record an attempted call that could not be read (``call_id``: a kept model id)."""
        index, call_id = self._take(call_id)
        self.problems.append(
            ParseProblem(index=index, raw=raw, reason=reason, name=name or None, call_id=call_id)
        )

    def model_id(self, call_id: object) -> str | ParseProblemReason | None:
        """The id the model wrote, if it is to be kept: ``None`` when it wrote none (or JSON
        null) or one another call of the turn already has; a ``ParseProblemReason`` when it
        breaks the id rule."""
        if call_id is None:
            return None
        if not isinstance(call_id, str):
            return ParseProblemReason(f"expected string, got {json_type(call_id)} @ id")
        if not CALL_ID.fullmatch(call_id):
            return ParseProblemReason(
                f"invalid call id {call_id[:80]!r} (1-64 of [A-Za-z0-9_.-]) @ id"
            )
        return None if call_id in self._taken else call_id

    def accept(
        self,
        raw: str,
        name: object,
        arguments: object,
        *,
        arguments_key: str = "arguments",
        call_id: object = None,
    ) -> None:
        """Record a call whose markup was read; refuse it if its name, id or arguments are wrong.

        ``name``, ``arguments`` and ``call_id`` are what the markup held (any JSON value, or
        ``None`` when absent); ``arguments_key`` is how the family calls the arguments, for the
        reason. ``call_id`` is kept by the rules in the module docstring.
        """
        if not isinstance(name, str) or not (stripped := name.strip()):
            reason = (
                "missing name @ name"
                if name is None or isinstance(name, str)
                else f"expected string, got {json_type(name)} @ name"
            )
            self.refuse(raw, reason)
            return
        name = stripped
        if not TOOL_NAME.fullmatch(name):
            self.refuse(raw, f"invalid tool name {name[:80]!r} (1-64 of [A-Za-z0-9_.-]) @ name")
            return
        kept = self.model_id(call_id)
        if isinstance(kept, ParseProblemReason):
            self.refuse(raw, kept.reason, name=name)
            return
        if not isinstance(arguments, dict):
            got = json_type(arguments)
            self.refuse(
                raw, f"expected a JSON object, got {got} @ {arguments_key}", name=name, call_id=kept
            )
            return
        if self.tools is not None:
            problem = self._check(self.tools, name, arguments, arguments_key)
            if problem is not None:
                self.refuse(raw, problem, name=name, call_id=kept)
                return
        try:
            call = ToolCall(id=kept or self._generated_id(), name=name, arguments=arguments)
        except ToolArgumentError as error:
            # The arguments are not plain JSON (a number too large for a float): "reason @ $.x".
            # The path starts at the first " @ $": a key in it may hold " @ " itself.
            reason, at, path = error.reason.partition(" @ $")
            where = f"{arguments_key}{path}" if at else arguments_key
            self.refuse(raw, f"{reason} @ {where}", name=name, call_id=kept)
            return
        except TrajcoreError as error:
            self.refuse(raw, str(error), name=name, call_id=kept)
            return
        except RecursionError:
            self.refuse(raw, f"nested too deeply @ {arguments_key}", name=name, call_id=kept)
            return
        self._attempts += 1
        self._taken.add(call.id)
        self.calls.append(call)

    def _check(
        self, tools: Mapping[str, ToolSpec], name: str, arguments: JSONObject, arguments_key: str
    ) -> str | None:
        spec = tools.get(name)
        if spec is None:
            return f"unknown tool {name!r} @ name"
        try:
            problems = spec.validate_arguments(arguments)
        except RecursionError:
            return f"nested too deeply @ {arguments_key}"
        if not problems:
            return None
        return "; ".join(f"{p.reason} @ {arguments_key}{p.path[1:]}" for p in problems)

    def turn(self, *, content: str, reasoning: str | None) -> ParsedTurn:
        return ParsedTurn(
            content=content, reasoning=reasoning, calls=self.calls, errors=self.problems
        )
