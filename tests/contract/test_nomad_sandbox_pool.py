"""The SandboxPool contract against the Nomad pool over the fake Nomad API.

The fake's allocations run the real slot server (``trajcore.entrypoints.slot_server``) as child
processes on loopback, with real bubblewrap when it is installed; killing one is a container
dying under the pool. Every request the pool sends is checked against Nomad's OpenAPI
description when it can be found (``TRAJCORE_NOMAD_OPENAPI``), and each test ends by asserting
that nothing broke it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.nomad_testbed import OPENAPI, crash_allocation, nomad_pool_config, pool_on
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_nomad.agent import FakeNomadAPI
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)


@asynccontextmanager
async def nomad_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with FakeNomadAPI(openapi=OPENAPI) as fake:
        config = nomad_pool_config(
            fake.address,
            containers=shape.containers,
            slots_per_container=shape.slots_per_container,
            acquire_timeout_s=shape.acquire_timeout_s,
        )
        async with pool_on(fake, config) as pool:
            yield pool


@pytest.mark.slow
class TestNomadSandboxPool(SandboxPoolContract):
    supports_crash = True
    # two generated sequences under the ci profile (each starts a fake Nomad and two slot
    # servers); ./dev test --deep runs forty
    machine_scale = 0.02

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return nomad_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return crash_allocation
