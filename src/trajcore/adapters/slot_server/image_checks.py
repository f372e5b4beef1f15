"""What a lease over a task environment checks before it is granted: that the tree can run the
slot's commands at all.

A lease whose image cannot start ``/bin/sh`` would turn every command of the model into a tool
error and the member into a 0; it is refused instead, naming the image and the reason, and the
pool makes that member an infrastructure failure (``EnvironmentUnavailable``). Two things are
checked, with a few system calls on the tree and nothing run:

- **A shell.** ``/bin/sh`` resolved inside the tree (its symlinks followed within the tree, an
  absolute target read from the tree's root, never the host's: a usr-merged image has
  ``/bin -> usr/bin``) is an executable regular file.
- **The architecture.** The image's config names an architecture (``CachedImage.architecture``,
  where the image source gives one) and the shell is an ELF program for a machine: either one
  that is not this host's is refused ("is built for arm64, this host runs amd64").

``ImageChecks`` remembers each image's answer by its id, so a lease over an image already
checked costs a dictionary lookup. A ``directory:`` tree is checked on every lease (the operator
may fix the tree between two).
"""

from __future__ import annotations

import os
import platform
import stat
from pathlib import Path

from trajcore.adapters.slot_server.image_cache import CachedImage, ImageCache, ImageUse
from trajcore.domain.task_environments import EnvironmentRef

__all__ = ["HOST_ARCHITECTURE", "ImageChecks", "resolve_inside", "unrunnable"]

_ARCHITECTURES = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
HOST_ARCHITECTURE = _ARCHITECTURES.get(platform.machine().lower(), platform.machine().lower())
"""This host's architecture, as image configs name it (``amd64``, ``arm64``, ...)."""

# ELF ``e_machine`` of the 64-bit machines an image is built for; a 32-bit one (i386, arm) may
# run on its 64-bit host, so it is not judged
_ELF_MACHINES = {62: "amd64", 183: "arm64", 21: "ppc64le", 22: "s390x", 243: "riscv64"}
_MAX_LINKS = 40  # as the kernel's own limit on the symlinks one lookup follows


def resolve_inside(root: Path, path: str) -> Path | None:
    """Where ``path`` leads in the tree at ``root``, every symlink on the way followed within
    the tree (an absolute target from ``root``, ``..`` never above it); ``None`` when a part
    is missing, is not a directory where one is needed, or the links loop."""
    parts = [part for part in path.split("/") if part]
    current: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if current:
                current.pop()
            continue
        candidate = root.joinpath(*current, part)
        try:
            info = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return None
            try:
                target = os.readlink(candidate)
            except OSError:
                return None
            if target.startswith("/"):
                current = []
            parts = [piece for piece in target.split("/") if piece] + parts
            continue
        if parts and not stat.S_ISDIR(info.st_mode):
            return None
        current.append(part)
    return root.joinpath(*current)


def _elf_architecture(program: Path) -> str | None:
    """The 64-bit machine ``program`` is an ELF program for, or ``None`` (not ELF, 32-bit, a
    machine not named here, unreadable)."""
    try:
        with program.open("rb") as source:
            head = source.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return _ELF_MACHINES.get(machine)


def unrunnable(image: CachedImage, host: str = HOST_ARCHITECTURE) -> str | None:
    """Why a lease over ``image`` could run no command (the reason, after the image's name),
    or ``None`` when it can."""
    if image.architecture and _ARCHITECTURES.get(image.architecture) not in (None, host):
        return f"is built for {image.architecture}, this host runs {host}"
    shell = resolve_inside(image.rootfs, "/bin/sh")
    try:
        info = None if shell is None else os.lstat(shell)
    except OSError:
        info = None
    if shell is None or info is None or not stat.S_ISREG(info.st_mode):
        return "has no /bin/sh (the slot's commands run with it)"
    if not info.st_mode & 0o111:
        return "has a /bin/sh that is not executable"
    built_for = _elf_architecture(shell)
    if built_for is not None and host in _ELF_MACHINES.values() and built_for != host:
        return f"is built for {built_for} (its /bin/sh), this host runs {host}"
    return None


class ImageChecks:
    """``unrunnable``'s answers, remembered per image id (``directory:`` trees: never)."""

    def __init__(self) -> None:
        self._answers: dict[str, str | None] = {}

    def problem(self, image: CachedImage) -> str | None:
        """Why no command could run over ``image`` (``"image REF has no /bin/sh ..."``), or
        ``None``."""
        if image.image_id in self._answers:
            reason = self._answers[image.image_id]
        else:
            reason = unrunnable(image)
            if not image.ref.startswith("directory:"):
                self._answers[image.image_id] = reason
        return None if reason is None else f"image {image.ref} {reason}"

    def acquire(self, cache: ImageCache, ref: EnvironmentRef) -> tuple[ImageUse, str | None]:
        """``ref``'s image held from ``cache``, and ``problem``'s answer for it: both of them
        reading files, for a thread (never the server's event loop: a slow file system would
        hold every slot)."""
        use = cache.acquire(ref)
        try:
            return use, self.problem(use.image)
        except BaseException:
            use.close()
            raise
