"""The scaling rules: decisions its examples and properties (``test_scaling``) left open,
found by mutation testing (docs/testing.md)."""

from __future__ import annotations

import pytest

from tests.unit.test_scaling import rules
from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.scaling import ScaleReason, ScaleSettings


def test_holding_within_the_cooldown_is_a_hold_not_a_cooldown() -> None:
    # Only a reversal is held back: keeping the count after a change is a plain HOLD.
    after_up = rules(cooldown_s=30.0)
    after_up.decide(demand=16, current=1, now=0.0)
    assert after_up.decide(demand=16, current=4, now=1.0).reason is ScaleReason.HOLD
    after_down = rules(cooldown_s=30.0)
    after_down.decide(demand=5, current=6, now=0.0)
    assert after_down.decide(demand=5, current=2, now=1.0).reason is ScaleReason.HOLD


def test_max_below_min_and_bad_demand_are_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError) as config_error:
        ScaleSettings(min_containers=3, max_containers=2)
    assert str(config_error.value) == "must be >= min_containers (3), got 2 @ max_containers"
    with pytest.raises(InvalidInput) as input_error:
        rules().decide(demand=-1, current=1, now=0.0)
    assert str(input_error.value) == "decide: must be an integer >= 0, got -1 @ demand"


def test_the_count_settings_are_whole_numbers_named_as_given() -> None:
    with pytest.raises(ConfigError) as caught:
        ScaleSettings(max_containers=0)
    assert str(caught.value) == "must be an integer >= 1, got 0 @ max_containers"
    with pytest.raises(ConfigError) as caught:
        ScaleSettings(min_containers=-1)
    assert str(caught.value) == "must be an integer >= 0, got -1 @ min_containers"
    assert ScaleSettings(min_containers=0).min_containers == 0
