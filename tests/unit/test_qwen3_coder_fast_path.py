"""Qwen3-Coder / Seed-OSS: the plain walk that reads values before any tag index is built.

A value whose walk stays at nesting depth 0 up to its end (the ordinary case: no literal
``<parameter=`` in it) is read without indexing the text's tags; any other value, and every
value after it, is read over the index. These tests pin that the two ways agree on every text,
unbalanced ones included, and that the ordinary turn never builds the index."""

from __future__ import annotations

from collections.abc import Mapping
from typing import SupportsIndex

from hypothesis import example, given, settings
from hypothesis import strategies as st

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers.base import TurnBuilder
from trajcore.domain.tool_parsers.qwen3_coder import Qwen3CoderParser, _Function, _Scan, read_text
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn

_FAMILY_TAGS = {
    "qwen3_coder": ("<tool_call>", "</tool_call>"),
    "seed_oss": ("<seed:tool_call>", "</seed:tool_call>"),
}


def _scan(text: str, family: str, *, wrapped: bool) -> _Scan:
    open_tag, close_tag = _FAMILY_TAGS[family]
    return _Scan.of(text, wrapped=wrapped, open_tag=open_tag, close_tag=close_tag)


def _read(scan: _Scan, tools: list[ToolSpec] | None) -> ParsedTurn:
    builder = TurnBuilder.start(tools, "call")
    content = read_text(builder, scan)
    return builder.turn(content=content, reasoning=None)


_TOOLS = [
    ToolSpec(
        name="f",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        },
    )
]

# Pieces of a function's body: ordinary values, literal and broken openers, stray closers and
# function ends, the next call's tags.
_PIECES = [
    "<parameter=a>",
    "<parameter=b>",
    "<parameter=c>",
    "<parameter=a",
    "</parameter>",
    "</parameter>\n",
    "<parameter=b>\nplain\n</parameter>\n",
    "</function>",
    "</function>\n",
    "<function=f>\n",
    "{open}",
    "{close}",
    "x",
    "\n",
    " ",
]


@settings(max_examples=300)
@given(
    calls=st.lists(st.lists(st.sampled_from(_PIECES), max_size=12), min_size=1, max_size=4),
    family=st.sampled_from(sorted(_FAMILY_TAGS)),
    wrapped=st.booleans(),
    with_tools=st.booleans(),
)
@example(
    # an unbalanced value first, then ordinary values read over the index
    calls=[["<parameter=a>", "<parameter=a>", "x", "</parameter>\n"], ["<parameter=b>", "x"]],
    family="qwen3_coder",
    wrapped=True,
    with_tools=False,
)
@example(
    # ordinary values first (plain walk), then an unbalanced one (the index from there on)
    calls=[["<parameter=b>\nplain\n</parameter>\n", "<parameter=a>", "<parameter=a>", "x"]],
    family="seed_oss",
    wrapped=True,
    with_tools=True,
)
def test_the_plain_walk_and_the_index_read_every_text_alike(
    calls: list[list[str]], family: str, wrapped: bool, with_tools: bool
) -> None:
    # The same text read twice: once as the parser does (plain walk until a value needs the
    # index), once with the index built before the first value. Every call, problem and the
    # content around them are the same.
    open_tag, close_tag = _FAMILY_TAGS[family]
    blocks = []
    for pieces in calls:
        body = "".join(pieces).format(open=open_tag, close=close_tag)
        block = f"<function=f>\n<parameter=a>\n{body}</function>\n"
        blocks.append(f"{open_tag}\n{block}{close_tag}\n" if wrapped else block)
    text = "prose\n" + "".join(blocks)
    tools = _TOOLS if with_tools else None

    lazy = _scan(text, family, wrapped=wrapped)
    indexed = _scan(text, family, wrapped=wrapped)
    assert indexed.tags is not None  # built up front
    assert _read(lazy, tools) == _read(indexed, tools)


_KNOWN: list[Mapping[str, JSON] | None] = [None, {"a": {}}, {"a": {}, "b": {}}]


@settings(max_examples=300)
@given(
    pieces=st.lists(st.sampled_from(_PIECES), max_size=30),
    start=st.integers(0, 30),
    key=st.sampled_from("abc"),
    given_names=st.frozensets(st.sampled_from("abc")),
    known=st.sampled_from(_KNOWN),
    wrapped=st.booleans(),
)
def test_a_value_the_plain_walk_decides_ends_where_the_index_ends_it(
    *,
    pieces: list[str],
    start: int,
    key: str,
    given_names: frozenset[str],
    known: Mapping[str, JSON] | None,
    wrapped: bool,
) -> None:
    # From any start between two pieces: where the plain walk decides, its end is the
    # indexed walk's; where it does not, the index decides. ``None`` from the plain walk
    # means undecided, never "no end".
    text = "".join(pieces).format(open="<tool_call>", close="</tool_call>")
    at = len(
        "".join(pieces[: min(start, len(pieces))]).format(open="<tool_call>", close="</tool_call>")
    )
    scan = _scan(text, "qwen3_coder", wrapped=wrapped)
    given_so_far: JSONObject = dict.fromkeys(given_names, "")
    plain = scan.plain_value_end(at, key, given_so_far, known)
    indexed = scan.indexed_value_end(at, key, given_so_far, _Function(known=known))
    if plain is not None:
        assert plain == indexed


def test_the_ordinary_turn_is_read_without_the_tag_index() -> None:
    # Two calls of two tools, typed values, prose around them: no value nests, so the text's
    # tags are never indexed.
    for family in sorted(_FAMILY_TAGS):
        parser = Qwen3CoderParser(family=family)
        calls = [
            ToolCall(id="c0", name="f", arguments={"a": "ls -la src", "b": 60}),
            ToolCall(id="c1", name="f", arguments={"a": "python -m pytest -x -q"}),
        ]
        text = parser.render(calls, content="I'll look.")
        scan = _scan(text, family, wrapped=True)
        turn = _read(scan, _TOOLS)
        assert [(c.name, c.arguments) for c in turn.calls] == [
            ("f", {"a": "ls -la src", "b": 60}),
            ("f", {"a": "python -m pytest -x -q"}),
        ]
        assert turn.errors == ()
        assert scan._tags is None  # the index was never built


def test_a_value_that_nests_builds_the_index_and_the_values_after_it_use_it() -> None:
    # The first value holds a literal parameter pair (depth 1 inside it): the plain walk leaves
    # it to the index, which reads it and the value after it.
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\n<parameter=a>y</parameter>\n</parameter>\n"
        "<parameter=b>\nplain\n</parameter>\n</function>\n</tool_call>"
    )
    scan = _scan(text, "qwen3_coder", wrapped=True)
    turn = _read(scan, None)
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("f", {"a": "<parameter=a>y</parameter>", "b": "plain"})
    ]
    assert scan._tags is not None
    assert scan.tags.steps > 0


def test_a_broken_opener_in_a_value_is_text_to_the_plain_walk() -> None:
    # ``<parameter=x`` cut by a newline opens nothing: the value is still read without the
    # index, and the broken opener is part of its text.
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\nsee <parameter=x\nhere\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    scan = _scan(text, "qwen3_coder", wrapped=True)
    turn = _read(scan, None)
    assert [(c.name, c.arguments) for c in turn.calls] == [("f", {"a": "see <parameter=x\nhere"})]
    assert scan._tags is None


class _CountingText(str):
    """A text that counts the characters its ``find`` calls pass over."""

    __slots__ = ("scanned",)

    scanned: int

    def find(
        self, sub: str, start: SupportsIndex | None = None, end: SupportsIndex | None = None, /
    ) -> int:
        found = super().find(sub, start, end)
        begin = 0 if start is None else int(start)
        stop = len(self) if end is None else min(int(end), len(self))
        self.scanned = (
            getattr(self, "scanned", 0) + (found + len(sub) if found >= 0 else stop) - begin
        )
        return found


def test_values_without_closers_are_read_with_the_text_scanned_about_once() -> None:
    # No value has a closer: each ends at the next parameter's opener. Looking for the closer
    # from every value again would pass over the rest of the text each time (n times the text).
    n = 400
    body = "".join(f"<parameter=p{i}>\nv\n" for i in range(n))
    text = _CountingText(f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>")
    turn = _read(_scan(text, "qwen3_coder", wrapped=True), None)
    assert [len(c.arguments) for c in turn.calls] == [n]
    assert turn.errors == ()
    assert text.scanned <= 4 * len(text)


def test_the_remembered_closer_answers_only_between_where_it_was_looked_for_and_found() -> None:
    text = "a</parameter>b</parameter>"
    scan = _scan(text, "qwen3_coder", wrapped=False)
    assert scan.next_closer(2) == 14
    assert scan.next_closer(14) == 14
    assert scan.next_closer(0) == 1  # before where it was looked for from: looked for again
    assert scan.next_closer(15) == -1
    assert scan.next_closer(20) == -1
    assert scan.next_closer(3) == 14
