"""A lease over a task environment writes into its root's own layer (``ROOT/layers/<i>/upper``
on the server's storage), not only into its workspace: that layer counts against the same disk
budget (8 MiB here).

The attack writes 1 MiB files into a folder of the image's root (one every 10 ms, up to
200 MiB); the answer must name the budget, the layer read from the host must hold far less
than 200 MiB, and after the reset the slot's layer is empty. Control: the same lease writing
2 MiB there ends normally, and the layer, read from the host, holds it (so the check does look
where the lease writes).

A fork (a lease started from a snapshot, its workspace an overlay over the snapshot's frozen
workspace) is held to its own writes only: from a snapshot of 7 MiB, a fork that writes 4 MiB
(11 MiB in its merged view) goes on, and one that writes 5 MiB more is ended, naming the budget.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem, write_shell_image
from tests.image_layouts import Entry
from tests.integration.test_environment_leases import lease, reset
from tests.integration.test_slot_server import Server, searchable_dir, start_server, stop_server
from tests.security.test_disk_budget import BUDGET_BYTES, WRITER, used_bytes
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.slot_protocol import ExecuteCall
from trajcore.domain.tools import ToolOutcome, ToolResult

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    with searchable_dir("disk-environments") as folder:
        cache = Path(tempfile.mkdtemp(prefix="trajcore-cache-", dir="/var/tmp"))
        cache.chmod(0o755)
        try:
            tools = [  # the writer's two programs (the shell image's libc is theirs)
                Entry(name=f"bin/{name}", data=Path(f"/usr/bin/{name}").read_bytes(), mode=0o755)
                for name in ("head", "sleep")
            ]
            write_shell_image(folder / "layout", salt="disk", extra=tools)
            running = start_server(
                folder / "root", "--image-cache", str(cache), f"--disk-bytes={BUDGET_BYTES}"
            )
            yield running, f"oci:{folder / 'layout'}"
            assert stop_server(running) == 0
        finally:
            shutil.rmtree(cache, ignore_errors=True)


async def _bash(client: SlotServerClient, slot: int, epoch: int, command: str) -> ToolResult:
    call = ExecuteCall(
        slot=slot, epoch=epoch, call_id=f"disk-{os.urandom(6).hex()}", tool="bash",
        arguments={"command": command}, timeout_s=20.0,
    )  # fmt: skip
    (result,) = await client.execute([call])
    return result


def test_a_lease_over_an_environment_is_held_to_the_budget_in_its_root_too(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server
    layer = server.root / "layers" / "0" / "upper"

    async def main() -> None:
        assert (await lease(server, 0, 1, ref))["ok"] is True
        async with server.client() as client:
            control = "mkdir /data && head -c 2097152 /dev/zero > /data/kept"
            kept = await _bash(client, 0, 1, control)
            assert kept.outcome is ToolOutcome.OK, kept
            assert kept.exec is not None
            assert kept.exec.exit_code == 0, kept
            assert used_bytes(layer) >= 2 << 20  # control: the layer is where it writes
            command = "mkdir /data/fill && cd /data/fill && " + WRITER.format(count=200)
            ended = await _bash(client, 0, 1, command)
        assert ended.outcome is ToolOutcome.TOOL_ERROR, ended
        assert f"disk budget of {BUDGET_BYTES} bytes (disk_bytes) reached" in (ended.error or "")
        assert used_bytes(layer) < 100 << 20
        await reset(server, 0, 1)
        assert used_bytes(layer) == 0

    asyncio.run(main())


async def _write_mib(client: SlotServerClient, slot: int, epoch: int) -> None:
    """``a``, 1 MiB, in the slot's workspace, written by ``write_file``."""
    call = ExecuteCall(
        slot=slot, epoch=epoch, call_id=f"disk-{os.urandom(6).hex()}", tool="write_file",
        arguments={"path": "a", "content": "a" * (1 << 20)}, timeout_s=20.0,
    )  # fmt: skip
    (result,) = await client.execute([call])
    assert result.outcome is ToolOutcome.OK, result


def test_a_fork_is_held_to_what_it_writes_not_to_its_snapshot(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            health = await client.health()
            if health.fork_workspaces != "overlay":
                pytest.skip(f"forked workspaces are not overlays here: {health.fork_workspaces}")
            assert (await lease(server, 2, 1, ref))["ok"] is True
            await _write_mib(client, 2, 1)
            made = await _bash(client, 2, 1, "cat a a a a a a > big")  # 7 MiB in all
            assert made.exec is not None
            assert made.exec.exit_code == 0, made
            frozen = await client.snapshot(2, 1)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            assert (await client.lease(3, 1, ref, snapshot=frozen.snapshot)).ok
            kept = await _bash(client, 3, 1, "cat a a a a > more")  # 11 MiB in its view
            assert kept.exec is not None
            assert kept.exec.exit_code == 0, kept
            await asyncio.sleep(1.5)  # the watch measured the fork meanwhile
            still = await _bash(client, 3, 1, "cat more > /dev/null")
            assert still.outcome is ToolOutcome.OK, still
            await _bash(client, 3, 1, "cat a a a a a > more2")  # 9 MiB of its own
            result = None
            for _ in range(50):
                await asyncio.sleep(0.2)
                result = await _bash(client, 3, 1, "true")
                if result.outcome is not ToolOutcome.OK:
                    break
            assert result is not None
            assert result.outcome is ToolOutcome.TOOL_ERROR, result
            assert "(disk_bytes) reached" in (result.error or "")
            await reset(server, 3, 1)
            await reset(server, 2, 1)
            assert (await client.drop_snapshot(frozen.snapshot)).ok

    asyncio.run(main())
