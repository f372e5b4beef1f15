"""``SnapshotStore``: freezing a lease's layer and workspace, starting from them, counting.

Real files in a temporary folder, no sandbox: the overlay's marks (a 0/0 character device, the
``user.overlay.opaque`` attribute) must come through a freeze unchanged, modes lose what the
image cache drops, and a snapshot goes only when no lease holds it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.idmaps import IdMaps
from trajcore.adapters.slot_server.image_cache import CachedImage
from trajcore.adapters.slot_server.snapshots import (
    MAX_DEPTH,
    Snapshot,
    SnapshotRefused,
    SnapshotStore,
)
from trajcore.adapters.slot_server.workspace_overlays import (
    WorkspaceOverlays,
    _unescape,
    mount_points_under,
)

ROOT = os.geteuid() == 0
OWNER = (54321, 54321)


def image(tmp: Path) -> CachedImage:
    return CachedImage(
        ref=f"directory:{tmp}", image_id=f"directory:{tmp}", rootfs=tmp, bytes=0, entries=0,
        hit=True, seconds=0.0,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SnapshotStore]:
    made = SnapshotStore(
        tmp_path / "snapshots", locks=tmp_path / "locks", max_bytes=1 << 20,
        owner=OWNER if ROOT else None,
    )  # fmt: skip
    yield made
    made.close()


def lease_files(tmp: Path, *, opaque: bool = True) -> tuple[Path, Path]:
    """An upper layer (a file, a whiteout, an opaque folder, a set-uid file) and a workspace."""
    upper, workspace = tmp / "layer" / "upper", tmp / "workspace"
    upper.mkdir(parents=True)
    workspace.mkdir()
    (upper / "made").write_text("made\n")
    (upper / "setuid").write_text("x")
    (upper / "setuid").chmod(0o4775)
    if ROOT:
        os.mknod(upper / "deleted", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (upper / "replaced").mkdir()
    if opaque:
        try:
            os.setxattr(upper / "replaced", "user.overlay.opaque", b"y")
        except OSError as error:
            if error.errno not in (errno.ENOTSUP, errno.EPERM):
                raise
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("code\n")
    return upper, workspace


def test_a_freeze_moves_the_layer_keeping_the_overlays_marks(
    store: SnapshotStore, tmp_path: Path
) -> None:
    upper, workspace = lease_files(tmp_path)
    marked = _xattr(upper / "replaced")
    frozen = store.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
    store.admit(frozen, None)
    assert not upper.exists()  # moved, not copied
    layer = frozen.layer
    assert (layer / "made").read_text() == "made\n"
    assert _xattr(layer / "replaced") == marked
    if ROOT:
        whiteout = (layer / "deleted").lstat()
        assert stat.S_ISCHR(whiteout.st_mode)
        assert whiteout.st_rdev == 0
        assert {(layer / n).lstat().st_uid for n in ("made", "deleted", "replaced")} == {OWNER[0]}
        assert frozen.workspace.stat().st_uid == OWNER[0]
    assert stat.S_IMODE((layer / "setuid").stat().st_mode) == 0o755  # the cache's modes
    assert stat.S_IMODE(frozen.workspace.stat().st_mode) == 0o700
    assert (frozen.workspace / "src" / "main.py").read_text() == "code\n"
    assert (workspace / "src" / "main.py").read_text() == "code\n"  # the lease keeps its own
    assert frozen.bytes == len("made\nx") + len("code\n")
    assert store.statistics() == (1, frozen.bytes, 0)


def test_a_start_copies_the_workspace_to_the_lease_and_no_further(
    store: SnapshotStore, tmp_path: Path
) -> None:
    upper, workspace = lease_files(tmp_path)
    frozen = store.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
    store.admit(frozen, None)
    fork = tmp_path / "fork"
    fork.mkdir()
    ids = (4242, 4242) if ROOT else None
    store.start(frozen, fork, ids)
    assert (fork / "src" / "main.py").read_text() == "code\n"
    if ROOT:
        assert {p.stat().st_uid for p in (fork, fork / "src", fork / "src" / "main.py")} == {4242}
    (fork / "src" / "main.py").write_text("changed\n")
    assert (frozen.workspace / "src" / "main.py").read_text() == "code\n"


def test_a_snapshot_goes_when_dropped_and_no_lease_holds_it(
    store: SnapshotStore, tmp_path: Path
) -> None:
    upper, workspace = lease_files(tmp_path)
    frozen = store.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
    store.admit(frozen, None)
    first, second = store.use(frozen, fork=False), store.use(frozen, fork=True)
    assert store.statistics()[2] == 1
    assert store.drop(frozen.snapshot_id) == (False, 2)
    with pytest.raises(SnapshotRefused, match="was dropped"):
        store.find(frozen.snapshot_id)
    first.close()
    first.close()  # idempotent: counted once
    assert frozen.folder.exists()
    second.close()
    assert not frozen.folder.exists()
    assert store.sweep() == []
    assert [p.name for p in store.root.iterdir()] == []
    with pytest.raises(SnapshotRefused) as refused:
        store.drop(frozen.snapshot_id)
    assert refused.value.field == "snapshot"


def test_a_snapshot_past_the_limit_is_refused_and_the_layer_stays(tmp_path: Path) -> None:
    small = SnapshotStore(tmp_path / "snapshots", locks=tmp_path, max_bytes=4, owner=None)
    upper, workspace = lease_files(tmp_path)
    with pytest.raises(SnapshotRefused, match="--snapshot-bytes") as refused:
        small.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
    assert refused.value.field == "snapshot"
    assert (upper / "made").read_text() == "made\n"
    assert list(small.root.iterdir()) == []


def test_snapshots_of_forks_stack_to_a_limit(store: SnapshotStore, tmp_path: Path) -> None:
    parent: Snapshot | None = None
    chain = []
    for depth in range(MAX_DEPTH):
        upper = tmp_path / f"upper-{depth}"
        upper.mkdir()
        (upper / f"file-{depth}").write_text(str(depth))
        frozen = store.freeze(upper=upper, workspace=upper, image=image(tmp_path), parent=parent)
        store.admit(frozen, parent)
        chain.append(frozen)
        parent = frozen
    assert parent is not None
    assert parent.layers == tuple(s.layer for s in reversed(chain))
    upper = tmp_path / "upper-last"
    upper.mkdir()
    with pytest.raises(SnapshotRefused, match=f"at most {MAX_DEPTH}"):
        store.freeze(upper=upper, workspace=upper, image=image(tmp_path), parent=parent)
    # a parent stays while a snapshot stands on it
    store.drop(chain[0].snapshot_id)
    assert chain[0].folder.exists()


def test_a_new_store_removes_what_a_crashed_server_left(tmp_path: Path) -> None:
    left = tmp_path / "snapshots" / "0123" / "root"
    left.mkdir(parents=True)
    SnapshotStore(tmp_path / "snapshots", locks=tmp_path, max_bytes=1, owner=None)
    assert list((tmp_path / "snapshots").iterdir()) == []


def _xattr(path: Path) -> bytes | None:
    try:
        return os.getxattr(path, "user.overlay.opaque")
    except OSError:
        return None


def test_a_copy_that_fails_is_refused_and_leaves_the_workspace_empty(
    store: SnapshotStore, tmp_path: Path
) -> None:
    upper, workspace = lease_files(tmp_path)
    frozen = store.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
    store.admit(frozen, None)
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "src").write_text("a file where the snapshot has a folder")
    with pytest.raises(SnapshotRefused, match="cannot copy snapshot") as refused:
        store.start(frozen, fork, None)
    assert refused.value.field == "snapshot"
    assert list(fork.iterdir()) == []
    assert (frozen.workspace / "src" / "main.py").read_text() == "code\n"


def test_a_frozen_workspace_belongs_to_the_server(store: SnapshotStore, tmp_path: Path) -> None:
    upper, workspace = lease_files(tmp_path)
    if ROOT:
        os.chown(workspace / "src" / "main.py", 1000, 1000)  # the slot's, as a lease leaves it
    frozen = store.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
    store.admit(frozen, None)
    copied = frozen.workspace / "src" / "main.py"
    assert copied.read_text() == "code\n"
    if ROOT:  # a fork's overlay maps exactly this owner to its slot's ids
        assert (copied.stat().st_uid, copied.stat().st_gid) == OWNER
        assert (frozen.workspace / "src").stat().st_uid == OWNER[0]


def test_forked_workspaces_without_overlays_are_copies_and_health_says_why(
    tmp_path: Path,
) -> None:
    overlays = WorkspaceOverlays.open(tmp_path / "root", None)
    assert overlays.problem is not None
    assert "not run as root" in overlays.problem
    store = SnapshotStore(
        tmp_path / "snapshots", locks=tmp_path / "locks", max_bytes=1 << 20, owner=None,
        overlays=overlays,
    )  # fmt: skip
    try:
        assert store.fork_workspaces() == f"copy: {overlays.problem}"
        upper, workspace = lease_files(tmp_path)
        frozen = store.freeze(upper=upper, workspace=workspace, image=image(tmp_path), parent=None)
        store.admit(frozen, None)
        fork = tmp_path / "fork"
        fork.mkdir()
        store.start(frozen, fork, None)
        assert (fork / "src" / "main.py").read_text() == "code\n"
        assert not store.forked(fork)
    finally:
        store.close()


def test_mount_points_are_read_with_their_escapes(tmp_path: Path) -> None:
    assert _unescape(r"/srv/a\040b\134c") == "/srv/a b\\c"
    assert _unescape("/plain") == "/plain"
    assert mount_points_under(tmp_path) == []


@pytest.mark.skipif(not ROOT, reason="a moved workspace is given to the server: root only")
def test_a_workspace_whose_overlay_cannot_be_mounted_goes_back_to_the_lease_and_is_copied(
    tmp_path: Path,
) -> None:
    """The freeze moves the workspace's entries into the snapshot, then the overlay over them
    fails (the clone's user namespace cannot be made: no slot helper): the entries go back to
    the lease's workspace, the slot's again, and the snapshot holds a copy."""
    (tmp_path / "root" / "forks").mkdir(parents=True)
    overlays = WorkspaceOverlays(
        root=tmp_path / "root", owner=OWNER, idmaps=IdMaps(helper=tmp_path / "no-helper")
    )
    store = SnapshotStore(
        tmp_path / "snapshots", locks=tmp_path / "locks", max_bytes=1 << 20, owner=OWNER,
        overlays=overlays,
    )  # fmt: skip
    slot = (1000, 1000)
    try:
        upper, workspace = lease_files(tmp_path)
        for path in (workspace / "src", workspace / "src" / "main.py"):
            os.lchown(path, *slot)
        written = (workspace / "src" / "main.py").stat().st_ino
        frozen = store.freeze(
            upper=upper, workspace=workspace, image=image(tmp_path), parent=None, ids=slot
        )
        store.admit(frozen, None)
        kept = (workspace / "src" / "main.py").stat()
        assert (kept.st_ino, kept.st_uid, kept.st_gid) == (written, *slot)
        assert (workspace / "src").stat().st_uid == slot[0]
        copied = (frozen.workspace / "src" / "main.py").stat()
        assert copied.st_ino != written
        assert (copied.st_uid, copied.st_gid) == OWNER
        assert (frozen.workspace / "src" / "main.py").read_text() == "code\n"
        assert not store.forked(workspace)
        assert store.overlay_failure is not None
        assert "no-helper" in store.overlay_failure
    finally:
        store.close()


@pytest.mark.skipif(not ROOT, reason="a moved workspace is given to the server: root only")
def test_an_empty_workspace_is_neither_mounted_nor_copied_when_frozen_or_forked(
    tmp_path: Path,
) -> None:
    """A lease that prepared its root alone: freezing it and starting a fork from it mount no
    overlay (the overlays here cannot mount one: a try would be recorded as a failure) and
    copy nothing; the frozen lease and the fork keep their own empty workspaces, the slots'."""
    (tmp_path / "root" / "forks").mkdir(parents=True)
    overlays = WorkspaceOverlays(
        root=tmp_path / "root", owner=OWNER, idmaps=IdMaps(helper=tmp_path / "no-helper")
    )
    store = SnapshotStore(
        tmp_path / "snapshots", locks=tmp_path / "locks", max_bytes=1 << 20, owner=OWNER,
        overlays=overlays,
    )  # fmt: skip
    slot = (1000, 1000)
    try:
        upper, workspace = lease_files(tmp_path)
        remove_tree(workspace / "src")
        os.chown(workspace, *slot)
        frozen = store.freeze(
            upper=upper, workspace=workspace, image=image(tmp_path), parent=None, ids=slot
        )
        store.admit(frozen, None)
        assert store.overlay_failure is None
        assert list(frozen.workspace.iterdir()) == []
        assert list(workspace.iterdir()) == []
        assert workspace.stat().st_uid == slot[0]
        fork = tmp_path / "fork"
        fork.mkdir(mode=0o700)
        os.chown(fork, 4242, 4242)
        store.start(frozen, fork, (4242, 4242))
        assert store.overlay_failure is None
        assert not store.forked(fork)
        assert list(fork.iterdir()) == []
        assert fork.stat().st_uid == 4242
        assert (frozen.layer / "made").read_text() == "made\n"  # the root's files are frozen
    finally:
        store.close()
