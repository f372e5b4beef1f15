"""SandboxPool: slots to lease, and batches of tool calls to run in them."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from trajcore.domain.slots import Lease, PoolStatistics, SlotCall
from trajcore.domain.tools import ToolResult

__all__ = ["SandboxPool"]


class SandboxPool(Protocol):
    """N slots per container, K containers, and a way to run tool calls in them.

    Implementations: the local pool (slot servers as child processes), the Nomad pool, and the
    in-memory fake.
    """

    def lease(
        self, holder: str, *, timeout_s: float | None = None
    ) -> AbstractAsyncContextManager[Lease]:
        """An async context manager that holds one slot for ``holder``.

        Entering waits first-come first-served for a free slot, at most ``timeout_s`` (and never
        past the caller's cancel scope). Leaving, however the block ends (normally, by an error
        or by cancellation), releases the slot exactly once: its sandbox is torn down and its
        workspace wiped, or it is quarantined when that fails. Release runs shielded, with its
        own timeout, so a cancelled holder still gives its slot back.

        Raises on entry:
            AcquireTimeout: no slot came free in time.
            PoolClosed: the pool is closed or closes while waiting.
        """
        ...

    async def execute(self, container: str, calls: Sequence[SlotCall]) -> list[ToolResult]:
        """Run ``calls``, all for slots of ``container``, as one batch.

        Returns one result per call, in the order of ``calls``. Calls for one slot run one at a
        time in that order; calls for different slots may run in parallel. A failure of one call
        (tool error, timeout, policy refusal, a dead server) is that call's result, never an
        exception: a dead or unreachable container gives every call an ``INFRA_ERROR`` result and
        its slots leave service (its leases turn stale; a replacement container may join). A
        call whose lease is stale is ``REJECTED``. A call id seen before returns the first result
        without running again.

        Raises:
            PoolClosed: after ``aclose``.
        """
        ...

    def statistics(self) -> PoolStatistics:
        """A snapshot of the pool's slots and waiters."""
        ...

    async def aclose(self) -> None:
        """Stop every container and child process. Idempotent; waiters get ``PoolClosed``."""
        ...
