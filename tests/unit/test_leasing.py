"""SlotLeasing: the domain slot book plus waiting, with a scripted reset and no processes.

Every test ends with ``check_valid()`` and with the slot counts it expects: a lease that leaked
(granted and never released) would show as a LEASED slot, a lost waiter as a waiting ticket.
"""

from __future__ import annotations

import functools
import logging
import math

import anyio
import anyio.lowlevel
import attrs
import pytest

from trajcore.adapters.pools.leasing import SlotLeasing
from trajcore.domain.errors import AcquireTimeout, InvalidInput, PoolClosed, SandboxUnavailable
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall, SlotId
from trajcore.domain.tools import ToolCall


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@attrs.define
class Resets:
    """A scripted ``reset``: records every lease it resets; can fail, raise, or wait on a gate."""

    done: list[Lease] = attrs.field(factory=list)
    fail_next: int = 0
    raise_next: int = 0
    gate: anyio.Event | None = None
    entered: anyio.Event = attrs.field(factory=anyio.Event)

    async def __call__(self, lease: Lease) -> bool:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        self.done.append(lease)
        if self.raise_next:
            self.raise_next -= 1
            raise OSError("the reset broke (scripted)")
        if self.fail_next:
            self.fail_next -= 1
            return False
        return True


def leasing_with(
    resets: Resets, *containers: tuple[str, int], default_timeout_s: float | None = None
) -> SlotLeasing:
    leasing = SlotLeasing(reset=resets, default_timeout_s=default_timeout_s, reset_timeout_s=5.0)
    for name, slots in containers:
        leasing.add_container(name, slots)
    return leasing


async def until_waiting(leasing: SlotLeasing, count: int) -> None:
    """Yield to the other tasks until ``count`` requests wait (no clock involved)."""
    for _ in range(10_000):
        if leasing.statistics().waiting == count:
            return
        await anyio.lowlevel.checkpoint()
    pytest.fail(f"never {count} waiting: {leasing.statistics()}")


def counts(stats: PoolStatistics) -> tuple[int, int, int, int, int]:
    return (stats.free, stats.leased, stats.resetting, stats.quarantined, stats.waiting)


def call_under(lease: Lease) -> SlotCall:
    call = ToolCall(id="c1", name="bash", arguments={"command": "true"})
    return SlotCall(lease=lease, call=call, timeout_s=1.0)


# ----------------------------------------------------------------------------- holding


@pytest.mark.anyio
async def test_a_lease_is_released_reset_and_granted_again_with_a_new_epoch() -> None:
    resets = Resets()
    leasing = leasing_with(resets, ("c", 1))
    async with leasing.lease("a") as first:
        assert first.slot == SlotId(container="c", index=0)
        assert counts(leasing.statistics()) == (0, 1, 0, 0, 0)
        assert leasing.refusal("c", call_under(first)) is None
    assert resets.done == [first]
    assert leasing.refusal("c", call_under(first)) is not None  # released: stale
    async with leasing.lease("b") as second:
        assert second.slot == first.slot
        assert second.epoch > first.epoch
    stats = leasing.statistics()
    assert counts(stats) == (1, 0, 0, 0, 0)
    assert stats.leases_granted == 2
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_call_for_another_container_is_refused_naming_the_field() -> None:
    leasing = leasing_with(Resets(), ("c", 1), ("d", 1))
    async with leasing.lease("a") as lease:
        refusal = leasing.refusal("d" if lease.slot.container == "c" else "c", call_under(lease))
        assert refusal is not None
        assert "$.lease.slot.container" in refusal


@pytest.mark.anyio
async def test_the_release_of_a_cancelled_holder_is_shielded() -> None:
    resets = Resets(gate=anyio.Event())
    leasing = leasing_with(resets, ("c", 1))
    released = anyio.Event()

    async def holder(scope: anyio.CancelScope) -> None:
        with scope:
            async with leasing.lease("doomed"):
                await anyio.sleep_forever()
        released.set()

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as group:
        group.start_soon(holder, scope)
        await until_leased(leasing, 1)
        scope.cancel()
        await resets.entered.wait()
        # Cancelled, yet the reset runs on: the slot is RESETTING until the gate opens.
        assert counts(leasing.statistics()) == (0, 0, 1, 0, 0)
        assert not released.is_set()
        assert resets.gate is not None
        resets.gate.set()
    assert released.is_set()
    assert counts(leasing.statistics()) == (1, 0, 0, 0, 0)
    leasing.check_valid()


async def until_leased(leasing: SlotLeasing, count: int) -> None:
    for _ in range(10_000):
        if leasing.statistics().leased == count:
            return
        await anyio.lowlevel.checkpoint()
    pytest.fail(f"never {count} leased: {leasing.statistics()}")


def quarantines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings the leasing logged."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "trajcore.adapters.pools.leasing" and record.levelno == logging.WARNING
    ]


@pytest.mark.anyio
async def test_a_failed_or_raising_reset_quarantines_the_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resets = Resets(fail_next=1, raise_next=1)
    leasing = leasing_with(resets, ("c", 3))
    async with leasing.lease("a"), leasing.lease("b"):
        pass
    stats = leasing.statistics()
    assert counts(stats) == (1, 0, 0, 2, 0)
    async with leasing.lease("c") as lease:
        assert lease.slot.index == 2  # the only clean slot left
    leasing.check_valid()
    # the raising reset (b's, the first released) is named with why; one that fails says why itself
    assert quarantines(caplog) == [
        "slot c/1 quarantined: its reset raised OSError: the reset broke (scripted)"
    ]


@pytest.mark.anyio
async def test_a_reset_past_its_timeout_quarantines_the_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resets = Resets(gate=anyio.Event())  # never opened
    leasing = SlotLeasing(reset=resets, reset_timeout_s=0.01, reset_backstop_s=0.02)
    leasing.add_container("c", 1)
    async with leasing.lease("a"):
        pass
    assert counts(leasing.statistics()) == (0, 0, 0, 1, 0)
    leasing.check_valid()
    assert quarantines(caplog) == [
        "slot c/0 quarantined: its reset ran past reset_timeout_s (0.01 s) plus 0.02 s"
    ]


@pytest.mark.anyio
async def test_a_reset_that_bounds_itself_gets_its_own_limit_before_the_backstop() -> None:
    """The release's limit is a backstop past ``reset_timeout_s``: a pool's reset that fails at
    its own bound (a slot server's client, which then loses the server) is heard, not cut off."""
    heard: list[str] = []

    async def own_bound(lease: Lease) -> bool:
        with anyio.move_on_after(0.05):
            await anyio.sleep_forever()
        heard.append(f"{lease.slot} gave up at its own bound")
        return False

    leasing = SlotLeasing(reset=own_bound, reset_timeout_s=0.05, reset_backstop_s=5.0)
    leasing.add_container("c", 1)
    async with leasing.lease("a"):
        pass
    assert heard == ["c/0 gave up at its own bound"]
    assert counts(leasing.statistics()) == (0, 0, 0, 1, 0)


# ----------------------------------------------------------------------------- waiting


@pytest.mark.anyio
async def test_waiters_under_contention_are_served_first_come_first_served() -> None:
    resets = Resets()
    leasing = leasing_with(resets, ("c", 2))
    order: list[int] = []
    holders_release = anyio.Event()

    async def hold(name: str) -> None:
        async with leasing.lease(name):
            await holders_release.wait()

    async def wait_turn(i: int) -> None:
        async with leasing.lease(f"w{i}"):
            order.append(i)
            await anyio.lowlevel.checkpoint()  # overlap with the next waiters

    async with anyio.create_task_group() as group:
        group.start_soon(hold, "h0")
        group.start_soon(hold, "h1")
        await until_leased(leasing, 2)
        for i in range(8):
            group.start_soon(wait_turn, i)
            await until_waiting(leasing, i + 1)
        leasing.check_valid()
        holders_release.set()
    assert order == list(range(8))
    stats = leasing.statistics()
    assert counts(stats) == (2, 0, 0, 0, 0)
    assert stats.leases_granted == 10
    assert stats.leases_expired == 0
    assert len(resets.done) == 10
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_waiter_past_its_deadline_gets_acquire_timeout_and_is_counted() -> None:
    leasing = leasing_with(Resets(), ("c", 1))
    async with leasing.lease("holder"):
        with pytest.raises(AcquireTimeout, match="'late'"):
            async with leasing.lease("late", timeout_s=0.01):
                pytest.fail("got a slot that was held")
        with pytest.raises(AcquireTimeout):
            async with leasing.lease("impatient", timeout_s=0.0):
                pytest.fail("got a slot that was held")
        assert leasing.statistics().waiting == 0
        leasing.check_valid()
    stats = leasing.statistics()
    assert counts(stats) == (1, 0, 0, 0, 0)
    assert stats.leases_expired == 2
    assert stats.leases_granted == 1
    leasing.check_valid()


@pytest.mark.anyio
async def test_the_default_timeout_applies_and_one_expiry_ends_every_due_waiter() -> None:
    leasing = leasing_with(Resets(), ("c", 1), default_timeout_s=0.01)
    failures: list[str] = []

    async def late(name: str) -> None:
        try:
            async with leasing.lease(name):
                pytest.fail("got a slot that was held")
        except AcquireTimeout:
            failures.append(name)

    async with leasing.lease("holder", timeout_s=math.inf), anyio.create_task_group() as group:
        for i in range(4):
            group.start_soon(late, f"w{i}")
        await until_waiting(leasing, 4)
    assert sorted(failures) == ["w0", "w1", "w2", "w3"]
    stats = leasing.statistics()
    assert stats.leases_expired == 4
    assert counts(stats) == (1, 0, 0, 0, 0)
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_waiter_served_before_its_deadline_keeps_the_lease() -> None:
    leasing = leasing_with(Resets(), ("c", 1))
    got: list[Lease] = []

    async def patient() -> None:
        async with leasing.lease("patient", timeout_s=30.0) as lease:
            got.append(lease)

    async with anyio.create_task_group() as group, leasing.lease("holder"):
        group.start_soon(patient)
        await until_waiting(leasing, 1)
    assert [lease.holder for lease in got] == ["patient"]
    assert leasing.statistics().leases_expired == 0
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_nan_timeout_is_refused_naming_the_field() -> None:
    leasing = leasing_with(Resets(), ("c", 1))
    with pytest.raises(InvalidInput, match="timeout_s"):
        async with leasing.lease("a", timeout_s=math.nan):
            pytest.fail("leased with a NaN timeout")
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_waiter_cancelled_while_queued_leaves_the_queue() -> None:
    leasing = leasing_with(Resets(), ("c", 1))
    async with leasing.lease("holder"):
        with anyio.CancelScope() as scope:

            async def cancel_soon() -> None:
                await until_waiting(leasing, 1)
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_soon)
                async with leasing.lease("impatient"):
                    pytest.fail("got a slot that was held")
        assert scope.cancelled_caught
        assert leasing.statistics().waiting == 0
        leasing.check_valid()
    stats = leasing.statistics()
    assert counts(stats) == (1, 0, 0, 0, 0)
    assert stats.leases_granted == 1
    assert stats.leases_expired == 0
    leasing.check_valid()


@pytest.mark.anyio
@pytest.mark.parametrize("cancel_first", [True, False])
async def test_a_waiter_served_as_it_is_cancelled_gives_the_lease_back(
    cancel_first: bool,
) -> None:
    """The grant and the cancellation cross within one step; either order leaks nothing.

    Cancelled first, then served before its task runs again: the waiter never enters its block
    and gives the lease it was served straight back. Served first, then cancelled: anyio
    delivers the cancellation at the waiter's next checkpoint, inside its block, and leaving
    the block releases the lease as usual.
    """
    resets = Resets()
    leasing = leasing_with(resets, ("c", 1))
    waiter_scope = anyio.CancelScope()
    entered: list[Lease] = []

    async def waiter() -> None:
        with waiter_scope:
            async with leasing.lease("waiter") as lease:
                entered.append(lease)
                await anyio.lowlevel.checkpoint()
                pytest.fail("the waiter was not cancelled")

    async def cancel_then_succeed(lease: Lease) -> bool:
        # The holder's reset: cancel the waiter, then report the slot clean, so the book
        # serves the waiter right after, before the waiter's task runs again.
        if cancel_first and lease.holder == "holder":
            waiter_scope.cancel()
        return await resets(lease)

    leasing.reset = cancel_then_succeed
    async with anyio.create_task_group() as group:
        async with leasing.lease("holder"):
            group.start_soon(waiter)
            await until_waiting(leasing, 1)
        # The release served the waiter already (no checkpoint since): it holds the slot.
        assert counts(leasing.statistics()) == (0, 1, 0, 0, 0)
        if not cancel_first:
            waiter_scope.cancel()
    assert waiter_scope.cancelled_caught
    assert [lease.holder for lease in entered] == ([] if cancel_first else ["waiter"])
    # The served lease was given back and reset, exactly once.
    assert [lease.holder for lease in resets.done] == ["holder", "waiter"]
    stats = leasing.statistics()
    assert counts(stats) == (1, 0, 0, 0, 0)
    assert stats.leases_granted == 2
    leasing.check_valid()


# ----------------------------------------------------------------------------- containers


@pytest.mark.anyio
async def test_a_lost_container_takes_its_leases_and_late_releases_change_nothing() -> None:
    resets = Resets()
    leasing = leasing_with(resets, ("a", 1), ("b", 1))
    b_free = anyio.Event()
    got: list[Lease] = []

    async def hold_b() -> None:
        async with leasing.lease("on-b"):
            await b_free.wait()

    async def waiter() -> None:
        async with leasing.lease("waiter") as lease:
            got.append(lease)

    async with anyio.create_task_group() as group:
        async with leasing.lease("on-a") as on_a:
            assert on_a.slot.container == "a"
            group.start_soon(hold_b)
            await until_leased(leasing, 2)
            group.start_soon(waiter)
            await until_waiting(leasing, 1)
            assert leasing.lose_container("a") == [on_a]
            assert leasing.refusal("a", call_under(on_a)) is not None
            stats = leasing.statistics()
            assert (stats.containers, stats.leased, stats.waiting) == (1, 1, 1)
            leasing.check_valid()
        # The late release of on-a was ignored: nothing to reset, no slot came free.
        assert resets.done == []
        assert leasing.statistics().waiting == 1
        b_free.set()
    assert [lease.slot.container for lease in got] == ["b"]
    stats = leasing.statistics()
    assert (stats.containers, *counts(stats)) == (1, 1, 0, 0, 0, 0)
    assert stats.leases_granted == 3
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_container_lost_while_a_slot_resets_and_its_replacement_serves_waiters() -> None:
    resets = Resets(gate=anyio.Event())
    leasing = leasing_with(resets, ("a", 1))
    got: list[Lease] = []

    async def waiter() -> None:
        async with leasing.lease("waiter") as lease:
            got.append(lease)

    async with anyio.create_task_group() as group:

        async def hold_and_release() -> None:
            async with leasing.lease("holder"):
                pass

        group.start_soon(hold_and_release)
        await resets.entered.wait()  # the holder's slot is resetting now
        group.start_soon(waiter)
        await until_waiting(leasing, 1)
        assert leasing.lose_container("a") == []  # a resetting slot has no lease
        assert resets.gate is not None
        resets.gate.set()  # the reset ends for a slot that left the book: ignored
        await anyio.lowlevel.checkpoint()
        assert leasing.statistics().waiting == 1
        leasing.add_container("a~1", 1)  # the replacement serves the waiter at once
    assert [lease.slot.container for lease in got] == ["a~1"]
    stats = leasing.statistics()
    assert (stats.containers, *counts(stats)) == (1, 1, 0, 0, 0, 0)
    leasing.check_valid()


# ----------------------------------------------------------------------------- closing


@pytest.mark.anyio
async def test_close_fails_every_waiter_and_every_later_lease_with_pool_closed() -> None:
    leasing = leasing_with(Resets(), ("c", 1))
    closed: list[str] = []

    async def waiter(name: str) -> None:
        try:
            async with leasing.lease(name):
                pytest.fail("got a slot that was held")
        except PoolClosed:
            closed.append(name)

    async with anyio.create_task_group() as group, leasing.lease("holder"):
        for i in range(3):
            group.start_soon(waiter, f"w{i}")
        await until_waiting(leasing, 3)
        leasing.close()
        leasing.close()  # idempotent
    assert sorted(closed) == ["w0", "w1", "w2"]
    with pytest.raises(PoolClosed):
        async with leasing.lease("after"):
            pytest.fail("leased after close")
    stats = leasing.statistics()
    assert counts(stats) == (1, 0, 0, 0, 0)
    assert stats.leases_expired == 0
    leasing.check_valid()


@pytest.mark.anyio
async def test_a_suspended_leasing_fails_its_waiters_and_new_leases_until_resumed() -> None:
    resets = Resets()
    leasing = leasing_with(resets, ("c", 1))
    failures: list[BaseException] = []

    def refusal() -> Exception:
        return SandboxUnavailable("the scheduler stopped the servers (scripted)")

    async def wait_for_a_slot(holder: str, *, prefer: str | None = None) -> None:
        with pytest.raises(SandboxUnavailable) as caught:
            async with leasing.lease(holder, prefer=prefer, prefer_s=60.0):
                pytest.fail("a lease from a suspended leasing")
        failures.append(caught.value)

    async with leasing.lease("holder"), anyio.create_task_group() as group:
        group.start_soon(wait_for_a_slot, "first")
        group.start_soon(functools.partial(wait_for_a_slot, "second", prefer="c"))
        while leasing.statistics().waiting < 2:
            await anyio.lowlevel.checkpoint()
        leasing.suspend(refusal)
        assert leasing.suspended
    assert len(failures) == 2
    assert failures[0] is not failures[1]  # each lease gets an error of its own
    with pytest.raises(SandboxUnavailable, match="scripted"):
        async with leasing.lease("late"):
            pytest.fail("a lease from a suspended leasing")
    leasing.check_valid()
    leasing.resume()
    async with leasing.lease("after") as lease:
        assert lease.slot == SlotId(container="c", index=0)
    assert counts(leasing.statistics()) == (1, 0, 0, 0, 0)
    leasing.check_valid()
