"""A member whose lease its disk budget ended gets ``sandbox_budget_score``; when that is above
a score the env's hook gives (an env scoring in [-1, 1] with the default 0.0), filling the disk
pays better than a wrong answer, so the group's collection says so, once per score."""

from __future__ import annotations

import logging

import anyio.lowlevel
import attrs
import pytest

from trajcore.domain.agent_loop import LoopState, StopReason, TrajectoryStats
from trajcore.domain.groups import GroupRules, TrajectoryOutcome, TrajectoryStatus
from trajcore.rollout.group import collect_group, failed_member
from trajcore.rollout.trajectory import TrajectoryResult


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _member(trajectory_id: str, reason: StopReason, score: float) -> TrajectoryResult:
    status = (
        TrajectoryStatus.BUDGET_EXHAUSTED
        if reason is StopReason.SANDBOX_BUDGET
        else TrajectoryStatus.FINISHED
    )
    stats = TrajectoryStats(state=LoopState.FINISHED, stop_reason=reason, detail=None, turns=1)
    outcome = TrajectoryOutcome(status=status, score=score)
    return attrs.evolve(
        failed_member(trajectory_id, StopReason.INFRA_ERROR, "-"), stats=stats, outcome=outcome
    )


async def _group(scores: dict[int, tuple[StopReason, float]]) -> None:
    async def run_member(trajectory_id: str) -> TrajectoryResult:
        await anyio.lowlevel.checkpoint()
        reason, score = scores[int(trajectory_id.rsplit("/", 1)[1])]
        return _member(trajectory_id, reason, score)

    await collect_group(group_id="g", rules=GroupRules(group_size=2), run_member=run_member)


@pytest.mark.anyio
async def test_a_budget_score_above_a_hook_score_is_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="trajcore.rollout"):
        above = {0: (StopReason.SANDBOX_BUDGET, 0.25), 1: (StopReason.NATURAL, -1.0)}
        await _group(above)
        await _group(above)  # the same score again: said once
        await _group({0: (StopReason.SANDBOX_BUDGET, -1.5), 1: (StopReason.NATURAL, -1.0)})
        await _group({0: (StopReason.SANDBOX_BUDGET, -0.5), 1: (StopReason.NATURAL, -0.5)})
    warned = [r.getMessage() for r in caplog.records if "sandbox_budget_score" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "sandbox_budget_score=0.25, above the -1.0 the score hook gave" in warned[0]
