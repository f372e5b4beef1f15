"""The decisions of the domain's built-in argument checker: which schemas it takes when a tool is
built (and the path and reason of each refusal), and which arguments fit a schema it took."""

from __future__ import annotations

from typing import Any

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.tool_schema import BuiltinArgumentValidator

VALIDATOR = BuiltinArgumentValidator()


def _problems(schema: dict[str, Any], value: object) -> list[str]:
    return [str(p) for p in VALIDATOR.compile("t", schema)(value)]


def _refusal(schema: object) -> tuple[str, str]:
    with pytest.raises(ConfigError) as caught:
        VALIDATOR.compile("calc", schema)  # type: ignore[arg-type]
    return caught.value.field, caught.value.reason


# ------------------------------------------------------------------ schemas taken at build time


def test_a_schema_that_is_no_object_is_refused_at_its_path() -> None:
    """The root is ``parameters``; a nested schema is named by its path below it."""
    assert _refusal([]) == ("parameters", "tool 'calc': a schema must be a JSON object")
    assert _refusal({"type": "object", "properties": {"a": 3}}) == (
        "parameters.properties.a",
        "tool 'calc': a schema must be a JSON object",
    )


def test_a_keyword_the_checker_does_not_enforce_is_refused_naming_it_and_the_way_out() -> None:
    """No keyword is ignored silently: the refusal names its path and the full validator."""
    assert _refusal({"type": "object", "minProperties": 1}) == (
        "parameters.minProperties",
        "tool 'calc': keyword 'minProperties' is not enforced by the built-in checker; build "
        "the ToolSpec with validator=JSONSchemaValidator() from trajcore.adapters.json_schema",
    )


def test_annotations_and_every_enforced_keyword_are_taken() -> None:
    """Describing keywords pass; the six enforced ones are each accepted."""
    VALIDATOR.compile(
        "t",
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$comment": "c",
            "title": "T",
            "description": "d",
            "default": {},
            "examples": [{}],
            "deprecated": False,
            "readOnly": False,
            "writeOnly": False,
            "type": "object",
            "properties": {"a": {"type": "array", "items": {"type": "string"}}},
            "required": ["a"],
            "additionalProperties": {"type": "integer"},
            "enum": [{"a": []}],
        },
    )


def test_every_named_type_must_be_a_json_schema_type() -> None:
    """A type list is checked name by name; a schema without a type is taken."""
    assert _refusal({"type": ["string", "strin"]}) == (
        "parameters.type",
        "tool 'calc': unknown JSON-schema type 'strin'",
    )
    assert _refusal({"type": "float"})[1] == "tool 'calc': unknown JSON-schema type 'float'"
    VALIDATOR.compile("t", {"type": ["string", "null", "number", "boolean", "integer"]})
    VALIDATOR.compile("t", {"properties": {}})


def test_properties_must_be_an_object_of_schemas_each_checked_at_its_path() -> None:
    assert _refusal({"properties": ["a"]}) == (
        "parameters.properties",
        "tool 'calc': must be an object of schemas",
    )
    assert _refusal({"properties": {"a": {"type": "object", "properties": {"b": {"x": 1}}}}}) == (
        "parameters.properties.a.properties.b.x",
        "tool 'calc': keyword 'x' is not enforced by the built-in checker; build the ToolSpec "
        "with validator=JSONSchemaValidator() from trajcore.adapters.json_schema",
    )


@pytest.mark.parametrize("required", ["a", ["a", 1], {"a": True}])
def test_required_must_be_a_list_of_property_names(required: object) -> None:
    assert _refusal({"required": required}) == (
        "parameters.required",
        "tool 'calc': must be a list of property names",
    )


def test_items_and_additional_properties_are_schemas_checked_at_their_paths() -> None:
    """``additionalProperties`` may also be a bool; anything else must be a schema."""
    assert _refusal({"items": {"type": "strin"}}) == (
        "parameters.items.type",
        "tool 'calc': unknown JSON-schema type 'strin'",
    )
    assert _refusal({"items": 3}) == (
        "parameters.items",
        "tool 'calc': a schema must be a JSON object",
    )
    assert _refusal({"additionalProperties": {"type": "strin"}}) == (
        "parameters.additionalProperties.type",
        "tool 'calc': unknown JSON-schema type 'strin'",
    )
    assert _refusal({"additionalProperties": "no"}) == (
        "parameters.additionalProperties",
        "tool 'calc': a schema must be a JSON object",
    )
    VALIDATOR.compile("t", {"additionalProperties": False})
    VALIDATOR.compile("t", {"additionalProperties": True})


def test_enum_must_be_a_list() -> None:
    assert _refusal({"enum": "ab"}) == ("parameters.enum", "tool 'calc': must be a list")
    assert _refusal({"enum": {"a": 1}}) == ("parameters.enum", "tool 'calc': must be a list")


# ------------------------------------------------------------------ arguments against a schema


@pytest.mark.parametrize(
    ("kind", "fits", "misses"),
    [
        ("integer", [0, -3, 3.0], [True, 3.5, "3", None]),
        ("number", [0, 2.5, -1], [False, "1", None]),
        ("boolean", [True, False], [0, 1, "true"]),
        ("string", ["", "x"], [1, None, ["x"]]),
        ("null", [None], [0, "", False]),
        ("array", [[], [1]], [{}, "[]"]),
        ("object", [{}, {"a": 1}], [[], "{}"]),
    ],
)
def test_each_type_takes_its_own_values_only(
    kind: str, fits: list[object], misses: list[object]
) -> None:
    """A bool is never a number; an integral float is an integer; a number is an int or a
    float."""
    for value in fits:
        assert _problems({"type": kind}, value) == [], value
    for value in misses:
        assert _problems({"type": kind}, value) != [], value


def test_a_type_mismatch_is_the_only_problem_reported_for_its_value() -> None:
    """When the type is wrong nothing else about the value is judged (its enum, its
    properties); the reason names every type allowed and the JSON type given."""
    schema = {"type": ["integer", "null"], "enum": [1]}
    assert _problems(schema, "x") == ["expected integer or null, got string @ $"]
    object_schema = {"type": "object", "required": ["a"], "enum": [{"a": 1}]}
    assert _problems(object_schema, [1]) == ["expected object, got array @ $"]


def test_a_value_outside_the_enum_is_named_with_the_allowed_values() -> None:
    assert _problems({"enum": ["fast", "slow"]}, "medium") == [
        "must be one of ['fast', 'slow'] @ $"
    ]
    assert _problems({"enum": ["fast", "slow"]}, "slow") == []


@pytest.mark.parametrize(
    ("allowed", "value"),
    [
        (1, 1.0),
        (1.0, 1),
        ("a", "a"),
        (None, None),
        (True, True),
        (False, False),
        ([1, [2]], [1.0, [2.0]]),
        ({"a": 1, "b": [True]}, {"b": [True], "a": 1.0}),
        ([], []),
        ({}, {}),
    ],
)
def test_enum_values_compare_as_json_values(allowed: object, value: object) -> None:
    """JSON's equality: ``1`` is ``1.0``, containers deeply, keys in any order."""
    assert _problems({"enum": [allowed]}, value) == []


@pytest.mark.parametrize(
    ("allowed", "value"),
    [
        (1, True),
        (True, 1),
        (0, False),
        (False, 0),
        (True, False),
        (False, True),
        ([1], [True]),
        ([1, 2], [1]),
        ([1], [1, 2]),
        ([1, 2], [2, 1]),
        ({"a": 1}, {"a": True}),
        ({"a": 1}, {"b": 1}),
        ({"a": 1}, {"a": 1, "b": 2}),
        ([], {}),
        ({}, []),
        ([1], 1),
        (1, [1]),
        ({"a": 1}, "a"),
        ("a", {"a": 1}),
        ("1", 1),
    ],
)
def test_enum_values_of_other_json_types_or_contents_differ(allowed: object, value: object) -> None:
    """``true`` is not ``1``, a list is not an object nor its only item, and containers
    differ when their lengths, keys or items do."""
    assert _problems({"enum": [allowed]}, value) == ["must be one of " + repr([allowed]) + " @ $"]


def test_an_objects_problems_are_its_missing_required_then_each_propertys_in_order() -> None:
    """Every missing required name is reported at its path, then each given property's own
    problems in the order they came; the enum's problem comes before all of them."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["x", "a", "y"],
        "enum": [{}],
    }
    assert _problems(schema, {"b": 1, "a": "1"}) == [
        "must be one of [{}] @ $",
        "required @ $.x",
        "required @ $.y",
        "expected string, got integer @ $.b",
        "expected integer, got string @ $.a",
    ]


def test_properties_outside_the_schema_follow_additional_properties() -> None:
    """``false`` refuses them by name; a schema checks them; ``true`` or no setting lets them
    pass."""
    base: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    value = {"a": 1, "b": "x", "c": 2}
    assert _problems({**base, "additionalProperties": False}, value) == [
        "unexpected property @ $.b",
        "unexpected property @ $.c",
    ]
    assert _problems({**base, "additionalProperties": {"type": "integer"}}, value) == [
        "expected integer, got string @ $.b"
    ]
    assert _problems({**base, "additionalProperties": True}, value) == []
    assert _problems(base, value) == []


def test_an_object_schema_without_properties_or_required_judges_only_additional_ones() -> None:
    assert _problems({"additionalProperties": False}, {"a": 1}) == ["unexpected property @ $.a"]
    assert _problems({"required": ["a"]}, {"a": None}) == []
    assert _problems({"required": ["a"]}, {}) == ["required @ $.a"]


def test_an_arrays_items_are_each_checked_at_their_index() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    assert _problems(schema, ["a", 1, "b", None]) == [
        "expected string, got integer @ $[1]",
        "expected string, got null @ $[3]",
    ]
    assert _problems({"type": "array"}, [1, "a"]) == []


def test_nested_problems_name_the_whole_path_from_the_arguments() -> None:
    schema = {
        "type": "object",
        "properties": {
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"mode": {"enum": ["r", "w"]}},
                    "required": ["path"],
                },
            }
        },
    }
    assert _problems(schema, {"files": [{"path": "a"}, {"mode": "x"}]}) == [
        "required @ $.files[1].path",
        "must be one of ['r', 'w'] @ $.files[1].mode",
    ]


def test_keywords_for_other_kinds_of_value_are_not_applied() -> None:
    """``properties`` and ``required`` judge objects only, ``items`` arrays only."""
    schema = {
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "items": {"type": "string"},
    }
    assert _problems(schema, "text") == []
    assert _problems(schema, [1]) == ["expected string, got integer @ $[0]"]
    assert _problems(schema, {"b": 1}) == ["required @ $.a"]
