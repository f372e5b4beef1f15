"""Building the compiled slot helper (``slot_helper.c``: keeper and lease agent) with the host's
C compiler, once.

A slot server that may use the compiled helper calls ``build_slot_helper()`` at start. The binary
is cached per user, under a name derived from the source, the compiler and the flags, so a
machine builds each version once (about 0.3 s) and every later server start finds it. Builds
race safely: each writes a private temporary file and renames it into place, under a lock.

Where the cache lives: ``$TRAJCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/trajcore``, else
``~/.cache/trajcore``; it must belong to the user and be writable by no one else (the helper
runs as every slot's keeper), and so must a cached binary, or it is not used. The compiler:
``$CC``, else ``cc``, ``gcc`` or ``clang`` from ``PATH``. The helper is linked statically when
the C library allows it (one less thing for a sandbox to bind, and a faster start), dynamically
otherwise.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SLOT_HELPER_SOURCE", "NativeBuildError", "build_slot_helper", "cache_dir"]

SLOT_HELPER_SOURCE = Path(__file__).with_name("slot_helper.c")
_FLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror")
_LINKS = (("-static",), ())
_BUILD_TIMEOUT_S = 120.0


class NativeBuildError(Exception):
    """The compiled slot helper cannot be had on this host; the message says why."""


def cache_dir() -> Path:
    """Where built helpers are kept (see the module docstring). Raises ``NativeBuildError``
    when none can be named (no ``$HOME`` and neither variable set)."""
    explicit = os.environ.get("TRAJCORE_CACHE_DIR")
    if explicit:
        return Path(explicit).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "trajcore"
    try:
        home = Path.home()
    except RuntimeError:
        home = Path()
    if not home.is_absolute():
        raise NativeBuildError("no cache directory: set TRAJCORE_CACHE_DIR (no home directory)")
    return home / ".cache" / "trajcore"


def _check_private(path: Path) -> None:
    """Refuse a cache directory or binary that someone else could have replaced: it must be
    this user's and writable by no one else (the binary runs as the slot's keeper)."""
    info = path.stat()
    if info.st_uid != os.getuid():
        raise NativeBuildError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o022:
        raise NativeBuildError(f"{path} is writable by others (mode {info.st_mode & 0o777:o})")


def _compiler() -> list[str]:
    named = os.environ.get("CC")
    if named:
        words = shlex.split(named)
        found = shutil.which(words[0]) if words else None
        if found is None:
            raise NativeBuildError(f"CC={named!r} names no executable compiler")
        return [found, *words[1:]]
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found is not None:
            return [found]
    raise NativeBuildError("no C compiler found (set CC, or install cc, gcc or clang)")


def build_slot_helper(directory: Path | None = None) -> Path:
    """The path of a built, executable slot helper for this source; built now when it is not
    cached yet. Blocks (run it in a thread from async code). Raises ``NativeBuildError`` with
    the reason when there is no compiler or the build fails."""
    source = SLOT_HELPER_SOURCE.read_bytes()
    compiler = _compiler()
    key = hashlib.sha256(
        b"\0".join([source, *(word.encode() for word in compiler), *(f.encode() for f in _FLAGS)])
    ).hexdigest()[:20]
    folder = directory if directory is not None else cache_dir()
    target = folder / f"slot-helper-{key}"
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        _check_private(folder)
        if os.access(target, os.X_OK):
            _check_private(target)
            return target
        lock = os.open(folder / f".slot-helper-{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        raise NativeBuildError(f"cannot use the cache directory {folder}: {error}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(target, os.X_OK):  # another process built it while this one waited
            _check_private(target)
            return target
        return _compile(compiler, folder, target)
    finally:
        os.close(lock)


def _compile(compiler: list[str], folder: Path, target: Path) -> Path:
    failures: list[str] = []
    for link in _LINKS:
        handle, temporary = tempfile.mkstemp(prefix=".slot-helper-", dir=folder)
        os.close(handle)
        argv = [*compiler, *_FLAGS, *link, "-o", temporary, str(SLOT_HELPER_SOURCE)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            os.unlink(temporary)
            raise NativeBuildError(f"{compiler[0]} did not run: {error}") from None
        if done.returncode == 0:
            os.chmod(temporary, 0o755)  # noqa: S103 - a program, readable and runnable by all
            os.replace(temporary, target)
            return target
        os.unlink(temporary)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        failures.append(f"{' '.join(link) or 'dynamic'}: {last}")
    raise NativeBuildError(f"{compiler[0]} failed to build the slot helper ({'; '.join(failures)})")
