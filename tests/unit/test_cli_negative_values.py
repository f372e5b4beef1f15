"""A negative value on an env's command line reaches Atropos as typed (``startup.cli_command``).

Atropos merges the ``--env.*`` and ``--openai.*`` flags it reads from ``sys.argv`` with its own
reader, which took ``--env.max_turns -3`` for a flag without a value: ``True``, so 1.
"""

from __future__ import annotations

import sys

import pytest
from atroposlib.utils.cli import get_double_dash_flags  # type: ignore[import-untyped]

from tests.unit.test_agent_env import FileEnv
from trajcore.entrypoints.atropos.startup import inline_negative_values
from trajcore.entrypoints.seed_settings import SeedSettingWarning


def test_atropos_reads_a_negative_value_as_the_value_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["env.py", "process", "--env.max_turns", "-3", "--openai.timeout", "-1.5"]
    monkeypatch.setattr(sys, "argv", argv)
    FileEnv.get_cli_process_config_cls()
    flags = get_double_dash_flags()
    assert flags["env.max_turns"] == "-3"  # then refused, naming max_turns
    assert flags["openai.timeout"] == "-1.5"


def test_a_seed_flag_keeps_its_negative_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["env.py", "process", "--env.agent_max_steps", "-3"])
    with pytest.warns(SeedSettingWarning, match="agent_max_steps"):
        FileEnv.get_cli_process_config_cls()
    assert get_double_dash_flags()["env.max_turns"] == "-3"


def test_only_negative_numbers_are_joined_to_their_flag() -> None:
    argv = [
        "process",
        "--env.use_wandb", "--env.group_size", "2",
        "--env.agent_temperature", "-.5",
        "--env.score_reserve_s=-1",
        "--", "-4",
        "--env.name", "-x",
    ]  # fmt: skip
    assert inline_negative_values(argv) == [
        "process",
        "--env.use_wandb", "--env.group_size", "2",
        "--env.agent_temperature=-.5",
        "--env.score_reserve_s=-1",
        "--", "-4",
        "--env.name", "-x",
    ]  # fmt: skip
