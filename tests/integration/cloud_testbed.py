"""What the cloud pools' tests share: a fast config for the real slot server behind the fake
provider, and the pool-to-fake registry their crash hooks stop sandboxes through."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from trajcore.adapters.sandbox.cloud_pool import CloudSandboxPool
from trajcore.domain.sandbox_policy import SlotPolicy
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_cloud import FakeCloud
from trajcore.testing.sandbox_pool_contract import PoolShape

FAST: dict[str, object] = {
    "python": sys.executable,
    "policy": SlotPolicy(
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
