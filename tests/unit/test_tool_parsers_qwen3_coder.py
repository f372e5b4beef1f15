"""Qwen3-Coder: the decisions of its value rules that the examples in ``test_tool_parsers`` and
the properties do not pin one by one (how much whitespace a value loses, which closer ends a
value whose nesting never balances, when ``</function>`` ends a value, what a closed block
that is no function is called)."""

from __future__ import annotations

import pytest

from trajcore.domain.json_values import JSONObject
from trajcore.domain.tool_parsers import Qwen3CoderParser
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


@pytest.mark.xfail(
    strict=True,
    reason=(
        "known bug: after a value ends at its fallback closer, the scan resumes behind where "
        "its forward-only markers (base.Marker) already looked, so the next parameter's "
        "closers are not seen and the call is reported truncated; re-finding the markers "
        "fixes it but makes the scan quadratic (about 47 s for 190 kB of such values)"
    ),
)
def test_the_parameter_after_a_value_that_never_balances_is_read() -> None:
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
