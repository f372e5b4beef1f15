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
``check_argument`` runs any of them on a plain function's argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from trajcore.domain.errors import ConfigError, InvalidInput

__all__ = [
    "Check",
    "Named",
    "check_argument",
    "finite_number",
    "flag",
    "instance_of",
    "non_negative_int",
    "non_negative_seconds",
    "nonempty_string",
    "nonempty_text",
    "optional_positive_int",
    "optional_seconds",
    "optional_text",
    "positive_int",
    "positive_number",
    "positive_seconds",
    "whole_number",
]


class Named(Protocol):
    """What a validator reads of its attribute: the name (an ``attrs.Attribute`` has one)."""

    @property
    def name(self) -> str:
        """The field's name, as the error names it."""
        ...


Check = Callable[[Any, Named, Any], None]
"""An attrs validator: ``check(instance, attribute, value)`` raises when ``value`` does not fit."""


@attrs.frozen
class _Argument:
    name: str


def check_argument(check: Check, name: str, value: object) -> None:
    """Run ``check`` on a function's argument, named ``name`` in the error.

    Raises:
        InvalidInput: What ``check`` raises when ``value`` does not fit.
    """
    check(None, _Argument(name), value)


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

    def check(_: object, attribute: Named, value: object) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
            raise error(f"{prefix}{attribute.name}", f"must be {expected}, got {value!r}")

    return check


def finite_number(
    above: float | None = 0.0,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    optional: bool = False,
    unit: str = "",
    error: type[InvalidInput] = ConfigError,
    prefix: str = "",
) -> Check:
    """Return a validator for a finite ``int`` or ``float`` (never a ``bool``) in a range.

    Args:
        above: Values must be strictly greater than this (the default: > 0). ``None``: no
            strict lower bound (``at_least`` may give one; neither: any finite number).
        at_least: Values must be at least this (``at_least=0`` accepts zero).
        at_most: Values must be at most this, when given.
        optional: Accept ``None`` too.
        unit: Named in the message (``"seconds"`` reads ``finite seconds > 0``).
        error: The error type raised.
        prefix: Put before the attribute's name in the error's field.

    Raises:
        ValueError: Both ``above`` and ``at_least`` were given (a programming error, at import
            time).
    """
    if above is not None and at_least is not None:
        msg = "give at most one of above= and at_least="
        raise ValueError(msg)
    bounds = []
    if above is not None:
        bounds.append(f"> {above:g}")
    if at_least is not None and at_most is not None:
        bounds.append(f"in [{at_least:g}, {at_most:g}]")
    elif at_least is not None:
        bounds.append(f">= {at_least:g}")
    if at_most is not None and at_least is None:
        bounds.append(f"<= {at_most:g}")
    what = f"finite {unit}" if unit else "a finite number"
    expected = " ".join([f"{'None or ' if optional else ''}{what}", " and ".join(bounds)]).strip()
    low = -math.inf if at_least is None else at_least
    beyond = -math.inf if above is None else above
    high = math.inf if at_most is None else at_most

    def check(_: object, attribute: Named, value: object) -> None:
        if optional and value is None:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not beyond < value <= high
            or value < low
        ):
            raise error(f"{prefix}{attribute.name}", f"must be {expected}, got {value!r}")

    return check


def nonempty_string(*, error: type[InvalidInput] = ConfigError, prefix: str = "") -> Check:
    """Return a validator for a ``str`` of at least one character (whitespace counts).

    Args:
        error: The error type raised.
        prefix: Put before the attribute's name in the error's field.
    """

    def check(_: object, attribute: Named, value: object) -> None:
        if not isinstance(value, str) or not value:
            raise error(f"{prefix}{attribute.name}", f"expected a non-empty string, got {value!r}")

    return check


def instance_of(kind: type, *, error: type[InvalidInput] = ConfigError, prefix: str = "") -> Check:
    """Return a validator for an instance of ``kind`` (a setting that is itself a value).

    Args:
        kind: The class the value must be an instance of.
        error: The error type raised.
        prefix: Put before the attribute's name in the error's field.
    """

    def check(_: object, attribute: Named, value: object) -> None:
        if not isinstance(value, kind):
            raise error(f"{prefix}{attribute.name}", f"expected a {kind.__name__}, got {value!r}")

    return check


def flag(_: object, attribute: Named, value: object) -> None:
    """Accept only ``True`` or ``False`` (not ``1``, not ``"yes"``).

    Raises:
        ConfigError: ``value`` is not a ``bool``.
    """
    if not isinstance(value, bool):
        raise ConfigError(attribute.name, f"must be true or false, got {value!r}")


def nonempty_text(_: object, attribute: Named, value: object) -> None:
    """Accept a ``str`` with something other than whitespace in it.

    Raises:
        ConfigError: ``value`` is not a string, or is empty or blank.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(attribute.name, f"must be non-empty text, got {value!r}")


def optional_text(_: object, attribute: Named, value: str | None) -> None:
    """Accept ``None`` or a ``str`` with something other than whitespace in it.

    Raises:
        ConfigError: ``value`` is neither ``None`` nor non-blank text.
    """
    given: object = value  # typed for the fields it guards; checked as whatever arrives
    if given is not None and (not isinstance(given, str) or not given.strip()):
        raise ConfigError(attribute.name, f"must be None or non-empty text, got {given!r}")


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
