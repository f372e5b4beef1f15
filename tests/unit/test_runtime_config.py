"""The slot runtime's config refuses values it cannot work with, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.domain.errors import ConfigError


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("slots", 0, "must be an integer >= 1, got 0"),
        ("slots", True, "got True"),
        ("start_timeout_s", 0.0, "must be finite seconds > 0"),
        ("reset_timeout_s", float("nan"), "got nan"),
        ("agent_grace_s", -1.0, "must be finite seconds >= 0"),
        ("dedup_per_slot", 0, "must be an integer >= 1"),
        ("use_cgroups", 1, "must be true or false"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(
    tmp_path: Path, field: str, value: object, says: str
) -> None:
    settings: dict[str, Any] = {"slots": 1, "root": tmp_path, field: value}
    with pytest.raises(ConfigError, match=says) as raised:
        RuntimeConfig(**settings)
    assert raised.value.field == field


def test_the_defaults_are_accepted(tmp_path: Path) -> None:
    config = RuntimeConfig(slots=2, root=tmp_path, agent_grace_s=0.0)
    assert (config.slots, config.dedup_per_slot, config.use_cgroups) == (2, 4096, True)
