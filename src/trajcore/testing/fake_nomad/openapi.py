"""Nomad's OpenAPI description as checks of requests and answers, found through one variable.

The description (``nomad-openapi-v1.yaml``, Nomad's own file) is never copied into trajcore: the
fake reads it from the path in ``$TRAJCORE_NOMAD_OPENAPI`` and from nowhere else.
``nomad_openapi_path`` raises ``ConfigError`` naming the variable when it is unset or names no
file. The checks close the published schemas' open objects (``additionalProperties: false``), so
a field the real agent does not know is refused instead of silently ignored.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import JSON

__all__ = ["GO_TRUE", "OPENAPI_ENV", "NomadOpenAPI", "nomad_openapi_path"]

OPENAPI_ENV: Final = "TRAJCORE_NOMAD_OPENAPI"
"""Environment variable naming Nomad's OpenAPI description (``nomad-openapi-v1.yaml``)."""
GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""How Go's ``strconv.ParseBool`` spells true (query flags such as ``purge``)."""
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def nomad_openapi_path() -> Path:
    """The file ``$TRAJCORE_NOMAD_OPENAPI`` names.

    Raises ``ConfigError`` naming ``TRAJCORE_NOMAD_OPENAPI`` when it is unset or empty, or when
    it names no readable file.
    """
    named = os.environ.get(OPENAPI_ENV, "").strip()
    if not named:
        raise ConfigError(
            OPENAPI_ENV,
            "is not set: point it at Nomad's OpenAPI description (nomad-openapi-v1.yaml)",
        )
    path = Path(named)
    if not path.is_file():
        raise ConfigError(OPENAPI_ENV, f"names {named!r}, which is not a file")
    return path


def _closed_world(schema: object) -> object:
    """``schema`` with ``additionalProperties: false`` on every object that lists properties and
    says nothing about others (the published file leaves them all open)."""
    if isinstance(schema, list):
        return [_closed_world(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed_world(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@functools.cache
def _load_spec(path: Path) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped]  # deferred: only the fake reads YAML

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as handle:
        spec = yaml.load(handle, Loader=loader)  # noqa: S506 - a safe loader (C or Python)
    if not isinstance(spec, dict) or "paths" not in spec or "components" not in spec:
        raise ConfigError(OPENAPI_ENV, f"{path} is not an OpenAPI description")
    return spec


@attrs.define(eq=False)
class NomadOpenAPI:
    """Nomad's OpenAPI description, as checks of requests and responses (see the module doc).

    Attributes:
        path: The YAML file it was read from.
    """

    path: Path
    _spec: dict[str, Any] = attrs.field(init=False, repr=False)
    _components: object = attrs.field(init=False, repr=False)
    _validators: dict[str, Any] = attrs.field(init=False, factory=dict, repr=False)

    def __attrs_post_init__(self) -> None:
        self._spec = _load_spec(self.path)
        self._components = _closed_world(self._spec["components"])

    @classmethod
    def from_env(cls) -> NomadOpenAPI:
        """The description ``$TRAJCORE_NOMAD_OPENAPI`` names (``nomad_openapi_path``'s errors)."""
        return cls(nomad_openapi_path())

    def _operation(self, method: str, template: str) -> dict[str, Any] | None:
        item = self._spec["paths"].get(template)
        if not isinstance(item, dict):
            return None
        operation = item.get(method.lower())
        return operation if isinstance(operation, dict) else None

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            target: Any = self._spec
            for part in str(node["$ref"]).removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    def _validator(self, schema: dict[str, Any]) -> Any:
        key = json.dumps(schema, sort_keys=True)
        found = self._validators.get(key)
        if found is None:
            import jsonschema  # type: ignore[import-untyped]  # deferred: a test dependency

            root = {"components": self._components, **_closed_world(schema)}  # type: ignore[dict-item]
            found = self._validators[key] = jsonschema.Draft4Validator(root)
        return found

    def _problems(self, schema: dict[str, Any], value: object, where: str) -> list[str]:
        validator = self._validator(schema)
        out: list[str] = []
        for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            out.append(f"{where}: {error.message} @ ${path}")
        return out

    def check_schema(self, name: str, value: object) -> list[str]:
        """Problems of ``value`` against the component schema ``name`` (closed world)."""
        if name not in self._spec["components"]["schemas"]:
            return [f"no schema named {name!r}"]
        return self._problems({"$ref": f"#/components/schemas/{name}"}, value, name)

    def check_request(
        self, method: str, template: str, query: Mapping[str, str], body: JSON | None
    ) -> list[str]:
        """Problems of a request to ``template`` (a path of the description, e.g.
        ``/job/{jobName}``): unknown operation, undeclared or mistyped query parameters, a body
        that does not fit the request schema (or a body where none is expected)."""
        where = f"{method} {template}"
        operation = self._operation(method, template)
        if operation is None:
            return [f"{where}: no such operation in the OpenAPI description"]
        problems: list[str] = []
        declared: dict[str, dict[str, Any]] = {}
        for parameter in operation.get("parameters", []):
            resolved = self._resolve(parameter)
            if resolved.get("in") == "query":
                declared[str(resolved["name"])] = resolved.get("schema", {})
        for name, value in query.items():
            schema = declared.get(name)
            if schema is None:
                problems.append(f"{where}: undeclared query parameter {name!r}")
            elif schema.get("type") == "boolean" and value not in GO_TRUE | _GO_FALSE:
                problems.append(f"{where}: query {name}={value!r} is not a boolean")
            elif schema.get("type") == "integer" and not value.lstrip("-").isdigit():
                problems.append(f"{where}: query {name}={value!r} is not an integer")
        request_body = operation.get("requestBody")
        if request_body is None:
            if body is not None:
                problems.append(f"{where}: the operation takes no body")
            return problems
        resolved_body = self._resolve(request_body)
        if body is None:
            if resolved_body.get("required"):
                problems.append(f"{where}: a body is required")
            return problems
        schema = resolved_body["content"]["application/json"]["schema"]
        return problems + self._problems(schema, body, f"{where} request")

    def check_response(self, method: str, template: str, status: int, body: JSON) -> list[str]:
        """Problems of a JSON answer ``body`` with ``status`` to ``method template``."""
        where = f"{method} {template}"
        operation = self._operation(method, template)
        if operation is None:
            return [f"{where}: no such operation in the OpenAPI description"]
        response = operation.get("responses", {}).get(str(status))
        if response is None:
            return [f"{where}: status {status} is not a declared response"]
        content = self._resolve(response).get("content")
        if content is None:
            return [f"{where}: status {status} declares no body"]
        schema = content["application/json"]["schema"]
        return self._problems(schema, body, f"{where} response {status}")
