"""The shared attrs validators: bounds, bools refused as numbers, the error's type and field."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain import validators as v
from trajcore.domain.errors import ConfigError, InvalidInput, WireError


def _attribute(name: str = "slots") -> attrs.Attribute[Any]:
    @attrs.define
    class Holder:
        slots: object
        timeout_s: object

    return next(a for a in attrs.fields(Holder) if a.name == name)


def _refuses(
    check: v.Check, value: object, error: type[InvalidInput] = ConfigError
) -> InvalidInput:
    with pytest.raises(error) as caught:
        check(None, _attribute(), value)
    return caught.value


@given(st.integers(min_value=-(10**6), max_value=10**6), st.integers(-5, 5))
def test_whole_number_accepts_exactly_the_ints_at_or_above_its_bound(value: int, low: int) -> None:
    check = v.whole_number(low)
    if value >= low:
        check(None, _attribute(), value)
    else:
        assert f"got {value}" in str(_refuses(check, value))


@pytest.mark.parametrize("check", [v.positive_int, v.optional_positive_int, v.non_negative_int])
@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_whole_numbers_refuse_bools_floats_and_text(check: v.Check, value: object) -> None:
    if value is None and check is v.optional_positive_int:
        check(None, _attribute(), value)
        return
    error = _refuses(check, value)
    assert error.field == "slots"
    assert repr(value) in error.reason


def test_the_error_type_and_field_prefix_are_the_callers() -> None:
    error = _refuses(v.whole_number(1, error=WireError, prefix="agent."), 0, WireError)
    assert error.field == "agent.slots"
    assert str(error) == "must be an integer >= 1, got 0 @ agent.slots"
    assert not isinstance(error, ConfigError)


def test_optional_is_named_in_the_message() -> None:
    assert _refuses(v.optional_positive_int, 0).reason == "must be None or an integer >= 1, got 0"
    assert _refuses(v.optional_seconds, 0).reason == "must be None or finite seconds > 0, got 0"
    assert _refuses(v.positive_number, -1).reason == "must be a finite number > 0, got -1"


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**9), 10**9))
def test_positive_seconds_accept_exactly_finite_numbers_above_zero(value: float) -> None:
    if math.isfinite(value) and value > 0:
        v.positive_seconds(None, _attribute(), value)
        v.optional_seconds(None, _attribute(), value)
    else:
        _refuses(v.positive_seconds, value)
        _refuses(v.optional_seconds, value)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**9), 10**9))
def test_non_negative_seconds_accept_zero_and_refuse_below(value: float) -> None:
    if math.isfinite(value) and value >= 0:
        v.non_negative_seconds(None, _attribute(), value)
    else:
        assert _refuses(v.non_negative_seconds, value).reason.startswith(
            "must be finite seconds >= 0"
        )


@pytest.mark.parametrize(
    "check", [v.positive_seconds, v.optional_seconds, v.non_negative_seconds, v.positive_number]
)
@pytest.mark.parametrize("value", [True, False, "1", b"1"])
def test_numbers_refuse_bools_and_text(check: v.Check, value: object) -> None:
    _refuses(check, value)


def test_optional_number_accepts_none_and_the_plain_one_does_not() -> None:
    v.optional_seconds(None, _attribute(), None)
    _refuses(v.positive_seconds, None)


def test_finite_number_needs_exactly_one_bound() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        v.finite_number(None)
    with pytest.raises(ValueError, match="exactly one"):
        v.finite_number(0.0, at_least=1.0)


def test_flag_accepts_only_bools() -> None:
    v.flag(None, _attribute(), True)
    v.flag(None, _attribute(), False)
    for value in (1, 0, "true", None):
        assert _refuses(v.flag, value).reason == f"must be true or false, got {value!r}"


def test_text_validators_refuse_blank_and_non_text() -> None:
    v.nonempty_text(None, _attribute(), "x")
    v.optional_text(None, _attribute(), None)
    v.optional_text(None, _attribute(), " x ")
    for value in ("", "  ", 3, b"x"):
        _refuses(v.nonempty_text, value)
        _refuses(v.optional_text, value)
    _refuses(v.nonempty_text, None)


def test_a_validator_works_inside_an_attrs_class() -> None:
    @attrs.frozen(kw_only=True)
    class Settings:
        slots: int = attrs.field(validator=v.positive_int)
        timeout_s: float | None = attrs.field(default=None, validator=v.optional_seconds)

    assert Settings(slots=2, timeout_s=1.5).slots == 2
    with pytest.raises(ConfigError, match=r"got True @ slots"):
        Settings(slots=True)
    with pytest.raises(ConfigError, match=r"@ timeout_s"):
        Settings(slots=1, timeout_s=math.inf)
