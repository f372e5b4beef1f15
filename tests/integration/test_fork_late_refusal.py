"""A fork refused late leaves nothing of the snapshot in its slot.

A fork request checks each lease, then mounts each fork's workspace overlay in a worker thread.
When the pool resets that slot's epoch meanwhile (the member's trajectory cancelled while its
``lease_from`` was in flight), the fork is refused after its overlay is mounted. The overlay
has by then reached the slot's keeper by mount propagation, where the host's unmount does not
reach it. The reset waits for the fork's start to end, and the refusal ends the keeper with its
copy, so the slot's next lease (another task's) neither reads the prepared workspace nor loses
its own. The race is made certain here: the store's ``start`` holds the worker thread, once the
overlay is mounted, until the reset has been asked for. On the code before, the next lease
could not write its workspace (the keeper's copy of the overlay had lost its upper layer) and
the host saw none of what it wrote.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.slot_runtime_testbed import call, searchable_root
from trajcore.adapters.slot_server.runtime import SlotRuntime
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.snapshots import Snapshot, SnapshotStore
from trajcore.domain.tools import ToolOutcome, ToolResult

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a fork's workspace overlay needs a root server"),
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with searchable_root("trajcore-fork-late-") as path:
        yield path


async def run(runtime: SlotRuntime, slot: int, epoch: int, command: str) -> ToolResult:
    (result,) = await runtime.execute([attrs.evolve(call(epoch, command), slot=slot)])
    return result


def test_a_fork_refused_after_its_overlay_was_mounted_leaves_the_slot_clean(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = root.parent / "layout"
    write_shell_image(layout, salt="fork-late")
    ref = f"oci:{layout}"
    config = RuntimeConfig(slots=2, root=root, use_cgroups=False, image_cache=root.parent / "cache")
    mounted, go = threading.Event(), threading.Event()

    async def main() -> None:
        runtime = SlotRuntime(config)
        await runtime.start()
        try:
            # slot 1's keeper lives on between leases (a plain lease, then its reset)
            assert (await run(runtime, 1, 1, "true")).outcome is ToolOutcome.OK
            assert (await runtime.reset(1, 1)).ok
            assert (await runtime.lease(0, 1, ref)).ok
            prepared = await run(runtime, 0, 1, "echo task-a > /workspace/prepared.txt")
            assert prepared.outcome is ToolOutcome.OK, prepared
            frozen = await runtime.snapshot(0, 1)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            store = runtime.snapshots
            assert store is not None
            start = SnapshotStore.start

            def held_start(
                self: SnapshotStore, found: Snapshot, workspace: Path, ids: tuple[int, int] | None
            ) -> None:
                start(self, found, workspace, ids)
                mounted.set()
                assert go.wait(30), "the test never let the fork go on"

            monkeypatch.setattr(SnapshotStore, "start", held_start)
            fork = asyncio.ensure_future(runtime.fork(ref, frozen.snapshot, [(1, 2)]))
            assert await asyncio.to_thread(mounted.wait, 30), "the fork never mounted"
            assert store.forked(runtime.slot(1).workspace.root)  # the overlay is there
            reset = asyncio.ensure_future(runtime.reset(1, 2))  # the member was cancelled
            await asyncio.sleep(0.2)
            assert not reset.done()  # it waits for the fork's start
            go.set()
            (answer,) = await fork
            assert (answer.ok, answer.field) == (False, "epoch"), answer
            assert (await reset).ok
            assert not store.forked(runtime.slot(1).workspace.root)
            # the slot's next lease: another task's, over the server's own root
            after = await run(runtime, 1, 3, "echo mine > /workspace/out.txt; ls -A /workspace")
            assert after.outcome is ToolOutcome.OK, after
            assert after.content.split() == ["out.txt"], after.content
            seen = await runtime.read_artifact(1, "out.txt", 100)
            assert seen.data == b"mine\n"
            assert (await runtime.reset(1, 3)).ok
            assert (await runtime.reset(0, 1)).ok
        finally:
            go.set()
            await runtime.aclose()

    asyncio.run(main())
