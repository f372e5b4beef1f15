"""Decisions of the value typing (``tool_parsers.value_types``) that its tests check only in part
(found by mutation testing): each test's docstring names the decision it pins."""

from __future__ import annotations

import sys

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tool_parsers.base import JSONFault
from trajcore.domain.tool_parsers.value_types import allowed_types, type_value

ROOT: JSONObject = {
    "type": "object",
    "$defs": {
        "a/b": {"type": "integer"},
        "a~b": {"type": "boolean"},
        "L": [{"type": "string"}, {"type": "integer"}],
    },
}


def test_a_reference_reads_json_pointer_escapes() -> None:
    """Pins the JSON pointer escapes of a local ``$ref``: ``~1`` is ``/`` and ``~0`` is ``~``."""
    assert allowed_types({"$ref": "#/$defs/a~1b"}, ROOT) == ("integer",)
    assert allowed_types({"$ref": "#/$defs/a~0b"}, ROOT) == ("boolean",)


def test_a_reference_indexes_lists_by_number_within_their_length() -> None:
    """Pins how a pointer walks a list (a number below its length) and that a number is no key
    of an object: both resolve to nothing rather than fail."""
    assert allowed_types({"$ref": "#/$defs/L/1"}, ROOT) == ("integer",)
    assert allowed_types({"$ref": "#/$defs/L/2"}, ROOT) == ()
    assert allowed_types({"$ref": "#/$defs/0"}, ROOT) == ()


def _nested(depth: int, inner: str, open_: str, close: str) -> str:
    return open_ * depth + inner + close * depth


def test_a_python_literal_as_deep_as_python_reads_it_is_a_value() -> None:
    """Pins that a Python literal nested as deep as Python's parser allows (200 brackets) is read
    whole: the depth bound of the JSON check lies beyond it, for lists and for dicts."""
    value: JSON = "a"
    for _ in range(200):
        value = [value]
    mapping: JSON = "x"
    for _ in range(150):
        mapping = {"k": mapping}
    # The check recurses once per level; a mutation run's trampolines add frames to each call.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))
    try:
        assert type_value(_nested(200, "'a'", "[", "]"), {"type": "array"}) == value
        assert type_value(_nested(150, "'x'", "{'k': ", "}"), {"type": "object"}) == mapping
    finally:
        sys.setrecursionlimit(limit)


def test_a_python_literal_holds_only_json_values() -> None:
    """Pins the JSON check of a Python literal: finite floats pass, bytes in a list do not (the
    value is then reported as broken JSON)."""
    assert type_value("{'x': 1.5, 'y': [None]}", {"type": "object"}) == {"x": 1.5, "y": [None]}
    assert isinstance(type_value("[b'x']", {"type": "array"}), JSONFault)
    assert isinstance(type_value("{'x': 1e999}", {"type": "object"}), JSONFault)


def _any_of(levels: int) -> JSON:
    schema: JSON = {"type": "integer"}
    for _ in range(levels):
        schema = {"anyOf": [schema]}
    return schema


def test_alternatives_and_references_are_followed_32_levels_deep() -> None:
    """Pins the depth bound of the schema walk: 32 levels of alternatives or references are
    read, the 33rd is not (a cycle ends there)."""
    assert allowed_types(_any_of(32)) == ("integer",)
    assert allowed_types(_any_of(33)) == ()
    defs: JSONObject = {f"R{i}": {"$ref": f"#/$defs/R{i + 1}"} for i in range(32)}
    defs["R32"] = {"type": "boolean"}
    root: JSONObject = {"type": "object", "$defs": defs}
    assert allowed_types({"$ref": "#/$defs/R1"}, root) == ("boolean",)
    assert allowed_types({"$ref": "#/$defs/R0"}, root) == ()


def test_a_schema_without_a_root_resolves_references_in_itself() -> None:
    """Pins that a schema given without a root is its own root for ``$ref``."""
    assert allowed_types({"$defs": {"N": {"type": "number"}}, "$ref": "#/$defs/N"}) == ("number",)


def test_prefix_items_allow_an_array() -> None:
    """Pins that ``prefixItems`` without a type allows an array."""
    assert allowed_types({"prefixItems": [{}]}) == ("array",)


def test_text_is_read_only_as_the_kind_asked_for() -> None:
    """Pins that a Python literal of the other container kind is no value of this one, a JSON
    string is no number, a cut-off array is a fault, and text that does not start like an
    object or array stays text."""
    assert isinstance(type_value("{'a': 1}", {"type": "array"}), JSONFault)
    assert type_value('"5"', {"type": "number"}) == '"5"'
    assert type_value("[1, ", {"type": "array"}) == JSONFault(reason="truncated JSON")
    assert type_value("Xyz", {"type": "object"}) == "Xyz"
