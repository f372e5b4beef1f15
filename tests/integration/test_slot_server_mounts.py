"""A slot server's mounts are its own: it runs in a mount namespace of its own, so a server
killed without its close (SIGKILL) leaves nothing mounted on the host.

With an image cache the server binds its root onto itself (a shared mount) and mounts each
forked workspace's overlay at the slot's workspace. The test kills such a server, one fork
running, and reads the host's ``/proc/self/mountinfo``; the control reads the same mounts in
the server's own namespace (``/proc/<pid>/mountinfo``) while it runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.integration.test_environment_leases import shell
from tests.integration.test_slot_server import Server, searchable_dir, start_server, stop_server

pytestmark = [
    pytest.mark.skipif(image_problem() is not None, reason=str(image_problem())),
    pytest.mark.skipif(os.geteuid() != 0, reason="only a server run as root mounts anything"),
]


def mount_points(mountinfo: str, under: Path) -> list[Path]:
    """The mount points at or below ``under`` that ``mountinfo`` lists (escapes read)."""
    found = []
    for line in Path(mountinfo).read_text(encoding="utf-8").splitlines():
        point = Path(line.split(" ")[4].encode().decode("unicode_escape"))
        if point == under or point.is_relative_to(under):
            found.append(point)
    return found


def test_a_killed_server_leaves_no_mount_of_its_root_on_the_host() -> None:
    with searchable_dir("mounts") as folder:
        write_shell_image(folder / "layout", salt="mounts")
        root = folder / "root"
        server = start_server(root, "--image-cache", str(folder / "cache"))
        pid = server.process.pid
        try:
            assert server.ready["mount_namespace"] == "own", server.ready
            asyncio.run(_fork_one(server, f"oci:{folder / 'layout'}"))
            # control: in the server's namespace, its root's bind and the fork's overlay
            inside = mount_points(f"/proc/{pid}/mountinfo", root)
            assert root in inside, inside
            assert root / "slots" / "1" in inside, inside
            assert mount_points("/proc/self/mountinfo", root) == []  # none of them here
        finally:
            server.process.send_signal(signal.SIGKILL)
            stop_server(server)
        assert mount_points("/proc/self/mountinfo", root) == []


async def _fork_one(server: Server, ref: str) -> None:
    async with server.client() as client:
        assert (await client.lease(0, 1, ref)).ok
        code, text = await shell(server, 0, 1, "echo prepared > /workspace/prep.txt")
        assert code == 0, text
        frozen = await client.snapshot(0, 1)
        assert frozen.ok, frozen
        assert (await client.lease(1, 1, ref, snapshot=frozen.snapshot)).ok
        code, text = await shell(server, 1, 1, "cat /workspace/prep.txt")
        assert (code, text.strip()) == (0, "prepared"), text
