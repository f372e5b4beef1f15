"""JSON values as the domain holds them: the ``JSON`` type, its check, its type names, the value
of a JSON text (refused naming its field), and the objects of a JSON Lines text.

JSON payloads (tool arguments, schemas, wire bodies) are plain ``dict``/``list`` trees typed as
``JSON``. They are not deep-frozen; treat them as read-only.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeAlias

from trajcore.domain.errors import InvalidInput

__all__ = [
    "JSON",
    "MAX_DEPTH",
    "JSONObject",
    "check_json",
    "json_lines",
    "json_object",
    "json_type",
    "json_value",
    "plain_json",
]

if TYPE_CHECKING:
    JSON: TypeAlias = "bool | int | float | str | list[JSON] | dict[str, JSON] | None"
    JSONObject: TypeAlias = "dict[str, JSON]"
else:
    # At run time the recursive reference names its module, so annotations that mention JSON or
    # JSONObject resolve from any module that imports either name (attrs, cattrs).
    _JSON_REF = typing.ForwardRef("JSON", module=__name__)
    JSON = typing.Union[None, bool, int, float, str, list[_JSON_REF], dict[str, _JSON_REF]]  # noqa: UP007 - a runtime alias needs typing.Union around a ForwardRef
    JSONObject = dict[str, JSON]


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, JSONObject]]:
    """Each JSON object of ``lines`` (JSON Lines text) with its line number from 1; blank lines
    are skipped.

    Raises:
        InvalidInput: a line that is not a JSON object (field ``line N``).
    """
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, json_object(line, f"line {number}")


def json_value(text: str, field: str, *, error: type[InvalidInput] = InvalidInput) -> JSON:
    """The JSON value ``text`` holds (a setting's text, a body, a line).

    Raises:
        InvalidInput: ``text`` is not JSON, or holds a number Python will not read (more
            digits than its limit): ``error`` (``ConfigError`` for a setting) at ``field``,
            the decoder's own message after ``not JSON: ``.
    """
    try:
        value: JSON = json.loads(text)
    except ValueError as fault:  # json.JSONDecodeError, or int()'s limit on digits
        reason = fault.msg if isinstance(fault, json.JSONDecodeError) else str(fault)
        raise error(field, f"not JSON: {reason}") from None
    return value


def json_object(text: str, field: str) -> JSONObject:
    """The JSON object ``text`` holds.

    Raises:
        InvalidInput: ``text`` is not JSON (as ``json_value``), or not an object (field
            ``field``).
    """
    value = json_value(text, field)
    if not isinstance(value, dict):
        raise InvalidInput(field, "expected a JSON object")
    return value


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


MAX_DEPTH = 100
"""The most arrays and objects a JSON tree nests, one inside another: every walk of a tree (this
check, a schema's validation, the wire's encoders) recurses once a level or more, and Python's
recursion limit (1,000 frames) must never be what refuses a tree (a policy's arguments nested a
few hundred deep would otherwise fail the request that carries them, not the call alone)."""


def check_json(value: object, path: str = "$") -> str | None:
    """Return ``None`` when ``value`` is a JSON tree, else ``"reason @ path"`` for the first fault.

    JSON here means: None, bool, int, finite float, str, list of JSON, dict with str keys of JSON,
    arrays and objects nested at most ``MAX_DEPTH`` deep.
    """
    if plain_json(value):
        return None  # the common case, decided without writing a path for every item
    return _first_fault(value, path, 0)


def plain_json(value: object, depth: int = 0) -> bool:
    """Whether ``value`` is a JSON tree built of exactly the built-in types (no subclass), every
    float finite, nested at most ``MAX_DEPTH`` deep (``depth``: how deep ``value`` itself
    stands): the trees ``json.loads`` makes, and tool arguments nearly always.

    ``True`` means ``check_json`` finds nothing to refuse; ``False`` means only that the tree is
    not of this plain kind (a ``str`` subclass is still JSON), so ask ``check_json``.
    """
    if type(value) in _PLAIN_SCALARS:
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is dict:
        if depth >= MAX_DEPTH:
            return False
        for key, item in value.items():
            if type(key) is not str or not plain_json(item, depth + 1):
                return False
        return True
    if type(value) is list:
        if depth >= MAX_DEPTH:
            return False
        for item in value:  # noqa: SIM110 - a loop, not all(...): no generator frame a level
            if not plain_json(item, depth + 1):
                return False
        return True
    return False


def _first_fault(value: object, path: str, depth: int) -> str | None:
    """``check_json``'s answer, walking the whole tree with the path to each item."""
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"non-finite number {value!r} @ {path}"
    if isinstance(value, list | dict) and depth >= MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} arrays and objects @ {path}"
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = _first_fault(item, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"object key {key!r} is not a string @ {path}"
            problem = _first_fault(item, f"{path}.{key}", depth + 1)
            if problem:
                return problem
        return None
    return f"{type(value).__name__} is not a JSON value @ {path}"


# Python's JSON types and their JSON-schema names; ``bool`` before ``int``, which it subclasses.
_JSON_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def json_type(value: object) -> str:
    """The JSON-schema name of ``value``'s type (``object``, ``array``, ``string``, ...)."""
    for kind, name in _JSON_TYPE_NAMES:
        if isinstance(value, kind):
            return name
    return type(value).__name__
