"""Finding the compiled slot helper (``slot_helper.c``: keeper and lease agent): the one shipped
in the wheel first, else one built with the host's C compiler, once.

A slot server that may use the compiled helper calls ``build_slot_helper()`` at start. A wheel
(or the slot-server image) built where a compiler was present ships the binary, compiled by the
build hook (``hatch_build.py``, which calls ``compile_slot_helper`` with the flags below), as
``_native/slot-helper`` next to this module, with the SHA-256 of the source it was built from in
``_native/slot-helper.sha256``. It is used when it matches this source, is executable, and
belongs to this user or to root and is writable by no one else; otherwise the reason is kept and
the run-time build below is the fallback (a source checkout never has a shipped binary). When the
fallback fails too, the error names both reasons, and health's detail carries them.

The run-time build is cached per user, under a name derived from the source, the compiler and the
flags, so a machine builds each version once and every later server start finds it. Builds race
safely: each writes a private temporary file and renames it into place, under a lock.

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
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "SHIPPED_SLOT_HELPER",
    "SLOT_HELPER_SOURCE",
    "NativeBuildError",
    "build_slot_helper",
    "cache_dir",
    "compile_slot_helper",
    "shipped_slot_helper",
]

SLOT_HELPER_SOURCE = Path(__file__).with_name("slot_helper.c")
SHIPPED_SLOT_HELPER = Path(__file__).with_name("_native") / "slot-helper"
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


def shipped_slot_helper(path: Path = SHIPPED_SLOT_HELPER) -> Path:
    """The slot helper shipped with this install, checked (see the module docstring). Raises
    ``NativeBuildError`` saying why it cannot be used (none shipped, built from another source,
    not executable, replaceable by others)."""
    digest = path.with_name("slot-helper.sha256")
    if not path.exists():
        raise NativeBuildError(f"no compiled helper ships with this install ({path} is absent)")
    try:
        recorded = digest.read_text().strip()
        info = path.stat()
    except OSError as error:
        raise NativeBuildError(f"the shipped helper {path} is unreadable: {error}") from None
    expected = hashlib.sha256(SLOT_HELPER_SOURCE.read_bytes()).hexdigest()
    if recorded != expected:
        raise NativeBuildError(f"the shipped helper {path} was built from another slot_helper.c")
    if info.st_uid not in (0, os.getuid()):
        raise NativeBuildError(f"the shipped helper {path} belongs to uid {info.st_uid}")
    if info.st_mode & 0o022:
        raise NativeBuildError(
            f"the shipped helper {path} is writable by others (mode {info.st_mode & 0o777:o})"
        )
    if not os.access(path, os.X_OK):
        raise NativeBuildError(f"the shipped helper {path} is not executable")
    return path


def build_slot_helper(directory: Path | None = None) -> Path:
    """The path of an executable slot helper for this source: the shipped one when it is
    usable, else one built now into the cache (or found there). With ``directory`` the shipped
    binary is not looked at: the helper is built into, or found in, that directory. Blocks (run
    it in a thread from async code). Raises ``NativeBuildError`` with the reasons when neither
    can be had (no shipped binary and no compiler, or the build fails)."""
    if directory is not None:
        return _cached_build(directory)
    try:
        return shipped_slot_helper()
    except NativeBuildError as unshipped:
        try:
            return _cached_build(None)
        except NativeBuildError as unbuilt:
            raise NativeBuildError(
                f"{unshipped}; and the run-time build failed: {unbuilt}"
            ) from None


def compile_slot_helper(target: Path, *, compiler: Sequence[str] | None = None) -> Path:
    """Compile ``slot_helper.c`` to ``target`` with this module's flags (statically when the C
    library allows it) and write the source's SHA-256 next to it as ``slot-helper.sha256``:
    what the wheel's build hook ships. Returns ``target``; raises ``NativeBuildError`` when
    there is no compiler or the build fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    built = _compile(list(compiler) if compiler else _compiler(), target.parent, target)
    digest = hashlib.sha256(SLOT_HELPER_SOURCE.read_bytes()).hexdigest()
    target.with_name("slot-helper.sha256").write_text(digest + "\n")
    return built


def _cached_build(directory: Path | None) -> Path:
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
