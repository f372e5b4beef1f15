"""The container pool over real slot-server containers: the SandboxPool contract, its generated
sequences, and its faults (a container killed by the engine, stale containers of a dead pool, a
missing image), each test checking that no container of the pool is left after it closes.

It needs a container engine (podman or docker) and the slot-server image built from this tree
(``./dev image``; ``TRAJCORE_IMAGE`` names another tag); without the image the tests are skipped
saying so. An image of an older tree fails the start, naming the server's log.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import pytest

from tests.flat_settings import split_off
from tests.image_source import image_problem
from trajcore.adapters.pools.container_guard import LABEL
from trajcore.adapters.pools.container_pool import (
    DEFAULT_IMAGE,
    ContainerPoolConfig,
    ContainerSandboxPool,
    abandon_container_pools,
    find_engine,
)
from trajcore.domain.errors import ConfigError, SandboxUnavailable
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.tools import ToolOutcome
from trajcore.ports.sandbox_pool import SandboxPool
from trajcore.testing.portal_pools import slot_call
from trajcore.testing.sandbox_pool_contract import (
    CrashContainer,
    PoolShape,
    SandboxPoolContract,
    SandboxPoolFactory,
)

ENGINE = find_engine()
IMAGE = os.environ.get("TRAJCORE_IMAGE") or DEFAULT_IMAGE


IMAGE_PROBLEM = image_problem(ENGINE, IMAGE)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(IMAGE_PROBLEM is not None, reason=str(IMAGE_PROBLEM)),
]

ISOLATION = SlotIsolation(
    require_sandbox=True, min_timeout_s=0.2, max_processes=64, memory_bytes=512 << 20
)


def _engine(*args: str) -> str:
    assert ENGINE is not None
    done = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{ENGINE} {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def containers_labelled(prefix: str) -> list[str]:
    """Every container (running or not) carrying the pool label ``prefix``."""
    return _engine(
        "ps", "--all", "--filter", f"label={LABEL}={prefix}", "--format", "{{.Names}}"
    ).split()


def config(containers: int = 2, slots: int = 2, **more: object) -> ContainerPoolConfig:
    values: dict[str, object] = {
        "slots_per_container": slots, "isolation": ISOLATION, "reset_timeout_s": 10.0,
        "image": IMAGE,
    } | more  # fmt: skip
    server = split_off(ContainerPoolConfig().server, values)
    return ContainerPoolConfig(
        containers=containers,
        server=server,
        name_prefix=f"test-pool-{secrets.token_hex(3)}",
        **values,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def container_pool(shape: PoolShape) -> AsyncIterator[SandboxPool]:
    pool_config = config(
        shape.containers, shape.slots_per_container, acquire_timeout_s=shape.acquire_timeout_s
    )
    try:
        async with ContainerSandboxPool(pool_config) as pool:
            yield pool
    finally:
        assert pool_config.name_prefix is not None
        assert containers_labelled(pool_config.name_prefix) == []


def kill_container(pool: SandboxPool, container: str) -> None:
    """``engine kill`` the container behind ``container``, by its engine ID."""
    assert isinstance(pool, ContainerSandboxPool)
    container_id = _engine("inspect", "--format", "{{.Id}}", pool.engine_name(container))
    _engine("kill", container_id)


class TestContainerSandboxPool(SandboxPoolContract):
    supports_crash = True
    machine_scale = 0.02  # every sequence starts containers: few of them

    @pytest.fixture
    def sandbox_pool_factory(self) -> SandboxPoolFactory:
        return container_pool

    @pytest.fixture
    def crash_container(self) -> CrashContainer:
        return kill_container


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_killed_container_fails_its_batch_and_a_replacement_serves() -> None:
    pool_config = config()
    prefix = pool_config.name_prefix
    assert prefix is not None
    async with ContainerSandboxPool(pool_config) as pool:
        first = set(containers_labelled(prefix))
        assert len(first) == 2
        async with pool.lease("victim") as victim:
            dead = victim.slot.container
            engine_name = pool.engine_name(dead)
            kill_container(pool, dead)
            (result,) = await pool.execute(dead, [slot_call(victim, "bash", command="echo x")])
            assert result.outcome is ToolOutcome.INFRA_ERROR, result
            (again,) = await pool.execute(dead, [slot_call(victim, "bash", command="true")])
            assert again.outcome is ToolOutcome.INFRA_ERROR, again
        with anyio.fail_after(60):
            while pool.restarts < 1 or len(pool.container_names()) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        assert dead not in pool.container_names()
        replacement = next(n for n in pool.container_names() if n.startswith(dead.split("~")[0]))
        assert pool.engine_name(replacement) != engine_name
        async with pool.lease("after") as after:
            (ok,) = await pool.execute(
                after.slot.container, [slot_call(after, "bash", command="echo ok")]
            )
        assert ok.content == "ok\n"
        assert pool.statistics().free == 4
        pool.check_valid()
    assert containers_labelled(prefix) == []


@pytest.fixture
def stranger() -> Iterator[str]:
    """A container labelled for another pool, which no pool of ours may remove."""
    name = f"test-stranger-{secrets.token_hex(3)}"
    _engine("create", "--name", name, "--label", f"{LABEL}={name}", IMAGE)
    try:
        yield name
    finally:
        subprocess.run(
            [ENGINE or "podman", "rm", "--force", name], capture_output=True, check=False
        )


@pytest.mark.anyio
async def test_stale_containers_of_the_same_prefix_are_removed_and_no_others(
    stranger: str,
) -> None:
    pool_config = config(containers=1)
    prefix = pool_config.name_prefix
    assert prefix is not None
    _engine("create", "--name", f"{prefix}-9-9", "--label", f"{LABEL}={prefix}", IMAGE)
    async with ContainerSandboxPool(pool_config) as pool:
        assert containers_labelled(prefix) == [pool.engine_name(pool.container_names()[0])]
    assert containers_labelled(prefix) == []
    assert containers_labelled(stranger) == [stranger]


@pytest.mark.anyio
async def test_a_forced_end_removes_every_container_and_the_token_folder(
    stranger: str,
) -> None:
    """What a second signal does (``signals``: the process exits at once, without the pool's
    close): ``abandon_container_pools`` removes the pool's containers by its label, and its
    token folder, synchronously; another pool's container stays."""
    pool_config = config(containers=2)
    prefix = pool_config.name_prefix
    assert prefix is not None
    async with ContainerSandboxPool(pool_config) as pool:
        assert len(containers_labelled(prefix)) == 2
        token = pool._engine._token_file  # where the bearer token lies on this host
        assert token is not None
        assert token.exists()
        assert abandon_container_pools(grace_s=60.0) == 1
        assert containers_labelled(prefix) == []
        assert not token.parent.exists()
        assert abandon_container_pools() == 0  # abandoned pools are forgotten
    assert containers_labelled(stranger) == [stranger]


@pytest.mark.anyio
async def test_a_missing_image_is_refused_naming_how_to_build_it() -> None:
    missing = f"localhost/trajcore/no-such-image:{secrets.token_hex(3)}"
    with pytest.raises(SandboxUnavailable, match=r"\./dev image"):
        async with ContainerSandboxPool(config(image=missing)):
            pytest.fail("a pool started without its image")


@pytest.mark.parametrize(
    ("field", "settings"),
    [
        ("name_prefix", {"name_prefix": "-bad"}),
        ("name_prefix", {"name_prefix": "a/b"}),
        ("containers", {"containers": 0}),
        ("image", {"image": " "}),
        ("stop_timeout_s", {"stop_timeout_s": float("nan")}),
    ],
)
def test_bad_settings_name_their_field(field: str, settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        ContainerPoolConfig(**settings)  # type: ignore[arg-type]
    assert caught.value.field == field
