"""Forks on the in-memory fake pool: a group prepared once forks every member on the
snapshot's container (leases from a snapshot prefer that container's slots, waiting a bounded
time for one there, and a lease that falls back is counted); ``SlotTools.fork`` opens n
leases from a running lease's files, each its own copy, and refuses with a reason."""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import pytest

from tests.unit.test_agent_env import _config
from tests.unit.test_agent_env_environments import IMAGE, RELEASE, PreparedEnv, _reads_os_release
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.environment_leases import ForkRefused
from trajcore.domain.errors import InvalidInput
from trajcore.domain.slots import Lease
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter
from trajcore.testing.pool_checks import wait_for_statistics

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pool(*, containers: int = 2, slots: int = 4, fork_wait_s: float = 2.0) -> FakeSandboxPool:
    return FakeSandboxPool(
        containers=containers,
        slots_per_container=slots,
        images={IMAGE: {"/etc/os-release": RELEASE}},
        fork_wait_s=fork_wait_s,
    )


async def test_a_group_of_four_prepared_once_forks_every_member_on_two_servers() -> None:
    PreparedEnv.preparations = 0
    env = PreparedEnv(_config(group_size=4, ensure_scores_are_not_same=False, prepare_once=True))
    async with _pool() as pool:
        result = await env.run_task(
            IMAGE, pool=pool, policy=env.make_policy(chat=_reads_os_release())
        )
        stats = pool.environment_statistics()
    assert result.verdict.member_scores == (1.0, 1.0, 1.0, 1.0)
    assert PreparedEnv.preparations == 1
    (prepare,) = [r for r in pool.environment_leases if r.holder.endswith("/prepare")]
    members = [r for r in pool.environment_leases if r is not prepare]
    assert prepare.slot is not None
    assert [r.forked for r in members] == [True] * 4
    assert {r.slot.container for r in members if r.slot} == {prepare.slot.container}
    assert (stats.snapshots, stats.forks, stats.fallbacks) == (1, 4, 0)


async def test_a_fork_waits_for_a_slot_of_its_server_then_falls_back_and_is_counted() -> None:
    async with _pool(slots=2, fork_wait_s=0.05) as pool:
        async with pool.lease("prepare", environment=IMAGE) as prepare:
            snapshot = await pool.snapshot(prepare, IMAGE)
        where = snapshot.container
        async with AsyncExitStack() as stack:
            leases = [await stack.enter_async_context(pool.lease_from(h, snapshot)) for h in "ab"]
            assert [(lease.slot.container, forked) for lease, forked in leases] == [
                (where, True),
                (where, True),
            ]  # the other server's slots were free longer
            async with pool.lease_from("late", snapshot) as (late, late_forked):
                assert (late.slot.container != where, late_forked) == (True, False)
            got: list[tuple[Lease, bool]] = []

            async def patient() -> None:
                async with pool.lease_from("patient", snapshot, fork_wait_s=30.0) as leased:
                    got.append(leased)

            async with anyio.create_task_group() as group:
                group.start_soon(patient)
                stats = await wait_for_statistics(pool, lambda s: s.waiting == 1)
                assert stats.free == 2  # it waits although others are free
                await stack.aclose()  # a and b come back: one of where's slots is its
            ((lease, forked),) = got
            assert (lease.slot.container, forked) == (where, True)
        # a preference cut short by the lease's deadline still takes a free slot elsewhere
        async with AsyncExitStack() as stack:
            for holder in "ab":
                await stack.enter_async_context(pool.lease_from(holder, snapshot))
            quick = pool.lease_from("quick", snapshot, timeout_s=0.05, fork_wait_s=30.0)
            async with quick as (lease, forked):
                assert (lease.slot.container != where, forked) == (True, False)
        counted = pool.environment_statistics()
        assert (counted.forks, counted.fallbacks) == (5, 2)
        pool.check_valid()


def _tools(
    pool: FakeSandboxPool, dispatcher: ToolDispatcher, lease: Lease, environment: str | None
) -> SlotTools:
    router = ToolRouter(
        lease=lease, dispatcher=dispatcher, tool_server=None, offered=frozenset(),
        tool_timeout_s=5.0, trajectory_id="t",
    )  # fmt: skip
    return SlotTools(router, pool=pool, environment=environment)


async def test_slot_tools_fork_opens_n_copies_of_the_leases_files_and_drops_the_snapshot() -> None:
    async with (
        _pool(containers=2, slots=4) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", environment=IMAGE) as lease,
    ):
        tools = _tools(pool, dispatcher, lease, IMAGE)
        await tools.write_file("state.txt", "turn 3")
        async with tools.fork(3) as forks:
            assert len({fork.lease.slot for fork in forks} | {lease.slot}) == 4
            assert {fork.lease.slot.container for fork in forks} == {lease.slot.container}
            for number, fork in enumerate(forks):
                assert await fork.read_file("state.txt") == "turn 3"
                assert (await fork.run("cat /etc/os-release")).stdout == RELEASE
                await fork.write_file("state.txt", f"branch {number}")
            assert [await fork.read_file("state.txt") for fork in forks] == [
                "branch 0",
                "branch 1",
                "branch 2",
            ]
            assert await tools.read_file("state.txt") == "turn 3"  # the lease goes on
            assert pool.statistics().leased == 4
        assert pool.statistics().leased == 1
        assert pool._snapshots == {}
        stats = pool.environment_statistics()
        assert (stats.snapshots, stats.forks, stats.fallbacks) == (1, 3, 0)


async def test_a_forks_forgotten_await_is_the_parents_to_answer_for() -> None:
    async with (
        _pool(containers=1, slots=3) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", environment=IMAGE) as lease,
    ):
        tools = _tools(pool, dispatcher, lease, IMAGE)
        async with tools.fork(1) as (child,):
            never = child.check("false")  # a coroutine: true in an `if`
            assert never  # type: ignore[truthy-bool]
        assert [c.split(" at ")[0] for c in tools.call_log.unawaited()] == ["tools.check()"]


async def test_slot_tools_fork_refuses_naming_the_reason() -> None:
    async with (
        _pool(containers=2, slots=2, fork_wait_s=0.05) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
    ):
        async with pool.lease("plain") as plain:
            with pytest.raises(ForkRefused, match="no_environment") as refused:
                async with _tools(pool, dispatcher, plain, None).fork(1):
                    pass
            assert refused.value.reason == "no_environment"
        async with pool.lease("t", environment=IMAGE) as lease:
            tools = _tools(pool, dispatcher, lease, IMAGE)
            with pytest.raises(InvalidInput, match="n"):
                async with tools.fork(0):
                    pass
            # one slot is left on the lease's server: two forks are one too many
            with pytest.raises(ForkRefused) as refused:
                async with tools.fork(2, timeout_s=0.05):
                    pass
            assert refused.value.reason == "no_slots"
            assert lease.slot.container in str(refused.value)
            assert pool._snapshots == {}
            stats = pool.statistics()
            assert (stats.leased, stats.waiting) == (1, 0)
            unpooled = SlotTools(tools.router, pool=None, environment=IMAGE)
            with pytest.raises(ForkRefused) as refused:
                async with unpooled.fork(1):
                    pass
            assert refused.value.reason == "no_snapshots"
