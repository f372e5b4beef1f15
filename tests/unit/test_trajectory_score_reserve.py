"""The last part of a trajectory's deadline is kept for scoring (``score_reserve_s``), against the
shipped fakes: a model still working when its turns' deadline passes ends as ``time_budget`` and
is scored in its lease; a score hook longer than the time left still fails, unscored."""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
import attrs
import pytest

from tests.turn_deadlines import check_long_calls_ended_at_the_turns_deadline, sleeping_after
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.fakes.tools import FakeToolServer, ToolFault
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.errors import ConfigError
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.tools import ToolOutcome, ToolSpec
from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.entrypoints.atropos.tasks import member_rollout
from trajcore.ports.tool_server import ToolServer
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.scripted import ModelScript, ScriptedPolicy, ScriptStep, tool_call
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

pytestmark = pytest.mark.anyio

DEADLINE_S = 2.0
SLACK_S = 0.5  # the run's own steps past the deadline (release, result), on a loaded machine
CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=50),
    tool_timeout_s=30.0,  # one sleep would outlast the whole deadline
    deadline_s=DEADLINE_S,  # the default reserve: a tenth of it, 0.2 s
    acquire_timeout_s=1.0,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


ANSWER = tool_call("write_file", path="done.txt", content="ok")
stalling = sleeping_after(ANSWER)
"""The model: writes its answer, then sleeps in the slot, turn after turn, never done."""
sleepers = sleeping_after(ANSWER, calls=3)
"""The model: writes its answer, then makes three long calls in one turn, turn after turn."""


def quick(messages: Sequence[Message]) -> ScriptStep:
    """The model: writes its answer and is done."""
    if not any(message.role == "tool" for message in messages):
        return ANSWER
    return "done"


@attrs.define
class Scoring:
    """A score hook that takes ``takes_s`` and scores the answer file; records each call."""

    takes_s: float = 0.0
    started: list[float] = attrs.field(factory=list)

    async def prepare(self, tools: SlotTools) -> None:
        return None

    async def score(self, tools: SlotTools, transcript: Transcript) -> float:
        self.started.append(anyio.current_time())
        await anyio.sleep(self.takes_s)
        return 1.0 if await tools.read_file("done.txt") == "ok" else 0.0


async def _run(
    script: ModelScript,
    scoring: Scoring,
    config: RolloutConfig = CONFIG,
    *,
    tools: Sequence[ToolSpec] = SLOT_TOOL_SPECS,
    tool_server: ToolServer | None = None,
) -> TrajectoryResult:
    async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        with anyio.fail_after(config.deadline_s + 10):
            result = await run_trajectory(
                trajectory_id="t0",
                messages=[Message.system("You fix things."), Message.user("Write done.txt.")],
                tools=tools,
                hooks=TrajectoryHooks(prepare=scoring.prepare, score=scoring.score),
                policy=ScriptedPolicy.openai(script),
                pool=pool,
                dispatcher=dispatcher,
                tool_server=tool_server,
                config=config,
            )
        assert pool.statistics().leased == 0
    return result


@pytest.mark.parametrize("tool_timeout_s", [30.0, 1.0])
async def test_a_model_still_sleeping_at_the_turns_deadline_is_scored_within_the_deadline(
    tool_timeout_s: float,
) -> None:
    """Its sleep is ended at the turns' deadline (one of 30 s: it gets the turn's time left,
    so the slot is free for the hook's read), its result is kept, and the hook scores the
    answer file."""
    scoring = Scoring()
    result = await _run(stalling, scoring, attrs.evolve(CONFIG, tool_timeout_s=tool_timeout_s))
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert result.stats.turns >= 2  # it wrote its answer, then slept
    *_, turn, last = result.messages  # its sleep's result came at the turns' end, the last
    assert [call.arguments for call in turn.tool_calls] == [{"command": "sleep 60"}]
    assert (last.role, last.tool_call_id) == ("tool", turn.tool_calls[0].id)
    assert result.exchanges[-1].result.outcome is ToolOutcome.TIMEOUT
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.BUDGET_EXHAUSTED, 1.0)
    assert result.stats.detail == (
        "the turns' deadline passed (deadline_s=2 s less score_reserve_s=0.2 s, kept for scoring)"
    )
    assert len(scoring.started) == 1
    assert result.duration_s <= DEADLINE_S + SLACK_S


async def test_a_turn_of_several_long_calls_ends_at_the_turns_deadline_and_is_scored() -> None:
    """The turn's three sleeps run one after another in the slot, but share the time the turn
    has left (each cut to its whole would take three times that): the first is ended at the
    turns' deadline, the others are answered ``TIMEOUT`` unrun, all three results are kept,
    and the hook's read finds the slot free. Before, the slot was still busy with them at the
    trajectory's deadline: ``infra_error``, unscored, with none of the turn's results."""
    scoring = Scoring()
    result = await _run(sleepers, scoring)
    check_long_calls_ended_at_the_turns_deadline(result, calls=3)
    assert [e.call.name for e in result.exchanges].count("bash") == 3
    assert len(scoring.started) == 1
    assert result.duration_s <= DEADLINE_S + SLACK_S


def sleepers_and_a_lookup(messages: Sequence[Message]) -> ScriptStep:
    """The model: writes its answer, then two long slot calls and a tool server's call in one
    turn, turn after turn."""
    if not any(message.role == "tool" for message in messages):
        return ANSWER
    return [*(tool_call("bash", command="sleep 60") for _ in range(2)), tool_call("lookup", q="x")]


async def test_a_turn_mixing_slot_calls_and_a_hanging_tool_server_is_scored() -> None:
    """The tool server's call runs beside the slot's and within the same time left: at the
    turns' deadline it is ``TIMEOUT`` (the policy's time), the slot calls' results are kept,
    and the member is scored. Before, it ran after them with no bound, and the turns ended
    with none of the turn's results: ``infra_error``, unscored."""
    lookup = ToolSpec(name="lookup", description="Look it up.", parameters={"type": "object"})
    server = FakeToolServer.with_tools([(lookup, lambda arguments, context: "found")])
    server.inject(*[ToolFault.hang()] * 20)
    scoring = Scoring()
    result = await _run(
        sleepers_and_a_lookup, scoring, tools=[*SLOT_TOOL_SPECS, lookup], tool_server=server
    )
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.BUDGET_EXHAUSTED, 1.0)
    last_turn = [e for e in result.exchanges if e.turn == result.exchanges[-1].turn]
    assert [e.call.name for e in last_turn] == ["bash", "bash", "lookup"]
    assert [e.result.outcome for e in last_turn] == [ToolOutcome.TIMEOUT] * 3
    assert "ran out before the tool server answered" in (last_turn[2].result.error or "")
    assert len(scoring.started) == 1
    assert result.duration_s <= DEADLINE_S + SLACK_S


async def test_the_reserve_set_is_the_time_a_late_score_hook_gets() -> None:
    """A hook of 1 s, more than the default reserve (0.2 s), scores with a reserve of 1.5 s: the
    turns end 1.5 s before the deadline, and the hook finishes within it."""
    config = attrs.evolve(CONFIG, deadline_s=3.0, score_reserve_s=1.5)
    scoring = Scoring(takes_s=1.0)
    result = await _run(stalling, scoring, config)
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.BUDGET_EXHAUSTED, 1.0)
    assert "score_reserve_s=1.5 s" in (result.stats.detail or "")
    assert 1.5 - SLACK_S <= result.stats.elapsed_s <= 1.5 + SLACK_S  # the turns' end
    assert result.duration_s <= 3.0 + SLACK_S


async def test_a_score_hook_slower_than_the_time_left_still_fails_unscored() -> None:
    """The control: the reserve is a floor, not more time; the deadline still bounds scoring.
    The hook waited in its own sleep, so the env's error (``test_hook_deadline``)."""
    scoring = Scoring(takes_s=30.0)
    result = await _run(stalling, scoring)
    assert len(scoring.started) == 1
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert result.outcome.status is TrajectoryStatus.ENV_ERROR
    assert result.outcome.score is None
    assert (result.outcome.detail or "").startswith(
        "score hook did not finish before the trajectory deadline: it was waiting in the "
        "env's own code"
    )
    assert "in score)" in (result.outcome.detail or "")
    assert result.duration_s <= DEADLINE_S + SLACK_S


async def test_a_member_that_finished_early_scores_with_all_the_time_left() -> None:
    scoring = Scoring(takes_s=1.0)  # past the turns' deadline (1.8 s from the start), not 2 s
    result = await _run(quick, scoring)
    assert result.stats.stop_reason is StopReason.NATURAL
    assert (result.outcome.status, result.outcome.score) == (TrajectoryStatus.FINISHED, 1.0)


@pytest.mark.parametrize(("deadline_s", "reserve_s"), [(1800.0, 60.0), (300.0, 30.0), (2.0, 0.2)])
def test_the_default_reserve_is_a_tenth_of_the_deadline_at_most_a_minute(
    deadline_s: float, reserve_s: float
) -> None:
    config = RolloutConfig(agent=AgentLoopConfig(max_turns=1), deadline_s=deadline_s)
    assert config.score_reserve_s is None
    assert config.score_reserve == pytest.approx(reserve_s)
    assert attrs.evolve(config, score_reserve_s=0.0).score_reserve == 0.0


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (-1.0, "finite seconds >= 0"),
        (math.nan, "finite seconds >= 0"),
        (math.inf, "finite seconds >= 0"),
        (True, "finite seconds >= 0"),
        ("5", "finite seconds >= 0"),
        (10.0, "must be below deadline_s=10"),
        (11, "must be below deadline_s=10"),
    ],
)
def test_a_reserve_that_is_not_a_part_of_the_deadline_is_refused(bad: object, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:
        RolloutConfig(agent=AgentLoopConfig(max_turns=1), deadline_s=10.0, score_reserve_s=bad)  # type: ignore[arg-type]
    assert caught.value.field == "score_reserve_s"


def test_the_env_setting_reaches_the_rollout_and_is_checked_against_slot_lifetime_s() -> None:
    assert AgentEnvConfig().settings().rollout.score_reserve == 54.0  # 540 s / 10
    assert AgentEnvConfig(score_reserve_s=5).settings().rollout.score_reserve_s == 5.0
    with pytest.raises(ConfigError, match="below deadline_s=540") as caught:
        AgentEnvConfig(score_reserve_s=540.0).settings()
    assert caught.value.field == "score_reserve_s"


async def test_a_member_whose_group_preparation_left_no_more_than_the_reserve_fails_naming_it() -> (
    None
):
    rollout = attrs.evolve(CONFIG, deadline_s=10.0, score_reserve_s=3.0)
    why = member_rollout(rollout, started=anyio.current_time() - 8.0)
    assert isinstance(why, str)
    assert "no more than score_reserve_s (3 s)" in why
    left = member_rollout(rollout, started=anyio.current_time() - 2.0)
    assert isinstance(left, RolloutConfig)
    assert left.score_reserve_s == 3.0
