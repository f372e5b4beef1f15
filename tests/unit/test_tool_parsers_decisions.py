"""Parser families' decisions the family tests check only in part (found by mutation testing):
each named here with the family it belongs to."""

from __future__ import annotations

import json

import pytest

from trajcore.domain.tool_parsers import granite, kimi_k2
from trajcore.domain.tool_parsers.granite import GraniteParser
from trajcore.domain.tool_parsers.hermes import HermesParser, _json_block_end
from trajcore.domain.tool_parsers.kimi_k2 import KimiK2Parser
from trajcore.domain.tools import ToolCall
from trajcore.domain.turns import ParseProblem


def test_hermes_an_empty_closed_call_is_refused_as_empty_with_its_text() -> None:
    """Pins Hermes' refusal of a call with no body: ``empty tool call`` when it was closed (a
    cut-off one is truncated), and the problem keeps the call as written."""
    turn = HermesParser().parse("Hi.\n<tool_call>\n \n</tool_call>")
    assert turn.content == "Hi."
    assert turn.errors == (
        ParseProblem(
            index=0,
            raw="<tool_call>\n \n</tool_call>",
            reason="empty tool call @ call",
            call_id="call_0",
        ),
    )
    cut = HermesParser().parse("<tool_call>\n ")
    assert [(p.raw, p.reason) for p in cut.errors] == [("<tool_call>\n ", "truncated JSON @ call")]


# ------------------------------------------------------------------------------ kimi_k2


def _kimi(*calls: str, closed: bool = True) -> str:
    inner = "".join(kimi_k2.CALL_BEGIN + call for call in calls)
    return f"Let me check.{kimi_k2.SECTION_BEGIN}{inner}" + (kimi_k2.SECTION_END if closed else "")


def test_kimi_a_call_without_its_argument_marker_keeps_its_text_and_name() -> None:
    """Pins Kimi K2's refusal of a call with no ``<|tool_call_argument_begin|>``: missing when the
    call was closed, truncated when the text ends in it; either way the problem keeps the call as
    written and the name its id gives."""
    closed = KimiK2Parser().parse(_kimi("functions.bash:0" + kimi_k2.CALL_END))
    assert closed.content == "Let me check."
    assert [(p.raw, p.reason, p.name) for p in closed.errors] == [
        (
            kimi_k2.CALL_BEGIN + "functions.bash:0" + kimi_k2.CALL_END,
            f"missing {kimi_k2.ARGUMENT_BEGIN} @ call",
            "bash",
        )
    ]
    cut = KimiK2Parser().parse(_kimi("functions.bash:0", closed=False))
    assert [(p.raw, p.reason, p.name) for p in cut.errors] == [
        (kimi_k2.CALL_BEGIN + "functions.bash:0", "truncated call @ arguments", "bash")
    ]


@pytest.mark.parametrize(
    ("call_id", "reason"),
    [
        ("0", "call id '0' names no function @ name"),
        ("bash", "malformed call id 'bash' (expected functions.NAME:INDEX) @ name"),
    ],
)
def test_kimi_a_call_id_that_names_no_function_says_which_way(call_id: str, reason: str) -> None:
    """Pins the two reasons Kimi K2 refuses a call id for: a bare counter names no function, any
    other id without ``:INDEX`` is malformed."""
    raw = f"{kimi_k2.CALL_BEGIN}{call_id}{kimi_k2.ARGUMENT_BEGIN}{{}}{kimi_k2.CALL_END}"
    errors = KimiK2Parser().parse(_kimi(raw.removeprefix(kimi_k2.CALL_BEGIN))).errors
    assert [(p.raw, p.reason, p.name) for p in errors] == [(raw, reason, None)]


def test_kimi_a_refused_call_id_is_quoted_up_to_80_characters() -> None:
    """Pins how much of a refused call id the reason quotes: its first 80 characters."""
    text = _kimi(f"{'9' * 100}{kimi_k2.ARGUMENT_BEGIN}{{}}{kimi_k2.CALL_END}")
    (problem,) = KimiK2Parser().parse(text).errors
    assert problem.reason == f"call id '{'9' * 80}' names no function @ name"
    text = _kimi(f"{'x' * 100}{kimi_k2.ARGUMENT_BEGIN}{{}}{kimi_k2.CALL_END}")
    (problem,) = KimiK2Parser().parse(text).errors
    assert problem.reason == (
        f"malformed call id '{'x' * 80}' (expected functions.NAME:INDEX) @ name"
    )


def test_kimi_empty_arguments_are_missing_when_closed_and_keep_the_call_text() -> None:
    """Pins that a closed call with no arguments is ``missing arguments`` (a cut-off one is
    truncated), its problem holding the call as written."""
    raw = f"{kimi_k2.CALL_BEGIN}functions.bash:0{kimi_k2.ARGUMENT_BEGIN} {kimi_k2.CALL_END}"
    errors = KimiK2Parser().parse(_kimi(raw.removeprefix(kimi_k2.CALL_BEGIN))).errors
    assert [(p.raw, p.reason, p.name) for p in errors] == [
        (raw, "missing arguments @ arguments", "bash")
    ]


def test_kimi_the_arguments_start_at_the_first_argument_marker() -> None:
    """Pins that the id ends at the first ``<|tool_call_argument_begin|>``: the marker's text inside
    the arguments' JSON is part of a value."""
    value = f"x{kimi_k2.ARGUMENT_BEGIN}y"
    body = f"functions.bash:0{kimi_k2.ARGUMENT_BEGIN}{json.dumps({'a': value})}{kimi_k2.CALL_END}"
    turn = KimiK2Parser().parse(_kimi(body))
    assert turn.errors == ()
    assert turn.calls == (ToolCall(id="call_0", name="bash", arguments={"a": value}),)


def test_kimi_renders_arguments_as_written_not_escaped() -> None:
    """Pins that Kimi K2's render writes non-ASCII arguments as they are (as its template does)."""
    text = KimiK2Parser().render([ToolCall(id="c", name="bash", arguments={"a": "é"})])
    assert '{"a": "é"}' in text


# ------------------------------------------------------------------------------ granite

BASH_CALL = '{"name": "bash", "arguments": {"command": "ls"}}'


@pytest.mark.parametrize("marker", [granite.SPECIAL_MARKER, granite.TEXT_MARKER])
def test_granite_calls_start_at_the_first_marker_of_either_spelling(marker: str) -> None:
    """Pins where Granite's calls start: the first marker (either spelling, skipped whole, spaces
    after it allowed); a later marker in the text after the array is content."""
    text = f"Let me check.{marker} [{BASH_CALL}] Then {marker}more."
    turn = GraniteParser().parse(text)
    assert turn.calls == (ToolCall(id="call_0", name="bash", arguments={"command": "ls"}),)
    assert turn.errors == ()
    assert turn.content == f"Let me check.\nThen {marker}more."


@pytest.mark.parametrize(
    ("after", "raw", "reason"),
    [
        (BASH_CALL, f"<|tool_call|>{BASH_CALL}", "expected a JSON array of calls @ call"),
        ("I will run ls.", "<|tool_call|>I will run ls.", "expected a JSON array of calls @ call"),
        ("  \n", "<|tool_call|>", "truncated call @ call"),
    ],
)
def test_granite_anything_after_the_marker_but_an_array_is_one_problem(
    after: str, raw: str, reason: str
) -> None:
    """Pins Granite's refusal of what follows its marker when it is no array: one problem holding
    the text from the marker on (never content), truncated when nothing follows, else not an
    array; the text before the marker stays content."""
    turn = GraniteParser().parse(f"Checking.{granite.SPECIAL_MARKER}{after}")
    assert turn.content == "Checking."
    assert turn.calls == ()
    assert [(p.raw, p.reason) for p in turn.errors] == [(raw, reason)]


def test_granite_renders_the_array_after_the_content_as_written() -> None:
    """Pins Granite's render: no content by default, non-ASCII arguments not escaped."""
    text = GraniteParser().render([ToolCall(id="c", name="bash", arguments={"a": "é"})])
    assert text == '<|tool_call|>[{"name": "bash", "arguments": {"a": "é"}}]'


# ------------------------------------------------------------------ hermes: markup in arguments

_MARKUP = '{"name": "bash", "arguments": {"command": "echo \'</tool_call>\' > f"}}'


@pytest.mark.parametrize(
    ("text", "start", "expected"),
    [
        ("<tool_call>" + '  {"a": 1}  ' + "</tool_call>", 11, 35),  # blanks on both sides
        ("<tool_call>[1]</tool_call>", 11, -1),  # not an object
        ("{ [1]</tool_call>", 1, -1),  # the object must start at the body, not before it
        ('x<tool_call>{"a": 1}</tool_call>', 12, 32),  # decoded from the body's start
        ('<tool_call>{"a": </tool_call>', 11, -1),  # broken JSON
        ('</tool_call>{"a": 1} x', 12, -1),  # not followed by the closer
        ("<tool_call>" + "{" * 3000 + "</tool_call>", 11, -1),  # too deep to decode
    ],
)
def test_hermes_a_json_block_ends_after_its_closer_or_is_not_one(
    text: str, start: int, expected: int
) -> None:
    """Pins ``_json_block_end``: one JSON object after blanks, then blanks and the closer."""
    assert _json_block_end(text, start) == expected


@pytest.mark.parametrize("lead", ["", " ", "Sure.\n"])
def test_hermes_markup_inside_a_strings_json_is_text_wherever_the_call_starts(lead: str) -> None:
    """Pins the whole-JSON pass of ``read_calls``: a closer inside an argument string neither
    ends the call nor leaves its tail in the content, with the call at index 0, 1 or later."""
    turn = HermesParser().parse(f"{lead}<tool_call>{_MARKUP}</tool_call>")
    assert turn.errors == ()
    assert [c.arguments for c in turn.calls] == [{"command": "echo '</tool_call>' > f"}]
    assert turn.content == lead.strip()


def test_hermes_two_whole_calls_then_a_broken_one_are_read_in_order() -> None:
    text = (
        f"<tool_call>{_MARKUP}</tool_call>\n<tool_call>{_MARKUP}</tool_call>\n"
        '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>'
    )
    turn = HermesParser().parse(text)
    assert len(turn.calls) == 2
    assert [p.index for p in turn.errors] == [2]


def test_hermes_a_whole_block_that_is_no_call_keeps_its_text_as_the_problems_raw() -> None:
    block = '<tool_call>{"name": 5, "arguments": {}}</tool_call>'
    turn = HermesParser().parse(block)
    assert turn.calls == ()
    (problem,) = turn.errors
    assert problem.raw == block
