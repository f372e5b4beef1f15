"""hermes-agent envs as their authors wrote them: config subclasses that redeclare a seed name,
hermes's own defaults passed explicitly, and ``HermesToolContext`` misuse that must not score."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from pydantic import Field

from tests.unit.test_agent_env import QWEN, _config
from trajcore.compat import HermesAgentEnvConfig
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.seed_settings import SeedSettingWarning

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


with warnings.catch_warnings():
    warnings.simplefilter("ignore", SeedSettingWarning)

    class TerminalBenchConfig(HermesAgentEnvConfig):
        """hermes's TerminalBench2EvalConfig: seed names redeclared with defaults of its own."""

        dataset_name: str = Field(default="NousResearch/terminal-bench-2")
        max_agent_turns: int = Field(default=60)
        terminal_backend: str = "docker"


def _bench(**fields: Any) -> TerminalBenchConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SeedSettingWarning)
        return TerminalBenchConfig(tokenizer_name=QWEN, **fields)


def test_a_redeclared_seed_field_sets_the_trajcore_setting_it_names() -> None:
    config = _bench(max_agent_turns=7, dataset_name="mine/ds")
    assert config.max_turns == 7
    assert config.dataset == config.dataset_name == "mine/ds"
    config = _bench(max_turns=8, dataset="theirs/ds")
    assert (config.max_agent_turns, config.dataset_name) == (8, "theirs/ds")


def test_a_redeclared_seed_default_is_the_trajcore_settings_default() -> None:
    config = _bench()
    assert config.max_turns == 60
    assert config.dataset == "NousResearch/terminal-bench-2"
    assert config.sandbox == "container"  # hermes's docker backend, with its meaning
    assert config.terminal_backend == "docker"
    assert "dataset_name" not in TerminalBenchConfig.model_fields
    assert TerminalBenchConfig.model_fields["max_turns"].metadata  # trajcore's checks kept
    with pytest.raises(ConfigError, match="max_turns"):
        _bench(max_agent_turns=0)


def test_a_redeclared_seed_field_warns_once_when_the_class_is_defined() -> None:
    with pytest.warns(SeedSettingWarning, match=r"max_agent_turns .* max_turns .*Own"):

        class Own(HermesAgentEnvConfig):
            max_agent_turns: int = 12

    assert Own(tokenizer_name=QWEN).max_turns == 12


def test_a_redeclared_seed_field_that_cannot_map_exactly_is_refused_naming_both() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SeedSettingWarning)
        with pytest.raises(ConfigError, match="max_agent_turns") as info:

            class Both(HermesAgentEnvConfig):
                max_agent_turns: int = 12
                max_turns: int = 13

        assert "max_turns" in str(info.value)
        with pytest.raises(ConfigError, match=r"Constrained\.max_agent_turns"):

            class Constrained(HermesAgentEnvConfig):
                max_agent_turns: int = Field(default=5, le=10)

        with pytest.raises(ConfigError, match=r"needs a default.*Required\.dataset_name"):

            class Required(HermesAgentEnvConfig):
                dataset_name: str


def test_hermes_disabled_toolsets_none_means_nothing_disabled() -> None:
    # hermes's default, which its envs pass explicitly
    assert _config(disabled_toolsets=None).disabled_toolsets == []
    assert _config(disabled_toolsets="None").disabled_toolsets == []
