"""Task environments in the container pool: slot-server containers with the host's image cache
mounted, each with a volume of its own for the slots' writable layers, and the folder of an OCI
layout made at test time mounted at its own path (``environment_dirs``). The
``TaskEnvironmentContract`` runs against it, and no container or volume of the pool is left
after it closes.

It needs a container engine and the slot-server image built from this tree (``./dev image``),
as ``test_container_pool.py`` does; without them it is skipped, saying so.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest

from tests.environment_roots import IMAGE_OS_RELEASE, image_problem, write_shell_image
from tests.integration.test_container_pool import IMAGE, IMAGE_PROBLEM, _engine
from trajcore.adapters.pools.container_guard import LABEL
from trajcore.adapters.pools.container_pool import (
    ContainerPoolConfig,
    ContainerSandboxPool,
)
from trajcore.domain.isolation import SlotIsolation
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.sandbox_pool_contract import (
    EnvironmentCase,
    PoolShape,
    TaskEnvironmentContract,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(IMAGE_PROBLEM is not None, reason=str(IMAGE_PROBLEM)),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]


@pytest.fixture(scope="module")
def image_dir() -> Iterator[Path]:
    """A folder every slot uid may search: the image's layout and the cache."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-container-env-"))
    folder.chmod(0o711)
    try:
        write_shell_image(folder / "layout")
        (folder / "cache").mkdir(mode=0o711)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def environment_config(shape: PoolShape, folder: Path) -> ContainerPoolConfig:
    return ContainerPoolConfig(
        containers=shape.containers,
        server=attrs.evolve(
            ContainerPoolConfig().server,
            slots_per_container=shape.slots_per_container,
            acquire_timeout_s=shape.acquire_timeout_s,
            isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.2, max_processes=64),
            reset_timeout_s=20.0,
        ),
        name_prefix=f"test-env-{secrets.token_hex(3)}",
        image=IMAGE,
        image_cache_dir=folder / "cache",
        environment_dirs=(folder / "layout",),
    )


def volumes_of(names: list[str]) -> set[str]:
    """The volumes mounted by the containers ``names``."""
    found: set[str] = set()
    for name in names:
        listed = _engine("inspect", "--format", "{{range .Mounts}}{{.Name}} {{end}}", name)
        found.update(listed.split())
    return found


class TestContainerPoolEnvironments(TaskEnvironmentContract):
    @pytest.fixture
    def environment_case(self, image_dir: Path) -> EnvironmentCase:
        @asynccontextmanager
        async def pool_factory(shape: PoolShape) -> AsyncIterator[SandboxPool]:
            config = environment_config(shape, image_dir)
            prefix = config.name_prefix
            assert prefix is not None
            volumes: set[str] = set()
            try:
                async with ContainerSandboxPool(config) as pool:
                    names = [pool.engine_name(c) for c in pool.container_names()]
                    volumes = volumes_of(names)
                    assert volumes, "each container has a volume for its layers"
                    yield pool
            finally:
                left = _engine("ps", "--all", "--quiet", "--filter", f"label={LABEL}={prefix}")
                assert left == ""
                listed = set(_engine("volume", "ls", "--quiet").split())
                assert not volumes & listed, "the pool removed its containers' volumes"

        return EnvironmentCase(
            factory=pool_factory,
            environment=f"oci:{image_dir / 'layout'}",
            path="/etc/os-release",
            content=IMAGE_OS_RELEASE.decode(),
        )
