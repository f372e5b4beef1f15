"""Leases over task environments, from the env's side: the refusal a lease raises, a reference
checked before anything is leased, and what a pool counts.

A task may name a root filesystem (``domain.task_environments``: an image reference); its
trajectories' leases then run over that image. What the pool and the rollout share lives here:

- ``EnvironmentUnavailable``: a lease that named an environment could not run over it (a
  malformed reference, a pool that runs no environments or has no image cache, an image that
  is missing or refused, a full cache, a slot server that failed the request). It is an
  ``InfrastructureError``: the trajectory fails as ``infra_error`` (never a score of 0), and
  only that trajectory; the slot it had is released as after any lease.
- ``check_environment``: the reference parsed before a slot is leased, so a malformed one costs
  no slot and names the field.
- ``Snapshot``: a group's prepared lease frozen on one slot server, which the group's members
  there start from copy-on-write instead of preparing again.
- ``EnvironmentStatistics``: the leases over environments a pool asked for and what they cost,
  with its slot servers' own figures summed (``ServerFigureBook``: their image caches, the
  snapshots they hold, the forks they started).

Rules: no I/O; every refusal names the environment, the field and the reason.
"""

from __future__ import annotations

from typing import Literal

import attrs

from trajcore.domain.errors import InfrastructureError
from trajcore.domain.task_environments import (
    ImageCacheStatistics,
    LeaseLayerStatistics,
    TaskEnvironmentError,
    parse_environment_ref,
)

__all__ = [
    "EnvironmentStatistics",
    "EnvironmentUnavailable",
    "ForkRefused",
    "ServerFigureBook",
    "ServerFigures",
    "ServerTotals",
    "Snapshot",
    "check_environment",
]

ForkReason = Literal["no_environment", "no_snapshots", "snapshot_refused", "no_slots"]


class EnvironmentUnavailable(InfrastructureError):
    """A lease could not run over the task environment it named.

    Attributes:
        environment: The reference the lease named.
        reason: Why (the pool's or the slot server's words, naming the image).
        field: What the reason is about (``environment``, ``epoch``, a pool setting such as
            ``image_cache_dir``, or the image cache's own field).
    """

    def __init__(self, environment: str, reason: str, *, field: str = "environment") -> None:
        super().__init__(f"task environment {environment}: {reason} @ {field}")
        self.environment = environment
        self.reason = reason
        self.field = field


class ForkRefused(InfrastructureError):
    """A running lease could not be forked (``SlotTools.fork``).

    Attributes:
        reason: Why, as a word: ``no_environment`` (the lease runs over no task environment),
            ``no_snapshots`` (the pool takes none), ``snapshot_refused`` (the pool or its server
            refused to freeze the lease), ``no_slots`` (the snapshot's server had not enough
            free slots in time).
        detail: The pool's or the server's words.
    """

    def __init__(self, reason: ForkReason, detail: str) -> None:
        super().__init__(f"fork refused ({reason}): {detail}")
        self.reason: ForkReason = reason
        self.detail = detail


def check_environment(environment: object, *, field: str = "environment") -> str:
    """``environment`` when it is a well-formed image reference.

    Raises:
        EnvironmentUnavailable: it is not text or names no known transport (``field``).
    """
    try:
        parse_environment_ref(environment, field=field)
    except TaskEnvironmentError as error:
        raise EnvironmentUnavailable(str(environment), error.reason, field=error.field) from None
    assert isinstance(environment, str)  # parse_environment_ref refuses anything else
    return environment


@attrs.frozen(kw_only=True)
class ServerTotals:
    """What a pool's slot servers say of their task environments, summed (``ServerFigureBook``).

    Attributes:
        cache_servers: Servers in the pool now that have an image cache.
        caches: Distinct caches among them (servers of one host share the host's).
        cache_images: Images those caches hold (each cache counted once).
        cache_bytes: What those images take.
        cache_max_bytes: The caches' limits, added up.
        cache_hits: Images the servers found cached (every server the pool read, gone ones too).
        cache_misses: Images they unpacked into a cache.
        cache_refused: Images their caches refused (missing, bad layers, a full cache).
        cache_evicted: Images evicted to make room.
        cache_unpack_s: Seconds spent unpacking (materializing) images.
        cache_recently_resolved: Hits answered from a recent resolution of the reference.
        held_snapshots: Snapshots the servers in the pool hold now.
        held_snapshot_bytes: What those snapshots hold on disk.
        server_forks: Leases the servers started from a snapshot (gone servers' too).
        layers_measured: Leases' writable layers the servers measured after their resets
            (gone servers' too; ``LeaseLayerStatistics``).
        layer_bytes: Those layers' disk use added up.
        layer_entries: Their entries added up.
        layer_largest_bytes: The largest of them.
        layers_cut_short: Measurements stopped at their deadline (a lower bound each).
        layer_measure_s: Seconds the servers spent measuring them.
    """

    cache_servers: int = 0
    caches: int = 0
    cache_images: int = 0
    cache_bytes: int = 0
    cache_max_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_refused: int = 0
    cache_evicted: int = 0
    cache_unpack_s: float = 0.0
    cache_recently_resolved: int = 0
    held_snapshots: int = 0
    held_snapshot_bytes: int = 0
    server_forks: int = 0
    layers_measured: int = 0
    layer_bytes: int = 0
    layer_entries: int = 0
    layer_largest_bytes: int = 0
    layers_cut_short: int = 0
    layer_measure_s: float = 0.0


@attrs.frozen(kw_only=True)
class EnvironmentStatistics(ServerTotals):
    """A pool's leases over task environments since it started.

    Attributes:
        leases: Leases that named an environment.
        refused: Of them, refused (by the pool, or by the slot server's answer or failure).
        hits: Leases whose image was in its host's cache already.
        misses: Leases whose image was first made on its host (unpacked into the cache).
        materialize_s: Seconds the misses' lease requests took (unpacking included).
        lease_request_s: Seconds every answered lease request took.
        snapshots: Prepared leases frozen into snapshots.
        snapshot_s: Seconds the snapshot requests took.
        snapshot_bytes: What those snapshots held when taken (their layers and workspaces).
        forks: Leases started from a snapshot.
        fallbacks: Leases asked from a snapshot (``lease_from``) that started over the plain
            image instead: no slot of the snapshot's server came free within the pool's
            ``fork_wait_s``, or that server refused the fork.

    And ``ServerTotals``' fields: the slot servers' own figures, as the pool last read their
    health (the pools of slot servers read it every ``figures_interval_s``, and on
    ``refresh_environment_figures``).
    """

    leases: int = 0
    refused: int = 0
    hits: int = 0
    misses: int = 0
    materialize_s: float = 0.0
    lease_request_s: float = 0.0
    snapshots: int = 0
    snapshot_s: float = 0.0
    snapshot_bytes: int = 0
    forks: int = 0
    fallbacks: int = 0


@attrs.frozen(kw_only=True)
class Snapshot:
    """A lease over ``environment`` frozen on the slot server of ``container``: its layer over
    the image and its workspace. Leases of that server may start from it; a server holds its
    own snapshots only.

    Attributes:
        environment: The image it was taken over.
        container: The pool's name of the server that holds it.
        snapshot: The server's id of it.
        bytes: What it holds on disk.
        files: How many entries it holds.
    """

    environment: str
    container: str
    snapshot: str
    bytes: int = 0
    files: int = 0


@attrs.frozen(kw_only=True)
class ServerFigures:
    """What one slot server's health says of its task environments.

    Attributes:
        cache: Its image cache's figures (``None``: it has no cache).
        snapshots: Snapshots it holds (dropped ones still in use included).
        snapshot_bytes: What they hold on disk.
        forks: Leases it started from a snapshot since it started.
        layers: What its leases' writable layers held, measured after their resets.
    """

    cache: ImageCacheStatistics | None = None
    snapshots: int = 0
    snapshot_bytes: int = 0
    forks: int = 0
    layers: LeaseLayerStatistics = attrs.field(factory=LeaseLayerStatistics)


_COUNTED = ("hits", "misses", "refused", "evicted", "unpack_seconds", "recently_resolved")
_LAYERS = ("measured", "bytes", "entries", "cut_short", "measure_seconds")


def _counts(figures: ServerFigures) -> tuple[float, ...]:
    """What a server counts (forks, the cache's counters, then its layers'), never going down
    while it runs."""
    cache = figures.cache
    counted = (0.0,) * len(_COUNTED) if cache is None else (getattr(cache, n) for n in _COUNTED)
    return (figures.forks, *counted, *(getattr(figures.layers, n) for n in _LAYERS))


@attrs.define
class ServerFigureBook:
    """A pool's slot servers' environment figures, summed into ``ServerTotals``. Sans-IO: the
    pool reads each server's health and hands it here.

    - What the servers *count* (cache hits, misses, refusals, evictions, unpacking seconds,
      recent resolutions, forks, the leases' layers measured and what they held) is summed
      over every server the pool read, one that left the pool included (its last reading is
      kept), so a count never goes down; the largest layer is the largest any of them saw.
    - What a cache *holds* (images, bytes, its limit) is counted once per cache: servers that
      share one (``observe``'s ``cache`` key: the local and container pools' servers all read
      the host's cache; a Nomad node's allocations read the node's) report the same directory,
      and the latest reading of each cache counts, not each server's.
    - What a server holds itself (snapshots, their bytes) counts for the servers in the pool.
    """

    _live: dict[str, tuple[str, ServerFigures]] = attrs.field(factory=dict)
    _left: list[float] = attrs.field(factory=lambda: [0.0] * (1 + len(_COUNTED) + len(_LAYERS)))
    _largest_left: int = 0

    def observe(self, server: str, cache: str, figures: ServerFigures) -> None:
        """``server``'s latest health; ``cache`` names the cache it reads."""
        seen = self._live.pop(server, None)
        if seen is not None and any(
            now < before for now, before in zip(_counts(figures), _counts(seen[1]), strict=True)
        ):
            self._keep(seen[1])  # its counts went back: a new process under the same name
        self._live[server] = (cache, figures)  # last in order: the latest reading

    def leave(self, server: str) -> None:
        """``server`` left the pool: what it counted stays counted; what it held goes."""
        seen = self._live.pop(server, None)
        if seen is not None:
            self._keep(seen[1])

    def _keep(self, figures: ServerFigures) -> None:
        self._left = [a + b for a, b in zip(self._left, _counts(figures), strict=True)]
        self._largest_left = max(self._largest_left, figures.layers.largest_bytes)

    def totals(self) -> ServerTotals:
        """The figures summed (see the class doc)."""
        counted = list(self._left)
        caches: dict[str, ImageCacheStatistics] = {}
        servers = snapshots = snapshot_bytes = 0
        largest = self._largest_left
        for cache, figures in self._live.values():
            counted = [a + b for a, b in zip(counted, _counts(figures), strict=True)]
            largest = max(largest, figures.layers.largest_bytes)
            snapshots += figures.snapshots
            snapshot_bytes += figures.snapshot_bytes
            if figures.cache is not None:
                servers += 1
                caches.pop(cache, None)
                caches[cache] = figures.cache
        forks, hits, misses, refused, evicted, unpack_s, resolved, *layers = counted
        measured, layer_bytes, layer_entries, cut_short, measure_s = layers
        return ServerTotals(
            cache_servers=servers,
            caches=len(caches),
            cache_images=sum(c.images for c in caches.values()),
            cache_bytes=sum(c.bytes for c in caches.values()),
            cache_max_bytes=sum(c.max_bytes for c in caches.values()),
            cache_hits=round(hits),
            cache_misses=round(misses),
            cache_refused=round(refused),
            cache_evicted=round(evicted),
            cache_unpack_s=unpack_s,
            cache_recently_resolved=round(resolved),
            held_snapshots=snapshots,
            held_snapshot_bytes=snapshot_bytes,
            server_forks=round(forks),
            layers_measured=round(measured),
            layer_bytes=round(layer_bytes),
            layer_entries=round(layer_entries),
            layer_largest_bytes=largest,
            layers_cut_short=round(cut_short),
            layer_measure_s=measure_s,
        )
