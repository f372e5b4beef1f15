"""The tool dispatcher's hot path on asyncio (``trajcore.ports.event_loop.LoopHooks``).

``anyio.current_time()`` and ``anyio.Event()`` find the running backend anew on every use, and
an anyio event on asyncio wraps an asyncio one: on the path of every tool call that was about a
sixth of the env process's CPU per call at 64 trajectories (docs/benchmarks.md). On asyncio the
loop's own clock is what anyio reads, and one future per call holds a result with the same
cancellation points as the anyio event it replaces.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import attrs

from trajcore.domain.tools import ToolResult
from trajcore.ports.event_loop import LoopHooks

__all__ = ["FutureWaiter", "asyncio_hooks"]


class FutureWaiter:
    """A result waiter on asyncio: one future.

    The cancellation points of anyio's ``Event.wait``: a waiter already delivered still yields
    once before it returns, and a cancelled caller leaves it undelivered.
    """

    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future: asyncio.Future[ToolResult | None] = loop.create_future()

    def deliver(self, result: ToolResult | None) -> None:
        if not self._future.done():
            self._future.set_result(result)

    def delivered(self) -> bool:
        return self._future.done() and not self._future.cancelled()

    async def wait(self) -> ToolResult | None:
        if self._future.done() and not self._future.cancelled():
            await asyncio.sleep(0)
        return await self._future


@attrs.frozen
class _AsyncioHooks:
    loop: asyncio.AbstractEventLoop
    # anyio's asyncio clock is the loop's: its own method, with no call of ours around it
    clock: Callable[[], float] = attrs.field(init=False)

    waiter: Callable[[], FutureWaiter] = attrs.field(init=False)  # likewise, the class itself

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "clock", self.loop.time)
        object.__setattr__(self, "waiter", functools.partial(FutureWaiter, self.loop))


def asyncio_hooks() -> LoopHooks | None:
    """The running asyncio loop's hooks; ``None`` on another backend (the dispatcher then uses
    anyio's portable primitives)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return _AsyncioHooks(loop)
