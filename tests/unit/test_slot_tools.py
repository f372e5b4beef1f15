"""Scores that cannot lie: ``SlotTools.check``/``run`` and the file helpers on the fake pool, and
a verification hit by an infrastructure failure marks the member failed, never 0."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest

from trajcore.adapters.fakes.llm import FakeChatServer
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import (
    InfrastructureError,
    InvalidInput,
    SlotFileError,
    SlotInfraError,
)
from trajcore.domain.groups import GroupRules, GroupStatus, TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS, SLOT_TOOLS
from trajcore.domain.slots import SlotCall
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.group import collect_group
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.tools import SlotTools, ToolRouter
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    run_trajectory,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def slot_tools(pool: SandboxPool, *, timeout_s: float = 5.0) -> AsyncIterator[SlotTools]:
    async with (
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
        pool.lease("t", timeout_s=5.0) as lease,
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


async def test_check_and_run_answer_what_the_command_did() -> None:
    async with FakeSandboxPool() as pool, slot_tools(pool) as tools:
        assert await tools.check("true") is True
        assert await tools.check("false") is False
        assert await tools.check("exit 3") is False
        report = await tools.run("echo hi")
        assert (report.exit_code, report.stdout, report.timed_out) == (0, "hi\n", False)
        assert (await tools.run("exit 3")).exit_code == 3


async def test_a_timeout_is_an_answer_not_a_failure() -> None:
    async with FakeSandboxPool() as pool, slot_tools(pool, timeout_s=0.05) as tools:
        report = await tools.run("sleep 1")
        assert report.timed_out
        assert report.exit_code is None
        assert await tools.check("sleep 1") is False


async def test_an_infra_error_raises_from_check_and_run() -> None:
    async with FakeSandboxPool(containers=1) as pool, slot_tools(pool) as tools:
        pool.crash_container(tools.lease.slot.container)
        with pytest.raises(SlotInfraError, match="infra_error"):
            await tools.check("true")
        # The crash lost the container: the lease ended with it, an infrastructure failure.
        with pytest.raises(SlotInfraError, match="infra_error: slot server fake-0 was lost"):
            await tools.run("true")
        with pytest.raises(SlotInfraError, match="infra_error: slot server fake-0 was lost"):
            await tools.read_file("x")


async def test_file_helpers_raise_slot_errors() -> None:
    async with FakeSandboxPool() as pool, slot_tools(pool) as tools:
        await tools.write_file("a/b.txt", "text")
        assert await tools.read_file("a/b.txt") == "text"
        with pytest.raises(SlotFileError) as info:
            await tools.read_file("missing.txt")
        assert info.value.path == "missing.txt"
        assert not isinstance(info.value, InfrastructureError)  # the env may score it 0


async def test_a_path_the_hook_got_wrong_is_its_own_error() -> None:
    """A hook's path that names no file of any workspace is the env's mistake: ``InvalidInput``
    naming ``path`` (an ``env_error``), raised before the call is sent; neither the model's
    ``SlotFileError`` (the env's ``except SlotFileError`` would score the model 0 for the env's
    own bug) nor the slot's ``SlotInfraError``. ``~`` is the workspace, so ``~//../etc/passwd``
    is ``../etc/passwd``."""
    async with FakeSandboxPool() as pool, slot_tools(pool) as tools:
        for path, why in [
            ("~//../etc/passwd", "'../etc/passwd' contains '..'"),
            ("../etc/passwd", "'../etc/passwd' contains '..'"),
            ("/abs.txt", "'/abs.txt' is absolute"),
        ]:
            with pytest.raises(InvalidInput, match=re.escape(f"read_file: {why}")) as info:
                await tools.read_file(path)
            assert info.value.field == "path"
            assert not isinstance(info.value, SlotFileError | InfrastructureError)
            with pytest.raises(InvalidInput, match=re.escape(f"write_file: {why}")):
                await tools.write_file(path, "x")
        assert pool.executed == []  # nothing was sent


async def test_text_of_the_hook_that_no_utf_8_carries_is_its_own_error() -> None:
    """A lone surrogate in a hook's file content or command (a model's ``\\udcff`` taken from
    its tool call's JSON) is ``InvalidInput`` naming the field, raised before the call is sent:
    the slot server refuses such a request, which read as the slot's ``SlotInfraError`` and
    turned the member into an infrastructure failure."""
    async with FakeSandboxPool() as pool, slot_tools(pool) as tools:
        with pytest.raises(InvalidInput, match="lone surrogate at 10") as info:
            await tools.write_file("answer.txt", "the model \udcff")
        assert info.value.field == "content"
        with pytest.raises(InvalidInput, match="lone surrogate at 5") as info:
            await tools.check("echo \udcff")
        assert info.value.field == "command"
        assert pool.executed == []  # nothing was sent


class _OlderServerPool(UnisolatedSandboxPool):
    """Answers a symlink leading out as slot servers before ``TOOL_ERROR`` for what a path
    finds did: ``REJECTED`` at ``$.path``."""

    def _escape(self, call: SlotCall) -> ToolResult:
        reason = f"{call.arguments['path']!r} leads out of the workspace @ $.path"
        return ToolResult.failure(call.call, ToolOutcome.REJECTED, reason)


async def test_a_server_that_refuses_what_a_path_finds_is_still_read_as_the_file() -> None:
    """A slot server that predates ``TOOL_ERROR`` for what a well-formed path finds refused a
    symlink leading out as ``REJECTED`` at ``$.path``: the hook gets ``SlotFileError`` there
    too (its path passed the hook-side check, so the refusal can only be of the file), and the
    model its 0."""
    async with _OlderServerPool() as pool, slot_tools(pool) as tools:
        (pool.slot_path(tools.lease.slot) / "out").symlink_to("/etc/hostname")
        raw = await tools.call("read_file", {"path": "out"})
        assert raw.outcome is ToolOutcome.REJECTED, raw
        with pytest.raises(SlotFileError, match="leads out of the workspace") as info:
            await tools.read_file("out")
        assert info.value.path == "out"


# ------------------------------------------------------------------- scoring in a trajectory

CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=3),
    sampling=SamplingParams(max_tokens=64),
    tool_timeout_s=5.0,
    deadline_s=30.0,
    acquire_timeout_s=5.0,
)
WRITE = ToolCall(id="c1", name="write_file", arguments={"path": "done.txt", "content": "ok"})


async def _prepare(tools: SlotTools) -> None:
    await tools.write_file("README", "task")


def _hooks(pool: FakeSandboxPool, crash_before_scoring: set[str]) -> TrajectoryHooks:
    async def score(tools: SlotTools, messages: Sequence[Message]) -> float:
        if tools.lease.holder in crash_before_scoring:
            pool.crash_container(tools.lease.slot.container)  # the verification is hit
        return 1.0 if await tools.check("cat done.txt") else 0.0

    return TrajectoryHooks(prepare=_prepare, score=score)


async def _member(
    pool: FakeSandboxPool, dispatcher: ToolDispatcher, tid: str, hooks: TrajectoryHooks
) -> TrajectoryResult:
    solves = tid != "t-wrong"
    chat = FakeChatServer(
        script=[
            Message.assistant("writing", tool_calls=[WRITE] if solves else []),
            Message.assistant("done"),
        ]
    )
    return await run_trajectory(
        trajectory_id=tid,
        messages=[Message.user("Create done.txt")],
        tools=SLOT_TOOL_SPECS,
        hooks=hooks,
        policy=ChatPolicy(chat),
        pool=pool,
        dispatcher=dispatcher,
        tool_server=None,
        config=CONFIG,
    )


async def test_a_verification_hit_by_an_infra_failure_fails_the_member_never_zero() -> None:
    # Four members, each in its own container; the one named t-hit loses its container while
    # its verification runs; t-wrong never writes the file and earns a real 0.
    async with (
        FakeSandboxPool(containers=4, slots_per_container=1) as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
    ):
        hooks = _hooks(pool, crash_before_scoring={"t-hit"})
        names = ["t-ok", "t-hit", "t-wrong", "t-ok2"]

        async def member(group_member: str) -> TrajectoryResult:
            index = int(group_member.rsplit("/", 1)[1])
            return await _member(pool, dispatcher, names[index], hooks)

        group = await collect_group(
            group_id="g",
            rules=GroupRules(group_size=4, min_healthy=2, drop_equal_scores=False),
            run_member=member,
        )
    by_name = {m.trajectory_id: m for m in group.members}
    hit = by_name["t-hit"].outcome
    assert hit.status is TrajectoryStatus.INFRA_ERROR
    assert hit.score is None
    assert "SlotInfraError" in (hit.detail or "") or "infra_error" in (hit.detail or "")
    assert by_name["t-wrong"].outcome.score == 0.0  # the control: a real zero stays a zero
    assert by_name["t-ok"].outcome.score == 1.0
    assert group.verdict.status is GroupStatus.PARTIAL
    assert [group.members[i].trajectory_id for i in group.verdict.kept] == [
        "t-ok",
        "t-wrong",
        "t-ok2",
    ]
    assert [m.outcome.score for m in group.kept] == [1.0, 0.0, 1.0]
