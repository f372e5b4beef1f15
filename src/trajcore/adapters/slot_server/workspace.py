"""A slot's workspace on the host: file tools and artifacts confined to it, and its wipe.

``read_file``, ``write_file`` and the artifact endpoints run in the slot server itself, on the
host side of the workspace bind, while the slot's commands change the same tree at the same
time. So every operation here keeps these rules:

- **Paths.** A path is relative to the workspace. An absolute path, a ``..`` component, an empty
  path or a NUL byte is refused outright (``ToolArgumentError`` on field ``path``), before
  anything is opened (``slot_protocol.workspace_path_problem``).
- **Descriptors, never host paths.** The workspace root is opened once per operation; everything
  after that is opened relative to a descriptor already held. A path is resolved beneath the root
  with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`` where the kernel has it (Linux 5.6),
  else by a walk that opens one component at a time with ``O_NOFOLLOW`` and reads each symlink
  it meets itself. Either way a symlink inside the workspace is followed only while it stays
  inside (a relative target); one that leads out (an absolute target, or more ``..`` than depth)
  is refused (``RefusedFile``), and a swap between a check and an open cannot escape because
  there is no check apart from the open.
- **Regular files only.** Files are opened with ``O_NONBLOCK``, and the descriptor is ``fstat``-ed
  before a byte moves: a FIFO, socket or device is refused (``RefusedFile`` naming the path
  and the kind) without blocking. A directory where a file was expected is an ordinary
  ``IsADirectoryError``.
- **Bounded work.** A read reads at most ``max_bytes + 1`` bytes, whatever the file's size; its
  ``sha256`` is the digest of the returned ``data`` (of the whole file exactly when the read is not
  ``truncated``), and its ``size`` is the file's size from ``fstat``. A write over the cap is
  refused before anything is opened. Listings look at no more than ``MAX_SCANNED_ENTRIES``
  entries; archives hold at most ``max_files`` members and ``max_bytes`` of file data, visit at
  most ``MAX_SCANNED_ENTRIES`` entries and descend at most ``MAX_ARCHIVE_DEPTH`` directories.
- **Archives walk descriptors.** Each directory is opened with ``O_DIRECTORY | O_NOFOLLOW``
  relative to its parent's descriptor, each file with ``O_NOFOLLOW | O_NONBLOCK`` and checked with
  ``fstat``. Symlinks are stored as symlinks (their target text), never followed; FIFOs, sockets
  and devices are left out; an entry that changes kind or disappears during the walk is left out.
- **The slot's rights, not the server's.** With ``owner`` set and the server running as root,
  every operation but ``wipe`` runs with the owner's filesystem uid and gid (``setfsuid`` and
  ``setfsgid`` change only the calling thread, and supplementary groups are dropped for that
  thread with a raw ``setgroups``; all are restored before the method returns). Root's
  filesystem capabilities go with the fsuid, so the server can read and write in the workspace
  only what the slot itself can, and the files it creates belong to the slot. The runtime calls
  these methods through ``asyncio.to_thread``, so the switch happens in a worker thread.
  ``wipe`` runs with the server's rights and removes entries through descriptors, never
  following a symlink.

Ordinary failures (no such file, a directory where a file was expected, permission denied) are
``OSError``. Those and ``RefusedFile`` (a ``ToolArgumentError`` for what a well-formed path found:
a FIFO, socket or device, a symlink leading out or looping) are the tool's answer about the
file (``TOOL_ERROR``), not a refusal of the request, which only a malformed path is.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import os
import platform
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from trajcore.adapters.removal import empty_directory
from trajcore.domain.errors import ConfigError, ToolArgumentError
from trajcore.domain.slot_protocol import (
    ArtifactArchive,
    ArtifactFile,
    DirectoryEntry,
    DirectoryListing,
    EntryKind,
    workspace_path_problem,
)

__all__ = ["MAX_ARCHIVE_DEPTH", "MAX_SCANNED_ENTRIES", "RefusedFile", "Workspace"]

MAX_SCANNED_ENTRIES = 100_000
"""Directory entries one listing or one archive looks at, at most."""
MAX_ARCHIVE_DEPTH = 64
"""Directory levels an archive descends, at most (one descriptor is held per level)."""
_MAX_SYMLINKS = 40  # as the kernel's own limit for one path resolution
_READ_CHUNK = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
# openat2 is 437 and setgroups is 116 / 159 on the two architectures the project runs on.
_SYSCALLS: dict[str, tuple[int, int]] = {"x86_64": (437, 116), "aarch64": (437, 159)}
_NUMBERS = _SYSCALLS.get(platform.machine())
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


def _refuse(reason: str) -> ToolArgumentError:
    return ToolArgumentError("path", reason)


class RefusedFile(ToolArgumentError):
    """What the workspace holds at a well-formed ``path`` is nothing the file tools open: a
    FIFO, a socket or a device, or a symlink that leads out of the workspace or loops.

    The answer of the tool about that file (the slot's ``TOOL_ERROR``, as for a directory or a
    missing file), not a refusal of the request; a ``ToolArgumentError`` on field ``path`` for
    every other caller (the artifact endpoints answer it as they answer a refused path).

    Attributes:
        path: The path as it was asked (relative to the workspace).
        what: What was found there, as the rest of a sentence: ``"is a FIFO; only regular
            files are read or written"``, ``"leads out of the workspace through a symlink"``.
    """

    def __init__(self, path: str, what: str) -> None:
        super().__init__("path", f"{path!r} {what}")
        self.path = path
        self.what = what


_ONLY_REGULAR = "only regular files are read or written"
_LEADS_OUT = "leads out of the workspace through a symlink"
_LOOPS = "resolves through too many symlinks"


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symlink"),
)


def _kind_name(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _require_regular(path: str, mode: int) -> None:
    """Raises ``IsADirectoryError`` for a directory, ``RefusedFile`` for any other non-regular
    file."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    raise RefusedFile(path, f"is {_kind_name(mode)}; {_ONLY_REGULAR}")


# ----------------------------------------------------------------------------- openat2


class _Openat2:
    """``openat2`` beneath a directory descriptor, or ``None`` where the kernel lacks it."""

    def __init__(self) -> None:
        self.available = _NUMBERS is not None

    def __call__(self, dir_fd: int, path: str, flags: int, mode: int) -> int | None:
        if not self.available or _NUMBERS is None:
            return None
        # openat2 is strict: a mode without O_CREAT is EINVAL.
        mode = mode if flags & os.O_CREAT else 0
        how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        name = os.fsencode(path)
        for _ in range(8):  # EAGAIN: a rename raced the kernel's ".." check; try again
            fd = _libc.syscall(
                ctypes.c_long(_NUMBERS[0]),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(name),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
            if fd >= 0:
                return int(fd)
            code = ctypes.get_errno()
            if code == errno.ENOSYS:
                # Not in this kernel (or hidden by a seccomp filter): walk instead, from now on.
                self.available = False
                return None
            if code != errno.EAGAIN:
                raise OSError(code, os.strerror(code), path)
        return None


_openat2 = _Openat2()


def _open_beneath(root_fd: int, path: str, flags: int, *, create_dirs: bool = False) -> int:
    """Open ``path`` (checked relative) beneath ``root_fd``; see the module's rules.

    Raises:
        RefusedFile: the path leads out of the workspace through a symlink, or loops.
        OSError: the open failed (missing, a directory, permission).
    """
    try:
        fd = _openat2(root_fd, path, flags, 0o644)
    except OSError as error:
        if error.errno == errno.EXDEV:
            raise RefusedFile(path, _LEADS_OUT) from None
        if error.errno == errno.ELOOP:
            raise RefusedFile(path, _LOOPS) from None
        if not (create_dirs and error.errno == errno.ENOENT):
            raise
        bare = path.rstrip("/")
        if path.endswith("/") or bare.endswith("/."):  # a directory is named, and the walk that
            # creates the missing parents would drop the slash and make a file of it
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path) from None
        fd = None  # a parent is missing: the walk creates it
    if fd is not None:
        return fd
    return _walk_beneath(root_fd, path, flags, create_dirs=create_dirs)


def _walk_beneath(root_fd: int, path: str, flags: int, *, create_dirs: bool) -> int:
    """The portable ``_open_beneath``: one ``O_NOFOLLOW`` open per component, each relative to
    the descriptor of the directory before it; symlinks are read and resolved here, ``..`` in
    a target steps back along the descriptors held, never past the root."""
    held = [os.dup(root_fd)]
    pending = _components(path)
    links = 0
    made = 0  # directories created: bounded, so a lease removing them in a loop cannot spin us
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":  # only from a symlink's target
                if len(held) == 1:
                    raise RefusedFile(path, _LEADS_OUT)
                os.close(held.pop())
                continue
            last = not pending
            here = held[-1]
            try:
                if last:
                    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=here)
                fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here
                )
            except FileNotFoundError:
                made += 1
                if last or not create_dirs or made > _MAX_SYMLINKS + path.count("/") + 1:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=here)
                pending.insert(0, name)
                continue
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = _readlink(here, name)
                if target is None:
                    raise
                links += 1
                if links > _MAX_SYMLINKS:
                    raise RefusedFile(path, _LOOPS) from None
                if target.startswith("/"):
                    raise RefusedFile(path, _LEADS_OUT) from None
                pending[:0] = _components(target)
                continue
            held.append(fd)
        return os.open(".", flags | os.O_CLOEXEC, 0o644, dir_fd=held[-1])
    finally:
        for fd in held:
            os.close(fd)


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _readlink(dir_fd: int, name: str) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None


def _open_regular(
    root_fd: int, path: str, flags: int, *, create_dirs: bool = False
) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path`` (opened with ``O_NONBLOCK``, so a FIFO or a
    device cannot block the open) and its ``fstat``.

    Raises:
        RefusedFile: the path leads out, or is not a regular file nor a directory.
        OSError: the open failed; ``IsADirectoryError`` for a directory.
    """
    try:
        fd = _open_beneath(root_fd, path, flags | os.O_NONBLOCK, create_dirs=create_dirs)
    except OSError as error:
        if error.errno != errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
            raise
        kind = _kind_beneath(root_fd, path)
        raise RefusedFile(path, f"is {kind}; {_ONLY_REGULAR}") from None
    try:
        info = os.fstat(fd)
        _require_regular(path, info.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _kind_beneath(root_fd: int, path: str) -> str:
    """What ``path`` is, from an ``O_PATH`` descriptor (which opens nothing's content)."""
    try:
        fd = _open_beneath(root_fd, path, os.O_PATH)
    except (OSError, ToolArgumentError):
        return "not a regular file"
    try:
        return _kind_name(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- credentials


def _check_owner(
    _: object, attribute: attrs.Attribute[tuple[int, int] | None], value: tuple[int, int] | None
) -> None:
    given: object = value  # checked as what a caller may really pass
    if given is None:
        return
    if (
        not isinstance(given, tuple)
        or len(given) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in given)
    ):
        raise ConfigError(attribute.name, f"must be (uid, gid), two ids >= 0, got {value!r}")


@contextlib.contextmanager
def _as_owner(owner: tuple[int, int] | None) -> Iterator[None]:
    """Run the block with ``owner``'s filesystem rights in this thread (root only)."""
    if owner is None or os.geteuid() != 0 or owner == (0, 0):
        yield
        return
    uid, gid = owner
    groups = os.getgroups()
    if groups:
        _set_thread_groups(None)
    previous_gid = _libc.setfsgid(gid)
    previous_uid = _libc.setfsuid(uid)
    try:
        # setfsuid answers the previous id whether or not it changed it: ask again to be sure.
        if _libc.setfsuid(-1) != uid or _libc.setfsgid(-1) != gid:
            raise PermissionError(errno.EPERM, f"cannot take the filesystem ids {uid}:{gid}")
        yield
    finally:
        _libc.setfsuid(previous_uid)
        _libc.setfsgid(previous_gid)
        if groups:
            _set_thread_groups(groups)
        if _libc.setfsuid(-1) != previous_uid or _libc.setfsgid(-1) != previous_gid:
            # This thread would go on serving with the slot's ids: stop the server instead.
            os.write(2, b"trajcore: cannot restore the server's filesystem ids; stopping\n")
            os._exit(70)


def _set_thread_groups(groups: list[int] | None) -> None:
    """``setgroups`` for this thread only (glibc's wrapper changes every thread)."""
    if _NUMBERS is None:
        raise PermissionError(
            errno.EPERM,
            f"cannot drop supplementary groups for one thread on {platform.machine()}",
        )
    values = groups or []
    array = (ctypes.c_uint32 * max(1, len(values)))(*values)
    result = _libc.syscall(
        ctypes.c_long(_NUMBERS[1]), ctypes.c_size_t(len(values)), ctypes.byref(array)
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setgroups for this thread: {os.strerror(code)}")


# ----------------------------------------------------------------------------- the workspace


@attrs.define
class Workspace:
    """One slot's workspace directory on the host.

    Attributes:
        root: The directory (created if missing); bound read-write into the slot's sandbox.
        owner: ``(uid, gid)`` of the slot's sandbox user. When set and the server runs as root,
            the root directory is given to it, and every file operation but ``wipe`` runs with
            its filesystem rights. ``None``: operations run with the server's rights.
    """

    root: Path
    owner: tuple[int, int] | None = attrs.field(default=None, kw_only=True, validator=_check_owner)

    def __attrs_post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = Path(os.path.realpath(self.root))
        if self.owner is not None and os.geteuid() == 0:
            with self._root_fd() as fd:
                os.fchown(fd, *self.owner)

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        # Opened with the server's rights: the root's own path is the host's, not the slot's.
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _working(self) -> Iterator[int]:
        with self._root_fd() as fd, _as_owner(self.owner):
            yield fd

    def read(self, path: str, max_bytes: int) -> ArtifactFile:
        """The first ``max_bytes`` of a regular file, with its size.

        Reads at most ``max_bytes + 1`` bytes. ``sha256`` is the digest of ``data``, which is the
        whole file exactly when ``truncated`` is false; ``size`` is the file's size (``fstat``).

        Raises:
            RefusedFile: the path names a FIFO, socket or device, or a symlink leading out.
            ToolArgumentError: the path is malformed (absolute, ``..``, empty).
            OSError: the file cannot be read (missing, a directory, permission).
        """
        _checked(path)
        with self._working() as root_fd:
            fd, info = _open_regular(root_fd, path, os.O_RDONLY)
            try:
                data = _read_at_most(fd, max_bytes + 1)
            finally:
                os.close(fd)
        head = data[:max_bytes]
        return ArtifactFile(
            path=path,
            size=info.st_size,
            sha256=hashlib.sha256(head).hexdigest(),
            data=head,
            truncated=len(data) > max_bytes or info.st_size > len(head),
        )

    def write(self, path: str, data: bytes, *, append: bool, max_bytes: int) -> int:
        """Write (or append) ``data`` to a regular file, creating it and its parent directories.
        Returns the bytes written.

        Raises:
            RefusedFile: the path names a FIFO, socket or device, or a symlink leading out.
            ToolArgumentError: the path is malformed, or ``data`` is over ``max_bytes``.
            OSError: the file cannot be written.
        """
        if len(data) > max_bytes:
            raise ToolArgumentError(
                "content", f"{len(data)} bytes is over the {max_bytes}-byte limit for write_file"
            )
        _checked(path)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
        with self._working() as root_fd:
            fd, _ = _open_regular(root_fd, path, flags, create_dirs=True)
            try:
                if not append:  # only now: O_TRUNC would act before the file is checked
                    os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        return len(data)

    def listing(self, path: str, max_entries: int) -> DirectoryListing:
        """A directory's entries, sorted by name, at most ``max_entries``.

        At most ``MAX_SCANNED_ENTRIES`` entries are looked at: in a bigger directory the
        listing is ``truncated`` and sorted among those seen.

        Raises:
            ToolArgumentError: the path is refused.
            OSError: not a directory, or missing.
        """
        rel = _checked(path)
        with self._working() as root_fd:
            fd = _open_beneath(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY)
            try:
                names, cut = _scan(fd, MAX_SCANNED_ENTRIES)
                entries = []
                for name in sorted(names)[:max_entries]:
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed since the scan
                    entries.append(
                        DirectoryEntry(name=name, kind=_kind(info.st_mode), size=info.st_size)
                    )
            finally:
                os.close(fd)
        return DirectoryListing(
            path=path, entries=tuple(entries), truncated=cut or len(names) > max_entries
        )

    def archive(self, path: str, max_bytes: int, max_files: int) -> ArtifactArchive:
        """A tar.gz of a directory; members past ``max_files`` or file data past ``max_bytes``
        are left out (``truncated``). Symlinks are stored as symlinks and count as members.

        Raises:
            ToolArgumentError: the path is refused, or the compressed archive is over
                ``max_bytes``.
            OSError: not a directory, or missing.
        """
        rel = _checked(path)
        buffer = io.BytesIO()
        with self._working() as root_fd:
            base = _open_beneath(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY)
            walk = _ArchiveWalk(max_bytes=max_bytes, max_files=max_files)
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                walk.directory(tar, base, "", 0)
        data = buffer.getvalue()
        if len(data) > max_bytes:  # compressed headers can push a full budget over
            raise ToolArgumentError("max_bytes", f"the archive is {len(data)} bytes")
        return ArtifactArchive(
            path=path,
            data=data,
            sha256=hashlib.sha256(data).hexdigest(),
            files=walk.files,
            truncated=walk.truncated,
        )

    def wipe(self, *, timeout_s: float | None = None) -> None:
        """Remove everything in the workspace, through descriptors, never following symlinks,
        without recursion, whatever the tree's depth or width (``removal.empty_directory``).

        Runs with the server's rights (a slot may leave files it cannot remove itself).

        Raises:
            TimeoutError: ``timeout_s`` passed before the workspace was empty.
            OSError: something could not be removed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._root_fd() as fd:
            empty_directory(fd, deadline=deadline)


def _checked(path: str) -> str:
    """``path`` if it may be resolved beneath the root (``workspace_path_problem``).

    Raises:
        ToolArgumentError: it may not, whatever the workspace holds.
    """
    problem = workspace_path_problem(path)
    if problem is not None:
        raise _refuse(problem)
    return path


def _read_at_most(fd: int, limit: int) -> bytes:
    parts = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, _READ_CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _scan(fd: int, limit: int) -> tuple[list[str], bool]:
    """Up to ``limit`` names of the directory ``fd``, and whether there were more."""
    names: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if len(names) == limit:
                return names, True
            names.append(entry.name)
    return names, False


@attrs.define
class _ArchiveWalk:
    """One archive's walk: what it may still take, and what it took."""

    max_bytes: int
    max_files: int
    files: int = 0
    members: int = 0
    scanned: int = 0
    data_bytes: int = 0
    truncated: bool = False

    def directory(self, tar: tarfile.TarFile, fd: int, prefix: str, depth: int) -> None:
        """Archive the directory ``fd`` (closed here) under ``prefix``."""
        subdirs: list[str] = []
        try:
            with os.scandir(fd) as scan:
                found = []
                for entry in scan:
                    if self.scanned >= MAX_SCANNED_ENTRIES:
                        self.truncated = True
                        break
                    self.scanned += 1
                    found.append(entry)
            for entry in sorted(found, key=lambda e: e.name):
                try:
                    if entry.is_symlink():
                        self._symlink(tar, fd, entry.name, prefix)
                    elif entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    elif entry.is_file(follow_symlinks=False):
                        self._file(tar, fd, entry.name, prefix)
                except FileNotFoundError:
                    continue  # removed since the scan
            for name in subdirs:
                if depth + 1 >= MAX_ARCHIVE_DEPTH:
                    self.truncated = True
                    break
                # None: swapped for something else, or removed, since the scan
                sub = _open_unless(
                    fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    (errno.ELOOP, errno.ENOTDIR, errno.ENOENT),
                )  # fmt: skip
                if sub is None:
                    continue
                self.directory(tar, sub, f"{prefix}{name}/", depth + 1)
        finally:
            os.close(fd)

    def _symlink(self, tar: tarfile.TarFile, dir_fd: int, name: str, prefix: str) -> None:
        if self.members >= self.max_files:
            self.truncated = True
            return
        target = _readlink(dir_fd, name)
        if target is None:
            return  # no longer a symlink
        member = tarfile.TarInfo(prefix + name)
        member.type = tarfile.SYMTYPE
        member.linkname = target
        member.mode = 0o777
        tar.addfile(member)
        self.members += 1

    def _file(self, tar: tarfile.TarFile, dir_fd: int, name: str, prefix: str) -> None:
        if self.members >= self.max_files:
            self.truncated = True
            return
        # None: swapped for a symlink, a socket or a directory since the scan
        fd = _open_unless(
            dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            (errno.ELOOP, errno.ENXIO, errno.ENOENT, errno.EISDIR),
        )  # fmt: skip
        if fd is None:
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return
            if info.st_size > self.max_bytes - self.data_bytes:
                self.truncated = True
                return
            data = _read_at_most(fd, info.st_size)
        finally:
            os.close(fd)
        member = tarfile.TarInfo(prefix + name)
        member.size = len(data)
        member.mode = stat.S_IMODE(info.st_mode)
        member.mtime = int(info.st_mtime)
        member.uid, member.gid = info.st_uid, info.st_gid
        tar.addfile(member, io.BytesIO(data))
        self.files += 1
        self.members += 1
        self.data_bytes += len(data)


def _kind(mode: int) -> EntryKind:
    if stat.S_ISREG(mode):
        return EntryKind.FILE
    if stat.S_ISDIR(mode):
        return EntryKind.DIRECTORY
    if stat.S_ISLNK(mode):
        return EntryKind.SYMLINK
    return EntryKind.OTHER


def _open_unless(dir_fd: int, name: str, flags: int, vanished: tuple[int, ...]) -> int | None:
    """``name`` opened under ``dir_fd``, or ``None`` when opening fails with an errno of
    ``vanished`` (it changed since the scan). Raises ``OSError`` for any other failure."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in vanished:
            return None
        raise
