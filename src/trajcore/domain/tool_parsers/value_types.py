"""Typing parameter values that a model wrote as text, by the JSON types the tool's schema allows.

Families that write arguments as tagged text (Qwen3-Coder's ``<parameter=KEY>``, GLM-4.5's
``<arg_value>``) lose the JSON types on the wire: ``5``, ``true`` and ``{"a": 1}`` arrive as
text. The parser gives them their types back from the tool's schema. This module is that rule,
a pure function of the value text and the schema, so every such family types values the same
way, and the rule is tested once.

Which types a schema allows (``allowed_types``), in schema order, duplicates dropped:

- ``type`` (a name or a list of names);
- the alternatives of ``anyOf`` and ``oneOf`` and the members of ``allOf``, each read the same
  way, in order (pydantic v2 writes ``Optional[T]`` as ``anyOf: [T, {"type": "null"}]``);
- a local ``$ref`` (``#/$defs/NAME``, ``#/definitions/NAME`` or any ``#/...`` JSON pointer) is
  resolved against the root schema (the tool's ``parameters``) and read in place; a reference
  that does not resolve, or a cycle, adds nothing;
- with none of these: ``const`` and ``enum`` give the JSON types of their values, ``properties``
  gives ``object``, ``items``/``prefixItems`` give ``array``.

How text becomes a value (``type_value``):

1. No allowed types (no schema, or one that says nothing about types): the text, verbatim.
2. ``null`` allowed and the text (stripped) is ``null`` or ``None`` (Qwen's templates render
   Python's ``None``): ``None``.
3. Otherwise the allowed types are tried in schema order, and the first that reads the text
   wins: ``string`` always reads it (verbatim, so ``anyOf: [string, integer]`` keeps ``"42"`` a
   string, and ``[integer, string]`` makes it ``42``); ``boolean`` reads ``true``/``false`` in
   any case; ``integer`` reads a JSON integer; ``number`` a JSON number; ``object`` and
   ``array`` a JSON object or array, or else a Python literal of one (``{'k': 'v'}``, as some
   templates render), holding only JSON values.
4. Nothing reads it: an object or array type with text that starts like one (``{``/``[``) is
   reported with its JSON fault (``truncated JSON``); any other text stays text, and the schema
   check then names the mismatch (``expected integer, got string @ arguments.count``). A value
   is never guessed into a type its schema does not allow.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping

from trajcore.domain.json_values import JSON, json_type
from trajcore.domain.tool_parsers.base import JSONFault, load_json

__all__ = ["allowed_types", "type_value"]

_MAX_REF_DEPTH = 32
_KNOWN = ("string", "integer", "number", "boolean", "object", "array", "null")


def _resolve(ref: str, root: Mapping[str, JSON]) -> JSON | None:
    """The schema a local ``$ref`` (``#/a/b``) points to inside ``root``, or ``None``."""
    if not ref.startswith("#"):
        return None
    node: JSON = dict(root)
    for raw in ref[1:].split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _collect(schema: JSON, root: Mapping[str, JSON], out: list[str], depth: int) -> None:
    if not isinstance(schema, dict) or depth > _MAX_REF_DEPTH:
        return
    found = len(out)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        _collect(_resolve(ref, root), root, out, depth + 1)
    kind = schema.get("type")
    for name in [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []:
        if isinstance(name, str) and name in _KNOWN and name not in out:
            out.append(name)
    for key in ("anyOf", "oneOf", "allOf"):
        alternatives = schema.get(key)
        if isinstance(alternatives, list):
            for alternative in alternatives:
                _collect(alternative, root, out, depth + 1)
    if len(out) > found:
        return
    inferred: list[str] = []
    if "const" in schema:
        inferred.append(json_type(schema["const"]))
    enum_values = schema.get("enum")
    if isinstance(enum_values, list):
        inferred.extend(json_type(v) for v in enum_values)
    if "properties" in schema:
        inferred.append("object")
    if "items" in schema or "prefixItems" in schema:
        inferred.append("array")
    out.extend(k for k in dict.fromkeys(inferred) if k not in out)


def allowed_types(schema: JSON, root: Mapping[str, JSON] | None = None) -> tuple[str, ...]:
    """The JSON types ``schema`` allows, in schema order (see the module's rules).

    ``root`` is the schema that local ``$ref`` pointers resolve against (the tool's
    ``parameters``); without it, ``schema`` itself.
    """
    out: list[str] = []
    if isinstance(schema, dict):
        _collect(schema, root if root is not None else schema, out, 0)
    return tuple(out)


def _is_json(value: object, depth: int = 0) -> bool:
    """Whether a Python literal holds only JSON values (string keys, finite numbers)."""
    if depth > 200:
        return False
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v, depth + 1) for k, v in value.items())
    return False


def _python_literal(word: str) -> JSON | None:
    try:
        value = ast.literal_eval(word)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if isinstance(value, tuple):
        value = list(value)
    return value if isinstance(value, (dict, list)) and _is_json(value) else None


_NOT_DECODED = JSONFault(reason="not decoded")


def _read_as(kind: str, text: str, word: str, decoded: JSON | JSONFault) -> tuple[bool, JSON]:
    """Whether the text reads as a value of ``kind``, and that value."""
    if kind == "string":
        return True, text
    if kind == "boolean":
        lowered = word.lower()
        return lowered in ("true", "false"), lowered == "true"
    if isinstance(decoded, JSONFault):
        if kind in ("object", "array") and word[:1] in "{[":
            literal = _python_literal(word)
            if literal is not None and json_type(literal) == kind:
                return True, literal
        return False, None
    if kind == "integer":
        return isinstance(decoded, int) and not isinstance(decoded, bool), decoded
    if kind == "number":
        return isinstance(decoded, (int, float)) and not isinstance(decoded, bool), decoded
    return kind in ("object", "array") and json_type(decoded) == kind, decoded


def type_value(text: str, schema: JSON, root: Mapping[str, JSON] | None = None) -> JSON | JSONFault:
    """The value of one text-written parameter under its property schema (see the module).

    Returns the typed value, the text itself when no allowed type reads it (the schema check
    reports that), or a ``JSONFault`` for broken JSON where an object or array is expected.
    """
    kinds = allowed_types(schema, root)
    if not kinds:
        return text
    word = text.strip()
    if "null" in kinds and word in ("null", "None"):
        return None
    structured = any(k in ("integer", "number", "object", "array") for k in kinds)
    decoded = load_json(word) if structured else _NOT_DECODED
    for kind in kinds:
        if kind != "null":
            ok, value = _read_as(kind, text, word, decoded)
            if ok:
                return value
    container = "object" in kinds or "array" in kinds
    if container and word[:1] in "{[" and isinstance(decoded, JSONFault):
        return decoded
    return text
