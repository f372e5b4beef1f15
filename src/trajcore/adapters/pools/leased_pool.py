"""``LeasedPool``: the port methods every pool over ``SlotLeasing`` answers the same way.

The pool core (``pool_core.SlotServerPool``) and the in-memory fake pool
(``adapters.fakes.sandbox``) lease through one ``SlotLeasing``; this base class is what they share
over it: ``lease`` and ``lease_from`` (a lease over a task environment is checked, counted and
entered through ``enter_environment`` before its block runs), the environment hooks a pool
overrides to say whether and how it runs task environments, and ``statistics``. Each pool closes
in its own way (``aclose``).
"""

from __future__ import annotations

import abc
import contextlib
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from trajcore.adapters.lifetime import ClosedOnExit
from trajcore.adapters.pools.environment_leasing import EnvironmentCounters, lease_only
from trajcore.adapters.pools.leasing import SlotLeasing
from trajcore.domain.environment_leases import (
    EnvironmentStatistics,
    EnvironmentUnavailable,
    Snapshot,
    check_environment,
)
from trajcore.domain.errors import InvalidInput
from trajcore.domain.slots import Lease, PoolStatistics

__all__ = ["DEFAULT_FORK_WAIT_S", "LeasedPool"]

DEFAULT_FORK_WAIT_S = 2.0


class LeasedPool(ClosedOnExit):
    """The port methods every pool over ``SlotLeasing`` answers the same way; each pool closes
    in its own way (``aclose``) and says whether and how it runs task environments
    (``environment_refusal``, ``enter_environment``)."""

    _leasing: SlotLeasing
    _environments: EnvironmentCounters
    fork_wait_s: float = DEFAULT_FORK_WAIT_S
    """How long ``lease_from`` waits for a slot on the snapshot's server before it leases any
    slot (over the plain image: a fallback, counted)."""

    def lease(
        self, holder: str, *, timeout_s: float | None = None, environment: str | None = None
    ) -> AbstractAsyncContextManager[Lease]:
        """See ``SandboxPool.lease``."""
        if environment is None:
            return self._leasing.lease(holder, timeout_s=timeout_s)
        return lease_only(self._environment_lease(holder, timeout_s, environment, None))

    def lease_from(
        self,
        holder: str,
        snapshot: Snapshot,
        *,
        timeout_s: float | None = None,
        fork_wait_s: float | None = None,
    ) -> AbstractAsyncContextManager[tuple[Lease, bool]]:
        """See ``EnvironmentPool.lease_from`` (``fork_wait_s``: else the pool's)."""
        return self._environment_lease(
            holder, timeout_s, snapshot.environment, snapshot, fork_wait_s
        )

    @contextlib.asynccontextmanager
    async def _environment_lease(
        self,
        holder: str,
        timeout_s: float | None,
        environment: str,
        snapshot: Snapshot | None,
        fork_wait_s: float | None = None,
    ) -> AsyncIterator[tuple[Lease, bool]]:
        counters = self._environments
        wait = self.fork_wait_s if fork_wait_s is None else fork_wait_s
        if math.isnan(wait) or wait < 0:
            raise InvalidInput("fork_wait_s", f"must be seconds >= 0, got {wait!r}")
        counters.asked()
        try:
            check_environment(environment)
            refusal = self.environment_refusal() or self.reference_refusal(environment)
            if refusal is not None:
                raise EnvironmentUnavailable(environment, refusal[1], field=refusal[0])
        except EnvironmentUnavailable as error:
            counters.refused()
            self.environment_refused(holder, environment, error)
            raise
        prefer = None if snapshot is None else snapshot.container
        leasing = self._leasing.lease(
            holder, timeout_s=timeout_s, prefer=prefer, prefer_s=wait, environment=environment
        )
        async with leasing as lease:
            try:
                forked = await self.enter_environment(lease, environment, snapshot)
            except EnvironmentUnavailable as error:
                counters.refused()
                self.environment_refused(holder, environment, error)
                raise
            if snapshot is not None and not forked:
                counters.fell_back()
            self.environment_leased(lease, environment, forked)
            yield lease, forked

    def environment_leased(self, lease: Lease, environment: str, forked: bool) -> None:
        """``lease`` runs over ``environment`` (from its snapshot when ``forked``) and its block
        starts now; nothing by default (the fake pool records it)."""
        del lease, environment, forked

    def environment_refused(
        self, holder: str, environment: str, error: EnvironmentUnavailable
    ) -> None:
        """``holder``'s lease over ``environment`` was refused (``error``, counted) before its
        block ran; nothing more by default (the fake pool records it)."""
        del holder, environment, error

    def environment_refusal(self) -> tuple[str, str] | None:
        """Why no lease of this pool can run over a task environment (the field at fault and
        the reason), or ``None`` when it can."""
        return "environment", f"the {type(self).__name__} does not run task environments"

    def reference_refusal(self, environment: str) -> tuple[str, str] | None:
        """Why this pool cannot run ``environment`` itself (as ``environment_refusal``), known
        before a slot is leased; ``None`` by default."""
        del environment
        return None

    async def enter_environment(
        self, lease: Lease, environment: str, snapshot: Snapshot | None
    ) -> bool:
        """Run the just-acquired ``lease`` over ``environment`` before its block runs, started
        from ``snapshot`` where it can (then ``True``). Raises ``EnvironmentUnavailable`` (the
        lease is then released as usual)."""
        raise EnvironmentUnavailable(environment, f"the {type(self).__name__} cannot run it")

    async def snapshot(self, lease: Lease, environment: str) -> Snapshot:
        """See ``EnvironmentPool.snapshot``."""
        raise EnvironmentUnavailable(
            environment, f"the {type(self).__name__} takes no snapshots", field="snapshot"
        )

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        """See ``EnvironmentPool.drop_snapshot``."""
        del snapshot  # this pool took none

    def environment_statistics(self) -> EnvironmentStatistics:
        """See ``EnvironmentPool.environment_statistics``."""
        return self._environments.statistics()

    def statistics(self) -> PoolStatistics:
        """See ``SandboxPool.statistics``."""
        return self._leasing.statistics()

    @abc.abstractmethod
    async def aclose(self) -> None:
        """See ``SandboxPool.aclose``."""
