"""The hooks' calls are marked as theirs all the way to the slot's agent (``SlotCall.hook``,
``ExecuteCall.hook``, a ``verify`` request), so their commands may use the process reserve the
model's commands leave free; the model's calls never carry the mark."""

from __future__ import annotations

import json

import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.batch_wire import batch_body
from trajcore.adapters.slot_server.codec import decode, encode
from trajcore.adapters.slot_server.limits import command_process_limit
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import InvalidInput, WireError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_protocol import SLOT_TOOLS, ExecuteCall, ExecuteRequest, execute_call
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.tools import SlotTools, ToolRouter

LEASE = Lease(slot=SlotId(container="c", index=2), epoch=3, holder="t")
CALL = ToolCall(id="k", name="bash", arguments={"command": "true"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("hook", [True, False])
def test_the_mark_travels_on_the_wire_and_reads_back(hook: bool) -> None:
    slot_call = SlotCall(lease=LEASE, call=CALL, timeout_s=5.0, hook=hook)
    wire = execute_call(slot_call)
    assert wire.hook is hook
    request = ExecuteRequest(calls=[wire])
    body = encode(request)
    assert json.loads(body)["calls"][0]["hook"] is hook
    assert decode(body, ExecuteRequest) == request
    fast = batch_body([slot_call])  # the env's fast path writes the same bytes
    assert fast is not None
    assert fast[0] == body


def test_a_call_without_the_mark_is_the_models() -> None:
    """A client from before the mark sends none: its calls are not the hooks'."""
    body = {"calls": [{"slot": 0, "epoch": 1, "call_id": "k", "tool": "bash", "timeout_s": 1.0}]}
    (call,) = decode(json.dumps(body), ExecuteRequest).calls
    assert call.hook is False


@pytest.mark.parametrize("bad", ["yes", 1, None, [True]])
def test_a_mark_that_is_not_a_boolean_is_refused_naming_it(bad: object) -> None:
    body = {
        "calls": [
            {"slot": 0, "epoch": 1, "call_id": "k", "tool": "bash", "timeout_s": 1.0, "hook": bad}
        ]
    }
    with pytest.raises(WireError) as refused:
        decode(json.dumps(body), ExecuteRequest)
    assert "hook" in str(refused.value)
    with pytest.raises(WireError, match="hook"):
        ExecuteCall(slot=0, epoch=1, call_id="k", tool="bash", timeout_s=1.0, hook=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="hook"):
        SlotCall(lease=LEASE, call=CALL, timeout_s=1.0, hook=bad)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_hooks_calls_carry_the_mark_and_the_models_do_not() -> None:
    async with (
        FakeSandboxPool() as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=5.0) as lease,
    ):
        router = ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=None,
            offered=frozenset(SLOT_TOOLS), tool_timeout_s=5.0, trajectory_id="t",
        )  # fmt: skip
        await router.run([ToolCall(id="m", name="bash", arguments={"command": "true"})])
        tools = SlotTools(router)
        assert await tools.check("true")
        await tools.write_file("f", "x")
    marks = [(call.call_id.split("#")[0], call.hook) for call in pool.executed]
    assert marks == [("m", False), ("ctx_0", True), ("ctx_1", True)]


@pytest.mark.parametrize(
    ("limit", "own_count", "cgroup_pids", "expected"),
    [
        (32, True, True, 24),  # a quarter of the limit is the hooks'
        (256, True, True, 192),
        (5, True, True, 4),
        (4, False, False, 3),  # no cgroup: the rlimit counts the same user as the agent's
        (3, True, True, None),  # too small to share
        (None, True, True, None),  # no limit, no reserve
        (32, False, True, None),  # the cgroup counts the slot, an rlimit would count more
    ],
)
def test_the_commands_limit_leaves_the_hooks_a_quarter(
    limit: int | None, own_count: bool, cgroup_pids: bool, expected: int | None
) -> None:
    isolation = SlotIsolation(max_processes=limit)
    found = command_process_limit(isolation, own_count=own_count, cgroup_pids=cgroup_pids)
    assert found == expected
