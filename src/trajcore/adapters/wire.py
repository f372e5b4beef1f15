"""The JSON shapes of trajcore's values, and the one place where JSON becomes values again.

``unstructure`` turns any domain value (messages, tool calls and results, specs, sampling
parameters, completions) into plain JSON; ``structure`` turns JSON back into the value and checks
it on the way. Bad input never escapes as a cattrs or attrs exception: it is a ``WireError`` whose
``field`` is the JSON path of the first fault (``$.tool_calls[0].name``) and whose ``problems``
list every fault found, each as ``reason @ $.path`` (cattrs' ``transform_error`` style).
Validators of the domain values run too, so a message with an unknown role or a tool message
without a call id is refused with its path.

Primitives are strict: ``1`` is not a string, ``"3"`` is not an integer and ``true`` is not a
number, where cattrs on its own would convert them.

Every wire type round-trips: ``structure(unstructure(x), type(x)) == x`` (a hypothesis property in
``tests/unit/test_wire.py``).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import Any, TypeVar, cast

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.v import transform_error

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.errors import InvalidInput, WireError
from trajcore.domain.json_values import JSON, JSONObject, check_json
from trajcore.domain.tools import ToolCall, ToolSpec

__all__ = ["converter", "register_strict_primitives", "structure", "unstructure"]

T = TypeVar("T")

# The runtime form of the recursive ``JSON`` alias, as attrs resolves it in field annotations.
_JSON_OBJECT_RUNTIME: object = typing.get_type_hints(ToolCall)["arguments"]
_JSON_RUNTIME: object = typing.get_args(_JSON_OBJECT_RUNTIME)[1]
_FIELD_MARK = " @@ "


def _structure_json(value: object, _: object) -> JSON:
    problem = check_json(value)
    if problem:
        reason, _at, where = problem.rpartition(" @ ")
        raise WireError(where.removeprefix("$"), reason)
    return cast("JSON", value)


def _structure_json_object(value: object, _: object) -> JSON:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return _structure_json(value, _)


def _strict_str(value: object, _: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _strict_int(value: object, _: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    return value


def _strict_float(value: object, _: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _strict_bool(value: object, _: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected a boolean, got {type(value).__name__}")
    return value


def _object_guard(conv: cattrs.Converter, cls: type[Any]) -> Callable[[object, object], Any]:
    build = conv.gen_structure_attrs_fromdict(cls)

    def structure_object(value: object, type_: object) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {type(value).__name__}")
        return build(value, type_)

    return structure_object


def register_strict_primitives(conv: cattrs.Converter) -> None:
    """Make ``conv`` refuse to convert between JSON primitives (``1`` is not ``"1"``, ``true``
    is not ``1``, ``NaN`` is no number), as every trajcore codec does."""
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(bool, _strict_bool)


@attrs.frozen(kw_only=True)
class _ToolSpecFields:
    """A ``ToolSpec`` as it travels: what it is, not how it is checked."""

    name: str
    description: str = ""
    parameters: JSONObject = attrs.field(factory=lambda: {"type": "object", "properties": {}})


def _register_tool_spec(conv: cattrs.Converter) -> None:
    # A spec from the wire (a tool server's listing) is checked with full JSON Schema: whoever
    # wrote it (pydantic, an MCP server) may use any keyword, and none may be ignored.
    validator = JSONSchemaValidator()

    def structure_spec(value: object, _: object) -> ToolSpec:
        fields = conv.structure(value, _ToolSpecFields)
        return ToolSpec(
            name=fields.name,
            description=fields.description,
            parameters=fields.parameters,
            validator=validator,
        )

    def unstructure_spec(spec: ToolSpec) -> dict[str, Any]:
        return {"name": spec.name, "description": spec.description, "parameters": spec.parameters}

    conv.register_structure_hook(ToolSpec, structure_spec)
    conv.register_unstructure_hook(ToolSpec, unstructure_spec)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    conv.register_structure_hook_factory(attrs.has, lambda cls: _object_guard(conv, cls))
    register_strict_primitives(conv)
    # JSON payloads (tool arguments, schemas, extra_body) pass through after a JSON-ness check.
    conv.register_structure_hook_func(lambda t: t == _JSON_OBJECT_RUNTIME, _structure_json_object)
    conv.register_structure_hook_func(lambda t: t == _JSON_RUNTIME, _structure_json)
    conv.register_unstructure_hook_func(
        lambda t: t in (_JSON_RUNTIME, _JSON_OBJECT_RUNTIME), lambda v: v
    )
    _register_tool_spec(conv)
    return conv


converter = _make_converter()


def unstructure(value: object) -> Any:
    """``value`` as plain JSON data (dicts, lists, strings, numbers, booleans, None)."""
    return converter.unstructure(value)


def _describe(exc: BaseException, type_: object) -> str:
    if isinstance(exc, InvalidInput):
        # A validator of the value being built: its field is relative to that value's path.
        return f"{exc.reason}{_FIELD_MARK}{exc.field}"
    if typing.get_origin(type_) is typing.Literal:
        return f"must be one of {list(typing.get_args(type_))}"
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"extra fields {sorted(exc.extra_fields)}"
    if isinstance(exc, ValueError | TypeError) and str(exc):
        return str(exc)
    return f"invalid value for {getattr(type_, '__name__', type_)}"


def _split(problem: str) -> tuple[str, str]:
    """``reason @ path`` (with a validator's relative field folded into the path)."""
    reason, _, path = problem.rpartition(" @ ")
    if _FIELD_MARK in reason:
        reason, _, field = reason.partition(_FIELD_MARK)
        if field.startswith(("[", ".")):
            path += field
        elif field not in ("", "$"):
            path += f".{field}"
    return reason, path


def structure(
    data: object, cls: type[T], *, root: str = "$", converter: cattrs.Converter = converter
) -> T:
    """Build a ``cls`` from JSON ``data``, validating it; ``converter`` is this module's unless
    a codec of another protocol (Nomad's answers) passes its own, with the same error shape.

    Raises:
        WireError: ``field`` is the path of the first fault; ``problems`` lists every fault as
            ``reason @ path``.
    """
    try:
        return converter.structure(data, cls)
    except (ClassValidationError, IterableValidationError) as exc:
        found = [_split(p) for p in transform_error(exc, path=root, format_exception=_describe)]
        error = _wire_error(found or [("invalid value", root)])
    except InvalidInput as exc:
        error = _wire_error([(exc.reason, f"{root}.{exc.field}")])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        error = _wire_error([(_describe(exc, cls), root)])
    raise error


def _wire_error(found: list[tuple[str, str]]) -> WireError:
    (reason, path), rest = found[0], found[1:]
    if rest:
        reason += "; also " + "; ".join(f"{r} @ {p}" for r, p in rest)
    return WireError(path, reason, problems=tuple(f"{r} @ {p}" for r, p in found))
