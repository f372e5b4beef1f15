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
copies (``shared_python``, ``stage_python``, ``stage_file``). Python is staged once per host
and installation as hard links (``/var/tmp/trajcore-python/KEY``, KEY derived from the
interpreter and its ``site-packages``; built in a private directory and renamed into place, and
used only while it and its parent belong to root and no one else can write them): the
interpreter, its shared library and its whole library with ``site-packages`` (commands in a slot
may run that Python too), without CPython's own test suites. Where hard links are impossible
(another file system), the server stages the standard library alone by copying, under its own
root. Nothing here changes a host path outside ``/var/tmp/trajcore-python`` and the server's
root.

A sandbox binds the staged library read-only, so whatever Python or pytest would cache there must
be cached before a slot runs: a staging runs the staged interpreter once, as root, with the tree
being built mounted at ``prefix`` in a private mount namespace (so nothing reaches the host's
tree, and the cached code names the paths a slot sees): ``compileall`` writes the plain ``.pyc``
the host lacks, and pytest, run on one trivial test, writes its rewritten plugin modules
(``*-pytest-VERSION.pyc``). Without them every pytest run in every slot rewrites its plugins
again (twice the CPU of a short pytest run). What it did is written to ``CACHES_NOTE`` in the
staged tree; when it fails, the staging stands without the caches and a warning says why.
``_FORMAT`` is part of KEY, so a staging made before a change of what it holds is not reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

__all__ = [
    "CACHES_NOTE",
    "shared_python",
    "stage_caches",
    "stage_file",
    "stage_python",
    "unmapped",
    "unreachable",
]

_log = logging.getLogger(__name__)


# What a staged library leaves out: CPython's own test suites (and, when copied, site-packages).
_LEFT_OUT = frozenset({"test", "tests", "idle_test"})
_SHARED = Path("/var/tmp/trajcore-python")  # noqa: S108 - root-owned, checked before each use
_FORMAT = "2"  # what a staging holds: 2 adds the compiled caches (stage_caches)
CACHES_NOTE = ".trajcore-caches"
"""The file of a shared staging that says what ``stage_caches`` did (JSON)."""
_CACHES_TIMEOUT_S = 600.0


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


def _link_or_copy(source: Path, target: Path, *, copy: bool) -> None:
    if not copy:
        os.link(source, target)
        return
    shutil.copy2(source, target)
    os.chmod(target, 0o755 if os.access(source, os.X_OK) else 0o644)


def _readable(path: Path) -> bool:
    mode = path.stat().st_mode
    return bool(mode & stat.S_IROTH)


def _stage_tree(source: Path, target: Path, *, copy: bool) -> None:
    target.mkdir(mode=0o755, exist_ok=True)
    for entry in os.scandir(source):
        origin = Path(entry.path)
        if entry.is_symlink():
            os.symlink(os.readlink(origin), target / entry.name)
        elif entry.is_file() and _readable(origin):
            _link_or_copy(origin, target / entry.name, copy=copy)
        elif (
            entry.is_dir()
            and entry.name not in _LEFT_OUT
            and not (copy and entry.name == "site-packages")
        ):
            _stage_tree(origin, target / entry.name, copy=copy)


def _private(path: Path) -> None:
    """Raise ``OSError`` unless ``path`` belongs to this user and no one else can write it."""
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise OSError(1, f"{path} is not a directory of uid {os.geteuid()} only it may write")


def shared_python(prefix: Path, executable: Path, *, shared: Path = _SHARED) -> Path:
    """The host's staged copy (hard links, with compiled caches) of the installation at
    ``prefix``, built now under ``shared`` when there is none for this interpreter,
    ``site-packages`` and staging format yet. Raises ``OSError`` (hard links impossible, or the
    shared directory not safely ours)."""
    site = next(prefix.glob("lib/python3*/site-packages"), prefix)
    material = "\0".join(
        [_FORMAT, str(prefix), str(executable), str(executable.stat().st_mtime_ns),
         str(site.stat().st_mtime_ns)]
    )  # fmt: skip
    key = hashlib.sha256(material.encode()).hexdigest()[:20]
    shared.mkdir(mode=0o755, exist_ok=True)
    _private(shared)
    target = shared / key
    if target.exists():
        _private(target)
        return target
    lock = os.open(shared / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another server built it while this one waited
            _private(target)
            return target
        building = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=shared))
        try:
            stage_python(prefix, executable, building, copy=False)
            note = stage_caches(prefix, executable, building)
            (building / CACHES_NOTE).write_text(json.dumps(note) + "\n")
            (building / CACHES_NOTE).chmod(0o644)
            building.chmod(0o755)
            os.rename(building, target)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    finally:
        os.close(lock)
    return target


def stage_python(prefix: Path, executable: Path, into: Path, *, copy: bool = True) -> Path:
    """Stage the interpreter ``executable`` of the installation at ``prefix`` under ``into``
    (made afresh), laid out as ``prefix`` is, for a sandbox to bind back at ``prefix``: as hard
    links with ``site-packages``, or (``copy``) as copies of the standard library alone.
    Returns ``into``. Raises ``OSError``."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(mode=0o755, parents=True)
    relative = executable.relative_to(prefix)
    (into / relative.parent).mkdir(mode=0o755, parents=True, exist_ok=True)
    _link_or_copy(executable, into / relative, copy=copy)
    library = prefix / "lib"
    staged_library = into / "lib"
    staged_library.mkdir(mode=0o755, exist_ok=True)
    for entry in os.scandir(library):
        if entry.name.startswith("libpython") and entry.is_file() and not entry.is_symlink():
            _link_or_copy(Path(entry.path), staged_library / entry.name, copy=copy)
        elif entry.name.startswith("libpython") and entry.is_symlink():
            os.symlink(os.readlink(entry.path), staged_library / entry.name)
    for entry in os.scandir(library):
        if entry.name.startswith("python3") and entry.is_dir():
            _stage_tree(Path(entry.path), staged_library / entry.name, copy=copy)
    return into


# Run by the host's interpreter as root: a private mount namespace with the staged tree bound at
# the prefix, then the staged interpreter (now at the host's path) byte-compiles its library and
# runs pytest once on a trivial test, so pytest writes its rewritten plugin modules there too.
_CACHES_SCRIPT = r"""
import ctypes, json, os, subprocess, sys
building, prefix, python, work = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
check(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")
check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None), "making / private")
check(libc.mount(building.encode(), prefix.encode(), None, 0x1000 | 0x4000, None), "bind")
os.umask(0o022)
env = {"PATH": "/usr/bin:/bin", "HOME": work, "LC_ALL": "C.UTF-8"}
lib = os.path.join(prefix, "lib")
libraries = [os.path.join(lib, n) for n in sorted(os.listdir(lib)) if n.startswith("python3")]
def run(*argv):
    done = subprocess.run([python, "-s", "-E", *argv], cwd=work, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr)[-400:]
compiled, _ = run("-m", "compileall", "-q", *[d for d in libraries if os.path.isdir(d)])
note = {"compileall_exit": compiled, "pytest_exit": None, "pytest_tail": ""}
if run("-c", "import pytest")[0] == 0:
    with open(os.path.join(work, "test_staged.py"), "w") as test:
        test.write("def test_staged():\n    assert True\n")
    note["pytest_exit"], note["pytest_tail"] = run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_staged.py")
print(json.dumps(note))
"""


def stage_caches(prefix: Path, executable: Path, building: Path) -> dict[str, object]:
    """Write into ``building`` (a staging of ``prefix``, not yet in use) the compiled caches a
    sandbox cannot write there itself: the plain ``.pyc`` the host lacks and pytest's rewritten
    plugin modules, made by the staged interpreter as root with ``building`` mounted at
    ``prefix`` in a private mount namespace (nothing else is written, and the code names the
    paths a slot sees). Returns what it did: ``compileall_exit``, ``pytest_exit`` (``None``
    where that Python has no pytest), ``pytest_rewritten`` (how many rewritten modules the
    staging holds), and ``error`` (why no caches were made, else ``None``); a failure is also
    logged as a warning, and the staging stays usable without the caches."""
    work = Path(tempfile.mkdtemp(prefix=".caches-", dir=building.parent))
    note: dict[str, object] = {"format": _FORMAT, "error": None}
    try:
        done = subprocess.run(
            [str(executable), "-I", "-c", _CACHES_SCRIPT,
             str(building), str(prefix), str(executable), str(work)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=_CACHES_TIMEOUT_S, check=False, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            note["error"] = f"exit {done.returncode}: {done.stderr.strip()[-400:]}"
        else:
            note.update(json.loads(lines[-1]))
    except (OSError, subprocess.TimeoutExpired, ValueError) as error:
        note["error"] = str(error)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    note["pytest_rewritten"] = sum(1 for _ in building.rglob("*-pytest-*.pyc"))
    if note["error"] is not None or note.get("pytest_exit") not in (None, 0):
        why = note["error"] or f"pytest exited {note['pytest_exit']}: {note['pytest_tail']}"
        _log.warning(
            "the staged Python at %s has no complete compiled caches (every slot recompiles "
            "what is missing on each run): %s",
            building, why,
        )  # fmt: skip
    return note


def stage_file(source: Path, into: Path) -> Path:
    """A root-owned copy of ``source`` at ``into`` (mode 0755), replaced atomically. Returns
    ``into``. Raises ``OSError``."""
    temporary = into.with_name(f".{into.name}.tmp")
    shutil.copyfile(source, temporary)
    os.chmod(temporary, 0o755)  # noqa: S103 - a program every slot uid runs
    os.replace(temporary, into)
    return into
