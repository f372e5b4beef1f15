"""A lease's calls after its first go straight to its agent (``tool_calls.start_call``): no task
of their own, the reply answered from the channel's read callback. What the task path promised
still holds on this path: a reset interrupts the running call at once, a lease that dies during
a call fails that call and every later call of its epoch, and the next lease is fresh.

The runtime runs in this process with bubblewrap and the compiled helper, as the slot servers
do. The control is the lease's first call, which starts the agent and so runs as a task.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slot_runtime_testbed import call, searchable_root
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.domain.tools import ToolOutcome, ToolResult

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-batch-path-") as path:
        yield path


def call_tasks() -> int:
    """Tasks of this loop that run one call (``CallTurns._run_turn``, ``SlotRuntime``'s)."""
    return sum(
        1
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") == "CallTurns._run_turn"
    )


async def tasks_while_running(runtime: SlotRuntime, epoch: int, command: str) -> tuple[int, str]:
    """How many call tasks exist while ``command`` runs, and its output."""
    running = asyncio.ensure_future(runtime.execute([call(epoch, command)]))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if runtime.listing().slots[0].busy:
            break
    await asyncio.sleep(0.1)
    seen = call_tasks()
    (result,) = await running
    return seen, result.content


def test_a_leases_later_calls_run_without_a_task_of_their_own(root: Path) -> None:
    config = RuntimeConfig(slots=1, root=root, use_cgroups=False)

    async def main() -> tuple[tuple[int, str], tuple[int, str], tuple[int, str]]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            first = await tasks_while_running(runtime, 1, "sleep 0.5; echo one")
            second = await tasks_while_running(runtime, 1, "sleep 0.5; echo two")
            third = await tasks_while_running(runtime, 1, "sleep 0.5; echo three")
            return first, second, third
        finally:
            await runtime.aclose()

    first, second, third = asyncio.run(main())
    assert first == (1, "one\n")  # control: the lease's first call starts its agent as a task
    assert second == (0, "two\n")
    assert third == (0, "three\n")


def test_a_reset_interrupts_a_call_on_the_direct_path_at_once(root: Path) -> None:
    config = RuntimeConfig(slots=1, root=root, use_cgroups=False)

    async def main() -> tuple[ToolResult, bool, float, str]:
        runtime = SlotRuntime(config)
        await runtime.start()
        loop = asyncio.get_running_loop()
        try:
            await runtime.execute([call(1, "true")])
            running = asyncio.ensure_future(runtime.execute([call(1, "sleep 30; echo late")]))
            await asyncio.sleep(0.3)
            assert call_tasks() == 0  # it runs on the direct path
            started = loop.time()
            reset = await runtime.reset(0, 1)
            (interrupted,) = await running
            took = loop.time() - started
            (next_lease,) = await runtime.execute([call(2, "echo fresh")])
            return interrupted, reset.ok, took, next_lease.content
        finally:
            await runtime.aclose()

    interrupted, reset_ok, took, fresh = asyncio.run(main())
    assert interrupted.outcome is ToolOutcome.INFRA_ERROR, interrupted
    assert "late" not in interrupted.content
    assert reset_ok
    assert took < 10
    assert fresh == "fresh\n"


def test_a_lease_that_dies_during_a_direct_call_fails_it_and_its_epochs_later_calls(
    root: Path,
) -> None:
    config = RuntimeConfig(slots=1, root=root, use_cgroups=False)

    async def main() -> tuple[ToolResult, ToolResult, str]:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            await runtime.execute([call(1, "true")])
            pid = runtime.listing().slots[0].sandbox_pid
            assert pid is not None
            running = asyncio.ensure_future(runtime.execute([call(1, "sleep 30")]))
            await asyncio.sleep(0.3)
            assert call_tasks() == 0
            os.kill(pid, signal.SIGKILL)  # the slot's sandbox: its keeper, and the lease with it
            (during,) = await running
            (after,) = await runtime.execute([call(1, "echo again")])
            assert (await runtime.reset(0, 1)).ok
            (next_lease,) = await runtime.execute([call(2, "echo fresh")])
            return during, after, next_lease.content
        finally:
            await runtime.aclose()

    during, after, fresh = asyncio.run(main())
    assert during.outcome is ToolOutcome.INFRA_ERROR, during
    assert after.outcome is ToolOutcome.INFRA_ERROR, after
    assert "during lease epoch 1" in (after.error or "")
    assert fresh == "fresh\n"
