"""The SandboxPool contract against the Nomad pool with the ``docker`` driver, over real containers.

The fake Nomad API starts each allocation of the job as a container of the slot-server image
(``localhost/trajcore/slot-server:latest``, which ``./dev image`` builds) through the container
engine here (podman, with runc when installed, else docker where its daemon answers), with the
options the job asks for (``security_opt``, ``ulimit``), so the job the pool registers is the one
an operator's cluster would run. Containers are named with this run's own prefix and removed
when their allocation stops and when the fake closes.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from tests.image_source import image_problem
from tests.nomad_testbed import OPENAPI, crash_allocation, nomad_pool_config, pool_on
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_nomad.agent import FakeNomadAPI
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)

IMAGE = "localhost/trajcore/slot-server:latest"
PREFIX = f"trajcore-test-{secrets.token_hex(3)}"


def _engine() -> tuple[str, ...] | None:
    if shutil.which("podman"):
        return ("podman", "--runtime", "runc") if shutil.which("runc") else ("podman",)
    if shutil.which("docker"):
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
        if info.returncode == 0:
            return ("docker",)
    return None


ENGINE = _engine()
IMAGE_PROBLEM = image_problem(None if ENGINE is None else ENGINE[0], IMAGE)
pytestmark = [pytest.mark.skipif(IMAGE_PROBLEM is not None, reason=str(IMAGE_PROBLEM))]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def docker_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    assert ENGINE is not None
    async with FakeNomadAPI(
        openapi=OPENAPI,
        drivers=("docker",),
        engine=ENGINE,
        container_prefix=PREFIX,
        kill_timeout_cap_s=5.0,
    ) as fake:
        config = nomad_pool_config(
            fake.address,
            driver="docker",
            image=IMAGE,
            command=("trajcore", "slot-server"),
            containers=shape.containers,
            slots_per_container=shape.slots_per_container,
            acquire_timeout_s=shape.acquire_timeout_s,
            isolation=SlotIsolation(
                require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
            ),
            start_timeout_s=60.0,
        )
        async with pool_on(fake, config) as pool:
            yield pool
    assert ENGINE is not None
    with anyio.fail_after(60):
        left = await anyio.run_process(
            [*ENGINE, "ps", "--all", "--quiet", "--filter", f"name={PREFIX}"], check=False
        )
    assert left.stdout.strip() == b"", f"containers left behind: {left.stdout!r}"


@pytest.mark.slow
class TestNomadDockerPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.02  # each generated sequence starts containers

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return docker_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return crash_allocation


@pytest.mark.anyio
async def test_each_allocation_is_a_container_of_the_image_removed_after() -> None:
    assert ENGINE is not None
    listing = [*ENGINE, "ps", "--filter", f"name={PREFIX}", "--format", "{{.Image}}"]
    async with docker_pool(PoolShape(containers=2, slots_per_container=1)) as pool:
        assert isinstance(pool, NomadSandboxPool)
        with anyio.fail_after(60):
            running = await anyio.run_process(listing)
        assert running.stdout.decode().split() == [IMAGE, IMAGE]
        health = await pool.client(pool.container_names()[0]).health()
        assert health.sandboxed
    with anyio.fail_after(60):
        after = await anyio.run_process(listing)
    assert after.stdout.strip() == b""
