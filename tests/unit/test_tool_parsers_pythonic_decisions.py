"""Decisions of the Python call-list parser (``pythonic``, ``llama4_pythonic``) that its family
tests check only in part (found by mutation testing): where a list ends, which lists are calls
and which are prose, what the plain-shape reader takes on and what it leaves to ``ast``, the
reason for each kind of refused call, and what ``render`` writes. Each test's docstring names the
decision it pins."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from unittest.mock import ANY

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_tool_parsers_properties_families import PLAIN_PIECES, python_call_lists
from trajcore.domain.json_values import MAX_DEPTH, JSONObject
from trajcore.domain.tool_parsers import pythonic
from trajcore.domain.tool_parsers.base import TurnBuilder
from trajcore.domain.tool_parsers.pythonic import (
    PythonicParser,
    list_extent,
    read_list,
    read_plain,
)
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn, ParseProblem

PYTHONIC = PythonicParser()
LLAMA4 = PythonicParser("llama4_pythonic")


def _call(index: int, name: str, arguments: JSONObject | None = None) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=arguments or {})


def _problem(index: int, raw: str, reason: str, name: str | None = None) -> ParseProblem:
    return ParseProblem(index=index, raw=raw, reason=reason, name=name, call_id=f"call_{index}")


# --------------------------------------------------------------------------- where a list ends


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("[f()]", 0, 5),
        ("ab[f(x=']')](", 2, 12),
        ('[f(x="]")]', 0, 10),
        ("[f({'k': [1]})] [", 0, 15),
        ("[f(x='a\n)]", 0, 10),
        ("[f(]", 0, None),
        ("[f(", 0, None),
        ("[f(x=1)]]", 0, 8),
        ("]x[f()]", 2, 7),
    ],
)
def test_a_list_ends_after_the_bracket_that_balances_it(
    text: str, start: int, end: int | None
) -> None:
    """Pins ``list_extent``: from the opener at ``start`` (text before it not read), brackets of
    the three kinds counted, brackets inside quoted strings of either quote not counted (a
    string cut at the line's end stops there), the index after the balancing ``]``; ``None``
    when a closer does not match its opener or the list never closes."""
    assert list_extent(text, start) == end


# ------------------------------------------------------------------ which lists are the calls


@pytest.mark.parametrize(
    ("text", "turn"),
    [
        ("[f()]", ParsedTurn(calls=[_call(0, "f")])),
        ("a\n  [f(a=1)]\nb", ParsedTurn(content="a\nb", calls=[_call(0, "f", {"a": 1})])),
        ("a\n\t[f()] b", ParsedTurn(content="a\nb", calls=[_call(0, "f")])),
        ("a [f()]  \n", ParsedTurn(content="a", calls=[_call(0, "f")])),
        ("x [f()] [g()]", ParsedTurn(content="x [f()]", calls=[_call(0, "g")])),
        ("[f()]\n[g()]", ParsedTurn(calls=[_call(0, "f"), _call(1, "g")])),
        ("Use [f(x=1)] like this.", ParsedTurn(content="Use [f(x=1)] like this.")),
        ("x[f()] y", ParsedTurn(content="x[f()] y")),
        ("X[f()] y", ParsedTurn(content="X[f()] y")),
        ("a\nx[f()] y", ParsedTurn(content="a\nx[f()] y")),
        (" [f()] y", ParsedTurn(content="y", calls=[_call(0, "f")])),
        ("[f(x=')')] ok", ParsedTurn(content="ok", calls=[_call(0, "f", {"x": ")"})])),
        ("[f(x=1)]]", ParsedTurn(content="]", calls=[_call(0, "f", {"x": 1})])),
        ("[1, f()]\n[(f())]", ParsedTurn(content="[1, f()]\n[(f())]")),
    ],
)
def test_a_call_list_opens_a_line_or_ends_the_text_and_the_rest_is_content(
    text: str, turn: ParsedTurn
) -> None:
    """Pins which lists are calls: a list that starts with a call and opens a line (only spaces
    or tabs before it on its line, or the start of the text), or one that ends the text (spaces
    after it not counted), even in the middle of a line; a list in a line with text after it
    is prose; a list that starts with anything but a call is not a call list; the text between
    the calls is content, one segment a line."""
    assert PYTHONIC.parse(text) == turn


def test_a_list_that_never_closes_is_read_to_the_end_of_the_text() -> None:
    """Pins that a call list whose brackets never close takes the rest of the text (the model
    ran out of tokens): one truncated problem with all of it, the text before it content."""
    turn = PYTHONIC.parse("Calling.\n[f(x=1), g(y=\nmore")
    assert turn == ParsedTurn(
        content="Calling.",
        errors=[_problem(0, "[f(x=1), g(y=\nmore", "truncated call @ call")],
    )


def test_a_later_list_after_a_never_closed_one_is_not_read_apart() -> None:
    """Pins that the scan stops at a list that never closes: what follows is part of it."""
    turn = PYTHONIC.parse("[f(x=[1)\n[g()]")
    assert turn.calls == ()
    assert [p.raw for p in turn.errors] == ["[f(x=[1)\n[g()]"]


@pytest.mark.parametrize(
    ("text", "turn"),
    [
        ("<|python_start|>[f()]", ParsedTurn(calls=[_call(0, "f")])),
        (
            "a<|python_start|>[f()]<|python_end|>b",
            ParsedTurn(content="a\nb", calls=[_call(0, "f")]),
        ),
        (
            "a<|python_start|>[f(x=1)]\n<|python_end|>\n[g()]",
            ParsedTurn(content="a\n[g()]", calls=[_call(0, "f", {"x": 1})]),
        ),
        (
            "<|python_start|>[f(x=1)",
            ParsedTurn(errors=[_problem(0, "[f(x=1)", "truncated call @ call")]),
        ),
        (
            "<|python_start|>[f(x='<|python_start|>')]<|python_end|>",
            ParsedTurn(calls=[_call(0, "f", {"x": "<|python_start|>"})]),
        ),
        (
            "<|python_end|>a<|python_start|>[f()]<|python_end|>b<|python_end|>",
            ParsedTurn(content="<|python_end|>a\nb<|python_end|>", calls=[_call(0, "f")]),
        ),
    ],
)
def test_tags_mark_the_one_list_and_the_text_around_them_is_content(
    text: str, turn: ParsedTurn
) -> None:
    """Pins Llama 4's tags: the list is the text between ``<|python_start|>`` and
    ``<|python_end|>`` (or the end of the text), stripped; the text before the opener and after
    the closer is content, not searched for other lists; the first opener opens the list (a
    later one is inside it) and the first closer after it closes it."""
    assert PYTHONIC.parse(text) == turn
    assert LLAMA4.parse(text) == turn


# ----------------------------------------------------------------------- the plain-shape reader


@pytest.mark.parametrize(
    ("source", "calls"),
    [
        ("[f()]", [("f", {}, "f()")]),
        (
            " [f( x = 1 , y=\t'a' )\n, g.h()] ",
            [("f", {"x": 1, "y": "a"}, "f( x = 1 , y=\t'a' )"), ("g.h", {}, "g.h()")],
        ),
        (
            "[f(x=[1, 2.5, -3, 1e3, -0.5E-2, 0], y={'a': None, \"b\": True}, z=False)]",
            [
                (
                    "f",
                    {
                        "x": [1, 2.5, -3, 1000.0, -0.005, 0],
                        "y": {"a": None, "b": True},
                        "z": False,
                    },
                    "f(x=[1, 2.5, -3, 1e3, -0.5E-2, 0], y={'a': None, \"b\": True}, z=False)",
                )
            ],
        ),
        ("[f(x={'a':'b'}, y=[[]], z={}, w='', v=\"\")]\n", None),
        ("[ f ( ) ]", [("f", {}, "f ( )")]),
        ("[f(x=1) ]", [("f", {"x": 1}, "f(x=1)")]),
        ("[f(x=-7)]", [("f", {"x": -7}, "f(x=-7)")]),
        (
            "[f(x=[1, 'a'], y={'k': [2]})]",
            [("f", {"x": [1, "a"], "y": {"k": [2]}}, "f(x=[1, 'a'], y={'k': [2]})")],
        ),
    ],
)
def test_the_plain_reader_reads_the_plain_shape_models_write(
    source: str, calls: list[tuple[str, JSONObject, str]] | None
) -> None:
    """Pins the fast path: a list in the plain shape (dotted ASCII names, keyword arguments,
    quoted strings without escapes of either quote, JSON numbers with sign, fraction and
    exponent, ``True``/``False``/``None``, lists and dicts, with spaces, tabs and newlines
    around every token) is read by the plain reader, giving each call's name, arguments and
    text as written, and the reader does not hand it to ``ast``."""
    got = read_plain(source)
    assert got is not None
    if calls is not None:
        assert got == calls


def test_the_plain_reader_reads_each_kind_of_value_as_python_does() -> None:
    """Pins the values of the fast path one kind at a time: an integer stays an integer, a
    number with a fraction or an exponent is a float, the three words their JSON values."""
    got = read_plain("[f(a=12, b=-0, c=1.5, d=2e2, e=True, f=False, g=None, h='t', i=3E1)]")
    assert got == [
        (
            "f",
            {
                "a": 12,
                "b": 0,
                "c": 1.5,
                "d": 200.0,
                "e": True,
                "f": False,
                "g": None,
                "h": "t",
                "i": 30.0,
            },
            "f(a=12, b=-0, c=1.5, d=2e2, e=True, f=False, g=None, h='t', i=3E1)",
        )
    ]
    assert [type(v) for v in got[0][1].values()] == [
        int, int, float, float, bool, bool, type(None), str, float,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "source",
    [
        "[f(x='a\\'')]",
        "[f(x='a\nb')]",
        "[f(x='a\rb')]",
        "[f(x='ab)]",
        "[if()]",
        "[a.if()]",
        "[f(class=1)]",
        "[f(x=1, x=2)]",
        "[f(x={1: 2})]",
        "[f(x=1y)]",
        "[f(x=Truex)]",
        "[f(x=abc)]",
        "[f()] x",
        "[f(),]",
        "[f(x=(1,))]",
        "[f(x=1e999)]",
        "[f(x=01)]",
        "[f(x=-)]",
        "[f(x=1.)]",
        "[f(x='\x00')]",
        "[f(x='\ud800')]",
        "[f(1)]",
        "[f(x=1,)]",
        "[f(x=[1,])]",
        "[f(x={'a':1,})]",
        "[f(x={'a' 1})]",
        "[f(x=[1 2])]",
        "[f(x=1)",
        "[f(x=1)g()]",
        "[f(x='a'\"b\")]",
        "[f(x=1:2)]",
        "f()]",
        "[f(x=1) g()]",
        "[f()] X",
        "[f()]\x0c",
    ],
)
def test_the_plain_reader_leaves_everything_else_to_python(source: str) -> None:
    """Pins what the fast path does not take on (each read by ``ast``, which may read it
    differently or refuse it): escapes, line breaks and unclosed quotes in strings, keywords as
    names or keys, a repeated key, a non-string dict key, a value run into other text, text
    after the list, trailing commas, tuples, a non-finite number, a leading zero, a sign or a
    point without digits, a NUL, a lone surrogate, a positional argument, a missing comma or
    colon, an unclosed list."""
    assert read_plain(source) is None


_TOO_DEEP = f"nested deeper than {MAX_DEPTH} arrays and objects @ arguments.x{'[0]' * 99}"


def test_a_list_in_the_plain_shape_is_read_by_the_plain_reader_first() -> None:
    """Pins that ``parse`` tries the plain reader before ``ast``: a plain list nested deeper than
    Python's parser takes (200 brackets) is read, not refused as invalid Python; past the JSON
    trees' depth (``MAX_DEPTH``) its call is then refused for that, at its arguments, and a
    list as deep as the bound is a call."""
    value = "[" * 250 + "]" * 250
    turn = PYTHONIC.parse(f"[f(x={value})]")
    assert turn.calls == ()
    assert [problem.reason for problem in turn.errors] == [_TOO_DEEP]
    value = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert [c.name for c in PYTHONIC.parse(f"[f(x={value})]").calls] == ["f"]


def test_a_list_in_llama4_tags_is_read_by_the_plain_reader_first() -> None:
    """Pins that the list between Llama 4's tags goes to the plain reader before ``ast`` too:
    a plain list nested deeper than Python's parser takes is read (then refused for its depth,
    not as invalid Python), and a refused call of it keeps its text as written."""
    value = "[" * 250 + "]" * 250
    turn = LLAMA4.parse(f"<|python_start|>[f(x={value})]<|python_end|>")
    assert turn.calls == ()
    assert [problem.reason for problem in turn.errors] == [_TOO_DEEP]
    tools = [ToolSpec(name="f")]
    turn = LLAMA4.parse("<|python_start|> [g(x=1), f()]\n<|python_end|>", tools=tools)
    assert turn == ParsedTurn(
        calls=[_call(1, "f")], errors=[_problem(0, "g(x=1)", "unknown tool 'g' @ name", "g")]
    )


def _depth(value: object) -> int:
    """How deeply lists and dicts nest in ``value`` (each holding at most one item)."""
    depth = 0
    while isinstance(value, list | dict) and value:
        value = value[0] if isinstance(value, list) else next(iter(value.values()))
        depth += 1
    return depth + isinstance(value, list | dict)


def _stack_depth() -> int:
    frame, depth = inspect.currentframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


@pytest.mark.parametrize("headroom", [None, 40])
def test_the_plain_reader_reads_any_depth_whatever_the_recursion_limit(
    headroom: int | None,
) -> None:
    """Pins that the plain reader's reach does not depend on the interpreter's stack: a value
    nested 2,000 deep in lists and dicts is read whole, under the default recursion limit and
    with a limit 40 frames above the caller's, too low for a recursive reader to reach it."""
    depth = 2000
    value = "[{'k': " * (depth // 2) + "{'k': 1}" + "}]" * (depth // 2)
    source = f"[f(x={value}, y='z'), g()]"
    before = sys.getrecursionlimit()
    if headroom is not None:
        sys.setrecursionlimit(_stack_depth() + headroom)
    try:
        got = read_plain(source)
    finally:
        sys.setrecursionlimit(before)
    assert got is not None
    (name, arguments, raw), second = got
    assert (name, raw, second) == ("f", source[1 : source.index(", g()")], ("g", {}, "g()"))
    assert _depth(arguments["x"]) == depth + 1
    assert arguments["y"] == "z"


def test_a_call_nested_deeper_than_its_check_can_walk_is_refused_at_its_arguments() -> None:
    """Pins the outcome for a plain list nested far past Python's parser and the recursion
    limit: read whole, then refused where the arguments are checked (past ``MAX_DEPTH``, named
    where the level past it begins), naming the call; the call after it stands."""
    value = "[" * 50_000 + "]" * 50_000
    turn = PYTHONIC.parse(f"[f(x={value}), g()]")
    assert turn == ParsedTurn(
        calls=[_call(1, "g")], errors=[_problem(0, f"f(x={value})", _TOO_DEEP, "f")]
    )


def test_an_integer_longer_than_the_interpreter_converts_is_left_to_python() -> None:
    """Pins that an integer with more digits than ``int`` converts (4,300 by default) is not
    read by the plain reader, and the list is one problem with the parser's words; ``parse``
    does not raise."""
    source = "[f(x=" + "1" * 5000 + ")]"
    assert read_plain(source) is None
    turn = PYTHONIC.parse(source)
    assert turn.calls == ()
    [problem] = turn.errors
    assert problem.reason.startswith("invalid Python (Exceeds the limit (4300 digits)")
    assert read_plain("[f(x=" + "1" * 4000 + ")]") == [("f", {"x": int("1" * 4000)}, ANY)]


def _read_with(reader: Callable[[str, int], object], text: str, start: int) -> object:
    try:
        return reader(text, start)
    except pythonic._Shape:
        return None


NESTED_PIECES = [*PLAIN_PIECES, "[1, {'k': [2]}]", "{'a': 1, 'b': [True]}", "{}", "[]", ": "]


@given(
    calls=python_call_lists(),
    prefix=st.sampled_from(["", "x ", "\n "]),
    suffix=st.sampled_from(["", "]", " tail"]),
)
def test_the_one_call_at_a_time_reader_agrees_with_the_token_reader(
    calls: list[ToolCall], prefix: str, suffix: str
) -> None:
    """Pins that the two plain readers agree: on every list the call-at-a-time reader takes it
    gives what the token reader gives (the token reader takes more: lists and dicts), and both
    end the list where ``list_extent`` does."""
    source = prefix + (PYTHONIC.render(calls) or "[f()]") + suffix
    start = len(prefix)
    flat = _read_with(pythonic._read_flat_at, source, start)
    tokens = _read_with(pythonic._read_tokens_at, source, start)
    if flat is not None:
        assert flat == tokens
    if tokens is not None:
        assert isinstance(tokens, tuple)
        assert list_extent(source, start) == tokens[1]
    scalars_only = all(not isinstance(v, list | dict) for c in calls for v in c.arguments.values())
    if scalars_only and tokens is not None:
        assert flat is not None


@given(source=st.lists(st.sampled_from(NESTED_PIECES), max_size=25).map("".join))
def test_the_plain_readers_agree_on_any_pieces(source: str) -> None:
    """Pins the same agreement on text pieced together from the shape's tokens and near
    misses: what the call-at-a-time reader takes, the token reader takes alike."""
    flat = _read_with(pythonic._read_flat_at, source, 0)
    tokens = _read_with(pythonic._read_tokens_at, source, 0)
    if flat is not None:
        assert flat == tokens
    if tokens is not None:
        assert isinstance(tokens, tuple)
        assert list_extent(source, 0) == tokens[1]


# ------------------------------------------------------------------------ reading with ast


def _read(source: str) -> TurnBuilder:
    builder = TurnBuilder.start(None, "call")
    read_list(builder, source)
    return builder


@pytest.mark.parametrize(
    ("text", "reason", "name"),
    [
        ("[f()()]", "expected a function name @ name", None),
        ("[f().g()]", "expected a function name @ name", None),
        ("[f(x=-y)]", "expected a literal, got Name @ arguments.x", "f"),
        ("[f(x=-True)]", "expected a number after a sign @ arguments.x", "f"),
        ("[f(x=-'a')]", "expected a number after a sign @ arguments.x", "f"),
        ("[f(x=b'a')]", "expected a JSON value, got bytes @ arguments.x", "f"),
        ("[f(x=1j)]", "expected a JSON value, got complex @ arguments.x", "f"),
        ("[f(x=1e999)]", "non-finite number inf @ arguments.x", "f"),
        ("[f(x=[1, {'k': (2, s)}])]", "expected a literal, got Name @ arguments.x[1].k[1]", "f"),
        ("[f(x={1: 2})]", "expected string keys @ arguments.x", "f"),
        ("[f(x={**a})]", "expected string keys @ arguments.x", "f"),
        ("[f(1)]", "positional arguments are not allowed @ arguments", "f"),
        ("[f(**a)]", "**arguments are not allowed @ arguments", "f"),
        ("[f(x=1, **a)]", "**arguments are not allowed @ arguments", "f"),
        ("[f(x=1, y=z)]", "expected a literal, got Name @ arguments.y", "f"),
    ],
)
def test_a_call_python_reads_but_json_cannot_hold_is_refused_naming_the_part(
    text: str, reason: str, name: str | None
) -> None:
    """Pins the reason for each call ``ast`` reads that is not a call of JSON values: a callee
    that is no (dotted) name, a sign before a non-number, a constant JSON has no kind for, a
    non-finite number, a name or an expression (at its path through lists, tuples and dicts),
    a non-string or ``**`` dict key, a positional or ``**`` argument; the problem keeps the
    call's text and its name once read."""
    turn = PYTHONIC.parse(text)
    assert turn == ParsedTurn(errors=[_problem(0, text[1:-1], reason, name)])


def test_a_sign_keeps_or_flips_a_number_read_by_python() -> None:
    """Pins the unary signs ``ast`` reads: ``+`` keeps the number, ``-`` negates it, of an
    integer and a float alike."""
    turn = PYTHONIC.parse("[f(a=+1, b=-(2), c=+2.5, d=-(1.5), e=(-1,))]")
    assert turn.calls == (_call(0, "f", {"a": 1, "b": -2, "c": 2.5, "d": -1.5, "e": [-1]}),)


def test_a_call_that_is_no_call_is_refused_naming_what_it_is() -> None:
    """Pins the reason for a list element ``ast`` reads that is no call (after a first element
    that is: the list is a call list), and that the other calls stand."""
    turn = PYTHONIC.parse("[f(), 1, g.h(x=(1, 'a'))]")
    assert turn == ParsedTurn(
        calls=[_call(0, "f"), _call(2, "g.h", {"x": [1, "a"]})],
        errors=[_problem(1, "1", "expected a function call, got Constant @ call")],
    )


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("[f(x=1), g(y=", "truncated call @ call"),
        ("[f(x=1) g()]", "invalid Python (invalid syntax. Perhaps you forgot a comma?) @ call"),
        ("[f(x=1) g()]  \n", "invalid Python (invalid syntax. Perhaps you forgot a comma?) @ call"),
        ("(f(x=1),)", "expected a list of calls @ call"),
    ],
)
def test_a_list_that_does_not_parse_is_one_problem(source: str, reason: str) -> None:
    """Pins the list-level refusals: ``truncated`` when the text does not end with ``]`` (spaces
    after it not counted), else ``invalid Python`` with the parser's words; a body that is not a
    list; the problem's text the list stripped, and no call guessed at."""
    builder = _read(source)
    assert builder.calls == []
    assert builder.problems == [_problem(0, source.strip(), reason)]


def test_a_list_nested_past_the_parsers_limit_is_refused_saying_so() -> None:
    """Pins the refusal of a list Python's parser cannot nest so deeply (signs upon signs)."""
    source = "[f(x=" + "-" * 5000 + "1)]"
    assert _read(source).problems == [
        _problem(0, source, "invalid Python (nested too deeply) @ call")
    ]


def test_a_list_holding_a_lone_surrogate_is_refused_naming_it_not_nesting() -> None:
    """Pins the reason for a list Python's parser cannot take because it holds a lone surrogate
    (no UTF-8 for it): that reason, not "nested too deeply"."""
    source = "[f(x='\ud800')]"
    assert _read(source).problems == [
        _problem(0, source, "invalid Python (surrogates not allowed) @ call")
    ]


def test_a_call_nested_past_the_recursion_limit_is_refused_at_its_arguments() -> None:
    """Pins the refusal of one call whose value parses but is nested too deeply to read (signs
    upon signs): that call is refused at its arguments with its own text; the call before it
    stands."""
    value = "-" * (sys.getrecursionlimit() + 500) + "1"
    turn = PYTHONIC.parse(f"[g(), f(x={value})]")
    assert turn == ParsedTurn(
        calls=[_call(0, "g")],
        errors=[_problem(1, f"f(x={value})", "nested too deeply @ arguments")],
    )


def test_each_calls_text_is_cut_from_the_list_across_lines_and_wide_characters() -> None:
    """Pins each call's text from ``ast``'s positions: byte columns over UTF-8 text, on the line
    each call starts and ends on, for calls spanning lines."""
    source = "[f(x='é', y=1j),\n  g(y='日本'\n ,z=b''),   h(\n)(), k(w=\\\n1)]"
    builder = _read(source)
    assert [p.raw for p in builder.problems] == [
        "f(x='é', y=1j)",
        "g(y='日本'\n ,z=b'')",
        "h(\n)()",
    ]
    assert builder.calls == [_call(3, "k", {"w": 1})]


# ------------------------------------------------------------------------------------ render


def test_render_writes_content_a_line_then_the_bare_list() -> None:
    """Pins ``pythonic``'s render: the content, a newline, the list; the list alone without
    content; the content alone without calls; values as Python literals (strings by ``repr``,
    ``True``/``False``/``None``, lists and dicts written out)."""
    calls = [
        _call(0, "f", {"s": "it's", "n": None, "b": False, "l": [1, 2.5], "d": {"k": [True]}}),
        _call(1, "g.h"),
    ]
    listed = "[f(s=\"it's\", n=None, b=False, l=[1, 2.5], d={'k': [True]}), g.h()]"
    assert PYTHONIC.render(calls, content="Ok.") == "Ok.\n" + listed
    assert PYTHONIC.render(calls) == listed
    assert PYTHONIC.render([], content="Ok.") == "Ok."
    assert LLAMA4.render([], content="Ok.") == "Ok."
    assert LLAMA4.render(calls, content="Ok.") == f"Ok.<|python_start|>{listed}<|python_end|>"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (_call(0, "a-b"), "tool name 'a-b' is not a (dotted) Python identifier"),
        (_call(0, "a..b"), "tool name 'a..b' is not a (dotted) Python identifier"),
        (_call(0, "f", {"class": 1}), "argument 'class' of f is not a Python identifier"),
        (_call(0, "f", {"x": 1, "1y": 2}), "argument '1y' of f is not a Python identifier"),
    ],
)
def test_render_refuses_names_and_keys_python_cannot_write(call: ToolCall, message: str) -> None:
    """Pins ``render``'s refusals: a name that is not dotted identifiers, a key that is not an
    identifier or is a keyword, each message naming it (and a later call is not written past a
    refused one)."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        PYTHONIC.render([_call(1, "ok"), call])


def test_the_family_is_one_of_the_two_and_names_the_parser() -> None:
    """Pins the family field: its default, that it is the parser's name, and the refusal of
    any other."""
    assert PYTHONIC.name == "pythonic"
    assert LLAMA4.name == "llama4_pythonic"
    with pytest.raises(ValueError, match="family"):
        PythonicParser("hermes")  # type: ignore[arg-type]


def test_calls_are_checked_against_the_tools_offered() -> None:
    """Pins that a call read from a list goes through the shared checks (an unknown tool)."""
    tools = [ToolSpec(name="f", parameters={"type": "object", "properties": {}})]
    turn = PYTHONIC.parse("[f(), g()]", tools=tools)
    assert turn.calls == (_call(0, "f"),)
    assert turn.errors == (_problem(1, "g()", "unknown tool 'g' @ name", "g"),)
    # read by ast (a tuple is not the plain shape): the refused call keeps its text too
    turn = PYTHONIC.parse("[f(), g(x=(1,))]", tools=tools)
    assert turn.errors == (_problem(1, "g(x=(1,))", "unknown tool 'g' @ name", "g"),)
