"""Task environments type-check for env authors (mypy checks this file; pytest never runs it):
the pools satisfy ``EnvironmentPool``, a typed ``task_environment`` override fits the hook, and
a lease naming an environment is the port's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.adapters.pools.container_pool import ContainerSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.environment_leases import EnvironmentStatistics, Snapshot
from trajcore.domain.messages import Message
from trajcore.domain.slots import Lease
from trajcore.entrypoints.atropos.env import AgentEnv
from trajcore.ports.sandbox_pool import EnvironmentPool, SandboxPool
from trajcore.rollout.tools import SlotTools


def check_the_pools_report_environments(
    fake: FakeSandboxPool, unisolated: UnisolatedSandboxPool, container: ContainerSandboxPool
) -> list[EnvironmentPool]:
    local = LocalSandboxPool(LocalPoolConfig(image_cache_dir="/var/cache/trajcore"))
    return [fake, unisolated, local, container]


def check_statistics(pool: EnvironmentPool) -> EnvironmentStatistics:
    return pool.environment_statistics()


async def check_a_lease_over_an_image(pool: SandboxPool) -> Lease:
    async with pool.lease("t", timeout_s=5.0, environment="oci:/images/task") as lease:
        return lease


async def check_a_fork(pool: EnvironmentPool, snapshot: Snapshot) -> bool:
    async with pool.lease_from("t", snapshot) as (_, forked):
        return forked


@attrs.frozen
class Repo:
    name: str
    commit: str


class RepoEnv(AgentEnv[Repo]):
    def build_task(self, item: Repo) -> str:
        return f"Fix {item.name}."

    def task_environment(self, item: Repo) -> str | None:
        return f"containers-storage:swe/{item.name}:{item.commit}"

    async def verify_and_score(
        self, item: Repo, tools: SlotTools, messages: Sequence[Message]
    ) -> float:
        return float(await tools.check("pytest -q"))


def check_the_hook(env: RepoEnv) -> Callable[[Repo], str | None]:
    return env.task_environment
