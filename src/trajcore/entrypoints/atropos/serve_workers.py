"""How many groups ``serve`` runs at once, against the slots the pool holds.

Atropos starts up to ``max_num_workers`` groups at once (``-1``, its default: 8 per model server,
``max_num_workers_per_node``), whatever the pool holds: with the defaults, 8 groups of 4 are 32
trajectories for the local pool's 16 slots. The members without a slot wait for one, and the
wait counts against the trajectory's deadline (``slot_lifetime_s``), so with trajectories of a
few minutes the ones that waited fail as ``infra_error`` ("no slot before the trajectory
deadline"): model time spent on the group's other members is thrown away, the groups go out
partial or fail, and ``max_failed_groups`` such groups in a row end the run.

``cap_workers`` caps Atropos's default at the groups whose members all fit in the pool's slots
when ``serve`` starts (at least one group; ``worker_count``), for the pools of a fixed size
(``FIXED_POOLS``); a ``max_num_workers`` set by hand is kept, with a warning when it is more
than the slots hold. A pool that grows when leases wait (Nomad, Slurm, the cloud pools, any
registered source) is left to Atropos's count, as its waiting leases are what make it grow.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from trajcore.entrypoints.atropos.config import AgentEnvConfig
from trajcore.ports.sandbox_pool import SandboxPool

__all__ = ["FIXED_POOLS", "cap_workers", "worker_count"]

FIXED_POOLS = frozenset({"local", "container", "ssh"})
"""The ``sandbox`` sources whose slots are fixed when the pool starts."""

_log = logging.getLogger("trajcore.env")


def worker_count(
    *,
    max_num_workers: int,
    atropos_default: int,
    group_size: int,
    slots: int,
    sandbox: str,
) -> int:
    """The ``max_num_workers`` serve runs with.

    Args:
        max_num_workers: The configured count (``-1``: Atropos's default).
        atropos_default: What ``-1`` means to Atropos (per node times model servers).
        group_size: Trajectories per group.
        slots: The pool's slots when serve starts.
        sandbox: The pool source (``sandbox``).
    """
    if sandbox not in FIXED_POOLS or slots < 1:
        return max_num_workers
    fits = max(1, slots // group_size)
    if max_num_workers != -1:
        if max_num_workers * group_size > slots:
            _log.warning(
                "max_num_workers=%d groups of group_size=%d are %d trajectories for the pool's "
                "%d slots: members that wait for a slot spend their slot_lifetime_s deadline "
                "waiting and may fail as infra_error; %d groups fit",
                max_num_workers, group_size, max_num_workers * group_size, slots, fits,
            )  # fmt: skip
        return max_num_workers
    if atropos_default <= fits:
        return max_num_workers
    _log.info(
        "serve runs at most %d groups at once: %d slots hold %d groups of group_size=%d "
        "(Atropos's default max_num_workers would be %d; set max_num_workers to override)",
        fits, slots, fits, group_size, atropos_default,
    )  # fmt: skip
    return fits


def cap_workers(config: AgentEnvConfig, server_manager: object, pool: SandboxPool) -> None:
    """Set ``config.max_num_workers`` for serve (``worker_count``), from the open pool's slots
    and Atropos's ``ServerManager`` (its model servers), before Atropos's loop starts."""
    servers = len(cast("Any", server_manager).servers)
    config.max_num_workers = worker_count(
        max_num_workers=config.max_num_workers,
        atropos_default=config.max_num_workers_per_node * servers,
        group_size=config.group_size,
        slots=pool.statistics().total,
        sandbox=str(config.sandbox),
    )
