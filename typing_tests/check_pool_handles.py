"""A pool's members keep their source's handle type (mypy checks this file; pytest never runs it).

``Member[H].handle`` is the handle the source joined it with: a scheduler's ``Run`` for the
scheduled pools, the launcher's handle for the supervised ones, never a bare ``object``.
"""

from __future__ import annotations

from typing import TypeVar, assert_type

from trajcore.adapters.pools.cloud_pool import CloudSandboxPool
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.adapters.pools.pool_core import ContainerSource, Member
from trajcore.adapters.pools.reconciled import ReconciledSettings, ReconciledSource, Run
from trajcore.adapters.pools.slurm_pool import SlurmSandboxPool
from trajcore.adapters.pools.supervision import Launcher, SupervisedPool, SupervisedSource

H = TypeVar("H")


def check_scheduled_members_hold_runs(
    nomad: NomadSandboxPool, slurm: SlurmSandboxPool, cloud: CloudSandboxPool
) -> None:
    for pool in (nomad, slurm, cloud):
        member = pool.member("c")
        if member is not None:
            assert_type(member.handle, Run)
        for each in pool.members():
            assert_type(each.handle.id, str)


def check_supervised_members_hold_the_launchers_handle(pool: SupervisedPool[H]) -> list[H]:
    return [member.handle for member in pool.members()]


def check_sources_are_container_sources(
    runs: ReconciledSource[ReconciledSettings], launcher: Launcher[H]
) -> tuple[ContainerSource[Run], ContainerSource[H]]:
    return runs, SupervisedSource(launcher, prefix="x", containers=1)


def check_a_source_is_told_of_its_own_members(
    source: ContainerSource[Run], member: Member[Run]
) -> None:
    source.lost(member, "a failed batch")
