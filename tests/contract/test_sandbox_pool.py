"""The SandboxPool contract against the in-memory fake and the local pool over real bubblewrap."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from trajcore.adapters.fakes.sandbox import FakeSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)


@asynccontextmanager
async def fake_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with FakeSandboxPool(
        containers=shape.containers,
        slots_per_container=shape.slots_per_container,
        acquire_timeout_s=shape.acquire_timeout_s,
    ) as pool:
        yield pool


@asynccontextmanager
async def local_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    config = LocalPoolConfig(
        containers=shape.containers,
        server=SlotServerSettings(
            slots_per_container=shape.slots_per_container,
            acquire_timeout_s=shape.acquire_timeout_s,
            isolation=SlotIsolation(
                require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
            ),
            reset_timeout_s=10.0,
        ),
    )
    async with LocalSandboxPool(config) as pool:
        yield pool


def crash_fake(pool: SandboxPool, container: str) -> None:
    assert isinstance(pool, FakeSandboxPool)
    pool.crash_container(container)


def crash_local(pool: SandboxPool, container: str) -> None:
    assert isinstance(pool, LocalSandboxPool)
    os.killpg(pool.server_pid(container), signal.SIGKILL)


class TestFakeSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.1  # ten sequences under ci; the lockstep test runs the fake too

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return fake_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return crash_fake

    async def test_a_scripted_failed_reset_quarantines_the_slot_saying_why(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        async with FakeSandboxPool(containers=1, slots_per_container=2) as pool:
            pool.fail_next_reset()
            async with pool.lease("first") as first:
                slot = first.slot
            async with pool.lease("second"):
                pass
            stats = pool.statistics()
            assert (stats.quarantined, stats.free) == (1, 1)
            assert [record.ok for record in pool.resets] == [False, True]
        quarantines = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
        assert quarantines == [
            f"fake pool: slot {slot.container}/{slot.index} quarantined: a scripted reset "
            "failure (fail_next_reset)"
        ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
class TestLocalSandboxPool(SandboxPoolContract):
    supports_crash = True
    # few sequences here: test_pool_agreement drives the local pool through the same machine,
    # checked against the same contract, in lockstep with the fake
    machine_scale = 0.02

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return local_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return crash_local
