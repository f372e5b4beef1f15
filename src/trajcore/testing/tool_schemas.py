"""Hypothesis strategies for tool specs with JSON-Schema parameters, and for arguments against them.

The contract machines offer generated tools to servers and send generated calls:

- ``tool_parameters()``: a ``parameters`` schema of type ``object`` with zero to four properties,
  each a ``string``, ``integer``, ``number``, ``boolean``, a string ``enum``, an ``array`` of one
  of those, or a nested ``object`` of them; a generated subset is ``required`` and
  ``additionalProperties`` may be ``false``. Every keyword is one the domain's built-in checker
  enforces, so a ``ToolSpec`` built from it with the default validator checks it in full.
- ``tool_lists()``: one to three ``ToolSpec`` with distinct names, generated descriptions and
  parameters.
- ``arguments_for(schema)``: arguments that fit ``schema`` (any unicode text, integers up to
  2**53, finite floats, nested arrays and objects).
- ``bad_arguments_for(schema)``: arguments that miss ``schema`` in exactly one place at the top
  level, with that place: a required property left out, a value of another JSON type, a string
  outside an ``enum``, or an unexpected property where ``additionalProperties`` is ``false``. A
  server must reject them naming ``<tool>.<property>``.
"""

from __future__ import annotations

from typing import cast

import attrs
from hypothesis import strategies as st

from trajcore.domain.json_values import JSON, JSONObject
from trajcore.domain.tools import ToolSpec

__all__ = [
    "BadArguments",
    "arguments_for",
    "bad_arguments_for",
    "can_be_missed",
    "tool_lists",
    "tool_parameters",
    "tool_texts",
]

tool_texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Co")), max_size=24)
"""Any text a model may write: unicode without surrogates or private-use characters."""

_PROPERTY = st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True)
_TOOL_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
_SCALARS = ("string", "integer", "number", "boolean", "enum")
_ENUM_WORDS = st.lists(
    st.text(alphabet="abcdefgh", min_size=1, max_size=6), min_size=1, max_size=4, unique=True
)


@st.composite
def _property_schema(draw: st.DrawFn, depth: int) -> JSONObject:
    kinds = (*_SCALARS, "array", "object") if depth > 0 else _SCALARS
    kind = draw(st.sampled_from(kinds))
    schema: JSONObject
    if kind == "enum":
        words: list[JSON] = list(draw(_ENUM_WORDS))
        schema = {"type": "string", "enum": words}
    elif kind == "array":
        schema = {"type": "array", "items": draw(_property_schema(depth - 1))}
    elif kind == "object":
        schema = draw(_object_schema(depth - 1, max_properties=3))
    else:
        schema = {"type": kind}
    if draw(st.booleans()):
        schema["description"] = draw(st.text(alphabet="abc xyz", max_size=12))
    return schema


@st.composite
def _object_schema(draw: st.DrawFn, depth: int, max_properties: int) -> JSONObject:
    names = draw(st.lists(_PROPERTY, max_size=max_properties, unique=True))
    properties: JSONObject = {name: draw(_property_schema(depth)) for name in names}
    schema: JSONObject = {"type": "object", "properties": properties}
    required: list[JSON] = [name for name in names if draw(st.booleans())]
    if required:
        schema["required"] = required
    if draw(st.booleans()):
        schema["additionalProperties"] = False
    return schema


def tool_parameters() -> st.SearchStrategy[JSONObject]:
    """A ``parameters`` schema (see the module doc)."""
    return _object_schema(1, max_properties=4)


@st.composite
def tool_lists(draw: st.DrawFn, *, min_size: int = 1, max_size: int = 3) -> list[ToolSpec]:
    """``min_size`` to ``max_size`` tools with distinct names and generated parameters."""
    names = draw(st.lists(_TOOL_NAME, min_size=min_size, max_size=max_size, unique=True))
    return [
        ToolSpec(
            name=name,
            description=draw(st.text(alphabet="abcdef xyz.", max_size=30)),
            parameters=draw(tool_parameters()),
        )
        for name in names
    ]


def _value_for(schema: JSONObject) -> st.SearchStrategy[JSON]:
    kind = schema.get("type")
    enum = schema.get("enum")
    if isinstance(enum, list):
        return st.sampled_from(enum)
    if kind == "string":
        return tool_texts
    if kind == "integer":
        return st.integers(-(2**53), 2**53)
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-1000, 1000)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        items = schema["items"]
        assert isinstance(items, dict)
        return st.lists(_value_for(items), max_size=3)
    return cast("st.SearchStrategy[JSON]", arguments_for(schema))


@st.composite
def _arguments(draw: st.DrawFn, schema: JSONObject) -> JSONObject:
    properties = schema.get("properties")
    assert isinstance(properties, dict)
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    out: JSONObject = {}
    for name, sub in properties.items():
        assert isinstance(sub, dict)
        if name in needed or draw(st.booleans()):
            out[name] = draw(_value_for(sub))
    return out


def arguments_for(schema: JSONObject) -> st.SearchStrategy[JSONObject]:
    """Arguments that fit the object ``schema``."""
    return _arguments(schema)


@attrs.frozen
class BadArguments:
    """Arguments that miss their schema at ``field`` (``$.<property>``), and how."""

    arguments: JSONObject
    field: str
    how: str


# A value of another JSON type for each type a property may have.
_OTHER_TYPE: dict[str, JSON] = {
    "string": 7,
    "integer": "7",
    "number": True,
    "boolean": 0,
    "array": {"not": "a list"},
    "object": ["not", "an object"],
}


@st.composite
def _bad_arguments(draw: st.DrawFn, schema: JSONObject) -> BadArguments:
    properties = schema.get("properties")
    assert isinstance(properties, dict)
    required = schema.get("required")
    fitting = draw(arguments_for(schema))
    names = required if isinstance(required, list) else []
    ways: list[tuple[str, str]] = [("missing", str(name)) for name in names]
    for name, sub in properties.items():
        assert isinstance(sub, dict)
        ways.append(("type", name))
        if "enum" in sub:
            ways.append(("enum", name))
    if schema.get("additionalProperties") is False:
        ways.append(("extra", draw(_PROPERTY.filter(lambda n: n not in properties))))
    assert ways, "every object fits this schema: check can_be_missed(schema) first"
    how, name = draw(st.sampled_from(ways))
    arguments = dict(fitting)
    if how == "missing":
        arguments.pop(name, None)
    elif how == "type":
        sub = properties[name]
        assert isinstance(sub, dict)
        arguments[name] = _OTHER_TYPE[str(sub["type"])]
    elif how == "enum":
        sub = properties[name]
        assert isinstance(sub, dict)
        arguments[name] = draw(st.text(alphabet="xyz", min_size=1, max_size=4))
    else:
        arguments[name] = draw(tool_texts)
    return BadArguments(arguments=arguments, field=f"$.{name}", how=how)


def can_be_missed(schema: JSONObject) -> bool:
    """Whether some object misses ``schema`` (it has a property, or refuses extra ones)."""
    return bool(schema.get("properties")) or schema.get("additionalProperties") is False


def bad_arguments_for(schema: JSONObject) -> st.SearchStrategy[BadArguments]:
    """Arguments that miss the object ``schema`` in one top-level place (see the module doc).

    ``schema`` must be one that ``can_be_missed``.
    """
    return _bad_arguments(schema)
