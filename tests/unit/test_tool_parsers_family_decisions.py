"""Decisions of the GLM-4.5, Mistral, Llama 3 JSON and DeepSeek parsers that their family tests
check only in part (found by mutation testing): each test's docstring names the decision it
pins and the family it belongs to."""

from __future__ import annotations

import pytest

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.tool_parsers import deepseek_v3
from trajcore.domain.tool_parsers.deepseek_v3 import DeepSeekV3Parser
from trajcore.domain.tool_parsers.glm45 import Glm45Parser
from trajcore.domain.tool_parsers.llama3_json import Llama3JsonParser
from trajcore.domain.tool_parsers.mistral import MistralParser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn, ParseProblem

# ------------------------------------------------------------------------------ glm45

COUNTS = ToolSpec(
    name="count",
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}, "opts": {"type": "object"}},
    },
)


def _glm(body: str, *, closed: bool = True) -> str:
    return "<tool_call>" + body + ("</tool_call>" if closed else "")


def _glm_problems(text: str) -> list[tuple[str, str | None, str]]:
    turn = Glm45Parser().parse(text)
    assert turn.calls == ()
    return [(p.raw, p.name, p.reason) for p in turn.errors]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("bash\n<arg_key>k", "missing </arg_key> @ arguments"),
        (
            "bash\n<arg_key>k<arg_key>j</arg_key><arg_value>v</arg_value>",
            "missing </arg_key> @ arguments",
        ),
        ("bash\n<arg_key>k<arg_value>v</arg_key>", "missing </arg_key> @ arguments"),
        (
            "bash\n<arg_key> </arg_key><arg_value>v</arg_value>",
            "missing parameter name @ arguments",
        ),
        ("bash\n<arg_key>k</arg_key>", "missing <arg_value> @ arguments.k"),
        ("bash\n<arg_key>k</arg_key>\nv", "missing <arg_value> @ arguments.k"),
        ("bash\n<arg_key>k</arg_key><arg_value>v", "missing </arg_value> @ arguments.k"),
        (
            "bash\n<arg_key>k</arg_key><arg_value>v</arg_value>" + "x" * 30,
            f"unexpected text {'x' * 24!r} @ arguments",
        ),
        ("bash\n<arg_k", "unexpected text '<arg_k' @ arguments"),
    ],
)
def test_glm45_a_closed_call_with_broken_pairs_is_refused_naming_the_fault(
    body: str, reason: str
) -> None:
    """Pins GLM-4.5's reason for each way a closed call's pairs break (a key not closed, or
    running into the next key or a value; an empty key; a key without a value, or a value not
    closed; other text, quoted up to 24 characters); the problem keeps the call and its name."""
    assert _glm_problems(_glm(body)) == [(_glm(body), "bash", reason)]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("bash\n<arg_key>k", "truncated call @ arguments"),
        ("bash\n<arg_k", "truncated call @ arguments"),
        ("bash\n<arg_key>k</arg_key>\n", "truncated call @ arguments.k"),
        ("bash\n<arg_key>k</arg_key><arg_value>v", "truncated call @ arguments.k"),
        ("bash\n<arg_key>k</arg_key><arg_value>v</arg_value>\n", "truncated call @ arguments"),
        (
            "bash\n<arg_key>k</arg_key><arg_value>v</arg_value><arg_key>j</arg_key>",
            "truncated call @ arguments.j",
        ),
        ("bash", "truncated call @ arguments"),
    ],
)
def test_glm45_a_call_cut_off_is_truncated_where_it_stopped(body: str, reason: str) -> None:
    """Pins GLM-4.5's reason for a call the text ends in: truncated, at the pair it stopped in
    (a part of ``<arg_key>`` too), and never run half-read even when its pairs are whole."""
    assert _glm_problems(_glm(body, closed=False)) == [(_glm(body, closed=False), "bash", reason)]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<tool_call>", "truncated call @ name"),
        ("<tool_call>  ", "truncated call @ name"),
        ("<tool_call>\n<arg_key>k</arg_key>", "missing name @ name"),
        ("<tool_call><arg_key>k</arg_key></tool_call>", "missing name @ name"),
        ("<tool_call>a b\n</tool_call>", "invalid tool name 'a b' (1-64 of [A-Za-z0-9_.-]) @ name"),
        (
            f"<tool_call>{'x' * 100}\n</tool_call>",
            f"invalid tool name {'x' * 80!r} (1-64 of [A-Za-z0-9_.-]) @ name",
        ),
    ],
)
def test_glm45_the_name_is_refused_missing_truncated_or_invalid(text: str, reason: str) -> None:
    """Pins GLM-4.5's name rules: no name is truncated only when the text ends in it (a newline
    or a tag after the name's place makes it missing), and a name that is no tool name is
    refused quoted up to 80 characters; such a problem names no tool."""
    assert _glm_problems(text) == [(text, None, reason)]


def test_glm45_the_name_ends_at_a_newline_or_a_tag_and_values_are_verbatim() -> None:
    """Pins where GLM-4.5's name ends (the first newline or ``<``, whichever comes first,
    leading space skipped) and that a value is the text between its tags, unstripped, when
    nothing types it."""
    text = _glm("  bash<arg_key> k </arg_key>\n<arg_value> a\nb </arg_value>\n")
    assert Glm45Parser().parse(text).calls == (
        ToolCall(id="call_0", name="bash", arguments={"k": " a\nb "}),
    )
    assert Glm45Parser().parse(_glm("ls\n")).calls == (ToolCall(id="call_0", name="ls"),)


def test_glm45_a_repeated_key_is_refused_once_its_value_is_read() -> None:
    """Pins GLM-4.5's refusal of a repeated key, and that it is found after the value is read
    (a repeated key without a value is refused for the missing value)."""
    pair = "<arg_key>k</arg_key><arg_value>v</arg_value>"
    assert _glm_problems(_glm("bash\n" + pair + pair)) == [
        (_glm("bash\n" + pair + pair), "bash", "repeated parameter @ arguments.k")
    ]
    again = "bash\n" + pair + "<arg_key>k</arg_key>"
    assert _glm_problems(_glm(again)) == [
        (_glm(again), "bash", "missing <arg_value> @ arguments.k")
    ]


def test_glm45_values_are_typed_by_the_tools_schema_and_only_by_it() -> None:
    """Pins GLM-4.5's typing: a key the schema names gets its type, a key it does not name stays
    text, a tool without a spec or without properties keeps text; broken JSON where an object
    is expected is a problem naming the key, with the tool's name."""
    pairs = (
        "<arg_key>n</arg_key><arg_value>5</arg_value><arg_key>x</arg_key><arg_value>5</arg_value>"
    )
    text = _glm("count\n" + pairs)
    assert Glm45Parser().parse(text, tools=[COUNTS]).calls == (
        ToolCall(id="call_0", name="count", arguments={"n": 5, "x": "5"}),
    )
    assert Glm45Parser().parse(text).calls[0].arguments == {"n": "5", "x": "5"}
    bare = ToolSpec(name="count", parameters={"type": "object"})
    assert Glm45Parser().parse(text, tools=[bare]).calls == (
        ToolCall(id="call_0", name="count", arguments={"n": "5", "x": "5"}),
    )
    broken = _glm('count\n<arg_key>opts</arg_key><arg_value>{"a": </arg_value>')
    turn = Glm45Parser().parse(broken, tools=[COUNTS])
    assert turn.errors == (
        ParseProblem(
            index=0,
            raw=broken,
            reason="truncated JSON @ arguments.opts",
            name="count",
            call_id="call_0",
        ),
    )


def test_glm45_a_key_not_closed_before_the_next_key_is_missing_its_closer() -> None:
    """Pins that GLM-4.5 looks for the next ``<arg_key>`` after a key's start (the first one,
    not any later one): a key that runs into it lacks its ``</arg_key>``."""
    pairs = (
        "<arg_key>k<arg_key>j</arg_key><arg_value>v</arg_value>"
        "<arg_key>z</arg_key><arg_value>w</arg_value>"
    )
    assert _glm_problems(_glm("bash\n" + pairs)) == [
        (_glm("bash\n" + pairs), "bash", "missing </arg_key> @ arguments")
    ]


def test_glm45_a_name_after_leading_newlines_is_read() -> None:
    """Pins that GLM-4.5's name starts after the whitespace that opens the body (newlines
    included), so a newline there does not end an empty name."""
    text = _glm("\n bash\n<arg_key>k</arg_key><arg_value>v</arg_value>\n")
    assert Glm45Parser().parse(text).calls == (
        ToolCall(id="call_0", name="bash", arguments={"k": "v"}),
    )


def test_glm45_a_values_schema_reference_resolves_against_the_tools_parameters() -> None:
    """Pins that GLM-4.5 types a value whose schema is a ``$ref`` by resolving it in the tool's
    parameters (where ``$defs`` live)."""
    spec = ToolSpec(
        name="count",
        validator=JSONSchemaValidator(),
        parameters={
            "type": "object",
            "$defs": {"N": {"type": "integer"}},
            "properties": {"n": {"$ref": "#/$defs/N"}},
        },
    )
    text = _glm("count\n<arg_key>n</arg_key><arg_value>5</arg_value>")
    assert Glm45Parser().parse(text, tools=[spec]).calls == (
        ToolCall(id="call_0", name="count", arguments={"n": 5}),
    )


def test_glm45_a_call_the_tool_check_refuses_keeps_its_text() -> None:
    """Pins that a GLM-4.5 call read whole but refused by the tool check keeps its text."""
    text = _glm("nope\n<arg_key>k</arg_key><arg_value>v</arg_value>")
    turn = Glm45Parser().parse(text, tools=[COUNTS])
    assert [(p.raw, p.name, p.reason) for p in turn.errors] == [
        (text, "nope", "unknown tool 'nope' @ name")
    ]


def test_glm45_renders_values_that_are_no_strings_as_json_not_escaped() -> None:
    """Pins that GLM-4.5's render writes a non-string value as JSON with non-ASCII as it is."""
    text = Glm45Parser().render([ToolCall(id="c", name="a", arguments={"k": ["é"]})])
    assert '<arg_value>["é"]</arg_value>' in text


# ------------------------------------------------------------------------------ llama3_json


def test_llama3_a_piece_that_is_no_object_is_quoted_up_to_24_characters() -> None:
    """Pins Llama 3's refusal of a piece that does not start with ``{``: it runs to the next
    ``;`` (or the end), is kept whole in the problem, and the reason quotes 24 characters."""
    garbage = "x" * 30 + "  "
    turn = Llama3JsonParser().parse(f'<|python_tag|>{garbage}; {{"name": "a"}}')
    assert [(p.raw, p.reason) for p in turn.errors] == [
        ("x" * 30, f"expected a JSON object, got {'x' * 24!r} @ call")
    ]
    assert turn.calls == (ToolCall(id="call_1", name="a"),)
    tail = Llama3JsonParser().parse('<|python_tag|>{"name": "a"}; oops')
    assert [(p.raw, p.reason) for p in tail.errors] == [
        ("oops", "expected a JSON object, got 'oops' @ call")
    ]


@pytest.mark.parametrize(
    ("piece", "reason"),
    [
        ('{"name": "a", "arguments": {"x": ', "truncated JSON @ arguments"),
        ('{"name": "a", "parameters": {"x": ', "truncated JSON @ parameters"),
        ('{"name": "a", "arguments": 1, "parameters": {"x": ', "truncated JSON @ parameters"),
        ('{"name": "a"', "truncated JSON @ parameters"),
    ],
)
def test_llama3_a_broken_call_is_at_fault_under_the_key_it_wrote(piece: str, reason: str) -> None:
    """Pins the key a broken Llama 3 call's fault is named under: ``arguments`` when the call
    wrote that key and not ``parameters``, else ``parameters``."""
    turn = Llama3JsonParser().parse("<|python_tag|>" + piece)
    assert [(p.name, p.reason) for p in turn.errors] == [("a", reason)]


def test_llama3_a_separator_or_tag_ending_the_text_ends_the_calls() -> None:
    """Pins that Llama 3's calls end at the end of the text after a last ``;`` or tag (nothing
    more is attempted there)."""
    for end in (";", "; ", "<|python_tag|>"):
        turn = Llama3JsonParser().parse('<|python_tag|>{"name": "a"}' + end)
        assert turn == ParsedTurn(calls=[ToolCall(id="call_0", name="a")])


def test_llama3_a_broken_call_keeps_its_piece_as_written() -> None:
    """Pins that a Llama 3 call whose JSON does not decode keeps its piece (to where it
    breaks) as the problem's text."""
    turn = Llama3JsonParser().parse('<|python_tag|>{"name": "a", "parameters": {"x": 1 2}}; x')
    assert [p.raw for p in turn.errors] == ['{"name": "a", "parameters": {"x": 1 2}}', "x"]


def test_llama3_a_refused_call_that_decodes_keeps_its_object_as_written() -> None:
    """Pins that a Llama 3 call whose JSON decodes but which is refused (an unknown tool, a
    name that is no string) keeps its object, as written and no more, as the problem's text."""
    text = '<|python_tag|>{"name": "b", "parameters": {}} ; {"name": 1}{"name": "a"}'
    turn = Llama3JsonParser().parse(text, tools=[ToolSpec(name="a")])
    assert [(p.raw, p.reason) for p in turn.errors] == [
        ('{"name": "b", "parameters": {}}', "unknown tool 'b' @ name"),
        ('{"name": 1}', "expected string, got integer @ name"),
    ]
    assert turn.calls == (ToolCall(id="call_2", name="a"),)


def test_llama3_calls_start_at_a_tag_or_an_opening_brace_only() -> None:
    """Pins when a Llama 3 text holds calls: a tag anywhere, or a ``{`` first (after spaces);
    content before the tag is kept, and text after the calls is content until a later tag."""
    for bare in (' \n{"name": "a"}', '{"name": "a"}'):
        assert Llama3JsonParser().parse(bare) == ParsedTurn(calls=[ToolCall(id="call_0", name="a")])
    turn = Llama3JsonParser().parse('So {"name": "a"} and <|python_tag|>{"name": "b"} done')
    assert turn.content == 'So {"name": "a"} and\ndone'
    assert turn.calls == (ToolCall(id="call_0", name="b"),)


def test_llama3_each_later_tag_in_the_content_starts_calls_again_in_order() -> None:
    """Pins that after the calls, content runs to the *next* ``<|python_tag|>``, not the last:
    every tagged run of calls is read, and the text between runs is content."""
    text = (
        'x <|python_tag|>{"name": "a"} mid <|python_tag|>{"name": "b"} more '
        '<|python_tag|>{"name": "c"} end'
    )
    turn = Llama3JsonParser().parse(text)
    assert [c.name for c in turn.calls] == ["a", "b", "c"]
    assert turn.content == "x\nmid\nmore\nend"


def test_llama3_renders_arguments_as_written_not_escaped() -> None:
    """Pins that Llama 3's render writes non-ASCII arguments as they are."""
    text = Llama3JsonParser().render([ToolCall(id="c", name="a", arguments={"x": "é"})])
    assert text == '<|python_tag|>{"name": "a", "parameters": {"x": "é"}}'


# ------------------------------------------------------------------------------ deepseek_v3


def _ds(inner: str, *, closed: bool = True) -> str:
    end = deepseek_v3.CALL_END + deepseek_v3.CALLS_END if closed else ""
    return deepseek_v3.CALLS_BEGIN + deepseek_v3.CALL_BEGIN + inner + end


def _ds_problems(text: str) -> list[tuple[str | None, str]]:
    turn = DeepSeekV3Parser().parse(text)
    assert turn.calls == ()
    return [(p.name, p.reason) for p in turn.errors]


@pytest.mark.parametrize(
    ("inner", "name"),
    [("bash", "bash"), ("bash<|tool", "bash"), ("func", None), ("function", None), ("", None)],
)
def test_deepseek_a_call_without_its_separator_names_the_tool_it_can(
    inner: str, name: str | None
) -> None:
    """Pins DeepSeek's refusal of a call without ``<|tool_sep|>``: missing when closed,
    truncated at the name when cut off; the name is the text before any ``<``, unless it is
    (the start of) the V3 type word ``function``."""
    sep = deepseek_v3.SEP
    assert _ds_problems(_ds(inner)) == [(name, f"missing {sep} @ call")]
    assert _ds_problems(_ds(inner, closed=False)) == [(name, "truncated call @ name")]


def test_deepseek_a_v3_call_cut_off_in_its_name_line_keeps_the_name_read() -> None:
    """Pins DeepSeek V3's refusal of a call whose name line has no end: truncated at the name,
    with what the name holds so far (none when blank)."""
    sep = deepseek_v3.SEP
    assert _ds_problems(_ds(f"function{sep} bash ", closed=False)) == [
        ("bash", "truncated call @ name")
    ]
    assert _ds_problems(_ds(f"function{sep} ", closed=False)) == [(None, "truncated call @ name")]


def test_deepseek_a_v3_call_reads_the_json_of_its_fence_or_after_its_name_line() -> None:
    """Pins where DeepSeek V3's arguments are: inside the ``json`` fence up to its last closing
    fence, or, without a fence, the text after the name line; a missing closing fence is
    tolerated."""
    sep = deepseek_v3.SEP
    prose = _ds(f'function{sep}bash\nnote ```json\n{{"a": 1}}\n```')
    assert DeepSeekV3Parser().parse(prose).calls == (
        ToolCall(id="call_0", name="bash", arguments={"a": 1}),
    )
    fenced = _ds(f'function{sep}bash\n```json\n{{"s": "```"}}\n```')
    assert DeepSeekV3Parser().parse(fenced).calls == (
        ToolCall(id="call_0", name="bash", arguments={"s": "```"}),
    )
    bare = _ds(f'function{sep}bash\n{{"a": 1}}')
    assert DeepSeekV3Parser().parse(bare).calls == (
        ToolCall(id="call_0", name="bash", arguments={"a": 1}),
    )
    open_fence = _ds(f'function{sep}bash\n```json\n{{"a": 1}}')
    assert DeepSeekV3Parser().parse(open_fence).calls == (
        ToolCall(id="call_0", name="bash", arguments={"a": 1}),
    )


def test_deepseek_function_before_json_is_a_v31_call_named_function() -> None:
    """Pins that the V3 form needs a name line: ``function`` followed by JSON is the V3.1 form
    of a tool named ``function``; a V3 name line that is blank is a missing name."""
    sep = deepseek_v3.SEP
    turn = DeepSeekV3Parser().parse(_ds(f'function{sep} {{"a": 1}}'))
    assert turn.calls == (ToolCall(id="call_0", name="function", arguments={"a": 1}),)
    blank = _ds(f"function{sep} \n```json\n{{}}\n```")
    assert _ds_problems(blank) == [(None, "missing name @ name")]
    assert _ds_problems(_ds(f" {sep}{{}}")) == [(None, "missing name @ name")]


def test_deepseek_a_cut_off_call_with_no_arguments_is_truncated_at_its_arguments() -> None:
    """Pins that empty arguments are truncated when the call was cut off (missing when it was
    closed), with the call's name."""
    sep = deepseek_v3.SEP
    assert _ds_problems(_ds(f"bash{sep} ", closed=False)) == [
        ("bash", "truncated call @ arguments")
    ]
    assert _ds_problems(_ds(f"bash{sep} ")) == [("bash", "missing arguments @ arguments")]


def test_deepseek_the_name_ends_at_the_first_separator() -> None:
    """Pins that a DeepSeek call's name ends at its first ``<|tool_sep|>``: the separator's
    text inside the arguments' JSON is part of a value."""
    sep = deepseek_v3.SEP
    turn = DeepSeekV3Parser().parse(_ds(f'bash{sep}{{"x": "{sep}"}}'))
    assert turn.calls == (ToolCall(id="call_0", name="bash", arguments={"x": sep}),)


def test_deepseek_a_refused_call_keeps_its_text() -> None:
    """Pins that every DeepSeek refusal keeps the call as written (V3 and V3.1): no separator
    (closed or cut off), a name line cut off, a blank name, bad arguments; and that a name
    without a separator ends at the first ``<``."""
    sep = deepseek_v3.SEP
    for inner, closed, name, reason in [
        ("bash<|x<|y", True, "bash", f"missing {sep} @ call"),
        ("bash", False, "bash", "truncated call @ name"),
        (f"function{sep}bash", False, "bash", "truncated call @ name"),
        (f"function{sep} \n```json\n{{}}\n```", True, None, "missing name @ name"),
        (
            f"function{sep}bash\n```json\n[1]\n```",
            True,
            "bash",
            "expected a JSON object, got array @ arguments",
        ),
        (f" {sep}{{}}", True, None, "missing name @ name"),
        (f"bash{sep}[1]", True, "bash", "expected a JSON object, got array @ arguments"),
    ]:
        text = _ds(inner, closed=closed)
        raw = deepseek_v3.CALL_BEGIN + inner + (deepseek_v3.CALL_END if closed else "")
        turn = DeepSeekV3Parser().parse(text)
        assert [(p.raw, p.name, p.reason) for p in turn.errors] == [(raw, name, reason)]


def test_deepseek_the_fence_is_the_first_one_and_may_close_at_once() -> None:
    """Pins that DeepSeek V3's arguments start after the first ``json`` fence (one inside the
    JSON is part of a value), and that a fence closed right after it opens holds no arguments
    (missing)."""
    sep = deepseek_v3.SEP
    turn = DeepSeekV3Parser().parse(_ds(f'function{sep}bash\n```json\n{{"s": "```json"}}\n```'))
    assert turn.calls == (ToolCall(id="call_0", name="bash", arguments={"s": "```json"}),)
    empty = _ds(f"function{sep}bash\n```json```")
    assert _ds_problems(empty) == [("bash", "missing arguments @ arguments")]


def test_deepseek_renders_arguments_as_written_not_escaped() -> None:
    """Pins that DeepSeek's render (both forms) writes non-ASCII arguments as they are, and
    writes the content alone when there are no calls."""
    calls = [ToolCall(id="c", name="a", arguments={"x": "é"})]
    assert '{"x": "é"}' in DeepSeekV3Parser().render(calls)
    assert '{"x": "é"}' in DeepSeekV3Parser(render_style="v31").render(calls)
    assert DeepSeekV3Parser().render([], content="hi") == "hi"


# ------------------------------------------------------------------------------ mistral


def test_mistral_reasoning_is_think_in_brackets_when_the_text_has_either_tag() -> None:
    """Pins Mistral's reasoning tags: ``[THINK]``/``[/THINK]`` when the text holds either (an
    unclosed ``[THINK]``, or a closer alone), else ``<think>``."""
    parser = MistralParser()
    assert parser.parse("a[THINK]r").reasoning == "r"
    assert parser.parse("r[/THINK]a") == ParsedTurn(content="a", reasoning="r")
    assert parser.parse("<think>r</think>a") == ParsedTurn(content="a", reasoning="r")


@pytest.mark.parametrize("head", ["bash[ARGS]", "bash"])
def test_mistral_an_array_inside_the_arguments_is_no_array_form(head: str) -> None:
    """Pins that a ``[{`` after ``[ARGS]`` or after a ``{`` is part of a named call's arguments,
    not the array form with stray text before it."""
    turn = MistralParser().parse(f'[TOOL_CALLS]{head}{{"x": [{{"y": 1}}]}}')
    assert turn.errors == ()
    assert turn.calls == (ToolCall(id="call_0", name="bash", arguments={"x": [{"y": 1}]}),)


def test_mistral_an_array_ends_at_its_bracket_or_at_text_that_continues_no_list() -> None:
    """Pins how Mistral's array ends: at ``]`` (text after it content, an empty array no call),
    at anything but ``,`` after an element (that text content), or at the end of the text after
    a complete element (no problem); spaces before the array are skipped."""
    parser = MistralParser()
    assert parser.parse("[TOOL_CALLS]  [ ] after") == ParsedTurn(content="after")
    turn = parser.parse('[TOOL_CALLS][{"name": "a"} then [TOOL_CALLS][{"name": "b"}')
    assert turn.calls == (ToolCall(id="call_0", name="a"), ToolCall(id="call_1", name="b"))
    assert turn.errors == ()
    assert turn.content == "then"


def test_mistral_a_broken_array_element_keeps_its_text_and_ends_the_array() -> None:
    """Pins Mistral's refusal of an element that does not decode: one problem holding the text
    from the element on, the part at fault and the name when it can be read; an element
    accepted keeps only its own text, as the raw of its problem shows."""
    text = '[TOOL_CALLS][{"name": "nope"},  {"name": "a", "arguments": {"x": 1 2}}] tail'
    turn = MistralParser().parse(text, tools=[ToolSpec(name="a")])
    assert [(p.raw, p.name, p.reason) for p in turn.errors] == [
        ('{"name": "nope"}', "nope", "unknown tool 'nope' @ name"),
        (
            '{"name": "a", "arguments": {"x": 1 2}}] tail',
            "a",
            "invalid JSON (Expecting ',' delimiter at char 35) @ arguments",
        ),
    ]
    assert turn.content == ""


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[TOOL_CALLS] [TOOL_CALLS]a[ARGS]{}", "missing name @ name"),
        ("[TOOL_CALLS] ", "truncated call @ name"),
        ("[TOOL_CALLS] [CALL_ID]x[ARGS]{}", "missing name @ name"),
        ("[TOOL_CALLS]a b[ARGS]{}", "invalid tool name 'a b' (1-64 of [A-Za-z0-9_.-]) @ name"),
        (
            f"[TOOL_CALLS]{'x' * 100}[ARGS]{{}}",
            f"invalid tool name {'x' * 80!r} (1-64 of [A-Za-z0-9_.-]) @ name",
        ),
    ],
)
def test_mistral_a_named_calls_name_is_missing_truncated_or_invalid(text: str, reason: str) -> None:
    """Pins Mistral's name rules: no name is truncated only in the last segment when it is
    blank, else missing; a marker at the start is no name; a name that is no tool name is
    refused quoted up to 80 characters."""
    turn = MistralParser().parse(text)
    assert reason in [p.reason for p in turn.errors]
    assert turn.errors[0].reason == reason
    assert turn.errors[0].name is None


def test_mistral_a_named_call_keeps_its_text_name_id_and_the_content_after_it() -> None:
    """Pins what a Mistral named call keeps: its raw text from ``[TOOL_CALLS]``, the name, the
    model's ``[CALL_ID]`` stripped, the text after its JSON as content; a broken JSON gives its
    fault at the arguments."""
    turn = MistralParser().parse(
        '[TOOL_CALLS]bash[CALL_ID] abc [ARGS]{"x": 1} more[TOOL_CALLS]ls[ARGS]{"x": '
    )
    assert turn.calls == (ToolCall(id="abc", name="bash", arguments={"x": 1}),)
    assert [(p.raw, p.name, p.reason) for p in turn.errors] == [
        ('[TOOL_CALLS]ls[ARGS]{"x": ', "ls", "truncated JSON @ arguments")
    ]
    assert turn.content == "more"


def test_mistral_renders_arguments_as_written_not_escaped() -> None:
    """Pins that Mistral's render (both styles) writes non-ASCII arguments as they are, and
    the content alone when there are no calls."""
    calls = [ToolCall(id="c", name="a", arguments={"x": "é"})]
    assert MistralParser().render(calls) == '[TOOL_CALLS]a[ARGS]{"x": "é"}'
    assert MistralParser(render_style="array").render(calls) == (
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": "é"}}]'
    )
    assert MistralParser().render([], content="hi") == "hi"


@pytest.mark.parametrize(
    ("text", "raw", "reason"),
    [
        ("[TOOL_CALLS][", "[", "truncated JSON @ call"),
        ("[TOOL_CALLS] [TOOL_CALLS]a[ARGS]{}", "[TOOL_CALLS] ", "missing name @ name"),
        ('[TOOL_CALLS]{"x": 1}', '[TOOL_CALLS]{"x": 1}', "missing name @ name"),
        (
            "[TOOL_CALLS]a b[ARGS]{} text",
            "[TOOL_CALLS]a b[ARGS]{} text",
            "invalid tool name 'a b' (1-64 of [A-Za-z0-9_.-]) @ name",
        ),
    ],
)
def test_mistral_a_refused_call_keeps_its_text_and_none_of_it_is_content(
    text: str, raw: str, reason: str
) -> None:
    """Pins what a refused Mistral call keeps: its text as written (the whole segment for a
    named call, a ``{`` first being no name), and that none of it becomes content."""
    turn = MistralParser().parse(text)
    assert [(p.raw, p.reason) for p in turn.errors] == [(raw, reason)]
    assert turn.content == ""


def test_mistral_an_array_is_read_element_by_element_without_spaces() -> None:
    """Pins where Mistral's array reading resumes: right after a ``,`` (no space needed) and
    right after the closing ``]`` (the next character is content)."""
    turn = MistralParser().parse('[TOOL_CALLS][{"name": "a"},{"name": "b"}]Done')
    assert turn.calls == (ToolCall(id="call_0", name="a"), ToolCall(id="call_1", name="b"))
    assert turn.content == "Done"


def test_mistral_a_named_call_splits_at_the_first_markers() -> None:
    """Pins that a named call's arguments start at its first ``[ARGS]`` (the marker's text
    inside the JSON is a value), its name ends at the first ``[`` and its id starts after the
    first ``[CALL_ID]`` (the rest, brackets and all, is the id, refused as one)."""
    turn = MistralParser().parse('[TOOL_CALLS]bash[ARGS]{"x": "[ARGS]"}')
    assert turn.calls == (ToolCall(id="call_0", name="bash", arguments={"x": "[ARGS]"}),)
    for written in ("x[y", "a[CALL_ID]b"):
        turn = MistralParser().parse(f"[TOOL_CALLS]bash[CALL_ID]{written}[ARGS]{{}}")
        assert [(p.name, p.reason) for p in turn.errors] == [
            ("bash", f"invalid call id {written!r} (1-64 of [A-Za-z0-9_.-]) @ id")
        ]


def test_mistral_a_named_call_without_arguments_or_with_a_wrong_tool_keeps_text_and_name() -> None:
    """Pins that a named Mistral call refused for its arguments (none written) or by the tool
    check keeps its text from ``[TOOL_CALLS]`` and its name."""
    turn = MistralParser().parse(
        "[TOOL_CALLS]bash [TOOL_CALLS]nope[ARGS]{}", tools=[ToolSpec(name="a")]
    )
    assert [(p.raw, p.name, p.reason) for p in turn.errors] == [
        ("[TOOL_CALLS]bash ", "bash", "missing arguments @ arguments"),
        ("[TOOL_CALLS]nope[ARGS]{}", "nope", "unknown tool 'nope' @ name"),
    ]
