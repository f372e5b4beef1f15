"""A batch whose answer came while the event loop was held up (a long synchronous step of some
task, such as the tokenizer rendering a trajectory with a large tool result, or a CPU starved by
load) is delivered, not abandoned as overrun: the dispatcher's deadline counts time the loop ran.
Before, at 48 concurrent trajectories on 2 cores, 32 of them ended ``infra_error`` with "batch
to container local-2 overran its 33.0s deadline" while their slot servers had answered."""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import pytest

from tests.unit.test_dispatcher import DelegatingPool, HookFactory, bash, loop_hooks
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolOutcome, ToolResult
from trajcore.rollout.dispatcher import ToolDispatcher

__all__ = ["loop_hooks"]  # (the fixture, shared with the dispatcher's other tests)

EAGER = BatchConfig(window_ms=0.0, max_batch_size=64, eager=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SlowPool(DelegatingPool):
    """Answers each batch after ``delay_s``."""

    delay_s = 0.1

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        await anyio.sleep(self.delay_s)
        return await self.inner.execute(container, calls)


def _hold_up(seconds: float) -> None:
    """Block the event loop's thread: a long synchronous step of some task."""
    time.sleep(seconds)


@pytest.mark.anyio
async def test_an_answer_that_came_while_the_loop_was_held_up_is_delivered(
    loop_hooks: HookFactory,
) -> None:
    async with FakeSandboxPool(containers=1, slots_per_container=1) as fake:
        pool = SlowPool(fake)
        results: list[ToolResult] = []
        async with (
            ToolDispatcher(pool, EAGER, grace_s=0.05, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("t") as lease,
        ):

            async def run() -> None:
                results.extend(await dispatcher.run([bash(lease, "echo hi", timeout_s=0.2)]))

            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await anyio.sleep(0.02)  # the batch is out; its answer comes at 0.1 s
                _hold_up(1.0)  # past the batch's deadline (0.2 s + 0.05 s)
    assert [r.outcome for r in results] == [ToolOutcome.OK], results
    assert results[0].content == "hi\n"


@pytest.mark.anyio
async def test_a_batch_that_overruns_while_the_loop_runs_is_still_abandoned(
    loop_hooks: HookFactory,
) -> None:
    async with FakeSandboxPool(containers=1, slots_per_container=1) as fake:
        pool = SlowPool(fake)
        pool.delay_s = 30.0
        async with (
            ToolDispatcher(pool, EAGER, grace_s=0.05, loop_hooks=loop_hooks) as dispatcher,
            pool.lease("t") as lease,
        ):
            started = time.monotonic()
            results = await dispatcher.run([bash(lease, "echo hi", timeout_s=0.2)])
            took = time.monotonic() - started
    assert [r.outcome for r in results] == [ToolOutcome.INFRA_ERROR], results
    assert "overran its 0.2s deadline" in (results[0].error or "")
    assert 0.2 < took < 2.0, took
