"""SandboxPool: slots to lease, and batches of tool calls to run in them.

``EnvironmentPool`` is what a pool that runs leases over task environments adds: the
statistics of those leases (``EnvironmentStatistics``), and a group's preparation done once:
a prepared lease frozen into a ``Snapshot`` that the group's members start from.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from trajcore.domain.environment_leases import EnvironmentStatistics, Snapshot
from trajcore.domain.slots import Lease, PoolStatistics, SlotCall
from trajcore.domain.tools import ToolResult

__all__ = ["EnvironmentPool", "SandboxPool"]


class SandboxPool(Protocol):
    """N slots per container, K containers, and a way to run tool calls in them.

    Implementations: the local pool (slot servers as child processes), the Nomad pool, and the
    in-memory fake.
    """

    def lease(
        self, holder: str, *, timeout_s: float | None = None, environment: str | None = None
    ) -> AbstractAsyncContextManager[Lease]:
        """An async context manager that holds one slot for ``holder``.

        Entering waits first-come first-served for a free slot, at most ``timeout_s`` (and never
        past the caller's cancel scope). Leaving, however the block ends (normally, by an error
        or by cancellation), releases the slot exactly once: its sandbox is torn down and its
        workspace wiped, or it is quarantined when that fails. Release runs shielded, with its
        own timeout, so a cancelled holder still gives its slot back.

        ``environment`` (an image reference, ``domain.task_environments``) runs the lease over
        that root filesystem: a malformed reference is refused before a slot is leased; a pool
        that runs environments names it to the slot's server after acquiring the slot and before
        the block runs; a pool that cannot refuses it naming itself and the reason. A refusal
        after the slot was acquired releases the slot as any lease's end does.

        Raises on entry:
            AcquireTimeout: no slot came free in time.
            PoolClosed: the pool is closed or closes while waiting.
            EnvironmentUnavailable: the lease cannot run over ``environment`` (an
                ``InfrastructureError`` naming the environment, the field and the reason).
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


@runtime_checkable
class EnvironmentPool(Protocol):
    """A pool that counts its leases over task environments (every pool of trajcore does)."""

    def environment_statistics(self) -> EnvironmentStatistics:
        """A snapshot of the leases over environments asked of this pool and what they cost."""
        ...

    async def snapshot(self, lease: Lease, environment: str) -> Snapshot:
        """Freeze ``lease`` (held, running over ``environment``) into a snapshot of its slot
        server: what it wrote over the image and its workspace. Its processes end; it goes on
        over the snapshot.

        Raises:
            EnvironmentUnavailable: the pool or the server takes no snapshot of it (naming the
                field and the reason); the lease goes on as it was.
        """
        ...

    def lease_from(
        self,
        holder: str,
        snapshot: Snapshot,
        *,
        timeout_s: float | None = None,
        fork_wait_s: float | None = None,
    ) -> AbstractAsyncContextManager[tuple[Lease, bool]]:
        """As ``lease(holder, environment=snapshot.environment)``; the lease starts from
        ``snapshot`` (``True``) when its slot is on the snapshot's server and the server starts
        it there, else over the plain image (``False``: the holder prepares it itself; counted
        in ``EnvironmentStatistics.fallbacks``).

        It prefers a slot of the snapshot's server: a free one there at once, else it waits
        for one there, first-come first-served among the leases that accept it, at most
        ``fork_wait_s`` (``None``: the pool's ``fork_wait_s`` setting) and never past
        ``timeout_s``, then takes any slot.

        Raises on entry what ``lease`` raises, and ``InvalidInput`` for a ``fork_wait_s`` that
        is negative or NaN.
        """
        ...

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        """No lease starts from ``snapshot`` any more; its files go once the leases over it
        have reset. Never raises (a gone server took it with it)."""
        ...
