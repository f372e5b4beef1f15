"""A score or prepare hook still running at the trajectory's deadline
(``rollout.hook_deadline``): the detail names where it waited (its frame in the env's code, and
the call of its tools that had not answered); ``infra_error`` when it waited on such a call,
``env_error`` when it waited in its own code. Never a score."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import anyio
import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.scripted import ScriptedPolicy, ScriptStep
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

pytestmark = pytest.mark.anyio

CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=5),
    tool_timeout_s=3.0,  # a hook's sleep in the slot outlasts the deadline (the lease ends with it)
    deadline_s=1.5,
    acquire_timeout_s=1.0,
)
Score = Callable[[SlotTools, Transcript], Awaitable[float]]
Prepare = Callable[[SlotTools], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def done(messages: Sequence[Message]) -> ScriptStep:
    return "done"


async def _nothing(tools: SlotTools) -> None:
    return None


async def _unscored(tools: SlotTools, transcript: Transcript) -> float:
    raise AssertionError("a member whose prepare hook did not finish is never scored")


async def _run(score: Score, prepare: Prepare = _nothing) -> TrajectoryResult:
    async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        with anyio.fail_after(CONFIG.deadline_s + 10):
            result = await run_trajectory(
                trajectory_id="t0",
                messages=[Message.user("Say done.")],
                tools=SLOT_TOOL_SPECS,
                hooks=TrajectoryHooks(prepare=prepare, score=score),
                policy=ScriptedPolicy.openai(done),
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=CONFIG,
            )
        assert pool.statistics().leased == 0
    return result


async def _checked(tools: SlotTools) -> bool:
    return await tools.check("sleep 60")  # a helper of the env's, where the hook waits


async def in_the_slot(tools: SlotTools, transcript: Transcript) -> float:
    return 1.0 if await _checked(tools) else 0.0


async def in_its_own_code(tools: SlotTools, transcript: Transcript) -> float:
    assert await tools.check("true")  # answered: no call pending when it hangs below
    await asyncio.sleep(1e9)
    return 1.0


async def test_a_hook_waiting_on_a_slot_call_names_the_call_and_its_line() -> None:
    result = await _run(in_the_slot)
    assert result.outcome.status is TrajectoryStatus.INFRA_ERROR
    assert result.outcome.score is None
    line = _line('await tools.check("sleep 60")')
    assert result.outcome.detail == (
        "score hook did not finish before the trajectory deadline: it was waiting on "
        f"bash 'sleep 60', which had not answered (at test_hook_deadline.py:{line} in _checked)"
    )


async def test_a_hook_waiting_in_its_own_code_is_the_envs_error_naming_its_line() -> None:
    result = await _run(in_its_own_code)
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert result.outcome.score is None
    assert result.outcome.detail == (
        "score hook did not finish before the trajectory deadline: it was waiting in the "
        "env's own code, on no call of its tools "
        f"(at test_hook_deadline.py:{_line('await asyncio.sleep(1e9)')} in in_its_own_code)"
    )


async def preparing_in_the_slot(tools: SlotTools) -> None:
    await tools.run("sleep 60")


async def preparing_in_its_own_code(tools: SlotTools) -> None:
    await tools.run("true")  # answered: no call pending when it hangs below
    await asyncio.sleep(1e9)


async def test_a_prepare_hook_waiting_on_a_slot_call_names_the_call_and_its_line() -> None:
    result = await _run(_unscored, prepare=preparing_in_the_slot)
    assert result.outcome.status is TrajectoryStatus.INFRA_ERROR
    assert result.outcome.score is None
    assert result.stats.turns == 0
    line = _line('await tools.run("sleep 60")')
    assert result.outcome.detail == (
        "prepare hook did not finish before the trajectory deadline: it was waiting on bash "
        f"'sleep 60', which had not answered (at test_hook_deadline.py:{line} in "
        "preparing_in_the_slot)"
    )


async def test_a_prepare_hook_waiting_in_its_own_code_is_the_envs_error_naming_its_line() -> None:
    result = await _run(_unscored, prepare=preparing_in_its_own_code)
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert result.outcome.score is None
    line = _line("await asyncio.sleep(1e9)", after="def preparing_in_its_own_code")
    assert result.outcome.detail == (
        "prepare hook did not finish before the trajectory deadline: it was waiting in the "
        f"env's own code, on no call of its tools (at test_hook_deadline.py:{line} in "
        "preparing_in_its_own_code)"
    )


def _line(text: str, after: str = "") -> int:
    """The line of this file that holds ``text``, the first below the line that holds ``after``."""
    with open(__file__, encoding="utf-8") as source:
        lines = list(enumerate(source, 1))
    start = next(n for n, line in lines if after in line and "_line(" not in line)
    return next(n for n, line in lines[start - 1 :] if text in line and "_line(" not in line)
