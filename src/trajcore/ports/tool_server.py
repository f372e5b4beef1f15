"""ToolServer: tools that do not run in a slot (search, APIs, Python functions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trajcore.domain.tools import ToolCall, ToolContext, ToolResult, ToolSpec

__all__ = ["ToolContext", "ToolServer"]


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

    async def aclose(self) -> None:
        """Release connections. Idempotent."""
        ...
