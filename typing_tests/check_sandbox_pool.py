"""Both sandbox pools satisfy the SandboxPool port (mypy checks this file; pytest never runs it)."""

from __future__ import annotations

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.fakes.unisolated import UnisolatedSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.batch_planner import BatchConfig
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.rollout.dispatcher import ToolDispatcher


def check_fake_is_a_pool() -> SandboxPool:
    return FakeSandboxPool(containers=1, slots_per_container=2)


def check_unisolated_is_a_pool() -> SandboxPool:
    return UnisolatedSandboxPool(containers=1, slots_per_container=2)


def check_local_is_a_pool() -> SandboxPool:
    return LocalSandboxPool(
        LocalPoolConfig(containers=1, server=SlotServerSettings(slots_per_container=2))
    )


def check_dispatcher_takes_either(fake: FakeSandboxPool, local: LocalSandboxPool) -> None:
    ToolDispatcher(fake, BatchConfig())
    ToolDispatcher(local, BatchConfig())
