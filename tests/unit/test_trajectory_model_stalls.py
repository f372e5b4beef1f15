"""A model call still in flight at the turns' deadline: the model server's failure
(``model_error``, never scored) when the run's ``model_stalled`` check says so, else the
policy's time (``time_budget``, scored as today). Against the shipped fakes and a real
atroposlib ``ServerManager`` for the Atropos env's check."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
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
    deadline_s=0.4,
    score_reserve_s=0.1,
    acquire_timeout_s=5.0,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _prepare(tools: SlotTools) -> None:
    return None


async def _score(tools: SlotTools, messages: Sequence[Message]) -> float:
    return 0.0


async def _run(chat: FakeChatServer, stalled: ModelStallCheck | None) -> TrajectoryResult:
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
                policy=ChatPolicy(chat),
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=CONFIG,
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
    (waited,) = waits  # asked once, with the call's wait: about the turns' 0.3 s
    assert 0.2 < waited < 5


async def test_a_model_call_the_check_clears_is_the_policys_time() -> None:
    result = await _run(_hanging(), lambda waited_s: None)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert result.outcome.status is TrajectoryStatus.BUDGET_EXHAUSTED


async def test_without_a_check_a_hanging_model_is_the_policys_time() -> None:
    result = await _run(_hanging(), None)
    assert result.stats.stop_reason is StopReason.TIME_BUDGET


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
