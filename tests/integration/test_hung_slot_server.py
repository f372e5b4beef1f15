"""A slot server that hangs (stopped with SIGSTOP) is lost and replaced, at its batch or at a
reset, through the env's dispatcher with its default grace.

A pool bounds each request to a slot server (the slot server client: a batch's slowest slot's
timeouts plus its grace, a reset's ``reset_timeout_s``) and loses a server that passes the
bound. The dispatcher's own deadline and the release's reset limit are backstops past those
bounds. Before, both fired first (the dispatcher's at the longest call's timeout plus 10 s, the
release's at ``reset_timeout_s``): the calls were infra errors and the slot quarantined, but the
hung server stayed in the pool and its other slots went on being leased.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import time
from collections.abc import Iterator

import anyio
import pytest

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]

_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """The pids this test stops: continued at its end, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def config() -> LocalPoolConfig:
    return LocalPoolConfig(
        containers=2,
        server=SlotServerSettings(
            slots_per_container=2, acquire_timeout_s=60.0, reset_timeout_s=2.0,
            isolation=SlotIsolation(min_timeout_s=0.2, max_processes=64),
        ),
    )  # fmt: skip


def bash(lease: Lease, command: str) -> SlotCall:
    call = ToolCall(id=f"h{next(_ids)}", name="bash", arguments={"command": command})
    return SlotCall(lease=lease, call=call, timeout_s=1.0)


async def replaced(pool: LocalSandboxPool, hung: str) -> None:
    with anyio.fail_after(30):
        while hung in pool.container_names() or len(pool.container_names()) < 2:  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_a_server_hung_under_a_batch_is_lost_at_the_clients_bound(
    stopped: list[int],
) -> None:
    async with (
        LocalSandboxPool(config()) as pool,
        ToolDispatcher(pool, BatchConfig(window_ms=2.0)) as dispatcher,  # the env's grace
    ):
        async with pool.lease("victim") as victim:
            hung = victim.slot.container
            stopped.append(pool.server_pid(hung))
            os.kill(stopped[-1], signal.SIGSTOP)
            started = time.monotonic()
            (result,) = await dispatcher.run([bash(victim, "echo hi")])
            took = time.monotonic() - started
            assert result.outcome is ToolOutcome.INFRA_ERROR, result
            assert result.error is not None
            assert f"slot server {hung} failed the batch" in result.error, result.error
            assert took < 1.0 + 15.0 + 5.0  # the client's bound, not the dispatcher's
            assert pool.containers_lost == 1
        await replaced(pool, hung)
        async with pool.lease("next") as fresh:
            (ok,) = await dispatcher.run([bash(fresh, "echo fine")])
            assert ok.content == "fine\n"


async def test_a_server_hung_under_a_reset_is_lost_not_only_its_slot_quarantined(
    stopped: list[int],
) -> None:
    async with LocalSandboxPool(config()) as pool:
        async with pool.lease("victim") as victim:
            hung = victim.slot.container
            (ran,) = await pool.execute(hung, [bash(victim, "true")])
            assert ran.outcome is ToolOutcome.OK, ran
            stopped.append(pool.server_pid(hung))
            os.kill(stopped[-1], signal.SIGSTOP)
        # the release's reset meets the stopped server: lost at reset_timeout_s (2 s)
        with anyio.fail_after(15):
            while pool.containers_lost == 0:  # noqa: ASYNC110 - the pool has no event for it
                await anyio.sleep(0.05)
        assert any(f"container {hung} lost" in line for line in pool.problems), pool.problems
        await replaced(pool, hung)
        assert pool.statistics().quarantined == 0
