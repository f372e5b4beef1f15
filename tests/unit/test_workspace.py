"""The workspace's file tools against a lease's tricks: FIFOs, sockets, sparse giants, symlinks
swapped in mid-archive, and files the slot's user may not read.

Every trick is played from the host on a canary the test makes, and checked from the host
(``os.stat``, ``/proc/self/io``, the archive's bytes). Where a check could pass by not looking,
a control plays the same trick against naive code and shows the check catches it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import io
import os
import secrets
import socket
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from trajcore.adapters.slot_server import workspace as workspace_module
from trajcore.adapters.slot_server.workspace import RefusedFile, Workspace
from trajcore.domain.errors import ConfigError, ToolArgumentError
from trajcore.domain.slot_protocol import EntryKind

T = TypeVar("T")
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="switching filesystem ids needs root")
SLOT_UID = 54_321  # a uid no account on the machine uses
PROMPT_S = 5.0


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each path test runs with openat2 and with the component walk a kernel without it uses."""
    if request.param == "walk":
        monkeypatch.setattr(workspace_module._openat2, "available", False)
    elif not workspace_module._openat2.available:
        pytest.skip("this kernel or architecture has no openat2")
    return str(request.param)


@pytest.fixture
def ws(tmp_path: Path, resolver: str) -> Workspace:
    return Workspace(tmp_path / "ws")


def promptly(
    action: Callable[[], T], unblock: Callable[[], None], *, limit_s: float = PROMPT_S
) -> T:
    """``action()``'s answer, failing the test if it takes over ``limit_s`` (then ``unblock``
    frees the stuck thread so the run goes on)."""
    box: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            box.append(action())
        except BaseException as error:  # noqa: BLE001  # handed to the test thread, raised there
            failure.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        unblock()
        worker.join(PROMPT_S)
        pytest.fail(f"the operation blocked for over {limit_s} s")
    if failure:
        raise failure[0]
    return box[0]


def open_other_end(fifo: Path) -> Callable[[], None]:
    def unblock() -> None:
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # frees a reader or writer stuck in open
        threading.Timer(0.2, os.close, (fd,)).start()

    return unblock


# ----------------------------------------------------------------------------- basics


def test_write_read_list_and_archive_round_trip(ws: Workspace) -> None:
    assert ws.write("a/b/c.txt", b"hello", append=False, max_bytes=100) == 5
    ws.write("a/b/c.txt", b" world", append=True, max_bytes=100)
    found = ws.read("a/b/c.txt", 100)
    assert (found.data, found.size, found.truncated) == (b"hello world", 11, False)
    assert found.sha256 == hashlib.sha256(b"hello world").hexdigest()
    ws.write("a/b/c.txt", b"new", append=False, max_bytes=100)
    assert ws.read("a/b/c.txt", 100).data == b"new"
    listing = ws.listing("a/b", 10)
    assert [(e.name, e.kind, e.size) for e in listing.entries] == [("c.txt", EntryKind.FILE, 3)]
    archive = ws.archive(".", 1 << 20, 10)
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        assert tar.getnames() == ["a/b/c.txt"]
        member = tar.extractfile("a/b/c.txt")
        assert member is not None
        assert member.read() == b"new"
    assert archive.files == 1


def test_a_truncated_read_hashes_what_it_returns(ws: Workspace) -> None:
    ws.write("f", b"0123456789", append=False, max_bytes=100)
    found = ws.read("f", 4)
    assert (found.data, found.size, found.truncated) == (b"0123", 10, True)
    assert found.sha256 == hashlib.sha256(b"0123").hexdigest()


def test_bad_paths_are_refused_naming_the_field(ws: Workspace) -> None:
    for bad in ("", "/etc/passwd", "../x", "a/../../x", "a\0b"):
        with pytest.raises(ToolArgumentError) as caught:
            ws.read(bad, 10)
        assert caught.value.field == "path"


def test_symlinks_inside_are_followed_and_those_leading_out_refused(
    ws: Workspace, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    (ws.root / "d").mkdir()
    (ws.root / "d" / "f").write_text("inside")
    (ws.root / "inner").symlink_to("d")
    (ws.root / "file-link").symlink_to("d/f")
    (ws.root / "d" / "up").symlink_to("../d")
    (ws.root / "absolute").symlink_to(outside)
    (ws.root / "relative-out").symlink_to("../outside")
    (ws.root / "loop").symlink_to("loop")
    assert ws.read("inner/f", 10).data == b"inside"
    assert ws.read("file-link", 10).data == b"inside"
    assert ws.read("d/up/up/f", 10).data == b"inside"
    ws.write("inner/new", b"x", append=False, max_bytes=10)
    assert (ws.root / "d" / "new").read_bytes() == b"x"
    for escape in ("absolute/secret", "relative-out/secret"):
        with pytest.raises(ToolArgumentError, match="leads out of the workspace through a symlink"):
            ws.read(escape, 100)
        with pytest.raises(ToolArgumentError, match="symlink"):
            ws.write(escape, b"evil", append=False, max_bytes=100)
    with pytest.raises(ToolArgumentError, match="too many symlinks"):
        ws.read("loop", 10)
    assert (outside / "secret").read_text() == "host secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_ordinary_failures_are_os_errors(ws: Workspace) -> None:
    (ws.root / "dir").mkdir()
    with pytest.raises(FileNotFoundError):
        ws.read("missing", 10)
    with pytest.raises(IsADirectoryError):
        ws.read("dir", 10)
    with pytest.raises(IsADirectoryError):
        ws.read(".", 10)
    ws.write("plain", b"x", append=False, max_bytes=10)
    with pytest.raises(NotADirectoryError):
        ws.listing("plain", 10)
    with pytest.raises(NotADirectoryError):
        ws.archive("plain", 1 << 20, 10)


def test_a_write_over_the_cap_is_refused_before_anything_is_written(ws: Workspace) -> None:
    with pytest.raises(ToolArgumentError) as caught:
        ws.write("big", b"x" * 11, append=False, max_bytes=10)
    assert caught.value.field == "content"
    assert not (ws.root / "big").exists()


def test_owner_must_be_two_ids(tmp_path: Path) -> None:
    for bad in ((1,), (1, -2), (1, True), ("1", 2)):
        with pytest.raises(ConfigError) as caught:
            Workspace(tmp_path / "ws", owner=bad)  # type: ignore[arg-type]  # bad on purpose
        assert caught.value.field == "owner"


# ----------------------------------------------------------------------------- non-regular files


def test_reading_or_writing_a_fifo_is_refused_without_blocking(ws: Workspace) -> None:
    fifo = ws.root / "p"
    os.mkfifo(fifo)
    unblock = open_other_end(fifo)
    for action in (
        lambda: ws.read("p", 16),
        lambda: ws.write("p", b"x", append=False, max_bytes=16),
        lambda: ws.write("p", b"x", append=True, max_bytes=16),
    ):
        with pytest.raises(ToolArgumentError, match=r"'p' is a FIFO; only regular files"):
            promptly(action, unblock)
    # with a reader holding the other end, the open succeeds and fstat refuses the FIFO
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(ToolArgumentError, match="is a FIFO"):
            promptly(lambda: ws.write("p", b"x", append=False, max_bytes=16), unblock)
        assert os.read(reader, 16) == b""  # nothing was written to it
    finally:
        os.close(reader)


def test_what_a_well_formed_path_finds_is_told_from_a_malformed_path(ws: Workspace) -> None:
    """A FIFO, a symlink to a device, one leading out and one looping, at a well-formed path,
    are ``RefusedFile`` naming the path and what is there (the tool's answer about that file,
    which the slot server gives as ``TOOL_ERROR``); a malformed path is a plain
    ``ToolArgumentError`` (a refusal of the request, ``REJECTED``). Both were the same plain
    ``ToolArgumentError`` before, so the server could not tell them apart."""
    fifo = ws.root / "p"
    os.mkfifo(fifo)
    (ws.root / "null").symlink_to("/dev/null")
    (ws.root / "up").symlink_to("..")
    (ws.root / "loop").symlink_to("loop")
    leads_out = "leads out of the workspace through a symlink"
    for path, what in [
        ("p", "is a FIFO; only regular files are read or written"),
        ("null", leads_out),
        ("up/ws/p", leads_out),
        ("loop", "resolves through too many symlinks"),
    ]:
        for action in (
            functools.partial(ws.read, path, 16),
            functools.partial(ws.write, path, b"x", append=False, max_bytes=16),
        ):
            with pytest.raises(RefusedFile) as caught:
                promptly(action, open_other_end(fifo))
            found = caught.value
            assert (found.path, found.what, found.field) == (path, what, "path")
            assert found.reason == f"{path!r} {what}"
    for bad in ("", "/etc/passwd", "../x", "a/../../x", "a\0b", "\ud800"):
        with pytest.raises(ToolArgumentError) as refused:
            ws.read(bad, 10)
        assert not isinstance(refused.value, RefusedFile), bad


def test_a_fifo_opened_without_o_nonblock_blocks(tmp_path: Path) -> None:
    """Control: the deadline in ``promptly`` does catch an open that blocks on a FIFO."""
    fifo = tmp_path / "p"
    os.mkfifo(fifo)

    def naive_read() -> bytes:
        with fifo.open("rb") as stream:
            return stream.read(16)

    with pytest.raises(pytest.fail.Exception, match="blocked"):
        promptly(naive_read, open_other_end(fifo), limit_s=0.5)


def test_a_socket_is_refused(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ws.root)  # a relative bind: socket paths are short
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("sock")
        server.listen(1)
        for action in (
            lambda: ws.read("sock", 16),
            lambda: ws.write("sock", b"x", append=False, max_bytes=16),
        ):
            with pytest.raises(ToolArgumentError, match=r"'sock' is a socket"):
                promptly(action, lambda: None)


def read_chars() -> int:
    """Bytes this process has read through read-like syscalls so far (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar")


def test_a_capped_read_of_a_sparse_gigabyte_reads_only_the_cap(ws: Workspace) -> None:
    with (ws.root / "big").open("wb") as stream:
        stream.truncate(1 << 30)
    before = read_chars()
    found = ws.read("big", 16)
    spent = read_chars() - before
    assert (found.data, found.size, found.truncated) == (b"\0" * 16, 1 << 30, True)
    assert found.sha256 == hashlib.sha256(b"\0" * 16).hexdigest()
    assert spent < 64 << 10, f"read {spent} bytes for a 16-byte cap"


def test_the_read_meter_sees_a_whole_file_read(tmp_path: Path) -> None:
    """Control: hashing a whole 32 MiB sparse file, as the old read did, shows in ``rchar``."""
    sparse = tmp_path / "big"
    with sparse.open("wb") as stream:
        stream.truncate(32 << 20)
    before = read_chars()
    with sparse.open("rb") as stream:
        hashlib.file_digest(stream, "sha256")
    assert read_chars() - before >= 32 << 20


# ----------------------------------------------------------------------------- archives


def test_archives_store_symlinks_skip_fifos_and_keep_caps(ws: Workspace) -> None:
    (ws.root / "d").mkdir()
    (ws.root / "d" / "f").write_bytes(b"12345")
    (ws.root / "g").write_bytes(b"67890")
    (ws.root / "link").symlink_to("/etc")
    os.mkfifo(ws.root / "pipe")
    archive = promptly(lambda: ws.archive(".", 1 << 20, 10), open_other_end(ws.root / "pipe"))
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["d/f", "g", "link"]
    assert members["link"].issym()
    assert members["link"].linkname == "/etc"
    assert (archive.files, archive.truncated) == (2, False)
    few = ws.archive(".", 1 << 20, 2)  # a symlink counts as a member
    assert (few.files, few.truncated) == (1, True)
    (ws.root / "noise").write_bytes(os.urandom(1000))
    small = ws.archive(".", 800, 10)  # file data over the budget is left out
    assert (small.files, small.truncated) == (2, True)
    with pytest.raises(ToolArgumentError, match="symlink"):
        ws.archive("link", 1 << 20, 10)


def test_listing_and_archive_look_at_a_bounded_number_of_entries(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace_module, "MAX_SCANNED_ENTRIES", 5)
    for index in range(20):
        (ws.root / f"f{index:02}").write_bytes(b"x")
    listing = ws.listing(".", 100)
    assert (len(listing.entries), listing.truncated) == (5, True)
    archive = ws.archive(".", 1 << 20, 100)
    assert (archive.files, archive.truncated) == (5, True)
    monkeypatch.setattr(workspace_module, "MAX_ARCHIVE_DEPTH", 3)
    ws.write("a/b/c/d/e", b"deep", append=False, max_bytes=10)
    for index in range(20):
        (ws.root / f"f{index:02}").unlink()
    deep = ws.archive(".", 1 << 20, 100)
    with tarfile.open(fileobj=io.BytesIO(deep.data), mode="r:gz") as tar:
        assert tar.getnames() == []
    assert deep.truncated


_libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2


@contextlib.contextmanager
def exchanging(first: Path, second: Path) -> Iterator[list[int]]:
    """Swap two names with ``renameat2(RENAME_EXCHANGE)`` in a loop until the block ends;
    yields a one-item list counting the swaps."""
    stop = threading.Event()
    swaps = [0]

    def loop() -> None:
        a, b = os.fsencode(first), os.fsencode(second)
        while not stop.is_set():
            if _libc.renameat2(-100, a, -100, b, RENAME_EXCHANGE) != 0:
                raise OSError(ctypes.get_errno(), "renameat2 failed")
            swaps[0] += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        yield swaps
    finally:
        stop.set()
        worker.join(PROMPT_S)
        assert not worker.is_alive()


def race_setup(tmp_path: Path, ws: Workspace) -> tuple[str, Path, Path]:
    token = secrets.token_hex(16)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret").write_text(f"host canary {token}")
    tree = ws.root / "out"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "secret").write_text("an ordinary result")
    (tree / "l").symlink_to(canary)
    return token, tree / "d", tree / "l"


def naive_archive(base: Path) -> list[bytes]:
    """The old way: walk by path, then open each file by path."""
    found = []
    for folder, _dirs, names in os.walk(base, followlinks=False):
        for name in names:
            with contextlib.suppress(OSError):
                found.append((Path(folder) / name).read_bytes())
    return found


def archived_contents(data: bytes) -> list[bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out = []
        for member in tar.getmembers():
            stream = tar.extractfile(member) if member.isfile() else None
            if stream is not None:
                out.append(stream.read())
        return out


ROUNDS = 300


def test_a_directory_swapped_for_a_symlink_mid_archive_never_escapes(
    ws: Workspace, tmp_path: Path
) -> None:
    token, directory, link = race_setup(tmp_path, ws)
    names: set[str] = set()
    with exchanging(directory, link):
        for _ in range(ROUNDS):
            archive = ws.archive("out", 1 << 20, 100)
            for content in archived_contents(archive.data):
                assert token.encode() not in content, "the archive followed the swapped symlink"
            with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
                names.update(m.name for m in tar.getmembers() if m.isfile())
    # the walk saw the directory under both names: the swaps raced it
    assert names == {"d/secret", "l/secret"}


def test_a_path_walk_under_the_same_race_leaks_the_canary(ws: Workspace, tmp_path: Path) -> None:
    """Control: the same swap loop makes a path-based walk read the host canary."""
    token, directory, link = race_setup(tmp_path, ws)
    leaked = False
    with exchanging(directory, link):
        for _ in range(20 * ROUNDS):
            if any(token.encode() in c for c in naive_archive(ws.root / "out")):
                leaked = True
                break
    assert leaked, "the naive walk never raced: the race test above would prove nothing"


def test_wipe_removes_links_not_what_they_point_at(ws: Workspace, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep").write_text("host file")
    (ws.root / "link").symlink_to(canary)
    (ws.root / "d" / "e").mkdir(parents=True)
    (ws.root / "d" / "e" / "link").symlink_to(canary)
    (ws.root / "d" / "file").write_text("x")
    ws.wipe()
    assert list(ws.root.iterdir()) == []
    assert (canary / "keep").read_text() == "host file"


# ----------------------------------------------------------------------------- the slot's rights


@pytest.fixture
def owned(tmp_path: Path, resolver: str) -> Workspace:
    if not IS_ROOT:
        pytest.skip("switching filesystem ids needs root")
    return Workspace(tmp_path / "owned", owner=(SLOT_UID, SLOT_UID))


def test_files_written_for_a_slot_belong_to_it(owned: Workspace) -> None:
    assert os.stat(owned.root).st_uid == SLOT_UID
    owned.write("sub/dir/f.txt", b"data", append=False, max_bytes=10)
    for path in ("sub", "sub/dir", "sub/dir/f.txt"):
        info = os.stat(owned.root / path)
        assert (info.st_uid, info.st_gid) == (SLOT_UID, SLOT_UID), path
    # the thread's own ids came back: what the test creates now is root's
    (owned.root / "mine").write_text("root")
    assert os.stat(owned.root / "mine").st_uid == 0


def test_a_slot_cannot_read_through_the_server_what_it_cannot_read(
    owned: Workspace, tmp_path: Path
) -> None:
    secret = owned.root / "shadow"
    secret.write_text("root only")
    secret.chmod(0o000)
    (owned.root / "private").mkdir(mode=0o700)
    (owned.root / "private" / "f").write_text("root only")
    with pytest.raises(PermissionError):
        owned.read("shadow", 100)
    with pytest.raises(PermissionError):
        owned.write("shadow", b"x", append=True, max_bytes=10)
    with pytest.raises(PermissionError):
        owned.read("private/f", 100)
    with pytest.raises(PermissionError):
        owned.listing("private", 10)
    with pytest.raises(PermissionError):
        owned.archive(".", 1 << 20, 10)
    assert secret.read_text() == "root only"  # and nothing was appended
    # control: the same workspace without an owner is read with root's rights
    plain = Workspace(owned.root)
    assert plain.read("shadow", 100).data == b"root only"
    assert plain.read("private/f", 100).data == b"root only"
    # after the refusals this thread is root again
    assert os.stat(tmp_path).st_uid == 0
    with (owned.root / "again").open("w") as stream:
        stream.write("x")
    assert os.stat(owned.root / "again").st_uid == 0


def test_wipe_runs_as_the_server(owned: Workspace) -> None:
    owned.write("d/f", b"x", append=False, max_bytes=10)
    (owned.root / "d").chmod(0o500)  # the slot made it unremovable for itself
    (owned.root / "rootfile").write_text("x")
    owned.wipe()
    assert list(owned.root.iterdir()) == []


@needs_root
def test_the_ids_switch_only_the_calling_thread(owned: Workspace) -> None:
    """While one thread works as the slot, the others keep root's rights."""
    gate = threading.Event()
    done = threading.Event()
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            gate.wait(PROMPT_S)
            path = owned.root / "from-other-thread"
            path.write_text("x")
            assert os.stat(path).st_uid == 0
        except BaseException as error:  # noqa: BLE001  # handed to the test thread, raised there
            errors.append(error)
        finally:
            done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    root_fd = os.open(owned.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with workspace_module._as_owner(owned.owner):
            gate.set()
            assert done.wait(PROMPT_S)
            os.close(os.open("from-slot-thread", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=root_fd))
    finally:
        os.close(root_fd)
    worker.join(PROMPT_S)
    assert not errors, errors
    assert os.stat(owned.root / "from-slot-thread").st_uid == SLOT_UID
