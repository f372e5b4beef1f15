"""A root given to two local pools on one host (two env processes of one env started with one
config): a server of one pool that is killed and replaced takes nothing of the other pool's
servers with it (``LocalPoolConfig.root``)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import attrs
import pytest

from tests.integration.test_local_pool import bash, config
from trajcore.adapters.pools.local_pool import LocalSandboxPool
from trajcore.domain.tools import ToolOutcome

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A root searchable by the slots' uids when run as root (pytest's tmp_path is 0700)."""
    scratch = Path(tempfile.mkdtemp(prefix="trajcore-shared-root-"))
    scratch.chmod(0o711)
    try:
        yield scratch / "slots"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _left_in(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir())


@pytest.mark.anyio
async def test_a_replaced_server_of_one_pool_leaves_the_other_pools_workspaces(
    shared_root: Path,
) -> None:
    """Each pool writes in a folder of its own in the root; both go at their pools' close."""
    await _two_pools_one_root(shared_root)
    assert _left_in(shared_root) == []


async def _two_pools_one_root(root: Path) -> None:
    shared = attrs.evolve(config(containers=1, slots=1), root=root)
    async with LocalSandboxPool(shared) as first, LocalSandboxPool(shared) as second:
        (other,) = second.container_names()
        async with second.lease("keeps") as kept:
            (wrote,) = await second.execute(other, [bash(kept, "echo kept > mine")])
            assert wrote.outcome is ToolOutcome.OK, wrote
            (name,) = first.container_names()
            os.kill(first.server_pid(name), signal.SIGKILL)
            with anyio.fail_after(60):
                while first.restarts < 1:  # noqa: ASYNC110 - polls state that has no event
                    await anyio.sleep(0.02)
            (read,) = await second.execute(other, [bash(kept, "cat mine")])
            assert read.outcome is ToolOutcome.OK, read
            assert "kept" in read.content, read
