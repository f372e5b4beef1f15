"""Conversation values: messages, tool calls, tool results and tool specs.

Everything here is a small frozen value, keyword-only and validated when built, so a value that
exists is a value that makes sense: an assistant message is the only one that carries tool calls,
a tool message always names the call it answers, a tool spec's parameters are a JSON-schema object.

A tool spec compiles its schema once, when built, through an injected ``ArgumentValidator``: the
domain's own ``BuiltinArgumentValidator`` enforces a small subset and refuses every other keyword
(so none is ever silently ignored); full JSON Schema is an adapter
(``trajcore.adapters.json_schema``), because the domain imports nothing but the standard library
and attrs.

JSON payloads (tool arguments, schemas) are plain ``dict``/``list`` trees typed as ``JSON``. They
are not deep-frozen; treat them as read-only.
"""

from __future__ import annotations

import enum
import json
import math
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

import attrs

from trajcore.domain import validators
from trajcore.domain.errors import ConfigError, ToolArgumentError

__all__ = [
    "BUILTIN_VALIDATOR",
    "JSON",
    "ArgumentCheck",
    "ArgumentProblem",
    "ArgumentValidator",
    "BuiltinArgumentValidator",
    "ExecReport",
    "JSONObject",
    "Message",
    "Role",
    "ToolCall",
    "ToolContext",
    "ToolOutcome",
    "ToolResult",
    "ToolSpec",
    "check_json",
    "json_type",
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
Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def check_json(value: object, path: str = "$") -> str | None:
    """Return ``None`` when ``value`` is a JSON tree, else ``"reason @ path"`` for the first fault.

    JSON here means: None, bool, int, finite float, str, list of JSON, dict with str keys of JSON.
    """
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"non-finite number {value!r} @ {path}"
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = check_json(item, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"object key {key!r} is not a string @ {path}"
            problem = check_json(item, f"{path}.{key}")
            if problem:
                return problem
        return None
    return f"{type(value).__name__} is not a JSON value @ {path}"


def _json_object(_: object, attribute: attrs.Attribute[object], value: object) -> None:
    if not isinstance(value, dict):
        raise ToolArgumentError(
            attribute.name, f"expected a JSON object, got {type(value).__name__}"
        )
    problem = check_json(value)
    if problem:
        raise ToolArgumentError(attribute.name, problem)


_nonempty = validators.nonempty_string()


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model asked for.

    Attributes:
        id: The call's id, unique within its trajectory; results answer it by this id.
        name: The tool's name.
        arguments: The decoded arguments, a JSON object.
    """

    id: str = attrs.field(validator=_nonempty)
    name: str = attrs.field(validator=_nonempty)
    arguments: JSONObject = attrs.field(factory=dict, validator=_json_object)

    def arguments_json(self) -> str:
        """The arguments as compact JSON text, keys in insertion order."""
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))


class ToolOutcome(enum.Enum):
    """How a tool call ended.

    ``OK`` and ``TOOL_ERROR`` are the tool's own answers (a command may exit non-zero and still be
    ``OK``: the exit code is data for the model). ``TIMEOUT`` means the call ran past its limit and
    was killed. ``REJECTED`` means policy or validation refused to run it (unknown tool, bad
    arguments, path escape). ``INFRA_ERROR`` means the sandbox or server failed; it is never the
    model's fault and is never scored as such.
    """

    OK = "ok"
    TOOL_ERROR = "tool_error"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    INFRA_ERROR = "infra_error"


@attrs.frozen(kw_only=True)
class ExecReport:
    """What happened when a command ran in a slot.

    Attributes:
        exit_code: The process's exit code, or ``None`` when it was killed or never started.
        stdout: Captured standard output (decoded as UTF-8 with replacement), capped.
        stderr: Captured standard error, capped likewise.
        stdout_dropped: Bytes of stdout cut out by the cap (the head and tail are kept).
        stderr_dropped: Bytes of stderr cut out by the cap.
        timed_out: The call ran past its timeout and its process group was killed.
        duration_s: Wall time of the call inside the slot server.
        sandboxed: Whether the command ran inside the slot's bubblewrap sandbox.
    """

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    stdout_dropped: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    stderr_dropped: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    timed_out: bool = False
    duration_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    sandboxed: bool = False


@attrs.frozen(kw_only=True)
class ToolResult:
    """The answer to one tool call.

    Attributes:
        call_id: The id of the call this answers.
        name: The tool that was called.
        outcome: How the call ended (see ``ToolOutcome``).
        content: The text the model will see.
        error: For any outcome but ``OK``, a one-line reason naming the field at fault.
        exec: For commands, what the process did.
    """

    call_id: str
    name: str
    outcome: ToolOutcome
    content: str = ""
    error: str | None = None
    exec: ExecReport | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is ToolOutcome.OK

    @classmethod
    def success(cls, call: ToolCall, content: str) -> ToolResult:
        """An OK result of ``call`` whose content is ``content``."""
        return cls(call_id=call.id, name=call.name, outcome=ToolOutcome.OK, content=content)

    @classmethod
    def failure(
        cls, call: ToolCall, outcome: ToolOutcome, error: str, *, exec: ExecReport | None = None
    ) -> ToolResult:
        """A non-OK result whose content tells the model what went wrong."""
        if outcome is ToolOutcome.OK:
            raise ValueError("failure() needs a non-OK outcome")
        return cls(
            call_id=call.id,
            name=call.name,
            outcome=outcome,
            content=f"Error: {error}",
            error=error,
            exec=exec,
        )

    @classmethod
    def infra_errors(cls, calls: Iterable[ToolCall], error: str) -> list[ToolResult]:
        """An ``INFRA_ERROR`` result for each of ``calls``, in order: their batch broke as one."""
        return [cls.failure(call, ToolOutcome.INFRA_ERROR, error) for call in calls]

    @classmethod
    def unknown_tool(cls, call: ToolCall) -> ToolResult:
        """The ``REJECTED`` result of a call naming a tool that is not offered (``@ name``)."""
        return cls.failure(call, ToolOutcome.REJECTED, f"unknown tool {call.name!r} @ name")


@attrs.frozen(kw_only=True)
class ToolContext:
    """Who calls a tool: the trajectory and, when it holds one, its slot (``container/index``)."""

    trajectory_id: str
    slot: str | None = None


def _tuple_of_calls(calls: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(calls)


def _role(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in ROLES:
        raise ConfigError(
            attribute.name, f"unknown role {value!r}; expected one of {sorted(ROLES)}"
        )


@attrs.frozen(kw_only=True)
class Message:
    """One chat message.

    Attributes:
        role: system, user, assistant or tool.
        content: The visible text.
        reasoning: The assistant's reasoning (think block, ``reasoning_content``), if any.
        tool_calls: The calls an assistant message asks for, in order.
        tool_call_id: For a tool message, the id of the call it answers.
        name: For a tool message, the tool's name.
    """

    role: Role = attrs.field(validator=_role)
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple_of_calls)
    tool_call_id: str | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.tool_calls and self.role != "assistant":
            raise ConfigError(
                "tool_calls", f"only assistant messages carry tool calls, not {self.role}"
            )
        if self.role == "tool" and not self.tool_call_id:
            raise ConfigError("tool_call_id", "a tool message must name the call it answers")
        if self.reasoning is not None and self.role != "assistant":
            raise ConfigError(
                "reasoning", f"only assistant messages carry reasoning, not {self.role}"
            )

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(
        cls, content: str = "", *, tool_calls: Sequence[ToolCall] = (), reasoning: str | None = None
    ) -> Message:
        return cls(
            role="assistant", content=content, tool_calls=tuple(tool_calls), reasoning=reasoning
        )

    @classmethod
    def tool(cls, result: ToolResult) -> Message:
        return cls(
            role="tool", content=result.content, tool_call_id=result.call_id, name=result.name
        )

    def to_chat_dict(self, *, arguments_as_json: bool = False) -> JSONObject:
        """The message as a chat-template / OpenAI-style dict.

        ``arguments_as_json`` renders tool-call arguments as JSON text (the OpenAI wire format)
        instead of a nested object (what most chat templates expect).
        """
        out: JSONObject = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments_json() if arguments_as_json else call.arguments,
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


# ---------------------------------------------------------------------------------- tool specs

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


def _tool_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _TOOL_NAME.match(value):
        raise ConfigError(attribute.name, f"{value!r} is not 1-64 of [A-Za-z0-9_.-]")


def _parameters(_: object, attribute: attrs.Attribute[JSONObject], value: JSONObject) -> None:
    if not isinstance(value, dict):
        raise ConfigError(attribute.name, "a schema must be a JSON object")
    problem = check_json(value, attribute.name)
    if problem:
        reason, _, where = problem.rpartition(" @ ")
        raise ConfigError(where, reason)
    if value.get("type") != "object":
        raise ConfigError(f"{attribute.name}.type", "a tool's parameters must be of type 'object'")


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool the model may call, described by a JSON schema.

    The schema is compiled once, when the spec is built, by ``validator``; a schema the validator
    cannot enforce in full is refused then (``ConfigError`` naming the tool and the schema path),
    so no keyword is ever silently ignored. Two specs are equal when their name, description and
    parameters are; the validator is how they are checked, not what they are.

    Attributes:
        name: 1-64 characters of ``[A-Za-z0-9_.-]``.
        description: What the tool does, for the model.
        parameters: A JSON-schema object (``{"type": "object", "properties": ...}``).
        validator: What compiles ``parameters`` (``BuiltinArgumentValidator`` by default, a strict
            subset; ``trajcore.adapters.json_schema.JSONSchemaValidator`` for full JSON Schema).
    """

    name: str = attrs.field(validator=_tool_name)
    description: str = ""
    parameters: JSONObject = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}, validator=_parameters
    )
    validator: ArgumentValidator = attrs.field(
        default=BUILTIN_VALIDATOR, eq=False, repr=False, hash=False
    )
    _check: ArgumentCheck = attrs.field(init=False, eq=False, repr=False, hash=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_check", self.validator.compile(self.name, self.parameters))

    def validate_arguments(self, arguments: object) -> list[ArgumentProblem]:
        """Every way ``arguments`` miss this tool's schema; empty when they fit."""
        return self._check(arguments)

    def check_call(self, call: ToolCall) -> None:
        """Raise ``ToolArgumentError`` for the first problem with ``call``'s arguments."""
        problems = self.validate_arguments(call.arguments)
        if problems:
            first = problems[0]
            raise ToolArgumentError(
                f"{call.name}{first.path[1:]}",
                first.reason,
                problems=tuple(f"{p.reason} @ {call.name}{p.path[1:]}" for p in problems),
            )

    def to_openai(self) -> JSONObject:
        """The spec in the OpenAI ``tools`` shape, which chat templates also take."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }
