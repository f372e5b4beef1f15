"""A fork request makes each fork's idmapped clones of its layers beside its workspace.

A fork's lease mounts idmapped clones of the snapshot's frozen layers and the image's tree. The
fork request makes them in its worker threads, right after the fork's workspace, and the fork's
first lease takes them (no thread hop of its own); a fork reset before its first call closes
them. The runtime runs in this process with bubblewrap and the compiled helper, as the slot
servers do; warm leases are off, so the clones wait for the first call.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.slot_runtime_testbed import call, searchable_root
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.domain.tools import ToolOutcome

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="idmapped clones need a root server"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-fork-clones-") as path:
        yield path


def seen(fd: int) -> tuple[int, int, str] | None:
    """What descriptor ``fd`` of this process is (its device, inode and link), or ``None``."""
    try:
        info = os.fstat(fd)
        return info.st_dev, info.st_ino, os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def test_a_fork_request_makes_each_forks_clones_and_its_lease_or_reset_closes_them(
    root: Path,
) -> None:
    layout = root.parent / "layout"
    write_shell_image(layout, salt="fork-clones")
    ref = f"oci:{layout}"
    config = RuntimeConfig(
        slots=3, root=root, use_cgroups=False, warm_leases=False,
        image_cache=root.parent / "cache",
    )  # fmt: skip

    async def main() -> None:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            assert (await runtime.lease(0, 1, ref)).ok
            (prepared,) = await runtime.execute([call(1, "echo prepared > /prepared")])
            assert prepared.outcome is ToolOutcome.OK, prepared
            frozen = await runtime.snapshot(0, 1)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            answers = await runtime.fork(ref, frozen.snapshot, [(1, 1), (2, 1)])
            assert [a.ok for a in answers] == [True, True], answers
            made: dict[int, list[tuple[int, tuple[int, int, str] | None]]] = {}
            for index in (1, 2):
                slot = runtime.slot(index)
                assert slot.clones is not None
                layers, clones = slot.clones
                assert layers == slot.layers()
                assert len(clones) == len(layers) == 2  # the frozen layer, the image's tree
                made[index] = [(fd, seen(fd)) for fd in clones]
                assert None not in [what for _, what in made[index]]
            first = attrs.evolve(call(1, "cat /prepared; stat -c %u /prepared"), slot=1)
            (result,) = await runtime.execute([first])
            assert result.outcome is ToolOutcome.OK, result
            lines = result.content.split()
            assert lines[0] == "prepared", result.content
            assert lines[1] != "0", result.content  # the frozen layer's idmapped clone
            assert runtime.slot(1).clones is None  # the lease took them, the keeper has them
            assert all(seen(fd) != what for fd, what in made[1])  # closed (or another file)
            assert (await runtime.reset(2, 1)).ok  # never started: its clones are closed
            assert runtime.slot(2).clones is None
            assert all(seen(fd) != what for fd, what in made[2])
            assert (await runtime.reset(1, 1)).ok
            assert (await runtime.reset(0, 1)).ok
        finally:
            await runtime.aclose()

    asyncio.run(main())
