"""Leases over task environments as the pools of slot servers ask for them: what they count,
the lease request, and a group's snapshot.

``leased_pool.LeasedPool`` runs every lease that names an environment the same way (the reference
checked, the pool's own refusal, then the slot, then ``enter_environment``); the pools of slot
servers carry ``enter_environment``, ``snapshot`` and ``drop_snapshot`` out with the functions
here, over the slot's server's client:

- ``lease_over``: ``POST /v1/lease`` for the lease's slot and epoch, from the group's snapshot
  when the slot is on the snapshot's server (a refused fork falls back to the plain image, so a
  member never fails because a fork could not be made); a refusal or a failed request is
  ``EnvironmentUnavailable`` naming the image, the field and the reason. A failed request does
  not take the server out of service: a first use may unpack a large image slowly, and the
  release's reset, which follows, finds a dead server out as for any lease.
- ``freeze``: ``POST /v1/snapshot`` of a held lease; ``drop``: ``POST /v1/snapshot/drop``,
  bounded and shielded, never raising.
- ``read_figures``: a server's image cache, snapshots and forks, from its health.
- ``EnvironmentCounters``: what ``environment_statistics()`` reports: the pool's own counts of
  the answers, and the servers' figures from their health (``ServerFigureBook``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager

import anyio
import attrs

from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.environment_leases import (
    EnvironmentStatistics,
    EnvironmentUnavailable,
    ServerFigureBook,
    ServerFigures,
    Snapshot,
)
from trajcore.domain.errors import InvalidInput, SlotServerError, StateError
from trajcore.domain.slots import Lease

__all__ = [
    "EnvironmentCounters",
    "drop",
    "freeze",
    "lease_only",
    "lease_over",
    "read_figures",
    "refresh_figures",
]

_log = logging.getLogger(__name__)
_DROP_TIMEOUT_S = 30.0
_FAILED = (SlotServerError, InvalidInput, StateError)  # unreachable, off-protocol, bad slot


@attrs.define
class EnvironmentCounters:
    """What a pool counts of its leases over task environments: the lease figures of an
    ``EnvironmentStatistics`` (``counted``, replaced as answers come), and the slot servers' own
    figures (``servers``, their health), summed into it by ``statistics``."""

    counted: EnvironmentStatistics = attrs.field(factory=EnvironmentStatistics)
    servers: ServerFigureBook = attrs.field(factory=ServerFigureBook)

    def asked(self) -> None:
        """A lease that named an environment."""
        self.counted = attrs.evolve(self.counted, leases=self.counted.leases + 1)

    def refused(self) -> None:
        """A lease refused (by the pool, or by the slot server's answer or failure)."""
        self.counted = attrs.evolve(self.counted, refused=self.counted.refused + 1)

    def fell_back(self) -> None:
        """A lease asked from a snapshot that started over the plain image instead."""
        self.counted = attrs.evolve(self.counted, fallbacks=self.counted.fallbacks + 1)

    def answered(self, *, hit: bool, duration_s: float, fork: bool = False) -> None:
        """A lease request the slot server granted (``fork``: from a snapshot)."""
        c = self.counted
        self.counted = attrs.evolve(
            c,
            lease_request_s=c.lease_request_s + duration_s,
            forks=c.forks + fork,
            hits=c.hits + hit,
            misses=c.misses + (not hit),
            materialize_s=c.materialize_s + (0.0 if hit else duration_s),
        )

    def froze(self, *, duration_s: float, size_bytes: int) -> None:
        """A snapshot the slot server took (in ``duration_s``, holding ``size_bytes``)."""
        c = self.counted
        self.counted = attrs.evolve(
            c,
            snapshots=c.snapshots + 1,
            snapshot_s=c.snapshot_s + duration_s,
            snapshot_bytes=c.snapshot_bytes + size_bytes,
        )

    def statistics(self) -> EnvironmentStatistics:
        """A frozen snapshot."""
        return attrs.evolve(self.counted, **attrs.asdict(self.servers.totals()))


@contextlib.asynccontextmanager
async def lease_only(
    leasing: AbstractAsyncContextManager[tuple[Lease, bool]],
) -> AsyncIterator[Lease]:
    """``leasing``'s lease, without whether it started from a snapshot."""
    async with leasing as (lease, _):
        yield lease


async def lease_over(
    client: SlotServerClient,
    lease: Lease,
    environment: str,
    snapshot: Snapshot | None,
    counters: EnvironmentCounters,
    *,
    sent: str | None = None,
) -> bool:
    """Run ``lease`` over ``environment`` on its server (``client``), from ``snapshot`` when
    the server holds it; ``True`` when it started from the snapshot. ``sent``: the reference
    as that server reads it, when not ``environment`` itself (a Nomad raw_exec allocation's
    own task directory); refusals name ``environment``.

    Raises:
        EnvironmentUnavailable: the server refused the image or failed the request.
    """
    where = lease.slot.container
    fork = snapshot.snapshot if snapshot is not None and snapshot.container == where else None
    asked = environment if sent is None else sent
    try:
        answer = await client.lease(lease.slot.index, lease.epoch, asked, snapshot=fork)
        if not answer.ok and fork is not None:
            _log.warning("fork of %s on %s refused: %s", fork, where, answer.error)
            fork = None
            answer = await client.lease(lease.slot.index, lease.epoch, asked)
    except _FAILED as error:
        raise EnvironmentUnavailable(
            environment, f"slot server {where}: {type(error).__name__}: {error}"
        ) from None
    if not answer.ok:
        raise EnvironmentUnavailable(
            environment,
            f"{answer.error or 'refused'} (slot server {where})",
            field=answer.field or "environment",
        )
    counters.answered(hit=answer.hit, duration_s=answer.duration_s, fork=fork is not None)
    return fork is not None


async def freeze(
    client: SlotServerClient,
    lease: Lease,
    environment: str,
    counters: EnvironmentCounters,
    label: str = "environment",
) -> Snapshot:
    """Freeze the held ``lease`` on its server into a ``Snapshot``.

    The request is shielded from the caller's cancellation (it is bounded by the client's
    lease timeout): a caller cancelled while the server freezes (its deadline, its group
    cancelled) would never learn the snapshot's id, and a snapshot nobody can drop stays on
    its server until it closes, holding its image against eviction and counting against the
    server's snapshot bytes. Such a snapshot is dropped here (``label`` names the pool in its
    log) before the cancellation goes on.

    Raises:
        EnvironmentUnavailable: the server refused (``field`` ``snapshot`` or the server's).
    """
    where = lease.slot.container
    failed: BaseException | None = None
    answer = None
    with anyio.CancelScope(shield=True):
        try:
            answer = await client.snapshot(lease.slot.index, lease.epoch)
        except _FAILED as error:
            failed = error
    if answer is None:
        raise EnvironmentUnavailable(
            environment, f"snapshot on {where}: {type(failed).__name__}: {failed}", field="snapshot"
        )
    if not answer.ok or answer.snapshot is None:
        raise EnvironmentUnavailable(
            environment,
            f"snapshot refused: {answer.error or 'no snapshot id'} (slot server {where})",
            field=answer.field or "snapshot",
        )
    counters.froze(duration_s=answer.duration_s, size_bytes=answer.bytes)
    snapshot = Snapshot(
        environment=environment, container=where, snapshot=answer.snapshot,
        bytes=answer.bytes, files=answer.files,
    )  # fmt: skip
    try:
        await anyio.lowlevel.checkpoint_if_cancelled()
    except BaseException:  # cancelled meanwhile: nobody holds the snapshot, so it goes now
        await drop(client, snapshot, label)
        raise
    return snapshot


async def drop(client: SlotServerClient, snapshot: Snapshot, label: str) -> None:
    """Drop ``snapshot`` on its server; bounded, shielded, logging what fails."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(_DROP_TIMEOUT_S):
        try:
            answer = await client.drop_snapshot(snapshot.snapshot)
        except _FAILED as error:
            _log.warning("%s pool: dropping %s failed: %s", label, snapshot.snapshot, error)
            return
        if not answer.ok:
            _log.warning("%s pool: %s not dropped: %s", label, snapshot.snapshot, answer.error)


async def read_figures(client: SlotServerClient) -> ServerFigures | None:
    """The server's environment figures from its health; ``None`` when it does not answer (a
    failing server is found out by its batches and resets, not here)."""
    try:
        health = await client.health()
    except _FAILED:
        return None
    return ServerFigures(
        cache=health.image_cache,
        snapshots=health.snapshots,
        snapshot_bytes=health.snapshot_bytes,
        forks=health.forks,
        layers=health.lease_layers,
    )


async def refresh_figures(
    servers: Sequence[tuple[str, str, SlotServerClient]],
    book: ServerFigureBook,
    still_in: Callable[[str], bool],
) -> None:
    """Read each server's figures at once (``(name, cache key, client)``) into ``book``; a
    server that left meanwhile (``still_in`` false) or does not answer is skipped."""

    async def read(name: str, cache: str, client: SlotServerClient) -> None:
        figures = await read_figures(client)
        if figures is not None and still_in(name):
            book.observe(name, cache, figures)

    async with anyio.create_task_group() as group:
        for name, cache, client in servers:
            group.start_soon(read, name, cache, client)
