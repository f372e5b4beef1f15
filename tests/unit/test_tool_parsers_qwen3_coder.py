"""Qwen3-Coder: the decisions of its value rules that the examples in ``test_tool_parsers`` and
the properties do not pin one by one (how much whitespace a value loses, which closer ends a
value whose nesting never balances, when ``</function>`` ends a value, what a closed block
that is no function is called)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers.base import TurnBuilder
from trajcore.domain.tool_parsers.qwen3_coder import (
    FUNCTION_END,
    PARAMETER,
    PARAMETER_END,
    Qwen3CoderParser,
    _Function,
    _Scan,
    read_text,
)
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn

PARSER = Qwen3CoderParser()


def calls(turn: ParsedTurn) -> list[tuple[str, JSONObject]]:
    return [(c.name, c.arguments) for c in turn.calls]


def reasons(turn: ParsedTurn) -> list[str]:
    return [problem.reason for problem in turn.errors]


def test_a_value_loses_exactly_one_newline_at_each_end() -> None:
    # The template writes one newline on each side of a value; any further blank lines are
    # the value's own (a file that starts or ends with an empty line).
    text = (
        "<tool_call>\n<function=write_file>\n"
        "<parameter=content>\n\n\nbody\n\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    turn = PARSER.parse(text)
    assert calls(turn) == [("write_file", {"content": "\n\nbody\n"})]
    assert reasons(turn) == []


def test_a_value_whose_nesting_never_balances_ends_at_the_first_structural_closer() -> None:
    # Two literal openers, so no closer balances the value: it ends at the first
    # ``</parameter>`` with a structural follower (here ``</function>``), not the last one.
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\n"
        "<parameter=a><parameter=a>u</parameter>\n</function>\n</tool_call>\n"
        "v</parameter>\n</function>\n</tool_call>"
    )
    turn = PARSER.parse(text)
    assert calls(turn) == [("f", {"a": "<parameter=a><parameter=a>u"})]
    assert turn.content == "v</parameter>\n</function>\n</tool_call>"


def test_a_function_end_inside_a_literal_parameter_pair_is_text() -> None:
    # A value whose own closer is missing ends at a structural ``</function>`` only at nesting
    # depth 0: one inside a literal ``<parameter=...>`` (opened in the value, not yet closed)
    # is part of the value's text.
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\n"
        "x <parameter=a> y\n</function>\n</tool_call>\n"
        "more </parameter>\n</function>\n</tool_call>"
    )
    turn = PARSER.parse(text)
    assert calls(turn) == [("f", {"a": "x <parameter=a> y\n</function>\n</tool_call>\nmore "})]
    assert turn.content == ""


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("<tool_call>\n<func\n</tool_call>", "expected <function=NAME> @ function"),
        ("<tool_call>\n<func", "truncated call @ function"),
    ],
)
def test_a_block_holding_part_of_function_is_truncated_only_when_unclosed(
    block: str, reason: str
) -> None:
    # ``<func`` cut off by the end of the text is a truncated call; the same inside a closed
    # block is a block that is no function call.
    turn = PARSER.parse("Working.\n" + block)
    assert turn.calls == ()
    assert reasons(turn) == [reason]


def test_the_parameter_after_a_value_that_never_balances_is_read() -> None:
    # The value of ``a`` ends at its first structural closer (its nesting never balances);
    # reading goes on from there, so ``b`` is read, not reported truncated.
    text = (
        "<tool_call>\n<function=f>\n<parameter=a>\n"
        "<parameter=a><parameter=a>u</parameter>\n"
        "<parameter=b>\nv\n</parameter>\n</function>\n</tool_call>"
    )
    turn = PARSER.parse(text)
    assert reasons(turn) == []
    assert turn.calls == (
        ToolCall(id="call_0", name="f", arguments={"a": "<parameter=a><parameter=a>u", "b": "v"}),
    )


@pytest.mark.parametrize(
    ("text", "value", "content"),
    [
        # bare functions: the first </function> ends a value whose closer is missing
        ("<function=f>\n<parameter=a>\nx\n</function>\ntrailing", "x", "trailing"),
        # in a block: a </function> at the very end of the text is structural
        ("<tool_call>\n<function=f>\n<parameter=a>\nx\n</function>", "x", ""),
        # in a block: one followed by text is not; the structural one after it ends the value
        (
            "<tool_call>\n<function=f>\n<parameter=a>\nx </function> y\n</function>\n</tool_call>",
            "x </function> y",
            "",
        ),
    ],
)
def test_a_value_without_its_closer_ends_at_a_structural_function_end(
    text: str, value: str, content: str
) -> None:
    turn = PARSER.parse(text)
    assert calls(turn) == [("f", {"a": value})]
    assert reasons(turn) == []
    assert turn.content == content


def test_a_refused_bare_function_ends_at_its_function_end_and_the_next_call_is_read() -> None:
    turn = PARSER.parse("<function=>\n</function>\nmiddle\n<function=f>\n</function>")
    assert reasons(turn) == ["missing name @ name"]
    assert calls(turn) == [("f", {})]
    assert turn.content == "middle"


def test_a_closer_followed_by_the_block_end_is_structural() -> None:
    # A function whose </function> is missing ends at the block's </tool_call>.
    turn = PARSER.parse("<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</tool_call>")
    assert calls(turn) == [("f", {"a": "x"})]
    assert reasons(turn) == []


def test_with_tools_a_closer_before_a_parameter_the_tool_lacks_is_text() -> None:
    bash = ToolSpec(
        name="bash",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    )
    text = (
        "<tool_call>\n<function=bash>\n<parameter=command>\necho </parameter>\n"
        "<parameter=bogus>x\n</parameter>\n</function>\n</tool_call>"
    )
    turn = PARSER.parse(text, tools=[bash])
    assert calls(turn) == [("bash", {"command": "echo </parameter>\n<parameter=bogus>x"})]
    assert reasons(turn) == []


def test_render_keeps_non_ascii_text_in_json_values() -> None:
    rendered = PARSER.render([ToolCall(id="c", name="f", arguments={"o": {"k": "ü✓"}})])
    assert '<parameter=o>\n{"k": "ü✓"}\n</parameter>' in rendered


# ------------------------------------------------------------------ one pass over the text


def _never_balancing_values(n: int) -> str:
    # one function, each value opening two literal parameters and closing one
    body = "".join(
        f"<parameter=p{i}>\n<parameter=p{i}><parameter=p{i}>u</parameter>\n" for i in range(n)
    )
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def _calls_whose_values_never_balance(n: int) -> str:
    # many calls, each value running past its call's end; a stray closer after each call keeps
    # every later call at the nesting depth where an earlier value's walk would look at it
    call = (
        "<tool_call>\n<function=f>\n<parameter=a>\n<parameter=a>x</parameter>\n</function>\n"
        "</tool_call>\n</parameter> junk\n"
    )
    return call * n


def _scan_all(text: str) -> tuple[ParsedTurn, int, int]:
    scan = _Scan.of(text, wrapped=True, open_tag="<tool_call>", close_tag="</tool_call>")
    builder = TurnBuilder.start(None, "call")
    content = read_text(builder, scan)
    return builder.turn(content=content, reasoning=None), scan.tags.steps, len(scan.tags.positions)


@pytest.mark.parametrize("n", [50, 800])
def test_values_that_never_balance_are_read_in_one_pass(n: int) -> None:
    # Each value here runs off the end of the text looking for its balance and falls back to
    # its first structural closer. The walks share what they found, so the tags looked at
    # stay a small multiple of the tags in the text (a walk per value over the rest of the
    # text would look at about n times as many).
    turn, steps, tags = _scan_all(_never_balancing_values(n))
    assert reasons(turn) == []
    assert [len(c.arguments) for c in turn.calls] == [n]
    assert n <= steps <= 2 * tags

    turn, steps, tags = _scan_all(_calls_whose_values_never_balance(n))
    assert reasons(turn) == []
    assert calls(turn) == [("f", {"a": "<parameter=a>x"})] * n
    assert n <= steps <= 3 * tags


def _reference_value_end(
    scan: _Scan, start: int, key: str, given: JSONObject, known: Mapping[str, JSON] | None
) -> tuple[int, int] | None:
    """The value rules as a plain walk over the text (quadratic over many values)."""
    text = scan.text
    depth = 0
    fallback: tuple[int, int] | None = None
    pos = start

    def find(tag: str) -> int:
        at = text.find(tag, pos)
        return len(text) if at < 0 else at

    def closer_is_structural(after: int) -> bool:
        name, hard = scan.closer_follower(after)
        return hard or (name is not None and (known is None or name in known))

    while True:
        opener, closer, function_end = find(PARAMETER), find(PARAMETER_END), find(FUNCTION_END)
        nearest = min(opener, closer, function_end)
        if nearest >= len(text):
            return fallback
        if nearest == closer:
            after = closer + len(PARAMETER_END)
            structural = closer_is_structural(after)
            if structural and fallback is None:
                fallback = (closer, after)
            if depth > 0:
                depth -= 1
            elif structural:
                return closer, after
            pos = after
        elif nearest == opener:
            name, _ = scan.tag_name(opener + len(PARAMETER))
            if name is not None:
                starts_next = name != key and name not in given
                if depth == 0 and starts_next and (known is None or name in known):
                    return opener, opener
                depth += 1
            pos = opener + len(PARAMETER)
        else:
            if depth == 0 and scan.function_end_is_structural(function_end) and not fallback:
                fallback = (function_end, function_end)
            pos = function_end + len(FUNCTION_END)


_PIECES = [
    "<parameter=a>",
    "<parameter=b>",
    "<parameter=c>",
    "<parameter=a",
    "</parameter>",
    "</parameter>\n",
    "</function>",
    "</function>\n",
    "<tool_call>",
    "</tool_call>",
    "x",
    "\n",
    " ",
]


_KNOWN: list[Mapping[str, JSON] | None] = [None, {"a": {}}, {"a": {}, "b": {}}]


@settings(max_examples=300)
@given(
    pieces=st.lists(st.sampled_from(_PIECES), max_size=40),
    wrapped=st.booleans(),
    reads=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 40), st.sampled_from("abc")),
        min_size=1,
        max_size=8,
    ),
    known=st.tuples(st.sampled_from(_KNOWN), st.sampled_from(_KNOWN)),
)
@example(
    pieces=["<parameter=b>", "x", "</parameter>"],
    wrapped=False,
    reads=[(0, 0, "b")],
    known=(None, None),
)
# skip pointers found with more names given are not used by a function that gave fewer
@example(
    pieces=["<parameter=b>", "x"],
    wrapped=False,
    reads=[(0, 0, "a"), (0, 0, "b"), (1, 0, "a")],
    known=(None, None),
)
# nor those found for one tool by a function of another
@example(
    pieces=["<parameter=b>", "x"],
    wrapped=False,
    reads=[(0, 0, "a"), (1, 0, "a")],
    known=({"a": {}}, None),
)
def test_a_value_ends_where_a_plain_walk_over_the_text_ends_it(
    pieces: list[str],
    wrapped: bool,
    reads: list[tuple[int, int, str]],
    known: tuple[Mapping[str, JSON] | None, Mapping[str, JSON] | None],
) -> None:
    # The values of two functions over one text (each of its own tool), read in order from
    # growing starts with the names each has given so far, end where the rules walked plainly
    # over the text end them: the skip pointers the reads share change no answer. A read
    # starts between two pieces.
    text = "".join(pieces)
    starts = [len("".join(pieces[:i])) for i in range(len(pieces) + 1)]
    scan = _Scan.of(text, wrapped=wrapped, open_tag="<tool_call>", close_tag="</tool_call>")
    functions = [_Function(known=known[0]), _Function(known=known[1])]
    given_so_far: list[JSONObject] = [{}, {}]
    for start, which, key in sorted((starts[min(i, len(pieces))], f, k) for f, i, k in reads):
        given = given_so_far[which]
        expected = _reference_value_end(scan, start, key, given, known[which])
        assert scan.value_end(start, key, given, functions[which]) == expected
        given[key] = ""


@pytest.mark.parametrize(
    ("text", "reason", "name"),
    [
        ("<tool_call>\n<function=wri", "truncated call @ name", "wri"),
        ("<tool_call>\n<function=", "truncated call @ name", None),
        ("<tool_call>\n<func\n</tool_call>", "expected <function=NAME> @ function", None),
        ("<tool_call>\n<function=f>\n<parameter=a", "truncated call @ arguments", "f"),
    ],
)
def test_a_refused_call_keeps_its_whole_text_and_the_name_written(
    text: str, reason: str, name: str | None
) -> None:
    turn = PARSER.parse(text)
    assert [(p.reason, p.name, p.raw) for p in turn.errors] == [(reason, name, text)]
    assert turn.content == ""
