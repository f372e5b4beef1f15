"""A number the model writes past a float's range (JSON reads ``1000...0`` as an int) in a slot
tool's ``timeout`` or the tmux tool's ``wait_s`` is a number like any other out of range: the
call runs under the env's limit, and the slot server, its other slots and their calls are
untouched. Through the local pool, with bubblewrap and tmux, on the path a call takes when its
lease's agent is already up and idle."""

from __future__ import annotations

import itertools
import shutil

import anyio
import pytest

from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("tmux") is None,
    reason="needs bubblewrap and tmux",
)
_ids = itertools.count(1)
HUGE = 10**400  # float(HUGE) raises OverflowError


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _call(lease: Lease, name: str, arguments: dict[str, JSON]) -> SlotCall:
    call = ToolCall(id=f"h{next(_ids)}", name=name, arguments=arguments)
    return SlotCall(lease=lease, call=call, timeout_s=10.0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tool", "arguments", "content"),
    [
        ("bash", {"command": "echo hi", "timeout": HUGE}, "hi\n"),
        ("tmux", {"keys": "echo hi", "wait_s": HUGE}, "echo hi"),
    ],
    ids=["bash-timeout", "tmux-wait_s"],
)
async def test_a_number_past_a_floats_range_fails_nothing(
    tool: str, arguments: dict[str, JSON], content: str
) -> None:
    config = LocalPoolConfig(
        containers=1,
        server=SlotServerSettings(
            slots_per_container=2, acquire_timeout_s=30.0,
            isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.2),
        ),
    )  # fmt: skip
    async with (
        LocalSandboxPool(config) as pool,
        pool.lease("bystander") as other,
        pool.lease("policy") as lease,
    ):
        name = lease.slot.container
        for held in (lease, other):  # each lease's agent up and idle: the path without a task
            (ready,) = await pool.execute(name, [_call(held, "bash", {"command": "true"})])
            assert ready.outcome is ToolOutcome.OK, ready
        beside: list[ToolResult] = []

        async def bystander() -> None:
            call = _call(other, "bash", {"command": "sleep 1; echo fine"})
            beside.extend(await pool.execute(name, [call]))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(bystander)
                await anyio.sleep(0.3)
                (result,) = await pool.execute(name, [_call(lease, tool, arguments)])
        assert result.outcome is ToolOutcome.OK, result
        assert content in (result.content or ""), result
        assert [(r.outcome, r.content) for r in beside] == [(ToolOutcome.OK, "fine\n")]
        (after,) = await pool.execute(name, [_call(lease, "bash", {"command": "echo still"})])
        assert (after.outcome, after.content) == (ToolOutcome.OK, "still\n")
        assert pool.restarts == 0
        assert name in pool.container_names()
