"""Checks of a started ``SandboxPool`` that the contract suite (``sandbox_pool_contract``) runs,
and that a pool's own tests may run too.

- ``wait_for_statistics`` polls ``statistics()`` until a condition holds: ``waiting``,
  ``all_free``, ``settled``.
- ``check_a_release_ends_the_running_call``: a lease's end ends the call running in its slot at
  once, as a slot server's reset does (it ends the lease's processes). This is what frees a
  slot when a trajectory's deadline cancels a hook's command: the dispatcher drops the call's
  result, the lease is released, and the release must neither wait for the command's timeout
  nor let it, or a call queued behind it, go on to touch the slot's next lease.
- ``check_a_turns_time_bounds_its_calls_in_a_slot``: the calls of one slot share the time their
  turn has left (``SlotCall.time_left_s``), however many they are and whatever each one's own
  timeout: the first runs under what is left, the next is answered ``TIMEOUT`` unrun. This is
  what frees a slot at a trajectory's turns' deadline when the model made several long calls.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs
import pytest

from trajcore.domain.slots import PoolStatistics, time_left_spent
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.portal_pools import slot_call

__all__ = [
    "all_free",
    "check_a_release_ends_the_running_call",
    "check_a_turns_time_bounds_its_calls_in_a_slot",
    "settled",
    "wait_for_statistics",
    "waiting",
]

_CALL_TIMEOUT_S = 60.0  # the running call's own limit: the release must not wait for it
_RELEASE_S = 20.0  # the most the release and the call's answer may take in all
_STARTING_S = 0.5  # time for the call to start in the slot before the lease ends
_TIME_LEFT_S = 1.5  # the turn's time left for its two calls of 5 s each
_SANDBOX_START_S = 2.0  # what starting a lease's sandbox and the batch's trip may add to it


async def wait_for_statistics(
    pool: SandboxPool, check: Callable[[PoolStatistics], bool], timeout_s: float = 10.0
) -> PoolStatistics:
    """Poll ``pool.statistics()`` until ``check`` holds; fail the test after ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while not check(stats := pool.statistics()):  # noqa: ASYNC110 - statistics have no event
            await anyio.sleep(0.005)
        return stats
    pytest.fail(f"statistics never reached the expected state: {pool.statistics()}")


def waiting(count: int) -> Callable[[PoolStatistics], bool]:
    """Whether ``count`` lease requests are queued."""
    return lambda stats: stats.waiting == count


def all_free(stats: PoolStatistics) -> bool:
    """Whether no slot is leased or resetting and no request waits."""
    return stats.leased == 0 and stats.resetting == 0 and stats.waiting == 0


def settled(free: int) -> Callable[[PoolStatistics], bool]:
    """Whether all is free (``all_free``) with ``free`` slots."""
    return lambda stats: all_free(stats) and stats.free == free


async def check_a_release_ends_the_running_call(pool: SandboxPool) -> None:
    """Lease a slot of ``pool`` (one slot, free), start a ``sleep 600`` there with a write
    queued behind it in the same batch, and end the lease while the sleep runs: the release
    and the batch's answer come well before the sleep's timeout; the sleep is ended
    (``INFRA_ERROR``) or refused as stale (``REJECTED``, had it not started yet), never run
    to its end; the queued write is refused for its lease (``lease_refused``) and never runs,
    so the slot's next lease finds no file of it."""
    results: list[ToolResult] = []
    with anyio.fail_after(_RELEASE_S):
        async with anyio.create_task_group() as group, pool.lease("ended") as lease:
            calls = [
                slot_call(lease, "bash", command="sleep 600", timeout_s=_CALL_TIMEOUT_S),
                slot_call(lease, "write_file", path="late.txt", content="late"),
            ]

            async def run() -> None:
                results.extend(await pool.execute(lease.slot.container, calls))

            group.start_soon(run)
            await anyio.sleep(_STARTING_S)  # started or not, the release must end it
        ended, queued = results
        assert ended.outcome in {ToolOutcome.INFRA_ERROR, ToolOutcome.REJECTED}, ended
        # a refusal for the lease is marked so: an env's reader tells it from the call's answer
        assert ended.outcome is ToolOutcome.INFRA_ERROR or ended.lease_refused, ended
        assert queued.outcome is ToolOutcome.REJECTED, queued
        assert queued.lease_refused, queued
        async with pool.lease("next") as after:
            (late,) = await pool.execute(
                after.slot.container, [slot_call(after, "read_file", path="late.txt")]
            )
        assert after.slot == lease.slot
        assert late.outcome is ToolOutcome.TOOL_ERROR, late  # no such file
    await wait_for_statistics(pool, settled(1))


async def check_a_turns_time_bounds_its_calls_in_a_slot(pool: SandboxPool) -> None:
    """Lease a slot of ``pool`` and send two ``sleep 5`` calls (timeout 10 s each) in one batch
    with ``time_left_s`` 1.5 s: both are answered within about that time (not the 10 s they
    take one after the other), the first ``TIMEOUT`` after it ran, the second ``TIMEOUT``
    without running (``time_left_spent``). The control, two ``sleep 1`` calls without a turn's
    time, both run to their end."""
    async with pool.lease("turn") as lease:
        calls = [
            attrs.evolve(
                slot_call(lease, "bash", command="sleep 5", timeout_s=10.0),
                time_left_s=_TIME_LEFT_S,
            )
            for _ in range(2)
        ]
        started = anyio.current_time()
        with anyio.fail_after(_TIME_LEFT_S + 10.0):
            ran, unrun = await pool.execute(lease.slot.container, calls)
        took = anyio.current_time() - started
        assert took < _TIME_LEFT_S + _SANDBOX_START_S, took
        assert ran.outcome is ToolOutcome.TIMEOUT, ran
        assert ran.exec is not None, ran
        assert ran.exec.timed_out, ran
        assert unrun.outcome is ToolOutcome.TIMEOUT, unrun
        assert (unrun.exec, unrun.error) == (None, time_left_spent(_TIME_LEFT_S)), unrun
        control = [slot_call(lease, "bash", command="sleep 1", timeout_s=10.0) for _ in range(2)]
        with anyio.fail_after(20.0):
            answers = await pool.execute(lease.slot.container, control)
        assert [answer.outcome for answer in answers] == [ToolOutcome.OK] * 2, answers
    await wait_for_statistics(pool, settled(1))
