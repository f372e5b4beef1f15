"""Decisions of the reading steps every parser family shares (``tool_parsers.base`` and
``tool_parsers.family``), pinned one at a time where the families' own tests reach them only in
part (found by mutation testing). Each test's docstring names the decision it pins."""

from __future__ import annotations

import pytest

from trajcore.domain.json_values import MAX_DEPTH
from trajcore.domain.tool_parsers.base import (
    Block,
    JSONFault,
    Marker,
    TurnBuilder,
    describe_json_fault,
    distinct_ids,
    fault_part,
    join_content,
    load_json,
    load_json_prefix,
    name_in_broken_json,
    scan_blocks,
    skip_space,
    split_reasoning,
    value_extent,
)
from trajcore.domain.tool_parsers.family import (
    Sections,
    read_json_arguments,
    read_json_object,
    section_text,
)
from trajcore.domain.tool_parsers.hermes import HermesParser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn, ParseProblem

BASH = ToolSpec(
    name="bash",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
)

# ------------------------------------------------------------------------------------ reasoning


def test_reasoning_is_the_think_block_wherever_it_opens() -> None:
    """Pins that a think block opening at the very start of the text is found (an opener at
    index 0 counts), and that the text around the block is the rest."""
    assert split_reasoning("<think> r </think>b") == ("r", "b")
    assert split_reasoning("a<think> r </think>b") == ("r", "ab")


def test_without_an_opener_everything_before_the_closer_is_reasoning() -> None:
    """Pins the template-opened think block: only ``</think>`` in the completion, everything
    before it is reasoning, the text after it the rest."""
    assert split_reasoning("a r </think> b") == ("a r", " b")


def test_a_closer_at_the_start_closes_an_empty_think_block() -> None:
    """Pins that a ``</think>`` at index 0 is a closer (an empty block: no reasoning), so a later
    ``<think>`` without its own closer is not taken for reasoning."""
    assert split_reasoning("</think>a<think>b") == (None, "a<think>b")


def test_an_unclosed_think_block_makes_the_rest_of_the_text_reasoning() -> None:
    """Pins the cut-off think block: from ``<think>`` on, all is reasoning; the text before it is
    the rest, also when the opener is the first thing in the text."""
    assert split_reasoning("a <think> r") == ("r", "a ")
    assert split_reasoning("<think> r") == ("r", "")


def test_text_without_reasoning_tags_is_left_whole() -> None:
    """Pins that a text with neither tag gives no reasoning and comes back unchanged (not
    stripped)."""
    assert split_reasoning(" x ") == (None, " x ")


def test_an_empty_think_block_is_no_reasoning() -> None:
    """Pins that reasoning is stripped and an empty or blank block gives ``None``."""
    assert split_reasoning("<think> \n</think>x") == (None, "x")


def test_the_first_closer_ends_reasoning_and_the_first_opener_before_it_starts_it() -> None:
    """Pins which tags split the reasoning when there are several: the first ``</think>`` ends
    it, and the first ``<think>`` before that starts it (later tags are text of the reasoning
    or of the rest); without a closer, the first ``<think>`` starts it."""
    assert split_reasoning("a</think>b</think>c") == ("a", "b</think>c")
    assert split_reasoning("x<think>a<think>b</think>c") == ("a<think>b", "xc")
    assert split_reasoning("x<think>a<think>b") == ("a<think>b", "x")


def test_reasoning_is_split_on_the_tags_the_family_gives() -> None:
    """Pins that ``split_reasoning`` uses the tags it is given, not ``<think>``."""
    text = "[THINK]r[/THINK]x<think>y</think>"
    assert split_reasoning(text, open_="[THINK]", close="[/THINK]") == ("r", "x<think>y</think>")
    assert split_reasoning("a[THINK]r", open_="[THINK]", close="[/THINK]") == ("r", "a")


# ----------------------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    "text",
    ["", "  \n", '{"a": ', '{"a": "b', '"', '"ab', "[1, [2]", '{"a": [1, {"b": "}"}'],
)
def test_json_that_stops_inside_a_value_is_truncated(text: str) -> None:
    """Pins what counts as cut off: empty text, an unclosed string (a lone quote too), or more
    brackets opened than closed (brackets inside strings not counted)."""
    assert load_json(text) == JSONFault(reason="truncated JSON")


@pytest.mark.parametrize("text", ['"ab\\"', '"\\"', '"ab\\"\\', '"a\\\\\\"'])
def test_a_top_level_string_cut_just_after_an_escaped_quote_is_truncated(text: str) -> None:
    """Pins that a string whose last character is an escaped quote (``"ab\\"``) is still open:
    the escaped quote does not close it, so the text is cut off, not invalid, also with nothing
    around the string to count brackets by."""
    assert load_json(text) == JSONFault(reason="truncated JSON")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1 2]", "invalid JSON (Expecting ',' delimiter at char 3)"),
        ('{"a": 1}}', "invalid JSON (Extra data at char 8)"),
        ('"a" "b"', "invalid JSON (Extra data at char 4)"),
        ("x", "invalid JSON (Expecting value at char 0)"),
        ("NaN", "invalid JSON (NaN is not allowed)"),
        ("[-Infinity]", "invalid JSON (-Infinity is not allowed)"),
    ],
)
def test_json_that_is_complete_but_wrong_is_invalid_with_the_decoders_words(
    text: str, reason: str
) -> None:
    """Pins the invalid-JSON reason: the decoder's message and the character it stopped at, and
    NaN and infinities refused by name; text whose brackets balance (or close more than they
    open) is not truncated."""
    assert load_json(text) == JSONFault(reason=reason)


def test_json_nested_too_deeply_is_invalid_saying_so() -> None:
    """Pins the reason for JSON deeper than the decoder's recursion limit."""
    assert load_json("[" * 100_000 + "]" * 100_000) == JSONFault(
        reason="invalid JSON (nested too deeply)"
    )
    assert describe_json_fault("[]", RecursionError()) == JSONFault(
        reason="invalid JSON (nested too deeply)"
    )


def test_a_fault_is_truncated_exactly_when_its_reason_says_so() -> None:
    """Pins ``JSONFault.truncated``: only the truncated reason."""
    assert JSONFault(reason="truncated JSON").truncated
    assert not JSONFault(reason="invalid JSON (x)").truncated


def test_a_json_prefix_decodes_one_value_and_says_where_it_ends() -> None:
    """Pins ``load_json_prefix``: the value starting at the index given and the index after it;
    ``None`` when no value decodes there."""
    assert load_json_prefix('ab{"x": 1} tail', 2) == ({"x": 1}, 10)
    assert load_json_prefix('{"x": ', 0) is None
    assert load_json_prefix("NaN", 0) is None


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("{} x", 0, 2),
        ('x{"a": [1, {"b": "}"}]} tail', 1, 23),
        ("[[{}]", 2, 4),
        ('{"a": 1; "b": 2}', 0, 7),
        ('{"a": ";"} x', 0, 10),
        ('{"a": "b', 0, 8),
        ('{"a": [1]', 0, 9),
        ('{"a": ""}; x', 0, 9),
        ('[""]', 0, 4),
    ],
)
def test_a_values_extent_ends_at_its_balancing_bracket_or_where_it_breaks(
    text: str, start: int, end: int
) -> None:
    """Pins ``value_extent``: the value starting at ``start`` (brackets before it not counted)
    ends after the bracket that balances it, at a ``;`` outside its strings, or at the end of the
    text when a string or a bracket never closes."""
    assert value_extent(text, start) == end


def test_the_name_of_a_broken_call_is_read_stripped_when_there_is_one() -> None:
    """Pins ``name_in_broken_json``: the ``"name"`` value, stripped; none when it is blank or
    absent."""
    assert name_in_broken_json('{"name": " bash ", "arguments": {') == "bash"
    assert name_in_broken_json('{"name": "  ", "arguments": {') is None
    assert name_in_broken_json('{"arguments": {') is None


@pytest.mark.parametrize(
    ("text", "key", "part"),
    [
        ('{"name": "bash", "argu', "arguments", "arguments"),
        ('{"arguments": {"a"', "arguments", "arguments"),
        ('{"parameters": {"a"', "parameters", "parameters"),
        ('{"arguments": {"a"', "parameters", "call"),
        ('{"name": "ba', "arguments", "name"),
        ('{"nam', "arguments", "call"),
    ],
)
def test_a_json_fault_lies_in_the_furthest_part_of_the_call_reached(
    text: str, key: str, part: str
) -> None:
    """Pins ``fault_part``: the arguments (under the family's own key) once their key is reached
    or the name is complete, the name once its key is reached, else the call."""
    assert fault_part(text, key) == part


# -------------------------------------------------------------------------------------- markers


def test_a_marker_answers_its_next_occurrence_at_or_after_each_position() -> None:
    """Pins ``Marker.next_at``: the first index at or after the position asked, an occurrence at
    index 0 included, and the text's length once there is none."""
    marker = Marker("-a-b", "-")
    assert [marker.next_at(p) for p in (0, 0, 1, 2, 3, 4)] == [0, 0, 2, 2, 4, 4]
    assert Marker("abc", "-").next_at(0) == 3


def test_blocks_are_cut_at_their_closers_and_unclosed_ones_at_the_next_opener() -> None:
    """Pins ``scan_blocks``: the plain text around blocks (stray closers kept in it), a closed
    block with its markers in ``raw``, and a block with no closer ending at the next opener or
    at the end of the text."""
    assert scan_blocks("a</b>c<b>x</b>d", "<b>", "</b>") == [
        "a</b>c",
        Block(body="x", raw="<b>x</b>", closed=True),
        "d",
    ]
    assert scan_blocks("<b>x<b>y", "<b>", "</b>") == [
        "",
        Block(body="x", raw="<b>x", closed=False),
        "",
        Block(body="y", raw="<b>y", closed=False),
        "",
    ]


def test_an_unclosed_block_ends_at_the_first_of_its_other_ends_which_stays_in_the_text() -> None:
    """Pins ``scan_blocks``' ``also_ends``: a block with no closer before one of them ends at the
    first, and that marker is kept in the plain text after the block."""
    pieces = scan_blocks("<b>x<f>y<e>z</b>", "<b>", "</b>", also_ends=("<e>", "<f>"))
    assert pieces == ["", Block(body="x", raw="<b>x", closed=False), "<f>y<e>z</b>"]


def test_a_text_without_an_opener_is_one_plain_segment() -> None:
    """Pins that ``scan_blocks`` gives a text with no opener back whole, stray closers and
    other ends in it."""
    assert scan_blocks("a</b>c<e>", "<b>", "</b>", also_ends=("<e>",)) == ["a</b>c<e>"]


def test_an_opener_that_starts_inside_a_closer_opens_no_block() -> None:
    """Pins that ``scan_blocks`` looks for the next opener after a closed block's closer: an
    opener whose text begins inside that closer is part of the closer, not a new block."""
    assert scan_blocks("ab1xab", "ab", "xa") == [
        "",
        Block(body="1", raw="ab1xa", closed=True),
        "b",
    ]
    assert scan_blocks("ab1xab2ab3", "ab", "xa") == [
        "",
        Block(body="1", raw="ab1xa", closed=True),
        "b2",
        Block(body="3", raw="ab3", closed=False),
        "",
    ]


def test_each_of_several_other_ends_is_found_again_after_the_scan_passes_it() -> None:
    """Pins that ``scan_blocks`` finds each of ``also_ends`` again once the scan is past it: an
    unclosed block ends at the first of them after its opener, block after block."""
    pieces = scan_blocks("<b>x<e>1<b>y<f>2<b>z<e>3", "<b>", "</b>", also_ends=("<e>", "<f>"))
    assert pieces == [
        "",
        Block(body="x", raw="<b>x", closed=False),
        "<e>1",
        Block(body="y", raw="<b>y", closed=False),
        "<f>2",
        Block(body="z", raw="<b>z", closed=False),
        "<e>3",
    ]


def test_skip_space_stops_at_the_first_non_space_or_the_end() -> None:
    """Pins ``skip_space``: from the position given, past whitespace of any kind."""
    assert skip_space(" \n\tx ", 0) == 3
    assert skip_space("a  b", 1) == 3
    assert skip_space("a  ", 1) == 3


def test_content_is_the_stripped_non_empty_segments_one_per_line() -> None:
    """Pins ``join_content``: each segment stripped, blank ones left out, joined by newlines."""
    assert join_content(["  a ", "", " \n", "b\n", " c d "]) == "a\nb\nc d"


# ---------------------------------------------------------------------------------- turn builder


def _builder(tools: list[ToolSpec] | None = None) -> TurnBuilder:
    return TurnBuilder.start(tools, "t")


def test_a_generated_id_skips_ids_the_model_took_with_a_counter_from_two() -> None:
    """Pins the generated id when the model already wrote it for an earlier call: ``_2``, then
    ``_3``, appended."""
    builder = _builder()
    builder.accept("r0", "bash", {}, call_id="t_2")
    builder.accept("r1", "bash", {}, call_id="t_2_2")
    builder.accept("r2", "bash", {})
    assert [c.id for c in builder.calls] == ["t_2", "t_2_2", "t_2_3"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (None, "missing name @ name"),
        ("", "missing name @ name"),
        ("  ", "missing name @ name"),
        (7, "expected string, got integer @ name"),
        (["bash"], "expected string, got array @ name"),
        ("a b", "invalid tool name 'a b' (1-64 of [A-Za-z0-9_.-]) @ name"),
        ("x" * 100, f"invalid tool name {'x' * 80!r} (1-64 of [A-Za-z0-9_.-]) @ name"),
    ],
)
def test_a_call_name_is_refused_with_the_reason_it_breaks(name: object, reason: str) -> None:
    """Pins the reasons for a name that is no tool name (absent or blank, not a string, or
    breaking the name rule, quoted up to 80 characters), and that such a problem names no
    tool."""
    builder = _builder()
    builder.accept("raw", name, {})
    assert builder.problems == [ParseProblem(index=0, raw="raw", reason=reason, call_id="t_0")]


def test_a_call_name_is_stripped() -> None:
    """Pins that whitespace around a call's name is not part of it."""
    builder = _builder()
    builder.accept("raw", " bash\n", {})
    assert builder.calls == [ToolCall(id="t_0", name="bash", arguments={})]


@pytest.mark.parametrize(
    ("call_id", "reason"),
    [
        (7, "expected string, got integer @ id"),
        ("", "invalid call id '' (1-64 of [A-Za-z0-9_.-]) @ id"),
        ("a b", "invalid call id 'a b' (1-64 of [A-Za-z0-9_.-]) @ id"),
        ("x" * 100, f"invalid call id {'x' * 80!r} (1-64 of [A-Za-z0-9_.-]) @ id"),
    ],
)
def test_a_call_id_the_model_wrote_is_refused_with_the_reason_it_breaks(
    call_id: object, reason: str
) -> None:
    """Pins the reasons for a model-written id that breaks the id rule (not a string, or not
    1-64 of the id characters, quoted up to 80 characters); the problem keeps the tool's name
    and gets a generated id."""
    builder = _builder()
    builder.accept("raw", "bash", {}, call_id=call_id)
    assert builder.problems == [
        ParseProblem(index=0, raw="raw", reason=reason, name="bash", call_id="t_0")
    ]


def test_arguments_that_are_no_object_are_refused_under_the_familys_key() -> None:
    """Pins the reason for arguments that are not a JSON object (named by the family's key), and
    that the problem keeps the name and the id the model wrote."""
    builder = _builder()
    builder.accept("raw", "bash", "ls", arguments_key="parameters", call_id="abc")
    assert builder.problems == [
        ParseProblem(
            index=0,
            raw="raw",
            reason="expected a JSON object, got string @ parameters",
            name="bash",
            call_id="abc",
        )
    ]


def test_arguments_that_miss_the_schema_are_refused_at_each_path_under_the_familys_key() -> None:
    """Pins the schema check's reason: every problem ``reason @ <key>.<path>``, joined by
    ``"; "``; the problem keeps the name and the id the model wrote."""
    builder = _builder([BASH])
    builder.accept("raw", "bash", {"timeout": "x"}, arguments_key="parameters", call_id="abc")
    (problem,) = builder.problems
    assert problem.reason == (
        "required @ parameters.command; expected integer, got string @ parameters.timeout"
    )
    assert (problem.name, problem.call_id) == ("bash", "abc")


def test_an_unknown_tool_keeps_its_name_and_model_id() -> None:
    """Pins the reason for a tool not offered, and that the problem keeps the name and id."""
    builder = _builder([BASH])
    builder.accept("raw", "rm", {}, call_id="abc")
    assert builder.problems == [
        ParseProblem(
            index=0, raw="raw", reason="unknown tool 'rm' @ name", name="rm", call_id="abc"
        )
    ]


def test_arguments_no_plain_json_are_refused_at_their_path_under_the_familys_key() -> None:
    """Pins the refusal of arguments the call itself refuses (a non-finite number): the
    reason, then its path under the family's key; the name and model id kept."""
    builder = _builder()
    builder.accept("raw", "bash", {"x": [float("inf")]}, arguments_key="parameters", call_id="c")
    assert builder.problems == [
        ParseProblem(
            index=0,
            raw="raw",
            reason="non-finite number inf @ parameters.x[0]",
            name="bash",
            call_id="c",
        )
    ]


def test_a_key_holding_an_at_sign_stays_whole_in_a_refusals_path() -> None:
    """Pins where the path of a refusal by the call itself starts: at the first ``" @ $"``, so
    a key holding ``" @ "`` stays whole in the path, and the reason keeps none of it (the split
    at the last ``" @ "`` named ``$.a`` inside the reason and the family's key as the path)."""
    builder = _builder()
    builder.accept("raw", "bash", {"a @ b": [float("inf")]}, arguments_key="parameters")
    assert [p.reason for p in builder.problems] == ["non-finite number inf @ parameters.a @ b[0]"]
    turn = HermesParser().parse('<tool_call>{"name": "bash", "arguments": {"x @ $y": 1e400}}')
    assert [p.reason for p in turn.errors] == ["non-finite number inf @ arguments.x @ $y"]


def test_arguments_nested_too_deeply_for_the_schema_check_are_refused_saying_so() -> None:
    """Pins the refusal of arguments nested past the JSON trees' depth (``MAX_DEPTH``), far
    past what a walk of them could recurse through: refused for their depth under the
    family's key, where the level past the bound begins, with a schema to check or without."""
    deep: object = []
    for _ in range(100_000):
        deep = [deep]
    reason = f"nested deeper than {MAX_DEPTH} arrays and objects @ parameters.x{'[0]' * 99}"
    spec = ToolSpec(name="t", parameters={"type": "object", "properties": {"x": {}}})
    for tools in ([spec], None):
        builder = _builder(tools)
        builder.accept("raw", "t", {"x": deep}, arguments_key="parameters", call_id="c")
        assert builder.problems == [
            ParseProblem(index=0, raw="raw", reason=reason, name="t", call_id="c")
        ]


def test_a_refused_call_takes_its_index_and_id_so_the_next_call_gets_the_next_ones() -> None:
    """Pins that refusing a call uses up its index and generated id."""
    builder = _builder()
    builder.refuse("bad", "truncated JSON @ call", name="")
    builder.accept("ok", "bash", {})
    assert builder.problems == [
        ParseProblem(index=0, raw="bad", reason="truncated JSON @ call", call_id="t_0")
    ]
    assert builder.calls == [ToolCall(id="t_1", name="bash", arguments={})]
    assert builder.turn(content="c", reasoning=None) == ParsedTurn(
        content="c", calls=builder.calls, errors=builder.problems
    )


def test_a_turn_without_calls_keeps_its_reasoning_and_content() -> None:
    """Pins that ``parse`` keeps the reasoning and strips the content when no call markup is
    there (the fast path)."""
    assert HermesParser().parse("<think>r</think>  hi \n") == ParsedTurn(
        content="hi", reasoning="r"
    )


# ---------------------------------------------------------------------------------- distinct ids


def _turn(call_ids: list[str], problem_ids: tuple[str, ...] = ()) -> ParsedTurn:
    return ParsedTurn(
        calls=[ToolCall(id=i, name="a") for i in call_ids],
        errors=[
            ParseProblem(index=len(call_ids) + n, raw="r", reason="x @ call", call_id=i)
            for n, i in enumerate(problem_ids)
        ],
    )


def _ids(turn: ParsedTurn) -> list[str | None]:
    return [c.id for c in turn.calls] + [p.call_id for p in turn.errors]


def test_an_id_used_in_an_earlier_turn_gets_the_suffix_then_a_counter_from_two() -> None:
    """Pins the renamed id: ``<id>-<suffix>``, and when that is taken by an earlier turn,
    ``-2``, ``-3``, ... after it (the first free one)."""
    used = {"a", "b", "b-7", "c", "c-7", "c-7-2"}
    turn = distinct_ids(_turn(["a", "b", "c"]), used, suffix="7")
    assert _ids(turn) == ["a-7", "b-7-2", "c-7-3"]
    assert used == {"a", "b", "b-7", "c", "c-7", "c-7-2", "a-7", "b-7-2", "c-7-3"}


def test_a_renamed_id_passes_over_the_ids_of_its_own_turn() -> None:
    """Pins that a renamed id is not one another call of the same turn keeps (that call's id is
    new, so it stays)."""
    turn = distinct_ids(_turn(["a", "a-2"]), {"a"}, suffix="2")
    assert _ids(turn) == ["a-2-2", "a-2"]


def test_a_renamed_id_passes_over_the_ids_given_earlier_in_its_turn() -> None:
    """Pins that two renamed ids of one turn never meet: the second passes over the first."""
    turn = distinct_ids(_turn(["a", "a-2"]), {"a", "a-2"}, suffix="2")
    assert _ids(turn) == ["a-2-2", "a-2-2-2"]


def test_the_ids_of_problems_are_made_distinct_too() -> None:
    """Pins that a problem's id used in an earlier turn is renamed like a call's, and recorded as
    used."""
    used = {"p"}
    turn = distinct_ids(_turn(["a"], ("p",)), used, suffix="3")
    assert _ids(turn) == ["a", "p-3"]
    assert turn.errors[0].index == 1
    assert used == {"p", "a", "p-3"}


# ------------------------------------------------------------------------ family reading steps

SECTIONS = Sections(begin="<B>", end="<E>", call_begin="<C>", call_end="</C>")


def test_a_plain_segments_section_markers_are_removed_and_its_text_kept() -> None:
    """Pins ``section_text`` outside the last segment: every section's markers removed (stray
    ends before the first section too, and begins after it), the text inside and around each
    section kept whole, whitespace included, and nothing refused."""
    builder = _builder()
    text = section_text(builder, "a<E>b<B> x y<E>c<E>d<B>z", SECTIONS, last=False)
    assert text == "ab x ycdz"
    assert builder.problems == []
    assert section_text(builder, "a<E>b", SECTIONS, last=False) == "ab"


def test_a_section_with_text_but_no_call_in_the_last_segment_is_one_problem() -> None:
    """Pins ``section_text`` in the last segment: a section holding text but no call is refused,
    ``missing <call_begin>`` when it is closed and ``truncated call`` when the text ends inside
    it, with the section as written for its text (not the content); a blank section is not (its
    blank stays in the content)."""
    builder = _builder()
    text = section_text(builder, "a<B> x <E>b<B> <E>c<B>y", SECTIONS, last=True)
    assert text == "ab c"
    assert builder.problems == [
        ParseProblem(index=0, raw="<B> x <E>", reason="missing <C> @ call", call_id="t_0"),
        ParseProblem(index=1, raw="<B>y", reason="truncated call @ call", call_id="t_1"),
    ]


def test_a_call_read_from_a_json_object_keeps_its_text_when_refused() -> None:
    """Pins that ``read_json_object`` gives the call as written (``raw``, not the JSON text) to
    the problem of a decoded value that is no call."""
    builder = _builder()
    read_json_object(builder, "RAW", "[1]", key="arguments", fallback="x", fault_key=str)
    assert builder.problems == [
        ParseProblem(
            index=0, raw="RAW", reason="expected a JSON object, got array @ call", call_id="t_0"
        )
    ]


def test_arguments_that_do_not_decode_keep_the_calls_text_and_name() -> None:
    """Pins ``read_json_arguments``' refusal of JSON that does not decode: the fault ``@
    arguments``, the call as written and the name the markup gave."""
    builder = _builder()
    read_json_arguments(builder, "RAW", "bash", '{"a": ', closed=True)
    assert builder.problems == [
        ParseProblem(
            index=0, raw="RAW", reason="truncated JSON @ arguments", name="bash", call_id="t_0"
        )
    ]
