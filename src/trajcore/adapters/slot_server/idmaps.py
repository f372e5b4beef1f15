"""Idmapped, read-only clones of trees: a tree the server owns shown as a slot's own.

A lease writes its own files only. What it is given to change but must never write (the image
cache's trees, a snapshot's frozen layers and workspace) belongs to the server; a lease sees it
through an *idmapped* clone (``open_tree`` + ``mount_setattr``: ``MOUNT_ATTR_IDMAP`` with
``MOUNT_ATTR_RDONLY``, ``NOSUID`` and ``NODEV``) that shows the tree's owner as the slot's uid
and gid, under an overlay whose upper layer is the lease's own: the lease may change, rename
and remove those files, each copied up into its layer first, and the tree itself is never
written (the clone is read-only, and overlayfs never writes a lower layer).

An idmapped mount takes a user namespace whose map says which ids become which: one per owner
and slot, held by descriptor for the server's life. Making one takes a process that unshares
its user namespace, too slow a step for a fork's lease path, so the compiled slot helper makes
them (``slot-helper userns COUNT``: one program, a child per namespace) for all of a server's
slots at once when the server starts (``prepare``), off every lease's path.

Where the host cannot (a server that is not root, a kernel without idmapped mounts, a file
system that refuses them), ``problem`` says why, and whoever asked keeps to what it did before
(a copied workspace; image files read-only to the lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import select
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

__all__ = ["LIBC", "IdMaps", "Ids", "checked", "kernel_problem", "make_namespaces", "open_idmaps"]

Ids = tuple[int, int]
"""A uid and a gid."""

_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442  # the same on every architecture
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_EMPTY_PATH = 1, os.O_CLOEXEC, 0x1000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MOUNT_ATTR_IDMAP = 0x100000
_AT_FDCWD = -100
_OVERLAY_IDMAPPED_LAYERS = (5, 19)  # overlayfs takes idmapped layers from Linux 5.19 on
NAMESPACE_TIMEOUT_S = 10.0
"""How long making the namespaces may take before it fails (and says so)."""


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


LIBC = ctypes.CDLL(None, use_errno=True)
"""The C library, its calls setting ``errno`` (read by ``checked``)."""


def checked(result: int, what: str, path: object = None) -> int:
    """``result`` of a C call, or the ``OSError`` of its ``errno`` naming ``what`` and ``path``."""
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}", None if path is None else path)
    return result


def kernel_problem(release: str | None = None) -> str | None:
    """Why this kernel cannot stack an overlay over idmapped layers, or ``None``."""
    release = platform.release() if release is None else release
    numbers = []
    for part in release.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            return f"cannot read the kernel's version from {release!r}"
        numbers.append(int(digits))
    if len(numbers) < 2:
        return f"cannot read the kernel's version from {release!r}"
    if tuple(numbers) < _OVERLAY_IDMAPPED_LAYERS:
        return f"overlayfs takes idmapped layers from Linux 5.19 on (this kernel: {release})"
    return None


def make_namespaces(
    helper: Path, maps: Sequence[tuple[Ids, Ids]], *, timeout_s: float = NAMESPACE_TIMEOUT_S
) -> list[int]:
    """User namespaces mapping each ``(owner, ids)`` pair's owner to its ids (uid and gid, one
    each): their descriptors, in order, made by one ``slot-helper userns`` run (as root).
    Raises ``OSError`` saying why (nothing is held then)."""
    if not maps:
        return []
    child = subprocess.Popen(
        [str(helper), "userns", str(len(maps))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdin is not None
    assert child.stdout is not None
    assert child.stderr is not None
    held: list[int] = []
    deadline = time.monotonic() + timeout_s
    problem = None
    try:
        line = _read_line(child.stdout.fileno(), deadline, timeout_s)
        words = line.split()
        if len(words) != len(maps) or not all(word.isdigit() for word in words):
            problem = f"the slot helper printed {line[:200]!r}"
        else:
            for pid, (owner, ids) in zip(words, maps, strict=True):
                for kind, inside, outside in (("uid", owner[0], ids[0]), ("gid", owner[1], ids[1])):
                    Path(f"/proc/{pid}/{kind}_map").write_text(f"{inside} {outside} 1\n")
                held.append(os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            child.stdin.close()  # each namespace's process ends; the descriptors hold them
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        os.set_blocking(child.stderr.fileno(), False)
        with contextlib.suppress(OSError):
            said = os.read(child.stderr.fileno(), 4096).decode("utf-8", "replace").strip()
            problem = problem and (said or problem)
        child.stdout.close()
        child.stderr.close()
    if problem is not None:
        raise OSError(f"cannot make user namespaces to map ids with: {problem}")
    return held


def _read_line(fd: int, deadline: float, timeout_s: float) -> str:
    """One line from ``fd`` by ``deadline`` (what came before the end, at its end)."""
    got = b""
    while not got.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            raise OSError(f"cannot make user namespaces within {timeout_s:.1f} s")
        more = os.read(fd, 4096)
        if not more:
            break
        got += more
    return got.decode("ascii", "replace").strip()


@attrs.define(eq=False)
class IdMaps:
    """The user namespaces of one slot server's idmapped clones, made by ``helper``.

    Attributes:
        helper: The slot helper (``slot-helper userns``).
        problem: Why no clone can be made here (``None``: they can).
        slots: Every slot's ids, in the slots' order, as the first ``prepare`` named them.
    """

    helper: Path
    problem: str | None = None
    slots: tuple[Ids, ...] = ()
    failure: str | None = None
    """Why the last lease that should have had clones had none (``lease_clones``)."""
    _held: dict[tuple[Ids, Ids], int] = attrs.field(factory=dict)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def prepare(self, owner: Ids, slots: Sequence[Ids]) -> None:
        """Make the namespaces that map ``owner`` to each of ``slots`` now (blocking: at the
        server's start, in a worker thread). Sets ``problem`` when they cannot be made."""
        if not self.slots:
            self.slots = tuple(slots)
        if self.problem is not None:
            return
        with self._lock:
            wanted = [
                (owner, ids) for ids in dict.fromkeys(slots) if (owner, ids) not in self._held
            ]
            try:
                made = make_namespaces(self.helper, wanted)
            except OSError as error:
                self.problem = str(error)
                return
            self._held.update(zip(wanted, made, strict=True))

    def held(self, owner: Ids, ids: Ids) -> int | None:
        """The namespace mapping ``owner`` to ``ids`` when it is made already (no blocking)."""
        return self._held.get((owner, ids))

    def namespace(self, owner: Ids, ids: Ids) -> int:
        """The namespace mapping ``owner`` to ``ids``, made now when it is not yet (blocking).
        Raises ``OSError``."""
        if self.problem is not None:
            raise OSError(self.problem)
        with self._lock:
            found = self._held.get((owner, ids))
            if found is None:
                (found,) = make_namespaces(self.helper, [(owner, ids)])
                self._held[(owner, ids)] = found
            return found

    def clone(self, path: Path, userns: int) -> int:
        """A detached, read-only, nosuid, nodev clone of ``path`` idmapped through ``userns``
        (a descriptor to attach with ``move_mount``, or to close). Raises ``OSError``."""
        tree = checked(
            LIBC.syscall(
                _SYS_OPEN_TREE, _AT_FDCWD, str(path).encode(),
                _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC,
            ),
            "open_tree", path,
        )  # fmt: skip
        try:
            attr = _MountAttr(
                _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV,
                0, 0, userns,
            )  # fmt: skip
            checked(
                LIBC.syscall(
                    _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                    ctypes.sizeof(attr),
                ),
                "mount_setattr (an idmapped clone)", path,
            )  # fmt: skip
        except BaseException:
            os.close(tree)
            raise
        return tree

    async def lease_clones(self, ids: Ids | None, layers: Sequence[Path]) -> list[int]:
        """Idmapped clones of a lease's read-only ``layers`` (top first), each showing its
        owner as the slot's ``ids``, for the keeper to mount in the lease's namespace instead
        of the layers themselves; the caller closes them. None when there are no ``ids`` (a
        server that is not root), or when one cannot be made (``failure`` says why: the lease
        mounts the layers as they are, read-only to it, as without clones). Made in a worker
        thread: ``open_tree`` and ``mount_setattr`` wait for the kernel's mount lock, which
        the keepers' lease setups take in turn (for tens of milliseconds when a group's forks
        start at once), and would stall the server's event loop meanwhile."""
        if ids is None or not layers or self.problem is not None:
            return []
        made = asyncio.ensure_future(asyncio.to_thread(self.lease_clones_now, ids, layers))
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(_close_clones)  # nobody takes them now
            raise

    def lease_clones_now(self, ids: Ids | None, layers: Sequence[Path]) -> list[int]:
        """``lease_clones``, blocking (in a worker thread the caller is in already: a fork
        request's, which makes its leases' clones beside their workspaces)."""
        if ids is None or not layers or self.problem is not None:
            return []
        clones: list[int] = []
        try:
            for layer in layers:
                info = os.stat(layer)
                owner = (info.st_uid, info.st_gid)
                userns = self.held(owner, ids)
                if userns is None:  # an owner the server did not expect: made now
                    userns = self.namespace(owner, ids)
                clones.append(self.clone(layer, userns))
        except OSError as error:
            for fd in clones:
                os.close(fd)
            self.failure = str(error)
            return []
        return clones

    def close(self) -> None:
        with self._lock:
            for fd in self._held.values():
                os.close(fd)
            self._held.clear()


def _close_clones(made: asyncio.Future[list[int]]) -> None:
    if not made.cancelled() and made.exception() is None:
        for fd in made.result():
            os.close(fd)


def open_idmaps(
    helper: Path, owner: Ids | None, slots: Sequence[Ids], images: Path
) -> tuple[IdMaps | None, str | None]:
    """A slot server's idmaps, their namespaces made for every slot (``owner``, the server's
    ids, and the owner of ``images``, the image cache's trees, each mapped to every slot's
    ids), and why a lease's image layers cannot be idmapped clones (``None``: they can).
    ``None`` for a server that is not root (``owner`` is ``None``). Blocking."""
    if owner is None:
        return None, "the slot server does not run as root"
    idmaps = IdMaps(helper=helper)
    info = images.stat()
    for each in dict.fromkeys((owner, (info.st_uid, info.st_gid))):
        idmaps.prepare(each, slots)
    if idmaps.problem is not None:
        return idmaps, idmaps.problem
    problem = kernel_problem()
    if problem is not None or not slots:
        return idmaps, problem or "no slots"
    try:  # the cache's file system takes idmapped mounts
        os.close(idmaps.clone(images, idmaps.namespace((info.st_uid, info.st_gid), slots[0])))
    except OSError as error:
        return idmaps, f"the image cache's file system cannot be idmapped ({error})"
    return idmaps, None
