"""Slot identities: the host uid/gid a slot's sandbox runs as, and the files it must reach.

A slot server run as root never runs a sandbox as root: slot ``i`` runs as host uid and gid
``slot_uid_base + i`` (``bwrap`` is started with that real uid, no supplementary groups, and
maps the same uid inside its user namespace, so root of the sandbox's namespace is unmapped).
``RLIMIT_NPROC`` then counts one slot's processes, ``/etc/shadow`` is unreadable, and one
slot's processes cannot signal or trace another's. A server that is not root runs every slot
as itself, as before.

An unprivileged ``bwrap`` resolves every bind source with the slot's own rights, so everything
a sandbox binds must be reachable by a stranger: this module finds the first directory that is
not (``unreachable``), and stages what a sandbox needs from places that are private (a Python
under ``/root/.pyenv``, the compiled helper in ``/root/.cache``) as root-owned, world-readable
copies under the server's root (``stage_python``, ``stage_file``). Python is staged as hard
links where the file system allows (a few milliseconds), as copies otherwise, and only the part
the agent needs: the interpreter, its shared library, the top-level standard library,
``encodings``, ``ctypes`` and the extension modules. Nothing here changes a host path outside
the server's root.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

__all__ = ["stage_file", "stage_python", "unmapped", "unreachable"]

# Packages of the standard library the staged Python keeps (besides its top-level modules and
# its extension modules): what ``-I -S`` needs to start and what the agent imports.
_PACKAGES = ("encodings", "ctypes")


def unreachable(path: Path) -> str | None:
    """The first directory from ``/`` down to ``path`` (included) that a user who is neither
    its owner nor in its group cannot search, or ``None`` when every one of them can."""
    current = Path("/")
    for part in (Path("/"), *path.absolute().parents[::-1][1:], path.absolute()):
        current = part
        try:
            mode = current.stat().st_mode
        except OSError as error:
            return f"{current} ({error.strerror})"
        if not mode & stat.S_IXOTH:
            return f"{current} (mode {stat.S_IMODE(mode):o})"
    return None


def unmapped(first: int, count: int, uid_map: str) -> str | None:
    """Why uids ``first .. first + count - 1`` cannot be used in the user namespace whose
    ``/proc/self/uid_map`` is ``uid_map`` (a container with remapped ids maps only a range),
    or ``None`` when they all are mapped."""
    for line in uid_map.splitlines():
        fields = line.split()
        if len(fields) != 3:
            continue
        inside, _, length = (int(field) for field in fields)
        if inside <= first and first + count <= inside + length:
            return None
    ranges = ", ".join(
        f"{int(f[0])}..{int(f[0]) + int(f[2]) - 1}"
        for f in (line.split() for line in uid_map.splitlines())
        if len(f) == 3
    )
    return f"uids {first}..{first + count - 1} are not mapped here (mapped: {ranges or 'none'})"


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
        os.chmod(target, 0o755 if os.access(source, os.X_OK) else 0o644)


def _readable(path: Path) -> bool:
    mode = path.stat().st_mode
    return bool(mode & stat.S_IROTH)


def _stage_tree(source: Path, target: Path, *, recurse: bool) -> None:
    target.mkdir(mode=0o755, exist_ok=True)
    for entry in os.scandir(source):
        origin = Path(entry.path)
        if entry.is_symlink():
            os.symlink(os.readlink(origin), target / entry.name)
        elif entry.is_file() and _readable(origin):
            _link_or_copy(origin, target / entry.name)
        elif (
            entry.is_dir()
            and (recurse or entry.name == "__pycache__")
            and entry.name not in ("test", "tests", "site-packages")
        ):
            _stage_tree(origin, target / entry.name, recurse=recurse)


def stage_python(prefix: Path, executable: Path, into: Path) -> Path:
    """Stage the interpreter ``executable`` of the installation at ``prefix`` under ``into``
    (made afresh), laid out as ``prefix`` is, for a sandbox to bind back at ``prefix``.
    Returns ``into``. Raises ``OSError``."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(mode=0o755, parents=True)
    relative = executable.relative_to(prefix)
    (into / relative.parent).mkdir(mode=0o755, parents=True, exist_ok=True)
    _link_or_copy(executable, into / relative)
    library = prefix / "lib"
    staged_library = into / "lib"
    staged_library.mkdir(mode=0o755, exist_ok=True)
    for entry in os.scandir(library):
        if entry.name.startswith("libpython") and entry.is_file() and not entry.is_symlink():
            _link_or_copy(Path(entry.path), staged_library / entry.name)
        elif entry.name.startswith("libpython") and entry.is_symlink():
            os.symlink(os.readlink(entry.path), staged_library / entry.name)
    for entry in os.scandir(library):
        if entry.name.startswith("python3") and entry.is_dir():
            standard = Path(entry.path)
            _stage_tree(standard, staged_library / entry.name, recurse=False)
            for package in (*_PACKAGES, "lib-dynload"):
                if (standard / package).is_dir():
                    _stage_tree(
                        standard / package, staged_library / entry.name / package, recurse=True
                    )
    return into


def stage_file(source: Path, into: Path) -> Path:
    """A root-owned copy of ``source`` at ``into`` (mode 0755), replaced atomically. Returns
    ``into``. Raises ``OSError``."""
    temporary = into.with_name(f".{into.name}.tmp")
    shutil.copyfile(source, temporary)
    os.chmod(temporary, 0o755)  # noqa: S103 - a program every slot uid runs
    os.replace(temporary, into)
    return into
