"""atropos-agent's ``exec_tool`` answers a result that reads as the seed's ``ToolResult``.

The seeds' verification hooks read ``res.success`` and ``res.output`` after ``exec_tool``
(``if not res.success: return 0.0, ...``). trajcore's ``ToolResult.success`` is a constructor,
true when read as a flag, so such a hook scored a failing check as a pass.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_agent_env import _config
from tests.unit.test_agent_env_seed_port import _SeedBase, _solver
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.compat import ExecResult, ExecTool
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SeedVerify(_SeedBase):
    """The seed's own check: a command, then ``res.success`` and ``res.output``."""

    command = "cat done.txt"

    async def verify_and_score_trajectory(
        self, item: str, final_response: str, *, trajectory_id: str, exec_tool: ExecTool
    ) -> tuple[float, dict[str, Any]]:
        call = ToolCall(id="verify", name="terminal", arguments={"command": self.command})
        res = await exec_tool(call)
        if not res.success:
            return 0.0, {"error": res.error, "output": res.output}
        return 1.0, {}


class FailingCheck(SeedVerify):
    command = "exit 3"


class MissingFile(SeedVerify):
    command = "cat never-written.txt"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("env_cls", "score"), [(SeedVerify, 1.0), (FailingCheck, 0.0), (MissingFile, 0.0)]
)
async def test_a_seed_check_that_fails_scores_as_the_seed_scored_it(
    env_cls: type[SeedVerify], score: float
) -> None:
    env = env_cls(_config(group_size=1, min_healthy=1))
    async with FakeSandboxPool() as pool:
        result = await env.run_task("ok", pool=pool, policy=env.make_policy(chat=_solver()))
    assert [m.outcome.score for m in result.members] == [score]


def test_the_result_reads_as_either_tool_result() -> None:
    ran = ExecResult(call_id="c", name="bash", outcome=ToolOutcome.OK, content="hi\n")
    refused = ExecResult(
        call_id="c", name="bash", outcome=ToolOutcome.REJECTED, error="no such tool"
    )
    assert (ran.ok, ran.success, ran.output) == (True, True, "hi\n")
    assert (refused.ok, refused.success, refused.error) == (False, False, "no such tool")


def test_the_result_is_a_tool_result_for_trajcore_code() -> None:
    ran = ExecResult.of(ToolResult.success(ToolCall(id="c", name="bash", arguments={}), "hi\n"))
    assert isinstance(ran, ToolResult)
    assert ran.answering("d") == ToolResult(
        call_id="d", name="bash", outcome=ToolOutcome.OK, content="hi\n"
    )
    assert Message.tool(ran) == Message(role="tool", content="hi\n", tool_call_id="c", name="bash")
