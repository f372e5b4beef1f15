"""The domain's validators: decisions ``test_validators`` left open, found by mutation testing
(docs/testing.md)."""

from __future__ import annotations

import pytest

from tests.unit.test_validators import _attribute, _refuses
from trajcore.domain import validators as v
from trajcore.domain.errors import WireError

# The validators are built inside each test: the module's ready-made ones (positive_int, ...) are
# built when it is imported, so these tests also pin the builders' defaults.


def test_whole_number_defaults_to_at_least_one_and_names_the_plain_field() -> None:
    error = _refuses(v.whole_number(), 0)
    assert (error.field, error.reason) == ("slots", "must be an integer >= 1, got 0")


def test_an_optional_whole_number_takes_none_and_nothing_else_outside_its_bound() -> None:
    check = v.whole_number(1, optional=True)
    check(None, _attribute(), None)
    check(None, _attribute(), 3)
    for bad in (0, True, 1.0):
        assert _refuses(check, bad).reason == f"must be None or an integer >= 1, got {bad!r}"


def test_finite_number_defaults_to_above_zero_and_names_the_plain_field() -> None:
    error = _refuses(v.finite_number(), 0)
    assert (error.field, error.reason) == ("slots", "must be a finite number > 0, got 0")
    assert _refuses(v.finite_number(unit="seconds"), 0).reason == (
        "must be finite seconds > 0, got 0"
    )
    assert _refuses(v.finite_number(None, at_least=0.0), -1).reason == (
        "must be a finite number >= 0, got -1"
    )
    with pytest.raises(ValueError, match=r"^give at most one of above= and at_least=$"):
        v.finite_number(0.0, at_least=1.0)


def test_every_check_names_the_field_it_guards() -> None:
    for check, value in (
        (v.nonempty_string(), ""),
        (v.instance_of(int), "x"),
        (v.flag, 1),
        (v.nonempty_text, " "),
        (v.optional_text, " "),
    ):
        assert _refuses(check, value).field == "slots"


def test_instance_of_accepts_instances_and_names_the_kind_it_wanted() -> None:
    check = v.instance_of(int)
    check(None, _attribute(), 3)
    assert str(_refuses(check, "x")) == "expected a int, got 'x' @ slots"
    wire = v.instance_of(str, error=WireError, prefix="p.")
    assert str(_refuses(wire, 3, WireError)) == "expected a str, got 3 @ p.slots"


def test_the_text_checks_say_what_they_wanted() -> None:
    assert _refuses(v.nonempty_text, " ").reason == "must be non-empty text, got ' '"
    assert _refuses(v.optional_text, "").reason == "must be None or non-empty text, got ''"
