"""A forked lease's workspace copy-on-write: an overlay over the snapshot's frozen workspace.

A lease started from a snapshot needs the snapshot's workspace as its own. Copying it costs a
file creation per file (seconds for a few thousand on a slow disk); instead the server (root)
mounts, on the host, an overlay *at the slot's workspace directory*:

- lower: the snapshot's frozen workspace (``ROOT/snapshots/<id>/workspace``, the server's,
  mode 0700), seen through an *idmapped*, read-only clone (``open_tree`` + ``mount_setattr``)
  that shows the server's uid and gid as the slot's: the lease owns the snapshot's files as it
  owned the files it wrote, so it may change, rename and remove them (the overlay copies them
  up first) while the frozen files stay the server's and untouched;
- upper and work: ``ROOT/forks/<slot>/upper`` and ``work`` (the folder the server's, 0700; the
  upper's root the slot's, 0700, like a workspace), on the server's storage.

Why on the host and not in the lease's mount namespace: the file tools and the artifact
endpoints (``Workspace``) open the workspace's host path with every rule they have (``O_NOFOLLOW``
walk, the slot's file-system ids); mounted there, they see the merged workspace unchanged. The
slots' sandboxes see it too: the server's root is made a *shared* mount before any keeper starts
(bubblewrap makes its own copies slaves of it), so a mount at a workspace reaches the keeper's
bind of it, and the lease's namespace copied from the keeper's; its unmount at the reset reaches
them the same way.

At the reset: the overlay and the lower's clone are unmounted (detached), and the fork's folder
is set aside into the trash like the lease's layer. A crashed server's mounts under its root are
detached at the next start.

The clone's user namespace (the server's ids mapped to the slot's) is made ahead, for every
slot when the server starts (``idmaps.IdMaps``), and so is each slot's fork folder (``lower``,
``work`` and the slot's ``upper``, empty; a fork's reset makes the next one), so a fork's lease
request only clones and mounts: four ``mkdir`` and a ``chown`` a fork, made by 15 forks at once
in one folder, were about half of the server's work for a group's forks.

Where this cannot work (a server that is not root, a kernel without idmapped mounts or
overlays, a root that cannot be made a shared mount), ``problem`` says why and forks copy the
workspace, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import attrs

from trajcore.adapters.removal import remove_tree
from trajcore.adapters.slot_server.idmaps import LIBC, IdMaps, checked

__all__ = ["WorkspaceOverlays", "mount_points_under"]

_SYS_MOVE_MOUNT = 429  # the same on every architecture
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_SHARED = 0x2, 0x4, 0x1000, 1 << 20
_MNT_DETACH = 2
_AT_FDCWD = -100
_OVERLAY_SEPARATORS = (",", ":", "\\")


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None) -> None:
    checked(
        LIBC.mount(
            None if source is None else source.encode(), target.encode(),
            None if kind is None else kind.encode(), ctypes.c_ulong(flags),
            None if data is None else data.encode(),
        ),
        "mount", target,
    )  # fmt: skip


def _detach(target: Path) -> None:
    checked(LIBC.umount2(str(target).encode(), _MNT_DETACH), "umount", target)


def mount_points_under(root: Path) -> list[Path]:
    """Every mount point strictly under ``root`` (this mount namespace's), deepest first."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            point = Path(_unescape(line.split(" ")[4]))
            if point != root and point.is_relative_to(root):
                found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _is_mount_point(path: Path) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return any(Path(_unescape(line.split(" ")[4])) == path for line in info)


def _unescape(field: str) -> str:
    out, index = [], 0
    while index < len(field):
        escaped = field[index + 1 : index + 4]
        if field[index] == "\\" and len(escaped) == 3 and escaped.isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


@attrs.define(eq=False)
class WorkspaceOverlays:
    """The forked workspaces of one slot server (``open``; blocking calls: a worker thread).

    Attributes:
        root: The server's root (made a shared mount).
        owner: The uid and gid the frozen workspaces belong to (the server's).
        problem: Why forks copy their workspace instead (``None``: they mount one).
    """

    root: Path
    owner: tuple[int, int]
    idmaps: IdMaps | None = None
    problem: str | None = None
    _bound: bool = False
    _mounted: dict[Path, Path] = attrs.field(factory=dict)
    _ids: dict[Path, tuple[int, int]] = attrs.field(factory=dict)
    _ready: dict[Path, tuple[int, int]] = attrs.field(factory=dict)
    """Forks' folders made empty after an unmount, and whose ``upper`` they are."""

    @property
    def forks(self) -> Path:
        return self.root / "forks"

    @classmethod
    def open(
        cls, root: Path, owner: tuple[int, int] | None, idmaps: IdMaps | None = None
    ) -> WorkspaceOverlays:
        """Detach a crashed server's mounts under ``root`` and make ``root`` a shared mount;
        ``idmaps`` makes the lower clones' user namespaces (prepared already). Never raises for
        what the host cannot do (``problem`` says it). Call it before any keeper starts (their
        sandboxes must see ``root`` shared)."""
        root = Path(os.path.realpath(root))
        found = cls(root=root, owner=owner or (os.geteuid(), os.getegid()), idmaps=idmaps)
        if owner is None or os.geteuid() != 0:
            found.problem = "forked workspaces are copies: the slot server does not run as root"
            return found
        if idmaps is None or idmaps.problem is not None:
            why = "no user namespaces to map ids with" if idmaps is None else idmaps.problem
            found.problem = f"forked workspaces are copies: {why}"
            return found
        bad = next((c for c in _OVERLAY_SEPARATORS if c in str(root)), None)
        if bad is not None:
            found.problem = f"forked workspaces are copies: the server's root holds {bad!r}"
            return found
        try:
            for point in mount_points_under(root):  # only what a server mounts there
                ours = point.parent == root / "slots" or (
                    point.name == "lower" and point.parent.parent == found.forks
                )
                if ours:
                    with contextlib.suppress(OSError):
                        _detach(point)
            if found.forks.exists():
                remove_tree(found.forks, timeout_s=600.0)
            found.forks.mkdir(mode=0o700)
            if not _is_mount_point(root):
                _mount(str(root), str(root), None, _MS_BIND, None)
                found._bound = True
            _mount(None, str(root), None, _MS_SHARED, None)
        except OSError as error:
            found.problem = f"forked workspaces are copies: {error}"
            return found
        found.ready_folders()
        return found

    def ready_folders(self) -> None:
        """Make every slot's fork folder now, empty (blocking: at the server's start), for the
        slots ``idmaps`` names (slot ``i``'s workspace is ``ROOT/slots/i``); its first fork
        then finds it, as a later fork finds the one its previous fork's reset made. A folder
        that cannot be made is left to its fork, which makes it then."""
        if self.problem is not None or self.idmaps is None:
            return
        for index, ids in enumerate(self.idmaps.slots):
            folder = self.forks / str(index)
            with contextlib.suppress(OSError):
                self._make_folder(folder, ids)
                self._ready[folder] = ids

    def mount(self, lower: Path, workspace: Path, ids: tuple[int, int]) -> None:
        """Mount the overlay of ``lower`` (a frozen workspace) at ``workspace`` (an empty
        one), its upper layer the slot's (``ids``). Raises ``OSError``; nothing stays mounted
        then."""
        if self.problem is not None:
            raise OSError(f"cannot mount the workspace: {self.problem}")
        for path in (lower, workspace):
            if any(c in str(path) for c in _OVERLAY_SEPARATORS):
                raise OSError(f"{path} holds one of ',', ':' or '\\' (the overlay's separators)")
        folder = self.forks / workspace.name
        if self._ready.pop(folder, None) != ids:  # else the last unmount made it, empty
            self._make_folder(folder, ids)
        attached = False
        assert self.idmaps is not None  # no problem: ``open`` had them
        try:
            userns = self.idmaps.held(self.owner, ids)
            if userns is None:  # a slot the server did not make ahead (never, as it starts)
                userns = self.idmaps.namespace(self.owner, ids)
            tree = self.idmaps.clone(lower, userns)
            try:
                checked(
                    LIBC.syscall(
                        _SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, str(folder / "lower").encode(),
                        _MOVE_MOUNT_F_EMPTY_PATH,
                    ),
                    "move_mount", folder / "lower",
                )  # fmt: skip
                attached = True
            finally:
                os.close(tree)
            options = f"lowerdir={folder}/lower,upperdir={folder}/upper,workdir={folder}/work"
            _mount("overlay", str(workspace), "overlay", _MS_NOSUID | _MS_NODEV, options)
        except BaseException:
            if attached:
                with contextlib.suppress(OSError):
                    _detach(folder / "lower")
            with contextlib.suppress(OSError):
                remove_tree(folder, timeout_s=600.0)
            raise
        self._mounted[workspace] = folder
        self._ids[workspace] = ids

    def _make_folder(self, folder: Path, ids: tuple[int, int]) -> None:
        """A fork's folder, empty: ``lower`` (where the clone is attached), ``work``, and
        ``upper`` (``ids``' own)."""
        if folder.exists():  # a fork's folder the last reset did not set aside
            remove_tree(folder, timeout_s=600.0)
        folder.mkdir(mode=0o700)
        (folder / "lower").mkdir(mode=0o700)
        (folder / "work").mkdir(mode=0o700)
        (folder / "upper").mkdir(mode=0o700)
        os.chown(folder / "upper", *ids)

    def mounted(self, workspace: Path) -> bool:
        """Whether ``workspace`` is a fork's overlay now."""
        return workspace in self._mounted

    def upper(self, workspace: Path) -> Path | None:
        """The upper layer of ``workspace``'s overlay (what its lease wrote), or ``None``."""
        folder = self._mounted.get(workspace)
        return None if folder is None else folder / "upper"

    def unmount(self, workspace: Path, trash: Path | None) -> str | None:
        """Detach ``workspace``'s overlay and its lower's clone and set the fork's folder
        aside into ``trash`` (or remove it now); ``None`` when done (or there was none), else
        why not."""
        folder = self._mounted.pop(workspace, None)
        ids = self._ids.pop(workspace, None)
        if folder is None:
            return None
        try:
            _detach(workspace)
            with contextlib.suppress(OSError):
                _detach(folder / "lower")
            if trash is None:
                remove_tree(folder, timeout_s=600.0)
            else:
                trash.mkdir(mode=0o700, exist_ok=True)
                folder.rename(trash / f"fork-{folder.name}-{os.urandom(6).hex()}")
        except OSError as error:
            return f"cannot unmount the forked workspace: {error}"
        if ids is not None:  # the slot's next fork finds its folder made, off its lease's path
            with contextlib.suppress(OSError):
                self._make_folder(folder, ids)
                self._ready[folder] = ids
        return None

    def close(self) -> None:
        """Detach every forked workspace and the root's own bind (the server closes)."""
        for workspace, folder in list(self._mounted.items()):
            with contextlib.suppress(OSError):
                _detach(workspace)
            with contextlib.suppress(OSError):
                _detach(folder / "lower")
        self._mounted.clear()
        if self.idmaps is not None:
            self.idmaps.close()
        if self._bound:
            self._bound = False
            with contextlib.suppress(OSError):
                _detach(self.root)
