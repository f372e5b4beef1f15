"""Unpacking an image's layers into one tree, safely, whatever the layers hold.

A layer is a tar stream (plain, gzip, bzip2 or xz) written by someone else: it may name paths
outside the tree, plant a symlink and then write through it, link to a host file, hold device
nodes, or expand to far more than it weighs. The unpacker keeps these rules:

- **Checked before written.** Each layer is read twice. The first pass checks every entry with
  ``domain.task_environments.plan_entry`` and charges the image's ``UnpackBudget``, and checks
  the layer's sha256 against its descriptor; only a layer that passed all of it is applied. So a
  refused entry or a bomb past the limits leaves the tree as the previous layer left it.
- **Whiteouts first, then the layer's files.** A ``.wh.`` entry removes what *lower* layers
  made and an opaque directory drops their content; applying all of a layer's whiteouts before
  any of its files is exactly that, whatever order the tar holds them in.
- **Descriptors, never paths.** Every directory on the way to an entry is opened relative to
  its parent with ``O_NOFOLLOW | O_DIRECTORY``; a symlink or a file where a directory should be
  ends the entry with ``LayerRefused``. Nothing here follows a symlink, so a link planted by one
  entry (or one layer) cannot carry a later write out of the tree. A hard link's target is
  opened the same way and must be a regular file in the tree.
- **No ownership, safe modes.** Files belong to the unpacking process; modes are
  ``safe_mode``'s; device nodes are skipped (under ``dev/``) or refused in planning.

``unpack_layer`` raises ``LayerRefused`` (an entry), ``TaskEnvironmentError`` (a digest that does
not match, an unknown media type) or ``OSError`` (the disk); the caller discards the whole tree
on any of them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

import attrs

from trajcore.adapters.sandbox.removal import empty_directory
from trajcore.domain.task_environments import (
    CreateEntry,
    EntryKind,
    EntryPlan,
    LayerRefused,
    MakeOpaque,
    RemoveLower,
    SkipDevice,
    TaskEnvironmentError,
    UnpackBudget,
    plan_entry,
)

__all__ = ["LAYER_MEDIA_TYPES", "Layer", "unpack_layer"]

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


def _kind(member: tarfile.TarInfo) -> EntryKind:
    if member.isreg():
        return EntryKind.FILE
    if member.isdir():
        return EntryKind.DIRECTORY
    if member.issym():
        return EntryKind.SYMLINK
    if member.islnk():
        return EntryKind.HARDLINK
    if member.isfifo():
        return EntryKind.FIFO
    if member.ischr():
        return EntryKind.CHAR_DEVICE
    if member.isblk():
        return EntryKind.BLOCK_DEVICE
    return EntryKind.OTHER


@contextlib.contextmanager
def _members(layer: Layer, image: str) -> Iterator[tuple[tarfile.TarFile, _Hashing]]:
    if layer.media_type not in LAYER_MEDIA_TYPES:
        raise TaskEnvironmentError(
            f"{image}: layer {layer.path.name}",
            f"has media type {layer.media_type!r}; known: {sorted(LAYER_MEDIA_TYPES)}",
        )
    with layer.path.open("rb") as raw:
        hashing = _Hashing(raw)
        try:
            tar = _open_stream(hashing)
        except tarfile.TarError as error:
            raise TaskEnvironmentError(
                f"{image}: layer {layer.path.name}", f"is not a tar stream: {error}"
            ) from error
        with tar:
            yield tar, hashing


def _open_stream(hashing: _Hashing) -> tarfile.TarFile:
    """A tar stream over ``hashing`` (plain or compressed; names kept as bytes can be)."""
    return tarfile.open(  # the caller closes it in a with block
        fileobj=cast("IO[bytes]", hashing),  # read() is all that stream mode uses
        mode="r|*",
        encoding="utf-8",
        errors="surrogateescape",
    )


def _check_digest(layer: Layer, hashing: _Hashing, image: str) -> None:
    found = hashing.drain()
    if layer.sha256 is not None and found != layer.sha256:
        raise TaskEnvironmentError(
            f"{image}: layer {layer.path.name}",
            f"has sha256 {found}, but its descriptor says {layer.sha256}",
        )


def _plan_layer(layer: Layer, image: str, budget: UnpackBudget) -> list[EntryPlan]:
    plans: list[EntryPlan] = []
    with _members(layer, image) as (tar, hashing):
        try:
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
                if isinstance(plan, CreateEntry):
                    budget.charge(member.name, plan.size)
                    plans.append(plan)
                elif isinstance(plan, SkipDevice):
                    budget.skipped_devices += 1
                elif plan is not None:
                    plans.append(plan)
        except tarfile.TarError as error:
            raise TaskEnvironmentError(
                f"{image}: layer {layer.path.name}", f"is a broken tar stream: {error}"
            ) from error
        _check_digest(layer, hashing, image)
    return plans


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


def _apply_removal(root: int, plan: RemoveLower | MakeOpaque, image: str) -> None:
    if isinstance(plan, MakeOpaque):
        if not plan.path:
            empty_directory(root)
            return
        parts = (*plan.path, "")  # the directory itself is the "parent" of an empty name
        fd = _open_parent(root, parts, image=image, make=False)
        if fd is not None:
            try:
                empty_directory(fd)
            finally:
                os.close(fd)
        return
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


def unpack_layer(layer: Layer, root: Path, *, image: str, budget: UnpackBudget) -> None:
    """Apply ``layer`` onto the tree at ``root`` (see the module's rules)."""
    plans = _plan_layer(layer, image, budget)
    creates = iter([plan for plan in plans if isinstance(plan, CreateEntry)])
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for plan in plans:
            if isinstance(plan, RemoveLower | MakeOpaque):
                _apply_removal(root_fd, plan, image)
        with _members(layer, image) as (tar, _):
            for member in tar:
                if member.name.rpartition("/")[2].startswith(".wh."):
                    continue
                parts = tuple(p for p in member.name.split("/") if p not in ("", "."))
                if not parts or member.ischr() or member.isblk():
                    continue
                plan = next(creates)
                if plan.path != parts:  # the stream changed between the two passes
                    raise TaskEnvironmentError(
                        f"{image}: layer {layer.path.name}", "changed while it was unpacked"
                    )
                source = tar.extractfile(member) if plan.kind is EntryKind.FILE else None
                _create(root_fd, plan, source, image)
    finally:
        os.close(root_fd)
