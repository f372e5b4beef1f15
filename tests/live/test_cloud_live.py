"""The SandboxPool contract against the real Modal and Daytona services (``./dev live-test
modal|daytona``). Each class runs only where its SDK and credentials are present, and skips
naming what is missing otherwise; CI has neither, so these have not run from this project's CI."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest

from trajcore.adapters.pools.cloud_pool import CloudPoolConfig
from trajcore.adapters.pools.daytona_pool import (
    DaytonaPoolConfig,
    DaytonaSandboxPool,
    DaytonaSandboxSettings,
    check_daytona,
)
from trajcore.adapters.pools.modal_pool import (
    ModalPoolConfig,
    ModalSandboxPool,
    ModalSandboxSettings,
    check_modal,
)
from trajcore.domain.errors import SandboxUnavailable
from trajcore.domain.scaling import ScaleSettings
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)


def _missing(check: object) -> str | None:
    assert callable(check)
    try:
        check()
    except SandboxUnavailable as error:
        return str(error)
    return None


_IMAGE = os.environ.get("TRAJCORE_LIVE_IMAGE", "ghcr.io/trajcore/slot-server:latest")


def _pool(shape: PoolShape) -> CloudPoolConfig:
    server = attrs.evolve(
        CloudPoolConfig().server,
        slots_per_container=shape.slots_per_container, acquire_timeout_s=shape.acquire_timeout_s,
    )  # fmt: skip
    scaling = ScaleSettings(min_containers=shape.containers, max_containers=shape.containers)
    return CloudPoolConfig(owner="trajcore-live-test", server=server, scaling=scaling)


@asynccontextmanager
async def _modal(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    config = ModalPoolConfig(pool=_pool(shape), sandbox=ModalSandboxSettings(image=_IMAGE))
    async with ModalSandboxPool(config) as pool:
        yield pool


@asynccontextmanager
async def _daytona(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    config = DaytonaPoolConfig(pool=_pool(shape), sandbox=DaytonaSandboxSettings(image=_IMAGE))
    async with DaytonaSandboxPool(config) as pool:
        yield pool


_MODAL = _missing(check_modal)
_DAYTONA = _missing(check_daytona)


@pytest.mark.slow
@pytest.mark.skipif(_MODAL is not None, reason=f"live Modal suite: {_MODAL}")
class TestModalLive(SandboxPoolContract):
    machine_scale = 0.01

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return _modal


@pytest.mark.slow
@pytest.mark.skipif(_DAYTONA is not None, reason=f"live Daytona suite: {_DAYTONA}")
class TestDaytonaLive(SandboxPoolContract):
    machine_scale = 0.01

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return _daytona
