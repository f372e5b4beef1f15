"""How the env's own failures are told apart, and what stops a run whose every group fails.

- An ``InfrastructureError`` raised inside a hook's task group (its checks run concurrently)
  is the infrastructure's, as when raised alone; a group holding any other exception is the
  env's, its detail naming that exception and its frame, not the task group's.
- ``build_task`` and ``item_limits`` raising fail the group's members as ``env_error`` naming
  the hook and the frame, as ``task_environment`` does; the group is counted like any other.
- ``max_failed_groups`` failed groups in a row end a training run (``GroupsFailing``) naming
  the last group's failures; a healthy group starts the count again; ``None``: no bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from tests.unit.test_agent_env import FileEnv, _alternating_chat, _config, _turn
from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.groups import GroupStatus, TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.entrypoints.atropos.failing_groups import GroupsFailing
from trajcore.entrypoints.item_limits import ItemLimits
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import RolloutConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _says_done() -> FakeChatServer:
    return FakeChatServer(policy=lambda _: _turn(Message.assistant("done")))


class ConcurrentChecks(FileEnv):
    """The score hook runs two checks at once in a task group; the second may raise."""

    raise_too: BaseException | None = None

    async def prepare_workspace(self, item: str, tools: SlotTools) -> None:
        return None  # the slot's first batch is the score hook's

    async def verify_and_score(
        self, item: str, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        async def fails() -> None:
            assert self.raise_too is not None
            raise self.raise_too

        async with anyio.create_task_group() as group:
            group.start_soon(tools.check, "true")
            group.start_soon(tools.check, "echo too")
            if self.raise_too is not None:
                group.start_soon(fails)
        return 1.0


async def test_a_slot_failure_inside_a_hooks_task_group_is_the_infrastructures() -> None:
    env = ConcurrentChecks(_config(group_size=2, min_healthy=1))
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        for name in pool.container_names():
            pool.crash_container(name)  # the score hook's checks meet a crashed container
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_says_done()))
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.INFRA_ERROR, member.outcome.detail
        assert member.outcome.score is None
        assert "TaskGroup" not in str(member.outcome.detail)


async def test_the_envs_own_error_inside_a_task_group_is_named_with_its_frame() -> None:
    env = ConcurrentChecks(_config(group_size=2, min_healthy=1))
    env.raise_too = KeyError("expected")
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_says_done()))
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR
        detail = str(member.outcome.detail)
        assert detail.startswith("score hook raised KeyError: 'expected' (at test_agent_env_")
        assert "in fails)" in detail


class BrokenHooks(FileEnv):
    broken: str = ""

    def build_task(self, item: str) -> str:
        if self.broken == "build_task":
            row: dict[str, str] = {"prompt": item}
            return row["text"]
        return super().build_task(item)

    def item_limits(self, item: str) -> ItemLimits | None:
        if self.broken == "item_limits":
            raise ValueError("no limits for this row")
        return None


class BrokenRollout(BrokenHooks):
    def item_rollout(self, item: str) -> RolloutConfig:
        if self.broken == "item_rollout":
            raise LookupError("no rollout for this row")
        return super().item_rollout(item)


@pytest.mark.parametrize(
    ("hook", "detail"),
    [
        ("build_task", "build_task raised KeyError: 'text' (at test_agent_env_failures.py:"),
        ("item_limits", "item_limits raised ValueError: no limits for this row (at "),
        ("item_rollout", "item_rollout raised LookupError: no rollout for this row (at "),
    ],
)
async def test_a_per_item_hook_that_raises_fails_the_members_as_the_envs(
    hook: str, detail: str
) -> None:
    env = (BrokenRollout if hook == "item_rollout" else BrokenHooks)(_config(group_size=2))
    env.broken = hook
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_says_done()))
        assert pool.statistics().leases_granted == 0  # no slot was leased for it
    assert result.verdict.status is GroupStatus.FAILED
    for member in result.members:
        assert member.outcome.status is TrajectoryStatus.ENV_ERROR
        assert str(member.outcome.detail).startswith(detail), member.outcome.detail
    assert env.tool_error_metrics()["trajcore/trajectories/env_error"] == 2


async def _collect(env: FileEnv, pool: FakeSandboxPool, chat: FakeChatServer) -> Any:
    async with env.rollout_services(pool=pool, policy=env.make_policy(chat=chat)):
        return await env.collect_trajectories("ok")


async def test_failed_groups_in_a_row_stop_the_run_naming_the_last_ones_failures() -> None:
    env = BrokenHooks(_config(group_size=2, max_failed_groups=3))
    env.broken = "build_task"
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        for _ in range(2):
            assert await _collect(env, pool, _says_done()) == (None, [])
        env.broken = ""  # a healthy group starts the count again
        scored, _ = await _collect(env, pool, _alternating_chat())
        assert scored is not None
        env.broken = "build_task"
        for _ in range(2):
            assert await _collect(env, pool, _says_done()) == (None, [])
        with pytest.raises(GroupsFailing) as caught:
            await _collect(env, pool, _says_done())
    message = str(caught.value)
    assert message.startswith("3 groups in a row failed (max_failed_groups=3); the last, ")
    assert "members 0, 1 env_error: build_task raised KeyError: 'text'" in message


async def test_without_a_bound_failed_groups_never_stop_the_run() -> None:
    env = BrokenHooks(_config(group_size=2, max_failed_groups=None))
    env.broken = "build_task"
    async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
        for _ in range(8):
            assert await _collect(env, pool, _says_done()) == (None, [])
