"""Idmapped clones and their user namespaces (``idmaps``), made by the compiled slot helper.

A clone shows its tree's owner as a slot's ids and is read-only, nosuid and nodev; the
namespaces that map the ids come from one ``slot-helper userns COUNT`` run. What the host cannot
do is said, never a weaker clone. The clones' life under a lease's overlay is tested through
real slot servers (tests/integration/test_environment_leases.py, test_snapshots.py and
tests/security/test_environment_roots.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.adapters.slot_server.idmaps import (
    IdMaps,
    kernel_problem,
    make_namespaces,
    open_idmaps,
)
from trajcore.adapters.slot_server.native_helper import build_slot_helper
from trajcore.adapters.slot_server.runtime_config import RuntimeConfig
from trajcore.adapters.slot_server.sandboxes import Sandboxes

ROOT = os.geteuid() == 0
HAS_COMPILER = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
SLOT = (1_234_567, 1_234_568)
OTHER = (2_345_678, 2_345_678)
_LIBC = ctypes.CDLL(None, use_errno=True)
_SYS_MOVE_MOUNT, _MOVE_MOUNT_F_EMPTY_PATH, _MNT_DETACH = 429, 4, 2


@pytest.fixture(scope="module")
def helper() -> Path:
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc, gcc, clang) to build the slot helper")
    return build_slot_helper()


needs_root = pytest.mark.skipif(not ROOT, reason="user namespaces' maps and mounts need root")


@contextlib.contextmanager
def attached(tree: int, point: Path) -> Iterator[Path]:
    """The detached mount ``tree`` attached at ``point`` (an empty folder) until the end."""
    point.mkdir()
    done = _LIBC.syscall(
        _SYS_MOVE_MOUNT, tree, b"", -100, str(point).encode(), _MOVE_MOUNT_F_EMPTY_PATH
    )
    assert done == 0, os.strerror(ctypes.get_errno())
    try:
        yield point
    finally:
        _LIBC.umount2(str(point).encode(), _MNT_DETACH)


def test_kernels_before_5_19_cannot_stack_an_overlay_over_idmapped_layers() -> None:
    assert kernel_problem("6.18.44-fc-v657") is None
    assert kernel_problem("5.19.0") is None
    assert kernel_problem("10.0") is None
    old = kernel_problem("5.15.0-91-generic")
    assert old is not None
    assert "from Linux 5.19 on (this kernel: 5.15.0-91-generic)" in old
    assert "cannot read the kernel's version" in str(kernel_problem("custom"))
    assert "cannot read the kernel's version" in str(kernel_problem("6"))


def test_the_slot_helper_refuses_a_count_it_cannot_make(helper: Path) -> None:
    for count in ("0", "-1", "x", "65537"):
        done = subprocess.run(
            [str(helper), "userns", count], capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 2, done
        assert "userns takes a count from 1 to 65536" in done.stderr


@needs_root
def test_a_clone_shows_its_owner_as_the_slots_ids_read_only(helper: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "repo").mkdir(parents=True)
    (tree / "repo" / "app.py").write_text("return 1\n")
    os.chown(tree / "repo" / "app.py", 0, 0)
    others = tree / "repo" / "others"
    others.write_text("")
    os.chown(others, *OTHER)  # an owner no map names
    slot, other = make_namespaces(helper, [((0, 0), SLOT), ((0, 0), OTHER)])
    try:
        for fd in (slot, other):
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("user:[")
        assert os.readlink(f"/proc/self/fd/{slot}") != os.readlink("/proc/self/ns/user")
        maps = IdMaps(helper=helper)
        with attached(maps.clone(tree, slot), tmp_path / "seen") as seen:
            info = (seen / "repo" / "app.py").stat()
            assert (info.st_uid, info.st_gid) == SLOT
            assert (seen / "repo" / "others").stat().st_uid == 65534  # unmapped: nobody
            assert (seen / "repo" / "app.py").read_text() == "return 1\n"
            flags = os.statvfs(seen).f_flag
            wanted = os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV
            assert flags & wanted == wanted
            with pytest.raises(OSError, match="Read-only") as refused:
                (seen / "repo" / "app.py").write_text("owned\n")
            assert refused.value.errno == errno.EROFS
        # control: the tree itself is untouched and still root's
        assert (tree / "repo" / "app.py").read_text() == "return 1\n"
        assert (tree / "repo" / "app.py").stat().st_uid == 0
    finally:
        os.close(slot)
        os.close(other)


@needs_root
def test_prepared_namespaces_are_held_and_a_lease_gets_one_clone_per_layer(
    helper: Path, tmp_path: Path
) -> None:
    layers = [tmp_path / "frozen", tmp_path / "image"]
    for layer in layers:
        layer.mkdir()
    maps = IdMaps(helper=helper)
    maps.prepare((0, 0), [SLOT, SLOT, OTHER])
    try:
        assert maps.problem is None
        held = maps.held((0, 0), SLOT)
        assert held is not None
        assert maps.namespace((0, 0), SLOT) == held  # made once, kept
        assert maps.held((0, 0), (3, 3)) is None
        clones = asyncio.run(maps.lease_clones(SLOT, layers))
        assert len(clones) == 2
        for fd in clones:
            os.close(fd)
        assert asyncio.run(maps.lease_clones(None, layers)) == []  # a server that is not root
        # a layer that cannot be cloned: none at all (the layers as they are), and why
        assert asyncio.run(maps.lease_clones(SLOT, [*layers, tmp_path / "gone"])) == []
        assert maps.failure is not None
        assert "gone" in maps.failure
    finally:
        maps.close()


@needs_root
def test_the_server_says_why_a_tree_cannot_be_idmapped(helper: Path, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    maps, problem = open_idmaps(helper, (0, 0), [SLOT], images)
    assert maps is not None
    assert problem is None
    maps.close()
    # a file system without idmapped mounts (proc): the server says so, and keeps the layers
    maps, problem = open_idmaps(helper, (0, 0), [SLOT], Path("/proc/sys"))
    assert maps is not None
    assert problem is not None
    assert "the image cache's file system cannot be idmapped" in problem
    assert "mount_setattr" in problem
    maps.close()


def test_a_server_that_is_not_root_makes_no_namespaces(helper: Path, tmp_path: Path) -> None:
    assert open_idmaps(helper, None, [], tmp_path) == (
        None,
        "the slot server does not run as root",
    )


@needs_root
def test_health_says_when_the_images_files_stay_read_only(helper: Path, tmp_path: Path) -> None:
    sandboxes = Sandboxes(config=RuntimeConfig(slots=2, root=tmp_path), native=helper)
    sandboxes.uid_base = SLOT[0]
    images = tmp_path / "images"
    images.mkdir()
    maps = sandboxes.open_idmaps((0, 0), 2, images)
    assert maps is not None
    assert sandboxes.lowers is maps  # leases get clones of their layers
    assert sandboxes.notes == []
    maps.close()
    refusing = Sandboxes(config=RuntimeConfig(slots=2, root=tmp_path), native=helper)
    refusing.uid_base = SLOT[0]
    maps = refusing.open_idmaps((0, 0), 2, Path("/proc/sys"))
    assert maps is not None  # forked workspaces may still use them
    assert refusing.lowers is None  # leases mount their layers as they are
    (note,) = refusing.notes  # what health's detail carries
    assert note.startswith("the image's files are read-only to leases: the image cache's file")
    maps.close()
