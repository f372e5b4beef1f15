"""With no score reserve (``score_reserve_s=0``) a member whose turns ran out of time ran them
to the trajectory's deadline, and its score hook had no time: that is the env's setting, so
the member fails as ``env_error`` naming ``score_reserve_s``, never as ``infra_error`` (which
the run counts as an outage of the sandbox). A score hook that had time and did not finish in
it keeps the status of where it waited (``rollout.hook_deadline``)."""

from __future__ import annotations

import attrs
import pytest

from tests.unit.test_trajectory_score_reserve import CONFIG, Scoring, _run, stalling
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.groups import TrajectoryStatus
from trajcore.rollout.hook_deadline import unscored
from trajcore.rollout.trajectory import RolloutConfig

pytestmark = pytest.mark.anyio

NO_RESERVE = attrs.evolve(CONFIG, score_reserve_s=0.0)
NO_TIME = (
    f"the score hook had no time: the turns ran to the trajectory's deadline "
    f"(deadline_s={CONFIG.deadline_s:g} s) and score_reserve_s is 0, which keeps none of it "
    f"for scoring (set score_reserve_s above 0 to score members that run out of time)"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_member_out_of_time_with_no_reserve_is_the_envs_setting_not_an_outage() -> None:
    """Before, the member was ``infra_error``: "scoring did not finish before the trajectory
    deadline", as if the sandbox had failed."""
    scoring = Scoring()
    result = await _run(stalling, scoring, NO_RESERVE)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.ENV_ERROR, None)
    assert result.outcome.detail == NO_TIME


async def test_a_slow_hook_with_no_reserve_that_had_time_keeps_where_it_waited() -> None:
    """The loop's own time budget ended the turns early (at the sleep's timeout): the hook had
    the rest of the deadline, and did not finish in it, waiting in its own sleep."""
    agent = AgentLoopConfig(max_turns=50, time_budget_s=0.3)
    config = attrs.evolve(NO_RESERVE, agent=agent, tool_timeout_s=0.3)
    scoring = Scoring(takes_s=30.0)
    result = await _run(stalling, scoring, config)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert len(scoring.started) == 1
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert (result.outcome.detail or "").startswith(
        "score hook did not finish before the trajectory deadline: it was waiting in the "
        "env's own code"
    )


CUT_READ = (
    "score hook did not finish ...: it was waiting on read_file",
    TrajectoryStatus.INFRA_ERROR,
)


def test_a_hook_ended_at_its_first_wait_with_no_reserve_had_no_time_either() -> None:
    """The turns' deadline and the trajectory's are one moment: a hook started between them is
    ended at its first call, which had no time to answer; still the env's setting."""
    assert unscored(NO_RESERVE, StopReason.TIME_BUDGET, CUT_READ) == (
        NO_TIME,
        TrajectoryStatus.ENV_ERROR,
    )


@pytest.mark.parametrize(
    ("config", "stop"),
    [
        (CONFIG, StopReason.TIME_BUDGET),  # a reserve: the hook had it
        (NO_RESERVE, None),  # the turns ended before their deadline
        (NO_RESERVE, StopReason.NATURAL),
    ],
)
def test_a_hook_that_had_time_keeps_its_own_status(
    config: RolloutConfig, stop: StopReason | None
) -> None:
    assert unscored(config, stop, CUT_READ) == CUT_READ
    never_started = unscored(config, stop, None)
    assert never_started == (
        "scoring did not finish before the trajectory deadline",
        TrajectoryStatus.INFRA_ERROR,
    )
