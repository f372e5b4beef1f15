"""A seed env's ``exec_tool`` result type-checks as trajcore's ``ToolResult`` and as the seed's.

atropos-agent's verification hooks read ``res.success`` and ``res.output``; a typed port also
hands the same result to trajcore's own code, which takes a ``ToolResult`` (``Message.tool``,
``answering``). Both must pass mypy --strict.
"""

from __future__ import annotations

from trajcore.compat import ExecResult, ExecTool
from trajcore.domain.messages import Message
from trajcore.domain.tools import ToolCall, ToolResult


async def verify(exec_tool: ExecTool) -> tuple[bool, str, Message]:
    res = await exec_tool(ToolCall(id="check", name="terminal", arguments={"command": "true"}))
    answer: ToolResult = res.answering("again")
    return res.success, res.output, Message.tool(answer if res.ok else res)


def from_trajcore(result: ToolResult) -> ExecResult:
    return ExecResult.of(result)
