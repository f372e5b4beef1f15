"""What the cloud pools' tests share: a fast config for the real slot server behind the fake
provider, the pool-to-fake registry their crash hooks stop sandboxes through, and the lockstep
machine that drives a cloud pool beside the fake pool."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from tests.flat_settings import split_off
from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.cloud_pool import CloudPoolConfig, CloudSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_cloud import FakeCloud
from trajcore.testing.sandbox_pool_contract import PoolShape, SandboxPoolFactory
from trajcore.testing.sandbox_pool_machine import MachineShape, run_pool_machine


def cloud_pool_config(**settings: object) -> CloudPoolConfig:
    """A ``CloudPoolConfig`` from flat settings: the slot servers' (``SlotServerSettings``) go
    to ``server``, the scaling ones (``ScaleSettings``) to ``scaling``."""
    pool, defaults = dict(settings), CloudPoolConfig()
    server, scaling = split_off(defaults.server, pool), split_off(defaults.scaling, pool)
    return CloudPoolConfig(server=server, scaling=scaling, **pool)  # type: ignore[arg-type]


FAST: dict[str, object] = {
    "python": sys.executable,
    "isolation": SlotIsolation(
        require_sandbox=shutil.which("bwrap") is not None,
        min_timeout_s=0.2,
        max_processes=64,
        memory_bytes=512 << 20,
    ),
    "start_timeout_s": 20.0,
    "reset_timeout_s": 10.0,
    "poll_interval_s": 0.05,
    "request_timeout_s": 5.0,
    "stop_timeout_s": 10.0,
    "cooldown_s": 0.0,
}
"""Settings every test pool shares: the real slot server of this venv, polled fast."""

_FAKES: dict[int, FakeCloud] = {}


@asynccontextmanager
async def pool_on(
    fake: FakeCloud, build: Callable[[FakeCloud], CloudSandboxPool]
) -> AsyncIterator[CloudSandboxPool]:
    """A started pool on ``fake``, known to ``stop_sandbox`` while it is open; on exit, no
    sandbox of its run is left."""
    async with build(fake) as pool:
        _FAKES[id(pool)] = fake
        run = pool.run
        try:
            yield pool
        finally:
            del _FAKES[id(pool)]
    assert [b.id for b in fake.live() if b.spec.labels.get("trajcore-run") == run] == []


def stop_sandbox(pool: SandboxPool, container: str) -> None:
    """The provider stops the sandbox behind ``container`` (the contract suites' crash hook)."""
    assert isinstance(pool, CloudSandboxPool)
    _FAKES[id(pool)].stop(pool.sandbox_id(container), "terminated by the provider (test)")


def shape_settings(shape: PoolShape) -> dict[str, object]:
    """The scale and slot settings of a contract suite's ``PoolShape``."""
    return {
        "slots_per_container": shape.slots_per_container,
        "min_containers": shape.containers,
        "max_containers": shape.containers,
        "acquire_timeout_s": shape.acquire_timeout_s,
    }


LOCKSTEP = MachineShape(containers=2, slots_per_container=2)


def agree_with_the_fake(cloud_pool: SandboxPoolFactory) -> None:
    """The lockstep machine (``run_pool_machine``): ``FakeSandboxPool`` and the cloud pool that
    ``cloud_pool`` opens over ``FakeCloud`` (real slot servers behind it), driven with the same
    sequences; a crash is the provider stopping the sandbox (``stop_sandbox``). Two sequences of
    twenty steps under the ci profile."""

    def crash_either(pool: SandboxPool, container: str) -> None:
        if isinstance(pool, FakeSandboxPool):
            pool.crash_container(container)
        else:
            stop_sandbox(pool, container)

    shape = PoolShape(
        containers=LOCKSTEP.containers,
        slots_per_container=LOCKSTEP.slots_per_container,
        acquire_timeout_s=30.0,
    )
    run_pool_machine(
        [
            lambda: FakeSandboxPool(
                containers=shape.containers,
                slots_per_container=shape.slots_per_container,
                acquire_timeout_s=shape.acquire_timeout_s,
            ),
            lambda: cloud_pool(shape),
        ],
        shape=LOCKSTEP,
        crash=crash_either,
        scale=0.02,
    )
