"""The conformance corpus: published tool-parser test cases of vLLM, transcribed as data.

Each ``Case`` is one model text from a reference project's own parser tests, with what that
test expects (the calls, as ``(name, arguments)``, and the content) and the source it came
from (repository, file, test name, and parameter id where the test is parametrized). These
are facts about the references' behaviour; no reference code is copied. Texts written with
``+`` and ``\\n`` are the test's own string, joined.

Conventions:

- ``content`` is the reference's expected content, or ``None`` where its test does not check
  content; trajcore joins the text around calls with newlines and strips it, so contents are
  compared up to whitespace.
- ``arguments`` of ``None`` means the reference checks only the call's name.
- ``problems`` are the ``ParseProblem`` reasons trajcore reports (substrings, in order) where
  the text holds a malformed call: the references drop such calls or keep them as content;
  trajcore returns them as problems, the calls agreeing.
- ``difference`` names an entry of ``docs/tool_parsers.md`` ("Where trajcore differs") when
  trajcore deliberately gives a different result; ``ours`` then holds trajcore's result, which
  the conformance test asserts, so the documented behaviour cannot drift silently.
"""

from __future__ import annotations

import json

import attrs

from trajcore.domain.json_values import JSON, JSONObject

VLLM = "vllm-project/vllm"
HERMES_TESTS = "tests/tool_parsers/test_hermes_tool_parser.py"
QWEN3CODER_TESTS = "tests/tool_parsers/test_qwen3coder_tool_parser.py"
QWEN3_SHARED_TESTS = "tests/tool_parsers/test_qwen3_xml_coder_shared.py"
QWEN36_TESTS = "tests/tool_parsers/test_qwen36_bugs.py"
LLAMA3_TESTS = "tests/tool_parsers/test_llama3_json_tool_parser.py"
MISTRAL_TESTS = "tests/tool_parsers/test_mistral_tool_parser.py"
DEEPSEEK_V31_TESTS = "tests/tool_parsers/test_deepseekv31_tool_parser.py"
KIMI_K2_TESTS = "tests/tool_parsers/test_kimi_k2_tool_parser.py"
GLM4_MOE_TESTS = "tests/tool_parsers/test_glm4_moe_tool_parser.py"
PYTHONIC_TESTS = "tests/tool_parsers/test_pythonic_tool_parser.py"
LLAMA4_PYTHONIC_TESTS = "tests/tool_parsers/test_llama4_pythonic_tool_parser.py"
SGLANG = "sgl-project/sglang"
SGLANG_TESTS = "test/srt/test_function_call_parser.py"

Call = tuple[str, JSONObject | None]
Tool = tuple[str, JSONObject]


@attrs.frozen(kw_only=True)
class Ours:
    """What trajcore returns for a case it deliberately differs on."""

    calls: tuple[Call, ...] = ()
    content: str | None = None
    problems: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Case:
    """One reference test case (see the module's conventions)."""

    family: str
    repo: str
    file: str
    test: str
    text: str
    tools: tuple[Tool, ...] | None = None
    calls: tuple[Call, ...] = ()
    content: str | None = None
    problems: tuple[str, ...] = ()
    difference: str | None = None
    ours: Ours | None = None

    @property
    def id(self) -> str:
        return f"{self.family}:{self.file.rsplit('/', 1)[-1]}::{self.test}"


@attrs.frozen
class _VllmFamily:
    """Makes the cases of one vLLM parser family's test file: each case's test is named
    ``prefix + name + suffix``, and parsed against ``tools`` where they are given."""

    family: str
    file: str
    prefix: str = ""
    suffix: str = ""
    tools: tuple[Tool, ...] | None = None

    def __call__(self, test: str, text: str, calls: tuple[Call, ...], **more: object) -> Case:
        if self.tools is not None:
            more = {"tools": self.tools, **more}
        return Case(
            family=self.family,
            repo=VLLM,
            file=self.file,
            test=f"{self.prefix}{test}{self.suffix}",
            text=text,
            calls=calls,
            **more,  # type: ignore[arg-type]  # the optional Case fields, checked by attrs
        )


_VARIOUS_TYPES: JSONObject = {
    "string_field": "hello",
    "int_field": 42,
    "float_field": 3.14,
    "bool_field": True,
    "null_field": None,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"},
    "empty_array": [],
    "empty_object": {},
}
"""The arguments of vLLM's shared ``test_various_data_types`` call (``ToolParserTestConfig``)."""


def _args(text: str) -> JSONObject:
    value: JSON = json.loads(text)
    assert isinstance(value, dict)
    return value


# ------------------------------------------------------------------------------------- hermes

_FINAL_ANSWER = (
    '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
)

HERMES: list[Case] = [
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_no_tool_call",
        text="This is not a tool call.",
        content="This is not a tool call.",
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_tool_call_between_tags",
        text=_FINAL_ANSWER,
        calls=(("final_answer", {"trigger": True}),),
    ),
    Case(
        family="qwen",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_tool_call_between_tags (Qwen3 tokenizer)",
        text=_FINAL_ANSWER,
        calls=(("final_answer", {"trigger": True}),),
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_tool_call_until_eos",
        text='<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}',
        calls=(("final_answer", {"trigger": True}),),
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_tool_call_invalid_json",
        text='<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
        problems=("truncated JSON @ arguments",),
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_serialized_arguments",
        text=(
            "<tool_call>\n"
            '{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}\n'
            "</tool_call>"
        ),
        calls=(("get_db_config", {"param": "max_connections"}),),
        difference="string-arguments",
        ours=Ours(problems=("expected a JSON object, got string @ arguments",)),
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_non_streaming_bare_string_arguments",
        text='<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>',
        calls=(("do_thing", None),),
        difference="string-arguments",
        ours=Ours(problems=("expected a JSON object, got string @ arguments",)),
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_parser_streaming (final calls)",
        text=(
            '<tool_call>{"name": "get_current_temperature","arguments": {"location":'
            '"San Francisco, California, United States", "unit": "celsius"}}</tool_call>'
        ),
        calls=(
            (
                "get_current_temperature",
                {"location": "San Francisco, California, United States", "unit": "celsius"},
            ),
        ),
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_streaming_content_then_tool_call_with_stream_interval (final)",
        text=(
            "Sure, let me check the weather."
            '<tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>'
        ),
        calls=(("get_weather", {"city": "NYC"}),),
        content="Sure, let me check the weather.",
    ),
    Case(
        family="hermes",
        repo=VLLM,
        file=HERMES_TESTS,
        test="test_hermes_streaming_multiple_tool_calls_with_stream_interval (final)",
        text=(
            '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>'
        ),
        calls=(("search", {"q": "cats"}), ("search", {"q": "dogs"})),
    ),
]

# -------------------------------------------------------------------------------- qwen3 coder

WEATHER_PARAMS: JSONObject = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city name"},
        "state": {"type": "string", "description": "The state code"},
        "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
    },
    "required": ["city", "state"],
}
AREA_PARAMS: JSONObject = {
    "type": "object",
    "properties": {
        "shape": {"type": "string"},
        "dimensions": {"type": "object"},
        "precision": {"type": "integer"},
    },
}
QWEN_TOOLS: tuple[Tool, ...] = (
    ("get_current_weather", WEATHER_PARAMS),
    ("calculate_area", AREA_PARAMS),
)
WRITE_FILE_TOOLS: tuple[Tool, ...] = (
    (
        "write_file",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    ),
)


def _qwen_call(name: str, params: list[tuple[str, str]], *, newlines: bool = True) -> str:
    sep = "\n" if newlines else ""
    body = "".join(f"<parameter={k}>{sep}{v}{sep}</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


_DALLAS = _qwen_call(
    "get_current_weather", [("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit")]
)
_DALLAS_ARGS: JSONObject = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
_ORLANDO = _qwen_call(
    "get_current_weather", [("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit")]
)
_RECTANGLE = _qwen_call(
    "calculate_area",
    [("shape", "rectangle"), ("dimensions", '{"width": 10, \n "height": 20}'), ("precision", "2")],
)
_CIRCLE = _qwen_call(
    "calculate_area",
    [("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3")],
)

_XML_TAGS_IN_CONTENT = (
    "char_deltas = [\n"
    '    "<tool_call>\\n",\n'
    '    "<parameter=query>\\n",\n'
    '    "\\n</parameter>\\n",\n'
    '    "</function>\\n",\n'
    "]\n"
)
_PARAM_LIKE_LINES = (
    'TOOL_CALL_TEMPLATE = """\n'
    "</parameter>\n"
    "<parameter=new_string>\n"
    "#!/usr/bin/env python3\n"
    "</parameter>\n"
    '"""\n'
)
_REAL_PARAM_NAME_LITERAL = 'doc = """\n<parameter=path>\nliteral/value\n</parameter>\n"""\n'
_FULL_NESTED_CALL = (
    'doc = """\n'
    "<tool_call>\n"
    "<function=write_file>\n"
    "<parameter=path>\n"
    "literal/value.txt\n"
    "</parameter>\n"
    "<parameter=content>\n"
    "hello\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n"
    '"""\n'
)
_OUT_OF_SCHEMA_NESTED = (
    'template = """\n'
    "<tool_call>\n<function=foo>\n"
    "<parameter=bar>baz</parameter>\n"
    "</function>\n</tool_call>\n"
    '"""\n'
)


def _write_file(path: str, content: str) -> str:
    return (
        "<tool_call>\n<function=write_file>\n"
        f"<parameter=path>\n{path}\n</parameter>\n"
        f"<parameter=content>\n{content}</parameter>\n"
        "</function>\n</tool_call>\n"
    )


def _typed(name: str, properties: JSONObject) -> tuple[Tool, ...]:
    return ((name, {"type": "object", "properties": properties}),)


_NULLABLE_INT: JSONObject = {"anyOf": [{"type": "integer"}, {"type": "null"}]}

QWEN3_CODER: list[Case] = [
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls_no_tools",
        text="This is a test response without any tool calls",
        tools=QWEN_TOOLS,
        content="This is a test response without any tool calls",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls[single_tool]",
        text=_DALLAS,
        tools=QWEN_TOOLS,
        calls=(("get_current_weather", _DALLAS_ARGS),),
        content="",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls[single_tool_with_content]",
        text="Sure! Let me check the weather for you." + _DALLAS,
        tools=QWEN_TOOLS,
        calls=(("get_current_weather", _DALLAS_ARGS),),
        content="Sure! Let me check the weather for you.",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls[single_tool_multiline_param]",
        text=_RECTANGLE,
        tools=QWEN_TOOLS,
        calls=(
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
            ),
        ),
        content="",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls[parallel_tools]",
        text=_DALLAS + "\n" + _ORLANDO,
        tools=QWEN_TOOLS,
        calls=(
            ("get_current_weather", _DALLAS_ARGS),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ),
        content="",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls[tool_with_typed_params]",
        text="Let me calculate that area for you." + _CIRCLE,
        tools=QWEN_TOOLS,
        calls=(
            (
                "calculate_area",
                {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3},
            ),
        ),
        content="Let me calculate that area for you.",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls_fallback_no_tags",
        text=(
            "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
            "<parameter=state>\nTX\n</parameter>\n</function>"
        ),
        tools=QWEN_TOOLS,
        calls=(("get_current_weather", None),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls_type_conversion",
        text=_qwen_call(
            "test_types",
            [
                ("int_param", "42"),
                ("float_param", "3.14"),
                ("bool_param", "true"),
                ("str_param", "hello world"),
                ("obj_param", '{"key": "value"}'),
            ],
        ),
        tools=_typed(
            "test_types",
            {
                "int_param": {"type": "integer"},
                "float_param": {"type": "number"},
                "bool_param": {"type": "boolean"},
                "str_param": {"type": "string"},
                "obj_param": {"type": "object"},
            },
        ),
        calls=(
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                },
            ),
        ),
        difference="float-type",
        ours=Ours(
            calls=(
                (
                    "test_types",
                    {
                        "int_param": 42,
                        "float_param": 3.14,
                        "bool_param": True,
                        "str_param": "hello world",
                        "obj_param": {"key": "value"},
                    },
                ),
            ),
            content="",
        ),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls_anyof_type_conversion",
        text=_qwen_call(
            "test_anyof",
            [
                ("anyof_int", "5"),
                ("anyof_str", "hello"),
                ("anyof_array", '["a", "b", "c"]'),
                ("anyof_obj", '{"key": "value"}'),
                ("type_as_array", "42"),
                ("multi_non_null", "some text"),
            ],
        ),
        tools=_typed(
            "test_anyof",
            {
                "anyof_int": {**_NULLABLE_INT, "default": 5},
                "anyof_str": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "anyof_array": {
                    "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
                },
                "anyof_obj": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                "type_as_array": {"type": ["integer", "null"]},
                "multi_non_null": {
                    "anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]
                },
            },
        ),
        calls=(
            (
                "test_anyof",
                {
                    "anyof_int": 5,
                    "anyof_str": "hello",
                    "anyof_array": ["a", "b", "c"],
                    "anyof_obj": {"key": "value"},
                    "type_as_array": 42,
                    "multi_non_null": "some text",
                },
            ),
        ),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_extract_tool_calls_missing_closing_parameter_tag",
        text=(
            "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n"
            "<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n"
            "<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>"
        ),
        tools=QWEN_TOOLS,
        calls=(("get_current_weather", _DALLAS_ARGS),),
        content="Let me check the weather for you:",
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_malformed_xml_no_gt_delimiter",
        text=(
            "<tool_call>\n<function=get_current_weather\n"
            "<parameter=city>Dallas</parameter>\n</function>\n</tool_call>"
        ),
        tools=QWEN_TOOLS,
        problems=("expected '>' after the function name @ name",),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_none_tool_calls_filtered",
        text=(
            "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_current_weather>\n"
            "<parameter=city>Dallas</parameter>\n<parameter=state>TX</parameter>\n"
            "</function>\n</tool_call>"
        ),
        tools=QWEN_TOOLS,
        calls=(("get_current_weather", {"city": "Dallas", "state": "TX"}),),
        problems=("expected '>' after the function name @ name",),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_none_tool_calls_filtered (no tool list)",
        text=(
            "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_current_weather>\n"
            "<parameter=city>Dallas</parameter>\n<parameter=state>TX</parameter>\n"
            "</function>\n</tool_call>"
        ),
        calls=(("get_current_weather", {"city": "Dallas", "state": "TX"}),),
        problems=("expected '>' after the function name @ name",),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_anyof_parameter_not_double_encoded",
        text=(
            "<tool_call>\n<function=update_record>\n"
            '<parameter=data>{"key": "value", "count": 42}</parameter>\n'
            "</function>\n</tool_call>"
        ),
        tools=_typed("update_record", {"data": {"anyOf": [{"type": "object"}, {"type": "null"}]}}),
        calls=(("update_record", {"data": {"key": "value", "count": 42}}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3CODER_TESTS,
        test="test_no_double_serialization_string_args",
        text=(
            "<tool_call>\n<function=greet>\n<parameter=message>hello world</parameter>\n"
            "</function>\n</tool_call>"
        ),
        tools=_typed("greet", {"message": {"type": "string"}}),
        calls=(("greet", {"message": "hello world"}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_extract_tool_calls_complex_type_with_single_quote",
        text=_qwen_call("test_types", [("obj_param", "{'key': 'value'}")]),
        tools=_typed("test_types", {"obj_param": {"type": "object"}}),
        calls=(("test_types", {"obj_param": {"key": "value"}}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_string_null_value_preserved",
        text="<tool_call>\n<function=search>\n<parameter=query>null</parameter>\n"
        "</function>\n</tool_call>",
        tools=_typed("search", {"query": {"type": "string"}}),
        calls=(("search", {"query": "null"}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_anyof_string_null_keeps_value_as_string",
        text="<tool_call>\n<function=set_code>\n<parameter=code>42</parameter>\n"
        "</function>\n</tool_call>",
        tools=_typed("set_code", {"code": {"anyOf": [{"type": "string"}, {"type": "null"}]}}),
        calls=(("set_code", {"code": "42"}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_anyof_integer_null_parses_as_int",
        text="<tool_call>\n<function=set_count>\n<parameter=count>42</parameter>\n"
        "</function>\n</tool_call>",
        tools=_typed("set_count", {"count": _NULLABLE_INT}),
        calls=(("set_count", {"count": 42}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_python_none_value_for_nullable_int",
        text="<tool_call>\n<function=set_count>\n<parameter=count>None</parameter>\n"
        "</function>\n</tool_call>",
        tools=_typed("set_count", {"count": _NULLABLE_INT}),
        calls=(("set_count", {"count": None}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_double_encoded_object_param_nonstreaming",
        text=(
            "<tool_call>\n<function=process>\n<parameter=name>\nhello\n</parameter>\n"
            "<parameter=data>\n\"{'key': 'value', 'n': 1}\"\n</parameter>\n"
            "</function>\n</tool_call>\n"
        ),
        tools=_typed("process", {"name": {"type": "string"}, "data": {"type": "object"}}),
        calls=(("process", {"name": "hello", "data": {"key": "value", "n": 1}}),),
        difference="double-encoded",
        ours=Ours(problems=("arguments.data",), content=""),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_content_with_xml_structural_tags_nonstreaming",
        text=_write_file("test.py", _XML_TAGS_IN_CONTENT),
        tools=WRITE_FILE_TOOLS,
        calls=(("write_file", {"path": "test.py", "content": _XML_TAGS_IN_CONTENT.rstrip("\n")}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_content_with_param_like_lines_nonstreaming",
        text=_write_file("test_template.py", _PARAM_LIKE_LINES),
        tools=WRITE_FILE_TOOLS,
        calls=(
            (
                "write_file",
                {"path": "test_template.py", "content": _PARAM_LIKE_LINES.rstrip("\n")},
            ),
        ),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_content_with_real_param_name_literal_nonstreaming",
        text=_write_file("fixture.py", _REAL_PARAM_NAME_LITERAL).rstrip("\n"),
        tools=WRITE_FILE_TOOLS,
        calls=(
            (
                "write_file",
                {"path": "fixture.py", "content": _REAL_PARAM_NAME_LITERAL.rstrip("\n")},
            ),
        ),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_content_with_full_nested_tool_call_nonstreaming",
        text=_write_file("fixture.py", _FULL_NESTED_CALL).rstrip("\n"),
        tools=WRITE_FILE_TOOLS,
        calls=(("write_file", {"path": "fixture.py", "content": _FULL_NESTED_CALL.rstrip("\n")}),),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN3_SHARED_TESTS,
        test="test_two_tools_second_with_out_of_schema_nested_literal_nonstreaming",
        text=(
            "<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n"
            "</function>\n</tool_call>\n\n"
            + _write_file("fixture.py", _OUT_OF_SCHEMA_NESTED).rstrip("\n")
        ),
        tools=WRITE_FILE_TOOLS,
        calls=(
            ("foo", {"bar": "baz"}),
            ("write_file", {"path": "fixture.py", "content": _OUT_OF_SCHEMA_NESTED.rstrip("\n")}),
        ),
        difference="unknown-tool",
        ours=Ours(
            calls=(
                (
                    "write_file",
                    {"path": "fixture.py", "content": _OUT_OF_SCHEMA_NESTED.rstrip("\n")},
                ),
            ),
            content="",
            problems=("unknown tool 'foo' @ name",),
        ),
    ),
    Case(
        family="qwen3_coder",
        repo=VLLM,
        file=QWEN36_TESTS,
        test="test_coder_array_with_json_bool_nonstreaming",
        text=(
            "<tool_call>\n<function=pick>\n"
            '<parameter=items>\n["a", "b", 1, true]\n</parameter>\n'
            "</function>\n</tool_call>"
        ),
        tools=_typed("pick", {"items": {"type": "array"}}),
        calls=(("pick", {"items": ["a", "b", 1, True]}),),
    ),
]

# ------------------------------------------------------------------------------------- llama 3

_SEARCH_1 = '{"name": "searchTool", "parameters": {"query": "test1"}}'
_INCIDENTS = '{"name": "getOpenIncidentsTool", "parameters": {}}'
_SEARCH_2 = '{"name": "searchTool", "parameters": {"query": "test2"}}'
_THREE_CALLS: tuple[Call, ...] = (
    ("searchTool", {"query": "test1"}),
    ("getOpenIncidentsTool", {}),
    ("searchTool", {"query": "test2"}),
)


_llama = _VllmFamily("llama3_json", LLAMA3_TESTS)


LLAMA3_JSON: list[Case] = [
    _llama(
        "test_extract_tool_calls_simple",
        'Here is the result: {"name": "getOpenIncidentsTool", '
        '"parameters": {}} Would you like to know more?',
        (("getOpenIncidentsTool", {}),),
        content="",
        difference="json-in-prose",
        ours=Ours(
            content='Here is the result: {"name": "getOpenIncidentsTool", '
            '"parameters": {}} Would you like to know more?'
        ),
    ),
    _llama(
        "test_extract_tool_calls_with_arguments",
        '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
        (("searchTool", {"query": "test query", "limit": 10}),),
    ),
    _llama(
        "test_extract_tool_calls_no_json",
        "This is just some text without any tool calls",
        (),
        content="This is just some text without any tool calls",
    ),
    _llama(
        "test_extract_tool_calls_invalid_json",
        '{"name": "invalidTool", "parameters": {invalid json}',
        (),
        content='{"name": "invalidTool", "parameters": {invalid json}',
        difference="problem-not-content",
        ours=Ours(content="", problems=("truncated JSON @ parameters",)),
    ),
    _llama(
        "test_extract_tool_calls_with_arguments_key",
        '{"name": "searchTool", "arguments": {"query": "test"}}',
        (("searchTool", {"query": "test"}),),
    ),
    _llama(
        "test_extract_tool_calls_multiple_json",
        f"{_SEARCH_1}; {_INCIDENTS}; {_SEARCH_2}",
        _THREE_CALLS,
    ),
    _llama(
        "test_extract_tool_calls_multiple_json_with_whitespace",
        f"{_SEARCH_1} ; {_INCIDENTS} ; {_SEARCH_2}",
        _THREE_CALLS,
    ),
    _llama(
        "test_extract_tool_calls_multiple_json_with_surrounding_text",
        f"Here are the results: {_SEARCH_1}; {_INCIDENTS}; {_SEARCH_2} "
        "Would you like to know more?",
        _THREE_CALLS,
        difference="json-in-prose",
        ours=Ours(
            content=f"Here are the results: {_SEARCH_1}; {_INCIDENTS}; {_SEARCH_2} "
            "Would you like to know more?"
        ),
    ),
    _llama(
        "test_extract_tool_calls_deeply_nested_json",
        '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": '
        '{"level4": {"value": "deep"}}}}}}',
        (
            (
                "complexTool",
                {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}},
            ),
        ),
    ),
    _llama(
        "test_extract_tool_calls_multiple_with_deep_nesting",
        '{"name": "simpleTool", "parameters": {"value": "test"}}; '
        '{"name": "complexTool", "parameters": '
        '{"config": {"database": {"connection": {"pool": {"size": 10}}}}}}',
        (
            ("simpleTool", {"value": "test"}),
            ("complexTool", {"config": {"database": {"connection": {"pool": {"size": 10}}}}}),
        ),
    ),
    _llama(
        "test_extract_tool_calls_with_quotes_and_brackets_in_string",
        '{"name": "searchTool", "parameters": {"query": "test {value} [complex]",'
        '"nested": {"inner": "more {brackets}"}}}',
        (
            (
                "searchTool",
                {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}},
            ),
        ),
    ),
    _llama(
        "test_extract_tool_calls_with_escaped_quotes_in_nested_json",
        '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
        (("parserTool", {"text": 'He said "Hello {world}"'}),),
    ),
    _llama(
        "test_extract_tool_calls_missing_name_key",
        '{"parameters": {}}',
        (),
        content='{"parameters": {}}',
        difference="problem-not-content",
        ours=Ours(content="", problems=("missing name @ name",)),
    ),
    _llama(
        "test_extract_tool_calls_missing_parameters_and_arguments_key",
        '{"name": "toolWithoutParams"}',
        (),
        content='{"name": "toolWithoutParams"}',
        difference="no-arguments-key",
        ours=Ours(calls=(("toolWithoutParams", {}),), content=""),
    ),
    _llama(
        "test_extract_tool_calls_brace_in_trailing_text",
        '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.',
        (("searchTool", {"query": "test"}),),
    ),
    _llama(
        "test_extract_tool_calls_json_fragment_in_trailing_text",
        '{"name": "searchTool", "parameters": {"query": "test"}} '
        'The arguments I passed were {"query": "test"}',
        (("searchTool", {"query": "test"}),),
    ),
    *(
        _llama(
            f"test_extract_tool_calls_streaming_parallel_separators[{separator!r}] (final)",
            _SEARCH_1 + separator + _INCIDENTS,
            (("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {})),
        )
        for separator in ("; ", ";", ";\n", "\n")
    ),
]

# ------------------------------------------------------------------------------------- mistral

MISTRAL: list[Case] = [
    Case(
        family="mistral",
        repo=VLLM,
        file=MISTRAL_TESTS,
        test="test_extract_tool_calls_pre_v11_regex_fallback",
        text='[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail',
        calls=(("add", {"a": 1, "b": 2}),),
    ),
    Case(
        family="mistral",
        repo=VLLM,
        file=MISTRAL_TESTS,
        test="test_extract_tool_calls_pre_v11_regex_fallback_fails",
        text="[TOOL_CALLS] not json at all",
        content="not json at all",
        difference="problem-not-content",
        ours=Ours(content="", problems=("invalid tool name 'not json at all'",)),
    ),
    Case(
        family="mistral",
        repo=VLLM,
        file=MISTRAL_TESTS,
        test="test_extract_tool_calls_pre_v11_multiple_bot_tokens_raises",
        text='[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1}}]'
        '[TOOL_CALLS] [{"name": "sub", "arguments":{"b": 2}}]',
        difference="mistral-several-markers",
        ours=Ours(calls=(("add", {"a": 1}), ("sub", {"b": 2})), content=""),
    ),
]

# ---------------------------------------------------------------------------------- deepseek

_DS_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
_DS_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
_DS_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
_DS_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
_DS_SEP = "<\uff5ctool\u2581sep\uff5c>"

DEEPSEEK_V3_TESTS = "tests/tool_parsers/test_deepseekv3_tool_parser.py"


def _ds3_call(name: str, arguments: str) -> str:
    return f"{_DS_CALL_BEGIN}function{_DS_SEP}{name}\n```json\n{arguments}\n```{_DS_CALL_END}"


_ds3 = _VllmFamily(
    "deepseek_v3",
    DEEPSEEK_V3_TESTS,
    prefix="TestDeepSeekV3ToolParser::",
    suffix=" (ToolParserTestConfig data)",
)


DEEPSEEK_V3: list[Case] = [
    _ds3(
        "test_no_tool_calls",
        "How can I help you today? I can check weather for you.",
        (),
        content="How can I help you today? I can check weather for you.",
    ),
    _ds3(
        "test_single_tool_call",
        _DS_CALLS_BEGIN
        + _ds3_call("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
        + _DS_CALLS_END,
        (("get_weather", {"city": "Tokyo", "unit": "celsius"}),),
        content="",
    ),
    _ds3(
        "test_parallel_tool_calls",
        _DS_CALLS_BEGIN
        + _ds3_call("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
        + _ds3_call("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}')
        + _DS_CALLS_END,
        (("get_weather", None), ("search_hotels", None)),
    ),
    _ds3(
        "test_various_data_types",
        _DS_CALLS_BEGIN
        + _ds3_call(
            "test_function",
            '{"string_field": "hello", "int_field": 42, "float_field": 3.14, '
            '"bool_field": true, "null_field": null, "array_field": ["a", "b", "c"], '
            '"object_field": {"nested": "value"}, "empty_array": [], "empty_object": {}}',
        )
        + _DS_CALLS_END,
        (("test_function", _VARIOUS_TYPES),),
    ),
    _ds3(
        "test_empty_arguments",
        _DS_CALLS_BEGIN + _ds3_call("get_current_time", "{}") + _DS_CALLS_END,
        (("get_current_time", {}),),
    ),
    _ds3(
        "test_surrounding_text",
        "Let me check the weather for you."
        + _DS_CALLS_BEGIN
        + _ds3_call("get_weather", '{"city": "Paris"}')
        + _DS_CALLS_END,
        (("get_weather", {"city": "Paris"}),),
        content="Let me check the weather for you.",
    ),
    _ds3(
        "test_escaped_strings",
        _DS_CALLS_BEGIN
        + _ds3_call(
            "send_message",
            '{"text": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file", '
            '"newline": "line1\\nline2"}',
        )
        + _DS_CALLS_END,
        (
            (
                "send_message",
                {"text": 'He said "hello"', "path": "C:\\Users\\file", "newline": "line1\nline2"},
            ),
        ),
    ),
    _ds3(
        "test_malformed_input[0]",
        _DS_CALLS_BEGIN + _ds3_call("get_weather", '{"city": "Tokyo"') + _DS_CALLS_END,
        (),
        problems=("truncated JSON @ arguments",),
    ),
    _ds3(
        "test_malformed_input[1]",
        f'{_DS_CALLS_BEGIN}function{_DS_SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```'
        + _DS_CALLS_END,
        (),
        problems=(f"missing {_DS_CALL_BEGIN} @ call",),
    ),
]

DEEPSEEK_V31: list[Case] = [
    Case(
        family="deepseek_v31",
        repo=VLLM,
        file=DEEPSEEK_V31_TESTS,
        test="test_extract_tool_calls_with_tool",
        text=f'normal text{_DS_CALLS_BEGIN}{_DS_CALL_BEGIN}foo{_DS_SEP}{{"x":1}}'
        f"{_DS_CALL_END}{_DS_CALLS_END}",
        calls=(("foo", {"x": 1}),),
        content="normal text",
    ),
    Case(
        family="deepseek_v31",
        repo=VLLM,
        file=DEEPSEEK_V31_TESTS,
        test="test_extract_tool_calls_with_multiple_tools",
        text=f'some prefix text{_DS_CALLS_BEGIN}{_DS_CALL_BEGIN}foo{_DS_SEP}{{"x":1}}'
        f'{_DS_CALL_END}{_DS_CALL_BEGIN}bar{_DS_SEP}{{"y":2}}{_DS_CALL_END}{_DS_CALLS_END}'
        " some suffix text",
        calls=(("foo", {"x": 1}), ("bar", {"y": 2})),
        content="some prefix text",
        difference="content-after-calls",
        ours=Ours(
            calls=(("foo", {"x": 1}), ("bar", {"y": 2})),
            content="some prefix text\nsome suffix text",
        ),
    ),
    Case(
        family="deepseek_v31",
        repo=VLLM,
        file=DEEPSEEK_V31_TESTS,
        test="test_extract_tool_calls_unparsable_block[cut off]",
        text=f"Let me look that up.{_DS_CALLS_BEGIN}get_weather",
        content=f"Let me look that up.{_DS_CALLS_BEGIN}get_weather",
        difference="problem-not-content",
        ours=Ours(content="Let me look that up.", problems=("truncated call @ call",)),
    ),
    Case(
        family="deepseek_v31",
        repo=VLLM,
        file=DEEPSEEK_V31_TESTS,
        test="test_extract_tool_calls_unparsable_block[no call markers]",
        text=f'{_DS_CALLS_BEGIN}foo{_DS_SEP}{{"x":1}}{_DS_CALLS_END}',
        content=f'{_DS_CALLS_BEGIN}foo{_DS_SEP}{{"x":1}}{_DS_CALLS_END}',
        difference="problem-not-content",
        ours=Ours(content="", problems=(f"missing {_DS_CALL_BEGIN} @ call",)),
    ),
]

# ------------------------------------------------------------------------------------ kimi k2

_K_SECTION_BEGIN = "<|tool_calls_section_begin|>"
_K_SECTION_END = "<|tool_calls_section_end|>"


def _kimi_tool(tool_id: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{tool_id} <|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


def _kimi_wrap(*tools: str) -> str:
    return _K_SECTION_BEGIN + "".join(tools) + _K_SECTION_END


_KIMI_WEATHER: tuple[Tool, ...] = (
    (
        "get_weather",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        },
    ),
)
_KIMI_BOOK_FLIGHT: Tool = (
    "book_flight",
    {"type": "object", "properties": {"city": {"type": "string"}}},
)


_kimi = _VllmFamily("kimi_k2", KIMI_K2_TESTS)


KIMI_K2: list[Case] = [
    _kimi("TestExtractToolCalls::test_no_tools", "This is a test", (), content="This is a test"),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[single_tool_call]",
        "I'll check. " + _kimi_wrap(_kimi_tool("functions.get_weather:0", '{"city": "Beijing"}')),
        (("get_weather", {"city": "Beijing"}),),
        content="I'll check. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[parallel_tool_calls]",
        "Compare weather. "
        + _kimi_wrap(
            _kimi_tool("functions.get_weather:0", '{"city": "Beijing"}'),
            _kimi_tool("functions.get_weather:1", '{"city": "Shanghai"}'),
        ),
        (("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})),
        content="Compare weather. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[three_tool_calls]",
        "Multiple tasks. "
        + _kimi_wrap(
            _kimi_tool("functions.get_weather:0", '{"city": "New York"}'),
            _kimi_tool("functions.get_news:1", '{"topic": "technology"}'),
            _kimi_tool(
                "functions.send_email:2",
                '{"to": "user@example.com", "subject": "Daily Update"}',
            ),
        ),
        (
            ("get_weather", {"city": "New York"}),
            ("get_news", {"topic": "technology"}),
            ("send_email", {"to": "user@example.com", "subject": "Daily Update"}),
        ),
        content="Multiple tasks. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[angle_brackets_in_json]",
        "Process HTML. "
        + _kimi_wrap(_kimi_tool("functions.process_html:0", '{"html": "<div>content</div>"}')),
        (("process_html", {"html": "<div>content</div>"}),),
        content="Process HTML. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[multiline_json]",
        "Formatted. "
        + _kimi_wrap(
            _kimi_tool("functions.process_data:0", '{\n  "name": "test",\n  "value": 123\n}')
        ),
        (("process_data", {"name": "test", "value": 123}),),
        content="Formatted. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[no_functions_prefix]",
        "No prefix. " + _kimi_wrap(_kimi_tool("get_weather:0", '{"city": "Tokyo"}')),
        (("get_weather", {"city": "Tokyo"}),),
        content="No prefix. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_extract_tool_calls[empty_arguments]",
        "Empty args. " + _kimi_wrap(_kimi_tool("functions.test:0", "{}")),
        (("test", {}),),
        content="Empty args. ",
    ),
    _kimi(
        "TestExtractToolCalls::test_invalid_json_still_extracted",
        "Help. "
        + _K_SECTION_BEGIN
        + _kimi_tool("functions.bad:0", '{"city": "Beijing"')
        + _kimi_tool("functions.good:1", '{"city": "Shanghai"}')
        + _K_SECTION_END,
        (("bad", None), ("good", None)),
        difference="problem-not-content",
        ours=Ours(
            calls=(("good", {"city": "Shanghai"}),),
            content="Help.",
            problems=("truncated JSON @ arguments",),
        ),
    ),
    _kimi(
        "TestExtractToolCalls::test_invalid_funcall_id_skipped",
        "Help. "
        + _K_SECTION_BEGIN
        + _kimi_tool("functions.invalid.0", '{"city": "Beijing"}')
        + _kimi_tool("functions.valid:1", '{"city": "Shanghai"}')
        + _K_SECTION_END,
        (("valid", {"city": "Shanghai"}),),
        problems=("malformed call id 'functions.invalid.0'",),
    ),
    _kimi(
        "TestExtractToolCalls::test_bare_counter",
        "Let me check. " + _kimi_wrap(_kimi_tool("0", '{"city": "Tokyo", "unit": "celsius"}')),
        (("get_weather", {"city": "Tokyo", "unit": "celsius"}),),
        tools=_KIMI_WEATHER,
        content="Let me check. ",
        difference="no-guessed-name",
        ours=Ours(content="Let me check.", problems=("call id '0' names no function @ name",)),
    ),
    _kimi(
        "TestExtractToolCalls::test_bare_counter_multiple_tools_skips_unsafe_inference[ambiguous]",
        "Let me check. " + _kimi_wrap(_kimi_tool("0", '{"city": "Tokyo"}')),
        (),
        tools=(*_KIMI_WEATHER, _KIMI_BOOK_FLIGHT),
        problems=("call id '0' names no function @ name",),
    ),
]

# ------------------------------------------------------------------------------------- glm 4.5

_GLM_TOOLS: tuple[Tool, ...] = (
    ("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
)


_glm = _VllmFamily("glm45", GLM4_MOE_TESTS, tools=_GLM_TOOLS)


def _glm_call(name: str, pairs: list[tuple[str, str]], indent: str = "") -> str:
    body = "".join(
        f"{indent}<arg_key>{k}</arg_key>\n{indent}<arg_value>{v}</arg_value>\n" for k, v in pairs
    )
    return f"<tool_call>{name}\n{body}{indent}</tool_call>"


_GLM_DALLAS = _glm_call(
    "get_current_weather",
    [("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit")],
    indent="    ",
)
_GLM_BEIJING = _glm_call("get_weather", [("city", "Beijing"), ("date", "2025-08-01")])

GLM45: list[Case] = [
    _glm("test_extract_tool_calls_no_tools", "This is a test", (), content="This is a test"),
    _glm(
        "test_extract_tool_calls[single_tool_call]",
        _GLM_DALLAS,
        (("get_current_weather", _DALLAS_ARGS),),
        content="",
        difference="unknown-tool",
        ours=Ours(content="", problems=("unknown tool 'get_current_weather' @ name",)),
    ),
    _glm(
        "test_extract_tool_calls[tool_call_with_chinese_content]",
        "I will help you get the weather." + _GLM_BEIJING.replace("\n<arg", "\n    <arg"),
        (("get_weather", {"city": "Beijing", "date": "2025-08-01"}),),
        content="I will help you get the weather.",
    ),
    _glm(
        "test_extract_tool_calls_with_thinking_tags",
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n"
        + _GLM_BEIJING,
        (("get_weather", None),),
        content="<think>I want to get the weather.</think>\n\nI will help you get the weather.\n",
        difference="reasoning",
        ours=Ours(
            calls=(("get_weather", {"city": "Beijing", "date": "2025-08-01"}),),
            content="I will help you get the weather.",
        ),
    ),
    _glm(
        "test_extract_tool_calls_malformed_xml",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n"
        "<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>",
        (),
        problems=("missing </arg_key> @ arguments",),
    ),
    _glm(
        "test_extract_tool_calls_mixed_content",
        "I will help you get the weather info.\n\n"
        + _GLM_BEIJING
        + "\n\nmeaningwhile, I will also check the weather in Shanghai.\n\n"
        + _GLM_BEIJING.replace("Beijing", "Shanghai"),
        (
            ("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
            ("get_weather", {"city": "Shanghai", "date": "2025-08-01"}),
        ),
        content="I will help you get the weather info.\n\n",
        difference="content-after-calls",
        ours=Ours(
            calls=(
                ("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
                ("get_weather", {"city": "Shanghai", "date": "2025-08-01"}),
            ),
            content="I will help you get the weather info.\n"
            "meaningwhile, I will also check the weather in Shanghai.",
        ),
    ),
    _glm(
        "test_extract_tool_calls_incomplete_tool_call",
        _GLM_BEIJING.removesuffix("\n</tool_call>"),
        (),
        content=_GLM_BEIJING.removesuffix("\n</tool_call>"),
        difference="problem-not-content",
        ours=Ours(content="", problems=("truncated call @ arguments",)),
    ),
]

# ------------------------------------------------------------------------------------ pythonic

_SIMPLE = "get_weather(city='San Francisco', metric='celsius')"
_SIMPLE_CALL: Call = ("get_weather", {"city": "San Francisco", "metric": "celsius"})
_MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])"
)
_MORE_TYPES_CALL: Call = (
    "register_user",
    _args(
        '{"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"}, '
        '"role": null, "passed_test": true, "aliases": ["John", "Johnny"]}'
    ),
)
_ESCAPED = r"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')"
_ESCAPED_CALL: Call = ("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'})


_pythonic = _VllmFamily("pythonic", PYTHONIC_TESTS)


_llama4 = _VllmFamily("llama4_pythonic", LLAMA4_PYTHONIC_TESTS)


PYTHONIC: list[Case] = [
    _pythonic(
        "test_no_tool_call", "How can I help you today?", (), content="How can I help you today?"
    ),
    _pythonic("test_tool_call[simple_nonstreaming]", f"[{_SIMPLE}]", (_SIMPLE_CALL,), content=""),
    _pythonic(
        "test_tool_call[more_types_nonstreaming]",
        f"[{_MORE_TYPES}]",
        (_MORE_TYPES_CALL,),
        content="",
    ),
    _pythonic(
        "test_tool_call[parameterless_nonstreaming]",
        "[get_weather()]",
        (("get_weather", {}),),
        content="",
    ),
    _pythonic(
        "test_tool_call[empty_dict_nonstreaming]",
        "[do_something_cool(additional_data={})]",
        (("do_something_cool", {"additional_data": {}}),),
        content="",
    ),
    _pythonic(
        "test_tool_call[empty_list_nonstreaming]",
        "[do_something_cool(steps=[])]",
        (("do_something_cool", {"steps": []}),),
        content="",
    ),
    _pythonic(
        "test_tool_call[escaped_string_nonstreaming]",
        f"[{_ESCAPED}]",
        (_ESCAPED_CALL,),
        content="",
    ),
    _pythonic(
        "test_tool_call[parallel_calls_nonstreaming]",
        f"[{_SIMPLE}, {_MORE_TYPES}]",
        (_SIMPLE_CALL, _MORE_TYPES_CALL),
        content="",
    ),
    _pythonic(
        "test_bad_sibling_call_does_not_drop_good_calls[False]",
        f"[bad(x=b'z'), {_SIMPLE}]",
        (_SIMPLE_CALL,),
        problems=("expected a JSON value, got bytes @ arguments.x",),
    ),
    _pythonic(
        "test_non_finite_argument_rejected",
        f"[calc(x=1e999), {_SIMPLE}]",
        (_SIMPLE_CALL,),
        problems=("non-finite number inf @ arguments.x",),
    ),
    _pythonic(
        "test_good_call_survives_unparsable_sibling",
        f"[{_SIMPLE}, f(a='x 'y', b='z')]",
        (_SIMPLE_CALL,),
        difference="pythonic-unparsable",
        ours=Ours(content="", problems=("invalid Python",)),
    ),
    _pythonic(
        "test_unrecoverable_block_still_reports_no_tool_call",
        "[f(a='x 'y' 'z), g(b='p 'q' 'r)]",
        (),
        content="[f(a='x 'y' 'z), g(b='p 'q' 'r)]",
        difference="problem-not-content",
        ours=Ours(content="", problems=("invalid Python",)),
    ),
    _pythonic(
        "test_streaming_mismatched_brackets_reported_once (final calls)",
        "[foo(x=1])]",
        (),
        problems=("invalid Python",),
    ),
    _llama4(
        "test_tool_call[simple_nonstreaming]",
        "[get_weather(city='LA', metric='C')]",
        (("get_weather", {"city": "LA", "metric": "C"}),),
    ),
    _llama4(
        "test_tool_call[python_tag_nonstreaming]",
        "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>",
        (("get_weather", {"city": "LA", "metric": "C"}),),
    ),
    _llama4(
        "test_tool_call[parallel_calls_nonstreaming] (python_start, no end)",
        "<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]",
        (
            ("get_weather", {"city": "LA", "metric": "C"}),
            ("register_user", {"name": "Doe", "age": 9}),
        ),
    ),
    _llama4(
        "test_bad_sibling_call_does_not_drop_good_calls[False]",
        "<|python_start|>[bad(x=b'z'), get_weather(city='LA', metric='C')]<|python_end|>",
        (("get_weather", {"city": "LA", "metric": "C"}),),
        problems=("expected a JSON value, got bytes @ arguments.x",),
    ),
]

# ------------------------------------------------------------------------------------- granite

GRANITE_TESTS = "tests/tool_parsers/test_granite_tool_parser.py"


_granite = _VllmFamily("granite", GRANITE_TESTS, prefix="TestGraniteToolParser::")


GRANITE: list[Case] = [
    _granite(
        "test_no_tool_calls (ToolParserTestConfig data)",
        "This is a regular response without any tool calls.",
        (),
        content="This is a regular response without any tool calls.",
    ),
    _granite(
        "test_single_tool_call (ToolParserTestConfig data)",
        '<|tool_call|> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]',
        (("get_weather", {"city": "Tokyo"}),),
        content="",
    ),
    _granite(
        "test_parallel_tool_calls (ToolParserTestConfig data)",
        '<|tool_call|> [\n  {"name": "get_weather", "arguments": {"city": "Tokyo"}},\n'
        '  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n]',
        (("get_weather", None), ("get_time", None)),
    ),
    _granite(
        "test_various_data_types (ToolParserTestConfig data)",
        '<tool_call> [{\n  "name": "test_function",\n  "arguments": {\n'
        '    "string_field": "hello",\n    "int_field": 42,\n    "float_field": 3.14,\n'
        '    "bool_field": true,\n    "null_field": null,\n'
        '    "array_field": ["a", "b", "c"],\n    "object_field": {"nested": "value"},\n'
        '    "empty_array": [],\n    "empty_object": {}\n  }\n}]',
        (("test_function", _VARIOUS_TYPES),),
    ),
    _granite(
        "test_empty_arguments (ToolParserTestConfig data)",
        '<|tool_call|> [{"name": "refresh", "arguments": {}}]',
        (("refresh", {}),),
    ),
    _granite(
        "test_escaped_strings (ToolParserTestConfig data)",
        '<tool_call> [{\n  "name": "test_function",\n  "arguments": {\n'
        '    "quoted": "He said \\"hello\\"",\n    "path": "C:\\\\Users\\\\file.txt",\n'
        '    "newline": "line1\\nline2",\n    "unicode": "emoji: \U0001f389"\n  }\n}]',
        (
            (
                "test_function",
                {
                    "quoted": 'He said "hello"',
                    "path": "C:\\Users\\file.txt",
                    "newline": "line1\nline2",
                    "unicode": "emoji: \U0001f389",
                },
            ),
        ),
    ),
    _granite(
        "test_malformed_input[0] (ToolParserTestConfig data)",
        '<|tool_call|> [{"name": "func", "arguments": {',
        (),
        problems=("truncated JSON @ arguments",),
    ),
    _granite(
        "test_malformed_input[1] (ToolParserTestConfig data)",
        '<|tool_call|> {"name": "func", "arguments": {}}',
        (),
        problems=("expected a JSON array of calls @ call",),
    ),
    _granite(
        "test_malformed_input[2] (ToolParserTestConfig data)",
        '[{"name": "func", "arguments": "not a dict"}]',
        (),
    ),
    _granite(
        "test_malformed_input[3] (ToolParserTestConfig data)",
        'Some text [{"name": "func"}]',
        (),
    ),
    _granite(
        "test_granite_string_prefix_format",
        '<tool_call> [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]',
        (("get_weather", None),),
    ),
    Case(
        family="granite",
        repo=VLLM,
        file=GRANITE_TESTS,
        test="test_streaming_parallel_calls_single_delta (final)",
        text='<|tool_call|>[{"name": "get_weather", "arguments": {"x": 42}}, '
        '{"name": "b", "arguments": {"y": 7}}]',
        calls=(("get_weather", {"x": 42}), ("b", {"y": 7})),
    ),
    Case(
        family="granite",
        repo=VLLM,
        file=GRANITE_TESTS,
        test="test_streaming_parallel_calls_batched_deltas (final)",
        text='<|tool_call|> [{"arguments": {"city": "Tokyo"}, "name": "get_weather"}, '
        '{"arguments": {"timezone": "Asia/Tokyo"}, "name": "get_time"}]',
        calls=(("get_weather", {"city": "Tokyo"}), ("get_time", None)),
    ),
]

# ------------------------------------------------------------------------------------ seed-oss

SEED_OSS_TESTS = "tests/tool_parsers/test_seed_oss_tool_parser.py"
_SEED_TOOLS: tuple[Tool, ...] = (
    (
        "get_weather",
        {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "City and country e.g. Bogot\u00e1, Colombia",
                },
                "unit": {"type": "string", "description": "this is the unit of temperature"},
            },
            "required": ["location"],
            "additionalProperties": False,
        },
    ),
)
_SEED_BARCELONA = (
    "<seed:tool_call>\n<function=get_weather>\n"
    "<parameter=location>Barcelona, Spain</parameter>\n</function>\n</seed:tool_call>"
)
_SEED_THINK_512 = (
    "<seed:think>The user's current thinking budget is 512.</seed:cot_budget_reflect>\n"
    "Let me analyze the question. The user wants to know the weather in Barcelona, Spain. "
    "\n<seed:cot_budget_reflect>I have used 131 tokens, and there are 381 tokens remaining "
    "for use.</seed:cot_budget_reflect>\n The unit parameter can be omitted since it's "
    "optional.</seed:think>\n"
)
_SEED_THINK_WITH_CALL = (
    "<seed:think>\nGot it, let's see. The user asked for the weather in Barcelona, Spain. "
    "Let me format the function call correctly. The format is <seed:tool_call>\n"
    "<function=get_weather>\n<parameter=location>Barcelona, Spain</parameter>\n"
    "<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>. Wait, but does "
    'the unit parameter accept "celsius"? Let me go with that.</seed:think>'
)

SEED_OSS: list[Case] = [
    Case(
        family="seed_oss",
        repo=VLLM,
        file=SEED_OSS_TESTS,
        test="test_extract_tool_calls_no_tools",
        text="This is a test response without any tool calls",
        content="This is a test response without any tool calls",
    ),
    Case(
        family="seed_oss",
        repo=VLLM,
        file=SEED_OSS_TESTS,
        test="test_extract_tool_calls[tool_call_0_thinking_budget]",
        text=_SEED_BARCELONA,
        tools=_SEED_TOOLS,
        calls=(("get_weather", {"location": "Barcelona, Spain"}),),
        content="",
    ),
    Case(
        family="seed_oss",
        repo=VLLM,
        file=SEED_OSS_TESTS,
        test="test_extract_tool_calls[tool_call_512_thinkg_budget] (thinking shortened)",
        text=_SEED_THINK_512 + _SEED_BARCELONA,
        tools=_SEED_TOOLS,
        calls=(("get_weather", {"location": "Barcelona, Spain"}),),
        content=_SEED_THINK_512,
        difference="reasoning",
        ours=Ours(calls=(("get_weather", {"location": "Barcelona, Spain"}),), content=""),
    ),
    Case(
        family="seed_oss",
        repo=VLLM,
        file=SEED_OSS_TESTS,
        test="test_extract_tool_calls[tool_call_unlimited_thinking_budget] (thinking shortened)",
        text=_SEED_THINK_WITH_CALL
        + "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, Spain"
        "</parameter>\n<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>",
        tools=_SEED_TOOLS,
        calls=(("get_weather", {"location": "Barcelona, Spain", "unit": "celsius"}),),
        content=_SEED_THINK_WITH_CALL,
        difference="reasoning",
        ours=Ours(
            calls=(("get_weather", {"location": "Barcelona, Spain", "unit": "celsius"}),),
            content="",
        ),
    ),
]

# ------------------------------------------------------------------------------------- sglang


def _sglang_pythonic(test: str, text: str, calls: tuple[Call, ...], **more: object) -> Case:
    return Case(
        family="pythonic",
        repo=SGLANG,
        file=SGLANG_TESTS,
        test=f"TestPythonicDetector::{test}",
        text=text,
        calls=calls,
        **more,  # type: ignore[arg-type]  # the optional Case fields, checked by attrs
    )


SGLANG_PYTHONIC: list[Case] = [
    _sglang_pythonic(
        "test_parse_streaming_no_brackets",
        "This is just normal text without any tool calls.",
        (),
        content="This is just normal text without any tool calls.",
    ),
    _sglang_pythonic(
        "test_parse_streaming_complete_tool_call",
        "Here's a tool call: [get_weather(location='New York', unit='celsius')]",
        (("get_weather", {"location": "New York", "unit": "celsius"}),),
        content="Here's a tool call: ",
    ),
    _sglang_pythonic(
        "test_parse_streaming_text_before_tool_call",
        "This is some text before [get_weather(location='London')]",
        (("get_weather", {"location": "London"}),),
        content="This is some text before ",
    ),
    _sglang_pythonic(
        "test_parse_streaming_bracket_without_text_before",
        "[search(query='python programming')]",
        (("search", {"query": "python programming"}),),
        content="",
    ),
    _sglang_pythonic(
        "test_parse_streaming_text_after_tool_call (both increments)",
        "[get_weather(location='Tokyo')] Here's the forecast:",
        (("get_weather", {"location": "Tokyo"}),),
        content=" Here's the forecast:",
    ),
    _sglang_pythonic(
        "test_parse_streaming_multiple_tool_calls (both increments)",
        "[get_weather(location='Berlin')] and [search(query='restaurants')]",
        (("get_weather", {"location": "Berlin"}), ("search", {"query": "restaurants"})),
        content=" and ",
    ),
    _sglang_pythonic(
        "test_parse_streaming_nested_brackets",
        "[get_weather(location='New York', unit='celsius', data=[1, 2, 3])]",
        (("get_weather", {"location": "New York", "unit": "celsius", "data": [1, 2, 3]}),),
        content="",
    ),
    _sglang_pythonic(
        "test_parse_streaming_nested_brackets_dict",
        "[search(query='test', config={'options': [1, 2], 'nested': {'key': 'value'}})]",
        (("search", {"query": "test", "config": {"options": [1, 2], "nested": {"key": "value"}}}),),
        content="",
    ),
    _sglang_pythonic(
        "test_parse_streaming_multiple_tools_with_nested_brackets",
        "[get_weather(location='Paris', data=[10, 20]), search(query='test', filters=['a', 'b'])]",
        (
            ("get_weather", {"location": "Paris", "data": [10, 20]}),
            ("search", {"query": "test", "filters": ["a", "b"]}),
        ),
        content="",
    ),
    _sglang_pythonic(
        "test_parse_streaming_partial_tool_call (first chunk alone)",
        "Let me check the weather: [get_weather(location=",
        (),
        content="Let me check the weather: ",
        problems=("truncated call @ call",),
    ),
    _sglang_pythonic(
        "test_parse_streaming_with_python_start_and_end_token (one chunk)",
        "Here's a call: <|python_start|>[get_weather(location='Tokyo', data=[1, 2, 3])]"
        "<|python_end|>",
        (("get_weather", {"location": "Tokyo", "data": [1, 2, 3]}),),
        content="Here's a call: ",
    ),
    _sglang_pythonic(
        "test_detect_and_parse_with_python_start_and_end_token",
        "User wants to get the weather in Mars. <|python_start|>[get_weather(location='Mars', "
        "unit='celsius')]<|python_end|> In this way we will get the weather in Mars.",
        (("get_weather", {"location": "Mars", "unit": "celsius"}),),
        content=(
            "User wants to get the weather in Mars.  In this way we will get the weather in Mars."
        ),
    ),
]


def _sglang(family: str, test: str, text: str, calls: tuple[Call, ...], **more: object) -> Case:
    return Case(
        family=family,
        repo=SGLANG,
        file=SGLANG_TESTS,
        test=test,
        text=text,
        calls=calls,
        **more,  # type: ignore[arg-type]  # the optional Case fields, checked by attrs
    )


_CITY: JSONObject = {"type": "string", "description": "City name"}
_SGLANG_CITY_TOOLS: tuple[Tool, ...] = (
    ("get_weather", {"type": "object", "properties": {"city": _CITY}, "required": ["city"]}),
    (
        "get_tourist_attractions",
        {"type": "object", "properties": {"city": _CITY}, "required": ["city"]},
    ),
)
_DECISION_TOOLS: tuple[Tool, ...] = (
    (
        "make_next_step_decision",
        {
            "type": "object",
            "properties": {"decision": {"type": "string"}, "content": {"type": "string"}},
            "required": ["decision", "content"],
        },
    ),
)
# SGLang's Qwen3-Coder tools omit the top-level "type": "object" that ToolSpec requires.
_SGLANG_QWEN_TOOLS = QWEN_TOOLS
_GLM_SGLANG_TOOLS: tuple[Tool, ...] = (
    (
        "get_weather",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "date": {"type": "string"}},
            "required": ["city", "date"],
        },
    ),
)
_TODOS = (
    '[{"id": "1", "task": "Check for hard-coded issues in the backend code", '
    '"status": "in_progress"}, {"id": "2", "task": "Check for hard-coded issues in the '
    'frontend code", "status": "pending"}, {"id": "3", "task": "Check for code violating the '
    'Single Responsibility Principle", "status": "pending"}, {"id": "4", "task": "Generate a '
    'rectification proposal report", "status": "pending"}]'
)
_TODO_TOOLS: tuple[Tool, ...] = (
    (
        "todo_write",
        {"type": "object", "properties": {"todos": {"type": "array"}}, "required": ["todos"]},
    ),
)
_GLM_BEIJING_0627 = (
    "<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
    "<arg_key>date</arg_key>\n<arg_value>2024-06-27</arg_value>\n"
    "</tool_call>"
)
_K_PARIS = (
    '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
    "<|tool_call_end|>"
)
_MISTRAL_BRACKETS = (
    "```\nTOOL: Access a weather API or service\nOBSERVATION: Retrieve the current weather "
    "data for the top 5 populated cities in the US\nANSWER: The weather in the top 5 populated "
    "cities in the US is as follows: [City Name] - [Weather Conditions] - [Temperature]\n```"
)

SGLANG_OTHERS: list[Case] = [
    _sglang(
        "mistral",
        "TestMistralDetector::test_detect_and_parse_with_nested_brackets_in_content",
        '[TOOL_CALLS] [{"name":"make_next_step_decision", "arguments":{"decision":"",'
        '"content":' + json.dumps(_MISTRAL_BRACKETS) + "}}]",
        (("make_next_step_decision", {"decision": "", "content": _MISTRAL_BRACKETS}),),
        tools=_DECISION_TOOLS,
        content="",
    ),
    _sglang(
        "mistral",
        "TestMistralDetector::test_detect_and_parse_simple_case",
        '[TOOL_CALLS] [{"name":"make_next_step_decision", "arguments":{"decision":"TOOL", '
        '"content":"Use weather API"}}]',
        (("make_next_step_decision", {"decision": "TOOL", "content": "Use weather API"}),),
        tools=_DECISION_TOOLS,
    ),
    _sglang(
        "mistral",
        "TestMistralDetector::test_detect_and_parse_no_tool_calls",
        "This is just normal text without any tool calls.",
        (),
        tools=_DECISION_TOOLS,
        content="This is just normal text without any tool calls.",
    ),
    _sglang(
        "mistral",
        "TestMistralDetector::test_detect_and_parse_with_text_before_tool_call",
        'Here is some text before the tool call: [TOOL_CALLS] [{"name":"make_next_step_decision",'
        ' "arguments":{"decision":"ANSWER", "content":"The answer is 42"}}]',
        (("make_next_step_decision", {"decision": "ANSWER", "content": "The answer is 42"}),),
        tools=_DECISION_TOOLS,
        content="Here is some text before the tool call:",
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_single_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        (("get_weather", {"city": "Paris"}),),
        tools=_SGLANG_CITY_TOOLS,
        content="",
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_multiple_json_with_separator",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}};'
        '{"name": "get_tourist_attractions", "parameters": {"city": "Paris"}}',
        (("get_weather", {"city": "Paris"}), ("get_tourist_attractions", {"city": "Paris"})),
        tools=_SGLANG_CITY_TOOLS,
        content="",
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_multiple_json_with_separator_customized",
        '<|python_tag|>{"name": "get_weather", "parameters": {}}'
        '<|python_tag|>{"name": "get_tourist_attractions", "parameters": {}}',
        (("get_weather", {}), ("get_tourist_attractions", {})),
        content="",
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_json_with_trailing_text",
        '{"name": "get_weather", "parameters": {}} Some follow-up text',
        (("get_weather", {}),),
        content="Some follow-up text",
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_invalid_then_valid_json",
        '{"name": "get_weather", "parameters": {{"name": "get_weather", "parameters": {}}',
        (("get_weather", None),),
        difference="no-salvage",
        ours=Ours(content="", problems=("truncated JSON @ parameters",)),
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_plain_text_only",
        "This is just plain explanation text.",
        (),
        content="This is just plain explanation text.",
    ),
    _sglang(
        "llama3_json",
        "TestLlama32Detector::test_with_python_tag_prefix",
        'Some intro. <|python_tag|>{"name": "get_weather", "parameters": {}}',
        (("get_weather", {}),),
        content="Some intro.",
    ),
    _sglang(
        "kimi_k2",
        "TestKimiK2Detector::test_single_tool_call",
        f"<|tool_calls_section_begin|>{_K_PARIS}<|tool_calls_section_end|>",
        (("get_weather", {"city": "Paris"}),),
        tools=_SGLANG_CITY_TOOLS,
        content="",
    ),
    _sglang(
        "kimi_k2",
        "TestKimiK2Detector::test_multiple_tool_calls",
        f"<|tool_calls_section_begin|>{_K_PARIS}<|tool_call_begin|>"
        "functions.get_tourist_attractions:1<|tool_call_argument_begin|>"
        '{"city": "London"}<|tool_call_end|><|tool_calls_section_end|>',
        (("get_weather", {"city": "Paris"}), ("get_tourist_attractions", {"city": "London"})),
        tools=_SGLANG_CITY_TOOLS,
        content="",
    ),
    _sglang(
        "kimi_k2",
        "TestKimiK2Detector::test_invalid_tool_call",
        'invalid_tool:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        (),
        tools=_SGLANG_CITY_TOOLS,
        content='invalid_tool:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
    ),
    _sglang(
        "kimi_k2",
        "TestKimiK2Detector::test_partial_tool_call (final chunk)",
        f"<|tool_calls_section_begin|>{_K_PARIS.split('{', maxsplit=1)[0]}" + '{"city": "Paris"',
        (("get_weather", None),),
        tools=_SGLANG_CITY_TOOLS,
        difference="problem-not-content",
        ours=Ours(content="", problems=("truncated JSON @ arguments",)),
    ),
    _sglang(
        "qwen3_coder",
        "TestQwen3CoderDetector::test_edge_case_no_parameters",
        "<tool_call>\n<function=get_current_weather>\n</function>\n</tool_call>",
        (("get_current_weather", {}),),
    ),
    _sglang(
        "qwen3_coder",
        "TestQwen3CoderDetector::test_edge_case_special_chars_in_value",
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas->TX\n"
        "</parameter>\n</function>\n</tool_call>",
        (("get_current_weather", {"city": "Dallas->TX"}),),
    ),
    _sglang(
        "qwen3_coder",
        "TestQwen3CoderDetector::test_detect_and_parse_parallel_tools",
        _DALLAS + "\n" + _ORLANDO,
        (
            ("get_current_weather", _DALLAS_ARGS),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
        ),
        tools=_SGLANG_QWEN_TOOLS,
        content="\n",
    ),
    _sglang(
        "qwen3_coder",
        "TestQwen3CoderDetector::test_parse_streaming_multiple_tools (final)",
        "<tool_call>\n        <function=get_current_weather>\n        <parameter=city>\n"
        "        Dallas\n        </parameter>\n        <parameter=state>\n        TX\n"
        "        </parameter>\n        </function>\n        </tool_call>\n"
        "        Some text in between.\n        <tool_call>\n        <function=calculate_area>\n"
        "        <parameter=shape>\n        circle\n        </parameter>\n"
        '        <parameter=dimensions>\n        {"radius": 5}\n        </parameter>\n'
        "        </function>\n        </tool_call>",
        (
            ("get_current_weather", {"city": "Dallas", "state": "TX"}),
            ("calculate_area", {"shape": "circle", "dimensions": {"radius": 5}}),
        ),
        tools=_SGLANG_QWEN_TOOLS,
        difference="value-whitespace",
        ours=Ours(
            calls=(
                (
                    "get_current_weather",
                    {"city": "        Dallas\n        ", "state": "        TX\n        "},
                ),
                (
                    "calculate_area",
                    {"shape": "        circle\n        ", "dimensions": {"radius": 5}},
                ),
            ),
            content="Some text in between.",
        ),
    ),
    _sglang(
        "glm45",
        "TestGlm4MoeDetector::test_single_tool_call",
        _GLM_BEIJING_0627,
        (("get_weather", {"city": "Beijing", "date": "2024-06-27"}),),
        tools=_GLM_SGLANG_TOOLS,
        content="",
    ),
    _sglang(
        "glm45",
        "TestGlm4MoeDetector::test_multiple_tool_calls",
        _GLM_BEIJING_0627
        + _GLM_BEIJING_0627.replace("Beijing", "Shanghai").replace("06-27", "06-28"),
        (
            ("get_weather", {"city": "Beijing", "date": "2024-06-27"}),
            ("get_weather", {"city": "Shanghai", "date": "2024-06-28"}),
        ),
        tools=_GLM_SGLANG_TOOLS,
        content="",
    ),
    _sglang(
        "glm45",
        "TestGlm4MoeDetector::test_invalid_tool_call",
        "<tool_call>invalid_func\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "</tool_call>",
        (),
        tools=_GLM_SGLANG_TOOLS,
        problems=("unknown tool 'invalid_func' @ name",),
    ),
    _sglang(
        "glm45",
        "TestGlm4MoeDetector::test_array_argument_with_escaped_json[plain]",
        f"<tool_call>todo_write\n<arg_key>todos</arg_key>\n<arg_value>{_TODOS}</arg_value>\n"
        "</tool_call>",
        (("todo_write", {"todos": json.loads(_TODOS)}),),
        tools=_TODO_TOOLS,
    ),
    _sglang(
        "glm45",
        "TestGlm4MoeDetector::test_array_argument_with_escaped_json[raw string]",
        "<tool_call>todo_write\\n<arg_key>todos</arg_key>\\n<arg_value>"
        + _TODOS.replace('"', '\\"')
        + "</arg_value>\n</tool_call>",
        (("todo_write", {"todos": json.loads(_TODOS)}),),
        tools=_TODO_TOOLS,
        difference="escaped-markup",
        ours=Ours(content="", problems=("invalid tool name",)),
    ),
]

CASES: list[Case] = [
    *HERMES,
    *QWEN3_CODER,
    *LLAMA3_JSON,
    *MISTRAL,
    *DEEPSEEK_V3,
    *DEEPSEEK_V31,
    *KIMI_K2,
    *GLM45,
    *PYTHONIC,
    *GRANITE,
    *SEED_OSS,
    *SGLANG_PYTHONIC,
    *SGLANG_OTHERS,
]
"""Every case, family by family."""
