"""The SandboxPool contract against the Nomad pool over the fake Nomad API.

The fake's allocations run the real slot server (``trajcore.entrypoints.slot_server``) as child
processes on loopback, with real bubblewrap when it is installed; killing one is a container
dying under the pool. Every request the pool sends is checked against Nomad's OpenAPI
description when it can be found (``TRAJCORE_NOMAD_OPENAPI``), and each test ends by asserting
that nothing broke it.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from trajcore.adapters.fakes.nomad_api import FakeNomadAPI, NomadOpenAPI
from trajcore.adapters.sandbox.nomad_pool import NomadPoolConfig, NomadSandboxPool
from trajcore.domain.slot_server_flags import SlotServerFlags
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)

SLOT_SERVER = (sys.executable, "-m", "trajcore.entrypoints.slot_server")
_FAKES: dict[int, FakeNomadAPI] = {}


def nomad_pool_config(address: str, shape: PoolShape, **overrides: object) -> NomadPoolConfig:
    """A raw_exec pool of the real slot server, tuned for fast tests."""
    settings: dict[str, object] = {
        "address": address,
        "job_id": "contract-slots",
        "driver": "raw_exec",
        "command": SLOT_SERVER,
        "slots_per_container": shape.slots_per_container,
        "min_containers": shape.containers,
        "max_containers": shape.containers,
        "acquire_timeout_s": shape.acquire_timeout_s,
        "flags": SlotServerFlags(
            require_sandbox=shutil.which("bwrap") is not None,
            min_timeout_s=0.2,
            max_processes=64,
            memory_mb=512,
        ),
        "memory_mb": 512,
        "start_timeout_s": 20.0,
        "reset_timeout_s": 10.0,
        "poll_interval_s": 0.05,
        "request_timeout_s": 5.0,
        "stop_timeout_s": 5.0,
        "cooldown_s": 0.0,
    }
    settings.update(overrides)
    return NomadPoolConfig(**settings)  # type: ignore[arg-type]


@asynccontextmanager
async def nomad_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with FakeNomadAPI(openapi=NomadOpenAPI.find()) as fake:
        async with NomadSandboxPool(nomad_pool_config(fake.address, shape)) as pool:
            _FAKES[id(pool)] = fake
            try:
                yield pool
            finally:
                del _FAKES[id(pool)]
        assert fake.violations == []


def crash_nomad(pool: SandboxPool, container: str) -> None:
    assert isinstance(pool, NomadSandboxPool)
    _FAKES[id(pool)].kill_allocation(pool.allocation_id(container))


@pytest.mark.slow
class TestNomadSandboxPool(SandboxPoolContract):
    supports_crash = True

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return nomad_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return crash_nomad
