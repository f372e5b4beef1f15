"""Removing a tree that a lease left behind, whatever its shape, within a deadline.

A lease may leave anything in its workspace: a directory chain thousands of levels deep, a
million entries in one directory, modes that forbid reading or writing, symlinks (to anywhere),
FIFOs, sockets, hard links, names that are not UTF-8, files some process still holds open. The
removal here keeps these rules:

- **No recursion, few descriptors.** The walk is a loop over an explicit stack of directory
  descriptors, at most ``MAX_HELD`` deep. Below that depth a non-empty directory is not entered:
  its subdirectories are moved up into the deepest held directory under fresh names (a rename
  inside one file system, which never follows a symlink) and it is removed; the moved ones are
  then taken in turn. So a chain of any depth costs one rename per level and the process never
  holds more than ``MAX_HELD`` descriptors or Python frames.
- **Descriptors, never paths.** Every entry is named relative to a descriptor of its directory,
  opened with ``O_NOFOLLOW | O_DIRECTORY``; a symlink is unlinked, never followed.
- **Modes are no obstacle.** A directory the remover may not read or change is given mode 0700
  through its own descriptor first (a server that is not root shares its uid with its slots).
- **Bounded in time.** The caller gives a deadline on the monotonic clock; past it the removal
  stops with ``TimeoutError`` (an ``OSError``), leaving what it did not reach.
- **Every failure is an ``OSError``.** An entry that could not be removed ends the removal with
  ``OSError(ENOTEMPTY)`` naming the first few that are left, so the caller has exactly two cases:
  the tree is gone, or it is not and the caller knows why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

__all__ = ["MAX_HELD", "empty_directory", "remove_tree"]

MAX_HELD = 64
"""Directory descriptors one removal holds at most (the depth it enters before moving up)."""
_CHECK_EVERY = 256  # entries between two looks at the clock
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@attrs.define
class _Level:
    """One held directory: its descriptor, the name it has in its parent, and its non-empty
    subdirectories still to take."""

    fd: int
    name: str
    pending: list[str] | None = None


@attrs.define
class _Removal:
    deadline: float | None
    clock: Callable[[], float]
    steps: int = 0
    fresh: int = 0
    last_error: OSError | None = None

    def tick(self) -> None:
        self.steps += 1
        if self.deadline is None or self.steps % _CHECK_EVERY:
            return
        if self.clock() > self.deadline:
            raise TimeoutError(errno.ETIMEDOUT, "the removal ran past its deadline")

    def scan(self, fd: int) -> list[str]:
        """Remove every entry of ``fd`` that goes at once (files, links, empty directories);
        returns the names of the non-empty directories left."""
        full: list[str] = []
        _make_searchable(fd)
        with os.scandir(fd) as entries:
            for entry in entries:
                self.tick()
                name = entry.name
                with self.kept_going():
                    if entry.is_dir(follow_symlinks=False):
                        if not _try_rmdir(name, fd):
                            full.append(name)
                    else:
                        os.unlink(name, dir_fd=fd)
        return full

    def lift(self, into: _Level, name: str) -> None:
        """Empty ``name`` (a directory in ``into``) without entering it further: its files go,
        its non-empty subdirectories move up into ``into`` (and onto its pending list), and then
        it goes itself."""
        child = _open_dir(name, into.fd)
        if child is None:
            return
        try:
            for sub in self.scan(child):
                self.tick()
                moved = self.move_up(child, sub, into.fd)
                if moved is not None:
                    assert into.pending is not None
                    into.pending.append(moved)
        finally:
            os.close(child)
        self.rmdir(name, into.fd)

    def move_up(self, child: int, name: str, parent: int) -> str | None:
        """Rename ``child/name`` to a fresh name in ``parent``; the new name, or ``None``."""
        for _ in range(100):
            self.fresh += 1
            target = f".trajcore-removal-{self.fresh}"
            try:
                os.rename(name, target, src_dir_fd=child, dst_dir_fd=parent)
            except FileNotFoundError:
                return None  # it went while we looked
            except OSError as error:
                # the lease made an entry of that name: try the next one
                if error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    continue
                self.last_error = error
                return None
            return target
        self.last_error = OSError(errno.EEXIST, "no fresh name to move a directory to")
        return None

    def rmdir(self, name: str, parent: int) -> None:
        with self.kept_going():
            os.rmdir(name, dir_fd=parent)

    @contextlib.contextmanager
    def kept_going(self) -> Iterator[None]:
        """Run one removal step: an entry already gone is no failure, any other ``OSError`` is
        kept as ``last_error`` and the removal goes on."""
        try:
            yield
        except FileNotFoundError:
            pass
        except OSError as error:
            self.last_error = error


def _try_rmdir(name: str, fd: int) -> bool:
    """Remove the directory ``name`` if it is empty; ``False`` when it is not."""
    try:
        os.rmdir(name, dir_fd=fd)
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


def _open_dir(name: str, parent: int) -> int | None:
    """``name`` in ``parent`` opened as a directory (never through a symlink), made searchable
    when its mode forbade it; ``None`` when it is gone or no longer a directory."""
    try:
        return os.open(name, _OPEN_DIR, dir_fd=parent)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except PermissionError:
        pass
    # Mode 0 (or similar) on a directory of the server's own uid: open it for its path only,
    # give it 0700 through that descriptor, then open it for reading.
    path_fd = os.open(
        name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
    )
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        return os.open(f"/proc/self/fd/{path_fd}", _OPEN_DIR)
    finally:
        os.close(path_fd)


def _make_searchable(fd: int) -> None:
    """Give the directory at ``fd`` mode 0700 when the server cannot list and change it (root
    can always; another server only what its own uid owns)."""
    if os.geteuid() == 0:
        return
    mode = os.fstat(fd).st_mode
    if stat.S_IMODE(mode) & 0o700 != 0o700:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o700)


def empty_directory(
    fd: int, *, deadline: float | None = None, clock: Callable[[], float] = time.monotonic
) -> None:
    """Remove everything inside the directory open at ``fd``; the directory itself stays.

    ``deadline`` is a time on ``clock`` (the monotonic clock by default).

    Raises:
        TimeoutError: the deadline passed first (what was not reached is still there).
        OSError: something could not be removed; the message names what is left.
    """
    removal = _Removal(deadline=deadline, clock=clock)
    for _ in range(3):  # an entry that changed kind while the walk passed is taken again
        _remove_beneath(removal, fd)
        left = os.listdir(fd)
        if not left:
            return
    why = f" (last error: {removal.last_error})" if removal.last_error is not None else ""
    shown = [os.fsencode(name).decode("utf-8", "backslashreplace") for name in left[:5]]
    raise OSError(errno.ENOTEMPTY, f"still holds {shown}{why}")


def _remove_beneath(removal: _Removal, fd: int) -> None:
    levels = [_Level(fd=fd, name="")]
    try:
        while levels:
            level = levels[-1]
            if level.pending is None:
                level.pending = removal.scan(level.fd)
            if level.pending:
                name = level.pending.pop()
                removal.tick()
                if len(levels) < MAX_HELD:
                    child = _open_dir(name, level.fd)
                    if child is not None:
                        levels.append(_Level(fd=child, name=name))
                else:
                    removal.lift(level, name)
                continue
            levels.pop()
            if levels:
                os.close(level.fd)
                removal.rmdir(level.name, levels[-1].fd)
    finally:
        for level in levels[1:]:
            os.close(level.fd)


def remove_tree(path: Path, *, timeout_s: float | None = None) -> None:
    """Remove ``path`` and everything under it, never following a symlink inside it. A missing
    ``path`` is no error; a symlink or file at ``path`` is unlinked.

    Raises:
        TimeoutError: ``timeout_s`` passed first.
        OSError: something could not be removed.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_dir(path.name, parent)
        if fd is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=parent)
            return
        try:
            empty_directory(fd, deadline=deadline)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)
