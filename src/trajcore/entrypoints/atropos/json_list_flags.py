"""Settings flags that hold a JSON list of records: which settings fields take one, and how a
flag's text becomes those records (an entry's every field named when it is wrong)."""

from __future__ import annotations

from typing import get_args, get_origin

import attrs
from attrs import AttrsInstance

from trajcore.domain.errors import ConfigError
from trajcore.domain.json_values import json_value

__all__ = ["json_items", "json_values"]


def json_items(hint: object) -> type[AttrsInstance] | None:
    """The attrs class of a ``tuple[C, ...]`` settings field (given as a JSON list), else
    ``None``."""
    args = get_args(hint)
    if get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        if isinstance(item, type) and attrs.has(item):
            return item
    return None


def json_values(flag: str, cls: type[AttrsInstance], value: object) -> object:
    """A JSON-list flag's text read as ``cls`` values (an empty text: none); anything but text
    as it is.

    Raises:
        ConfigError: not a JSON list of objects with ``cls``'s fields, or a value that cannot
            work (field ``flag``, the entry and its field named in the reason).
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return ()
    entries = json_value(text, flag, error=ConfigError)
    if not isinstance(entries, list):
        raise ConfigError(flag, f"expected a JSON list, got {text[:80]!r}")
    known = {field.name: field.default is attrs.NOTHING for field in attrs.fields(cls)}
    found: list[AttrsInstance] = []
    for index, entry in enumerate(entries):
        where = f"[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(flag, f"{where}: expected an object, got {entry!r}")
        unknown = sorted(set(entry) - set(known))
        missing = sorted(name for name, required in known.items() if required and name not in entry)
        if unknown or missing:
            raise ConfigError(
                flag,
                f"{where}: unknown keys {unknown}, missing keys {missing} (keys: {sorted(known)})",
            )
        try:
            found.append(cls(**entry))
        except ConfigError as error:
            raise ConfigError(flag, f"{where}.{error.field}: {error.reason}") from None
    return tuple(found)
