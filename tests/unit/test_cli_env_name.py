"""An env's command line names it after the class when its config names nothing
(``startup.cli_command``): ``serve`` registers with run-api under that name.

Atropos sets the class's name as ``wandb_name`` only on a flag it then drops while merging, so
``serve`` sent run-api ``desired_name: null`` and was refused with HTTP 422.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.unit.test_agent_env import FileEnv
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.startup import cli_command


def _name_seen(env_cls: type[FileEnv]) -> Any:
    """The ``wandb_name`` of the defaults Atropos's command class is built from."""
    names: list[str | None] = []

    def build() -> type:
        names.append(env_cls.config_init()[0].wandb_name)
        return object

    cli_command(env_cls, build)
    return names[0]


def test_the_cli_defaults_name_the_env_after_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["env.py", "serve"])
    assert FileEnv.config_init()[0].wandb_name is None
    assert _name_seen(FileEnv) == FileEnv.name


def test_a_name_the_config_sets_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["env.py", "serve"])

    class Named(FileEnv):
        @classmethod
        def config_init(cls) -> tuple[AgentEnvConfig, object]:
            config, servers = super().config_init()
            config.wandb_name = "mine"
            return config, servers

    assert _name_seen(Named) == "mine"
