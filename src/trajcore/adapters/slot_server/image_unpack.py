"""Unpacking an image's layers into one tree, safely, whatever the layers hold.

A layer is a tar stream (plain, gzip, bzip2 or xz) written by someone else: it may name paths
outside the tree, plant a symlink and then write through it, link to a host file, hold device
nodes, or expand to far more than it weighs. The unpacker keeps these rules:

- **One pass, from any stream.** A layer is read once, from a file or a pipe (``podman
  export``): each entry is checked with ``domain.task_environments.plan_entry`` and charged to
  the image's ``UnpackBudget`` before it is written, and the layer's sha256 is checked at its
  end. The tree being unpacked is the cache's staging copy, which the caller discards on any
  error, so a refusal or a bomb midway admits nothing.
- **Whiteouts reach lower layers only**, whatever order the tar holds them in: the unpacker
  remembers what the current layer made, a ``.wh.`` entry leaves that alone, and an opaque
  directory drops everything under it that the current layer did not make.
- **Descriptors, never paths.** Every directory on the way to an entry is opened relative to
  its parent with ``O_NOFOLLOW | O_DIRECTORY``; a symlink or a file where a directory should be
  ends the entry with ``LayerRefused``. Nothing here follows a symlink, so a link planted by one
  entry (or one layer) cannot carry a later write out of the tree. A hard link's target is
  opened the same way and must be a regular file in the tree.
- **No ownership, safe modes.** Files belong to the unpacking process; modes are
  ``safe_mode``'s; device nodes are skipped (under ``dev/``) or refused in planning.

``unpack_layer`` and ``unpack_stream`` raise ``LayerRefused`` (an entry), ``TaskEnvironmentError``
(a digest that does not match, an unknown media type, a broken stream) or ``OSError`` (the
disk); the caller discards the whole tree on any of them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tarfile
from pathlib import Path
from typing import IO, cast

import attrs

from trajcore.adapters.removal import empty_directory
from trajcore.domain.task_environments import (
    CreateEntry,
    EntryKind,
    LayerRefused,
    MakeOpaque,
    RemoveLower,
    SkipDevice,
    TaskEnvironmentError,
    UnpackBudget,
    plan_entry,
)

__all__ = ["LAYER_MEDIA_TYPES", "Layer", "unpack_layer", "unpack_stream"]

LAYER_MEDIA_TYPES = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/x-tar",  # docker-archive's layer.tar, typed by the reader
    }
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


@attrs.frozen(kw_only=True)
class Layer:
    """One layer blob on disk: where, what kind of tar, and the sha256 it must have (or None
    when the format names no digest, as a docker archive's ``layer.tar``)."""

    path: Path
    media_type: str
    sha256: str | None


class _Hashing:
    """A read-only stream that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.digest.update(data)
        return data

    def drain(self) -> str:
        while self.read(_CHUNK):
            pass
        return self.digest.hexdigest()


# A header's type flag to what the entry is (as ``TarInfo.isreg()``, ``isdir()``, ... read it).
_KINDS: dict[bytes, EntryKind] = {
    **dict.fromkeys(tarfile.REGULAR_TYPES, EntryKind.FILE),
    tarfile.DIRTYPE: EntryKind.DIRECTORY,
    tarfile.SYMTYPE: EntryKind.SYMLINK,
    tarfile.LNKTYPE: EntryKind.HARDLINK,
    tarfile.FIFOTYPE: EntryKind.FIFO,
    tarfile.CHRTYPE: EntryKind.CHAR_DEVICE,
    tarfile.BLKTYPE: EntryKind.BLOCK_DEVICE,
}


def _kind(member: tarfile.TarInfo) -> EntryKind:
    return _KINDS.get(member.type, EntryKind.OTHER)


def _open_stream(hashing: _Hashing) -> tarfile.TarFile:
    """A tar stream over ``hashing`` (plain or compressed; names kept as bytes can be)."""
    return tarfile.open(  # the caller closes it in a with block
        fileobj=cast("IO[bytes]", hashing),  # read() is all that stream mode uses
        mode="r|*",
        encoding="utf-8",
        errors="surrogateescape",
    )


def _open_parent(root: int, parts: tuple[str, ...], *, image: str, make: bool) -> int | None:
    """The directory holding ``parts[-1]``, walked from ``root`` without following a symlink.

    With ``make``, missing directories are created (mode 0755); without it a missing one gives
    None. A symlink or a non-directory on the way is refused.
    """
    fd = os.dup(root)
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    shown = "/".join(parts[: index + 1])
                    raise LayerRefused(
                        f"{image}: entry {'/'.join(parts)!r}",
                        f"passes through {shown!r}, which is not a directory (a symlink or a file)",
                    ) from error
                raise
            os.close(fd)
            fd = child
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def _remove_entry(parent: int, name: str) -> None:
    """Remove ``name`` in ``parent`` whatever it is; a directory with everything in it."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        empty_directory(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def _drop_lower(fd: int, under: tuple[str, ...], made: set[tuple[str, ...]]) -> None:
    """Remove everything in the directory open at ``fd`` (the tree's ``under``) that the
    current layer did not make; directories it made are kept and walked in turn."""
    walk = [(os.dup(fd), under)]
    while walk:
        dir_fd, path = walk.pop()
        try:
            for name in os.listdir(dir_fd):
                child = (*path, name)
                if child not in made:
                    _remove_entry(dir_fd, name)
                elif stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    walk.append((os.open(name, _DIR_FLAGS, dir_fd=dir_fd), child))
        finally:
            os.close(dir_fd)


def _apply_removal(
    root: int, plan: RemoveLower | MakeOpaque, image: str, made: set[tuple[str, ...]]
) -> None:
    if isinstance(plan, MakeOpaque):
        parts = (*plan.path, "")  # the directory itself is the "parent" of an empty name
        fd = _open_parent(root, parts, image=image, make=False)
        if fd is not None:
            try:
                _drop_lower(fd, plan.path, made)
            finally:
                os.close(fd)
        return
    if plan.path in made:
        return  # this layer's own entry: a whiteout removes only what lower layers made
    fd = _open_parent(root, plan.path, image=image, make=False)
    if fd is None:
        return  # a whiteout of something lower layers never made
    try:
        _remove_entry(fd, plan.path[-1])
    finally:
        os.close(fd)


def _write_file(parent: int, name: str, source: IO[bytes] | None, plan: CreateEntry) -> None:
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=parent,
    )
    with os.fdopen(fd, "wb") as out:
        left = plan.size
        while left > 0 and source is not None:
            chunk = source.read(min(left, _CHUNK))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        if left:
            raise OSError(errno.EIO, f"the layer ended {left} bytes into {name!r}")
        os.fchmod(out.fileno(), plan.mode)


def _link_file(root: int, parent: int, name: str, plan: CreateEntry, image: str) -> None:
    assert plan.link is not None
    target = tuple(plan.link.split("/"))
    field = f"{image}: entry {'/'.join(plan.path)!r}"
    try:
        source_dir = _open_parent(root, target, image=image, make=False)
    except LayerRefused as error:
        raise LayerRefused(
            field, f"is a hard link to {plan.link!r}, which {error.reason}"
        ) from error
    if source_dir is None:
        raise LayerRefused(field, f"is a hard link to {plan.link!r}, which the tree does not hold")
    try:
        info = os.stat(target[-1], dir_fd=source_dir, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise LayerRefused(
                field, f"is a hard link to {plan.link!r}, which is not a regular file"
            )
        os.link(target[-1], name, src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError as error:
        raise LayerRefused(
            field, f"is a hard link to {plan.link!r}, which the tree does not hold"
        ) from error
    finally:
        os.close(source_dir)


def _create(root: int, plan: CreateEntry, source: IO[bytes] | None, image: str) -> None:
    parent = _open_parent(root, plan.path, image=image, make=True)
    assert parent is not None
    name = plan.path[-1]
    try:
        if plan.kind is EntryKind.DIRECTORY:
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                os.mkdir(name, plan.mode, dir_fd=parent)
            else:
                if not stat.S_ISDIR(info.st_mode):
                    _remove_entry(parent, name)
                    os.mkdir(name, plan.mode, dir_fd=parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            try:
                os.fchmod(fd, plan.mode)
            finally:
                os.close(fd)
            return
        _remove_entry(parent, name)  # a later entry or layer replaces what was there
        if plan.kind is EntryKind.FILE:
            _write_file(parent, name, source, plan)
        elif plan.kind is EntryKind.SYMLINK:
            assert plan.link is not None
            os.symlink(plan.link, name, dir_fd=parent)
        elif plan.kind is EntryKind.HARDLINK:
            _link_file(root, parent, name, plan, image)
        elif plan.kind is EntryKind.FIFO:
            os.mkfifo(name, plan.mode, dir_fd=parent)
    finally:
        os.close(parent)


def unpack_stream(
    stream: IO[bytes],
    root: Path,
    *,
    image: str,
    label: str,
    sha256: str | None,
    budget: UnpackBudget,
) -> None:
    """Apply the layer read from ``stream`` onto the tree at ``root`` (see the module's rules);
    ``label`` names the layer in errors, ``sha256`` is what the stream must hash to (or None)."""
    field = f"{image}: layer {label}"
    hashing = _Hashing(stream)
    made: set[tuple[str, ...]] = set()
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        with _open_stream(hashing) as tar:
            for member in tar:
                plan = plan_entry(
                    image=image,
                    name=member.name,
                    kind=_kind(member),
                    mode=member.mode,
                    size=member.size if member.isreg() else 0,
                    link=member.linkname,
                    limits=budget.limits,
                )
                if isinstance(plan, SkipDevice):
                    budget.skipped_devices += 1
                elif isinstance(plan, RemoveLower | MakeOpaque):
                    _apply_removal(root_fd, plan, image, made)
                elif isinstance(plan, CreateEntry):
                    budget.charge(member.name, plan.size)
                    source = tar.extractfile(member) if plan.kind is EntryKind.FILE else None
                    _create(root_fd, plan, source, image)
                    made.update(plan.path[:end] for end in range(1, len(plan.path) + 1))
    except tarfile.TarError as error:
        raise TaskEnvironmentError(field, f"is not a readable tar stream: {error}") from error
    finally:
        os.close(root_fd)
    found = hashing.drain()
    if sha256 is not None and found != sha256:
        raise TaskEnvironmentError(field, f"has sha256 {found}, but its descriptor says {sha256}")


def unpack_layer(layer: Layer, root: Path, *, image: str, budget: UnpackBudget) -> None:
    """Apply the layer blob ``layer`` onto the tree at ``root``."""
    if layer.media_type not in LAYER_MEDIA_TYPES:
        raise TaskEnvironmentError(
            f"{image}: layer {layer.path.name}",
            f"has media type {layer.media_type!r}; known: {sorted(LAYER_MEDIA_TYPES)}",
        )
    with layer.path.open("rb") as stream:
        unpack_stream(
            stream, root, image=image, label=layer.path.name, sha256=layer.sha256, budget=budget
        )
