"""Driving pools from a test's thread through a blocking portal: opening them, holding leases.

The pool state machine (``sandbox_pool_machine``) and other lockstep suites run their steps in
the test's thread while the pools live in a ``BlockingPortal``'s event loop. ``open_all`` opens
one context per factory there, closed together by an ``ExitStack``; a ``Hold`` is one lease
held by a task in that loop until the test tells it how to leave its block; ``slot_call`` is a
call under a lease.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, ExitStack
from typing import Literal, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from trajcore.domain.json_values import JSON
from trajcore.domain.slots import Lease, SlotCall
from trajcore.domain.tools import ToolCall
from trajcore.ports.sandbox_pool import SandboxPool

__all__ = ["SETTLE_S", "BlockError", "Hold", "open_all", "slot_call"]

SETTLE_S = 30.0  # the longest a reset, a replacement or a grant may take to show

_T = TypeVar("_T")
_ids = itertools.count(1)


def open_all(
    stack: ExitStack,
    portal: BlockingPortal,
    factories: Sequence[Callable[[], AbstractAsyncContextManager[_T]]],
) -> list[_T]:
    """Enter one context of each factory in ``portal``'s loop; ``stack`` exits them all."""
    return [stack.enter_context(portal.wrap_async_context_manager(make())) for make in factories]


def slot_call(
    lease: Lease,
    tool: str,
    *,
    call_id: str | None = None,
    timeout_s: float = 10.0,
    **arguments: JSON,
) -> SlotCall:
    """A call of ``tool`` under ``lease`` (a fresh call id unless one is given)."""
    call = ToolCall(id=call_id or f"contract-{next(_ids)}", name=tool, arguments=arguments)
    return SlotCall(lease=lease, call=call, timeout_s=timeout_s)


class BlockError(Exception):
    """Raised inside a lease block to leave it by an error."""


class Hold:
    """One pool's lease, held by a task in the portal's loop until told how to leave."""

    def __init__(
        self, portal: BlockingPortal, pool: SandboxPool, holder: str, timeout_s: float
    ) -> None:
        self.pool = pool
        self.holder = holder
        self.timeout_s = timeout_s
        self.lease: Lease | None = None
        self.mode: Literal["normal", "error"] = "normal"
        self.entered = portal.call(anyio.Event)
        self.leave = portal.call(anyio.Event)
        self.portal = portal
        self.started = time.monotonic()
        self.future = portal.start_task_soon(self._run)

    async def _run(self) -> None:
        try:
            async with self.pool.lease(self.holder, timeout_s=self.timeout_s) as lease:
                self.lease = lease
                self.entered.set()
                await self.leave.wait()
                if self.mode == "error":
                    raise BlockError(self.holder)
        finally:
            self.entered.set()

    def wait_entered(self) -> Lease:
        """The lease once granted; raises what entering raised."""
        self.portal.call(self._wait_entered)
        if self.lease is None:
            self.future.result(timeout=SETTLE_S)
            raise AssertionError(f"{self.holder}: the lease block ended without a lease")
        return self.lease

    async def _wait_entered(self) -> None:
        with anyio.fail_after(SETTLE_S):
            await self.entered.wait()

    def release(self, how: Literal["normal", "error", "cancel"]) -> None:
        """Leave the block by ``how`` and wait until it has left."""
        if how == "cancel":
            self.future.cancel()
        else:
            self.mode = how
            self.portal.call(self.leave.set)
        done, _ = concurrent.futures.wait([self.future], timeout=SETTLE_S)
        assert done, f"{self.holder}: leaving the lease block took over {SETTLE_S} s"
        if how == "error":
            assert isinstance(self.future.exception(), BlockError), self.future.exception()
        elif how == "normal":
            assert self.future.exception() is None, self.future.exception()
