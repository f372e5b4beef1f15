"""A snapshot stays what it was frozen as: no lease writes it, whatever path it takes.

A snapshot's frozen layer is a read-only lower layer of every lease started from it, and the
keepers bind the snapshots' folder read-only (they mount the layers from there). Each attack
runs in a lease and is checked from the host, on the snapshot's files (the canary); its control
runs the same write where the lease may write, and finds it there.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.integration.test_environment_leases import reset, shell, tree_digest
from tests.integration.test_slot_server import Server, start_server, stop_server
from tests.integration.test_snapshots import EMPTY_DIR, IMAGE_FILE, PREPARE

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    """A server whose root lies outside ``/tmp`` (a lease's own ``/tmp`` would hide the
    snapshots' folder from the lease over the server's root, which attacks it by its path)."""
    folder = Path(tempfile.mkdtemp(prefix="trajcore-snapshot-attacks-", dir="/var/tmp"))
    folder.chmod(0o711)
    try:
        write_shell_image(folder / "layout", salt="snapshot-attacks", extra=[IMAGE_FILE, EMPTY_DIR])
        running = start_server(folder / "root", "--image-cache", str(folder / "cache"))
        yield running, f"oci:{folder / 'layout'}"
        assert stop_server(running) == 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_no_lease_can_write_a_snapshot(image_server: tuple[Server, str]) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            assert (await client.lease(0, 1, ref)).ok
            code, text = await shell(server, 0, 1, PREPARE)
            assert code == 0, text
            frozen = await client.snapshot(0, 1)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            folder = server.root / "snapshots" / frozen.snapshot
            before = tree_digest(folder)
            frozen_file = folder / "root" / "prepared-root"
            frozen_workspace = folder / "workspace" / "prep.txt"

            # a fork: the frozen file in its root, its workspace's copy, the host paths
            assert (await client.lease(1, 1, ref, snapshot=frozen.snapshot)).ok
            attack = (
                f"echo owned > /prepared-root; echo owned >> /image-dir/made; "
                f"echo owned > {frozen_file}; echo owned > {frozen_workspace}; "
                f"echo owned >> /workspace/prep.txt; cat /prepared-root /workspace/prep.txt"
            )
            _, text = await shell(server, 1, 1, attack)
            # the frozen file, unchanged in its view
            # control: the fork's own workspace took the write (a copy of its own)
            assert text.split()[:3] == ["root-prepared", "prepared", "owned"], text
            assert text.count("Permission denied") == 2, text
            own = server.root / "slots" / "1" / "prep.txt"
            assert own.read_text() == "prepared\nowned\n"

            # a lease over the server's root that knows the snapshot's host path
            attack = (
                f"ls {server.root / 'snapshots'}; echo owned > {frozen_file}; "
                f"echo owned > {folder / 'root' / 'planted'}; cat {frozen_workspace}; "
                "echo control > /workspace/control"
            )
            _, text = await shell(server, 2, 1, attack)
            assert text.count("Read-only file system") == 2, text
            assert "ls: cannot open directory" in text, text  # it lists nothing to a slot
            assert "prep.txt: Permission denied" in text, text  # the frozen workspace
            assert "prepared\n" not in text.replace("[stderr]", ""), text
            assert (server.root / "slots" / "2" / "control").read_text() == "control\n"

            # the canary, from the host
            assert tree_digest(folder) == before
            assert frozen_file.read_text() == "root-prepared\n"
            assert frozen_workspace.read_text() == "prepared\n"
            assert not (folder / "root" / "planted").exists()
            for slot in (0, 1, 2):
                await reset(server, slot, 1)
            assert (await client.drop_snapshot(frozen.snapshot)).removed is True

    asyncio.run(main())
