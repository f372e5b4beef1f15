"""Pythonic tool calls (Llama 3.2, Llama 4): a Python list of function calls with literal values.

The format of the Llama 3.2 (lightweight models) and Llama 4 chat templates::

    [get_weather(city='San Francisco', metric='celsius'), get_time()]

Llama 4 may wrap the list in ``<|python_start|>`` and ``<|python_end|>``.

Rules this parser keeps, beyond those in ``base``:

- The calls are the lists that start with a call (``[name(``) and open a line or end the text
  (the text around them is content), or the text between ``<|python_start|>`` and
  ``<|python_end|>`` (or the end of the text; text before and after the tags is content). A
  list ends at its matching ``]`` (brackets inside quoted strings do not count). A list in
  the middle of a line with more text after it is prose quoting a call, and stays content;
  ``[1, 2]`` is not a call.
- Such a list that does not parse is one problem: ``truncated call`` when its brackets never
  close (the model ran out of tokens), ``invalid Python (...)`` otherwise.
- The list is read with Python's own parser (``ast``), never evaluated. Each element is one
  attempted call: a call of a plain or dotted name with keyword arguments only. Argument values
  must be literals that are JSON values (strings, numbers, ``True``/``False``/``None``, lists,
  tuples as lists, dicts with string keys); anything else (a variable, an expression, bytes,
  a set, ``1e999``) makes that call a problem naming the argument, and the other calls stand.
- A list that does not parse is one problem: ``truncated call`` when it stops before its
  closing ``]`` (the model ran out of tokens), ``invalid Python (...)`` otherwise. The calls
  in it are not guessed at.
- Lists in the plain shape models write (ASCII names, keyword arguments, quoted strings without
  escapes, JSON numbers, ``True``/``False``/``None``, lists and dicts) are read by a small
  reader of that shape first, which is faster than compiling; anything else goes to ``ast``,
  and both give the same calls (property-tested).
- ``render`` writes ``[name(key=value, ...), ...]`` with values as Python literals. Keys must
  be Python identifiers and names dotted identifiers, as the format requires; ``render``
  raises ``ValueError`` for others.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Sequence
from typing import Literal

import attrs

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers.base import TurnBuilder, join_content
from trajcore.domain.tool_parsers.family import FamilyParser
from trajcore.domain.tools import ToolCall

__all__ = ["PythonicParser"]

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"

_CALL_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
# A quoted string (to the closing quote, or cut at the line's end) or a bracket.
_STRING_OR_BRACKET = re.compile(r"""'(?:[^'\\\n]|\\.)*'?|"(?:[^"\\\n]|\\.)*"?|[\[\](){}]""")


def list_extent(text: str, start: int) -> int | None:
    """The index after the bracket that closes the one at ``text[start]``.

    ``None`` when it never closes, or a closer does not match its opener (the list is then
    read to the end of the text, and Python's parser names the fault).
    """
    expected: list[str] = []
    for token in _STRING_OR_BRACKET.finditer(text, start):
        piece = token.group()
        if piece[0] in "'\"":
            continue
        if piece in "[({":
            expected.append(_CLOSER[piece])
        elif not expected or expected.pop() != piece:
            return None
        elif not expected:
            return token.end()
    return None


_CLOSER = {"[": "]", "(": ")", "{": "}"}


_ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_WORDS: dict[str, JSON] = {"True": True, "False": False, "None": None}
_AFTER_VALUE = frozenset(" \t\n,)]}:")


class _Shape(Exception):
    """The text leaves the plain shape the fast reader knows; ``ast`` reads it instead."""


class _PlainReader:
    """Reads ``[name(key=value, ...), ...]`` in the plain shape, or raises ``_Shape``.

    It accepts only text that Python reads the same way: anything it is unsure of (escapes,
    prefixes, tuples, trailing commas, comments, keywords as names) raises ``_Shape``.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def space(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in " \t\n":
            pos += 1
        self.pos = pos

    def char(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self, expected: str) -> None:
        if self.char() != expected:
            raise _Shape
        self.pos += 1
        self.space()

    def name(self, pattern: re.Pattern[str]) -> str:
        found = pattern.match(self.text, self.pos)
        if found is None or any(keyword.iskeyword(part) for part in found.group().split(".")):
            raise _Shape
        self.pos = found.end()
        self.space()
        return found.group()

    def value(self) -> JSON:
        head = self.char()
        value: JSON
        if head in ("'", '"'):
            value = self.string(head)
        elif head == "[":
            value = self.items()
        elif head == "{":
            value = self.mapping()
        elif head == "-" or head.isdigit():
            value = self.number()
        else:
            found = _ASCII_NAME.match(self.text, self.pos)
            if found is None or found.group() not in _WORDS:
                raise _Shape
            value = _WORDS[found.group()]
            self.pos = found.end()
        if self.pos < len(self.text) and self.text[self.pos] not in _AFTER_VALUE:
            raise _Shape
        self.space()
        return value

    def string(self, quote: str) -> str:
        end = self.text.find(quote, self.pos + 1)
        body = self.text[self.pos + 1 : end]
        if end < 0 or "\\" in body or "\n" in body or "\r" in body:
            raise _Shape
        self.pos = end + 1
        return body

    def items(self) -> list[JSON]:
        self.take("[")
        items: list[JSON] = []
        while self.char() != "]":
            if items:
                self.take(",")
            items.append(self.value())
        self.pos += 1
        return items

    def mapping(self) -> JSONObject:
        self.take("{")
        out: JSONObject = {}
        first = True
        while self.char() != "}":
            if not first:
                self.take(",")
            first = False
            key = self.value()
            if not isinstance(key, str):
                raise _Shape
            self.take(":")
            out[key] = self.value()
        self.pos += 1
        return out

    def number(self) -> int | float:
        found = _NUMBER.match(self.text, self.pos)
        if found is None:
            raise _Shape
        self.pos = found.end()
        if not (found.group(1) or found.group(2)):
            return int(found.group())
        number = float(found.group())
        if not math.isfinite(number):
            raise _Shape
        return number

    def calls(self) -> list[tuple[str, JSONObject, str]]:
        self.space()
        self.take("[")
        calls: list[tuple[str, JSONObject, str]] = []
        while True:
            start = self.pos
            name = self.name(_DOTTED_NAME)
            self.take("(")
            arguments: JSONObject = {}
            while self.char() != ")":
                if arguments:
                    self.take(",")
                key = self.name(_ASCII_NAME)
                if key in arguments:
                    raise _Shape
                self.take("=")
                arguments[key] = self.value()
            self.pos += 1
            calls.append((name, arguments, self.text[start : self.pos]))
            self.space()
            if self.char() == "]":
                self.pos += 1
                self.space()
                if self.pos != len(self.text):
                    raise _Shape
                return calls
            self.take(",")


def read_plain(source: str) -> list[tuple[str, JSONObject, str]] | None:
    """The ``(name, arguments, raw)`` calls of a list in the plain shape, or ``None``."""
    if "\x00" in source:
        return None
    try:
        source.encode()
        return _PlainReader(source).calls()
    except (_Shape, RecursionError, UnicodeEncodeError):
        return None


def _opens_line(text: str, start: int) -> bool:
    """Whether only spaces stand between the line's start and ``text[start]``.

    Walks back over the spaces only, so a scan over many lists on one line stays linear.
    """
    at = start - 1
    while at >= 0 and text[at] in " \t":
        at -= 1
    return at < 0 or text[at] == "\n"


class _NotJSON(Exception):
    """A literal that is not a JSON value; ``args[0]`` says why, ``args[1]`` where."""


def _literal(node: ast.expr, path: str) -> JSON:
    """The JSON value of a literal expression; raise ``_NotJSON`` for anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _NotJSON(f"non-finite number {value}", path)
            return value
        raise _NotJSON(f"expected a JSON value, got {type(value).__name__}", path)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _literal(node.operand, path)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
        raise _NotJSON("expected a number after a sign", path)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item, f"{path}[{i}]") for i, item in enumerate(node.elts)]
    if isinstance(node, ast.Dict):
        out: JSONObject = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if not (isinstance(key_node, ast.Constant) and isinstance(key_node.value, str)):
                raise _NotJSON("expected string keys", path)
            key = key_node.value
            out[key] = _literal(value_node, f"{path}.{key}")
        return out
    raise _NotJSON(f"expected a literal, got {type(node).__name__}", path)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def read_call(builder: TurnBuilder, node: ast.expr, raw: str) -> None:
    """Read one element of the call list."""
    if not isinstance(node, ast.Call):
        builder.refuse(raw, f"expected a function call, got {type(node).__name__} @ call")
        return
    name = _dotted(node.func)
    if name is None:
        builder.refuse(raw, "expected a function name @ name")
        return
    if node.args:
        builder.refuse(raw, "positional arguments are not allowed @ arguments", name=name)
        return
    arguments: JSONObject = {}
    for argument in node.keywords:
        if argument.arg is None:
            builder.refuse(raw, "**arguments are not allowed @ arguments", name=name)
            return
        try:
            arguments[argument.arg] = _literal(argument.value, f"arguments.{argument.arg}")
        except _NotJSON as error:
            builder.refuse(raw, f"{error.args[0]} @ {error.args[1]}", name=name)
            return
    builder.accept(raw, name, arguments)


def read_list(builder: TurnBuilder, source: str) -> None:
    """Read the calls of one ``[f(...), ...]`` list (a list that does not parse is a problem)."""
    plain = read_plain(source.strip())
    if plain is not None:
        for name, arguments, raw in plain:
            builder.accept(raw, name, arguments)
        return
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as error:
        truncated = not source.rstrip().endswith("]")
        reason = "truncated call @ call" if truncated else f"invalid Python ({error.msg}) @ call"
        builder.refuse(source.strip(), reason)
        return
    except UnicodeEncodeError as error:  # a lone surrogate: no UTF-8 for the parser to read
        builder.refuse(source.strip(), f"invalid Python ({error.reason}) @ call")
        return
    except (RecursionError, MemoryError, ValueError):
        builder.refuse(source.strip(), "invalid Python (nested too deeply) @ call")
        return
    if not isinstance(tree.body, ast.List):
        builder.refuse(source.strip(), "expected a list of calls @ call")
        return
    # ast gives UTF-8 byte columns; slice the encoded source once per element (ast's own
    # get_source_segment re-splits the whole source for every element).
    encoded = source.strip().encode()
    line_starts = [0]
    while (newline := encoded.find(b"\n", line_starts[-1])) >= 0:
        line_starts.append(newline + 1)
    for element in tree.body.elts:
        start = line_starts[element.lineno - 1] + element.col_offset
        end_line = element.end_lineno or element.lineno
        end = line_starts[end_line - 1] + (element.end_col_offset or 0)
        raw = encoded[start:end].decode(errors="replace")
        try:
            read_call(builder, element, raw)
        except RecursionError:
            builder.refuse(raw, "nested too deeply @ arguments")


def _python(value: JSON) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_python(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    return repr(value)


def _check_renderable(call: ToolCall) -> None:
    if not all(part.isidentifier() for part in call.name.split(".")):
        raise ValueError(f"tool name {call.name!r} is not a (dotted) Python identifier")
    for key in call.arguments:
        if not key.isidentifier() or keyword.iskeyword(key):
            raise ValueError(f"argument {key!r} of {call.name} is not a Python identifier")


@attrs.frozen
class PythonicParser(FamilyParser):
    """Parser for Python call lists (``pythonic``; ``llama4_pythonic`` writes the tags).

    Attributes:
        family: ``pythonic`` renders the bare list; ``llama4_pythonic`` wraps it in
            ``<|python_start|>`` and ``<|python_end|>``. Both read either form.
    """

    family: Literal["pythonic", "llama4_pythonic"] = attrs.field(
        default="pythonic", validator=attrs.validators.in_(("pythonic", "llama4_pythonic"))
    )

    @property
    def name(self) -> str:
        return self.family

    def read_calls(self, builder: TurnBuilder, text: str) -> str:
        rest = text
        start = rest.find(PYTHON_START)
        if start >= 0:
            body_start = start + len(PYTHON_START)
            end = rest.find(PYTHON_END, body_start)
            body_end = len(rest) if end < 0 else end
            after = "" if end < 0 else rest[end + len(PYTHON_END) :]
            read_list(builder, rest[body_start:body_end])
            return join_content([rest[:start], after])
        segments: list[str] = []
        content_from = pos = 0
        text_end = len(rest.rstrip())
        while (found := _CALL_LIST.search(rest, pos)) is not None:
            start = found.start()
            stop = list_extent(rest, start)
            if stop is None:
                segments.append(rest[content_from:start])
                read_list(builder, rest[start:])
                content_from = pos = len(rest)
                break
            if _opens_line(rest, start) or stop >= text_end:
                segments.append(rest[content_from:start])
                read_list(builder, rest[start:stop])
                content_from = stop
            pos = stop
        segments.append(rest[content_from:])
        return join_content(segments)

    def render(self, calls: Sequence[ToolCall], *, content: str = "") -> str:
        """``content`` followed by the call list; the content alone if there are no calls.

        Raises:
            ValueError: a name or argument key cannot be written as Python.
        """
        if not calls:
            return content
        for call in calls:
            _check_renderable(call)
        listed = ", ".join(
            f"{call.name}("
            + ", ".join(f"{k}={_python(v)}" for k, v in call.arguments.items())
            + ")"
            for call in calls
        )
        if self.family == "llama4_pythonic":
            return f"{content}{PYTHON_START}[{listed}]{PYTHON_END}"
        return f"{content}\n[{listed}]" if content else f"[{listed}]"
