"""A policy that fills its disk is scored, not dropped: real slot servers, real bubblewrap, a small
disk budget, a scripted model. The slot server ends the lease that passes its budget and marks
the call's result; the trajectory ends there as ``sandbox_budget``, with the env's
``sandbox_budget_score`` and its score hook never called, and the group keeps it. Before, the
model went on, the hook's check raised in the ended lease, and the member was an
``infra_error``, left out of training."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
import pytest

from tests.integration.test_local_pool import config, running_now, wait_no_leftovers
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import SlotBudgetSpent
from trajcore.domain.groups import GroupRules, TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.tools import SandboxBudget, ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.scripted import ScriptedPolicy, ScriptStep, tool_call
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BUDGET = 4 << 20
FILL = f"head -c {2 * BUDGET} /dev/zero > fill; sleep 10"  # ended while it sleeps
ROLLOUT = RolloutConfig(
    agent=AgentLoopConfig(max_turns=4),
    tool_timeout_s=20.0,
    deadline_s=60.0,
    acquire_timeout_s=30.0,
    sandbox_budget_score=-0.5,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def script(messages: Sequence[Message]) -> ScriptStep:
    """The model: fills its disk or writes one small file, as its task says, then answers."""
    if any(message.role == "tool" for message in messages):
        return "done"
    task = next(message.content for message in messages if message.role == "user")
    return tool_call("bash", command=FILL if task == "fill" else "echo ok > small")


@attrs.define
class Hooks:
    scored: list[str] = attrs.field(factory=list)

    async def prepare(self, tools: SlotTools) -> None:
        return None

    async def score(self, tools: SlotTools, transcript: Transcript) -> float:
        self.scored.append(transcript.trajectory_id)
        return 1.0 if await tools.check("test -s small") else 0.0


async def _members(
    pool: LocalSandboxPool, hooks: Hooks, runs: dict[str, tuple[str, RolloutConfig]]
) -> dict[str, TrajectoryResult]:
    """Run one trajectory per ``runs`` entry (id: task, config) at once, on ``pool``."""
    results: dict[str, TrajectoryResult] = {}
    trajectory_hooks = TrajectoryHooks(prepare=hooks.prepare, score=hooks.score)

    async def member(tid: str, task: str, rollout: RolloutConfig) -> None:
        results[tid] = await run_trajectory(
            trajectory_id=tid,
            messages=[Message.system("You work in a slot."), Message.user(task)],
            tools=SLOT_TOOL_SPECS,
            hooks=trajectory_hooks,
            policy=ScriptedPolicy.openai(script),
            pool=pool,
            dispatcher=dispatcher,
            tool_server=None,
            config=rollout,
        )

    async with ToolDispatcher(pool, BatchConfig()) as dispatcher, anyio.create_task_group() as tg:
        for tid, (task, rollout) in runs.items():
            tg.start_soon(member, tid, task, rollout)
    return results


async def test_a_member_that_fills_its_disk_is_scored_by_the_setting_and_kept() -> None:
    before = running_now()
    base = config(containers=1, slots=3)
    isolation = attrs.evolve(base.server.isolation, disk_bytes=BUDGET)
    budgeted = attrs.evolve(base, server=attrs.evolve(base.server, isolation=isolation))
    hooks = Hooks()
    async with LocalSandboxPool(budgeted) as pool:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        left_out = attrs.evolve(ROLLOUT, sandbox_budget_score=None)
        results = await _members(
            pool,
            hooks,
            {"filler": ("fill", ROLLOUT), "solver": ("small", ROLLOUT), "old": ("fill", left_out)},
        )
    await wait_no_leftovers(groups, run_dir, before)

    filler = results["filler"]
    assert filler.stats.stop_reason is StopReason.SANDBOX_BUDGET, filler.outcome
    assert filler.stats.turns == 1  # the turn that got the budget's answer ended it
    assert (filler.outcome.status, filler.outcome.score) == (
        TrajectoryStatus.BUDGET_EXHAUSTED,
        -0.5,
    )
    detail = filler.outcome.detail or ""
    assert f"disk budget of {BUDGET} bytes (disk_bytes) reached" in detail
    assert "writable area holds at least" in detail  # what was measured
    assert "score hook was not run" in detail
    assert "filler" not in hooks.scored  # its check could not run in the ended lease
    (exchange,) = filler.exchanges
    assert exchange.result.outcome is ToolOutcome.TOOL_ERROR
    assert exchange.result.sandbox_budget is SandboxBudget.DISK
    last = filler.messages[-1]  # the tool message the model saw stays in the transcript
    assert [m.role for m in filler.messages] == ["system", "user", "assistant", "tool"]
    assert last.content == exchange.result.content
    assert "disk budget of" in last.content

    solver = results["solver"]
    assert (solver.stats.stop_reason, solver.outcome.score) == (StopReason.NATURAL, 1.0)
    assert "solver" in hooks.scored

    rules = GroupRules(group_size=2, min_healthy=2)
    verdict = rules.assess([filler.outcome, solver.outcome])
    assert verdict.drop_reason is None, verdict.detail
    assert (verdict.kept, verdict.scores) == ((0, 1), (-0.5, 1.0))

    # sandbox_budget_score None: left out, as before, and never scored by the hook either
    old = results["old"]
    assert old.stats.stop_reason is StopReason.SANDBOX_BUDGET
    assert (old.outcome.status, old.outcome.score) == (TrajectoryStatus.INFRA_ERROR, None)
    assert "left out" in (old.outcome.detail or "")
    assert "old" not in hooks.scored
    verdict = rules.assess([old.outcome, solver.outcome])
    assert (verdict.failed, verdict.kept) == ((0,), ())


LATE_FILL = f"(sleep 2; head -c {2 * BUDGET} /dev/zero > fill) > /dev/null 2>&1 &"


def late_script(messages: Sequence[Message]) -> ScriptStep:
    """The model: leaves a writer that fills its disk after its last turn, then answers."""
    if any(message.role == "tool" for message in messages):
        return "done"
    return tool_call("bash", command=LATE_FILL)


async def test_a_lease_ended_for_its_disk_while_the_hook_waits_is_scored_by_the_setting() -> None:
    """The budget ends the lease after the model's last call was answered: the score hook's
    check meets the ended lease (``SlotBudgetSpent``), and the member gets the setting's score,
    not ``infra_error``."""
    before = running_now()
    base = config(containers=1, slots=1)
    isolation = attrs.evolve(base.server.isolation, disk_bytes=BUDGET)
    budgeted = attrs.evolve(base, server=attrs.evolve(base.server, isolation=isolation))
    raised: list[BaseException] = []

    async def score(tools: SlotTools, transcript: Transcript) -> float:
        await anyio.sleep(6.0)  # the writer starts 2 s after its call; the watch ends the lease
        try:
            return 1.0 if await tools.check("test -s small") else 0.0
        except SlotBudgetSpent as error:
            raised.append(error)
            raise

    async with LocalSandboxPool(budgeted) as pool, ToolDispatcher(pool, BatchConfig()) as calls:
        groups = {pool.server_pid(name) for name in pool.container_names()}
        run_dir = pool.run_dir
        result = await run_trajectory(
            trajectory_id="late",
            messages=[Message.system("You work in a slot."), Message.user("fill later")],
            tools=SLOT_TOOL_SPECS,
            hooks=TrajectoryHooks(prepare=Hooks().prepare, score=score),
            policy=ScriptedPolicy.openai(late_script),
            pool=pool,
            dispatcher=calls,
            tool_server=None,
            config=ROLLOUT,
        )
    await wait_no_leftovers(groups, run_dir, before)

    assert result.stats.stop_reason is StopReason.NATURAL  # the model's calls all answered
    assert len(raised) == 1, result.outcome
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.FINISHED, -0.5)
    detail = result.outcome.detail or ""
    assert "score hook: bash 'test -s small'" in detail
    assert "ended for its disk budget" in detail
    assert "scored sandbox_budget_score=-0.5" in detail
