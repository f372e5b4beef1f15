"""The persistent shell (``bash_stateful``, ``tmux``) under a policy that misbehaves in its own
lease, on the local pool with real bubblewrap and tmux: every such call ends as its own
``TIMEOUT`` or ``TOOL_ERROR`` within its time, never as an infrastructure failure, and the lease
goes on (a shell that had to be killed is started afresh by the next call)."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import AsyncIterator

import pytest

from tests.integration.test_local_pool import config
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.json_values import JSON
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is missing"),
]
_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pool() -> AsyncIterator[LocalSandboxPool]:
    async with LocalSandboxPool(config(containers=1, slots=1)) as running:
        yield running


async def one(
    pool: LocalSandboxPool, lease: Lease, tool: str, timeout_s: float = 10.0, **arguments: JSON
) -> tuple[ToolResult, float]:
    """The result of one call, and how long it took."""
    call = ToolCall(id=f"s{next(_ids)}", name=tool, arguments=arguments)
    started = time.monotonic()
    (result,) = await pool.execute(
        lease.slot.container, [SlotCall(lease=lease, call=call, timeout_s=timeout_s)]
    )
    return result, time.monotonic() - started


async def test_a_lost_exit_status_is_a_tool_error(pool: LocalSandboxPool) -> None:
    async with pool.lease("t") as lease:
        # the command fills /tmp, where the shell writes its status: the status file stays empty
        filled, _ = await one(
            pool, lease, "bash_stateful", command="dd if=/dev/zero of=/tmp/fill bs=1M; false"
        )
        assert filled.outcome is ToolOutcome.TOOL_ERROR, filled
        assert "exit status was lost" in (filled.error or "")
        freed, _ = await one(pool, lease, "bash", command="rm /tmp/fill")
        assert freed.outcome is ToolOutcome.OK
        after, _ = await one(pool, lease, "bash_stateful", command="false")
        assert (after.outcome, after.exec and after.exec.exit_code) == (ToolOutcome.OK, 1)
