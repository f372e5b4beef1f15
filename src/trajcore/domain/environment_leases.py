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
- ``EnvironmentStatistics``: the leases over environments a pool asked for and what they cost.

Rules: no I/O; every refusal names the environment, the field and the reason.
"""

from __future__ import annotations

from typing import Literal

import attrs

from trajcore.domain.errors import InfrastructureError
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref

__all__ = [
    "EnvironmentStatistics",
    "EnvironmentUnavailable",
    "ForkRefused",
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
class EnvironmentStatistics:
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
