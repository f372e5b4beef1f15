"""OpenAI mode at its seam: a trajectory whose policy is the real ``OpenAIChatServer`` talking
real HTTP on loopback to a chat-completions server the test writes, which refuses, as OpenAI
does, a conversation whose tool messages and tool calls do not pair.

- ``pairing_problem``: what OpenAI would refuse in a request's ``messages``, or ``None``.
- ``refusal``: the 400 answer OpenAI gives such a request (``invalid_request_error``).
- ``chat_trajectory``: one trajectory ("write a.txt", ``CONFIG``) through a client of the
  test's ``handle`` served on loopback, over the fakes' sandbox pool; server and client closed
  after.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.http1.server import HTTPServer
from trajcore.adapters.http1.values import Reply, Request
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.domain.agent_loop import AgentLoopConfig
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.json_values import JSON
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams
from trajcore.domain.slot_protocol import SLOT_TOOL_SPECS
from trajcore.rollout.dispatcher import ToolDispatcher
from trajcore.rollout.policy import ChatPolicy
from trajcore.rollout.tools import SlotTools
from trajcore.rollout.trajectory import (
    RolloutConfig,
    TrajectoryHooks,
    TrajectoryResult,
    Transcript,
    run_trajectory,
)

__all__ = ["CONFIG", "chat_trajectory", "pairing_problem", "refusal"]

CONFIG = RolloutConfig(
    agent=AgentLoopConfig(max_turns=4),
    sampling=SamplingParams(max_tokens=256),
    tool_timeout_s=5.0,
    deadline_s=30.0,
    acquire_timeout_s=5.0,
)


def pairing_problem(messages: list[JSON]) -> str | None:
    """What OpenAI would refuse in ``messages``: a tool message answering no pending call, or
    calls left unanswered before the next message; ``None`` when they pair."""
    pending: list[object] = []
    for i, message in enumerate(messages):
        assert isinstance(message, dict)
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in pending:
                return f"messages[{i}]: role 'tool' must answer a preceding 'tool_calls'"
            pending.remove(message.get("tool_call_id"))
            continue
        if pending:
            return f"messages[{i}]: tool calls {pending} were not answered"
        calls = message.get("tool_calls") or []
        assert isinstance(calls, list)
        for call in calls:
            assert isinstance(call, dict)
            pending.append(call["id"])
    return None


def refusal(problem: str) -> Reply:
    """OpenAI's answer to a request it refuses for ``problem``."""
    error = {"error": {"message": problem, "type": "invalid_request_error"}}
    return Reply(status=400, body=json.dumps(error).encode())


async def _prepare(tools: SlotTools) -> None:
    return None


async def chat_trajectory(
    handle: Callable[[Request], Reply],
    score: Callable[[SlotTools, Transcript], Awaitable[float]],
) -> TrajectoryResult:
    """The trajectory of a model served by ``handle`` on loopback HTTP (one attempt a request),
    scored by ``score``, in the fakes' sandbox pool."""
    http = HTTPServer(handle)
    _, port = await http.listen_tcp("127.0.0.1", 0)
    chat = OpenAIChatServer(
        base_url=f"http://127.0.0.1:{port}/v1", model="m", retry=RetryRules(max_attempts=1)
    )
    try:
        async with FakeSandboxPool() as pool, ToolDispatcher(pool, BatchConfig()) as dispatcher:
            return await run_trajectory(
                trajectory_id="t0",
                messages=[Message.user("write a.txt")],
                tools=SLOT_TOOL_SPECS,
                hooks=TrajectoryHooks(prepare=_prepare, score=score),
                policy=ChatPolicy(chat),
                pool=pool,
                dispatcher=dispatcher,
                tool_server=None,
                config=CONFIG,
            )
    finally:
        await chat.aclose()
        await http.aclose(grace_s=0.0)
