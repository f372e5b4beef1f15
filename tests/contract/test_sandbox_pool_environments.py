"""The task-environment contract against the in-memory fake and the local pool (real slot
servers with an image cache, over an image made at test time from the host's own programs),
and the local pool's refusal without a cache naming the setting to set."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.environment_roots import IMAGE_OS_RELEASE, image_problem, write_shell_image
from trajcore.adapters.fakes.sandbox import EnvironmentLeaseRecord, FakeSandboxPool
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.environment_leases import EnvironmentUnavailable
from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    EnvironmentCase,
    PoolShape,
    SandboxPoolFactory,
    TaskEnvironmentContract,
)

pytestmark = pytest.mark.anyio

FAKE_IMAGE = "oci:/images/fake-task"
FAKE_RELEASE = "ID=fake-task-image\n"
ISOLATION = SlotIsolation(require_sandbox=True, min_timeout_s=0.2, max_processes=64)


@asynccontextmanager
async def fake_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    async with FakeSandboxPool(
        containers=shape.containers,
        slots_per_container=shape.slots_per_container,
        acquire_timeout_s=shape.acquire_timeout_s,
        images={FAKE_IMAGE: {"/etc/os-release": FAKE_RELEASE}},
    ) as pool:
        yield pool


class TestFakeSandboxPoolEnvironments(TaskEnvironmentContract):
    @pytest.fixture
    def environment_case(self) -> EnvironmentCase:
        return EnvironmentCase(
            factory=fake_pool, environment=FAKE_IMAGE, path="/etc/os-release", content=FAKE_RELEASE
        )


def local_config(shape: PoolShape, cache: Path | None) -> LocalPoolConfig:
    return LocalPoolConfig(
        containers=shape.containers,
        server=SlotServerSettings(
            slots_per_container=shape.slots_per_container,
            acquire_timeout_s=shape.acquire_timeout_s,
            isolation=ISOLATION,
            reset_timeout_s=10.0,
        ),
        image_cache_dir=cache,
    )


@pytest.fixture(scope="module")
def shell_image() -> Iterator[tuple[Path, str]]:
    """A folder every slot uid may search (the cache goes under it), and the shell image's
    reference (an OCI layout in it)."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-env-contract-"))
    folder.chmod(0o711)
    try:
        write_shell_image(folder / "layout")
        yield folder, f"oci:{folder / 'layout'}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))
class TestLocalSandboxPoolEnvironments(TaskEnvironmentContract):
    @pytest.fixture
    def environment_case(self, shell_image: tuple[Path, str]) -> EnvironmentCase:
        folder, reference = shell_image

        @asynccontextmanager
        async def local_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
            async with LocalSandboxPool(local_config(shape, folder / "cache")) as pool:
                yield pool

        factory: SandboxPoolFactory = local_pool
        return EnvironmentCase(
            factory=factory,
            environment=reference,
            path="/etc/os-release",
            content=IMAGE_OS_RELEASE.decode(),
        )


# ----------------------------------------------------------------------------- without


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_fake_records_each_lease_over_an_environment() -> None:
    async with fake_pool(PoolShape(slots_per_container=1)) as pool:
        assert isinstance(pool, FakeSandboxPool)
        async with pool.lease("member/0", environment=FAKE_IMAGE) as lease:
            pass
        with pytest.raises(EnvironmentUnavailable) as caught:
            async with pool.lease("member/1", environment="oci:/images/other"):
                pytest.fail("the fake ran an image it does not hold")
        async with pool.lease("plain"):
            pass
    assert "oci:/images/fake-task" in caught.value.reason  # names the images it holds
    assert pool.environment_leases == [
        EnvironmentLeaseRecord(
            holder="member/0", environment=FAKE_IMAGE, slot=lease.slot, epoch=lease.epoch
        ),
        EnvironmentLeaseRecord(
            holder="member/1", environment="oci:/images/other", refusal=str(caught.value)
        ),
    ]


def test_the_fakes_images_are_checked_when_it_is_built() -> None:
    with pytest.raises(ConfigError) as caught:
        FakeSandboxPool(images={"ubuntu:22.04": {}})
    assert caught.value.field == "images['ubuntu:22.04']"
    with pytest.raises(ConfigError) as caught:
        FakeSandboxPool(images={FAKE_IMAGE: {"etc/os-release": "x"}})
    assert "absolute" in caught.value.reason


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_a_local_pool_without_a_cache_names_the_setting_to_set() -> None:
    async with LocalSandboxPool(local_config(PoolShape(slots_per_container=1), None)) as pool:
        with pytest.raises(EnvironmentUnavailable) as caught:
            async with pool.lease("t", environment=FAKE_IMAGE):
                pytest.fail("a pool without an image cache ran an environment")
        assert pool.statistics().leases_granted == 0  # refused before leasing
    assert caught.value.field == "image_cache_dir"
    assert "LocalPoolConfig.image_cache_dir" in caught.value.reason
    assert "--env.image_cache_dir" in caught.value.reason
    assert "under trajcore run, --set image_cache_dir=DIR" in caught.value.reason


def test_the_cache_setting_reaches_the_slot_servers_command_line(tmp_path: Path) -> None:
    config = LocalPoolConfig(image_cache_dir=tmp_path / "cache", image_cache_bytes=1 << 30)
    argv = config.server_argv(root=tmp_path / "root", listen=["--unix", "s"])
    assert argv[-4:] == [
        "--image-cache",
        str(tmp_path / "cache"),
        "--image-cache-bytes",
        "1073741824",
    ]
    assert "--image-cache" not in LocalPoolConfig().server_argv(root=tmp_path, listen=[])
    with pytest.raises(ConfigError) as caught:
        LocalPoolConfig(image_cache_dir="relative/cache")
    assert caught.value.field == "image_cache_dir"
