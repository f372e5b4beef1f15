"""A small image with a shell, made at test time from the host's own programs.

The image holds ``/bin/sh``, ``cat``, ``ls``, ``rm``, ``mkdir`` and ``id``, the libraries ``ldd``
names for them (each at the path the program asks for) and an ``/etc/os-release`` of its own,
written as an OCI image layout with ``tests/image_layouts.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

from tests.image_layouts import Entry, write_layout
from trajcore.adapters.slot_server.image_checks import HOST_ARCHITECTURE

__all__ = [
    "IMAGE_OS_RELEASE",
    "PROGRAMS",
    "image_problem",
    "shell_entries",
    "write_shell_image",
    "write_shell_tree",
]

PROGRAMS = ("/bin/sh", "/bin/cat", "/bin/ls", "/bin/rm", "/bin/mkdir", "/usr/bin/id")
IMAGE_OS_RELEASE = b'ID=trajcore-test-image\nPRETTY_NAME="trajcore test image"\n'


def image_problem() -> str | None:
    """Why the shell image cannot be made here, or ``None``."""
    if shutil.which("ldd") is None:
        return "ldd is not installed (it names the programs' libraries)"
    missing = [path for path in PROGRAMS if not Path(path).exists()]
    return f"the host lacks {missing}" if missing else None


def _libraries(program: str) -> set[str]:
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        match = re.search(r"(/\S+)", line.split("=>")[-1])
        if match:
            found.add(match.group(1))
    return found


def shell_entries(programs: Sequence[str] = ()) -> list[Entry]:
    """The image's entries: its folders, programs (and the host's ``programs`` besides),
    libraries and ``/etc/os-release``."""
    files = {*PROGRAMS, *programs}
    for program in sorted(files):
        files |= _libraries(program)
    dirs: set[str] = set()
    for path in files | {"/etc/os-release"}:
        parent = Path(path).parent
        while str(parent) != "/":
            dirs.add(str(parent))
            parent = parent.parent
    entries = [
        Entry(name=d.lstrip("/") + "/", kind=tarfile.DIRTYPE, mode=0o755) for d in sorted(dirs)
    ]
    entries += [
        Entry(name=path.lstrip("/"), data=Path(path).read_bytes(), mode=0o755)
        for path in sorted(files)
    ]
    entries.append(Entry(name="etc/os-release", data=IMAGE_OS_RELEASE, mode=0o644))
    return entries


def write_shell_image(
    layout: Path,
    *,
    salt: str = "",
    extra: Sequence[Entry] = (),
    programs: Sequence[str] = (),
    env: Sequence[str] | None = None,
    architecture: str = HOST_ARCHITECTURE,
) -> str:
    """Write the image at ``layout`` (with the host's ``programs`` and the ``extra`` entries
    besides, and ``env`` as its config's ``Env``); its id."""
    entries = shell_entries(programs) + list(extra)
    return write_layout(layout, [entries], salt=salt, env=env, architecture=architecture)


def write_shell_tree(tree: Path) -> None:
    """Write the image's files as a plain directory at ``tree`` (a ``directory:`` root), owned
    by the test's user, folders 0755."""
    for entry in shell_entries():
        path = tree / entry.name
        if entry.kind == tarfile.DIRTYPE:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(entry.data)
        path.chmod(entry.mode)
    tree.chmod(0o755)
