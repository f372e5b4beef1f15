"""The ``SandboxPool`` contract as an abstract pytest suite (fsspec's abstract-test shape).

Subclass ``SandboxPoolContract`` and provide two fixtures:

- ``sandbox_pool_factory``: a function of a ``PoolShape`` (containers, slots per container, the
  default acquire timeout) returning an async context manager that yields a started pool and
  closes it on exit;
- ``crash_container`` (optional, set ``supports_crash = True``): a function of the pool and a
  container name that makes that container die before or during its next batch.

The suite then checks what ``trajcore.ports.sandbox_pool`` promises:

- a lease holds one slot; leaving the block, by any route (normally, an error, cancellation while
  holding), releases it exactly once and ``statistics()`` shows every slot free afterwards;
- waiters are served first come, first served; a deadline gives ``AcquireTimeout``; a waiter
  cancelled while queued leaves the queue and takes nothing;
- ``execute`` returns one result per call in the order of the calls; one slot's calls run in
  order; a repeated call id returns the first result without running again; a stale lease is
  ``REJECTED``; a lease's end ends the call running in its slot at once and refuses those
  queued behind it (``pool_checks.check_a_release_ends_the_running_call``); failures (unknown
  tool, bad arguments, the paths ``workspace_paths`` lists, non-zero exits, timeouts) are
  results, never exceptions; a workspace is wiped between leases;
- ``aclose`` is idempotent; afterwards ``execute`` and ``lease`` raise ``PoolClosed``, and a
  waiter queued when the pool closes gets ``PoolClosed``;
- (with ``supports_crash``) a dead container gives every call of its batch an ``INFRA_ERROR``,
  and every later call under one of its leases too (naming it), its slots leave service, and
  later leases still work;
- a lease naming a task environment the pool cannot run (one no host has, or any for a pool
  that runs none) raises ``EnvironmentUnavailable`` on entry naming it, and its slot is free
  and clean afterwards; a malformed reference is refused before any slot is leased.

``TaskEnvironmentContract`` is the suite of a pool that runs task environments: given an
``EnvironmentCase`` (a factory of pools that run one image, a file of the image and its text),
it checks that a lease naming the image runs over it (and one naming none does not), that the
next lease over it starts clean, that the members of a group each run over it concurrently,
and that a refused image fails only its own lease; ``environment_statistics()`` counts each.
With ``supports_snapshots`` it also checks a group's preparation done once: a prepared lease
frozen with ``snapshot`` starts the leases of its server (``lease_from``) with what it wrote,
and once dropped, leases start from the plain image again.

Besides these scenarios, ``test_generated_sequences`` drives the pool with hypothesis-generated
sequences of leases, releases (normal, by an error, by cancellation), queued and cancelled
waiters, lease deadlines, batches across slots and containers, repeated call ids, call timeouts,
cancelled batches and (with ``supports_crash``) container deaths, checking the contract after
every step (``trajcore.testing.sandbox_pool_machine`` says what exactly). It opens one pool of
``machine_shape`` for the whole test; ``machine_scale`` sets how many sequences it runs as a
fraction of the loaded hypothesis profile's ``max_examples``.

Pools under test must allow call timeouts down to 0.2 s (the timeout test uses 0.5 s).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

import anyio
import attrs
import pytest

from trajcore.domain.environment_leases import EnvironmentUnavailable
from trajcore.domain.errors import AcquireTimeout, PoolClosed
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.ports.sandbox_pool import EnvironmentPool, SandboxPool
from trajcore.testing.async_contract import AsyncioContract
from trajcore.testing.pool_checks import (
    all_free,
    check_a_release_ends_the_running_call,
    check_a_turns_time_bounds_its_calls_in_a_slot,
    settled,
    wait_for_statistics,
    waiting,
)
from trajcore.testing.portal_pools import slot_call
from trajcore.testing.sandbox_pool_machine import MachineShape, run_pool_machine
from trajcore.testing.workspace_paths import PATH_CHECKS, CheckPaths

__all__ = [
    "CrashContainer",
    "EnvironmentCase",
    "PoolShape",
    "SandboxPoolContract",
    "SandboxPoolFactory",
    "TaskEnvironmentContract",
]

NO_SUCH_IMAGE = "oci:/nonexistent/trajcore-contract/no-such-image"
"""An image reference no host has (its path does not exist)."""


@attrs.frozen(kw_only=True)
class PoolShape:
    """What a test needs from a pool: its size and its default lease deadline."""

    containers: int = 1
    slots_per_container: int = 2
    acquire_timeout_s: float | None = 30.0


SandboxPoolFactory = Callable[[PoolShape], AbstractAsyncContextManager[SandboxPool]]
CrashContainer = Callable[[SandboxPool, str], None]


async def _one(pool: SandboxPool, call: SlotCall) -> ToolResult:
    (result,) = await pool.execute(call.container, [call])
    return result


@contextlib.asynccontextmanager
async def _one_slot_leased(
    factory: SandboxPoolFactory,
) -> AsyncIterator[tuple[SandboxPool, Lease]]:
    """A pool of one slot, that slot leased (to ``"t"``) for the block."""
    async with factory(PoolShape(slots_per_container=1)) as pool, pool.lease("t") as lease:
        yield pool, lease


async def _a_new_lease_runs(pool: SandboxPool) -> None:
    async with pool.lease("after") as after:
        ok = await _one(pool, slot_call(after, "bash", command="echo ok"))
    assert ok.content == "ok\n"


class SandboxPoolContract(AsyncioContract):
    """Abstract suite: subclass and override ``sandbox_pool_factory`` (and ``crash_container``)."""

    supports_crash: ClassVar[bool] = False
    machine_shape: ClassVar[MachineShape] = MachineShape(containers=2, slots_per_container=2)
    machine_scale: ClassVar[float] = 0.2

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        raise NotImplementedError

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        raise NotImplementedError

    # ------------------------------------------------------------------------- leasing

    async def test_a_lease_holds_one_slot_and_leaving_frees_it(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=2)) as pool:
            before = pool.statistics()
            assert before.total == 2
            assert before.free == 2
            async with pool.lease("t1") as lease:
                assert lease.holder == "t1"
                assert lease.epoch >= 1
                held = pool.statistics()
                assert (held.leased, held.free) == (1, 1)
            stats = await wait_for_statistics(pool, settled(2))
            assert stats.leases_granted >= 1

    async def test_concurrent_leases_get_distinct_slots(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        leases: list[Lease] = []
        async with sandbox_pool_factory(PoolShape(containers=2, slots_per_container=2)) as pool:
            all_in = anyio.Event()

            async def hold(i: int) -> None:
                async with pool.lease(f"t{i}") as lease:
                    leases.append(lease)
                    if len(leases) == 4:
                        all_in.set()
                    await all_in.wait()

            async with anyio.create_task_group() as group:
                for i in range(4):
                    group.start_soon(hold, i)
            assert len({lease.slot for lease in leases}) == 4
            assert len({lease.slot.container for lease in leases}) == 2
            await wait_for_statistics(pool, settled(4))

    async def test_waiters_are_served_first_come_first_served(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        order: list[int] = []
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            async with anyio.create_task_group() as group, pool.lease("first"):

                async def wait_turn(i: int) -> None:
                    async with pool.lease(f"w{i}"):
                        order.append(i)

                for i in range(5):
                    group.start_soon(wait_turn, i)
                    await wait_for_statistics(pool, waiting(i + 1))
            assert order == [0, 1, 2, 3, 4]
            await wait_for_statistics(pool, all_free)

    @pytest.mark.parametrize("the_pools", [False, True], ids=["given", "the_pools_default"])
    async def test_a_lease_deadline_gives_acquire_timeout(
        self, sandbox_pool_factory: SandboxPoolFactory, the_pools: bool
    ) -> None:
        # The deadline given to the lease, or (none given) the pool's default acquire timeout.
        shape = PoolShape(slots_per_container=1, acquire_timeout_s=0.2 if the_pools else 30.0)
        async with sandbox_pool_factory(shape) as pool:
            async with pool.lease("holder"):
                with pytest.raises(AcquireTimeout):
                    async with pool.lease("late", timeout_s=None if the_pools else 0.2):
                        pytest.fail("got a slot that was held")
                assert pool.statistics().waiting == 0
            async with pool.lease("next", timeout_s=5.0) as lease:
                assert lease.holder == "next"
            stats = await wait_for_statistics(pool, all_free)
            assert stats.leases_expired >= 1

    async def test_a_waiter_cancelled_while_queued_leaves_the_queue(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            async with pool.lease("holder"):
                with anyio.move_on_after(0.1) as scope:
                    async with pool.lease("impatient"):
                        pytest.fail("got a slot that was held")
                assert scope.cancelled_caught
                assert pool.statistics().waiting == 0
            async with pool.lease("after") as lease:
                assert lease.holder == "after"
            await wait_for_statistics(pool, settled(1))

    async def test_cancellation_while_holding_releases_exactly_once(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=2)) as pool:
            granted = pool.statistics().leases_granted
            with anyio.move_on_after(0.1) as scope:
                async with pool.lease("doomed") as lease:
                    await _one(pool, slot_call(lease, "write_file", path="a.txt", content="x"))
                    await anyio.sleep_forever()
            assert scope.cancelled_caught
            stats = await wait_for_statistics(pool, settled(2))
            assert stats.quarantined == 0
            assert stats.leases_granted == granted + 1
            # The released slot is clean and leasable again.
            async with pool.lease("a") as a, pool.lease("b") as b:
                for held in (a, b):
                    found = await _one(pool, slot_call(held, "read_file", path="a.txt"))
                    assert found.outcome is not ToolOutcome.OK

    async def test_an_error_in_the_block_releases_the_slot(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            with pytest.raises(ZeroDivisionError):
                async with pool.lease("t"):
                    _ = 1 / 0
            await wait_for_statistics(pool, settled(1))

    # ------------------------------------------------------------------------- execute

    async def test_one_result_per_call_in_the_order_of_the_calls(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with (
            sandbox_pool_factory(PoolShape(slots_per_container=3)) as pool,
            pool.lease("a") as a,
            pool.lease("b") as b,
            pool.lease("c") as c,
        ):
            assert a.slot.container == b.slot.container == c.slot.container
            calls = [
                slot_call(lease, "bash", command=f"echo {lease.holder}{k}")
                for k in range(3)
                for lease in (c, a, b)
            ]
            results = await pool.execute(a.slot.container, calls)
        assert [r.call_id for r in results] == [call.call.id for call in calls]
        assert [r.content for r in results] == [
            f"{holder}{k}\n" for k in range(3) for holder in "cab"
        ]
        assert all(r.outcome is ToolOutcome.OK for r in results)

    async def test_calls_for_one_slot_run_in_order(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with _one_slot_leased(sandbox_pool_factory) as (pool, lease):
            parts = [str(k) for k in range(8)]
            calls = [
                slot_call(lease, "write_file", path="log.txt", content=part, append=True)
                for part in parts
            ]
            calls.append(slot_call(lease, "read_file", path="log.txt"))
            results = await pool.execute(lease.slot.container, calls)
        assert all(r.outcome is ToolOutcome.OK for r in results)
        assert results[-1].content == "".join(parts)

    async def test_files_written_can_be_read_and_a_new_lease_finds_the_workspace_empty(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            async with pool.lease("writer") as lease:
                wrote = await _one(
                    pool, slot_call(lease, "write_file", path="dir/notes.md", content="héllo ✓")
                )
                assert wrote.outcome is ToolOutcome.OK
                read = await _one(pool, slot_call(lease, "read_file", path="dir/notes.md"))
                assert (read.outcome, read.content) == (ToolOutcome.OK, "héllo ✓")
                shown = await _one(pool, slot_call(lease, "bash", command="cat dir/notes.md"))
                assert shown.exec is not None
                assert shown.exec.stdout == "héllo ✓"
            async with pool.lease("next") as second:
                assert second.slot == lease.slot
                gone = await _one(pool, slot_call(second, "read_file", path="dir/notes.md"))
                assert gone.outcome is ToolOutcome.TOOL_ERROR

    async def test_a_stale_lease_is_rejected(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            async with pool.lease("old") as old:
                pass
            await wait_for_statistics(pool, all_free)
            async with pool.lease("new") as new:
                assert new.slot == old.slot
                assert new.epoch > old.epoch
                stale, fresh = await pool.execute(
                    new.slot.container,
                    [
                        slot_call(old, "write_file", path="x", content="old"),
                        slot_call(new, "bash", command="cat x"),
                    ],
                )
            assert stale.outcome is ToolOutcome.REJECTED
            assert stale.error
            assert fresh.exec is not None
            assert fresh.exec.exit_code != 0  # the stale write never ran
            async with pool.lease("later"):
                late = await _one(pool, slot_call(new, "bash", command="true"))
            assert late.outcome is ToolOutcome.REJECTED

    async def test_a_repeated_call_id_returns_the_first_result_without_running_again(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with _one_slot_leased(sandbox_pool_factory) as (pool, lease):
            first = slot_call(lease, "write_file", path="n", content="x", append=True)
            again = slot_call(
                lease, "write_file", call_id=first.call.id, path="n", content="x", append=True
            )
            one = await _one(pool, first)
            two = await _one(pool, again)
            same_batch = await pool.execute(lease.slot.container, [first, again])
            read = await _one(pool, slot_call(lease, "read_file", path="n"))
        assert one == two
        assert same_batch == [one, one]
        assert read.content == "x"

    async def test_failures_are_results_never_exceptions(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with _one_slot_leased(sandbox_pool_factory) as (pool, lease):
            calls = [
                slot_call(lease, "no_such_tool", x=1),
                slot_call(lease, "bash"),
                slot_call(lease, "bash", command=42),
                slot_call(lease, "read_file", path="../outside"),
                slot_call(lease, "write_file", path="/etc/passwd", content="x"),
                slot_call(lease, "bash", command="exit 3"),
                slot_call(lease, "bash", command="echo still here"),
            ]
            results = await pool.execute(lease.slot.container, calls)
            timed = await _one(pool, slot_call(lease, "bash", command="sleep 5", timeout_s=0.5))
        outcomes = [r.outcome for r in results]
        assert outcomes[:5] == [ToolOutcome.REJECTED] * 5
        for result in results[:5]:
            assert result.error
            assert "@" in result.error  # names the field at fault
        assert results[3].error is not None
        assert "$.path" in results[3].error
        assert outcomes[5] is ToolOutcome.OK
        assert results[5].exec is not None
        assert results[5].exec.exit_code == 3
        assert results[6].content == "still here\n"
        assert timed.outcome is ToolOutcome.TIMEOUT
        assert timed.exec is not None
        assert timed.exec.timed_out

    @pytest.mark.parametrize("check", PATH_CHECKS, ids=lambda check: check.__name__)
    async def test_paths(self, sandbox_pool_factory: SandboxPoolFactory, check: CheckPaths) -> None:
        async with _one_slot_leased(sandbox_pool_factory) as (pool, lease):
            await check(pool, lease)

    async def test_a_release_ends_the_call_running_in_its_slot(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            await check_a_release_ends_the_running_call(pool)

    async def test_a_turns_time_bounds_its_calls_in_a_slot(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            await check_a_turns_time_bounds_its_calls_in_a_slot(pool)

    async def test_a_call_for_another_container_is_rejected(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with (
            sandbox_pool_factory(PoolShape(containers=2, slots_per_container=1)) as pool,
            pool.lease("a") as a,
            pool.lease("b") as b,
        ):
            assert a.slot.container != b.slot.container
            wrong, right = await pool.execute(
                a.slot.container,
                [slot_call(b, "bash", command="true"), slot_call(a, "bash", command="true")],
            )
        assert wrong.outcome is ToolOutcome.REJECTED
        assert right.outcome is ToolOutcome.OK

    # ------------------------------------------------------------------------- closing

    async def test_aclose_is_idempotent_and_then_everything_raises_pool_closed(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            async with pool.lease("t") as lease:
                call = slot_call(lease, "bash", command="true")
            await pool.aclose()
            await pool.aclose()
            with pytest.raises(PoolClosed):
                await pool.execute(lease.slot.container, [call])
            with pytest.raises(PoolClosed):
                async with pool.lease("late"):
                    pytest.fail("leased from a closed pool")

    async def test_a_waiter_gets_pool_closed_when_the_pool_closes(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        errors: list[BaseException] = []
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:

            async def waiter() -> None:
                try:
                    async with pool.lease("waiter"):
                        pytest.fail("leased a held slot")
                except PoolClosed as error:
                    errors.append(error)

            async with anyio.create_task_group() as group, pool.lease("holder"):
                group.start_soon(waiter)
                await wait_for_statistics(pool, lambda s: s.waiting == 1)
                await pool.aclose()
        assert len(errors) == 1

    # ------------------------------------------------------------------------- faults

    async def test_a_dead_container_fails_its_calls_and_leaves_service(
        self, sandbox_pool_factory: SandboxPoolFactory, crash_container: CrashContainer
    ) -> None:
        if not self.supports_crash:
            pytest.skip("this implementation cannot crash a container")
        async with sandbox_pool_factory(PoolShape(containers=2, slots_per_container=2)) as pool:
            async with contextlib.AsyncExitStack() as stack:
                held = [await stack.enter_async_context(pool.lease(f"t{i}")) for i in range(4)]
                victim = held[0]
                other = next(h for h in held if h.slot.container != victim.slot.container)
                dead = victim.slot.container
                crash_container(pool, dead)
                calls = [slot_call(victim, "bash", command=f"echo {k}") for k in range(3)]
                results = await pool.execute(dead, calls)
                assert [r.outcome for r in results] == [ToolOutcome.INFRA_ERROR] * 3
                assert [r.call_id for r in results] == [c.call.id for c in calls]
                fine = await _one(pool, slot_call(other, "bash", command="echo fine"))
                assert fine.content == "fine\n"
                again = await _one(pool, slot_call(victim, "bash", command="true"))
                assert again.outcome is ToolOutcome.INFRA_ERROR, again  # never the model's fault
                assert again.error is not None
                assert dead in again.error, again.error
            await wait_for_statistics(pool, settled(4), 30.0)
            await _a_new_lease_runs(pool)

    # ------------------------------------------------------------------------- environments

    async def test_an_environment_it_cannot_run_is_refused_and_its_slot_comes_back(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            with pytest.raises(EnvironmentUnavailable) as caught:
                async with pool.lease("t", environment=NO_SUCH_IMAGE):
                    pytest.fail("a lease ran over an image no host has")
            assert caught.value.environment == NO_SUCH_IMAGE
            assert NO_SUCH_IMAGE in str(caught.value)
            assert caught.value.reason
            stats = await wait_for_statistics(pool, all_free)
            assert (stats.free, stats.quarantined) == (1, 0)
            await _a_new_lease_runs(pool)

    async def test_a_malformed_environment_is_refused_before_a_slot_is_leased(
        self, sandbox_pool_factory: SandboxPoolFactory
    ) -> None:
        async with sandbox_pool_factory(PoolShape(slots_per_container=1)) as pool:
            granted = pool.statistics().leases_granted
            for bad in ("ubuntu:22.04", "oci:relative/layout", "directory:"):
                with pytest.raises(EnvironmentUnavailable) as caught:
                    async with pool.lease("t", environment=bad):
                        pytest.fail(f"a lease ran over {bad!r}")
                assert (caught.value.environment, caught.value.field) == (bad, "environment")
            assert pool.statistics().leases_granted == granted
            assert pool.statistics().free == 1

    # ------------------------------------------------------------------------- generated

    def test_generated_sequences(
        self, sandbox_pool_factory: SandboxPoolFactory, request: pytest.FixtureRequest
    ) -> None:
        crash: CrashContainer | None = None
        if self.supports_crash:
            crash = request.getfixturevalue("crash_container")
        shape = PoolShape(
            containers=self.machine_shape.containers,
            slots_per_container=self.machine_shape.slots_per_container,
        )
        run_pool_machine(
            [lambda: sandbox_pool_factory(shape)],
            shape=self.machine_shape,
            crash=crash,
            scale=self.machine_scale,
        )


@attrs.frozen(kw_only=True)
class EnvironmentCase:
    """A pool that runs task environments, and an image it runs.

    Attributes:
        factory: Makes pools (as ``SandboxPoolFactory``) that run ``environment``.
        environment: The image's reference.
        path: An absolute path of a file the image holds (``cat`` must be in the image).
        content: That file's text, which a lease naming no environment does not see there.
    """

    factory: SandboxPoolFactory
    environment: str
    path: str
    content: str


def _environment_counts(pool: SandboxPool) -> tuple[int, int, int]:
    """(leases, refused, hits + misses) of ``pool``'s environment statistics."""
    assert isinstance(pool, EnvironmentPool), "a pool running environments reports them"
    stats = pool.environment_statistics()
    return stats.leases, stats.refused, stats.hits + stats.misses


class TaskEnvironmentContract(AsyncioContract):
    """Abstract suite of a pool that runs task environments: override ``environment_case``."""

    supports_snapshots: ClassVar[bool] = True

    @pytest.fixture
    def environment_case(self) -> EnvironmentCase:
        raise NotImplementedError

    async def _cat(self, pool: SandboxPool, lease: Lease, path: str) -> str:
        seen = await _one(pool, slot_call(lease, "bash", command=f"cat {path}"))
        assert seen.exec is not None, seen
        return seen.exec.stdout

    async def test_a_lease_naming_an_image_runs_over_it(
        self, environment_case: EnvironmentCase
    ) -> None:
        case = environment_case
        async with case.factory(PoolShape(slots_per_container=1)) as pool:
            async with pool.lease("over", environment=case.environment) as lease:
                assert await self._cat(pool, lease, case.path) == case.content
                wrote = await _one(pool, slot_call(lease, "write_file", path="n.txt", content="x"))
                read = await _one(pool, slot_call(lease, "read_file", path="n.txt"))
                assert (wrote.outcome, read.content) == (ToolOutcome.OK, "x")
            async with pool.lease("plain") as plain:
                assert await self._cat(pool, plain, case.path) != case.content
            assert _environment_counts(pool) == (1, 0, 1)
            await wait_for_statistics(pool, settled(1))

    async def test_the_next_lease_over_the_image_starts_clean(
        self, environment_case: EnvironmentCase
    ) -> None:
        case = environment_case
        async with case.factory(PoolShape(slots_per_container=1)) as pool:
            async with pool.lease("first", environment=case.environment) as first:
                await _one(pool, slot_call(first, "write_file", path="left.txt", content="x"))
            async with pool.lease("second", environment=case.environment) as second:
                assert second.slot == first.slot
                gone = await _one(pool, slot_call(second, "read_file", path="left.txt"))
                assert gone.outcome is ToolOutcome.TOOL_ERROR
                assert await self._cat(pool, second, case.path) == case.content
            assert _environment_counts(pool) == (2, 0, 2)
            assert isinstance(pool, EnvironmentPool)
            assert pool.environment_statistics().hits >= 1  # the second found it made

    async def test_each_member_of_a_group_runs_over_the_image(
        self, environment_case: EnvironmentCase
    ) -> None:
        case = environment_case
        seen: list[str] = []
        async with case.factory(PoolShape(containers=2, slots_per_container=2)) as pool:

            async def member(i: int) -> None:
                async with pool.lease(f"g/{i}", environment=case.environment) as lease:
                    seen.append(await self._cat(pool, lease, case.path))

            async with anyio.create_task_group() as group:
                for i in range(4):
                    group.start_soon(member, i)
            assert seen == [case.content] * 4
            assert _environment_counts(pool) == (4, 0, 4)
            await wait_for_statistics(pool, settled(4))

    async def test_a_refused_image_fails_only_its_own_lease(
        self, environment_case: EnvironmentCase
    ) -> None:
        case = environment_case
        refused: list[EnvironmentUnavailable] = []
        async with case.factory(PoolShape(slots_per_container=2)) as pool:

            async def missing() -> None:
                try:
                    async with pool.lease("missing", environment=NO_SUCH_IMAGE):
                        pytest.fail("a lease ran over an image no host has")
                except EnvironmentUnavailable as error:
                    refused.append(error)

            async with anyio.create_task_group() as group:
                group.start_soon(missing)
                async with pool.lease("good", environment=case.environment) as good:
                    assert await self._cat(pool, good, case.path) == case.content
            assert [error.environment for error in refused] == [NO_SUCH_IMAGE]
            assert _environment_counts(pool) == (2, 1, 1)
            stats = await wait_for_statistics(pool, settled(2))
            assert stats.quarantined == 0

    async def test_leases_start_from_a_prepared_snapshot_until_it_is_dropped(
        self, environment_case: EnvironmentCase
    ) -> None:
        if not self.supports_snapshots:
            pytest.skip("this implementation takes no snapshots")
        case = environment_case
        async with case.factory(PoolShape(slots_per_container=2)) as pool:
            assert isinstance(pool, EnvironmentPool)
            async with pool.lease("prepare", environment=case.environment) as prepare:
                wrote = await _one(
                    pool, slot_call(prepare, "write_file", path="prepared.txt", content="ready")
                )
                assert wrote.outcome is ToolOutcome.OK
                snapshot = await pool.snapshot(prepare, case.environment)
            assert (snapshot.environment, snapshot.container) == (
                case.environment,
                prepare.slot.container,
            )
            async with (
                pool.lease_from("a", snapshot) as (a, a_forked),
                pool.lease_from("b", snapshot) as (b, b_forked),
            ):
                assert (a_forked, b_forked) == (True, True)
                for lease in (a, b):
                    read = await _one(pool, slot_call(lease, "read_file", path="prepared.txt"))
                    assert (read.outcome, read.content) == (ToolOutcome.OK, "ready")
                    assert await self._cat(pool, lease, case.path) == case.content
                await _one(pool, slot_call(a, "write_file", path="prepared.txt", content="a"))
                read = await _one(pool, slot_call(b, "read_file", path="prepared.txt"))
                assert read.content == "ready"  # each fork writes to its own copy
            await pool.drop_snapshot(snapshot)
            await pool.drop_snapshot(snapshot)  # twice: never raises
            async with pool.lease_from("late", snapshot) as (late, late_forked):
                assert not late_forked
                gone = await _one(pool, slot_call(late, "read_file", path="prepared.txt"))
                assert gone.outcome is ToolOutcome.TOOL_ERROR
                assert await self._cat(pool, late, case.path) == case.content
            stats = pool.environment_statistics()
            assert (stats.snapshots, stats.forks, stats.refused) == (1, 2, 0)
            assert stats.snapshot_bytes == snapshot.bytes > 0  # prepared.txt at least
            await wait_for_statistics(pool, lambda s: all_free(s) and s.quarantined == 0)

    async def test_leases_from_a_snapshot_prefer_its_server(
        self, environment_case: EnvironmentCase
    ) -> None:
        if not self.supports_snapshots:
            pytest.skip("this implementation takes no snapshots")
        case = environment_case
        async with case.factory(PoolShape(containers=2, slots_per_container=2)) as pool:
            assert isinstance(pool, EnvironmentPool)
            async with pool.lease("prepare", environment=case.environment) as prepare:
                snapshot = await pool.snapshot(prepare, case.environment)
            async with (
                pool.lease_from("a", snapshot) as (a, a_forked),
                pool.lease_from("b", snapshot) as (b, b_forked),
                pool.lease_from("c", snapshot, fork_wait_s=0.0) as (c, c_forked),
            ):
                assert (a_forked, b_forked, c_forked) == (True, True, False)
                assert {a.slot.container, b.slot.container} == {snapshot.container}
                assert c.slot.container != snapshot.container
            await pool.drop_snapshot(snapshot)
            assert pool.environment_statistics().fallbacks == 1
