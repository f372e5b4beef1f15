"""The slot servers' own task-environment figures (their health's image cache, snapshots and
forks), summed into the local pool's ``environment_statistics()`` and the env's metrics.

Two slot servers share the host's cache: its image is counted once, their hits and misses
add up; a snapshot held by one server counts while it is held; a fork counts; the leases'
writable layers, measured by each server after their resets, add up (the largest is the
largest of all); a server that leaves the pool keeps what it counted.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from trajcore.adapters.pools.local_pool import LocalPoolConfig, LocalSandboxPool
from trajcore.domain.environment_leases import EnvironmentStatistics
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slot_server_settings import SlotServerSettings
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


async def measured(pool: LocalSandboxPool, layers: int) -> EnvironmentStatistics:
    """The pool's figures once its servers measured ``layers`` leases' layers (each server
    measures a lease's layer in the background after its reset)."""
    deadline = time.monotonic() + 20
    while True:
        await pool.refresh_environment_figures()
        figures = pool.environment_statistics()
        if figures.layers_measured >= layers:
            return figures
        assert time.monotonic() < deadline, figures
        await asyncio.sleep(0.05)


def pool_config(folder: Path) -> LocalPoolConfig:
    return LocalPoolConfig(
        containers=2,
        server=SlotServerSettings(
            slots_per_container=1,
            acquire_timeout_s=30.0,
            isolation=SlotIsolation(require_sandbox=True, min_timeout_s=0.2, max_processes=64),
            reset_timeout_s=10.0,
        ),
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
        async with (
            pool.lease("a", environment=ref) as first,
            pool.lease("b", environment=ref) as second,
        ):
            await pool.refresh_environment_figures()
            both = pool.environment_statistics()
            # the second lease writes 300 kB over the image (its server's layer, not the first's)
            (big,) = await pool.execute(
                second.slot.container,
                [slot_call(second, "write_file", path="big.bin", content="x" * 100_000)],
            )
            assert big.ok, big
            (copied,) = await pool.execute(
                second.slot.container,
                [slot_call(second, "bash", command="for n in 1 2 3; do cat big.bin > /b$n; done")],
            )
            assert copied.ok, copied
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
        after = await measured(pool, 3)  # a's, b's and the fork's: over both servers
        assert after.layer_largest_bytes >= 300_000, after
        assert after.layer_bytes >= after.layer_largest_bytes, after
        assert after.layer_entries >= 3, after
        assert after.server_forks >= 1, after
        assert after.held_snapshots == 0, after
        assert after.cache_hits == both.cache_hits, after  # a fork holds its image already
        metrics = service_metrics(pool, DispatcherStatistics())
        assert metrics["trajcore/environments/cache_images"] == 1.0
        assert metrics["trajcore/environments/cache_hits"] == after.cache_hits
        assert metrics["trajcore/environments/server_forks"] == after.server_forks
        assert metrics["trajcore/environments/layers_measured"] == after.layers_measured
        assert metrics["trajcore/environments/layer_bytes"] == after.layer_bytes
        assert metrics["trajcore/environments/layer_largest_bytes"] == after.layer_largest_bytes
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
        assert gone.layers_measured >= after.layers_measured, gone  # the gone server's count
        assert gone.layer_largest_bytes == after.layer_largest_bytes, gone
