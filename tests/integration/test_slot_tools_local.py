"""``SlotTools.check``/``run`` and the file helpers on the local pool: real slot servers, real
bubblewrap; a killed slot server makes them raise, never answer False."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.integration.test_local_pool import config, running_now, wait_no_leftovers
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import SlotFileError, SlotInfraError
from trajcore.domain.slot_protocol import SLOT_TOOLS
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def slot_tools(pool: LocalSandboxPool, *, timeout_s: float) -> AsyncIterator[SlotTools]:
    async with (
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=30.0) as lease,
    ):
        router = ToolRouter(
            lease=lease,
            dispatcher=dispatcher,
            tool_server=None,
            offered=frozenset(SLOT_TOOLS),
            tool_timeout_s=timeout_s,
            trajectory_id="t",
        )
        yield SlotTools(router)


async def test_check_run_and_files_on_the_local_pool() -> None:
    before = running_now()
    async with LocalSandboxPool(config(containers=1, slots=2)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with slot_tools(pool, timeout_s=1.0) as tools:
            assert await tools.check("true") is True
            assert await tools.check("exit 4") is False
            report = await tools.run("echo out; echo err >&2; exit 2")
            assert (report.exit_code, report.stdout, report.stderr) == (2, "out\n", "err\n")
            assert report.sandboxed
            timed = await tools.run("sleep 10")
            assert timed.timed_out
            assert await tools.check("sleep 10") is False
            await tools.write_file("sub/f.txt", "text")
            assert await tools.check('test "$(cat sub/f.txt)" = text')
            assert await tools.read_file("sub/f.txt") == "text"
            with pytest.raises(SlotFileError):
                await tools.read_file("missing.txt")
            with pytest.raises(SlotInfraError):
                await tools.read_file("../outside")

            # The slot server dies: the verification has no answer, so it raises.
            os.kill(pool.server_pid(tools.lease.slot.container), signal.SIGKILL)
            with pytest.raises(SlotInfraError, match="infra_error"):
                await tools.check("true")
            with pytest.raises(SlotInfraError):  # the lease is lost with its container
                await tools.run("true")
    await wait_no_leftovers(groups, run_dir, before)
