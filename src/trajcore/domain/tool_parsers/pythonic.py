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
  and both give the same calls (property-tested). The reader takes a list of calls whose
  values are all strings, numbers or words with one regular expression a call, and any other
  token by token, keeping the lists and dicts it is inside on a stack of its own: its reach
  does not depend on the interpreter's recursion limit, and a value nested deeper than the
  arguments' check can walk is refused as ``nested too deeply @ arguments``. Every repeat in
  its expressions is possessive, so a scan stays linear on any text.
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


# The pieces of the plain shape. A string's quotes hold no escape, line break, carriage
# return, NUL or lone surrogate; the strings are matched to their closing quote only, and
# those are looked for once in the text read (``_check_plain``) and in each string's body.
# Every repeat is possessive (``*+``): a piece is matched one way or not at all, so a failed
# match never backtracks and each costs at most one pass over the text it covers.
_STRING_TEXT = r"""'[^']*+'|"[^"]*+\""""
_NUMBER_TEXT = r"-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]++)?+"
_NAME_TEXT = r"[A-Za-z_][A-Za-z0-9_]*+"
_SPACE = r"[ \t\n]*+"

# One token (group 1), after any spaces, tabs and newlines: a string, a number, a dotted name
# or one punctuation mark. Which it is shows in its first character. Two tokens with nothing
# between them are never read as one Python token: each that can end in a letter or a digit
# leaves the shape when another token follows it at once (``1e5j``, ``Truex``, ``b'x'``).
_TOKEN = re.compile(
    rf"{_SPACE}({_STRING_TEXT}|{_NUMBER_TEXT}|{_NAME_TEXT}(?:\.{_NAME_TEXT})*+|[\[\](){{}},:=])"
)

# The common shape, one call at a time: a dotted name, keyword arguments whose values are
# strings, numbers or words (no list or dict), and the comma or ``]`` after the call. Group 1
# is the name, 2 the arguments, 3 the call's closing parenthesis, 4 what follows it.
_SCALAR_TEXT = rf"(?:{_STRING_TEXT}|{_NUMBER_TEXT}|{_NAME_TEXT})"
_FLAT_ARGUMENT = re.compile(rf"({_NAME_TEXT}){_SPACE}={_SPACE}({_SCALAR_TEXT})")
_ARGUMENT_TEXT = rf"{_NAME_TEXT}{_SPACE}={_SPACE}{_SCALAR_TEXT}"
_FLAT_CALL = re.compile(
    rf"{_SPACE}({_NAME_TEXT}(?:\.{_NAME_TEXT})*+){_SPACE}\({_SPACE}"
    rf"((?:{_ARGUMENT_TEXT}(?:{_SPACE},{_SPACE}{_ARGUMENT_TEXT})*+)?+){_SPACE}(\)){_SPACE}([,\]])"
)
_LIST_OPEN = re.compile(rf"{_SPACE}\[")

_WORDS: dict[str, JSON] = {"True": True, "False": False, "None": None}
_KEYWORDS = frozenset(keyword.kwlist)
_QUOTES = ("'", '"')
_OPENERS = ("[", "{")


class _Shape(Exception):
    """The text leaves the plain shape the fast reader knows; ``ast`` reads it instead."""


def _string(piece: str) -> str:
    """The body of a string token; raise ``_Shape`` for another token or a string holding a
    line break."""
    if piece[0] not in _QUOTES or "\n" in piece:
        raise _Shape
    return piece[1:-1]


def _scalar(piece: str) -> JSON:
    """The value of a string, number or word token; raise ``_Shape`` for a string holding a
    line break, a number that is not finite, or any other token."""
    head = piece[0]
    if head in _QUOTES:
        return _string(piece)
    if head == "-" or head.isdigit():
        if "." not in piece and "e" not in piece and "E" not in piece:
            try:
                return int(piece)
            except ValueError:  # more digits than the interpreter converts: ``ast`` says so
                raise _Shape from None
        number = float(piece)
        if not math.isfinite(number):
            raise _Shape
        return number
    if piece not in _WORDS:
        raise _Shape
    return _WORDS[piece]


def _closer(container: list[JSON] | JSONObject) -> str:
    return "]" if isinstance(container, list) else "}"


def _call_name(name: str) -> str:
    """``name``, a token; raise ``_Shape`` unless it is a dotted name with no keyword in it."""
    if not all(part.isidentifier() and part not in _KEYWORDS for part in name.split(".")):
        raise _Shape
    return name


def _check_plain(text: str) -> None:
    """Raise ``_Shape`` when ``text`` (a list read) holds a character no plain string may:
    a backslash, a carriage return, a NUL, or a lone surrogate (no UTF-8 for Python's parser)."""
    if "\\" in text or "\r" in text or "\x00" in text:
        raise _Shape
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise _Shape from None


PlainCall = tuple[str, JSONObject, str]
"""A call read in the plain shape: its name, its arguments and its text as written."""


def _read_flat_at(text: str, start: int) -> tuple[list[PlainCall], int]:
    """``read_plain_at`` for lists of calls whose values hold no list or dict, one regular
    expression a call; raise ``_Shape`` for any other text."""
    opened = _LIST_OPEN.match(text, start)
    if opened is None:
        raise _Shape
    calls: list[PlainCall] = []
    pos = opened.end()
    while (call := _FLAT_CALL.match(text, pos)) is not None:
        arguments: JSONObject = {}
        for key, value in _FLAT_ARGUMENT.findall(call.group(2)):
            if key in _KEYWORDS or key in arguments:
                raise _Shape
            arguments[key] = _scalar(value)
        calls.append((_call_name(call.group(1)), arguments, text[call.start(1) : call.end(3)]))
        pos = call.end()
        if call.group(4) == "]":
            return calls, pos
    raise _Shape


class _Tokens:
    """The tokens of the plain shape from an index of a text on, one at a time."""

    def __init__(self, text: str, start: int) -> None:
        self.text = text
        self.start = self.end = start  # where the last token began (spaces not counted), ended

    def next(self) -> str:
        """The next token; raise ``_Shape`` when the text ends or what comes next is no token."""
        token = _TOKEN.match(self.text, self.end)
        if token is None:
            raise _Shape
        self.start, self.end = token.span(1)
        return token.group(1)


def _item(piece: str, stack: list[list[JSON] | JSONObject]) -> JSON:
    """The value that opens with the token ``piece``: a scalar, or a new list or dict, which
    is pushed on ``stack`` to be filled."""
    if piece not in _OPENERS:
        return _scalar(piece)
    opened: list[JSON] | JSONObject = [] if piece == "[" else {}
    stack.append(opened)
    return opened


def _read_value(tokens: _Tokens, piece: str) -> JSON:
    """The value that opens with the token ``piece``: a string, number or word, or a list or
    dict read to its closer. The lists and dicts not yet closed are kept on a stack of their
    own, not the interpreter's, so any depth is read. Raise ``_Shape`` for text outside the
    shape."""
    stack: list[list[JSON] | JSONObject] = []
    value = _item(piece, stack)
    while stack:
        top = stack[-1]
        piece = tokens.next()
        # A value goes into its container as it opens (a dict keeps a repeated key where it
        # first stood, as Python's does), so a list or dict is empty only until its first item.
        if not top and piece == _closer(top):
            stack.pop()
        else:
            if isinstance(top, list):
                top.append(_item(piece, stack))
            else:
                key = _string(piece)
                if tokens.next() != ":":
                    raise _Shape
                piece = tokens.next()
                top[key] = _item(piece, stack)
            if piece in _OPENERS:
                continue
        # After an item, or a list or dict that closed: a comma, or the closers of the lists
        # and dicts that end here.
        while stack:
            piece = tokens.next()
            if piece == ",":
                break
            if piece != _closer(stack[-1]):
                raise _Shape
            stack.pop()
    return value


def _read_tokens_at(text: str, start: int) -> tuple[list[PlainCall], int]:
    """``read_plain_at`` token by token, for values that hold lists and dicts; raise
    ``_Shape`` for text outside the plain shape."""
    tokens = _Tokens(text, start)
    if tokens.next() != "[":
        raise _Shape
    calls: list[PlainCall] = []
    while True:
        name = _call_name(tokens.next())
        call_start = tokens.start
        if tokens.next() != "(":
            raise _Shape
        arguments: JSONObject = {}
        piece = tokens.next()
        while piece != ")":
            if arguments:
                if piece != ",":
                    raise _Shape
                piece = tokens.next()
            if not piece.isidentifier() or piece in _KEYWORDS or piece in arguments:
                raise _Shape
            if tokens.next() != "=":
                raise _Shape
            arguments[piece] = _read_value(tokens, tokens.next())
            piece = tokens.next()
        calls.append((name, arguments, text[call_start : tokens.end]))
        piece = tokens.next()
        if piece == "]":
            return calls, tokens.end
        if piece != ",":
            raise _Shape


def read_plain_at(text: str, start: int) -> tuple[list[PlainCall], int]:
    """Read the list in the plain shape that opens at ``text[start]`` (spaces, tabs and
    newlines before its ``[`` allowed): its calls and the index after its closing ``]``.

    It accepts only text that Python reads the same way: anything it is unsure of (escapes,
    prefixes, tuples, trailing commas, comments, keywords as names) raises ``_Shape``. Lists
    whose values hold no list or dict are read a call at a time; any other is read token by
    token, at any depth.
    """
    try:
        calls, end = _read_flat_at(text, start)
    except _Shape:
        calls, end = _read_tokens_at(text, start)
    _check_plain(text[start:end])
    return calls, end


def read_plain(source: str) -> list[PlainCall] | None:
    """The calls of ``source``, a list in the plain shape with nothing but spaces, tabs and
    newlines around it; ``None`` when it is not one."""
    try:
        calls, end = read_plain_at(source, 0)
    except _Shape:
        return None
    return calls if not source[end:].strip(" \t\n") else None


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
            # A list in the plain shape is read where it stands, and ends where its reading
            # does (where ``list_extent`` would end it); any other is found, then read.
            plain: list[PlainCall] | None
            stop: int | None
            try:
                plain, stop = read_plain_at(rest, start)
            except _Shape:
                plain, stop = None, list_extent(rest, start)
            if stop is None:
                segments.append(rest[content_from:start])
                read_list(builder, rest[start:])
                content_from = pos = len(rest)
                break
            if _opens_line(rest, start) or stop >= text_end:
                segments.append(rest[content_from:start])
                if plain is None:
                    read_list(builder, rest[start:stop])
                else:
                    for name, arguments, raw in plain:
                        builder.accept(raw, name, arguments)
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
