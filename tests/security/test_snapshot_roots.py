"""A snapshot stays what it was frozen as: no lease writes it, whatever path it takes.

A snapshot's frozen layer is a read-only lower layer of every lease started from it, and the
keepers bind the snapshots' folder read-only (they mount the layers from there). Each attack
runs in a lease and is checked from the host, on the snapshot's files (the canary); its control
runs the same write where the lease may write, and finds it there.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import image_problem
from tests.integration.test_environment_leases import reset, shell, tree_digest
from tests.integration.test_slot_server import Server, call, one
from tests.integration.test_snapshots import PREPARE, prepared_snapshot, snapshot_server
from trajcore.domain.tools import ToolOutcome

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    """A server whose root lies outside ``/tmp`` (a lease's own ``/tmp`` would hide the
    snapshots' folder from the lease over the server's root, which attacks it by its path)."""
    with snapshot_server("snapshot-attacks", under=Path("/var/tmp")) as running:
        yield running


def test_no_lease_can_write_a_snapshot(image_server: tuple[Server, str]) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            snapshot = await prepared_snapshot(client, server, ref, 1)
            folder = server.root / "snapshots" / snapshot
            before = tree_digest(folder)
            frozen_file = folder / "root" / "prepared-root"
            frozen_workspace = folder / "workspace" / "prep.txt"

            # a fork: the frozen file in its root, its workspace's copy, the host paths
            assert (await client.lease(1, 1, ref, snapshot=snapshot)).ok
            attack = (
                f"echo owned > /prepared-root; echo owned >> /image-dir/made; "
                f"echo owned > {frozen_file}; echo owned > {frozen_workspace}; "
                f"echo owned >> /workspace/prep.txt; cat /prepared-root /workspace/prep.txt"
            )
            _, text = await shell(server, 1, 1, attack)
            # the frozen files are the fork's to change in its view (an idmapped lower), and
            # the host paths are out of its root; control: the writes landed, in the fork's
            # own layer and in its own workspace (the snapshot is checked from the host below)
            assert text.split()[:3] == ["owned", "prepared", "owned"], text
            assert text.count("Directory nonexistent") == 2, text
            own = server.seen(server.root / "slots" / "1" / "prep.txt")
            assert own.read_text() == "prepared\nowned\n"
            upper = server.root / "layers" / "1" / "upper"
            assert (upper / "prepared-root").read_text() == "owned\n"
            assert (upper / "image-dir" / "made").read_text() == "new\nowned\n"

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
            assert (await client.drop_snapshot(snapshot)).removed is True

    asyncio.run(main())


def test_no_fork_can_write_the_snapshots_workspace_under_its_overlay(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            snapshot = await prepared_snapshot(client, server, ref, 2)
            folder = server.root / "snapshots" / snapshot
            frozen_workspace = folder / "workspace"
            before = tree_digest(folder)
            assert (await client.lease(1, 2, ref, snapshot=snapshot)).ok
            assert (await client.health()).fork_workspaces == "overlay"
            forks = server.root / "forks" / "1"
            # through its workspace: every change lands in its own upper layer
            attack = (
                "echo owned >> /workspace/prep.txt; rm /workspace/src/main.py; "
                "echo owned > /workspace/src/new; rm -r /workspace/src; "
                f"echo owned > {frozen_workspace / 'prep.txt'}; "
                f"echo owned > {forks / 'lower' / 'prep.txt'}; ls {forks}; "
                "cat /workspace/prep.txt"
            )
            _, text = await shell(server, 1, 2, attack)
            assert text.split()[:2] == ["prepared", "owned"], text  # its own view
            assert "[stderr]" in text.split()[2:3], text
            # through the file tools: its own workspace, and no path out of it
            wrote = await one(
                client, call(1, "write_file", epoch=2, path="src/main.py", content="owned")
            )
            assert wrote.outcome == ToolOutcome.OK, wrote
            for path in (
                f"../../snapshots/{snapshot}/workspace/prep.txt",
                str(frozen_workspace / "prep.txt"),
                "../../forks/1/lower/prep.txt",
            ):
                escaped = await one(
                    client, call(1, "write_file", epoch=2, path=path, content="owned")
                )
                assert escaped.outcome != ToolOutcome.OK, (path, escaped)
            # a lease over the server's root that knows the host paths
            attack = (
                f"echo owned > {frozen_workspace / 'prep.txt'}; "
                f"echo owned > {forks / 'lower' / 'prep.txt'}; "
                f"echo owned > {forks / 'upper' / 'planted'}; ls {forks}; "
                "echo control > /workspace/control"
            )
            _, text = await shell(server, 2, 2, attack)
            assert "owned" not in text.replace("echo owned", ""), text
            assert (server.root / "slots" / "2" / "control").read_text() == "control\n"

            # the canary, from the host: the snapshot's workspace is as it was frozen
            assert tree_digest(folder) == before
            assert (frozen_workspace / "prep.txt").read_text() == "prepared\n"
            assert (frozen_workspace / "src" / "main.py").read_text() == "code\n"
            # and the fork's own, merged workspace holds its writes
            own = server.seen(server.root / "slots" / "1")
            assert (own / "prep.txt").read_text() == "prepared\nowned\n"
            assert (own / "src" / "main.py").read_text() == "owned"
            for slot in (0, 1, 2):
                await reset(server, slot, 2)

            # control: the same write, where the snapshot's workspace is made writable to the
            # slot, reaches it, and the check sees it
            uid, gid = own.stat().st_uid, own.stat().st_gid
            for opened in (folder, frozen_workspace):
                opened.chmod(0o755)
            os.chown(frozen_workspace / "prep.txt", uid, gid)
            writer = await asyncio.create_subprocess_exec(
                "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sh", "-c",
                f"echo owned >> {frozen_workspace / 'prep.txt'}",
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, stderr = await asyncio.wait_for(writer.communicate(), timeout=30)
            assert writer.returncode == 0, stderr
            assert tree_digest(folder) != before
            assert (await client.drop_snapshot(snapshot)).removed is True

    asyncio.run(main())


def test_the_frozen_lease_cannot_write_the_workspace_it_gave_its_snapshot(
    image_server: tuple[Server, str],
) -> None:
    """A snapshot's workspace holds the frozen lease's own files, moved (the same inodes), not
    copies: that lease goes on over an overlay of them, and none of its writes, by any path,
    reaches them; the frozen files are the server's, none the slot's."""
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            own = server.seen(server.root / "slots" / "0")
            assert (await client.lease(0, 3, ref)).ok
            code, text = await shell(server, 0, 3, PREPARE)
            assert code == 0, text
            written = (own / "src" / "main.py").stat()
            frozen = await client.snapshot(0, 3)
            assert frozen.ok, frozen
            assert frozen.snapshot is not None
            folder = server.root / "snapshots" / frozen.snapshot
            frozen_workspace = folder / "workspace"
            moved = (frozen_workspace / "src" / "main.py").stat()
            assert (moved.st_dev, moved.st_ino) == (written.st_dev, written.st_ino)
            owners = {
                (info.st_uid, info.st_gid)
                for info in (
                    (Path(path) / name).lstat()
                    for path, dirs, files in os.walk(frozen_workspace)
                    for name in (*dirs, *files)
                )
            }
            assert owners == {(os.geteuid(), os.getegid())}, owners
            before = tree_digest(folder)
            forks = server.root / "forks" / "0"
            attack = (
                "echo owned >> /workspace/prep.txt; echo owned >> /workspace/src/main.py; "
                "chmod 777 /workspace/src; echo owned > /workspace/src/new; "
                f"echo owned > {frozen_workspace / 'prep.txt'}; "
                f"echo owned > {forks / 'lower' / 'prep.txt'}; "
                "cat /workspace/prep.txt /workspace/src/main.py"
            )
            _, text = await shell(server, 0, 3, attack)
            assert text.split()[:4] == ["prepared", "owned", "code", "owned"], text
            wrote = await one(
                client, call(0, "write_file", epoch=3, path="src/main.py", content="by-tool")
            )
            assert wrote.outcome == ToolOutcome.OK, wrote
            for path in (
                f"../../snapshots/{frozen.snapshot}/workspace/prep.txt",
                str(frozen_workspace / "prep.txt"),
                "../../forks/0/lower/prep.txt",
            ):
                escaped = await one(
                    client, call(0, "write_file", epoch=3, path=path, content="owned")
                )
                assert escaped.outcome != ToolOutcome.OK, (path, escaped)
            # control: the writes landed, in the lease's own merged workspace
            assert (own / "prep.txt").read_text() == "prepared\nowned\n"
            assert (own / "src" / "main.py").read_text() == "by-tool"
            assert (own / "src" / "new").read_text() == "owned\n"
            # the canary, from the host: the snapshot's workspace is as it was frozen
            assert tree_digest(folder) == before
            assert (frozen_workspace / "prep.txt").read_text() == "prepared\n"
            assert (frozen_workspace / "src" / "main.py").read_text() == "code\n"
            assert not (frozen_workspace / "src" / "new").exists()
            await reset(server, 0, 3)
            # control: the same write by the slot's uid, where the frozen file is made its own
            # and its folders searchable, reaches it, and the check sees it
            for opened in (folder, frozen_workspace):
                opened.chmod(0o755)
            os.chown(frozen_workspace / "prep.txt", written.st_uid, written.st_gid)
            writer = await asyncio.create_subprocess_exec(
                "setpriv", f"--reuid={written.st_uid}", f"--regid={written.st_gid}",
                "--clear-groups", "sh", "-c", f"echo owned >> {frozen_workspace / 'prep.txt'}",
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, stderr = await asyncio.wait_for(writer.communicate(), timeout=30)
            assert writer.returncode == 0, stderr
            assert tree_digest(folder) != before
            assert (await client.drop_snapshot(frozen.snapshot)).removed is True

    asyncio.run(main())
