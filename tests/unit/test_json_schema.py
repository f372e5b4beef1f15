"""Full JSON Schema for tool arguments: every keyword enforced, bad schemas refused when built.

The schemas are the ones tool authors write: pydantic's ``model_json_schema()`` (``anyOf`` for
``Optional``, ``$ref``/``$defs`` for nested models and enums, ``const``/``oneOf`` for tagged
unions, constraints) and hand-written ones for the keywords pydantic does not emit.
"""

from __future__ import annotations

import datetime
import enum
import json
import subprocess
import sys
from typing import Annotated, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from trajcore.adapters.json_schema import ASSERTED_FORMATS, JSONSchemaValidator
from trajcore.adapters.wire import structure
from trajcore.domain.errors import ConfigError, ToolArgumentError, WireError
from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolCall, ToolSpec

FULL = JSONSchemaValidator()


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int = Field(ge=0, le=100)
    y: float = Field(gt=0, lt=1)


class Circle(BaseModel):
    kind: Literal["circle"]
    radius: float = Field(gt=0)


class Square(BaseModel):
    kind: Literal["square"]
    side: float = Field(gt=0)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=8, pattern=r"^[a-z]+$")
    count: int | None = Field(default=None, ge=2, multiple_of=2)
    ratio: float = Field(default=0.5, lt=1.0)
    mode: Literal["fast", "slow"] = "fast"
    color: Color = Color.RED
    point: Point | None = None
    tags: list[str] = Field(default_factory=list, max_length=3)
    when: datetime.date | None = None
    shape: Annotated[Circle | Square, Field(discriminator="kind")] | None = None


def _spec(parameters: JSONObject) -> ToolSpec:
    return ToolSpec(name="tool", parameters=parameters, validator=FULL)


PYDANTIC = _spec(Args.model_json_schema())
VALID: JSONObject = {"name": "ok"}


def _problems(spec: ToolSpec, arguments: JSON) -> list[str]:
    return [str(p) for p in spec.validate_arguments(arguments)]


# The fourteen checks a pydantic schema asks for, each with the problem it must produce.
PYDANTIC_CASES: list[tuple[str, JSONObject, str]] = [
    (
        "type through anyOf (Optional)",
        {"count": "4"},
        "expected integer or null, got string @ $.count",
    ),
    ("minimum", {"count": 0}, "must be >= 2 @ $.count"),
    ("multipleOf", {"count": 3}, "must be a multiple of 2 @ $.count"),
    ("exclusiveMaximum", {"ratio": 1.0}, "must be < 1.0 @ $.ratio"),
    ("minLength", {"name": ""}, "must be at least 1 characters long @ $.name"),
    ("maxLength", {"name": "abcdefghi"}, "must be at most 8 characters long @ $.name"),
    ("pattern", {"name": "AB"}, "must match the pattern '^[a-z]+$' @ $.name"),
    ("enum through Literal", {"mode": "medium"}, "must be one of ['fast', 'slow'] @ $.mode"),
    ("enum through $ref/$defs", {"color": "green"}, "must be one of ['red', 'blue'] @ $.color"),
    (
        "nested model through anyOf + $ref",
        {"point": {"x": -1, "y": 0.5}},
        "must be >= 0 @ $.point.x",
    ),
    ("exclusiveMinimum in a nested model", {"point": {"x": 1, "y": 0}}, "must be > 0 @ $.point.y"),
    ("maxItems", {"tags": ["a", "b", "c", "d"]}, "must have at most 3 items @ $.tags"),
    ("format", {"when": "2024-13-45"}, "must be a valid date @ $.when"),
    (
        "oneOf/const (tagged union)",
        {"shape": {"kind": "circle", "radius": -1}},
        "must be > 0 @ $.shape.radius",
    ),
    ("additionalProperties", {"extra": 1}, "unexpected property @ $.extra"),
]


@pytest.mark.parametrize(("check", "change", "problem"), PYDANTIC_CASES)
def test_a_pydantic_schema_is_enforced_in_full(
    check: str, change: JSONObject, problem: str
) -> None:
    arguments = {**VALID, **change}
    assert problem in _problems(PYDANTIC, arguments), check
    # pydantic itself (strict, on the JSON text) agrees these arguments are wrong.
    with pytest.raises(ValueError, match="validation error"):
        Args.model_validate_json(json.dumps(arguments), strict=True)


def test_required_and_valid_arguments() -> None:
    assert _problems(PYDANTIC, {}) == ["required @ $.name"]
    full: JSONObject = {
        "name": "abc",
        "count": 4,
        "ratio": 0.25,
        "mode": "slow",
        "color": "blue",
        "point": {"x": 3, "y": 0.5},
        "tags": ["a"],
        "when": "2024-02-29",
        "shape": {"kind": "square", "side": 2.0},
    }
    assert _problems(PYDANTIC, full) == []
    assert _problems(PYDANTIC, {**full, "count": None, "point": None, "when": None}) == []


# Keywords pydantic does not emit, each: schema of one property ``v``, a fitting value, a value
# that must fail and the problem it must produce.
KEYWORD_CASES: list[tuple[JSONObject, JSON, JSON, str]] = [
    ({"const": 3}, 3, 4, "must be 3 @ $.v"),
    ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, 1, 0, "must be >= 1 @ $.v"),
    ({"not": {"type": "string"}}, 1, "s", "must not match the schema under 'not' @ $.v"),
    (
        {"oneOf": [{"type": "integer"}, {"minimum": 0}]},
        -1,
        1,
        "matches more than one of the oneOf choices @ $.v",
    ),
    ({"type": "number", "maximum": 5}, 5, 5.5, "must be <= 5 @ $.v"),
    ({"type": "number", "exclusiveMinimum": 0}, 0.1, 0, "must be > 0 @ $.v"),
    ({"type": "array", "minItems": 1}, [1], [], "must have at least 1 items @ $.v"),
    ({"type": "array", "uniqueItems": True}, [1, 2], [1, 1], "items must be unique @ $.v"),
    (
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
        ["a", 1],
        ["a", "b"],
        "expected integer, got string @ $.v[1]",
    ),
    (
        {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
        ["a"],
        ["a", 1],
        "has more items than the schema allows @ $.v",
    ),
    (
        {"type": "object", "patternProperties": {"^n_": {"type": "integer"}}},
        {"n_a": 1},
        {"n_a": "x"},
        "expected integer, got string @ $.v.n_a",
    ),
    (
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
        {"ab": 1},
        {"A": 1},
        "property name 'A': must match the pattern '^[a-z]+$' @ $.v",
    ),
    (
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        {"a": 1, "b": 2},
        {"a": 1},
        "required when 'a' is present @ $.v.b",
    ),
    (
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"k": "s"},
        {"k": 1},
        "expected string, got integer @ $.v.k",
    ),
    (
        {"if": {"type": "integer"}, "then": {"minimum": 10}, "else": {"type": "string"}},
        10,
        9,
        "must be >= 10 @ $.v",
    ),
    (
        {"if": {"type": "integer"}, "then": {"minimum": 10}, "else": {"type": "string"}},
        "s",
        1.5,
        "expected string, got number @ $.v",
    ),
    ({"type": "object", "minProperties": 1}, {"a": 1}, {}, "must have at least 1 properties @ $.v"),
    ({"type": "string", "format": "email"}, "a@b.org", "nobody", "must be a valid email @ $.v"),
    (
        {"type": "string", "format": "uri"},
        "https://x.org/a",
        "no scheme",
        "must be a valid uri @ $.v",
    ),
    (
        {"type": "string", "format": "date-time"},
        "2024-01-01T00:00:00Z",
        "yesterday",
        "must be a valid date-time @ $.v",
    ),
    (
        {"type": "string", "format": "uuid"},
        "12345678-1234-5678-1234-567812345678",
        "x",
        "must be a valid uuid @ $.v",
    ),
    ({"type": "string", "format": "ipv4"}, "10.0.0.1", "10.0.0.300", "must be a valid ipv4 @ $.v"),
    ({"type": "string", "format": "duration"}, "P1DT2H", "1 day", "must be a valid duration @ $.v"),
    ({"$ref": "#/$defs/small"}, 1, 11, "must be <= 10 @ $.v"),
]


@pytest.mark.parametrize(("keyword", "good", "bad", "problem"), KEYWORD_CASES)
def test_every_keyword_is_enforced(
    keyword: JSONObject, good: JSON, bad: JSON, problem: str
) -> None:
    spec = _spec(
        {
            "type": "object",
            "properties": {"v": keyword},
            "$defs": {"small": {"type": "integer", "maximum": 10}},
        }
    )
    assert _problems(spec, {"v": good}) == []
    assert problem in _problems(spec, {"v": bad})


def test_a_schema_that_names_an_older_draft_is_checked_by_that_draft() -> None:
    spec = _spec(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"v": {"$ref": "#/definitions/n"}},
            "definitions": {"n": {"type": "integer", "exclusiveMaximum": 3}},
        }
    )
    assert _problems(spec, {"v": 3}) == ["must be < 3 @ $.v"]


@pytest.mark.parametrize(
    ("parameters", "field", "reason"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "intger"}}},
            "parameters.properties.a.type",
            "not a valid JSON Schema",
        ),
        (
            {"type": "object", "properties": {"a": {"minimum": "3"}}},
            "parameters.properties.a.minimum",
            "not a valid JSON Schema",
        ),
        (
            {"type": "object", "properties": {"a": {"pattern": "("}}},
            "parameters.properties.a.pattern",
            "not a valid JSON Schema",
        ),
        ({"type": "object", "required": "a"}, "parameters.required", "not a valid JSON Schema"),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.org/s.json"}}},
            "parameters.properties.a.$ref",
            "leaves the schema",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
            "parameters.properties.a.$ref",
            "leaves the schema",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
            "parameters.properties.a.$ref",
            "does not resolve",
        ),
        (
            {"type": "object", "properties": {"a": {"format": "uri-template"}}},
            "parameters.properties.a.format",
            "cannot be enforced",
        ),
        ({"type": "array"}, "parameters.type", "must be of type 'object'"),
    ],
)
def test_a_bad_schema_is_refused_when_the_tool_is_built(
    parameters: JSONObject, field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _spec(parameters)
    assert info.value.field == field
    assert reason in info.value.reason
    assert "must be of type 'object'" in reason or "'tool'" in info.value.reason


@pytest.mark.parametrize(
    ("parameters", "field", "reason"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}},
            "parameters.properties.a.maxLenght",
            "not a keyword",
        ),
        (
            {"type": "object", "properties": {"default": {"$ref": "https://x.org/s"}}},
            "parameters.properties.default.$ref",
            "leaves the schema",
        ),
        (
            {"type": "object", "$defs": {"a": {"$id": "https://x.org/a", "type": "string"}}},
            "parameters.$defs.a.$id",
            "own '$id'",
        ),
    ],
)
def test_what_would_be_ignored_is_refused_when_the_tool_is_built(
    parameters: JSONObject, field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _spec(parameters)
    assert info.value.field == field
    assert reason in info.value.reason


def test_data_that_looks_like_keywords_is_data() -> None:
    # A property named like a keyword is a schema; a default or an enum value is data.
    spec = _spec(
        {
            "type": "object",
            "properties": {
                "format": {"type": "string", "default": "uri-template"},
                "$ref": {"type": "object", "default": {"$ref": "https://x.org/s"}},
                "mode": {"enum": [{"format": "iri"}]},
            },
            "x-origin": "mcp",
        }
    )
    assert _problems(spec, {"format": "x", "$ref": {}, "mode": {"format": "iri"}}) == []
    assert _problems(spec, {"format": 1}) == ["expected string, got integer @ $.format"]


def test_non_standard_formats_are_annotations_and_the_standard_ones_are_asserted() -> None:
    spec = _spec({"type": "object", "properties": {"p": {"type": "string", "format": "password"}}})
    assert _problems(spec, {"p": "anything"}) == []
    assert {"date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6"} <= ASSERTED_FORMATS


def test_the_builtin_checker_refuses_what_it_cannot_enforce() -> None:
    with pytest.raises(ConfigError) as info:
        ToolSpec(name="t", parameters=Args.model_json_schema())
    assert info.value.field.startswith("parameters.")
    assert "JSONSchemaValidator" in info.value.reason
    assert "'t'" in info.value.reason


def test_specs_from_the_wire_get_full_json_schema() -> None:
    spec = structure(
        {"name": "tool", "parameters": Args.model_json_schema()}, ToolSpec, root="$.tools[0]"
    )
    assert spec == PYDANTIC
    assert _problems(spec, {"name": "ok", "count": 3}) == ["must be a multiple of 2 @ $.count"]
    with pytest.raises(WireError) as info:
        structure({"name": "t", "parameters": {"type": "object", "minProperties": -1}}, ToolSpec)
    assert info.value.field == "$.parameters.minProperties"


def test_check_call_names_the_tool_and_every_problem() -> None:
    call = ToolCall(id="c", name="tool", arguments={"name": "A", "count": "x"})
    with pytest.raises(ToolArgumentError) as info:
        PYDANTIC.check_call(call)
    assert info.value.field in ("tool.name", "tool.count")
    assert set(info.value.problems) == {
        "must match the pattern '^[a-z]+$' @ tool.name",
        "expected integer or null, got string @ tool.count",
    }


# ------------------------------------------------------------------------------- properties

_names = st.text("abcdefghij", min_size=1, max_size=8)
_counts = st.none() | st.integers(1, 500).map(lambda n: 2 * n)
_ratios = st.floats(min_value=-1e6, max_value=1.0, exclude_max=True, allow_nan=False)
_points = st.none() | st.fixed_dictionaries(
    {
        "x": st.integers(0, 100),
        "y": st.floats(0, 1, exclude_min=True, exclude_max=True),
    }
)
_shapes = (
    st.none()
    | st.fixed_dictionaries({"kind": st.just("circle"), "radius": st.floats(0.001, 1e6)})
    | st.fixed_dictionaries({"kind": st.just("square"), "side": st.floats(0.001, 1e6)})
)
_dates = st.none() | st.dates().map(lambda d: d.isoformat())


@st.composite
def valid_arguments(draw: st.DrawFn) -> JSONObject:
    optional: dict[str, st.SearchStrategy[JSON]] = {
        "count": _counts,
        "ratio": _ratios,
        "mode": st.sampled_from(["fast", "slow"]),
        "color": st.sampled_from(["red", "blue"]),
        "point": _points,  # type: ignore[dict-item]  # dicts of JSON values are JSON
        "tags": st.lists(st.text(max_size=5), max_size=3),
        "when": _dates,
        "shape": _shapes,  # type: ignore[dict-item]  # as above
    }
    out: JSONObject = {"name": draw(_names)}
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        out[key] = draw(optional[key])
    return out


@given(valid_arguments())
def test_arguments_valid_by_construction_pass(arguments: JSONObject) -> None:
    Args.model_validate_json(json.dumps(arguments), strict=True)  # the model agrees
    assert _problems(PYDANTIC, arguments) == []


# Per property, values that break it (a wrong type, a broken constraint).
_BREAKS: dict[str, list[JSON]] = {
    "name": ["", "UPPER", "toolongname", 3, None],
    "count": [0, 3, -2, "4", 2.5, True],
    "ratio": [1.0, 2, "0.5", None],
    "mode": ["medium", 1, None],
    "color": ["green", 0],
    "point": [{"x": -1, "y": 0.5}, {"x": 1, "y": 1}, {"x": 1}, {"x": "1", "y": 0.5}, [1, 2]],
    "tags": [["a", "b", "c", "d"], [1], "a"],
    "when": ["2024-02-30", "today", 20240101],
    "shape": [{"kind": "triangle"}, {"kind": "circle", "radius": 0}, {"kind": "square"}],
    "surplus": [1],
}


@given(valid_arguments(), st.sampled_from(sorted(_BREAKS)), st.data())
def test_mutated_arguments_fail_with_the_path_of_the_mutation(
    arguments: JSONObject, key: str, data: st.DataObject
) -> None:
    broken = {**arguments, key: data.draw(st.sampled_from(_BREAKS[key]))}
    problems = PYDANTIC.validate_arguments(broken)
    assert problems
    assert all(
        p.path == f"$.{key}" or p.path.startswith((f"$.{key}.", f"$.{key}[")) for p in problems
    )


# Schemas inside the built-in checker's subset, to drive both checkers in lockstep.
_subset_leaf = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": ["string", "null"]},
        {"enum": [1, "a", True, None]},
        {"enum": [1, "a"]},
        {"enum": [False, [0]]},
        {"enum": [0.0]},
        {"type": "integer", "enum": [0, 1]},
        {"type": "array", "items": {"type": "integer"}},
    ]
)
_subset_schemas = st.recursive(
    _subset_leaf,
    lambda inner: st.builds(
        lambda props, required, extra: {
            "type": "object",
            "properties": props,
            "required": sorted(required & set(props)),
            "additionalProperties": extra,
        },
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        st.sets(st.sampled_from(["a", "b", "c"])),
        st.sampled_from([True, False, {"type": "string"}]),
    ),
    max_leaves=6,
)
_argument_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.sampled_from([0.0, 1.0, 1.5])
    | st.sampled_from(["", "a"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=4)
    ),
    max_leaves=8,
)


@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), _subset_schemas, min_size=1, max_size=3),
    st.data(),
)
def test_the_builtin_checker_agrees_with_full_json_schema_on_its_subset(
    properties: JSONObject, data: st.DataObject
) -> None:
    keys = data.draw(st.lists(st.sampled_from([*properties, "d"]), unique=True))
    arguments: JSONObject = {key: data.draw(_argument_values) for key in keys}
    parameters: JSONObject = {"type": "object", "properties": properties}
    builtin = ToolSpec(name="t", parameters=parameters)
    full = _spec(parameters)
    assert bool(builtin.validate_arguments(arguments)) == bool(full.validate_arguments(arguments))


# ------------------------------------------------------------------ the fast path and the reference
# ``JSONSchemaValidator`` accepts what jsonschema-rs finds valid and asks jsonschema otherwise, so
# the two must agree on every verdict. These schemas cover every keyword of Draft 2020-12 that
# asserts something, in combinations, with instances drawn to hit their edges.

_KEYS = ["a", "b", "n_1", "Z"]
_STRINGS = [
    "",
    "a",
    "ab",
    "abc",
    "A",
    "n_x",
    "10.0.0.1",
    "10.0.0.300",
    "::1",
    "2024-02-29",
    "2024-02-30",
    "2024-01-01T00:00:00Z",
    "12:00:00Z",
    "a@b.org",
    "nobody",
    "P1DT2H",
    "P",
    "https://x.org/a",
    "no scheme",
    "example.com",
    "-bad-.com",
    "12345678-1234-5678-1234-567812345678",
    "/a/b",
    "a~2",
    "é",
    "\n",
    "ab\n",
]
_values: st.SearchStrategy[JSON] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 12)
    | st.sampled_from([0.0, 1.0, 1.5, -0.5, 2.0, 10.0, 2**64, -(2**63) - 1])
    | st.sampled_from(_STRINGS),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=10,
)
_FORMAT_NAMES = [
    "date",
    "date-time",
    "time",
    "email",
    "ipv4",
    "ipv6",
    "uuid",
    "hostname",
    "duration",
    "uri",
    "uri-reference",
    "json-pointer",
    "regex",
    "password",
]
# Patterns whose meaning is the same in Python's ``re`` and the Rust engine (no ``$``: Python's
# also matches before a final newline; that difference has its own test below).
_PATTERNS = ["^a", "b", "^[a-z]+", "[0-9]", "^n_", "^(a|b)c?", "\\d", "^.{2,3}"]
_TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]


def _leaf_schemas() -> st.SearchStrategy[JSON]:
    small = st.integers(0, 4)
    num = st.sampled_from([0, 1, 2, 1.5, -1, 10])
    return st.one_of(
        st.builds(lambda t: {"type": t}, st.sampled_from(_TYPES)),
        st.builds(
            lambda ts: {"type": ts},
            st.lists(st.sampled_from(_TYPES), min_size=1, max_size=3, unique=True),
        ),
        st.builds(lambda v: {"enum": v}, st.lists(_values, min_size=1, max_size=3)),
        st.builds(lambda v: {"const": v}, _values),
        st.builds(
            lambda k, v: {k: v},
            st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
            num,
        ),
        st.builds(lambda v: {"multipleOf": v}, st.sampled_from([1, 2, 3, 0.5, 0.25])),
        st.builds(
            lambda k, v: {k: v},
            st.sampled_from(
                ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"]
            ),
            small,
        ),
        st.builds(lambda p: {"pattern": p}, st.sampled_from(_PATTERNS)),
        st.builds(lambda f: {"format": f}, st.sampled_from(_FORMAT_NAMES)),
        st.builds(lambda u: {"uniqueItems": u}, st.booleans()),
        st.builds(
            lambda r: {"required": r}, st.lists(st.sampled_from(_KEYS), unique=True, max_size=3)
        ),
        st.builds(
            lambda k, r: {"dependentRequired": {k: r}},
            st.sampled_from(_KEYS),
            st.lists(st.sampled_from(_KEYS), unique=True, max_size=2),
        ),
        st.just({"$ref": "#/$defs/small"}),
        st.just({"$ref": "#/$defs/tree"}),
        st.booleans(),  # true and false are schemas too
    )


def _composite(inner: st.SearchStrategy[JSON]) -> st.SearchStrategy[JSON]:
    props = st.dictionaries(st.sampled_from(_KEYS), inner, max_size=3)
    alternatives = st.lists(inner, min_size=1, max_size=3)
    return st.one_of(
        st.lists(inner, min_size=2, max_size=3).map(
            lambda subs: {k: v for s in subs if isinstance(s, dict) for k, v in s.items()}
        ),
        st.builds(
            lambda p, extra: {"properties": p, "additionalProperties": extra},
            props,
            st.booleans() | inner,
        ),
        st.builds(
            lambda p: {"patternProperties": p},
            st.dictionaries(st.sampled_from(_PATTERNS), inner, max_size=2),
        ),
        st.builds(lambda s: {"propertyNames": s}, inner),
        st.builds(lambda k, s: {"dependentSchemas": {k: s}}, st.sampled_from(_KEYS), inner),
        st.builds(lambda s: {"items": s}, inner),
        st.builds(
            lambda p, rest: {"prefixItems": p, "items": rest}, alternatives, st.booleans() | inner
        ),
        st.builds(lambda s, lo: {"contains": s, "minContains": lo}, inner, st.integers(0, 2)),
        st.builds(lambda s, hi: {"contains": s, "maxContains": hi}, inner, st.integers(1, 2)),
        st.builds(
            lambda k, subs: {k: subs}, st.sampled_from(["allOf", "anyOf", "oneOf"]), alternatives
        ),
        st.builds(lambda s: {"not": s}, inner),
        st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, inner, inner, inner),
        st.builds(lambda p, u: {"properties": p, "unevaluatedProperties": u}, props, st.booleans()),
        st.builds(
            lambda p, u: {"prefixItems": p, "unevaluatedItems": u}, alternatives, st.booleans()
        ),
    )


_any_schemas = st.recursive(_leaf_schemas(), _composite, max_leaves=8)
_DEFS: JSONObject = {
    "small": {"type": "integer", "maximum": 10},
    "tree": {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/tree"}, "b": {"type": "integer"}},
    },
}


def _lockstep(schema: JSONObject, instance: JSON) -> None:
    check = FULL.compile("t", schema)
    assert check.fast, "jsonschema-rs compiles every generated schema"
    fast, reference = check.verdicts(instance)
    assert fast == reference, (schema, instance)
    assert (check(instance) == []) == reference
    assert check.disagreements == 0


@given(_any_schemas, st.lists(_values, min_size=1, max_size=6))
def test_the_fast_path_and_the_reference_agree_on_every_keyword(
    schema: JSON, instances: list[JSON]
) -> None:
    if not isinstance(schema, dict):
        schema = {"allOf": [schema]}
    full: JSONObject = {**schema, "$defs": _DEFS}
    for instance in instances:
        _lockstep(full, instance)


@given(
    st.sampled_from(
        [
            PYDANTIC.parameters,
            *[
                {"type": "object", "properties": {"v": k}, "$defs": _DEFS}
                for k, *_ in KEYWORD_CASES
            ],
        ]
    ),
    st.data(),
)
def test_the_fast_path_and_the_reference_agree_on_pydantic_and_keyword_schemas(
    schema: JSONObject, data: st.DataObject
) -> None:
    properties = schema["properties"]
    assert isinstance(properties, dict)
    names = [*properties, "surplus"]
    for _ in range(4):
        keys = data.draw(st.lists(st.sampled_from(names), unique=True))
        arguments: JSONObject = {}
        for key in keys:
            breaks = _BREAKS.get(key, [])
            arguments[key] = data.draw(_values | st.sampled_from([*breaks, 0]))
        if data.draw(st.booleans()):
            arguments = {**data.draw(valid_arguments()), **arguments}
        _lockstep(schema, arguments)


def test_a_pattern_dollar_before_a_final_newline_is_a_counted_disagreement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Python's ``$`` matches before a final newline, the Rust engine's does not: the reference
    # (jsonschema, Python) wins, the arguments pass, and the disagreement is counted and logged.
    check = FULL.compile("t", {"type": "string", "pattern": "^abc$"})
    assert check.verdicts("abc\n") == (False, True)
    with caplog.at_level("WARNING", logger="trajcore.tools"):
        assert check("abc\n") == []
        assert check("abc\n") == []
    assert check.disagreements == 2
    assert [r.getMessage() for r in caplog.records] == [
        "tool 't': jsonschema-rs rejected arguments that jsonschema (the reference) accepts; "
        "accepted them (1 time(s) for this tool so far)"
    ]
    assert [str(p) for p in check("abd")] == ["must match the pattern '^abc$' @ $"]
    assert check.disagreements == 2


def test_a_false_branch_of_any_of_is_explained() -> None:
    check = FULL.compile("t", {"anyOf": [False, {"type": "string"}]})
    assert [str(p) for p in check(None)] == ["expected string, got null @ $"]
    assert [str(p) for p in FULL.compile("t", {"anyOf": [False]})(None)] == [
        "no value is allowed here @ $"
    ]


def test_a_fractional_multiple_of_is_exact_on_the_fast_path() -> None:
    # jsonschema's float division says 0.07 is no multiple of 0.01; jsonschema-rs says it is and
    # its verdict stands (the documented difference no run-time check can see).
    check = FULL.compile("t", {"type": "number", "multipleOf": 0.01})
    assert check.verdicts(0.07) == (True, False)
    assert check(0.07) == []
    assert [str(p) for p in check(0.075)] == ["must be a multiple of 0.01 @ $"]


def test_arguments_the_fast_path_cannot_read_go_to_the_reference() -> None:
    # A lone surrogate (json.loads makes one of "\\ud800") cannot be encoded for the Rust side.
    check = FULL.compile(
        "t", {"type": "object", "properties": {"v": {"type": "string", "pattern": "^x"}}}
    )
    assert check.verdicts({"v": "x\ud800"}) == (None, True)
    assert check({"v": "x\ud800"}) == []
    assert [str(p) for p in check({"v": "\ud800"})] == ["must match the pattern '^x' @ $.v"]
    assert check.disagreements == 0


def test_formats_mean_what_the_reference_checker_says_on_both_paths() -> None:
    # hostname, uri and duration are this module's own checkers; jsonschema-rs calls them.
    check = FULL.compile(
        "t",
        {
            "type": "object",
            "properties": {
                "h": {"type": "string", "format": "hostname"},
                "d": {"type": "string", "format": "duration"},
                "p": {"type": "string", "format": "password"},
            },
        },
    )
    assert check.fast
    for arguments, valid in [
        ({"h": "example.com."}, True),
        ({"h": "-bad-.com"}, False),
        ({"d": "P1W"}, True),
        ({"d": "PT"}, False),
        ({"p": "anything at all"}, True),
    ]:
        assert check.verdicts(arguments) == (valid, valid), arguments


def test_a_schema_only_python_can_compile_is_checked_by_the_reference_alone() -> None:
    check = FULL.compile("t", {"type": "string", "pattern": "a\\Z"})
    assert not check.fast
    assert check.verdicts("ba") == (None, True)
    assert [str(p) for p in check("ab")] == ["must match the pattern 'a\\\\Z' @ $"]


def test_without_jsonschema_rs_the_reference_checks_alone_after_one_warning() -> None:
    code = (
        "import sys, warnings\n"
        "sys.modules['jsonschema_rs'] = None\n"
        "warnings.simplefilter('always')\n"
        "from trajcore.adapters.json_schema import JSONSchemaValidator\n"
        "v = JSONSchemaValidator()\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    a = v.compile('a', {'type': 'integer'})\n"
        "    b = v.compile('b', {'type': 'string'})\n"
        "print(len(seen), seen[0].category.__name__, a.fast, b.fast)\n"
        "print([str(p) for p in a('x')], b('x'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [
        "1 RuntimeWarning False False",
        "['expected integer, got string @ $'] []",
    ]


# ---------------------------------------------------------------------- pinned decisions


def test_disagreements_are_logged_the_1st_10th_100th_time_per_tool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Never silent, never a flood: the warning cadence is every power of ten, per tool.
    check = FULL.compile("t", {"type": "string", "pattern": "^abc$"})
    with caplog.at_level("WARNING", logger="trajcore.tools"):
        for _ in range(1000):
            assert check("abc\n") == []
    assert check.disagreements == 1000
    assert [r.args for r in caplog.records] == [("t", 1), ("t", 10), ("t", 100), ("t", 1000)]


def test_property_names_matched_by_pattern_properties_are_not_unexpected() -> None:
    # With ``additionalProperties: false``, a name that ``patternProperties`` matches is allowed;
    # only the names no ``properties`` entry and no pattern covers are named as unexpected.
    spec = _spec(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "patternProperties": {"^n_": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    assert _problems(spec, {"a": 1, "n_x": 2}) == []
    assert _problems(spec, {"a": 1, "n_x": 2, "zz": 3}) == ["unexpected property @ $.zz"]


@pytest.mark.parametrize(
    ("items", "field", "reason"),
    [
        ({"type": "string", "maxLenght": 3}, "parameters.properties.v.items.maxLenght",
         "not a keyword"),
        ({"$ref": "https://x.org/s"}, "parameters.properties.v.items.$ref", "leaves the schema"),
        ({"$ref": "#/$defs/missing"}, "parameters.properties.v.items.$ref", "does not resolve"),
    ],
)  # fmt: skip
def test_a_single_items_subschema_is_checked_when_the_tool_is_built(
    items: JSONObject, field: str, reason: str
) -> None:
    # ``items`` holding one schema (not a list) is walked like any subschema: a misspelt
    # keyword or an outside or dangling ``$ref`` there is refused at build, not ignored.
    with pytest.raises(ConfigError) as info:
        _spec({"type": "object", "properties": {"v": {"type": "array", "items": items}}})
    assert info.value.field == field
    assert reason in info.value.reason


def test_a_long_schema_problem_is_cut_to_160_characters() -> None:
    prefix = "tool 't': not a valid JSON Schema: "
    for size, tail in ((135, "' is not of type 'array'"), (136, "' is not of type 'ar...")):
        with pytest.raises(ConfigError) as info:
            _spec_named("t", {"type": "object", "properties": {"a": {"enum": "x" * size}}})
        assert info.value.reason == prefix + "'" + "x" * size + tail
        assert len(info.value.reason) == len(prefix) + 160


def _spec_named(name: str, parameters: JSONObject) -> ToolSpec:
    return ToolSpec(name=name, parameters=parameters, validator=FULL)


def test_every_problem_of_the_branch_an_any_of_chose_is_named() -> None:
    check = FULL.compile("t", {"anyOf": [{"minimum": 5, "multipleOf": 2}, {"type": "string"}]})
    assert [str(p) for p in check(3)] == ["must be >= 5 @ $", "must be a multiple of 2 @ $"]


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("hostname", "a-b.example.org", "-bad-.org"),
        ("uri", "https://x.org/a", "https://x y"),
        ("uri-reference", "a/b?c", "a b"),
        ("json-pointer", "/a/~0b", "a/b"),
        ("duration", "P1DT2H", "P1H"),
    ],
)
def test_the_format_checker_asserts_its_own_formats_and_passes_non_strings(
    fmt: str, good: str, bad: str
) -> None:
    # Called directly: the module builds its checker once at import, out of reach of a
    # mutation run's per-test switch, so this is where its decisions are pinned.
    from trajcore.adapters import json_schema

    checker = json_schema._format_checker()
    assert checker.conforms(good, fmt)
    assert not checker.conforms(bad, fmt)
    assert checker.conforms(5, fmt)
    assert [str(p) for p in FULL.compile("t", {"format": fmt})(bad)] == [
        f"must be a valid {fmt} @ $"
    ]
    assert FULL.compile("t", {"format": fmt})(5) == []


DRAFT_07 = "http://json-schema.org/draft-07/schema#"
MISSPELT = (
    "tool 't': 'maxLenght' is not a keyword of this JSON Schema draft, so nothing would "
    "enforce it (misspelt? extensions are named 'x-...')"
)


@pytest.mark.parametrize(
    ("parameters", "field", "reason"),
    [
        ({"allOf": [{"type": "strng"}]}, "parameters.allOf[0].type",
         "tool 't': not a valid JSON Schema: 'strng' is not valid under any of the given schemas"),
        ({"allOf": [{"maxLenght": 1}]}, "parameters.allOf[0].maxLenght", MISSPELT),
        ({"dependentSchemas": {"a": {"maxLenght": 1}}},
         "parameters.dependentSchemas.a.maxLenght", MISSPELT),
        ({"$schema": DRAFT_07, "dependencies": {"a": {"maxLenght": 1}}},
         "parameters.dependencies.a.maxLenght", MISSPELT),
        ({"$schema": DRAFT_07, "items": [{"maxLenght": 1}]}, "parameters.items[0].maxLenght",
         MISSPELT),
        ({"$dynamicRef": "https://x.org/s"}, "parameters.$dynamicRef",
         "tool 't': reference 'https://x.org/s' leaves the schema; only references inside it "
         "('#...') are resolved, nothing is fetched"),
        ({"$defs": {"a": {"$id": "https://x.org/a"}}}, "parameters.$defs.a.$id",
         "tool 't': a subschema with its own '$id' is not supported; keep one document with "
         "'$defs' and '#/...' references"),
    ],
)  # fmt: skip
def test_every_subschema_is_checked_at_build_and_the_fault_named_in_full(
    parameters: JSONObject, field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        FULL.compile("t", parameters)
    assert (info.value.field, info.value.reason) == (field, reason)


@pytest.mark.parametrize(
    ("schema", "arguments", "problems"),
    [
        ({"type": ["integer", "null"]}, "x", ["expected integer or null, got string @ $"]),
        ({"propertyNames": {"type": "integer"}}, {"a": 1},
         ["property name 'a': expected integer, got string @ $"]),
        ({"required": ["a", "b"]}, {"a": 1}, ["required @ $.b"]),
        ({"dependentRequired": {"a": ["b", "c"]}}, {"a": 1, "b": 2},
         ["required when 'a' is present @ $.c"]),
        ({"dependentRequired": {"a": ["b"], "x": ["y"]}}, {"a": 1},
         ["required when 'a' is present @ $.b"]),
        ({"type": "object", "additionalProperties": False}, {"a": 1},
         ["unexpected property @ $.a"]),
        ({"properties": {"a": {}}, "unevaluatedProperties": False}, {"a": 1, "b": 2},
         ["Unevaluated properties are not allowed ('b' was unexpected) @ $"]),
        ({"allOf": [{"minimum": 5}, {"minimum": 5}]}, 3, ["must be >= 5 @ $"]),
        ({"pattern": "a\\Z"}, "ab", ["must match the pattern 'a\\\\Z' @ $"]),
    ],
)  # fmt: skip
def test_problems_are_named_once_and_only_where_they_are(
    schema: JSONObject, arguments: JSON, problems: list[str]
) -> None:
    assert [str(p) for p in FULL.compile("t", schema)(arguments)] == problems


def test_a_false_subschema_allows_no_value() -> None:
    check = FULL.compile("t", {"properties": {"v": False}})
    assert [p.reason for p in check({"v": {"x": 1}})] == ["no value is allowed here"]


def test_a_format_outside_the_standard_keeps_the_fast_path() -> None:
    assert FULL.compile("t", {"type": "string", "format": "password"}).fast


def test_keys_named_as_annotations_pass_and_every_keyword_is_still_enforced() -> None:
    """A tool server's own keys (``markdownDescription``) pass when named, as ``x-...`` does;
    an unnamed unknown key is still refused, and naming a keyword turns nothing off."""
    schema: JSONObject = {
        "type": "object",
        "properties": {"k": {"type": "string", "maxLength": 3, "markdownDescription": "**k**"}},
        "required": ["k"],
    }
    with pytest.raises(ConfigError) as info:
        FULL.compile("t", schema)
    assert info.value.field == "parameters.properties.k.markdownDescription"
    named = JSONSchemaValidator(annotations=("markdownDescription", "maxLength"))
    check = named.compile("t", schema)
    assert check({"k": "abc"}) == []
    assert [str(p) for p in check({"k": "abcd"})] == ["must be at most 3 characters long @ $.k"]
    assert [str(p) for p in check({})] == ["required @ $.k"]
    with pytest.raises(ConfigError) as info:
        named.compile("t", {**schema, "optinal": True})
    assert info.value.field == "parameters.optinal"


def test_annotations_given_as_one_string_are_refused_not_read_letter_by_letter() -> None:
    """``annotations="markdownDescription"`` would otherwise name its letters, each a key that
    passes unenforced, and still refuse the schema's ``markdownDescription``."""
    with pytest.raises(ConfigError) as info:
        JSONSchemaValidator(annotations="markdownDescription")
    assert info.value.field == "annotations"
    assert "markdownDescription" in info.value.reason
