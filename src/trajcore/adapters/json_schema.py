"""Full JSON Schema for tool arguments, through the ``jsonschema`` library.

``JSONSchemaValidator`` is the ``ArgumentValidator`` that tools with real-world schemas (pydantic's
``model_json_schema()``, MCP servers) are built with. It keeps these rules:

- The draft is the schema's ``$schema`` when it names one, Draft 2020-12 otherwise. The schema is
  checked against that draft's metaschema when the ``ToolSpec`` is built; a bad schema is a
  ``ConfigError`` whose field is the path of the fault (``parameters.properties.n.minimum``) and
  whose reason names the tool.
- Every keyword of the draft is enforced, ``format`` included for the formats listed in
  ``ASSERTED_FORMATS``. A standard format that cannot be asserted here is refused at build;
  a format outside the standard vocabulary is an annotation, as the specification says.
- A key that is no keyword of the draft (``maxLenght``) is refused at build, where the
  specification would let it pass as an annotation that nothing enforces; extensions are named
  ``x-...``. Annotations (``title``, ``default``, ...) and pydantic's ``discriminator`` pass.
- Nothing is ever fetched. A ``$ref`` outside the schema (anything but ``#...``) is refused at
  build, every ``#...`` reference must resolve then, and the validator's registry refuses to
  retrieve any URI, so no later lookup can reach the network or the disk.
- ``jsonschema`` is the reference; ``jsonschema-rs`` (Rust) is the fast path for the common case.
  Both are compiled once per spec. Arguments the fast validator finds valid are accepted at once;
  arguments it finds invalid (or cannot read: a lone surrogate) go to ``jsonschema``, which
  judges them and names every problem. A schema the fast validator cannot compile (a Python-only
  regex, draft 3) is checked by ``jsonschema`` alone (``JSONSchemaCheck.fast`` is ``False``).
- Formats mean the same in both: the fast validator calls this module's format checker for
  every ``format`` the schema names, an asserted one through ``jsonschema``'s checker and any
  other as an annotation. The fast validator is built offline: it retrieves nothing.
- When the fast validator rejects arguments that ``jsonschema`` accepts, the reference wins: the
  arguments are accepted, ``JSONSchemaCheck.disagreements`` counts it, and the logger
  ``trajcore.tools`` warns (the 1st, 10th, 100th, ... time per tool), so it is never silent.
  The one known case is a ``pattern`` ending in ``$`` against a string ending in a newline
  (Python's ``$`` matches before a final newline, the Rust engine's does not). The reverse, which
  no check can see at run time, is pinned by tests and listed in docs/tool_parsers.md: a
  fractional ``multipleOf`` is exact in the fast validator (``0.07`` is a multiple of ``0.01``),
  where ``jsonschema``'s float division says it is not.
- Without ``jsonschema_rs`` (a platform with no wheel for it) ``jsonschema`` checks alone, after one
  ``RuntimeWarning`` at the first compile.
- Problems read as the domain's do: ``expected integer, got string @ $.count``.

``jsonschema`` ships no type information, so its objects stay inside this module.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import urllib.parse
import warnings
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, Final

import attrs
import jsonschema  # type: ignore[import-untyped]  # no py.typed; its Any stays in this module
from jsonschema import validators as _validators
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSONObject, json_type
from trajcore.domain.tool_schema import ArgumentProblem

_fast_lib: ModuleType | None
try:
    import jsonschema_rs as _fast_lib
except ImportError:  # a platform without its wheel; the tests run this in a subprocess
    _fast_lib = None

__all__ = ["ASSERTED_FORMATS", "JSONSchemaCheck", "JSONSchemaValidator"]

_log = logging.getLogger("trajcore.tools")

# The formats of JSON Schema 2020-12's format vocabulary.
_STANDARD_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
        "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
        "json-pointer", "relative-json-pointer", "regex",
    }
)  # fmt: skip

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")
_JSON_POINTER = re.compile(r"^(?:/(?:[^~/]|~[01])*)*$")
# RFC 3339 appendix A: P[n]W, or P with date and/or T with time parts, at least one part each.
_DURATION = re.compile(
    r"^P(?:\d+W|(?=\d|T\d)(?:\d+Y)?(?:\d+M)?(?:\d+D)?(?:T(?=\d)(?:\d+H)?(?:\d+M)?(?:\d+S)?)?)$"
)
_URI_CHARS = re.compile(r"^[^\s<>\"{}|\\^`\x00-\x1f\x7f]*$")


def _is_uri_reference(value: object) -> bool:
    return not isinstance(value, str) or bool(_URI_CHARS.match(value))


def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    return _is_uri_reference(value) and bool(_SCHEME.match(urllib.parse.urlsplit(value).scheme))


def _format_checker() -> Any:
    checker = jsonschema.FormatChecker()
    checker.checks("hostname")(lambda v: not isinstance(v, str) or bool(_HOSTNAME.match(v)))
    checker.checks("uri")(_is_uri)
    checker.checks("uri-reference")(_is_uri_reference)
    checker.checks("json-pointer")(lambda v: not isinstance(v, str) or bool(_JSON_POINTER.match(v)))
    checker.checks("duration")(lambda v: not isinstance(v, str) or bool(_DURATION.match(v)))
    return checker


_FORMATS = _format_checker()
ASSERTED_FORMATS: frozenset[str] = frozenset(_FORMATS.checkers)
"""The ``format`` values this validator enforces; other standard formats are refused at build."""


# A registry without a ``retrieve`` function fails every lookup of a URI it does not hold, so the
# validators never fall back to jsonschema's deprecated resolver, which would fetch remote refs.
_REGISTRY: Registry[Any] = Registry()


def _schema_path(parts: Iterable[object]) -> str:
    return "parameters" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _arg_path(parts: Iterable[object]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Keywords that hold one subschema, a map of them, or a list of them (any draft).
_ONE_SCHEMA = frozenset(
    {
        "additionalProperties", "contains", "propertyNames", "not", "if", "then", "else",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema",
    }
)  # fmt: skip
_SCHEMA_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_SCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
# Keywords no validator asserts but the specification defines (core, annotations, content),
# applicator partners that live under another keyword's implementation, and pydantic's
# ``discriminator`` (OpenAPI's, emitted beside ``oneOf``; the ``oneOf`` itself is enforced).
_NOT_ASSERTED = frozenset(
    {
        "$schema", "$id", "$anchor", "$dynamicAnchor", "$vocabulary", "$comment", "$defs",
        "definitions", "title", "description", "default", "examples", "deprecated", "readOnly",
        "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "then", "else",
        "minContains", "maxContains", "discriminator",
    }
)  # fmt: skip


def _subschemas(
    schema: JSONObject, path: tuple[object, ...] = ()
) -> Iterator[tuple[tuple[object, ...], JSONObject]]:
    """``schema`` and every subschema in it, by keyword (values of ``enum``, ``const``,
    ``default`` and ``examples`` are data, not schemas), each with its path."""
    yield path, schema
    for key, value in schema.items():
        if isinstance(value, dict) and (key in _ONE_SCHEMA or key == "items"):
            yield from _subschemas(value, (*path, key))
        elif isinstance(value, dict) and key in (*_SCHEMA_MAP, "dependentSchemas", "dependencies"):
            for name, sub in value.items():
                if isinstance(sub, dict):
                    yield from _subschemas(sub, (*path, key, name))
        elif isinstance(value, list) and (key in _SCHEMA_LIST or key == "items"):
            for i, sub in enumerate(value):
                if isinstance(sub, dict):
                    yield from _subschemas(sub, (*path, key, i))


def _check_keywords(tool: str, schema: JSONObject, known: frozenset[str]) -> None:
    """Refuse what would be silently ignored or fetched: an unknown (misspelt) keyword, a
    reference that leaves the schema or does not resolve, a format that cannot be asserted."""
    resolver = _REGISTRY.resolver_with_root(Resource.from_contents(schema, DRAFT202012))
    for path, sub in _subschemas(schema):
        for key, value in sub.items():
            where = _schema_path((*path, key))
            if key not in known and key not in _NOT_ASSERTED and not key.startswith("x-"):
                raise ConfigError(
                    where,
                    f"tool {tool!r}: {key!r} is not a keyword of this JSON Schema draft, so "
                    "nothing would enforce it (misspelt? extensions are named 'x-...')",
                )
            if key == "$id" and path:
                raise ConfigError(
                    where,
                    f"tool {tool!r}: a subschema with its own '$id' is not supported; keep one "
                    "document with '$defs' and '#/...' references",
                )
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                if not value.startswith("#"):
                    raise ConfigError(
                        where,
                        f"tool {tool!r}: reference {value!r} leaves the schema; only references "
                        "inside it ('#...') are resolved, nothing is fetched",
                    )
                try:
                    resolver.lookup(value)
                except Unresolvable:
                    raise ConfigError(
                        where, f"tool {tool!r}: reference {value!r} does not resolve"
                    ) from None
            if key == "format" and value in _STANDARD_FORMATS and value not in ASSERTED_FORMATS:
                raise ConfigError(
                    where,
                    f"tool {tool!r}: format {value!r} cannot be enforced here; asserted formats "
                    f"are {sorted(ASSERTED_FORMATS)}",
                )


def _types(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _top_type_mismatch(error: Any) -> bool:
    return error.validator == "type" and not error.relative_path


def _explain_alternatives(error: Any) -> list[ArgumentProblem]:
    """An ``anyOf``/``oneOf`` miss: the branch the value's type chose, or the types it missed."""
    path = _arg_path(error.absolute_path)
    if not error.context:  # oneOf matched more than once
        return [
            ArgumentProblem(
                path=path, reason=f"matches more than one of the {error.validator} choices"
            )
        ]
    branches: dict[object, list[Any]] = {}
    for sub in error.context:
        # A ``false`` branch's error has no schema path of its own: it is a branch by itself.
        branch = sub.relative_schema_path[0] if sub.relative_schema_path else ("false", id(sub))
        branches.setdefault(branch, []).append(sub)
    # A ``false`` branch explains nothing while another branch can.
    chosen = {k: v for k, v in branches.items() if not isinstance(k, tuple)} or branches
    branches = chosen
    for subs in branches.values():
        if not all(_top_type_mismatch(sub) for sub in subs):
            return [p for sub in subs for p in _explain(sub)]
    expected: list[str] = []
    for subs in branches.values():
        for sub in subs:
            expected.extend(t for t in _types(sub.validator_value) if t not in expected)
    got = json_type(error.instance)
    return [ArgumentProblem(path=path, reason=f"expected {' or '.join(expected)}, got {got}")]


def _explain(error: Any) -> list[ArgumentProblem]:
    """``jsonschema``'s error as the domain's problems (one error may name several)."""
    keyword, value, instance = error.validator, error.validator_value, error.instance
    path = _arg_path(error.absolute_path)
    if "propertyNames" in error.relative_schema_path:
        inner = _explain_keyword(keyword, value, instance) or _short(error.message)
        return [ArgumentProblem(path=path, reason=f"property name {instance!r}: {inner}")]
    if keyword in ("anyOf", "oneOf"):
        return _explain_alternatives(error)
    if keyword == "required":
        return [
            ArgumentProblem(path=f"{path}.{name}", reason="required")
            for name in value
            if isinstance(instance, dict) and name not in instance
        ]
    if keyword == "dependentRequired":
        return [
            ArgumentProblem(path=f"{path}.{need}", reason=f"required when {name!r} is present")
            for name, needs in value.items()
            if isinstance(instance, dict) and name in instance
            for need in needs
            if need not in instance
        ]
    if keyword == "additionalProperties" and value is False and isinstance(instance, dict):
        schema = error.schema
        known = schema.get("properties", {})
        patterns = list(schema.get("patternProperties", {}))
        return [
            ArgumentProblem(path=f"{path}.{name}", reason="unexpected property")
            for name in instance
            if name not in known and not any(re.search(p, name) for p in patterns)
        ]
    if keyword is None and error.schema is False:
        value = False
    reason = _explain_keyword(keyword, value, instance)
    return [ArgumentProblem(path=path, reason=reason or _short(error.message))]


# What a failed keyword means, as a sentence about the value; ``{value}`` is the keyword's own
# value in the schema.
_KEYWORD_REASONS: Final[Mapping[str, str]] = {
    "enum": "must be one of {value!r}",
    "minimum": "must be >= {value}",
    "maximum": "must be <= {value}",
    "exclusiveMinimum": "must be > {value}",
    "exclusiveMaximum": "must be < {value}",
    "multipleOf": "must be a multiple of {value}",
    "minLength": "must be at least {value} characters long",
    "maxLength": "must be at most {value} characters long",
    "pattern": "must match the pattern {value!r}",
    "format": "must be a valid {value}",
    "minItems": "must have at least {value} items",
    "maxItems": "must have at most {value} items",
    "uniqueItems": "items must be unique",
    "minProperties": "must have at least {value} properties",
    "maxProperties": "must have at most {value} properties",
    "not": "must not match the schema under 'not'",
}


def _explain_keyword(keyword: object, value: Any, instance: Any) -> str | None:
    if keyword == "type":
        return f"expected {' or '.join(_types(value))}, got {json_type(instance)}"
    if keyword == "const":
        return f"must be {json.dumps(value)}"
    if isinstance(keyword, str) and keyword in _KEYWORD_REASONS:
        return _KEYWORD_REASONS[keyword].format(value=value)
    if keyword == "items" and value is False:
        return "has more items than the schema allows"
    if keyword is None and value is False:
        return "no value is allowed here"
    return None


def _format_names(schema: JSONObject) -> set[str]:
    return {
        str(sub["format"]) for _, sub in _subschemas(schema) if isinstance(sub.get("format"), str)
    }


def _fast_format(name: str) -> Any:
    """The fast validator's check of ``format: name``: this module's checker where it asserts
    the format, an annotation (always true) otherwise, as ``jsonschema`` treats it."""
    if name in ASSERTED_FORMATS:
        return lambda value: _FORMATS.conforms(value, name)
    return lambda value: True


def _compile_fast(schema: JSONObject) -> Any:
    """``jsonschema_rs``'s validator for ``schema``, or ``None`` where it has none (not installed,
    or a schema it cannot compile: a regex only Python reads, a draft it does not know)."""
    if _fast_lib is None:
        _warn_no_fast()
        return None
    try:
        return _fast_lib.validator_for(
            schema,
            formats={name: _fast_format(name) for name in _format_names(schema)},
            validate_formats=True,
            ignore_unknown_formats=True,
            offline=True,
        )
    except ValueError:
        return None


@functools.cache
def _warn_no_fast() -> None:
    warnings.warn(
        "jsonschema_rs is not installed (no wheel for this platform?): tool arguments are "
        "checked by jsonschema alone, several times slower",
        RuntimeWarning,
        stacklevel=4,
    )


@attrs.define(eq=False)
class JSONSchemaCheck:
    """The compiled check of one tool's arguments (an ``ArgumentCheck``).

    ``fast`` says whether ``jsonschema_rs`` checks valid arguments first; ``disagreements``
    counts the arguments it rejected and the reference, ``jsonschema``, accepted (and so were
    accepted).
    """

    tool: str
    _reference: Any = attrs.field(alias="reference", repr=False)
    _fast: Any = attrs.field(alias="fast_validator", repr=False)
    disagreements: int = 0

    @property
    def fast(self) -> bool:
        return self._fast is not None

    def verdicts(self, arguments: object, /) -> tuple[bool | None, bool]:
        """Both validators' answers for ``arguments``, for audits of their agreement: the fast
        one's (``None`` where it has no fast validator or cannot read the arguments) and the
        reference's."""
        fast: bool | None = None
        if self._fast is not None:
            try:
                fast = bool(self._fast.is_valid(arguments))
            except ValueError:
                fast = None
        return fast, bool(self._reference.is_valid(arguments))

    def __call__(self, arguments: object, /) -> list[ArgumentProblem]:
        rejected_fast = False
        if self._fast is not None:
            try:
                if self._fast.is_valid(arguments):
                    return []
                rejected_fast = True
            except ValueError:  # what it cannot read (a lone surrogate): the reference judges
                pass
        if not rejected_fast and self._reference.is_valid(arguments):
            return []
        seen: set[tuple[str, str]] = set()
        out: list[ArgumentProblem] = []
        for error in self._reference.iter_errors(arguments):
            for problem in _explain(error):
                if (problem.path, problem.reason) not in seen:
                    seen.add((problem.path, problem.reason))
                    out.append(problem)
        if rejected_fast and not out:
            self.disagreements += 1
            if _is_power_of_ten(self.disagreements):
                _log.warning(
                    "tool %r: jsonschema-rs rejected arguments that jsonschema (the reference) "
                    "accepts; accepted them (%d time(s) for this tool so far)",
                    self.tool,
                    self.disagreements,
                )
        return out


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1


def _keys(keys: Iterable[str]) -> frozenset[str]:
    """``keys`` as a set; one string is refused (its letters would be the keys)."""
    if isinstance(keys, str):
        raise ConfigError("annotations", f"expected a list of keys, got the string {keys!r}")
    return frozenset(keys)


@attrs.frozen
class JSONSchemaValidator:
    """Full JSON Schema (Draft 2020-12 unless the schema names another draft), compiled per tool.

    Use it where tools are built:
    ``ToolSpec(name=..., parameters=..., validator=JSONSchemaValidator())``. ``annotations``
    names keys that are no keyword of the draft but are known annotations of the schemas' author
    (an MCP server's ``markdownDescription``): they pass, as ``x-...`` does, and nothing
    enforces them; any other unknown key is still refused. A keyword named there is enforced
    all the same.
    """

    annotations: frozenset[str] = attrs.field(default=frozenset(), converter=_keys, kw_only=True)

    def compile(self, tool: str, schema: JSONObject) -> JSONSchemaCheck:
        """A reusable check of arguments against ``schema``.

        Raises:
            ConfigError: ``schema`` is invalid against its draft's metaschema, has a reference
                outside itself or one that does not resolve, or names a standard format that
                cannot be enforced; ``field`` is the path of the fault in the spec.
        """
        cls = _validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigError(
                _schema_path(exc.absolute_path),
                f"tool {tool!r}: not a valid JSON Schema: {_short(exc.message)}",
            ) from None
        _check_keywords(tool, schema, frozenset(cls.VALIDATORS) | self.annotations)
        return JSONSchemaCheck(
            tool,
            reference=cls(schema, registry=_REGISTRY, format_checker=_FORMATS),
            fast_validator=_compile_fast(schema),
        )
