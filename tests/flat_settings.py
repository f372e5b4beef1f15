"""Flat test settings split into the parts a composed pool config holds.

The testbeds write each pool's settings as one flat mapping (``slots_per_container``,
``image``, ``poll_interval_s``, ...); a pool's config holds some of them in its parts
(``server: SlotServerSettings``, ``job: NomadJobSettings``). ``split_off`` takes one part's
fields out of the mapping.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
from attrs import AttrsInstance

P = TypeVar("P", bound=AttrsInstance)


def split_off(default: P, settings: dict[str, Any]) -> P:
    """``default`` with the fields of its class found in ``settings``, which loses them."""
    names = {field.name for field in attrs.fields(type(default))}
    given = {name: settings.pop(name) for name in list(settings) if name in names}
    values = {**attrs.asdict(default, recurse=False), **given}
    return type(default)(**values)
