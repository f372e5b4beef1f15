"""Snapshots and forks in a real slot server (real bubblewrap, the compiled keeper).

A lease over an image prepares files in its workspace and in its root, ``POST /v1/snapshot``
freezes them, and leases of other slots start from the snapshot copy-on-write: each sees what
the first lease prepared (a file it deleted from the image included: deleted), and nothing one
of them writes reaches another or the snapshot, whose files are checked from the host.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tarfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.environment_roots import image_problem
from tests.image_layouts import Entry
from tests.integration.image_leases import shell_image_server
from tests.integration.test_environment_leases import (
    freeze,
    measured_layers,
    reset,
    run_in_lease,
    shell,
    tree_digest,
)
from tests.integration.test_slot_server import (
    Server,
    call,
    one,
)
from trajcore.adapters.pools.client import SlotServerClient
from trajcore.domain.slot_protocol import SnapshotAnswer
from trajcore.domain.tools import ToolOutcome

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]

IMAGE_FILE = Entry(name="image-file", data=b"from-image\n", mode=0o644)
EMPTY_DIR = Entry(name="image-dir/", kind=tarfile.DIRTYPE, mode=0o755)
PREPARE = (
    "echo prepared > /workspace/prep.txt && mkdir /workspace/src && "
    "echo code > /workspace/src/main.py && echo root-prepared > /prepared-root && "
    "rm /image-file && rm -r /image-dir && mkdir /image-dir && echo new > /image-dir/made"
)


def snapshot_server(
    tag: str, *flags: str, under: Path | None = None
) -> AbstractContextManager[tuple[Server, str]]:
    """A slot server with an image cache in a fresh searchable folder (``shell_image_server``),
    and the reference of an image with a file and a folder at its top (where a lease may delete
    them: the overlay's root is the lease's own)."""
    return shell_image_server(tag, *flags, under=under, salt=tag, extra=[IMAGE_FILE, EMPTY_DIR])


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    with snapshot_server("snapshots") as running:
        yield running


def snapshot_folder(server: Server, snapshot: str) -> Path:
    return server.root / "snapshots" / snapshot


async def wait_gone(path: Path) -> None:
    deadline = time.monotonic() + 10
    while path.exists():  # noqa: ASYNC240 - a poll between sleeps
        assert time.monotonic() < deadline, f"{path} is still there"
        await asyncio.sleep(0.05)


async def freeze_prepared(
    client: SlotServerClient, server: Server, ref: str, epoch: int
) -> SnapshotAnswer:
    """Slot 0's lease ``epoch`` over ``ref`` prepares files (``PREPARE``) and is frozen; the
    server's answer (granted, with an id)."""
    await run_in_lease(client, server, 0, epoch, ref, command=PREPARE)
    return await freeze(client, 0, epoch)


async def prepared_snapshot(client: SlotServerClient, server: Server, ref: str, epoch: int) -> str:
    """``freeze_prepared``'s snapshot id."""
    snapshot = (await freeze_prepared(client, server, ref, epoch)).snapshot
    assert snapshot is not None
    return snapshot


def test_forks_start_from_what_the_first_lease_prepared_and_stay_apart(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            frozen = await freeze_prepared(client, server, ref, 1)
            assert frozen.snapshot is not None
            assert frozen.bytes >= len("prepared\ncode\nroot-prepared\nnew\n"), frozen
            folder = snapshot_folder(server, frozen.snapshot)
            # the frozen layer, from the host: the deletion is an overlay whiteout, kept
            whiteout = (folder / "root" / "image-file").lstat()
            assert stat.S_ISCHR(whiteout.st_mode), whiteout
            assert whiteout.st_rdev == 0
            assert (folder / "root" / "prepared-root").read_text() == "root-prepared\n"
            assert (folder / "workspace" / "src" / "main.py").read_text() == "code\n"
            before = tree_digest(folder)
            health = await client.health()
            assert (health.snapshots, health.snapshot_bytes) == (1, frozen.bytes), health

            for slot in (1, 2):
                fork = await client.lease(slot, 1, ref, snapshot=frozen.snapshot)
                assert fork.ok, fork
                assert fork.snapshot == frozen.snapshot
            see = (
                "cat /workspace/prep.txt /workspace/src/main.py /prepared-root "
                "/image-dir/made; ls /"
            )
            for slot in (1, 2):
                code, text = await shell(server, slot, 1, see)
                assert code == 0, text
                assert text.split()[:4] == ["prepared", "code", "root-prepared", "new"], text
                assert "image-file" not in text.split(), text  # deleted in the image: deleted
                code, text = await shell(server, slot, 1, "cat /image-file")
                assert code != 0, text
            # each fork writes over what it was given; its own workspace is its own
            code, text = await shell(
                server, 1, 1,
                "echo from-b > /workspace/prep.txt && echo b > /b-only && "
                "rm /prepared-root && echo b-root > /prepared-root",
            )  # fmt: skip
            assert code == 0, text
            # what the frozen layer holds is the fork's to change (an idmapped lower), copied
            # up into its own layer: the other fork and the snapshot keep theirs
            code, text = await shell(server, 1, 1, "echo b >> /image-dir/made; cat /image-dir/made")
            assert (code, text.split()) == (0, ["new", "b"]), text
            code, text = await shell(
                server, 2, 1,
                "cat /workspace/prep.txt /prepared-root /image-dir/made; ls /b-only; "
                "echo c > /workspace/c-only",
            )  # fmt: skip
            assert text.split()[:3] == ["prepared", "root-prepared", "new"], text
            assert "No such file" in text, text
            code, text = await shell(server, 1, 1, "cat /workspace/prep.txt /prepared-root")
            assert text.split() == ["from-b", "b-root"], text
            code, text = await shell(server, 1, 1, "ls /workspace")
            assert text.split() == ["prep.txt", "src"], text
            # the first lease goes on over its own snapshot, apart from its forks
            code, text = await shell(server, 0, 1, "cat /workspace/prep.txt /prepared-root")
            assert (code, text.split()) == (0, ["prepared", "root-prepared"]), text
            code, text = await shell(server, 0, 1, "echo a2 > /workspace/prep.txt; ls /")
            assert "b-only" not in text.split(), text
            assert tree_digest(folder) == before
            health = await client.health()
            assert (health.snapshots, health.forks) == (1, 2), health
            # the snapshot goes once its leases have reset
            dropped = await client.drop_snapshot(frozen.snapshot)
            assert (dropped.ok, dropped.removed, dropped.leases) == (True, False, 3), dropped
            later = await client.lease(3, 1, ref, snapshot=frozen.snapshot)
            assert (later.ok, later.field) == (False, "snapshot"), later
            assert "dropped" in str(later.error)
            for slot in (0, 1, 2):
                assert folder.exists()
                await reset(server, slot, 1)
            await wait_gone(folder)
            assert (await client.health()).snapshots == 0
            await reset(server, 3, 1)

    asyncio.run(main())


def test_a_snapshot_of_a_fork_stacks_on_its_parent(image_server: tuple[Server, str]) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            first = await prepared_snapshot(client, server, ref, 2)
            on_first = "echo second > /second && rm /prepared-root"
            await run_in_lease(client, server, 1, 2, ref, command=on_first, snapshot=first)
            second = await freeze(client, 1, 2)
            assert second.snapshot is not None
            # the first snapshot, dropped, stays while the second stands on it
            assert (await client.drop_snapshot(first)).removed is False
            for slot in (0, 1):
                await reset(server, slot, 2)
            assert snapshot_folder(server, first).exists()
            assert (await client.lease(2, 2, ref, snapshot=second.snapshot)).ok
            _, text = await shell(server, 2, 2, "cat /second /workspace/prep.txt; ls /")
            assert text.split()[:2] == ["second", "prepared"], text
            assert "prepared-root" not in text.split(), text
            assert "image-file" not in text.split(), text
            await reset(server, 2, 2)
            assert (await client.drop_snapshot(second.snapshot)).removed is True
            await wait_gone(snapshot_folder(server, second.snapshot))
            await wait_gone(snapshot_folder(server, first))

    asyncio.run(main())


def test_bad_snapshot_requests_are_refused_and_the_slot_goes_on(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            # a lease over the server's own root has no layer to freeze
            code, _ = await shell(server, 3, 5, "echo x > /workspace/x")
            assert code == 0
            plain = await client.snapshot(3, 5)
            assert (plain.ok, plain.field) == (False, "epoch"), plain
            assert "over the server's own root" in str(plain.error)
            code, text = await shell(server, 3, 5, "cat /workspace/x")
            assert (code, text.strip()) == (0, "x")
            await reset(server, 3, 5)
            stale = await client.snapshot(3, 5)
            assert (stale.ok, stale.field) == (False, "epoch"), stale
            # an unknown snapshot, a snapshot over another image
            unknown = await client.lease(3, 6, ref, snapshot="0" * 32)
            assert (unknown.ok, unknown.field) == (False, "snapshot"), unknown
            assert "no snapshot" in str(unknown.error)
            frozen = await prepared_snapshot(client, server, ref, 3)
            other = await client.lease(3, 6, "oci:/elsewhere", snapshot=frozen)
            assert (other.ok, other.field) == (False, "environment"), other
            assert "was taken over" in str(other.error)
            missing = await client.drop_snapshot("no-such")
            assert (missing.ok, missing.field) == (False, "snapshot"), missing
            # the slot goes on: the same epoch from the snapshot, then over the root again
            assert (await client.lease(3, 6, ref, snapshot=frozen)).ok
            code, text = await shell(server, 3, 6, "cat /workspace/prep.txt")
            assert (code, text.strip()) == (0, "prepared")
            await reset(server, 3, 6)
            await reset(server, 0, 3)
            assert (await client.drop_snapshot(frozen)).removed is True

    asyncio.run(main())


def test_a_snapshot_past_the_servers_limit_is_refused_and_the_lease_keeps_its_files() -> None:
    with snapshot_server("snapshot-limit", "--snapshot-bytes", "8") as (running, ref):
        asyncio.run(_refused_past_the_limit(running, ref))


async def _refused_past_the_limit(server: Server, ref: str) -> None:
    async with server.client() as client:
        await run_in_lease(client, server, 0, 1, ref, command=PREPARE)
        refused = await client.snapshot(0, 1)
        assert (refused.ok, refused.field) == (False, "snapshot"), refused
        assert "--snapshot-bytes" in str(refused.error)
        code, text = await shell(server, 0, 1, "cat /workspace/prep.txt /prepared-root")
        assert (code, text.split()) == (0, ["prepared", "root-prepared"]), text
        assert os.listdir(server.root / "snapshots") == []
        assert (await client.health()).snapshots == 0
        await reset(server, 0, 1)


MANY = 2000
MAKE_MANY = (
    f"mkdir /workspace/many && cd /workspace/many && i=0; while [ $i -lt {MANY} ]; do "
    "i=$((i + 1)); echo $i > f$i; done && echo prepared > /workspace/prep.txt"
)


def mounted_at(server: Server, path: Path) -> str | None:
    """The file system type mounted at ``path`` (``server.seen``'s) in the server's namespace."""
    pid = server.process.pid
    point = "/" + str(path.relative_to(f"/proc/{pid}/root"))
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as info:
        for line in info:
            fields = line.split(" ")
            if fields[4] == point:
                return fields[fields.index("-") + 1]
    return None


def test_a_forks_workspace_is_an_overlay_over_the_snapshots_and_its_writes_stay_its_own(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            await run_in_lease(client, server, 0, 20, ref, command=MAKE_MANY)
            frozen = await freeze(client, 0, 20)
            assert frozen.snapshot is not None
            folder = snapshot_folder(server, frozen.snapshot)
            before = tree_digest(folder)
            for slot in (1, 2):
                assert (await client.lease(slot, 20, ref, snapshot=frozen.snapshot)).ok
            assert (await client.health()).fork_workspaces == "overlay"
            workspaces = [server.seen(server.root / "slots" / str(slot)) for slot in (1, 2)]
            for workspace in workspaces:  # from the host: the merged workspace
                assert mounted_at(server, workspace) == "overlay"
                assert (workspace / "many" / f"f{MANY}").read_text() == f"{MANY}\n"
                assert len(os.listdir(workspace / "many")) == MANY
            # a fork writes, renames and removes the snapshot's files: its own, from the host
            code, text = await shell(
                server, 1, 20,
                "echo b > /workspace/many/f1 && cat /workspace/many/f2 > /workspace/moved && "
                "rm /workspace/many/f2 /workspace/many/f3 && echo b-new > /workspace/b-new && "
                "ls -ln /workspace/prep.txt",
            )  # fmt: skip
            assert code == 0, text
            uid = workspaces[0].stat().st_uid
            assert text.split()[2] == str(uid), text  # the snapshot's file is the slot's
            assert (workspaces[0] / "many" / "f1").read_text() == "b\n"
            assert (workspaces[0] / "moved").read_text() == "2\n"
            assert not (workspaces[0] / "many" / "f2").exists()
            assert not (workspaces[0] / "many" / "f3").exists()
            other = workspaces[1]
            assert (other / "many" / "f1").read_text() == "1\n"
            assert (other / "many" / "f2").exists()
            assert (other / "many" / "f3").exists()
            assert not (other / "b-new").exists()
            assert not (other / "moved").exists()
            assert (folder / "workspace" / "many" / "f1").read_text() == "1\n"
            assert tree_digest(folder) == before
            # the file tools and the artifacts see the merged workspace
            read = await one(client, call(2, "read_file", epoch=20, path="many/f7"))
            assert read.outcome == ToolOutcome.OK, read
            assert "7" in read.content, read
            artifact = await client.read_artifact(2, "prep.txt")
            assert artifact.data == b"prepared\n", artifact
            wrote = await one(
                client,
                call(2, "write_file", epoch=20, path="many/f8", content="by-tool\n"),
            )
            assert wrote.outcome == ToolOutcome.OK, wrote
            code, text = await shell(server, 2, 20, "cat /workspace/many/f8")
            assert (code, text.strip()) == (0, "by-tool"), text
            assert (folder / "workspace" / "many" / "f8").read_text() == "8\n"
            # the reset takes the overlay away: the slot's next lease sees an empty workspace
            for slot in (0, 1, 2):
                await reset(server, slot, 20)
            for workspace in workspaces:
                assert mounted_at(server, workspace) is None
                assert os.listdir(workspace) == []
            for slot in (1, 2):
                code, text = await shell(server, slot, 21, "ls -A /workspace | wc -l")
                assert (code, text.strip()) == (0, "0"), text
                await reset(server, slot, 21)
            assert (await client.drop_snapshot(frozen.snapshot)).removed is True

    asyncio.run(main())


def test_a_fork_edits_the_snapshots_frozen_files_in_its_own_layer(
    image_server: tuple[Server, str],
) -> None:
    """A file the preparation wrote at the lease's root is frozen as the server's: every fork
    owns it (the server's ids shown as the fork's slot's), edits it in its own layer, and the
    fork's reset takes the edit away; the snapshot never changes."""
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            frozen = await prepared_snapshot(client, server, ref, 30)
            folder = snapshot_folder(server, frozen)
            frozen_file = folder / "root" / "prepared-root"
            assert frozen_file.stat().st_uid == os.geteuid()  # the server's, not the slot's
            before = tree_digest(folder)
            assert (await client.lease(1, 30, ref, snapshot=frozen)).ok
            code, text = await shell(server, 1, 30, "id -u; ls -ln /prepared-root /image-dir/made")
            assert code == 0, text
            uid = text.split()[0]
            assert text.split()[3] == text.split()[12] == uid, text  # both the fork's own
            edit = (
                "echo edited >> /prepared-root && rm /image-dir/made && echo mine > /image-dir/x"
                " && cat /prepared-root && ls /image-dir"
            )
            code, text = await shell(server, 1, 30, edit)
            assert (code, text.split()) == (0, ["root-prepared", "edited", "x"]), text
            upper = server.root / "layers" / "1" / "upper"
            assert (upper / "prepared-root").read_text() == "root-prepared\nedited\n"
            assert frozen_file.read_text() == "root-prepared\n"
            assert tree_digest(folder) == before
            await reset(server, 1, 30)
            assert (await client.lease(1, 31, ref, snapshot=frozen)).ok
            code, text = await shell(server, 1, 31, "cat /prepared-root; ls /image-dir")
            assert (code, text.split()) == (0, ["root-prepared", "made"]), text
            await reset(server, 1, 31)
            await reset(server, 0, 30)
            assert tree_digest(folder) == before
            assert (await client.drop_snapshot(frozen)).removed is True

    asyncio.run(main())


def test_a_forks_reset_measures_its_root_layer_and_its_workspace_overlays_layer(
    image_server: tuple[Server, str],
) -> None:
    """A fork writes 200 kB into its workspace (its overlay's upper layer, when forks' workspaces
    are overlays) and 200 kB at its root: its reset counts one layer holding both."""
    server, ref = image_server
    size = 200_000

    async def main() -> None:
        async with server.client() as client:
            frozen = await prepared_snapshot(client, server, ref, 90)
            await reset(server, 0, 90)
            before = await measured_layers(client, server, 0)
            assert (await client.lease(1, 90, ref, snapshot=frozen)).ok
            wrote = await one(
                client, call(1, "write_file", epoch=90, path="big.bin", content="x" * size)
            )
            assert wrote.outcome == ToolOutcome.OK, wrote
            code, text = await shell(server, 1, 90, "cat /workspace/big.bin > /big")
            assert code == 0, text
            overlay = (await client.health()).fork_workspaces == "overlay"
            await reset(server, 1, 90)
            after = await measured_layers(client, server, before.measured + 1)
            assert after.measured == before.measured + 1, after
            assert after.last_bytes >= (2 if overlay else 1) * size, (overlay, after)
            assert after.bytes - before.bytes == after.last_bytes, after
            assert (await client.drop_snapshot(frozen)).removed is True

    asyncio.run(main())


def test_a_snapshot_moves_the_leases_workspace_and_the_lease_goes_on_over_an_overlay(
    image_server: tuple[Server, str],
) -> None:
    """Freezing a workspace is renames, not a copy: the snapshot holds the lease's own files
    (the same inodes), given to the server; the lease goes on over an overlay of them, as a
    fork does, and what it writes then is its own."""
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            await run_in_lease(client, server, 0, 100, ref, command=MAKE_MANY)
            workspace = server.seen(server.root / "slots" / "0")
            written = (workspace / "many" / "f7").stat()
            assert written.st_uid != os.geteuid()  # the slot's
            frozen = await freeze(client, 0, 100)
            assert frozen.snapshot is not None
            folder = snapshot_folder(server, frozen.snapshot)
            moved = (folder / "workspace" / "many" / "f7").stat()
            assert (moved.st_dev, moved.st_ino) == (written.st_dev, written.st_ino)  # not copied
            assert (moved.st_uid, moved.st_gid) == (os.geteuid(), os.getegid())
            assert stat.S_IMODE((folder / "workspace").stat().st_mode) == 0o700
            assert mounted_at(server, workspace) == "overlay"
            before = tree_digest(folder)
            # the lease goes on over its snapshot's files, as its own, and changes them
            code, text = await shell(
                server, 0, 100,
                "cat /workspace/many/f7 && echo a > /workspace/many/f7 && "
                "rm /workspace/many/f8 && echo new > /workspace/new && ls -ln /workspace/prep.txt",
            )  # fmt: skip
            assert code == 0, text
            assert text.split()[0] == "7", text
            assert text.split()[3] == str(written.st_uid), text
            wrote = await one(
                client, call(0, "write_file", epoch=100, path="many/f9", content="by-tool\n")
            )
            assert wrote.outcome == ToolOutcome.OK, wrote
            assert (workspace / "many" / "f7").read_text() == "a\n"
            assert (workspace / "many" / "f9").read_text() == "by-tool\n"
            assert not (workspace / "many" / "f8").exists()
            # a fork starts from the snapshot as frozen, not from the lease's later writes
            assert (await client.lease(1, 100, ref, snapshot=frozen.snapshot)).ok
            code, text = await shell(
                server, 1, 100, "cat /workspace/many/f7 /workspace/many/f8 /workspace/many/f9"
            )
            assert (code, text.split()) == (0, ["7", "8", "9"]), text
            code, text = await shell(server, 1, 100, "ls /workspace/new")
            assert code != 0, text
            assert tree_digest(folder) == before
            assert (folder / "workspace" / "many" / "f7").read_text() == "7\n"
            # the resets take the overlays away: both slots' next leases see empty workspaces
            for slot in (0, 1):
                await reset(server, slot, 100)
            assert mounted_at(server, workspace) is None
            assert os.listdir(workspace) == []
            for slot in (0, 1):
                code, text = await shell(server, slot, 101, "ls -A /workspace | wc -l")
                assert (code, text.strip()) == (0, "0"), text
                await reset(server, slot, 101)
            assert (await client.drop_snapshot(frozen.snapshot)).removed is True

    asyncio.run(main())


def test_a_snapshot_of_the_root_alone_forks_without_a_workspace_overlay_or_a_new_keeper(
    image_server: tuple[Server, str],
) -> None:
    """A preparation that wrote to its root alone: the frozen lease and its forks keep plain,
    empty workspaces of their own (nothing mounted there, seen from the host), see the
    prepared root, and a fork's reset leaves its slot's keeper running (a fork's workspace
    overlay would end it)."""
    server, ref = image_server

    async def main() -> None:
        async with server.client() as client:
            await run_in_lease(
                client, server, 0, 400, ref, command="echo root-only > /prepared-root"
            )
            frozen = await freeze(client, 0, 400)
            assert frozen.snapshot is not None
            assert (await client.lease(1, 400, ref, snapshot=frozen.snapshot)).ok
            for slot in (0, 1):
                workspace = server.seen(server.root / "slots" / str(slot))
                assert mounted_at(server, workspace) is None
                code, text = await shell(
                    server, slot, 400, "cat /prepared-root; ls -A /workspace; echo x > /workspace/x"
                )
                assert (code, text.split()) == (0, ["root-only"]), text
                assert (workspace / "x").stat().st_uid != os.geteuid()  # the slot's own
            keeper = (await client.list_slots()).slots[1].sandbox_pid
            assert keeper is not None
            await reset(server, 1, 400)
            assert (await client.list_slots()).slots[1].sandbox_pid == keeper
            await reset(server, 0, 400)
            assert (await client.drop_snapshot(frozen.snapshot)).removed is True

    asyncio.run(main())


def test_a_slots_first_fork_mounts_over_the_fork_folder_its_server_made_at_start() -> None:
    """Every slot's fork folder (``lower``, ``work`` and the slot's ``upper``) is made when the
    server starts, so a slot's first fork only clones and mounts: its workspace overlay's upper
    layer is that folder (the same inode; the fork's write lands in it, seen from the host),
    the slot's, mode 0700, in a folder of the server's."""
    with snapshot_server("fork-folders") as (server, ref):

        async def main() -> None:
            forks = server.seen(server.root / "forks")
            uids = {}
            for slot in range(4):
                upper = forks / str(slot) / "upper"
                info = upper.stat()
                assert stat.S_IMODE(info.st_mode) == 0o700
                assert (forks / str(slot)).stat().st_uid == os.geteuid()
                assert sorted(os.listdir(forks / str(slot))) == ["lower", "upper", "work"]
                uids[slot] = info.st_uid
            assert len(set(uids.values())) == 4  # each slot's own
            made = (forks / "1" / "upper").stat().st_ino
            async with server.client() as client:
                snapshot = await prepared_snapshot(client, server, ref, 1)
                assert (await client.lease(1, 1, ref, snapshot=snapshot)).ok
                workspace = server.seen(server.root / "slots" / "1")
                assert mounted_at(server, workspace) == "overlay"
                assert uids[1] == workspace.stat().st_uid
                code, text = await shell(server, 1, 1, "echo fork > /workspace/forked")
                assert code == 0, text
                upper = forks / "1" / "upper"
                assert upper.stat().st_ino == made
                assert (upper / "forked").read_text() == "fork\n"
                for slot in (0, 1):
                    await reset(server, slot, 1)
                assert (await client.drop_snapshot(snapshot)).ok

        asyncio.run(main())
