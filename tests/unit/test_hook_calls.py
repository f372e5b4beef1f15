"""The hooks' calls are marked as theirs all the way to the slot's agent (``SlotCall.hook``,
``ExecuteCall.hook``, a ``verify`` request), so their commands may use the process reserve the
model's commands leave free; the model's calls never carry the mark."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.batch_wire import batch_body
from trajcore.adapters.slot_server.codec import decode, encode
from trajcore.adapters.slot_server.limits import CgroupPlan, SlotCgroup, command_process_limit
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.sandboxes import Sandboxes
from trajcore.adapters.slot_server.slot_state import Slot
from trajcore.adapters.slot_server.workspace import Workspace
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import InvalidInput, WireError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_protocol import SLOT_TOOLS, ExecuteCall, ExecuteRequest, execute_call
from trajcore.domain.slots import Lease, SlotCall, SlotId
from trajcore.domain.tools import ToolCall, ToolOutcome
from trajcore.entrypoints.hermes_tool_context import run_env_tool
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


@asynccontextmanager
async def _router() -> AsyncIterator[tuple[FakeSandboxPool, ToolRouter]]:
    """A fake pool and the model's router over one lease of it."""
    async with (
        FakeSandboxPool() as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=5.0) as lease,
    ):
        yield pool, ToolRouter(
            lease=lease, dispatcher=dispatcher, tool_server=None,
            offered=frozenset(SLOT_TOOLS), tool_timeout_s=5.0, trajectory_id="t",
        )  # fmt: skip


@pytest.mark.anyio
async def test_the_hooks_calls_carry_the_mark_and_the_models_do_not() -> None:
    async with _router() as (pool, router):
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


@pytest.mark.anyio
async def test_a_seed_tool_context_call_is_the_hooks_too() -> None:
    """hermes-agent's ``ToolContext`` (``ctx.terminal(...)`` in a ported env's score code) goes
    through ``run_env_tool``: its calls carry the mark as ``SlotTools``' do."""
    async with _router() as (pool, router):
        await run_env_tool(SlotTools(router), "terminal", {"command": "true"})
    assert [call.hook for call in pool.executed] == [True]


@pytest.mark.parametrize(
    ("sandboxed", "expected"),
    [
        (True, 24),  # the lease's user is the slot's own: the reserve holds
        (False, None),  # a bare agent runs as the server's user (root here): no reserve
    ],
)
def test_a_bare_agent_under_a_root_server_with_a_cgroup_gets_no_reserve(
    tmp_path: Path, sandboxed: bool, expected: int | None
) -> None:
    """A root server gives each sandboxed slot a uid of its own, but an unsandboxed (``bare``)
    agent runs as root, whom ``RLIMIT_NPROC`` never binds: a reserve there would be a promise
    the kernel does not keep, while the cgroup's ``pids.max`` counts the slot's processes."""
    isolation = SlotIsolation(max_processes=32)
    sandboxes = Sandboxes(
        config=RuntimeConfig(slots=1, root=tmp_path, isolation=isolation), uid_base=100_000
    )
    plan = CgroupPlan(version=2, pids_parent=tmp_path / "pids", memory_parent=None)
    slot = Slot(
        index=0,
        workspace=Workspace(tmp_path / "w"),
        state_dir=tmp_path / "s",
        cgroup=SlotCgroup(plan=plan, name="slot-0"),
    )
    assert sandboxes.agent_config(slot, sandboxed=sandboxed)["command_nproc"] == expected


@pytest.mark.anyio
@pytest.mark.parametrize("time_left_s", [0.0, -1.5])
async def test_a_turn_asked_for_past_its_deadline_starts_no_call(time_left_s: float) -> None:
    """The model answered after the turns' deadline: its calls are ``TIMEOUT`` unrun (a command
    started even for a moment could change what is scored), an unknown tool still refused as
    one, and nothing reaches the slot."""
    calls = [
        ToolCall(id="a", name="bash", arguments={"command": "rm -rf *"}),
        ToolCall(id="b", name="nowhere", arguments={}),
    ]
    async with _router() as (pool, router):
        first, second = await router.run_turn(calls, time_left_s, None, 1.0)
    assert (first.call_id, first.outcome) == ("a", ToolOutcome.TIMEOUT)
    assert first.error == "not run: its turn's time had run out when the model asked for it"
    assert (second.call_id, second.outcome) == ("b", ToolOutcome.REJECTED)
    assert pool.executed == []
