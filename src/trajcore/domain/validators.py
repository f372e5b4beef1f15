"""The attrs validators every setting and wire value uses: whole numbers, seconds, flags, text.

A validator here is ``check(instance, attribute, value) -> None``: it returns when ``value``
fits and raises otherwise. Rules it keeps:

* ``bool`` is never a number. ``True`` is an ``int`` to Python, but ``slots=True`` is a mistake, not
  one slot, so every number check refuses it by name.
* Numbers are finite: ``nan`` and ``inf`` are refused wherever a float is accepted.
* The error names the field and says what was expected and what came: ``must be an integer >= 1,
  got 0 @ slots``. The error's type is the caller's choice (``ConfigError`` for a setting, the
  default; ``WireError`` for a peer's message) and so is a prefix of the field (``agent.`` gives
  ``agent.max_turns``).

The ready-made validators (``positive_int``, ``positive_seconds`` ...) raise ``ConfigError`` with
the bare attribute name; the factories (``whole_number``, ``finite_number``) build the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from trajcore.domain.errors import ConfigError, InvalidInput

__all__ = [
    "Check",
    "finite_number",
    "flag",
    "non_negative_int",
    "non_negative_seconds",
    "nonempty_text",
    "optional_positive_int",
    "optional_seconds",
    "optional_text",
    "positive_int",
    "positive_number",
    "positive_seconds",
    "whole_number",
]

Check = Callable[[Any, "attrs.Attribute[Any]", Any], None]
"""An attrs validator: ``check(instance, attribute, value)`` raises when ``value`` does not fit."""


def whole_number(
    at_least: int = 1,
    *,
    optional: bool = False,
    error: type[InvalidInput] = ConfigError,
    prefix: str = "",
) -> Check:
    """Return a validator for an ``int`` (never a ``bool``) that is ``>= at_least``.

    Args:
        at_least: The smallest value accepted.
        optional: Accept ``None`` too.
        error: The error type raised (``ConfigError`` for a setting, ``WireError`` for a message).
        prefix: Put before the attribute's name in the error's field (``"agent."``).
    """
    expected = f"{'None or ' if optional else ''}an integer >= {at_least}"

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
            raise error(f"{prefix}{attribute.name}", f"must be {expected}, got {value!r}")

    return check


def finite_number(
    above: float | None = 0.0,
    *,
    at_least: float | None = None,
    optional: bool = False,
    unit: str = "",
    error: type[InvalidInput] = ConfigError,
    prefix: str = "",
) -> Check:
    """Return a validator for a finite ``int`` or ``float`` (never a ``bool``) in a range.

    Args:
        above: Values must be strictly greater than this (the default: > 0). Pass ``None`` when
            ``at_least`` gives the bound.
        at_least: Values must be at least this (``at_least=0`` accepts zero).
        optional: Accept ``None`` too.
        unit: Named in the message (``"seconds"`` reads ``finite seconds > 0``).
        error: The error type raised.
        prefix: Put before the attribute's name in the error's field.

    Raises:
        ValueError: Neither or both bounds were given (a programming error, at import time).
    """
    if (above is None) == (at_least is None):
        msg = "give exactly one of above= and at_least="
        raise ValueError(msg)
    what = f"finite {unit}" if unit else "a finite number"
    strict = above is not None
    low = above if above is not None else at_least
    assert low is not None  # one of the two was given, checked above
    expected = f"{'None or ' if optional else ''}{what} {'>' if strict else '>='} {low:g}"

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if optional and value is None:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < low
            or (strict and value == low)
        ):
            raise error(f"{prefix}{attribute.name}", f"must be {expected}, got {value!r}")

    return check


def flag(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Accept only ``True`` or ``False`` (not ``1``, not ``"yes"``).

    Raises:
        ConfigError: ``value`` is not a ``bool``.
    """
    if not isinstance(value, bool):
        raise ConfigError(attribute.name, f"must be true or false, got {value!r}")


def nonempty_text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Accept a ``str`` with something other than whitespace in it.

    Raises:
        ConfigError: ``value`` is not a string, or is empty or blank.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(attribute.name, f"must be non-empty text, got {value!r}")


def optional_text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Accept ``None`` or a ``str`` with something other than whitespace in it.

    Raises:
        ConfigError: ``value`` is neither ``None`` nor non-blank text.
    """
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(attribute.name, f"must be None or non-empty text, got {value!r}")


positive_int: Check = whole_number(1)
"""An ``int`` >= 1, else ``ConfigError``."""

optional_positive_int: Check = whole_number(1, optional=True)
"""``None`` or an ``int`` >= 1, else ``ConfigError``."""

non_negative_int: Check = whole_number(0)
"""An ``int`` >= 0, else ``ConfigError``."""

positive_number: Check = finite_number(0.0)
"""A finite ``int`` or ``float`` > 0, else ``ConfigError``."""

positive_seconds: Check = finite_number(0.0, unit="seconds")
"""Finite seconds > 0, else ``ConfigError``."""

optional_seconds: Check = finite_number(0.0, unit="seconds", optional=True)
"""``None`` or finite seconds > 0, else ``ConfigError``."""

non_negative_seconds: Check = finite_number(None, at_least=0.0, unit="seconds")
"""Finite seconds >= 0, else ``ConfigError``."""
