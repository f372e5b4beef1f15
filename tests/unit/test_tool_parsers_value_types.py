"""Typing text-written parameter values by the JSON types their schema allows."""

from __future__ import annotations

import pytest

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers.base import JSONFault
from trajcore.domain.tool_parsers.value_types import allowed_types, type_value

ROOT: JSONObject = {
    "type": "object",
    "$defs": {
        "Address": {"type": "object", "properties": {"city": {"type": "string"}}},
        "Count": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "Loop": {"$ref": "#/$defs/Loop"},
    },
    "definitions": {"Flag": {"type": "boolean"}},
}


@pytest.mark.parametrize(
    ("schema", "kinds"),
    [
        ({"type": "integer"}, ("integer",)),
        ({"type": ["integer", "null"]}, ("integer", "null")),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, ("integer", "null")),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ("string", "integer")),
        ({"allOf": [{"type": "object"}]}, ("object",)),
        ({"$ref": "#/$defs/Address"}, ("object",)),
        ({"$ref": "#/definitions/Flag"}, ("boolean",)),
        ({"anyOf": [{"$ref": "#/$defs/Count"}, {"type": "string"}]}, ("integer", "null", "string")),
        ({"$ref": "#/$defs/Loop"}, ()),
        ({"$ref": "#/$defs/Missing"}, ()),
        ({"$ref": "https://example.com/schema"}, ()),
        ({"enum": ["a", 1]}, ("string", "integer")),
        ({"const": True}, ("boolean",)),
        ({"properties": {"x": {}}}, ("object",)),
        ({"items": {}}, ("array",)),
        ({"description": "anything"}, ()),
        ({"type": "float"}, ()),
        (None, ()),
    ],
)
def test_allowed_types_follow_the_schema_in_order(schema: JSON, kinds: tuple[str, ...]) -> None:
    assert allowed_types(schema, ROOT) == kinds


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("5", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 5),
        ("None", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, None),
        ("null", {"type": ["object", "null"]}, None),
        ("null", {"type": "string"}, "null"),
        ("None", {"type": "integer"}, "None"),
        ('{"a": 1}', {"anyOf": [{"type": "object"}, {"type": "null"}]}, {"a": 1}),
        ('{"city": "Paris"}', {"$ref": "#/$defs/Address"}, {"city": "Paris"}),
        ("{'k': 'v', 'n': [1, None]}", {"type": "object"}, {"k": "v", "n": [1, None]}),
        ("('a', 'b')", {"type": "array"}, "('a', 'b')"),
        ("['a', True]", {"type": "array"}, ["a", True]),
        ("42", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "42"),
        ("42", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 42),
        ("some text", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "some text"),
        ("True", {"$ref": "#/definitions/Flag"}, True),
        ("false", {"type": "boolean"}, False),
        ("2.5", {"type": "number"}, 2.5),
        ("2.5", {"type": "integer"}, "2.5"),
        ("ten", {"type": "integer"}, "ten"),
        ("true", {"type": "integer"}, "true"),
        (" 7 ", {"type": "integer"}, 7),
        ("  keep  ", {"type": "string"}, "  keep  "),
        ("  keep  ", {}, "  keep  "),
        ("[1, 2]", {"type": "object"}, "[1, 2]"),
        ("{'x': b'z'}", {"type": "object"}, JSONFault(reason="invalid JSON")),
    ],
)
def test_type_value_reads_text_as_the_first_allowed_type(
    text: str, schema: JSON, value: JSON | JSONFault
) -> None:
    got = type_value(text, schema, ROOT)
    if isinstance(value, JSONFault):
        assert isinstance(got, JSONFault)
        assert got.reason.startswith(value.reason)
    else:
        assert got == value
        assert type(got) is type(value)


def test_broken_json_where_an_object_is_expected_is_a_fault() -> None:
    assert type_value('{"a": ', {"type": "object"}) == JSONFault(reason="truncated JSON")
    assert type_value('{"a": ', {"type": ["object", "string"]}) == '{"a": '
