"""ToolServer: tools that do not run in a slot (search, APIs, Python functions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trajcore.domain.tools import ToolCall, ToolContext, ToolResult, ToolSpec

__all__ = ["ToolServer"]


class ToolServer(Protocol):
    """A set of external tools."""

    async def list_tools(self) -> list[ToolSpec]:
        """The tools this server offers.

        Raises:
            ToolServerError: the server is unreachable or failed.
            WireError: a spec in its answer is malformed (names the tool and field).
        """
        ...

    async def execute(self, calls: Sequence[ToolCall], *, context: ToolContext) -> list[ToolResult]:
        """Run ``calls`` for ``context``; one result per call, in order.

        An unknown tool or bad arguments is that call's ``REJECTED`` result; a tool that raises
        is a ``TOOL_ERROR`` result; a server that cannot be reached gives every call an
        ``INFRA_ERROR`` result. It raises only ``PoolClosed`` (after ``aclose``).
        """
        ...

    async def release(self, trajectory_id: str) -> None:
        """End the state the server keeps for ``trajectory_id`` (an MCP session per trajectory).

        Called once a trajectory has ended. A no-op for a server that keeps no such state, for a
        trajectory it has never seen, for one already released, and after ``aclose``; a later
        ``execute`` for the same trajectory starts afresh. Raises nothing of its own (a failure
        to end a session is the server's to log), and returns once the state is gone.
        """
        ...

    async def aclose(self) -> None:
        """Release connections. Idempotent."""
        ...
