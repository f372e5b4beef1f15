"""The setting that scores a member whose lease its disk budget ended (``sandbox_budget_score``):
on ``RolloutConfig`` and as the Atropos env's ``--env.sandbox_budget_score``."""

from __future__ import annotations

import math

import pytest

from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.errors import ConfigError
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.rollout.trajectory import RolloutConfig


@pytest.mark.parametrize("bad", [-math.inf, math.inf, math.nan, True, "0"])
def test_the_rollout_setting_refuses_what_is_not_a_finite_score(bad: object) -> None:
    with pytest.raises(ConfigError, match="finite number") as caught:
        RolloutConfig(agent=AgentLoopConfig(max_turns=1), sandbox_budget_score=bad)  # type: ignore[arg-type]
    assert caught.value.field == "sandbox_budget_score"


def test_the_rollout_setting_defaults_to_zero_and_takes_none() -> None:
    agent = AgentLoopConfig(max_turns=1)
    assert RolloutConfig(agent=agent).sandbox_budget_score == 0.0
    assert RolloutConfig(agent=agent, sandbox_budget_score=None).sandbox_budget_score is None


@pytest.mark.parametrize("bad", ["-inf", "nan", -math.inf, math.nan, "zero"])
def test_the_env_setting_refuses_what_is_not_a_finite_score(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        AgentEnvConfig(sandbox_budget_score=bad)
    assert caught.value.field == "sandbox_budget_score"


@pytest.mark.parametrize(("given", "score"), [("-0.5", -0.5), (None, None), (2, 2.0)])
def test_the_env_setting_reaches_the_rollout(given: object, score: float | None) -> None:
    assert AgentEnvConfig().settings().rollout.sandbox_budget_score == 0.0
    settings = AgentEnvConfig(sandbox_budget_score=given).settings()
    assert settings.rollout.sandbox_budget_score == score
