"""Tool-call parsers on realistic completions: one family at a time, then the shared rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser
from trajcore.domain.tool_parsers.base import distinct_ids
from trajcore.domain.tool_parsers.deepseek_v3 import DeepSeekV3Parser
from trajcore.domain.tool_parsers.hermes import HermesParser
from trajcore.domain.tool_parsers.llama3_json import Llama3JsonParser
from trajcore.domain.tool_parsers.mistral import MistralParser
from trajcore.domain.tool_parsers.qwen3_coder import Qwen3CoderParser
from trajcore.domain.tools import ToolCall, ToolSpec
from trajcore.domain.turns import ParsedTurn

BASH = ToolSpec(
    name="bash",
    description="Run a shell command in the workspace.",
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
)
READ_FILE = ToolSpec(
    name="read_file",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "offset": {"type": "integer"},
            "limit": {"type": "number"},
            "follow": {"type": "boolean"},
            "ranges": {"type": "array", "items": {"type": "integer"}},
            "options": {"type": "object"},
            "note": {"type": ["string", "null"]},
        },
        "required": ["path"],
    },
)
TOOLS = [BASH, READ_FILE]

# DeepSeek's special tokens, spelled with escapes (the real text uses U+FF5C and U+2581).
DS_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
DS_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
DS_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
DS_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"


def call(index: int, name: str, arguments: JSONObject) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=arguments)


def reasons(turn: ParsedTurn) -> list[str]:
    return [problem.reason for problem in turn.errors]


# ---------------------------------------------------------------------------------------- hermes


def test_hermes_reads_a_qwen3_turn_with_thinking_and_two_calls() -> None:
    text = (
        "<think>\nThe tests live in tests/. I should list them, then run them.\n</think>\n\n"
        "Let me look at the test layout first.\n"
        "<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls tests"}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "read_file", "arguments": {"path": "pyproject.toml", "offset": 0}}\n'
        "</tool_call>"
    )
    turn = HermesParser().parse(text, tools=TOOLS)
    assert turn.reasoning == "The tests live in tests/. I should list them, then run them."
    assert turn.content == "Let me look at the test layout first."
    assert turn.calls == (
        call(0, "bash", {"command": "ls tests"}),
        call(1, "read_file", {"path": "pyproject.toml", "offset": 0}),
    )
    assert turn.errors == ()


def test_hermes_reads_reasoning_when_the_template_opened_the_think_block() -> None:
    text = 'I need the file.\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n'
    turn = HermesParser().parse(text + "</tool_call>")
    assert turn.reasoning == "I need the file."
    assert turn.content == ""
    assert [c.name for c in turn.calls] == ["bash"]


def test_hermes_accepts_an_unclosed_final_call_whose_json_is_complete() -> None:
    text = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}'
    turn = HermesParser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "pytest -q"}),)
    assert turn.errors == ()
    assert turn.content == "Running it."


def test_hermes_reports_a_call_cut_off_inside_its_arguments() -> None:
    text = (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/trajcore/dom'
    )
    turn = HermesParser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)
    [problem] = turn.errors
    assert problem.index == 1
    assert problem.call_id == "call_1"
    assert problem.name == "read_file"
    assert problem.reason == "truncated JSON @ arguments"
    assert problem.raw.startswith("<tool_call>")
    assert problem.message_for_model() == (
        "Error: tool call 1 (read_file) was not run: truncated JSON @ arguments"
    )


def test_hermes_reports_a_call_cut_off_right_after_it_opened() -> None:
    turn = HermesParser().parse("Let me check.\n<tool_call>\n")
    assert turn.calls == ()
    assert reasons(turn) == ["truncated JSON @ call"]
    assert turn.content == "Let me check."


def test_hermes_unclosed_call_ends_where_the_next_call_opens() -> None:
    text = (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>'
    )
    turn = HermesParser().parse(text)
    assert reasons(turn) == ["truncated JSON @ arguments"]
    assert turn.errors[0].index == 0
    assert turn.calls == (call(1, "bash", {"command": "pwd"}),)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"arguments": {"command": "ls"}}', "missing name @ name"),
        ('{"name": "", "arguments": {}}', "missing name @ name"),
        ('{"name": 7, "arguments": {}}', "expected string, got integer @ name"),
        (
            '{"name": "bash", "arguments": "ls -la"}',
            "expected a JSON object, got string @ arguments",
        ),
        ('{"name": "bash", "arguments": ["ls"]}', "expected a JSON object, got array @ arguments"),
        ('["bash", {"command": "ls"}]', "expected a JSON object, got array @ call"),
        ('{"name": "bash", "arguments": {"command": "ls"}}}', "@ arguments"),
        ("", "empty tool call @ call"),
        ('{"name": "bash", "arguments": {"x": NaN}}', "invalid JSON"),
        ('{"name": "bash", "arguments": {"x": [1e999]}}', "non-finite number inf @ arguments.x[0]"),
        ('{"name": "bash", "arguments": {"x": 1' + "0" * 5000 + "}}", "invalid JSON (Exceeds"),
    ],
)
def test_hermes_names_the_part_at_fault(body: str, reason: str) -> None:
    turn = HermesParser().parse(f"<tool_call>\n{body}\n</tool_call>")
    assert turn.calls == ()
    [problem] = turn.errors
    assert reason in problem.reason
    assert problem.index == 0


def test_hermes_missing_arguments_mean_no_arguments() -> None:
    turn = HermesParser().parse('<tool_call>{"name": "list_tools"}</tool_call>')
    assert turn.calls == (call(0, "list_tools", {}),)


def test_hermes_checks_names_and_arguments_against_the_tools() -> None:
    text = (
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": "soon"}}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": {"timeout": 5}}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": {"command": "ls", "timeout": 5}}</tool_call>'
    )
    turn = HermesParser().parse(text, tools=TOOLS)
    assert reasons(turn) == [
        "unknown tool 'rm_rf' @ name",
        "expected integer, got string @ arguments.timeout",
        "required @ arguments.command",
    ]
    assert [p.index for p in turn.errors] == [0, 1, 2]
    assert [p.name for p in turn.errors] == ["rm_rf", "bash", "bash"]
    assert turn.calls == (call(3, "bash", {"command": "ls", "timeout": 5}),)


def test_hermes_without_tools_accepts_any_name() -> None:
    turn = HermesParser().parse('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')
    assert turn.calls == (call(0, "rm_rf", {}),)


def test_hermes_keeps_prose_around_and_between_calls_and_stray_closers() -> None:
    text = (
        "First I list.\n"
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\n\n'
        "Then I read.\n"
        '<tool_call>{"name": "bash", "arguments": {"command": "cat a"}}</tool_call>\n'
        "Done </tool_call> here."
    )
    turn = HermesParser().parse(text)
    assert turn.content == "First I list.\nThen I read.\nDone </tool_call> here."
    assert len(turn.calls) == 2


def test_hermes_uses_the_id_prefix() -> None:
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": </tool_call>'
    turn = HermesParser().parse(text + '<tool_call>{"name": "b"}', id_prefix="t3_turn2")
    assert [c.id for c in turn.calls] == ["t3_turn2_0", "t3_turn2_2"]
    assert [p.call_id for p in turn.errors] == ["t3_turn2_1"]


def test_hermes_ignores_calls_inside_reasoning() -> None:
    text = (
        '<think>Maybe <tool_call>{"name": "bash", "arguments": {}}</tool_call>?</think>'
        "No tool needed: the answer is 4."
    )
    turn = HermesParser().parse(text)
    assert turn.calls == ()
    assert turn.reasoning == 'Maybe <tool_call>{"name": "bash", "arguments": {}}</tool_call>?'
    assert turn.content == "No tool needed: the answer is 4."


def test_hermes_plain_answer_has_no_calls_and_no_reasoning() -> None:
    turn = HermesParser().parse("  The answer is 42.\n")
    assert turn == ParsedTurn(content="The answer is 42.")


def test_hermes_survives_deeply_nested_arguments() -> None:
    deep = "[" * 50_000 + "]" * 50_000
    turn = HermesParser().parse(f'<tool_call>{{"name": "a", "arguments": {{"x": {deep}}}}}')
    assert turn.calls == ()
    assert "nested too deeply" in turn.errors[0].reason


def test_hermes_render_writes_the_qwen_template_form() -> None:
    calls = [call(0, "bash", {"command": "ls"}), call(1, "read_file", {"path": "é.txt"})]
    assert HermesParser().render(calls, content="Looking.") == (
        "Looking.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "é.txt"}}\n</tool_call>'
    )
    assert HermesParser().render([]) == ""


# ------------------------------------------------------------------------------------ qwen3 coder

QWEN_TURN = """I'll read the file, then patch it.
<tool_call>
<function=read_file>
<parameter=path>
src/app.py
</parameter>
<parameter=offset>
10
</parameter>
<parameter=limit>
2.5
</parameter>
<parameter=follow>
True
</parameter>
<parameter=ranges>
[1, 2, 3]
</parameter>
<parameter=options>
{"encoding": "utf-8"}
</parameter>
<parameter=note>
None
</parameter>
</function>
</tool_call>
<tool_call>
<function=bash>
<parameter=command>
cat <<'EOF' > notes.txt
  indented line
EOF
</parameter>
</function>
</tool_call>"""


def test_qwen3_coder_converts_values_to_the_schema_types() -> None:
    turn = Qwen3CoderParser().parse(QWEN_TURN, tools=TOOLS)
    assert turn.errors == ()
    assert turn.content == "I'll read the file, then patch it."
    assert turn.calls == (
        call(
            0,
            "read_file",
            {
                "path": "src/app.py",
                "offset": 10,
                "limit": 2.5,
                "follow": True,
                "ranges": [1, 2, 3],
                "options": {"encoding": "utf-8"},
                "note": None,
            },
        ),
        call(1, "bash", {"command": "cat <<'EOF' > notes.txt\n  indented line\nEOF"}),
    )


def test_qwen3_coder_keeps_text_without_tools() -> None:
    turn = Qwen3CoderParser().parse(QWEN_TURN)
    assert turn.calls[0].arguments["offset"] == "10"
    assert turn.calls[0].arguments["options"] == '{"encoding": "utf-8"}'


def test_qwen3_coder_keeps_string_typed_values_verbatim() -> None:
    text = (
        "<tool_call>\n<function=bash>\n<parameter=command>\n  42  \n</parameter>\n"
        "</function>\n</tool_call>"
    )
    turn = Qwen3CoderParser().parse(text, tools=TOOLS)
    assert turn.calls == (call(0, "bash", {"command": "  42  "}),)


def test_qwen3_coder_reports_values_that_miss_their_type() -> None:
    text = (
        "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n"
        "<parameter=offset>\nten\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n"
        '<parameter=options>\n{"encoding": \n</parameter>\n</function>\n</tool_call>'
    )
    turn = Qwen3CoderParser().parse(text, tools=TOOLS)
    assert reasons(turn) == [
        "expected integer, got string @ arguments.offset",
        "truncated JSON @ arguments.options",
    ]


def test_qwen3_coder_reports_a_call_cut_off_in_a_value() -> None:
    text = QWEN_TURN.split("cat <<'EOF'", maxsplit=1)[0] + "cat <<'EOF' > no"
    turn = Qwen3CoderParser().parse(text, tools=TOOLS)
    assert [c.name for c in turn.calls] == ["read_file"]
    [problem] = turn.errors
    assert (problem.index, problem.name, problem.reason) == (
        1,
        "bash",
        "truncated call @ arguments.command",
    )


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("<tool_call>\n<function=ba", "truncated call @ name"),
        ("<tool_call>\n<func", "truncated call @ function"),
        ("<tool_call>\n<function=bash>\n<parameter=comm", "truncated call @ arguments"),
        (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n",
            "truncated call @ function",
        ),
        ("<tool_call>\n", "truncated call @ call"),
    ],
)
def test_qwen3_coder_names_where_a_cut_off_call_stopped(tail: str, reason: str) -> None:
    turn = Qwen3CoderParser().parse("Working.\n" + tail)
    assert turn.calls == ()
    assert reasons(turn) == [reason]
    assert turn.content == "Working."


def test_qwen3_coder_accepts_an_unclosed_block_whose_function_is_complete() -> None:
    text = "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n"
    turn = Qwen3CoderParser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)


def test_qwen3_coder_tolerates_missing_parameter_closers_inside_a_closed_function() -> None:
    text = (
        "<tool_call><function=read_file><parameter=path>a.txt<parameter=offset>3"
        "</function></tool_call>"
    )
    turn = Qwen3CoderParser().parse(text, tools=TOOLS)
    assert turn.calls == (call(0, "read_file", {"path": "a.txt", "offset": 3}),)


def test_qwen3_coder_reports_repeated_and_unnamed_parameters_and_bad_blocks() -> None:
    text = (
        "<tool_call><function=bash><parameter=command>a</parameter>"
        "<parameter=command>b</parameter></function></tool_call>"
        "<tool_call><function=bash><parameter=>a</parameter></function></tool_call>"
        '<tool_call>{"name": "bash", "arguments": {}}</tool_call>'
        "<tool_call><function=><parameter=command>a</parameter></function></tool_call>"
        "<tool_call></tool_call>"
    )
    turn = Qwen3CoderParser().parse(text)
    assert reasons(turn) == [
        "repeated parameter @ arguments.command",
        "missing parameter name @ arguments",
        "expected <function=NAME> @ function",
        "missing name @ name",
        "empty tool call @ call",
    ]
    assert turn.calls == ()


def test_qwen3_coder_reads_bare_function_blocks() -> None:
    text = "Sure.\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>"
    turn = Qwen3CoderParser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)
    assert turn.content == "Sure."


def test_qwen3_coder_checks_unknown_tools_and_required_parameters() -> None:
    text = (
        "<tool_call><function=deploy></function></tool_call>"
        "<tool_call><function=read_file><parameter=offset>1</parameter></function></tool_call>"
    )
    turn = Qwen3CoderParser().parse(text, tools=TOOLS)
    assert reasons(turn) == ["unknown tool 'deploy' @ name", "required @ arguments.path"]


def test_qwen3_coder_render_writes_the_template_form() -> None:
    calls = [call(0, "read_file", {"path": "a b", "offset": 3, "options": {"x": [True]}})]
    assert Qwen3CoderParser().render(calls, content="Reading.") == (
        "Reading.\n<tool_call>\n<function=read_file>\n"
        "<parameter=path>\na b\n</parameter>\n"
        "<parameter=offset>\n3\n</parameter>\n"
        '<parameter=options>\n{"x": [true]}\n</parameter>\n'
        "</function>\n</tool_call>"
    )


# ------------------------------------------------------------------------------------ llama3 json


def test_llama3_reads_python_tag_calls_separated_by_semicolons() -> None:
    text = (
        "<|python_tag|>"
        '{"name": "bash", "parameters": {"command": "ls"}}; '
        '{"name": "read_file", "parameters": {"path": "a.py"}}'
    )
    turn = Llama3JsonParser().parse(text, tools=TOOLS)
    assert turn.calls == (
        call(0, "bash", {"command": "ls"}),
        call(1, "read_file", {"path": "a.py"}),
    )
    assert turn.content == ""


def test_llama3_reads_a_bare_json_call_and_the_arguments_key() -> None:
    turn = Llama3JsonParser().parse('  {"name": "bash", "arguments": {"command": "ls"}}\n')
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)


def test_llama3_keeps_prose_before_the_tag_and_after_the_calls() -> None:
    text = (
        "Checking the weather.<|python_tag|>"
        '{"name": "weather", "parameters": {"city": "Paris"}}\nThat is all.'
    )
    turn = Llama3JsonParser().parse(text)
    assert turn.content == "Checking the weather.\nThat is all."
    assert turn.calls == (call(0, "weather", {"city": "Paris"}),)


def test_llama3_prose_with_json_inside_is_content() -> None:
    text = 'The config is {"name": "x", "parameters": {}} as shown.'
    assert Llama3JsonParser().parse(text) == ParsedTurn(content=text)


def test_llama3_reports_truncated_and_garbage_pieces_in_order() -> None:
    text = (
        "<|python_tag|>"
        '{"name": "bash", "parameters": {"command": "ls"}}; '
        '{"name": "bash", "parameters": {"command": 1, ; '
        "oops not json; "
        '{"name": "read_file", "parameters": {"path": "a"}}; '
        '{"name": "read_file", "parameters": {"path": "README'
    )
    turn = Llama3JsonParser().parse(text, tools=TOOLS)
    assert [c.id for c in turn.calls] == ["call_0", "call_3"]
    assert [(p.index, p.reason) for p in turn.errors] == [
        (1, "truncated JSON @ parameters"),
        (2, "expected a JSON object, got 'oops not json' @ call"),
        (4, "truncated JSON @ parameters"),
    ]
    assert turn.errors[2].name == "read_file"


def test_llama3_reads_objects_written_back_to_back() -> None:
    text = '<|python_tag|>{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {}}'
    turn = Llama3JsonParser().parse(text)
    assert [c.name for c in turn.calls] == ["a", "b"]


def test_llama3_reports_non_object_parameters_with_their_key() -> None:
    text = '<|python_tag|>{"name": "bash", "parameters": "ls"}; {"name": "b", "arguments": 3}'
    turn = Llama3JsonParser().parse(text)
    assert reasons(turn) == [
        "expected a JSON object, got string @ parameters",
        "expected a JSON object, got integer @ arguments",
    ]


def test_llama3_render() -> None:
    calls = [call(0, "a", {"x": 1}), call(1, "b", {})]
    assert Llama3JsonParser().render(calls) == (
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    )
    assert Llama3JsonParser().render([], content="hi") == "hi"


# ---------------------------------------------------------------------------------------- mistral


def test_mistral_reads_the_array_form() -> None:
    text = (
        "Let me check both.[TOOL_CALLS]"
        '[{"name": "bash", "arguments": {"command": "ls"}, "id": "a1b2c3d4e"},'
        ' {"name": "read_file", "arguments": {"path": "x"}}]'
    )
    turn = MistralParser().parse(text, tools=TOOLS)
    assert turn.content == "Let me check both."
    assert turn.calls == (
        ToolCall(id="a1b2c3d4e", name="bash", arguments={"command": "ls"}),
        call(1, "read_file", {"path": "x"}),
    )


def test_mistral_keeps_complete_array_elements_before_a_cut_off_one() -> None:
    text = (
        '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}}, '
        '{"name": "read_file", "arguments": {"path": "sr'
    )
    turn = MistralParser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)
    assert [(p.index, p.name, p.reason) for p in turn.errors] == [
        (1, "read_file", "truncated JSON @ arguments")
    ]


def test_mistral_reads_the_args_form_with_call_ids_and_thinking() -> None:
    text = (
        "[THINK]Two calls are needed.[/THINK]"
        'On it.[TOOL_CALLS]bash[ARGS]{"command": "ls"}'
        '[TOOL_CALLS]read_file[CALL_ID]a1b2c3d4e[ARGS]{"path": "x"}'
    )
    turn = MistralParser().parse(text, tools=TOOLS)
    assert turn.reasoning == "Two calls are needed."
    assert turn.content == "On it."
    assert turn.calls == (
        call(0, "bash", {"command": "ls"}),
        ToolCall(id="a1b2c3d4e", name="read_file", arguments={"path": "x"}),
    )


def test_mistral_reads_the_args_form_after_the_tokenizer_dropped_args() -> None:
    turn = MistralParser().parse('[TOOL_CALLS]bash{"command": "ls"}')
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[TOOL_CALLS]", "truncated call @ name"),
        ("[TOOL_CALLS]bash", "truncated call @ arguments"),
        ("[TOOL_CALLS]bash[ARGS]", "truncated call @ arguments"),
        ('[TOOL_CALLS]bash[ARGS]{"command": "l', "truncated JSON @ arguments"),
        ("[TOOL_CALLS]bash[ARGS][1]", "expected a JSON object, got array @ arguments"),
        ("[TOOL_CALLS][", "truncated JSON @ call"),
        ('[TOOL_CALLS][{"name": "bash", "argum', "truncated JSON @ arguments"),
        ("[TOOL_CALLS][3]", "expected a JSON object, got integer @ call"),
        ('[TOOL_CALLS][ARGS]{"command": "ls"}', "missing name @ name"),
    ],
)
def test_mistral_names_the_part_at_fault(text: str, reason: str) -> None:
    turn = MistralParser().parse(text)
    assert turn.calls == ()
    assert reasons(turn) == [reason]


def test_mistral_reports_a_bad_call_between_good_ones() -> None:
    text = (
        '[TOOL_CALLS]bash[ARGS]{"command": "ls"}'
        "[TOOL_CALLS]bash"
        '[TOOL_CALLS]bash[ARGS]{"command": "pwd"} and some trailing words'
    )
    turn = MistralParser().parse(text)
    assert [c.id for c in turn.calls] == ["call_0", "call_2"]
    assert [(p.index, p.reason) for p in turn.errors] == [(1, "missing arguments @ arguments")]
    assert turn.content == "and some trailing words"


def test_mistral_keeps_the_ids_the_model_wrote_and_generates_the_rest() -> None:
    text = (
        '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "call_1_1"},'
        ' {"name": "bash", "arguments": {"command": "cd"}, "id": null},'
        ' {"name": "bash", "arguments": {"command": "pwd"}, "id": "call_1_1"},'
        ' {"name": "nope", "arguments": {}, "id": "Zz9Zz9Zz9"}]'
    )
    turn = MistralParser().parse(text, tools=TOOLS, id_prefix="call_1")
    # Kept; generated (its own index, 1, is the model's: _2 is appended); repeated in the turn,
    # so generated; a refused call keeps the id the model wrote, so the answer names it.
    assert [c.id for c in turn.calls] == ["call_1_1", "call_1_1_2", "call_1_2"]
    assert [(p.index, p.call_id, p.reason) for p in turn.errors] == [
        (3, "Zz9Zz9Zz9", "unknown tool 'nope' @ name")
    ]


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        ("7", "expected string, got integer @ id"),
        ('""', "invalid call id '' (1-64 of [A-Za-z0-9_.-]) @ id"),
        ('"a b"', "invalid call id 'a b' (1-64 of [A-Za-z0-9_.-]) @ id"),
        ('"' + "x" * 65 + '"', "invalid call id '" + "x" * 65 + "' (1-64 of [A-Za-z0-9_.-]) @ id"),
    ],
)
def test_mistral_refuses_a_call_whose_id_is_malformed(written: str, reason: str) -> None:
    text = f'[TOOL_CALLS][{{"name": "bash", "arguments": {{"command": "ls"}}, "id": {written}}}]'
    turn = MistralParser().parse(text, tools=TOOLS)
    assert turn.calls == ()
    assert [(p.index, p.name, p.call_id, p.reason) for p in turn.errors] == [
        (0, "bash", "call_0", reason)
    ]


def test_mistral_reads_the_call_id_of_the_v13_form() -> None:
    text = (
        '[TOOL_CALLS]bash[CALL_ID]Ab3De6Gh9[ARGS]{"command": "ls"}'
        '[TOOL_CALLS]bash[CALL_ID][ARGS]{"command": "pwd"}'
    )
    turn = MistralParser().parse(text, tools=TOOLS)
    assert turn.calls == (ToolCall(id="Ab3De6Gh9", name="bash", arguments={"command": "ls"}),)
    assert reasons(turn) == ["invalid call id '' (1-64 of [A-Za-z0-9_.-]) @ id"]


def test_ids_stay_unique_across_a_trajectory() -> None:
    used: set[str] = set()
    parser = MistralParser(render_style="array")
    texts = [
        '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "abcDEF123"}, '
        '{"name": "bash", "arguments": {"command": 1}}]',
        # the model repeats its id, and writes the id trajcore generated for a problem
        '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "abcDEF123"}, '
        '{"name": "bash", "arguments": {"command": "ls"}, "id": "call_1_1"}, '
        '{"name": "bash", "arguments": {"command": "ls"}, "id": "fresh0001"}]',
        '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls"}, "id": "abcDEF123"}]',
    ]
    ids: list[list[str]] = []
    for turn_no, text in enumerate(texts, start=1):
        turn = parser.parse(text, tools=TOOLS, id_prefix=f"call_{turn_no}")
        turn = distinct_ids(turn, used, suffix=str(turn_no))
        ids.append([c.id for c in turn.calls] + [p.call_id or "" for p in turn.errors])
    assert ids == [
        ["abcDEF123", "call_1_1"],
        ["abcDEF123-2", "call_1_1-2", "fresh0001"],
        ["abcDEF123-3"],
    ]
    assert len(used) == 6
    # The same turns give the same ids: deterministic.
    again: set[str] = set()
    first = parser.parse(texts[0], tools=TOOLS, id_prefix="call_1")
    assert distinct_ids(first, again, suffix="1") is first


def test_mistral_render_in_both_styles() -> None:
    calls = [call(0, "a", {"x": 1}), call(1, "b", {})]
    assert MistralParser().render(calls) == '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}'
    assert MistralParser(render_style="array").render(calls, content="Hi.") == (
        'Hi.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    )


def test_mistral_refuses_an_unknown_render_style() -> None:
    with pytest.raises(ValueError, match="render_style"):
        MistralParser(render_style="yaml")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ deepseek v3


def test_deepseek_reads_the_v3_form_with_r1_thinking() -> None:
    text = (
        "<think>\nUser wants the weather.\n</think>\n\nLet me check."
        f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}bash\n```json\n"
        '{"command": "curl wttr.in"}\n```'
        f"{DS_CALL_END}\n{DS_CALL_BEGIN}function{DS_SEP}read_file\n```json\n"
        '{"path": "notes.md"}\n```'
        f"{DS_CALL_END}{DS_CALLS_END}"
    )
    turn = DeepSeekV3Parser().parse(text, tools=TOOLS)
    assert turn.reasoning == "User wants the weather."
    assert turn.content == "Let me check."
    assert turn.calls == (
        call(0, "bash", {"command": "curl wttr.in"}),
        call(1, "read_file", {"path": "notes.md"}),
    )


def test_deepseek_reads_the_v31_form() -> None:
    text = (
        f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}bash{DS_SEP}{{"command": "ls"}}{DS_CALL_END}{DS_CALLS_END}'
    )
    turn = get_parser("deepseek_v31").parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)
    assert turn.content == ""


def test_deepseek_reports_a_cut_off_call_and_keeps_the_one_before() -> None:
    text = (
        f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}bash{DS_SEP}"
        '{"command": "ls"}'
        f"{DS_CALL_END}{DS_CALL_BEGIN}function{DS_SEP}read_file\n```json\n"
        '{"path": "no'
    )
    turn = DeepSeekV3Parser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)
    assert [(p.index, p.name, p.reason) for p in turn.errors] == [
        (1, "read_file", "truncated JSON @ arguments")
    ]


def test_deepseek_accepts_a_call_cut_off_after_complete_json() -> None:
    text = f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}bash\n```json\n{{"command": "ls"}}\n'
    turn = DeepSeekV3Parser().parse(text)
    assert turn.calls == (call(0, "bash", {"command": "ls"}),)


@pytest.mark.parametrize(
    ("inner", "reason"),
    [
        ("bash", f"missing {DS_SEP} @ call"),
        (f"function{DS_SEP}\n```json\n{{}}\n```", "missing name @ name"),
        (f"{DS_SEP}{{}}", "missing name @ name"),
        (f"bash{DS_SEP}", "missing arguments @ arguments"),
        (f"bash{DS_SEP}[]", "expected a JSON object, got array @ arguments"),
        (f"function{DS_SEP}bash", "truncated call @ name"),
    ],
)
def test_deepseek_names_the_part_at_fault(inner: str, reason: str) -> None:
    text = f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}{inner}{DS_CALL_END}{DS_CALLS_END}"
    turn = DeepSeekV3Parser().parse(text)
    assert turn.calls == ()
    assert reasons(turn) == [reason]


def test_deepseek_render_in_both_forms() -> None:
    calls = [call(0, "bash", {"command": "ls"})]
    assert DeepSeekV3Parser().render(calls, content="Ok.") == (
        f"Ok.{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}bash\n```json\n"
        f'{{"command": "ls"}}\n```{DS_CALL_END}{DS_CALLS_END}'
    )
    assert get_parser("deepseek_v31").render(calls) == (
        f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}bash{DS_SEP}{{"command": "ls"}}{DS_CALL_END}{DS_CALLS_END}'
    )


# --------------------------------------------------------------------------------- shared rules


def test_registry_knows_every_family_by_its_own_name() -> None:
    assert PARSER_NAMES == (
        "hermes",
        "qwen3_coder",
        "llama3_json",
        "mistral",
        "deepseek_v3",
        "deepseek_v31",
        "qwen",
        "kimi_k2",
        "glm45",
        "pythonic",
        "llama4_pythonic",
        "granite",
        "seed_oss",
    )
    for name in PARSER_NAMES:
        assert get_parser(name).name == name


def test_registry_refuses_an_unknown_name_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        get_parser("hermes2")
    assert caught.value.field == "tool_call_parser"
    assert "'hermes2'" in caught.value.reason
    for name in PARSER_NAMES:
        assert name in caught.value.reason


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_every_parser_splits_reasoning_the_same_way(name: str) -> None:
    parser = get_parser(name)
    assert parser.parse("<think> a </think> b") == ParsedTurn(content="b", reasoning="a")
    assert parser.parse("a </think> b") == ParsedTurn(content="b", reasoning="a")
    assert parser.parse("b <think> still thinking") == ParsedTurn(
        content="b", reasoning="still thinking"
    )
    assert parser.parse("<think>\n\n</think>\n\nb") == ParsedTurn(content="b")
    assert parser.parse("") == ParsedTurn()


# --------------------------------------------------------------- fixes beyond the seed's rules


def test_hermes_reads_parameters_as_the_arguments_when_arguments_are_absent() -> None:
    text = '<tool_call>{"name": "bash", "parameters": {"command": "ls"}}</tool_call>'
    assert HermesParser().parse(text, tools=TOOLS).calls == (call(0, "bash", {"command": "ls"}),)
    both = (
        '<tool_call>{"name": "bash", "arguments": {"command": "a"}, "parameters": {}}</tool_call>'
    )
    assert HermesParser().parse(both).calls == (call(0, "bash", {"command": "a"}),)
    bad = '<tool_call>{"name": "bash", "parameters": "ls"}</tool_call>'
    assert reasons(HermesParser().parse(bad)) == ["expected a JSON object, got string @ parameters"]


@pytest.mark.parametrize(
    ("name", "parser"),
    [
        ("bad name", "hermes"),
        ("bad_func_no_gt\n</function", "hermes"),
        ("{{ tool.name }}", "hermes"),
        ("x" * 65, "hermes"),
    ],
)
def test_a_call_name_must_be_a_tool_name_without_tools_too(name: str, parser: str) -> None:
    body = '{"name": ' + json.dumps(name) + ', "arguments": {}}'
    turn = get_parser(parser).parse(f"<tool_call>{body}</tool_call>")
    assert turn.calls == ()
    [problem] = turn.errors
    assert problem.reason.startswith("invalid tool name")
    assert problem.reason.endswith("@ name")


def test_qwen3_coder_function_name_without_its_closing_bracket_is_a_problem() -> None:
    text = "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>"
    turn = Qwen3CoderParser().parse(text)
    assert turn.calls == ()
    assert reasons(turn) == ["expected '>' after the function name @ name"]
    jinja = "<tool_call>\n<function={{ x }}>\n</function>\n</tool_call>"
    assert reasons(Qwen3CoderParser().parse(jinja))[0].startswith("invalid tool name '{{ x }}'")


def test_qwen3_coder_keeps_a_literal_inner_call_in_a_value_and_runs_only_the_real_one() -> None:
    inner = "<tool_call>\n<function=bash>\n<parameter=command>\nrm -rf /\n</parameter>\n</function>"
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.md\n</parameter>\n"
        f"<parameter=content>\nExample:\n{inner}\n</tool_call>\nEnd.\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    spec = ToolSpec(
        name="write_file",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    )
    turn = Qwen3CoderParser().parse(text, tools=[spec, BASH])
    assert turn.errors == ()
    assert turn.calls == (
        call(
            0,
            "write_file",
            {"path": "notes.md", "content": f"Example:\n{inner}\n</tool_call>\nEnd."},
        ),
    )


def test_qwen3_coder_types_values_through_pydantic_optional_and_refs() -> None:
    spec = ToolSpec(
        name="search",
        validator=JSONSchemaValidator(),
        parameters={
            "type": "object",
            "$defs": {"Filter": {"type": "object", "properties": {"lang": {"type": "string"}}}},
            "properties": {
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 5},
                "offset": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "filter": {"anyOf": [{"$ref": "#/$defs/Filter"}, {"type": "null"}]},
            },
        },
    )
    text = (
        "<tool_call>\n<function=search>\n<parameter=limit>\n5\n</parameter>\n"
        "<parameter=offset>\nNone\n</parameter>\n"
        '<parameter=filter>\n{"lang": "en"}\n</parameter>\n</function>\n</tool_call>'
    )
    turn = Qwen3CoderParser().parse(text, tools=[spec])
    assert turn.calls == (
        call(0, "search", {"limit": 5, "offset": None, "filter": {"lang": "en"}}),
    )


def test_llama3_reads_calls_after_a_repeated_python_tag() -> None:
    text = (
        '<|python_tag|>{"name": "a", "parameters": {}}<|python_tag|>{"name": "b", "parameters": {}}'
        '\nLet me also check.<|python_tag|>{"name": "c", "parameters": {"x": 1}}'
    )
    turn = Llama3JsonParser().parse(text)
    assert [c.name for c in turn.calls] == ["a", "b", "c"]
    assert turn.content == "Let me also check."


def test_mistral_reads_the_array_after_stray_text_and_keeps_the_text_as_content() -> None:
    text = '[TOOL_CALLS]  junk [{"name": "add", "arguments": {"a": 1}}] trail'
    turn = MistralParser().parse(text)
    assert turn.calls == (call(0, "add", {"a": 1}),)
    assert turn.content == "junk\ntrail"
    assert turn.errors == ()


def test_deepseek_reports_a_calls_block_cut_off_before_its_first_call() -> None:
    text = f"Let me look that up.{DS_CALLS_BEGIN}get_weather"
    turn = get_parser("deepseek_v31").parse(text)
    assert turn.calls == ()
    [problem] = turn.errors
    assert problem.reason == "truncated call @ call"
    assert problem.raw == f"{DS_CALLS_BEGIN}get_weather"
    assert turn.content == "Let me look that up."


# ------------------------------------------------------------------------- kimi_k2, glm45, pythonic


def test_kimi_k2_render_writes_the_template_form() -> None:
    calls = [call(0, "bash", {"command": "ls"}), call(1, "read_file", {"path": "a"})]
    assert get_parser("kimi_k2").render(calls, content="Ok.") == (
        "Ok.<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{"command": "ls"}'
        "<|tool_call_end|>"
        '<|tool_call_begin|>functions.read_file:1<|tool_call_argument_begin|>{"path": "a"}'
        "<|tool_call_end|><|tool_calls_section_end|>"
    )


def test_glm45_render_writes_the_template_form_and_types_values_by_schema() -> None:
    calls = [call(0, "read_file", {"path": "a b", "offset": 3, "follow": True})]
    text = get_parser("glm45").render(calls, content="Reading.")
    assert text == (
        "Reading.\n<tool_call>read_file\n"
        "<arg_key>path</arg_key>\n<arg_value>a b</arg_value>\n"
        "<arg_key>offset</arg_key>\n<arg_value>3</arg_value>\n"
        "<arg_key>follow</arg_key>\n<arg_value>true</arg_value>\n</tool_call>"
    )
    assert get_parser("glm45").parse(text, tools=TOOLS).calls == tuple(calls)
    untyped = get_parser("glm45").parse(text).calls[0].arguments
    assert untyped == {"path": "a b", "offset": "3", "follow": "true"}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls", "truncated call @ "),
        ("<tool_call>bash\n<arg_key>command</arg_key>\nls\n</tool_call>", "missing <arg_value>"),
        (
            "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>a</arg_value>\n"
            "<arg_key>command</arg_key>\n<arg_value>b</arg_value>\n</tool_call>",
            "repeated parameter @ arguments.command",
        ),
        ("<tool_call>bash\nhello\n</tool_call>", "unexpected text 'hello\\n' @ arguments"),
        ("<tool_call>\n</tool_call>", "missing name @ name"),
    ],
)
def test_glm45_names_the_part_at_fault(body: str, reason: str) -> None:
    turn = get_parser("glm45").parse(body)
    assert turn.calls == ()
    [problem] = turn.errors
    assert problem.reason.startswith(reason)


def test_pythonic_reads_only_literals_and_names_the_argument_at_fault() -> None:
    text = "[a(x=os.system('rm -rf /')), b(x={1, 2}), c(1), d(**{'x': 1}), e(y=-2.5, z=(1, 'a'))]"
    turn = get_parser("pythonic").parse(text)
    assert reasons(turn) == [
        "expected a literal, got Call @ arguments.x",
        "expected a literal, got Set @ arguments.x",
        "positional arguments are not allowed @ arguments",
        "**arguments are not allowed @ arguments",
    ]
    assert turn.calls == (call(4, "e", {"y": -2.5, "z": [1, "a"]}),)
    assert [p.raw for p in turn.errors][:1] == ["a(x=os.system('rm -rf /'))"]


def test_pythonic_keeps_prose_and_reads_a_list_that_starts_a_line() -> None:
    parser = get_parser("pythonic")
    assert parser.parse("Use [f(x=1)] like this.") == ParsedTurn(content="Use [f(x=1)] like this.")
    turn = parser.parse("I'll call it.\n[f(x=1), g.h(y='é')]")
    assert turn.content == "I'll call it."
    assert turn.calls == (call(0, "f", {"x": 1}), call(1, "g.h", {"y": "é"}))
    assert reasons(parser.parse("[f(x=1), g(y=")) == ["truncated call @ call"]


def test_llama4_pythonic_render_wraps_the_list_in_its_tags() -> None:
    calls = [call(0, "f", {"x": [1, None, True], "y": {"k": "v"}})]
    text = get_parser("llama4_pythonic").render(calls)
    assert text == "<|python_start|>[f(x=[1, None, True], y={'k': 'v'})]<|python_end|>"
    assert get_parser("llama4_pythonic").parse(text).calls == tuple(calls)


@given(
    st.lists(
        st.lists(
            st.sampled_from([None, "abcDEF123", "call_1_0", "call_2_1", "x", "", 5]), max_size=4
        ),
        min_size=1,
        max_size=5,
    )
)
def test_call_ids_are_unique_in_a_trajectory_and_new_model_ids_are_kept(
    turns: list[list[str | int | None]],
) -> None:
    parser = MistralParser(render_style="array")
    used: set[str] = set()
    seen: list[str] = []
    for turn_no, written in enumerate(turns, start=1):
        calls = [{"name": "bash", "arguments": {"command": "ls"}, "id": w} for w in written]
        text = "[TOOL_CALLS]" + json.dumps(calls) if calls else "no calls"
        turn = distinct_ids(
            parser.parse(text, tools=TOOLS, id_prefix=f"call_{turn_no}"), used, suffix=str(turn_no)
        )
        ids = [c.id for c in turn.calls] + [p.call_id for p in turn.errors if p.call_id]
        assert len(ids) == len(written)
        # Each attempt's id, in the order the model wrote them (problems carry their index).
        problem_ids = {p.index: p.call_id for p in turn.errors}
        made = iter(turn.calls)
        by_attempt = [problem_ids.get(i) or next(made).id for i in range(len(written))]
        for i, w in enumerate(written):
            if isinstance(w, str) and w and w not in seen and w not in by_attempt[:i]:
                assert by_attempt[i] == w  # a new, well-formed id the model wrote is kept
        assert [p.reason.endswith("@ id") for p in turn.errors] == [
            True for w in written if w in ("", 5)
        ]
        seen.extend(ids)
    assert len(seen) == len(set(seen))
