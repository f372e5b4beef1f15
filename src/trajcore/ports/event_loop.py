"""What the tool dispatcher may take from a particular event loop on its hot path.

The dispatcher (``trajcore.rollout``) runs on any anyio backend and imports anyio alone. Every
tool call passes through it, so an adapter that knows the running loop may hand it cheaper
primitives than anyio's portable ones (``trajcore.adapters.event_loops.asyncio_hooks``: the
loop's own clock, one future per call); the entry point that builds the dispatcher passes them.
"""

from __future__ import annotations

from typing import Protocol

from trajcore.domain.tools import ToolResult

__all__ = ["LoopHooks", "ResultWaiter"]


class ResultWaiter(Protocol):
    """Where one call's result waits for its caller.

    ``wait`` is a cancellation point even when the result is already there (it yields once
    first), and a cancelled ``wait`` leaves the waiter undelivered, so the caller withdraws its
    call if it is still queued.
    """

    def deliver(self, result: ToolResult | None) -> None:
        """Hand the caller ``result`` (``None``: the dispatcher stopped); the first one counts."""
        ...

    def delivered(self) -> bool:
        """Whether a result was handed over."""
        ...

    async def wait(self) -> ToolResult | None:
        """The result handed over, once there is one."""
        ...


class LoopHooks(Protocol):
    """The running loop's clock (what ``anyio.current_time()`` reads) and result waiters."""

    def clock(self) -> float:
        """The loop's time in seconds."""
        ...

    def waiter(self) -> ResultWaiter:
        """A new, undelivered waiter of this loop."""
        ...
