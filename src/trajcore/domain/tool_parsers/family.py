"""The reading steps the parser families compose, so that each family states only its markup.

``FamilyParser`` is the ``parse`` every family keeps: split off the reasoning, start a
``TurnBuilder``, let the family read its calls out of the rest, build the turn. A family says
which reasoning tags it writes (``reasoning_tags``), when a text can hold no call at all
(``call_markers``, or ``holds_calls`` for a rule of its own: such a text is its content,
stripped, a fast path) and how its calls are read (``read_calls``). The loops and call readers
several families share sit beside it:

- ``blocks_content``: calls in ``open ... close`` blocks (``hermes``, ``glm45``);
- ``sectioned_content``: calls in ``call_begin ... call_end`` blocks inside a ``begin ... end``
  section (``kimi_k2``, ``deepseek_v3``), described by one ``Sections`` value;
- ``read_json_object``: a call written as one JSON object with its name and arguments
  (``hermes``, ``llama3_json``);
- ``read_json_arguments``: arguments written as one JSON object after a name the markup gave
  (``kimi_k2``, ``deepseek_v3``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import ClassVar

import attrs

from trajcore.domain.json_values import JSON, json_type
from trajcore.domain.tool_parsers.base import (
    THINK_CLOSE,
    THINK_OPEN,
    Block,
    JSONFault,
    TurnBuilder,
    fault_part,
    join_content,
    load_json,
    name_in_broken_json,
    scan_blocks,
    split_reasoning,
)
from trajcore.domain.tools import ToolSpec
from trajcore.domain.turns import ParsedTurn

__all__ = [
    "FamilyParser",
    "Sections",
    "accept_json_value",
    "blocks_content",
    "read_json_arguments",
    "read_json_object",
    "refuse_broken_json",
    "section_text",
    "sectioned_content",
]


class FamilyParser(abc.ABC):
    """The ``parse`` of ``ToolCallParser``, written once; a family supplies ``read_calls``."""

    __slots__ = ()

    def reasoning_tags(self, text: str) -> tuple[str, str]:
        """The opening and closing reasoning tags of ``text`` (``<think>`` unless overridden)."""
        return THINK_OPEN, THINK_CLOSE

    call_markers: ClassVar[tuple[str, ...]] = ()
    """Markup one of which every call of the family holds (none: any text may hold calls)."""

    def holds_calls(self, text: str) -> bool:
        """Whether ``text`` (reasoning removed) may hold calls; when not, it is all content."""
        return not self.call_markers or any(marker in text for marker in self.call_markers)

    @abc.abstractmethod
    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        """Read every attempted call of ``text`` into ``builder``; return the visible content."""

    def parse(
        self, text: str, *, tools: Sequence[ToolSpec] | None = None, id_prefix: str = "call"
    ) -> ParsedTurn:
        """Parse one completion; see ``ToolCallParser.parse``. Never raises."""
        open_, close = self.reasoning_tags(text)
        reasoning, rest = split_reasoning(text, open_=open_, close=close)
        builder = TurnBuilder.start(tools, id_prefix)
        content = self.read_calls(builder, rest) if self.holds_calls(rest) else rest.strip()
        return builder.turn(content=content, reasoning=reasoning)


def blocks_content(
    builder: TurnBuilder,
    text: str,
    open_: str,
    close: str,
    read_call: Callable[[TurnBuilder, Block], None],
) -> str:
    """Read every ``open ... close`` block of ``text`` with ``read_call`` (``scan_blocks``
    decides where a block the model did not close ends); return the content around them."""
    segments: list[str] = []
    for piece in scan_blocks(text, open_, close):
        if isinstance(piece, Block):
            read_call(builder, piece)
        else:
            segments.append(piece)
    return join_content(segments)


@attrs.frozen(kw_only=True)
class Sections:
    """The markers of a family whose calls sit in a ``begin ... end`` section.

    Attributes:
        begin: Opens the section of calls.
        end: Closes it.
        call_begin: Opens one call inside it.
        call_end: Closes that call.
    """

    begin: str
    end: str
    call_begin: str
    call_end: str


def section_text(builder: TurnBuilder, segment: str, sections: Sections, *, last: bool) -> str:
    """The content of a plain segment of a family whose calls sit in sections.

    The section markers are removed. In the last segment of the text, a section that holds text
    but no ``call_begin`` is one problem: ``truncated call @ call`` when the text ends inside
    it, ``missing <call_begin> @ call`` when it is closed; its text goes to the problem's
    ``raw``, not to the content.
    """
    begin, end = sections.begin, sections.end
    head, marker, tail = segment.partition(begin)
    if not marker:
        return segment.replace(end, "")
    parts = [head.replace(end, "")]
    for inner in tail.split(begin):
        body, closer, after = inner.partition(end)
        if last and body.strip():
            reason = f"missing {sections.call_begin} @ call" if closer else "truncated call @ call"
            builder.refuse(begin + body + closer, reason)
        else:
            parts.append(body)
        parts.append(after.replace(end, ""))
    return "".join(parts)


def sectioned_content(
    builder: TurnBuilder,
    text: str,
    sections: Sections,
    read_call: Callable[[TurnBuilder, Block], None],
) -> str:
    """Read every ``call_begin ... call_end`` block of ``text`` with ``read_call``, and return the
    visible content around them (``section_text`` on each plain segment, then ``join_content``).
    A call the model did not close ends at the next call, at the section's end or at the end of
    the text."""
    pieces = scan_blocks(text, sections.call_begin, sections.call_end, also_ends=(sections.end,))
    segments: list[str] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, Block):
            read_call(builder, piece)
        else:
            last = i == len(pieces) - 1
            segments.append(section_text(builder, piece, sections, last=last))
    return join_content(segments)


def read_json_object(
    builder: TurnBuilder,
    raw: str,
    text: str,
    *,
    key: str,
    fallback: str,
    fault_key: Callable[[str], str],
) -> None:
    """Read one call written as the JSON object ``text``: ``{"name": ..., "<key>": {...}}``.

    The arguments are under ``key``, or under ``fallback`` when the object has only that one,
    and ``{}`` under neither. JSON that does not decode is one problem, its part found by
    ``fault_part`` with the arguments' name ``fault_key(text)`` gives; a value that is not an
    object is one problem ``@ call``. ``raw`` is the call as written, for the problem.
    """
    value = load_json(text)
    if isinstance(value, JSONFault):
        refuse_broken_json(builder, raw, text, value, fault_key(text))
    else:
        accept_json_value(builder, raw, value, key=key, fallback=fallback)


def refuse_broken_json(
    builder: TurnBuilder, raw: str, text: str, fault: JSONFault, arguments_key: str
) -> None:
    """Record the call ``text`` (written as ``raw``), whose JSON did not decode: the fault, the
    part it lies in (``fault_part``) and the call's name when it can be read."""
    part = fault_part(text, arguments_key)
    builder.refuse(raw, f"{fault.reason} @ {part}", name=name_in_broken_json(text))


def accept_json_value(
    builder: TurnBuilder,
    raw: str,
    value: JSON,
    *,
    key: str = "arguments",
    fallback: str | None = None,
    id_key: str | None = None,
) -> None:
    """Record the call decoded as ``value``: an object ``{"name": ..., "<key>": {...}}``.

    The arguments are under ``key``, or under ``fallback`` when the object has only that one,
    and ``{}`` under neither; the id the model wrote is under ``id_key`` (when the family has
    one). A value that is not an object is one problem ``@ call``.
    """
    if not isinstance(value, dict):
        builder.refuse(raw, f"expected a JSON object, got {json_type(value)} @ call")
        return
    if fallback is not None and key not in value and fallback in value:
        key = fallback
    call_id = None if id_key is None else value.get(id_key)
    builder.accept(raw, value.get("name"), value.get(key, {}), arguments_key=key, call_id=call_id)


def read_json_arguments(
    builder: TurnBuilder, raw: str, name: str | None, text: str, *, closed: bool
) -> None:
    """Read the arguments of call ``name`` (read from the markup), written as the JSON ``text``.

    Empty arguments are a problem: missing when the call was closed, truncated when it was cut
    off. JSON that does not decode is a problem with its fault ``@ arguments``.
    """
    if not text.strip():
        reason = "missing arguments @ arguments" if closed else "truncated call @ arguments"
        builder.refuse(raw, reason, name=name)
        return
    arguments = load_json(text)
    if isinstance(arguments, JSONFault):
        builder.refuse(raw, f"{arguments.reason} @ arguments", name=name)
        return
    builder.accept(raw, name, arguments)
