"""A model call still in flight at the turns' deadline: the model server's failure
(``model_error``, never scored) when the run's ``model_stalled`` check says so, else the
policy's time (``time_budget``, scored as today). Against the shipped fakes and a real
atroposlib ``ServerManager`` for the Atropos env's check."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio
import attrs
import pytest

from trajcore.adapters.fakes.llm import FakeChatServer, LLMFault
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.llm.atropos import server_manager_for, stall_check
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.groups import TrajectoryStatus
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.tools import ToolCall
from trajcore.entrypoints.idle_slots import IdleLimitedPolicy
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy, ModelStallCheck
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    run_trajectory,
)

pytestmark = pytest.mark.anyio

TASK = [Message.user("Create done.txt containing ok.")]
CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=4),
    sampling=SamplingParams(max_tokens=64),
    tool_timeout_s=5.0,
    deadline_s=3.0,
    score_reserve_s=1.0,
    acquire_timeout_s=5.0,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _prepare(tools: SlotTools) -> None:
    return None


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 0.0


async def _run(
    chat: FakeChatServer,
    stalled: ModelStallCheck | None,
    config: RolloutConfig = CONFIG,
    idle_s: float | None = None,
) -> TrajectoryResult:
    policy = ChatPolicy(chat)
    async with (
        FakeSandboxPool() as pool,
        ToolDispatcher(pool, BatchConfig()) as dispatcher,
    ):
        with anyio.fail_after(10):
            result = await run_trajectory(
                trajectory_id="t0",
                messages=TASK,
                tools=SLOT_TOOL_SPECS,
                hooks=TrajectoryHooks(prepare=_prepare, score=_score),
                policy=policy if idle_s is None else IdleLimitedPolicy(policy, idle_s),
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=config,
                model_stalled=stalled,
            )
        assert pool.statistics().leased == 0
    return result


def _hanging() -> FakeChatServer:
    chat = FakeChatServer(script=[Message.assistant("late")])
    chat.inject(LLMFault.delay(60.0))
    return chat


async def test_a_model_call_the_check_calls_stalled_is_a_model_error_without_score() -> None:
    waits: list[float] = []

    def stalled(waited_s: float) -> str | None:
        waits.append(waited_s)
        return "every model server is marked unhealthy"

    result = await _run(_hanging(), stalled)
    assert result.stats.stop_reason is StopReason.MODEL_ERROR
    assert result.outcome.status is TrajectoryStatus.MODEL_ERROR
    assert result.outcome.score is None
    assert result.stats.detail == ("at the turns' deadline: every model server is marked unhealthy")
    (waited,) = waits  # asked once, with the call's wait: about the turns' 2 s
    assert 0 < waited < 3


async def test_a_model_call_the_check_clears_is_the_policys_time() -> None:
    result = await _run(_hanging(), lambda waited_s: None)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert result.outcome.status is TrajectoryStatus.BUDGET_EXHAUSTED


async def test_without_a_check_a_hanging_model_is_the_policys_time() -> None:
    result = await _run(_hanging(), None)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET


async def test_a_stalled_call_at_the_slots_idle_limit_is_a_model_error() -> None:
    result = await _run(_hanging(), lambda waited_s: "every server is down", idle_s=0.3)
    assert result.stats.stop_reason is StopReason.MODEL_ERROR
    assert result.outcome.score is None
    assert result.stats.detail == "at the slot's idle limit: every server is down"


async def test_a_call_the_check_clears_at_the_idle_limit_is_that_budget() -> None:
    result = await _run(_hanging(), lambda waited_s: None, idle_s=0.3)
    assert result.stats.stop_reason is StopReason.IDLE_LIMIT


async def test_with_no_score_reserve_a_stalled_call_is_a_model_error_too() -> None:
    """The turns' deadline is the trajectory's: the check is asked there as well."""
    config = attrs.evolve(CONFIG, score_reserve_s=0.0)
    result = await _run(_hanging(), lambda waited_s: "every server is down", config)
    assert result.stats.stop_reason is StopReason.MODEL_ERROR
    assert result.outcome.status is TrajectoryStatus.MODEL_ERROR
    assert result.stats.detail is not None
    assert result.stats.detail.endswith(": every server is down")


async def test_the_deadline_in_a_tool_call_is_never_the_model_servers() -> None:
    """The model answered; the turns' time ran out in the tool call after it: ``time_budget``
    whatever the check would say of a model call."""
    call = ToolCall(id="c1", name="bash", arguments={"command": "sleep 30"})
    chat = FakeChatServer(script=[Message.assistant("", tool_calls=[call])])
    asked: list[float] = []

    def stalled(waited_s: float) -> str | None:
        asked.append(waited_s)
        return "stalled"

    result = await _run(chat, stalled)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert asked == []


# ------------------------------------------------------------------ the Atropos env's check


def _manager(*timeouts: int) -> object:
    return server_manager_for(
        [
            {
                "base_url": f"http://127.0.0.1:{9 + i}/v1",
                "model_name": "m",
                "api_key": "x",
                "timeout": t,
            }
            for i, t in enumerate(timeouts)
        ]
    )


def test_atropos_every_server_unhealthy_is_the_servers_failure() -> None:
    manager = _manager(1200, 1200)
    check = stall_check(manager)
    servers = manager.servers  # type: ignore[attr-defined]
    servers[0].server_healthy = False
    assert check(3.0) is None  # one server is still up: the call may be on it
    servers[1].server_healthy = False
    why = check(3.0)
    assert why is not None
    assert "every model server (2) is marked unhealthy by Atropos's health check" in why
    assert "waited 3.0 s" in why


def test_atropos_a_call_past_the_longest_request_timeout_is_the_servers_failure() -> None:
    check = stall_check(_manager(15, 20))
    assert check(19.9) is None  # within one request's limit on the slower server
    why = check(20.5)
    assert why is not None
    assert "waited 20.5 s, past openai.timeout=20 s for one request" in why


def test_atropos_a_timeout_that_cannot_fire_before_the_deadline_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="trajcore.llm"):
        stall_check(_manager(30), deadline_s=60.0)
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="trajcore.llm"):
        stall_check(_manager(1200), deadline_s=540.0)
    (record,) = caplog.records
    assert "openai.timeout=1200 s is not below the trajectory's deadline (540 s)" in (
        record.getMessage()
    )
    assert "set --openai.timeout below --env.slot_lifetime_s" in record.getMessage()
