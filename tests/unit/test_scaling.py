"""The scaling rules: bounds, hysteresis, cooldown, settling, and the drain order."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.errors import ConfigError, InvalidInput
from trajcore.domain.scaling import (
    ContainerLoad,
    ScaleDecision,
    ScaleReason,
    ScaleRules,
    ScaleSettings,
    drain_order,
)


def rules(*, slots_per_container: int = 4, **settings: float) -> ScaleRules:
    base: dict[str, float] = {
        "min_containers": 1,
        "max_containers": 10,
        "scale_down_margin": 2,
        "cooldown_s": 30.0,
    }
    base.update(settings)
    return ScaleRules(ScaleSettings(**base), slots_per_container)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- examples


def test_scaling_up_covers_the_demand() -> None:
    decision = rules().decide(demand=9, current=1, now=0.0)
    assert decision == ScaleDecision(target=3, current=1, reason=ScaleReason.UP)
    assert decision.delta == 2


def test_scaling_up_stops_at_max() -> None:
    assert rules(max_containers=2).decide(demand=100, current=1, now=0.0).target == 2


def test_spare_capacity_within_the_margin_holds() -> None:
    # 3 containers x 4 slots = 12; demand 10 leaves 2 spare, not more than the margin.
    decision = rules().decide(demand=10, current=3, now=0.0)
    assert (decision.target, decision.reason) == (3, ScaleReason.HOLD)


def test_scaling_down_keeps_the_margin_spare() -> None:
    # demand 5 + margin 2 = 7 slots -> 2 containers (8 slots, 3 spare >= 2).
    decision = rules().decide(demand=5, current=6, now=0.0)
    assert (decision.target, decision.reason) == (2, ScaleReason.DOWN)


def test_scaling_down_stops_at_min() -> None:
    assert rules(min_containers=3).decide(demand=0, current=6, now=0.0).target == 3


def test_no_reversal_within_the_cooldown_but_more_of_the_same_is_fine() -> None:
    scale = rules(cooldown_s=30.0)
    assert scale.decide(demand=16, current=1, now=0.0).target == 4
    held = scale.decide(demand=0, current=4, now=29.9)
    assert (held.target, held.reason) == (4, ScaleReason.COOLDOWN)
    assert scale.decide(demand=24, current=4, now=29.95).target == 6  # up again: allowed
    assert scale.decide(demand=0, current=6, now=59.9).reason is ScaleReason.COOLDOWN
    down = scale.decide(demand=0, current=6, now=59.95)
    assert (down.target, down.reason) == (1, ScaleReason.DOWN)
    assert scale.decide(demand=40, current=1, now=60.0).reason is ScaleReason.COOLDOWN


def test_bounds_win_over_the_cooldown() -> None:
    scale = rules(min_containers=2, max_containers=5)
    assert scale.decide(demand=20, current=2, now=0.0).target == 5
    decision = scale.decide(demand=0, current=1, now=1.0)  # a container died
    assert (decision.target, decision.reason) == (2, ScaleReason.BOUNDS)
    decision = scale.decide(demand=0, current=9, now=2.0)
    assert (decision.target, decision.reason) == (5, ScaleReason.BOUNDS)


def test_below_min_with_demand_goes_straight_to_what_is_needed() -> None:
    decision = rules(min_containers=2).decide(demand=20, current=0, now=0.0)
    assert (decision.target, decision.reason) == (5, ScaleReason.BOUNDS)


def test_scale_to_zero_is_possible_when_min_is_zero() -> None:
    scale = rules(min_containers=0, scale_down_margin=0)
    assert scale.decide(demand=0, current=2, now=0.0).target == 0
    assert scale.decide(demand=1, current=0, now=100.0).target == 1


def test_drain_order_is_fewest_leased_then_newest_then_name() -> None:
    loads = [
        ContainerLoad(name="old-idle", leased=0, added_at=1.0),
        ContainerLoad(name="busy", leased=5, added_at=9.0),
        ContainerLoad(name="new-idle", leased=0, added_at=8.0),
        ContainerLoad(name="b-twin", leased=1, added_at=3.0),
        ContainerLoad(name="a-twin", leased=1, added_at=3.0),
    ]
    assert drain_order(loads) == ["new-idle", "old-idle", "a-twin", "b-twin", "busy"]
    assert drain_order([]) == []


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"min_containers": -1}, "min_containers"),
        ({"max_containers": 0}, "max_containers"),
        ({"min_containers": 3, "max_containers": 2}, "max_containers"),
        ({"scale_down_margin": -1}, "scale_down_margin"),
        ({"cooldown_s": -1.0}, "cooldown_s"),
        ({"cooldown_s": float("nan")}, "cooldown_s"),
        ({"max_containers": 2.5}, "max_containers"),
    ],
)
def test_bad_config_names_the_field(settings: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ScaleSettings(**settings)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize("slots", [0, -1, 2.5, True])
def test_bad_slots_per_container_names_the_field(slots: object) -> None:
    with pytest.raises(ConfigError) as caught:
        ScaleRules(ScaleSettings(), slots)  # type: ignore[arg-type]
    assert caught.value.field == "slots_per_container"


def test_bad_inputs_name_the_argument() -> None:
    scale = rules()
    with pytest.raises(InvalidInput, match="@ demand"):
        scale.decide(demand=-1, current=1, now=0.0)
    with pytest.raises(InvalidInput, match="@ current"):
        scale.decide(demand=0, current=True, now=0.0)
    scale.decide(demand=0, current=1, now=5.0)
    with pytest.raises(InvalidInput, match=r"decide: time went backwards .* @ now"):
        scale.decide(demand=0, current=1, now=4.0)


# ---------------------------------------------------------------------- properties

scale_rules = st.builds(
    lambda lo, extra, spc, margin, cooldown: ScaleRules(
        ScaleSettings(
            min_containers=lo,
            max_containers=max(1, lo + extra),
            scale_down_margin=margin,
            cooldown_s=cooldown,
        ),
        spc,
    ),
    st.integers(0, 4),
    st.integers(0, 8),
    st.integers(1, 8),
    st.integers(0, 12),
    st.sampled_from([0.0, 1.0, 10.0, 30.0]),
)
steps = st.lists(
    st.tuples(
        st.integers(0, 80),  # demand
        st.sampled_from([0.0, 0.5, 1.0, 5.0, 15.0, 40.0]),  # time since the last decision
        st.booleans(),  # whether the pool acted on the last decision
    ),
    min_size=1,
    max_size=40,
)


@given(scale=scale_rules, start=st.integers(0, 15), history=steps)
def test_target_in_bounds_and_no_reversal_within_cooldown(
    scale: ScaleRules, start: int, history: list[tuple[int, float, bool]]
) -> None:
    config, slots = scale.config, scale.slots_per_container
    now, current = 0.0, start
    changes: list[tuple[float, int]] = []  # (when, direction)
    for demand, step, acted in history:
        now += step
        decision = scale.decide(demand=demand, current=current, now=now)
        assert config.min_containers <= decision.target <= config.max_containers
        direction = (decision.target > current) - (decision.target < current)
        if direction and changes and decision.reason is not ScaleReason.BOUNDS:
            when, earlier = changes[-1]
            assert not (earlier == -direction and now < when + config.cooldown_s), (
                "reversed within the cooldown"
            )
        if decision.reason is ScaleReason.UP:
            needed = scale.needed(demand)
            assert decision.target == min(needed, config.max_containers)
            assert decision.target * slots >= demand or decision.target == config.max_containers, (
                "scaling up must cover the demand when max allows"
            )
        if decision.reason is ScaleReason.DOWN:
            spare = decision.target * slots - demand
            assert spare >= config.scale_down_margin or decision.target == config.min_containers
        if direction:
            changes.append((now, direction))
        if acted:
            current = decision.target


@given(scale=scale_rules, start=st.integers(0, 15), demand=st.integers(0, 80))
def test_steady_demand_settles(scale: ScaleRules, start: int, demand: int) -> None:
    config = scale.config
    now, current = 0.0, start
    targets = []
    for _ in range(6):
        decision = scale.decide(demand=demand, current=current, now=now)
        current = decision.target
        targets.append(current)
        now += config.cooldown_s + 1.0
    # At most two moves (into the bounds, then to demand), then the count stays put.
    assert len(set(targets[2:])) == 1, targets
    final = targets[-1]
    assert scale.decide(demand=demand, current=final, now=now).reason is ScaleReason.HOLD
    if scale.needed(demand) <= config.max_containers:
        assert final * scale.slots_per_container >= demand, "settled short of the demand"


@given(
    loads=st.lists(
        st.builds(
            ContainerLoad,
            name=st.text("abc", min_size=1, max_size=3),
            leased=st.integers(0, 4),
            added_at=st.sampled_from([0.0, 1.0, 2.0]),
        ),
        max_size=8,
        unique_by=lambda load: load.name,
    )
)
def test_drain_order_prefers_idle_then_new(loads: list[ContainerLoad]) -> None:
    order = drain_order(loads)
    assert sorted(order) == sorted(load.name for load in loads)
    by_name = {load.name: load for load in loads}
    for first, second in itertools.pairwise(order):
        a, b = by_name[first], by_name[second]
        assert (a.leased, -a.added_at) <= (b.leased, -b.added_at)
