"""Collect a group: ``group_size`` trajectories of one item, concurrently, then judge the group.

The members run in one anyio task group. A hook's exception never gets here: the trajectory
runner makes it an ``env_error`` member (or ``infra_error`` for an infrastructure error). A member
that still fails in an unexpected way (an adapter raising something that is not a trajcore
error) does not take its siblings down: it becomes an ``infra_error`` member with the exception
in its detail, and is logged with its traceback. Cancellation of the group (the env shutting
down) cancels every member; each releases its slot on the way out.

The domain ``GroupRules`` then decides: complete, partial (keep the healthy members when enough
remain) or dropped; infrastructure failures are never scored as zero.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
import attrs

from trajcore.domain.agent_loop import StopReason, TrajectoryStats
from trajcore.domain.groups import GroupRules, GroupVerdict
from trajcore.domain.sampling import SamplingParams
from trajcore.rollout.trajectory import TrajectoryResult

__all__ = ["GroupResult", "collect_group", "failed_member"]

log = logging.getLogger("trajcore.rollout")


@attrs.frozen(kw_only=True)
class GroupResult:
    """A group's members and the verdict on them.

    Attributes:
        group_id: The group's id (members are ``<group_id>/<index>``).
        members: One result per member, in index order.
        verdict: The group rules' judgement (kept members, scores, drop reason).
        duration_s: Wall time of the whole group.
        environment: The task environment (image reference) every member's lease named, or
            ``None``.
        sampling: The sampling the members ran with (an item's own, from ``item_rollout``),
            or ``None`` when the caller did not say.
    """

    group_id: str
    members: tuple[TrajectoryResult, ...]
    verdict: GroupVerdict
    duration_s: float
    environment: str | None = None
    sampling: SamplingParams | None = None

    @property
    def kept(self) -> tuple[TrajectoryResult, ...]:
        """The members the verdict keeps, in index order."""
        return tuple(self.members[i] for i in self.verdict.kept)


def _crashed(trajectory_id: str, exc: BaseException) -> TrajectoryResult:
    return failed_member(trajectory_id, StopReason.INFRA_ERROR, f"{type(exc).__name__}: {exc}")


def failed_member(trajectory_id: str, reason: StopReason, detail: str) -> TrajectoryResult:
    """The result of a member that failed before it started (``reason``: ``INFRA_ERROR`` or
    ``ENV_ERROR``, with its one-line ``detail``): no messages, no slot, never scored."""
    stats = TrajectoryStats.failed_unstarted(reason, detail)
    return TrajectoryResult(
        trajectory_id=trajectory_id,
        messages=(),
        stats=stats,
        outcome=stats.outcome(),
        tokens=None,
        drift=None,
        exchanges=(),
        duration_s=0.0,
        slot=None,
    )


_warned_budget_scores: set[float] = set()


def _warn_budget_score_above(members: Sequence[TrajectoryResult]) -> None:
    """Warn (once per score) when a member whose lease its disk budget ended got a score
    above one the score hook gave a sibling: the policy may then learn to fill its disk rather
    than answer (an env that scores in [-1, 1] with ``sandbox_budget_score`` 0.0)."""
    budget = {
        m.outcome.score
        for m in members
        if m.stats.stop_reason is StopReason.SANDBOX_BUDGET and m.outcome.score is not None
    }
    lowest = min(
        (
            m.outcome.score
            for m in members
            if m.stats.stop_reason is not StopReason.SANDBOX_BUDGET and m.outcome.score is not None
        ),
        default=None,
    )
    for score in sorted(budget - _warned_budget_scores):
        if lowest is not None and lowest < score:
            _warned_budget_scores.add(score)
            log.warning(
                "a member whose lease its disk budget ended scored sandbox_budget_score=%r, "
                "above the %r the score hook gave a sibling: filling the disk pays better than "
                "that answer; set sandbox_budget_score to the lowest score the hook gives",
                score,
                lowest,
            )


async def collect_group(
    *,
    group_id: str,
    rules: GroupRules,
    run_member: Callable[[str], Awaitable[TrajectoryResult]],
    environment: str | None = None,
    sampling: SamplingParams | None = None,
) -> GroupResult:
    """Run ``rules.group_size`` members concurrently and judge the group.

    ``run_member`` is called with each member's trajectory id and must return its result (it is
    typically ``run_trajectory`` with the item's messages, hooks, environment and shared
    services bound). ``environment`` is the task environment the members' leases name, kept in
    the result for its logs; ``sampling``, the sampling they run with, kept for the trainer.
    """
    started = anyio.current_time()
    size = rules.group_size
    members: list[TrajectoryResult | None] = [None] * size

    async def member(index: int) -> None:
        trajectory_id = f"{group_id}/{index}"
        try:
            members[index] = await run_member(trajectory_id)
        except Exception as exc:
            log.exception(
                "trajectory %s crashed; counted as an infrastructure failure", trajectory_id
            )
            members[index] = _crashed(trajectory_id, exc)

    async with anyio.create_task_group() as group:
        for index in range(size):
            group.start_soon(member, index)
    done = tuple(m for m in members if m is not None)
    _warn_budget_score_above(done)
    verdict = rules.assess([m.outcome for m in done])
    return GroupResult(
        group_id=group_id,
        members=done,
        verdict=verdict,
        duration_s=anyio.current_time() - started,
        environment=environment,
        sampling=sampling,
    )
