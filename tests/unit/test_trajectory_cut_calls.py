"""A model's tool calls that the deadline cuts are answered, never left open: a call still
running (or waiting out ``tool_delay_s``) when the trajectory's time runs out gets a tool
message saying so (``TIMEOUT``), counted in ``tool_calls`` and ``tool_errors.timeout``, in both
modes, and the training tokens end with that answer, masked, after the model's trained call.
Before, the turn's calls were left without an answer in ``messages``, counted nowhere."""

from __future__ import annotations

import re

import anyio
import attrs
import pytest

from tests.turn_deadlines import sleeping_after
from tests.unit.test_agent_env import FileEnv, _config
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.domain.agent_loop import AgentLoopConfig, StopReason
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.messages import Message
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.domain.token_ledger.ledger import MASKED_LABEL
from trajcore.domain.tool_parsers import get_parser
from trajcore.domain.tools import ToolOutcome
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.scripted import ScriptedPolicy, tool_call
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
    agent=AgentLoopConfig(max_turns=50),
    tool_timeout_s=30.0,  # one sleep would outlast the whole deadline
    deadline_s=1.0,
    acquire_timeout_s=1.0,
)
CUT = re.compile(r"not finished: the (trajectory's|turns') deadline passed while it ran")
stalling = sleeping_after(tool_call("write_file", path="done.txt", content="ok"))
"""The model: writes its answer, then sleeps in the slot, turn after turn, never done."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def env() -> FileEnv:
    return FileEnv(_config(group_size=1, tool_call_parser="hermes"))


def _policy(env: FileEnv, mode: str) -> ScriptedPolicy:
    if mode == "openai":
        return ScriptedPolicy.openai(stalling, template=env.chat_template())
    return ScriptedPolicy.managed(
        stalling,
        tokenizer=env.tokenizer_port(),
        template=env.chat_template(),
        parser=get_parser("hermes"),
    )


async def _prepare(tools: SlotTools) -> None:
    return None


async def _score(tools: SlotTools, transcript: Transcript) -> float:
    return 1.0


async def _run(policy: ScriptedPolicy, config: RolloutConfig) -> TrajectoryResult:
    async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
        with anyio.fail_after(config.deadline_s + 10):
            result = await run_trajectory(
                trajectory_id="t0",
                messages=[Message.system("You fix things."), Message.user("Write done.txt.")],
                tools=SLOT_TOOL_SPECS,
                hooks=TrajectoryHooks(prepare=_prepare, score=_score),
                policy=policy,
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=config,
            )
        assert pool.statistics().leased == 0
    return result


def _check_every_call_answered(result: TrajectoryResult, env: FileEnv) -> None:
    """Each assistant call has its tool message, in order; the last, the cut one's, says why;
    the stats count it; the training tokens end with it, masked, after the trained call."""
    calls = [c.id for m in result.messages if m.role == "assistant" for c in m.tool_calls]
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == calls
    assert [e.call.id for e in result.exchanges] == calls
    cut = result.exchanges[-1].result
    assert cut.outcome is ToolOutcome.TIMEOUT
    assert CUT.fullmatch(cut.error or ""), cut.error
    last = result.messages[-1]
    assert (last.role, last.tool_call_id) == ("tool", calls[-1])
    assert CUT.search(last.content), last.content
    assert result.stats.stop_reason is StopReason.TIME_BUDGET
    assert result.stats.tool_calls == len(calls)
    assert result.stats.tool_errors.timeout == 1
    tokens = result.tokens
    assert tokens is not None
    trained = [i for i, mask in enumerate(tokens.masks) if mask != MASKED_LABEL]
    assert trained, "the model's turns are trained"
    tail = tokens.tokens[trained[-1] + 1 :]
    assert CUT.search(env.tokenizer_port().decode(list(tail))), "the answer closes the tokens"


@pytest.mark.parametrize("mode", ["openai", "managed"])
async def test_a_call_running_at_the_trajectorys_deadline_is_answered(
    env: FileEnv, mode: str
) -> None:
    """No score reserve: the turns end at the trajectory's deadline, the sleep still running."""
    result = await _run(_policy(env, mode), attrs.evolve(CONFIG, score_reserve_s=0.0))
    _check_every_call_answered(result, env)
    assert [e.call.name for e in result.exchanges] == ["write_file", "bash"]


@pytest.mark.parametrize("mode", ["openai", "managed"])
async def test_a_call_waiting_out_the_tool_delay_at_the_turns_deadline_is_answered(
    env: FileEnv, mode: str
) -> None:
    """The pause before a turn's calls (``tool_delay_s``) outlasts the turns: the first
    turn's call never started, and is answered as cut all the same."""
    result = await _run(_policy(env, mode), attrs.evolve(CONFIG, tool_delay_s=30.0))
    _check_every_call_answered(result, env)
    assert [e.call.name for e in result.exchanges] == ["write_file"]
    assert result.exchanges[-1].result.error == (
        "not finished: the turns' deadline passed while it ran"
    )
