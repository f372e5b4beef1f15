"""The decisions of ``SlotServerSettings``, which mutation testing cannot see (attrs fields only):
what a pool's slot servers are told and must show when nothing is set, and which settings are
refused, naming the field."""

from __future__ import annotations

import math

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings


def test_by_default_four_slots_default_isolation_no_tmux_and_the_timeouts() -> None:
    """Four slots a server, the env's default isolation, tmux not required, 30 s to start and
    to reset, and a 600 s lease deadline."""
    assert SlotServerSettings() == SlotServerSettings(
        slots_per_container=4,
        isolation=SlotIsolation(),
        require_tmux=False,
        start_timeout_s=30.0,
        reset_timeout_s=30.0,
        acquire_timeout_s=600.0,
    )


def test_a_lease_deadline_may_be_none() -> None:
    assert SlotServerSettings(acquire_timeout_s=None).acquire_timeout_s is None


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"slots_per_container": 0}, "must be an integer >= 1, got 0"),
        ({"slots_per_container": True}, "must be an integer >= 1, got True"),
        ({"isolation": "strict"}, "expected a SlotIsolation, got 'strict'"),
        ({"require_tmux": 1}, "must be true or false, got 1"),
        ({"start_timeout_s": 0}, "must be finite seconds > 0, got 0"),
        ({"reset_timeout_s": math.inf}, "must be finite seconds > 0, got inf"),
        ({"acquire_timeout_s": -1}, "must be None or finite seconds > 0, got -1"),
    ],
)
def test_a_setting_out_of_its_range_is_refused_naming_the_field(
    setting: dict[str, object], reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        SlotServerSettings(**setting)  # type: ignore[arg-type]
    [field] = setting
    assert (caught.value.field, caught.value.reason) == (field, reason)
