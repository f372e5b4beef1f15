"""Both argument validators satisfy the domain's ArgumentValidator protocol."""

from __future__ import annotations

from trajcore.adapters.json_schema import JSONSchemaValidator
from trajcore.domain.tool_schema import ArgumentValidator, BuiltinArgumentValidator
from trajcore.domain.tools import ToolSpec


def check_validators_are_argument_validators() -> None:
    full: ArgumentValidator = JSONSchemaValidator()
    builtin: ArgumentValidator = BuiltinArgumentValidator()
    spec = ToolSpec(name="t", validator=full)
    del builtin, spec
