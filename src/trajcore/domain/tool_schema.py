"""Tool argument schemas: the ``ArgumentValidator`` port and the domain's built-in checker.

A tool spec compiles its schema once, when built, through an injected ``ArgumentValidator``: the
domain's own ``BuiltinArgumentValidator`` enforces a small subset and refuses every other keyword
(so none is ever silently ignored); full JSON Schema is an adapter
(``trajcore.adapters.json_schema``), because the domain imports nothing but the standard library
and attrs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject, json_type

__all__ = [
    "BUILTIN_VALIDATOR",
    "ArgumentCheck",
    "ArgumentProblem",
    "ArgumentValidator",
    "BuiltinArgumentValidator",
]

_SCHEMA_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}

# Keywords that only describe (JSON Schema's annotations): no checker has anything to enforce.
_ANNOTATIONS = frozenset(
    {
        "$schema", "$comment", "title", "description", "default", "examples", "deprecated",
        "readOnly", "writeOnly",
    }
)  # fmt: skip
_BUILTIN_KEYWORDS = frozenset(
    {"type", "properties", "required", "items", "enum", "additionalProperties"}
)


@attrs.frozen(kw_only=True)
class ArgumentProblem:
    """One way in which arguments miss a tool's schema: ``reason @ path``."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.reason} @ {self.path}"


class ArgumentCheck(Protocol):
    """A tool's schema compiled once: call it with arguments, get every problem (empty: fits).

    A check is pure computation; it never raises for bad arguments, it reports them.
    """

    def __call__(self, arguments: object, /) -> list[ArgumentProblem]: ...


class ArgumentValidator(Protocol):
    """What compiles a tool's ``parameters`` schema into an ``ArgumentCheck``.

    ``compile`` runs once, when the ``ToolSpec`` is built. It raises ``ConfigError`` for a schema
    it cannot enforce in full (invalid against its metaschema, a keyword it does not understand,
    a reference outside the schema); the error's ``field`` is the path of the fault inside the
    spec (``parameters.properties.count.type``) and its reason names the tool. A validator never
    fetches anything: references resolve inside the schema or the schema is refused.

    The domain ships ``BuiltinArgumentValidator`` (a small, strict subset); the full JSON Schema
    validator lives in ``trajcore.adapters.json_schema`` and is injected where specs are built.
    """

    def compile(self, tool: str, schema: JSONObject) -> ArgumentCheck: ...


def _type_matches(value: object, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _SCHEMA_TYPES[kind])


def _json_equal(a: object, b: object) -> bool:
    """JSON Schema's equality: ``true`` is not ``1``, ``1`` is ``1.0``, containers deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return False
    return a == b


def _builtin_schema(tool: str, schema: object, path: str) -> None:
    """Raise ``ConfigError`` unless the built-in checker enforces every keyword of ``schema``."""
    if not isinstance(schema, dict):
        raise ConfigError(path, f"tool {tool!r}: a schema must be a JSON object")
    for key in schema:
        if key not in _BUILTIN_KEYWORDS and key not in _ANNOTATIONS:
            raise ConfigError(
                f"{path}.{key}",
                f"tool {tool!r}: keyword {key!r} is not enforced by the built-in checker; build "
                "the ToolSpec with validator=JSONSchemaValidator() from "
                "trajcore.adapters.json_schema",
            )
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _SCHEMA_TYPES:
            raise ConfigError(f"{path}.type", f"tool {tool!r}: unknown JSON-schema type {k!r}")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ConfigError(f"{path}.properties", f"tool {tool!r}: must be an object of schemas")
        for name, sub in props.items():
            _builtin_schema(tool, sub, f"{path}.properties.{name}")
    required = schema.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise ConfigError(f"{path}.required", f"tool {tool!r}: must be a list of property names")
    items = schema.get("items")
    if items is not None:
        _builtin_schema(tool, items, f"{path}.items")
    extra = schema.get("additionalProperties")
    if extra is not None and not isinstance(extra, bool):
        _builtin_schema(tool, extra, f"{path}.additionalProperties")
    enum_values = schema.get("enum")
    if enum_values is not None and not isinstance(enum_values, list):
        raise ConfigError(f"{path}.enum", f"tool {tool!r}: must be a list")


def _builtin_problems(
    value: object, schema: Mapping[str, object], path: str
) -> list[ArgumentProblem]:
    problems: list[ArgumentProblem] = []
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds and not any(_type_matches(value, str(k)) for k in kinds):
        expected = " or ".join(str(k) for k in kinds)
        return [ArgumentProblem(path=path, reason=f"expected {expected}, got {json_type(value)}")]
    enum_values = schema.get("enum")
    if isinstance(enum_values, list) and not any(_json_equal(value, v) for v in enum_values):
        problems.append(ArgumentProblem(path=path, reason=f"must be one of {enum_values!r}"))
    if isinstance(value, dict):
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        names = required if isinstance(required, list) else []
        problems.extend(
            ArgumentProblem(path=f"{path}.{name}", reason="required")
            for name in names
            if name not in value
        )
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            sub = props.get(name)
            if isinstance(sub, dict):
                problems.extend(_builtin_problems(item, sub, f"{path}.{name}"))
            elif extra is False:
                problems.append(
                    ArgumentProblem(path=f"{path}.{name}", reason="unexpected property")
                )
            elif isinstance(extra, dict):
                problems.extend(_builtin_problems(item, extra, f"{path}.{name}"))
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                problems.extend(_builtin_problems(item, items, f"{path}[{i}]"))
    return problems


@attrs.frozen
class _BuiltinCheck:
    schema: JSONObject

    def __call__(self, arguments: object, /) -> list[ArgumentProblem]:
        return _builtin_problems(arguments, self.schema, "$")


@attrs.frozen
class BuiltinArgumentValidator:
    """The domain's own checker: a strict subset of JSON Schema, with no dependency.

    It enforces ``type``, ``properties``, ``required``, ``items``, ``enum`` and
    ``additionalProperties`` (and lets annotations such as ``description`` pass). A schema with
    any other keyword is refused when the spec is built, naming the keyword's path: it is never
    silently ignored. The slot tools' specs use it; tools with richer schemas (pydantic, MCP) are
    built with ``trajcore.adapters.json_schema.JSONSchemaValidator``.
    """

    def compile(self, tool: str, schema: JSONObject) -> ArgumentCheck:
        """A check for ``schema``; ``ConfigError`` for a keyword this checker cannot enforce."""
        _builtin_schema(tool, schema, "parameters")
        return _BuiltinCheck(schema)


BUILTIN_VALIDATOR: ArgumentValidator = BuiltinArgumentValidator()
