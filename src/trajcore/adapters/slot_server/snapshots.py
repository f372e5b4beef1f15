"""Snapshots of leases over images, and leases started from them: prepare once, fork many.

A snapshot freezes a lease over an image: the writable layer the lease wrote over the image
(its overlay's upper directory) and its workspace. Leases then start from it copy-on-write: the
keeper mounts the frozen layer as a read-only lower layer between the image's tree and the new
lease's own empty upper layer, and the lease's workspace is an overlay over the snapshot's
(``workspace_overlays``; a copy where the server cannot mount one).

Where it lives: ``ROOT/snapshots/<id>/`` on the slot server's own storage, ``<id>`` 32 random
hex digits; ``root/`` is the frozen layer (readable by every slot: the keepers bind
``ROOT/snapshots`` read-only, and a lease over the snapshot sees it only through its overlay),
``workspace/`` the frozen workspace (mode 0700, the server's: only the server copies it).
``ROOT/snapshots`` and each snapshot's folder are mode 0711: a slot cannot list them.

How a layer is frozen. The lease ended first (a snapshot holds files, not processes), so
nothing writes its layer; the upper directory is *renamed* into the snapshot (one rename,
whatever it holds), and its entries are given to the server's uid with the modes the image
cache keeps (set-uid, set-gid, sticky and group or other write dropped): the frozen layer is
then part of the image for every lease over it, read-only in place like the image's own files.
The overlay's own marks keep their meaning because nothing rewrites them: a deleted file is a
character device 0/0 (the whiteout an overlay mounted in a user namespace makes), an opaque
directory carries ``user.overlay.opaque``, and every lease's overlay is mounted with
``userxattr``, so the kernel reads them in the frozen layer as it did in the upper one.
Renames of directories are copies in such an overlay (no ``redirect_dir``), so no redirect
marks exist to carry.

How a workspace is frozen: *moved*, where forks' workspaces are overlays (a server that runs
as root with idmapped mounts) and the workspace is a plain directory. Its top-level entries
are renamed into the snapshot's ``workspace/`` (one rename each, whatever they hold), every
entry is given to the server, and the server mounts at the lease's workspace the overlay a
fork gets (``workspace_overlays``): the lease goes on over its snapshot's files as a fork does,
its writes copied up into its own upper layer, and its reset is a fork's: freezing costs a
walk of the tree, not a copy of its bytes (docs/environments.md has the figures). Else (no
overlays here, another file system, a fork's workspace, which is an
overlay already) it is copied with ``cp -a --reflink=auto`` (blocks shared where the file
system can share them; a Python copy when GNU ``cp`` is missing), every entry given to the
server, and the lease keeps its own. A fork whose workspace cannot be an overlay gets a copy,
every entry given to the lease's uid.

Counting. A snapshot counts the leases that run over it; a dropped snapshot takes no new lease
and is removed when its last lease resets; ``close`` removes them all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.image_cache import CachedImage, ImageUse
from trajcore.adapters.slot_server.workspace_overlays import WorkspaceOverlays

__all__ = [
    "MAX_DEPTH",
    "Snapshot",
    "SnapshotRefused",
    "SnapshotStore",
    "SnapshotUse",
    "copy_tree",
    "tree_size",
]

MAX_DEPTH = 16
"""The most frozen layers a lease stacks over its image (a snapshot of a fork of a fork...)."""
_SET_IDS = stat.S_ISUID | stat.S_ISGID
_KEPT_MODE = ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
_COPY_TIMEOUT_S = 600.0
_REMOVE_TIMEOUT_S = 600.0


class SnapshotRefused(Exception):
    """A snapshot request, or a lease from a snapshot, that cannot be served: ``field`` and
    ``reason`` say why (the answer's ``field`` and ``error``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{reason} @ {field}")
        self.field = field
        self.reason = reason


@attrs.define(eq=False)
class Snapshot:
    """One frozen lease.

    Attributes:
        snapshot_id: Its id (32 hex digits).
        image: The image it was taken over.
        folder: ``ROOT/snapshots/<id>``.
        bytes: What its layer and workspace hold.
        files: How many entries they hold.
        leases: The leases running over it now.
        dropped: No new lease may start from it.
        parent: The snapshot the frozen lease had started from, held while this one lives.
    """

    snapshot_id: str
    image: CachedImage
    folder: Path
    bytes: int
    files: int
    _image_lock: int | None
    parent: SnapshotUse | None = None
    leases: int = 0
    dropped: bool = False

    @property
    def layer(self) -> Path:
        """The frozen layer (an overlay lower layer)."""
        return self.folder / "root"

    @property
    def layers(self) -> tuple[Path, ...]:
        """Every frozen layer a lease over it mounts, the top one first."""
        return (self.layer, *(() if self.parent is None else self.parent.layers))

    @property
    def workspace(self) -> Path:
        """The frozen workspace."""
        return self.folder / "workspace"

    def hold_image(self) -> ImageUse:
        """A hold on the image for one lease (a duplicate of the snapshot's own shared lock:
        the cache evicts the image only when every holder closed)."""
        lock = None if self._image_lock is None else os.dup(self._image_lock)
        return ImageUse(self.image, lock)

    def release_image(self) -> None:
        lock, self._image_lock = self._image_lock, None
        if lock is not None:
            os.close(lock)


@attrs.define(eq=False)
class SnapshotUse:
    """A lease over a snapshot, until ``close`` (at the lease's reset); idempotent."""

    store: SnapshotStore
    snapshot: Snapshot
    _open: bool = True

    @property
    def layers(self) -> tuple[Path, ...]:
        return self.snapshot.layers

    def close(self) -> None:
        if self._open:
            self._open = False
            self.store.release(self.snapshot)


@attrs.define(eq=False)
class SnapshotStore:
    """The snapshots of one slot server (under ``root``, on the server's own storage).

    Attributes:
        root: ``ROOT/snapshots``.
        locks: The image cache's lock folder (a snapshot holds its image shared, as a lease
            does, so the cache never evicts an image a snapshot needs).
        max_bytes: What all snapshots together may hold; a new one past it is refused.
        owner: The uid and gid frozen layers are given to (the image cache's owner), or
            ``None`` to leave them as they are (a server that is not root).
    """

    root: Path
    locks: Path
    max_bytes: int
    owner: tuple[int, int] | None
    overlays: WorkspaceOverlays | None = None
    """Forked workspaces as overlays (``None``: copies)."""
    forks: int = 0
    overlay_failure: str | None = None
    """Why the last fork's workspace that should have been an overlay was copied instead."""
    removing: bool = False
    """Removed snapshots' files wait for ``sweep``."""
    _held: dict[str, Snapshot] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.root.exists():  # a crashed server's snapshots: nothing runs over them
            remove_tree(self.root, timeout_s=_REMOVE_TIMEOUT_S)
        self.root.mkdir(mode=0o711, parents=True)
        os.chmod(self.root, 0o711)  # noqa: S103 - slot uids reach layers by name, list none

    # -- queries

    def find(self, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id``. Raises ``SnapshotRefused`` when there is none."""
        found = self._held.get(snapshot_id)
        if found is None:
            raise SnapshotRefused(
                "snapshot",
                f"no snapshot {snapshot_id[:80]!r} on this slot server (snapshots are per "
                "server: a lease starts from a snapshot of its own server only)",
            )
        if found.dropped:
            raise SnapshotRefused("snapshot", f"snapshot {snapshot_id} was dropped")
        return found

    def statistics(self) -> tuple[int, int, int]:
        """(snapshots held, their bytes, leases started from one so far)."""
        held = list(self._held.values())
        return len(held), sum(s.bytes for s in held), self.forks

    # -- changes (blocking: run them in a worker thread)

    def freeze(
        self, *, upper: Path, workspace: Path, image: CachedImage, parent: Snapshot | None,
        ids: tuple[int, int] | None = None,
    ) -> Snapshot:  # fmt: skip
        """Make a snapshot of a lease that has ended: its ``upper`` layer (moved into the
        snapshot) and its ``workspace``; ``parent``, the snapshot the lease had started from.
        ``admit`` then holds it.

        The workspace is *moved* when it can be (``ids``, the lease's slot's uid and gid,
        given; forked workspaces mounted as overlays here; the workspace a plain directory,
        not a fork's overlay): its entries are renamed into the snapshot and given to the
        server, and an overlay over them is mounted at ``workspace``, so the lease goes on
        over its snapshot's workspace as a fork does (``forked`` is then true). Else it is
        copied and the lease keeps its own. Raises ``SnapshotRefused`` (too deep, over the
        limit, a full disk, a copy that failed); the lease's layer and workspace are then as
        they were."""
        depth = 1 if parent is None else len(parent.layers) + 1
        if depth > MAX_DEPTH:
            raise SnapshotRefused(
                "snapshot",
                f"a snapshot of a lease started from a snapshot {depth - 1} deep: at most "
                f"{MAX_DEPTH} frozen layers stack over an image",
            )
        size, files = self._room_for(upper, workspace)
        snapshot_id = secrets.token_hex(16)
        staging = self.root / f".staging-{snapshot_id}"
        staging.mkdir(mode=0o711)
        moved, taken = False, _Moved()
        try:
            self._freeze_workspace(workspace, staging / "workspace", ids, taken)
            if upper.is_dir():
                upper.rename(staging / "root")
                moved = True
            else:
                (staging / "root").mkdir(mode=0o755)
            _freeze_layer(staging / "root", self.owner)
            lock = self._hold(image)
            try:
                staging.rename(self.root / snapshot_id)
            except BaseException:
                if lock is not None:
                    os.close(lock)
                raise
        except (SnapshotRefused, OSError) as error:
            reason = error.reason if isinstance(error, SnapshotRefused) else (
                f"cannot freeze the lease: {_describe(error)}"
            )  # fmt: skip
            if ids is not None:
                try:
                    self._give_back(staging / "workspace", workspace, ids, taken)
                except OSError as stuck:  # kept in staging: removed when a server next starts
                    reason += f"; the workspace's files stay in {staging}: {_describe(stuck)}"
                    raise SnapshotRefused("snapshot", reason) from None
            self._undo(staging, upper, moved)
            raise SnapshotRefused(
                "snapshot" if isinstance(error, OSError) else error.field, reason
            ) from None
        return Snapshot(
            snapshot_id=snapshot_id, image=image, folder=self.root / snapshot_id,
            bytes=size, files=files, image_lock=lock,
        )  # fmt: skip

    def _room_for(self, upper: Path, workspace: Path) -> tuple[int, int]:
        """(bytes, entries) of the lease's layer and workspace. Raises ``SnapshotRefused``
        when they do not fit beside this server's snapshots."""
        size, files = tree_size(workspace)
        if upper.is_dir():
            more, entries = tree_size(upper)
            size, files = size + more, files + entries
        held = sum(s.bytes for s in self._held.values())
        if held + size > self.max_bytes:
            raise SnapshotRefused(
                "snapshot",
                f"the lease holds {size} bytes; with the {held} bytes of this server's "
                f"snapshots that passes the limit of {self.max_bytes} (--snapshot-bytes)",
            )
        return size, files

    def _freeze_workspace(
        self, workspace: Path, frozen: Path, ids: tuple[int, int] | None, moved: _Moved
    ) -> None:
        """Make ``frozen`` (the server's alone, mode 0700: no slot reads it) the snapshot's
        workspace: ``workspace``'s entries moved there when they can be (``moved`` names them
        while they are there), else a copy. Raises ``OSError``; ``moved`` then says what to
        give back."""
        frozen.mkdir(mode=0o700)
        if self.owner is not None:
            os.lchown(frozen, *self.owner)
        if (
            ids is not None
            and self._movable(workspace)
            and self._take(workspace, frozen, ids, moved)
        ):
            return
        copy_tree(workspace, frozen, owner=self.owner)
        os.chmod(frozen, 0o700)
        if self.owner is not None:
            os.lchown(frozen, *self.owner)

    def _movable(self, workspace: Path) -> bool:
        overlays = self.overlays
        return overlays is not None and overlays.problem is None and not self.forked(workspace)

    def _take(self, workspace: Path, frozen: Path, ids: tuple[int, int], moved: _Moved) -> bool:
        """Move ``workspace``'s entries into ``frozen``, give them to the server, and mount the
        overlay over them at ``workspace``; ``False`` when the overlay cannot be had (the
        entries are given back: the caller copies instead). Raises ``OSError`` only when what
        was moved cannot be put back (``moved`` still names it). An empty workspace moves
        nothing and mounts nothing: the lease goes on over its own empty workspace, as its
        forks do (``start``)."""
        assert self.overlays is not None
        try:
            moved.names = _move_entries(workspace, frozen)
            _own(frozen, self.owner, keep_mode=True)
            os.chmod(frozen, 0o700)
            if not moved.names:
                return True
            self.overlays.mount(frozen, workspace, ids)
            moved.mounted = True
        except OSError as error:  # another file system (nothing moved), a failed mount
            self.overlay_failure = _describe(error)
            self._give_back(frozen, workspace, ids, moved)
            return False
        return True

    def _give_back(
        self, frozen: Path, workspace: Path, ids: tuple[int, int], moved: _Moved
    ) -> None:
        """Undo ``_take``: the overlay unmounted, the entries ``moved`` names back in
        ``workspace`` and the slot's again. Raises ``OSError`` when one will not go back."""
        if moved.mounted and self.overlays is not None:
            problem = self.overlays.unmount(workspace, None)
            if problem is not None:
                raise OSError(errno.EBUSY, problem)
            moved.mounted = False
        if moved.names is None:
            return
        _put_back(frozen, workspace, moved.names)
        moved.names = None
        _own(workspace, ids, keep_mode=True)

    def admit(self, frozen: Snapshot, parent: Snapshot | None) -> None:
        """Hold ``frozen`` (what ``freeze`` made), and through it ``parent``. On the event
        loop: the counts change there only."""
        frozen.parent = None if parent is None else self.use(parent, fork=False)
        self._held[frozen.snapshot_id] = frozen

    def use(self, snapshot: Snapshot, *, fork: bool) -> SnapshotUse:
        """Count one more lease over ``snapshot`` (``fork``: one started from it, counted in
        the statistics; the frozen lease itself goes on over it too)."""
        snapshot.leases += 1
        if fork:
            self.forks += 1
        return SnapshotUse(store=self, snapshot=snapshot)

    def fork_workspaces(self) -> str:
        """How forked workspaces start: ``overlay``, or ``copy: <why>``."""
        overlays = self.overlays
        if overlays is None:
            return "copy: no overlays were set up"
        if overlays.problem is not None:
            return f"copy: {overlays.problem}"
        if self.overlay_failure is not None:
            return f"overlay (the last that failed was copied: {self.overlay_failure})"
        return "overlay"

    def start(self, snapshot: Snapshot, workspace: Path, ids: tuple[int, int] | None) -> None:
        """Give ``workspace`` (an empty one) the snapshot's workspace: an overlay over it when
        the server can mount one, else a copy given to ``ids``; nothing where the snapshot's
        workspace is empty (a preparation that wrote to the root alone): the lease keeps its
        own empty workspace, as a lease over the image does, with no mount to make now and to
        undo at its reset. Raises ``SnapshotRefused`` (a full disk: what was copied is removed
        again)."""
        with os.scandir(snapshot.workspace) as entries:
            if next(entries, None) is None:
                return
        overlays = self.overlays
        if overlays is not None and overlays.problem is None and ids is not None:
            try:
                overlays.mount(snapshot.workspace, workspace, ids)
            except OSError as error:
                self.overlay_failure = _describe(error)
            else:
                return
        try:
            copy_tree(snapshot.workspace, workspace, owner=ids)
        except OSError as error:
            for entry in list(workspace.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    remove_tree(entry, timeout_s=_REMOVE_TIMEOUT_S)
                else:
                    entry.unlink()
            raise SnapshotRefused(
                "snapshot",
                f"cannot copy snapshot {snapshot.snapshot_id}'s workspace: {_describe(error)}",
            ) from None

    def forked(self, workspace: Path) -> bool:
        """Whether ``workspace`` is a fork's overlay now."""
        return self.overlays is not None and self.overlays.mounted(workspace)

    def unmount(self, workspace: Path, trash: Path | None) -> str | None:
        """Detach ``workspace``'s overlay when it is one (its upper layer set aside into
        ``trash``, or removed now without one); ``None`` when done, else why not."""
        return None if self.overlays is None else self.overlays.unmount(workspace, trash)

    def release(self, snapshot: Snapshot) -> None:
        snapshot.leases -= 1
        if snapshot.dropped and snapshot.leases <= 0:
            self._remove(snapshot)

    def drop(self, snapshot_id: str) -> tuple[bool, int]:
        """Drop ``snapshot_id``: (removed now, leases still over it). Raises
        ``SnapshotRefused`` when there is no such snapshot."""
        found = self._held.get(snapshot_id)
        if found is None or found.dropped:
            raise SnapshotRefused(
                "snapshot", f"no snapshot {snapshot_id[:80]!r} on this slot server"
            )
        found.dropped = True
        if found.leases <= 0:
            self._remove(found)
            return True, 0
        return False, found.leases

    def close(self) -> None:
        """Remove every snapshot (the server is closing: no lease runs any more)."""
        for found in list(self._held.values()):
            self._remove(found)
        if self.overlays is not None:
            self.overlays.close()
        self.sweep()

    # -- inside

    def _hold(self, image: CachedImage) -> int | None:
        if image.ref.startswith("directory:"):
            return None  # a tree used in place: the cache holds no lock for it
        fd = os.open(self.locks / f"{image.image_id}.lock", os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _remove(self, snapshot: Snapshot) -> None:
        """Forget ``snapshot`` and set its files aside (one rename) for ``sweep``."""
        self._held.pop(snapshot.snapshot_id, None)
        snapshot.release_image()
        parent, snapshot.parent = snapshot.parent, None
        if parent is not None:
            parent.close()
        if snapshot.folder.exists():
            snapshot.folder.rename(self.root / f".removed-{snapshot.snapshot_id}")
            self.removing = True

    def sweep(self) -> list[str]:
        """Remove the files of removed snapshots (blocking); a line for each that would not
        go."""
        left = []
        for folder in self.root.glob(".removed-*"):
            try:
                remove_tree(folder, timeout_s=_REMOVE_TIMEOUT_S)
            except OSError as error:
                left.append(f"{folder.name}: {error}")
        return left

    @staticmethod
    def _undo(staging: Path, upper: Path, moved: bool) -> None:
        if moved and (staging / "root").is_dir() and not upper.exists():
            (staging / "root").rename(upper)
        if staging.exists():
            remove_tree(staging, timeout_s=_REMOVE_TIMEOUT_S)


def tree_size(root: Path) -> tuple[int, int]:
    """(bytes of the regular files under ``root``, entries under it); never follows a link."""
    total = count = 0
    pending = [str(root)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                count += 1
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(entry.path)
                elif stat.S_ISREG(info.st_mode):
                    total += info.st_size
    return total, count


def copy_tree(source: Path, dest: Path, *, owner: tuple[int, int] | None) -> None:
    """Copy what ``source`` holds into ``dest`` (made if missing), links as links, modes,
    times and extended attributes kept; every entry then given to ``owner`` when named.
    Raises ``OSError``."""
    dest.mkdir(mode=0o700, exist_ok=True)
    with os.scandir(source) as entries:
        empty = next(entries, None) is None  # a preparation that wrote to the root alone
    cp = None if empty else shutil.which("cp")
    if empty:
        pass
    elif cp is not None and _gnu(cp):
        done = subprocess.run(
            [cp, "-a", "--reflink=auto", "--", f"{source}/.", f"{dest}/"],
            capture_output=True, text=True, timeout=_COPY_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            problem = done.stderr.strip().splitlines()
            number = errno.ENOSPC if "No space left" in done.stderr else errno.EIO
            raise OSError(number, problem[-1] if problem else f"cp exited {done.returncode}")
    else:
        shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    if owner is not None:
        _own(dest, owner, keep_mode=True)


def _move_entries(source: Path, dest: Path) -> list[str]:
    """Rename every entry of ``source`` into ``dest`` (the same file system), through the two
    directories' descriptors (never following a link); the names moved. On a failure what
    was moved goes back, and the ``OSError`` is raised."""
    with _directory(source) as source_fd, _directory(dest) as dest_fd:
        moved: list[str] = []
        try:
            for name in os.listdir(source_fd):
                os.rename(name, name, src_dir_fd=source_fd, dst_dir_fd=dest_fd)
                moved.append(name)
        except OSError:
            _rename_all(dest_fd, source_fd, moved)
            raise
        return moved


def _put_back(frozen: Path, workspace: Path, names: list[str]) -> None:
    """Rename ``names`` from ``frozen`` back into ``workspace``. Raises ``OSError`` naming
    what would not go back."""
    with _directory(frozen) as frozen_fd, _directory(workspace) as workspace_fd:
        left = _rename_all(frozen_fd, workspace_fd, names)
    if left:
        raise OSError(errno.EIO, f"{len(left)} entries would not go back, {left[:3]} first")


def _rename_all(source_fd: int, dest_fd: int, names: list[str]) -> list[str]:
    """Rename each of ``names`` (one missing from ``source_fd`` is there already); the ones
    that would not go."""
    left = []
    for name in names:
        try:
            os.rename(name, name, src_dir_fd=source_fd, dst_dir_fd=dest_fd)
        except FileNotFoundError:
            continue
        except OSError:
            left.append(name)
    return left


@contextlib.contextmanager
def _directory(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


@attrs.define
class _Moved:
    """A workspace being moved into its snapshot: the names of its entries while they are in
    the snapshot's staging folder."""

    names: list[str] | None = None
    mounted: bool = False
    """Whether the overlay over them is mounted at the workspace."""


_GNU: dict[str, bool] = {}


def _gnu(cp: str) -> bool:
    if cp not in _GNU:
        try:
            found = subprocess.run(
                [cp, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            _GNU[cp] = "GNU coreutils" in found.stdout
        except (OSError, subprocess.TimeoutExpired):
            _GNU[cp] = False
    return _GNU[cp]


def _freeze_layer(layer: Path, owner: tuple[int, int] | None) -> None:
    """Give every entry of a frozen layer to ``owner`` and keep the modes the cache keeps."""
    os.chmod(layer, 0o755)  # noqa: S103 - an overlay layer every lease over it reads
    _own(layer, owner, keep_mode=False)


def _own(root: Path, owner: tuple[int, int] | None, *, keep_mode: bool) -> None:
    pending = [str(root)]
    if owner is not None:
        os.lchown(root, *owner)
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                if owner is not None and (
                    (info.st_uid, info.st_gid) != owner or info.st_mode & _SET_IDS
                ):  # a chown drops the set-ids bits too, as the copy would see them dropped
                    os.lchown(entry.path, *owner)
                if stat.S_ISLNK(info.st_mode):
                    continue
                kept = stat.S_IMODE(info.st_mode) & _KEPT_MODE
                if not keep_mode and kept != stat.S_IMODE(info.st_mode):  # else nothing to drop
                    os.chmod(entry.path, kept)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(entry.path)


def _describe(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return f"the disk is full ({error.strerror})"
    return f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
