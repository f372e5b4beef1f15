"""A policy that stalls is scored, not dropped: real slot servers, real bubblewrap, a scripted
model that writes its answer and then sleeps in the slot, turn after turn. Its turns end at the
turns' deadline (``deadline_s`` less the score reserve), its sleep is killed there (the call's
timeout was cut to end there), and the score hook's check runs in the same lease before the
trajectory's deadline: ``time_budget``, healthy, with the hook's score. Before, the deadline
took the lease with the hook unrun, and the member was an ``infra_error``, left out. The same
holds for a turn of several long calls, which the slot runs one after another: they share the
time the turn has left."""

from __future__ import annotations

import anyio
import attrs
import pytest

from tests.integration.test_local_pool import config, running_now, wait_no_leftovers
from tests.turn_deadlines import check_long_calls_ended_at_the_turns_deadline, sleeping_after
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.scripted import ModelScript, ScriptedPolicy, tool_call
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DEADLINE_S = 10.0  # the default reserve: a tenth, 1 s
SLACK_S = 1.0  # the release and the result past the deadline, on a loaded machine
ROLLOUT = RolloutConfig(
    agent=AgentLoopConfig(max_turns=50),
    tool_timeout_s=30.0,  # one sleep would outlast the whole deadline
    deadline_s=DEADLINE_S,
    acquire_timeout_s=30.0,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


ANSWER = tool_call("bash", command="echo ok > answer")
stalling = sleeping_after(ANSWER)
"""The model: writes its answer, then sleeps, turn after turn, never done."""
sleepers = sleeping_after(ANSWER, calls=3)
"""The model: writes its answer, then makes three long calls in one turn, turn after turn."""


@attrs.define
class Hooks:
    scored_at: list[float] = attrs.field(factory=list)

    async def prepare(self, tools: SlotTools) -> None:
        return None

    async def score(self, tools: SlotTools, transcript: Transcript) -> float:
        self.scored_at.append(anyio.current_time())
        return 1.0 if await tools.check("test -s answer") else 0.0


@attrs.frozen(kw_only=True)
class Run:
    """A trajectory run in a local pool's one slot: its result, how long it took, and when the
    score hook started (seconds from the run's start), one entry a call."""

    result: TrajectoryResult
    took_s: float
    scored_at_s: list[float]


async def run_in_a_slot(script: ModelScript, *, trajectory_id: str, deadline_s: float) -> Run:
    """``script``'s trajectory in a local pool of one slot, with the deadline ``deadline_s``
    and ``Hooks``; the pool's processes (a sleep killed with its lease) are checked gone."""
    before = running_now()
    hooks = Hooks()
    async with LocalSandboxPool(config(containers=1, slots=1)) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        async with ToolDispatcher(pool, BatchConfig()) as dispatcher:
            started = anyio.current_time()
            with anyio.fail_after(deadline_s + 20):
                result = await run_trajectory(
                    trajectory_id=trajectory_id,
                    messages=[Message.system("You work in a slot."), Message.user("answer")],
                    tools=SLOT_TOOL_SPECS,
                    hooks=TrajectoryHooks(prepare=hooks.prepare, score=hooks.score),
                    policy=ScriptedPolicy.openai(script),
                    pool=pool,
                    dispatcher=dispatcher,
                    tool_server=None,
                    config=attrs.evolve(ROLLOUT, deadline_s=deadline_s),
                )
            took_s = anyio.current_time() - started
    await wait_no_leftovers(groups, run_dir, before)
    return Run(result=result, took_s=took_s, scored_at_s=[at - started for at in hooks.scored_at])


async def test_a_model_sleeping_past_its_turns_is_scored_in_its_lease_within_the_deadline() -> None:
    run = await run_in_a_slot(stalling, trajectory_id="stalls", deadline_s=DEADLINE_S)
    result = run.result
    assert result.stats.stop_reason is StopReason.TIME_BUDGET, result.outcome
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.BUDGET_EXHAUSTED, 1.0)
    assert "score_reserve_s=1 s" in (result.stats.detail or "")
    assert [e.call.arguments["command"] for e in result.exchanges][:1] == ["echo ok > answer"]
    (scored_at_s,) = run.scored_at_s
    assert scored_at_s <= DEADLINE_S - 0.5  # it started with most of the reserve left
    assert run.took_s <= DEADLINE_S + SLACK_S


async def test_a_turn_of_several_long_calls_ends_at_the_turns_deadline_and_is_scored() -> None:
    """Three ``sleep 60`` in one turn, a 6 s deadline: the slot server runs them one after
    another within the time the turn has left (the first is killed at the turns' deadline, the
    others are answered ``TIMEOUT`` unrun), their results reach the transcript, and the hook's
    check runs in the lease. Before, each had the whole time left, the slot was busy with them
    past the trajectory's deadline, and the member was an ``infra_error`` with none of them."""
    deadline_s = 6.0
    run = await run_in_a_slot(sleepers, trajectory_id="sleepers", deadline_s=deadline_s)
    check_long_calls_ended_at_the_turns_deadline(run.result, calls=3)
    assert len(run.scored_at_s) == 1  # its command ran
    assert run.took_s <= deadline_s + SLACK_S
