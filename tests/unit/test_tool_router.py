"""The tool router sends each of a trajectory's slot calls under an id of its own: a model's
call ids need be unique only within a turn, and a slot answers a repeated id with the first
result (a retry), so a reused ``call_0`` must never get an earlier turn's answer."""

from __future__ import annotations

import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.slot_protocol import SLOT_TOOLS
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import ToolRouter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_call_id_reused_in_a_later_turn_runs_again() -> None:
    async with (
        FakeSandboxPool() as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=5.0) as lease,
    ):
        router = ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=None, offered=frozenset(SLOT_TOOLS),
            tool_timeout_s=5.0, trajectory_id="t",
        )  # fmt: skip
        write = ToolCall(id="call_0", name="write_file", arguments={"path": "a", "content": "1"})
        read = ToolCall(id="call_0", name="read_file", arguments={"path": "a"})
        (first,) = await router.run([write])
        (second,) = await router.run([read])
    assert first.outcome is ToolOutcome.OK
    assert (second.outcome, second.content) == (ToolOutcome.OK, "1")
    assert (first.call_id, second.call_id) == ("call_0", "call_0")
