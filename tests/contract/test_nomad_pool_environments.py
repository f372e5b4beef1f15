"""Task environments on the Nomad pool over the fake Nomad API.

The fake's allocations run the real slot server (raw_exec, on this host) with the job's image
cache. The environment reaches each allocation as the job's artifact: Nomad fetches the shell
image's OCI layout into the task's ``local/environments/shell`` before the server starts, and the
env names it ``oci:/local/environments/shell``, as a docker or exec task sees it; a raw_exec
server reads it in its own task directory (``client_alloc_dir``). The ``TaskEnvironmentContract``
runs against that pool. Besides: a reference under ``/local/environments`` that no artifact
places is refused before a slot is leased; an artifact gone from the allocation fails only its
lease, naming the image and the reason; a host layout (a node's own folder) runs as well; the
cache's figures are summed across the allocations sharing the node's cache; an image pulled
into the node's engine runs (``containers-storage:``); a pool without a cache names the
setting.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.environment_roots import IMAGE_OS_RELEASE, image_problem, write_shell_image
from tests.nomad_testbed import OPENAPI, nomad_pool_config, pool_on
from trajcore.adapters.pools.nomad_pool import NomadSandboxPool
from trajcore.domain.environment_leases import EnvironmentUnavailable
from trajcore.domain.errors import SlotServerError
from trajcore.domain.nomad_job import EnvironmentArtifact
from trajcore.domain.slots import Lease
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.fake_nomad.agent import FakeNomadAPI
from trajcore.testing.portal_pools import slot_call
from trajcore.testing.sandbox_pool_contract import (
    EnvironmentCase,
    PoolShape,
    SandboxPoolFactory,
    TaskEnvironmentContract,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]

ARTIFACT_REF = "oci:/local/environments/shell"


@pytest.fixture(scope="module")
def shell_image() -> Iterator[Path]:
    """A folder every slot uid may search, holding the shell image's OCI layout (``layout``);
    the image cache goes under it too. Its name is lowercase letters and digits only: podman
    names an image pulled from ``oci:PATH`` after PATH, and refuses the pull as an "invalid
    reference format" when a component begins or ends with ``_`` (which ``mkdtemp`` may give)."""
    folder = Path(tempfile.gettempdir()) / f"trajcore-nomad-env-{secrets.token_hex(6)}"
    folder.mkdir(mode=0o711)
    folder.chmod(0o711)
    try:
        write_shell_image(folder / "layout", salt="nomad")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@asynccontextmanager
async def nomad_pool(
    shape: PoolShape, folder: Path, *, cache: bool = True
) -> AsyncIterator[NomadSandboxPool]:
    """A Nomad pool on a fake agent whose job fetches the shell image into every allocation."""
    async with FakeNomadAPI(openapi=OPENAPI) as fake:
        environments: dict[str, object] = {}
        if cache:
            environments = {
                "image_cache_dir": str(folder / "cache"),
                "artifacts": (
                    EnvironmentArtifact(
                        source=str(folder / "layout"), destination="shell", unpack=True
                    ),
                ),
                "client_alloc_dir": str(fake.alloc_dir),
            }
        config = nomad_pool_config(
            fake.address,
            containers=shape.containers,
            slots_per_container=shape.slots_per_container,
            acquire_timeout_s=shape.acquire_timeout_s,
            **environments,
        )
        async with pool_on(fake, config) as pool:
            assert isinstance(pool, NomadSandboxPool)
            yield pool


class TestNomadSandboxPoolEnvironments(TaskEnvironmentContract):
    @pytest.fixture
    def environment_case(self, shell_image: Path) -> EnvironmentCase:
        @asynccontextmanager
        async def factory(shape: PoolShape) -> AsyncIterator[SandboxPool]:
            async with nomad_pool(shape, shell_image) as pool:
                yield pool

        pools: SandboxPoolFactory = factory
        return EnvironmentCase(
            factory=pools,
            environment=ARTIFACT_REF,
            path="/etc/os-release",
            content=IMAGE_OS_RELEASE.decode(),
        )


async def cat(pool: SandboxPool, lease: Lease, path: str) -> str:
    (result,) = await pool.execute(
        lease.slot.container, [slot_call(lease, "bash", command=f"cat {path}")]
    )
    assert result.exec is not None, result
    return result.exec.stdout


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_reference_no_artifact_places_is_refused_before_a_slot_is_leased(
    shell_image: Path,
) -> None:
    async with nomad_pool(PoolShape(slots_per_container=1), shell_image) as pool:
        with pytest.raises(EnvironmentUnavailable) as caught:
            async with pool.lease("t", environment="oci:/local/environments/other"):
                pytest.fail("a lease ran over an image no artifact places")
        assert pool.statistics().leases_granted == 0
    assert caught.value.field == "artifacts"
    assert caught.value.environment == "oci:/local/environments/other"
    assert "/local/environments/shell" in caught.value.reason  # what the job places


async def test_an_artifact_gone_from_the_allocation_fails_only_its_lease(
    shell_image: Path,
) -> None:
    async with nomad_pool(PoolShape(slots_per_container=1), shell_image) as pool:
        async with pool.lease("before", environment=ARTIFACT_REF) as lease:  # control
            assert await cat(pool, lease, "/etc/os-release") == IMAGE_OS_RELEASE.decode()
        alloc = pool.allocation_id(lease.slot.container)
        placed = pool.config.job.task_reference(ARTIFACT_REF, alloc).partition(":")[2]
        shutil.rmtree(placed)
        with pytest.raises(EnvironmentUnavailable) as caught:
            async with pool.lease("after", environment=ARTIFACT_REF):
                pytest.fail("a lease ran over an image its allocation no longer holds")
        assert caught.value.environment == ARTIFACT_REF
        assert placed in caught.value.reason, caught.value.reason
        async with pool.lease("plain") as plain:  # the slot is still good
            assert await cat(pool, plain, "/etc/os-release") != IMAGE_OS_RELEASE.decode()


async def test_a_layout_on_the_node_runs_too(shell_image: Path) -> None:
    node_layout = f"oci:{shell_image / 'layout'}"
    async with (
        nomad_pool(PoolShape(slots_per_container=1), shell_image) as pool,
        pool.lease("node", environment=node_layout) as lease,
    ):
        assert await cat(pool, lease, "/etc/os-release") == IMAGE_OS_RELEASE.decode()


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
async def _pull(layout: str) -> str:
    """``layout`` pulled into podman's store: its image ID. A failed pull is tried once more
    (the engine's store can refuse for an instant under other work: that is set-up, not the
    pool); a second failure fails the test with podman's own words."""
    for attempt in (1, 2):
        done = await anyio.run_process(["podman", "pull", "-q", layout], check=False)
        if done.returncode == 0:
            return done.stdout.decode().strip()
        if attempt == 2:
            pytest.fail(f"podman pull {layout}: {done.stderr.decode(errors='replace')}")
        await anyio.sleep(1.0)
    raise AssertionError("unreachable")


async def test_an_image_pulled_into_the_nodes_engine_runs(shell_image: Path) -> None:
    layout = f"oci:{shell_image / 'layout'}"
    pulled = await _pull(layout)
    name = f"localhost/trajcore-nomad-env-{secrets.token_hex(4)}:latest"
    try:
        await anyio.run_process(["podman", "tag", pulled, name])
        async with (
            nomad_pool(PoolShape(slots_per_container=1), shell_image) as pool,
            pool.lease("engine", environment=f"containers-storage:{name}") as lease,
        ):
            assert await cat(pool, lease, "/etc/os-release") == IMAGE_OS_RELEASE.decode()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(120):
            await anyio.run_process(["podman", "rmi", "--force", pulled], check=False)


async def test_the_cache_figures_are_summed_once_per_node(shell_image: Path) -> None:
    async with nomad_pool(PoolShape(containers=2, slots_per_container=1), shell_image) as pool:
        for holder in ("first", "second", "third"):
            async with pool.lease(holder, environment=ARTIFACT_REF):
                pass
        await pool.refresh_environment_figures()
        stats = pool.environment_statistics()
    # two allocations, one node: one cache, its image counted once
    assert (stats.cache_servers, stats.caches, stats.cache_images) == (2, 1, 1), stats
    assert stats.cache_bytes > 0
    # each allocation reads its own copy of the artifact: two resolutions, one unpacking
    assert stats.cache_hits + stats.cache_misses == 3, stats
    assert stats.cache_hits >= 1


async def test_an_artifact_nomad_cannot_fetch_fails_the_start_naming_it(shell_image: Path) -> None:
    async with FakeNomadAPI(openapi=OPENAPI) as fake:
        missing = shell_image / "no-such-image.tar"
        config = nomad_pool_config(
            fake.address,
            start_timeout_s=3.0,
            image_cache_dir=str(shell_image / "cache"),
            artifacts=(EnvironmentArtifact(source=str(missing), destination="task.tar"),),
            client_alloc_dir=str(fake.alloc_dir),
        )
        with pytest.raises(SlotServerError) as caught:
            async with NomadSandboxPool(config):
                pytest.fail("a pool started without its allocations' artifacts")
    assert "Failed Artifact Download" in str(caught.value)
    assert str(missing) in str(caught.value)


async def test_a_pool_without_a_cache_names_the_setting(shell_image: Path) -> None:
    async with nomad_pool(PoolShape(slots_per_container=1), shell_image, cache=False) as pool:
        with pytest.raises(EnvironmentUnavailable) as caught:
            async with pool.lease("t", environment=ARTIFACT_REF):
                pytest.fail("a pool without an image cache ran an environment")
        assert pool.statistics().leases_granted == 0
    assert caught.value.field == "image_cache_dir"
    assert "NomadJobSettings.image_cache_dir" in caught.value.reason
