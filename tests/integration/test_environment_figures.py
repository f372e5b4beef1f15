"""The slot servers' own task-environment figures (their health's image cache, snapshots and
forks), summed into the local pool's ``environment_statistics()`` and the env's metrics.

Two slot servers share the host's cache: its image is counted once, their hits and misses
add up; a snapshot held by one server counts while it is held; a fork counts; a server that
leaves the pool keeps what it counted.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.isolation import SlotIsolation
from trajcore.entrypoints.atropos.metrics import service_metrics
from trajcore.rollout.dispatcher import DispatcherStatistics
from trajcore.testing.portal_pools import slot_call

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def shell_image() -> Iterator[tuple[Path, str]]:
    folder = Path(tempfile.mkdtemp(prefix="trajcore-env-figures-"))
    folder.chmod(0o711)
    try:
        write_shell_image(folder / "layout", salt="figures")
        yield folder, f"oci:{folder / 'layout'}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def pool_config(folder: Path) -> LocalPoolConfig:
    return LocalPoolConfig(
        containers=2,
        slots_per_container=1,
        acquire_timeout_s=30.0,
        isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.2, max_processes=64),
        reset_timeout_s=10.0,
        image_cache_dir=folder / "cache",
    )


async def test_the_servers_cache_snapshots_and_forks_are_summed(
    shell_image: tuple[Path, str],
) -> None:
    folder, ref = shell_image
    async with LocalSandboxPool(pool_config(folder)) as pool:
        await pool.refresh_environment_figures()
        empty = pool.environment_statistics()
        assert (empty.cache_servers, empty.caches, empty.cache_images) == (2, 1, 0), empty
        assert empty.cache_max_bytes == 32 << 30  # one cache, not one per server
        async with pool.lease("a", environment=ref) as first, pool.lease("b", environment=ref):
            await pool.refresh_environment_figures()
            both = pool.environment_statistics()
            (wrote,) = await pool.execute(
                first.slot.container,
                [slot_call(first, "write_file", path="prep.txt", content="prepared\n")],
            )
            assert wrote.ok, wrote
            frozen = await pool.snapshot(first, ref)
            await pool.refresh_environment_figures()
            held = pool.environment_statistics()
        # each server resolved the image once: one unpacked it, the other found it made
        assert (both.cache_misses, both.cache_hits, both.cache_images) == (1, 1, 1), both
        assert both.cache_bytes > 0
        assert both.cache_unpack_s > 0
        assert (held.held_snapshots, held.server_forks) == (1, 0), held
        assert held.held_snapshot_bytes > 0
        async with pool.lease_from("c", frozen) as (_, forked):
            assert forked
        await pool.drop_snapshot(frozen)
        await pool.refresh_environment_figures()
        after = pool.environment_statistics()
        assert after.server_forks >= 1, after
        assert after.held_snapshots == 0, after
        assert after.cache_hits == both.cache_hits, after  # a fork holds its image already
        metrics = service_metrics(pool, DispatcherStatistics())
        assert metrics["trajcore/environments/cache_images"] == 1.0
        assert metrics["trajcore/environments/cache_hits"] == after.cache_hits
        assert metrics["trajcore/environments/server_forks"] == after.server_forks
        # a server that leaves keeps what it counted; its cache stays counted by the other
        name = pool.container_names()[0]
        member = pool.member(name)
        assert member is not None
        pool.lose(member, "the test takes it out")
        await pool.refresh_environment_figures()
        gone = pool.environment_statistics()
        assert gone.cache_hits >= after.cache_hits, gone
        assert gone.cache_misses == after.cache_misses, gone
        assert gone.cache_images == 1, gone
