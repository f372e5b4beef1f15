"""Host-wide reservations of slot uid ranges.

A slot server run as root runs slot ``i`` as host uid ``slot_uid_base + i``. Two slot servers on
one host whose ranges overlap (two envs side by side, two env processes of one env, two Nomad
jobs on one node) would run slots of both as the same uid: ``RLIMIT_NPROC`` would count the
processes of both (a fork loop in one starves the other's commands), and so would everything
else the kernel keys on a uid. Nothing else on the host would notice.

So every range in use is reserved in one file per host (``lock_file()``:
``/run/trajcore/slot-uids``, or ``$TRAJCORE_SLOT_UID_LOCK``): byte ``u`` of the file stands for uid
``u`` (the file stays empty; a lock may lie past its end), and a range is held as an
open-file-description write lock over its bytes (``F_OFD_SETLK``). The kernel refuses a second
lock over any byte already held, by another process or by another open of this one (two pools
in one env process), and drops a lock when its file is closed, however its process ends: a
crash leaves nothing to clean up.

Who holds what: a slot server run as root holds its own range from its start to its end; a
pool that starts its servers on this host (the local and container pools) holds the range of
all of them for the pool's life, before any server starts, and tells its servers not to
(``--slot-uid-lock none``), so that a server's restart never races another pool for its uids.
The local pool's servers inherit the reservation's descriptor: the lock, their shared open
file description's, stays held while any of them runs, should the env process die first.
A range another holder has moves to the next free one of its size (``reserve_free``), and the
holder says so in a warning naming the setting; a moved range must still be mapped (a server
in a user namespace checks its range against the namespace's map at start).

The file is created ``0600`` in a folder only its owner may change (``/run/trajcore`` is made
``0755`` when missing); a file or folder that belongs to another user, or that others may
open or replace, is refused: a stranger holding read locks over a range could keep every
server off it, and one who could replace the file could let two servers hold one range.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
from pathlib import Path

import attrs

__all__ = [
    "DEFAULT_LOCK_FILE",
    "LOCK_FILE_ENV",
    "SlotUidLockError",
    "SlotUidReservation",
    "SlotUidsHeld",
    "free_base",
    "lock_file",
    "reserve",
    "reserve_free",
]

DEFAULT_LOCK_FILE = Path("/run/trajcore/slot-uids")
LOCK_FILE_ENV = "TRAJCORE_SLOT_UID_LOCK"
_SEARCH = 4096
"""How many ranges past a held one ``free_base`` tries before it gives up."""
_TRIES = 3
"""How often ``reserve_free`` looks again when another holder took the free range it found."""


class SlotUidLockError(Exception):
    """The lock file cannot be used (missing folder, another user's file, ...); says why."""


class SlotUidsHeld(Exception):
    """Some uid of a range is held already by another slot server or pool on this host."""

    def __init__(self, first: int, count: int, holder: str) -> None:
        self.first = first
        self.count = count
        super().__init__(
            f"host uids {first}-{first + count - 1} are in use by another slot server or pool "
            f"on this host ({holder})"
        )


class _Flock(ctypes.Structure):
    """``struct flock`` (Linux): ``off_t`` is a ``long`` on the 64-bit hosts slot servers run."""

    _fields_ = (
        ("l_type", ctypes.c_short),
        ("l_whence", ctypes.c_short),
        ("l_start", ctypes.c_long),
        ("l_len", ctypes.c_long),
        ("l_pid", ctypes.c_int),
    )


def lock_file() -> Path:
    """The host's reservation file: ``$TRAJCORE_SLOT_UID_LOCK`` when set, else the default."""
    named = os.environ.get(LOCK_FILE_ENV, "").strip()
    return Path(named) if named else DEFAULT_LOCK_FILE


@attrs.define(eq=False)
class SlotUidReservation:
    """Uids ``first`` to ``first + count - 1`` held until ``release`` (or this process ends)."""

    first: int
    count: int
    path: Path
    _fd: int | None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        """The reservation file's descriptor: a child process given it (``pass_fds``) keeps the
        range held while it has it open, the lock being its open file description's.

        Raises:
            ValueError: Released.
        """
        if self._fd is None:
            raise ValueError("the reservation was released")
        return self._fd

    def release(self) -> None:
        """Give the range back (closing the file drops its lock); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:  # a holder dropped unreleased (a start that failed after it)
        self.release()


def _open(path: Path) -> int:
    """The reservation file, opened for writing (a write lock needs it); raises
    ``SlotUidLockError`` naming the path and why it cannot serve."""
    folder = path.parent
    try:
        folder.mkdir(mode=0o755, exist_ok=True)
        info = folder.lstat()
    except OSError as error:
        raise SlotUidLockError(f"cannot make {folder}: {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or _strangers_may_change(info):
        raise SlotUidLockError(f"cannot use {folder}: {_whose(info)}")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        raise SlotUidLockError(f"cannot open {path}: {error.strerror}") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "it is not a regular file"
    elif info.st_uid not in (os.geteuid(), 0):
        problem = f"it belongs to uid {info.st_uid}"
    elif info.st_mode & 0o077:
        problem = f"others may open it (mode {stat.S_IMODE(info.st_mode):o}, want 600)"
    if problem is not None:
        os.close(fd)
        raise SlotUidLockError(f"cannot use {path}: {problem}; remove it")
    return fd


def _strangers_may_change(folder: os.stat_result) -> bool:
    """Whether someone but its owner (this user or root) may replace entries of ``folder``
    (a sticky folder lets them replace their own entries only)."""
    if folder.st_uid not in (os.geteuid(), 0):
        return True
    return bool(folder.st_mode & 0o022) and not folder.st_mode & stat.S_ISVTX


def _whose(folder: os.stat_result) -> str:
    if not stat.S_ISDIR(folder.st_mode):
        return "it is not a folder"
    mode = stat.S_IMODE(folder.st_mode)
    return f"others may replace what it holds (owner uid {folder.st_uid}, mode {mode:o})"


def _lock(fd: int, command: int, kind: int, first: int, count: int) -> _Flock:
    if ctypes.sizeof(ctypes.c_long) != 8:  # an off_t of 8 bytes
        raise SlotUidLockError("slot uid reservations need a 64-bit host (an off_t of 8 bytes)")
    request = _Flock(l_type=kind, l_whence=os.SEEK_SET, l_start=first, l_len=count, l_pid=0)
    answer = fcntl.fcntl(fd, command, bytes(request))
    return _Flock.from_buffer_copy(answer)


def reserve(
    first: int, count: int, *, path: Path | None = None, shared: bool = False
) -> SlotUidReservation:
    """Hold uids ``first`` to ``first + count - 1`` on this host; ``shared``: as a read lock,
    which other read locks over them may share and which any write lock over them is refused
    (and the other way round): for holders that only need no writer there.

    Raises:
        SlotUidsHeld: Another holder has some of them.
        SlotUidLockError: The reservation file cannot be used (says why).
    """
    where = lock_file() if path is None else path
    fd = _open(where)
    try:
        _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK if shared else fcntl.F_WRLCK, first, count)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EACCES):  # a conflicting lock
            raise SlotUidsHeld(first, count, f"a lock over them in {where}") from None
        raise SlotUidLockError(f"cannot lock {where}: {error.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return SlotUidReservation(first=first, count=count, path=where, fd=fd)


def free_base(first: int, count: int, *, limit: int, path: Path | None = None) -> int:
    """The lowest ``first + k * count`` (``k >= 0``) whose ``count`` uids no one holds now and
    that ends at or below ``limit``; holds nothing (``reserve`` it, which may still lose a race).

    Raises:
        SlotUidsHeld: No such range within ``_SEARCH`` tries (the first range named).
        SlotUidLockError: The reservation file cannot be used.
    """
    where = lock_file() if path is None else path
    fd = _open(where)
    try:
        for k in range(_SEARCH):
            base = first + k * count
            if base + count - 1 > limit:
                break
            seen = _lock(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, base, count)
            if seen.l_type == fcntl.F_UNLCK:
                return base
    finally:
        os.close(fd)
    raise SlotUidsHeld(first, count, f"and no free range of {count} after them up to {limit}")


def reserve_free(
    first: int, count: int, *, limit: int, path: Path | None = None
) -> SlotUidReservation:
    """Hold ``count`` uids from ``first``, or, when another holder has some of them, the next
    free range of ``count`` (``free_base``); the reservation's ``first`` says which.

    Raises:
        SlotUidsHeld: No free range up to ``limit`` (or each one found was taken before it
            could be held, ``_TRIES`` times).
        SlotUidLockError: The reservation file cannot be used.
    """
    base = first
    for _ in range(_TRIES):
        try:
            return reserve(base, count, path=path)
        except SlotUidsHeld:
            base = free_base(first, count, limit=limit, path=path)
    return reserve(base, count, path=path)
