"""A lease over a task environment: the cached image stays untouched and the host stays out of
reach.

The keeper's sandbox binds the image cache read-only and the slot's layer directory read-write
(the keeper needs both to build a lease's root); a lease over an image pivots into an overlay of
the cached tree and must see neither. Each attack runs in a lease over the image and is checked
from outside; its control runs the same commands in a lease of the same server that names no
environment, where the cache's path is present (so only the image lease's root hides it).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment_roots import IMAGE_OS_RELEASE, image_problem, write_shell_image
from tests.integration.test_environment_leases import (
    cached_rootfs,
    lease,
    reset,
    shell,
    tree_digest,
)
from tests.integration.test_slot_server import Server, searchable_dir, start_server, stop_server

pytestmark = [pytest.mark.skipif(image_problem() is not None, reason=str(image_problem()))]


@pytest.fixture(scope="module")
def image_server() -> Iterator[tuple[Server, str]]:
    """A server whose cache lies outside ``/tmp`` (a lease's own ``/tmp`` would hide it from
    the control lease, which must be able to reach its path)."""
    with searchable_dir("environment-attacks") as folder:
        cache = Path(tempfile.mkdtemp(prefix="trajcore-cache-", dir="/var/tmp"))
        cache.chmod(0o755)
        try:
            write_shell_image(folder / "layout", salt="attacks")
            running = start_server(folder / "root", "--image-cache", str(cache))
            (folder / "cache").symlink_to(cache)  # where ``cached_rootfs`` looks
            yield running, f"oci:{folder / 'layout'}"
            assert stop_server(running) == 0
        finally:
            shutil.rmtree(cache, ignore_errors=True)


def test_a_lease_over_an_image_cannot_write_or_see_the_cached_tree(
    image_server: tuple[Server, str],
) -> None:
    server, ref = image_server

    async def main() -> None:
        answer = await lease(server, 0, 1, ref)
        assert answer["ok"] is True, answer
        rootfs = cached_rootfs(server.root, str(answer["image_id"])).resolve()
        before = tree_digest(rootfs)
        release = rootfs / "etc" / "os-release"
        attack = (
            f"echo owned > /etc/os-release; echo owned > {release}; "
            f"echo owned > /proc/1/root{release}; cat {release}; ls /run/trajcore/layer; "
            f"ls {server.root}"
        )
        _, text = await shell(server, 0, 1, attack)
        assert "No such file" in text, text
        assert "owned" not in text, text
        assert IMAGE_OS_RELEASE.decode().strip() not in text  # not reached by its host path
        assert tree_digest(rootfs) == before
        assert release.read_bytes() == IMAGE_OS_RELEASE
        # control: a lease with no environment, in the same server, reaches the cached tree by
        # that path (read-only): only the image lease's own root hides it
        _, text = await shell(server, 1, 1, f"cat {release}; echo owned > {release}")
        assert IMAGE_OS_RELEASE.decode().strip() in text, text
        assert "Read-only file system" in text, text
        assert release.read_bytes() == IMAGE_OS_RELEASE
        await reset(server, 0, 1)
        await reset(server, 1, 1)

    asyncio.run(main())


def test_a_lease_over_an_image_reaches_no_host_file(image_server: tuple[Server, str]) -> None:
    server, ref = image_server
    host_release = Path("/etc/os-release").read_text()

    async def main() -> None:
        assert (await lease(server, 2, 1, ref))["ok"] is True
        probe = (
            "cat /etc/os-release /proc/1/root/etc/os-release; ls /usr /etc; "
            "cat /proc/self/mountinfo"
        )
        _, text = await shell(server, 2, 1, probe)
        assert host_release.strip() not in text, text
        assert "ID=trajcore-test-image" in text, text
        # nothing of the sandbox's old root stays mounted in the lease
        assert " / / " in text, text
        assert "/run/trajcore/slot-helper" not in text, text
        # control: the same probe over the server's root shows the host's file
        _, text = await shell(server, 3, 1, probe)
        assert host_release.strip() in text
        await reset(server, 2, 1)
        await reset(server, 3, 1)

    asyncio.run(main())


def test_a_lease_that_owns_the_images_files_never_writes_the_cache(
    image_server: tuple[Server, str],
) -> None:
    """The image's files are the lease's (an idmapped, read-only clone of the cached tree under
    its overlay): every write, removal and new entry it makes lands in its own layer, and the
    cached tree, checked from the host, is as it was. Control: the writes took effect, in the
    lease's view and in its layer on the host."""
    server, ref = image_server

    async def main() -> None:
        answer = await lease(server, 0, 2, ref)
        assert answer["ok"] is True, answer
        rootfs = cached_rootfs(server.root, str(answer["image_id"])).resolve()
        before = tree_digest(rootfs)
        owners = {path.lstat().st_uid for path in rootfs.rglob("*")}
        release = rootfs / "etc" / "os-release"
        attack = (
            "echo owned > /etc/os-release; echo owned >> /proc/self/root/etc/os-release; "
            "rm /usr/bin/id; mkdir /etc/planted; echo owned > /etc/planted/file; "
            "ls /run/trajcore/layer/lower-0 /run/trajcore/layer; cat /etc/os-release; ls /usr/bin"
        )
        _, text = await shell(server, 0, 2, attack)
        assert text.count("No such file") == 2, text  # the clone and the layer are out of reach
        # control: each write took effect in the lease's view ...
        assert "owned\nowned\n" in text, text
        assert "id" not in text.split(), text
        # ... and landed in its own layer on the host
        upper = server.root / "layers" / "0" / "upper"
        assert (upper / "etc" / "os-release").read_text() == "owned\nowned\n"
        assert (upper / "etc" / "planted" / "file").read_text() == "owned\n"
        # the canary: the cached tree, from the host
        assert release.read_bytes() == IMAGE_OS_RELEASE
        assert (rootfs / "usr" / "bin" / "id").is_file()
        assert not (rootfs / "etc" / "planted").exists()
        assert tree_digest(rootfs) == before
        assert {path.lstat().st_uid for path in rootfs.rglob("*")} == owners == {0}
        await reset(server, 0, 2)
        assert tree_digest(rootfs) == before

    asyncio.run(main())
