"""How the image cache finds an image again, and how it reads an image archive.

- A reference resolved lately is answered from that resolution: an archive or layout whose file
  is unchanged is not read again, an engine's image is not looked up again within
  ``resolve_ttl_s`` (the engine here is a stand-in ``docker`` on ``PATH`` that logs each call
  and names an image the cache holds).
- ``acquire_recent`` answers only from such a resolution, at once: a layout resolved lately
  and unchanged, held by the cache, and not locked for its unpacking or eviction; anything
  else is ``None`` (``acquire`` finds out), counting nothing.
- An archive's members are extracted by the cache's own rules, the same on every Python 3.11:
  files and directories only, no name outside the staging folder.
"""

from __future__ import annotations

import fcntl
import io
import os
import tarfile
from pathlib import Path

import pytest

from tests.image_layouts import Entry, write_docker_archive, write_layout
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.domain.task_environments import TaskEnvironmentError, parse_environment_ref


def test_acquire_recent_answers_from_a_late_resolution_only(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [[Entry(name="a", data=b"one")]])
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"oci:{layout}")
    assert cache.acquire_recent(ref) is None  # never resolved: acquire reads the layout
    with cache.acquire(ref) as first:
        image_id = first.image.image_id
    before = cache.statistics()
    use = cache.acquire_recent(ref)
    assert use is not None
    with use:
        assert (use.image.image_id, use.image.hit) == (image_id, True)
        assert (use.image.rootfs / "a").read_bytes() == b"one"
        after = cache.statistics()
        assert (after.hits, after.recently_resolved) == (
            before.hits + 1,
            1 + before.recently_resolved,
        )
        # held: an eviction's exclusive lock cannot be taken meanwhile
        lock = os.open(cache.root / "locks" / f"{image_id}.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(lock)
    # locked for an unpacking or an eviction: no wait, None
    lock = os.open(cache.root / "locks" / f"{image_id}.lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert cache.acquire_recent(ref) is None
    finally:
        os.close(lock)
    # the layout changed (another image written over it): resolved again by acquire alone
    write_layout(layout, [[Entry(name="a", data=b"two")]])
    assert cache.acquire_recent(ref) is None
    with cache.acquire(ref) as second:
        assert second.image.image_id != image_id
    assert cache.statistics().hits == before.hits + 1
    # a directory tree is never answered here
    tree = tmp_path / "tree"
    tree.mkdir()
    assert cache.acquire_recent(parse_environment_ref(f"directory:{tree}")) is None


def test_an_unchanged_archive_is_not_read_again_and_a_changed_one_is(tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    first_id = write_docker_archive(archive, [[Entry(name="a", data=b"one")]])
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"docker-archive:{archive}")
    with cache.acquire(ref) as use:
        assert not use.image.hit
    with cache.acquire(ref) as use:
        assert use.image.hit
        assert use.image.image_id == first_id
    assert cache.statistics().recently_resolved == 1
    # The archive is replaced by another image: its stamp changes, so it is read again.
    second_id = write_docker_archive(archive, [[Entry(name="a", data=b"two")]])
    with cache.acquire(ref) as use:
        assert not use.image.hit
        assert use.image.image_id == second_id != first_id
        assert (use.image.rootfs / "a").read_bytes() == b"two"
    assert cache.statistics().recently_resolved == 1


def _stand_in_docker(folder: Path, image_id: str) -> Path:
    """A ``docker`` that answers ``image inspect`` with ``image_id`` and logs every call."""
    folder.mkdir()
    log = folder / "calls"
    script = folder / "docker"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho {image_id}\n')
    script.chmod(0o755)
    return log


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("ttl_s", [30.0, 0.0])
def test_an_engines_image_is_looked_up_once_within_the_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ttl_s: float
) -> None:
    archive = tmp_path / "image.tar"
    image_id = write_docker_archive(archive, [[Entry(name="a", data=b"x")]])
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, resolve_ttl_s=ttl_s)
    with cache.acquire(parse_environment_ref(f"docker-archive:{archive}")):
        pass  # the cache now holds the image the stand-in engine names
    log = _stand_in_docker(tmp_path / "bin", image_id)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    ref = parse_environment_ref("docker-daemon:example/task:1")
    for _ in range(3):
        with cache.acquire(ref) as use:
            assert use.image.hit
            assert use.image.image_id == image_id
    # within the ttl one lookup serves all three; with a ttl of 0 each one looks it up
    assert _calls(log) == (1 if ttl_s else 3)


def test_a_negative_ttl_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="resolve_ttl_s"):
        ImageCache(tmp_path / "cache", max_bytes=1 << 30, resolve_ttl_s=-1)


def _archive_with(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> None:
    with tarfile.open(path, "w") as tar:
        readme = tarfile.TarInfo("oci-layout")
        readme.size = 2
        tar.addfile(readme, io.BytesIO(b"{}"))
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data) if data else None)


@pytest.mark.parametrize(
    ("name", "kind", "reason"),
    [
        ("../escaped", tarfile.REGTYPE, "names a place outside it"),
        ("/tmp/escaped", tarfile.REGTYPE, "names a place outside it"),
        ("blobs/link", tarfile.SYMTYPE, "a symlink that leads outside it"),
        ("blobs/hard", tarfile.LNKTYPE, "holds only files, directories and symlinks"),
        ("blobs/fifo", tarfile.FIFOTYPE, "holds only files, directories and symlinks"),
    ],
)
def test_an_archive_member_that_is_not_a_plain_file_inside_it_is_refused(
    tmp_path: Path, name: str, kind: bytes, reason: str
) -> None:
    archive = tmp_path / "image.tar"
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/hostname" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
    _archive_with(archive, member, b"attack" if kind == tarfile.REGTYPE else b"")
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"oci-archive:{archive}")
    with pytest.raises(TaskEnvironmentError) as caught:
        cache.acquire(ref)
    assert caught.value.field == str(ref)
    assert reason in caught.value.reason
    assert repr(name) in caught.value.reason
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "cache" / "escaped").exists()
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
    assert cache.statistics().images == 0


def test_no_member_is_written_through_a_symlink_and_no_chain_of_them_leads_out(
    tmp_path: Path,
) -> None:
    # "here" -> "." stays inside, and "out" -> "here/../canary" looks inside when read as text,
    # but resolves to the folder that holds the staging area: refused once unpacked
    outside = tmp_path / "cache" / "staging"
    chain = tmp_path / "chain.tar"
    with tarfile.open(chain, "w") as tar:
        for name, target in (("here", "."), ("out", "here/../canary")):
            link = tarfile.TarInfo(name)
            link.type = tarfile.SYMTYPE
            link.linkname = target
            tar.addfile(link)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError, match="'out': a symlink that leads outside it"):
        cache.acquire(parse_environment_ref(f"oci-archive:{chain}"))
    # a directory symlink to the host, then a file written below it
    through = tmp_path / "through.tar"
    canary_dir = tmp_path / "canary-dir"
    canary_dir.mkdir()
    with tarfile.open(through, "w") as tar:
        link = tarfile.TarInfo("blobs")
        link.type = tarfile.SYMTYPE
        link.linkname = str(canary_dir)
        tar.addfile(link)
        planted = tarfile.TarInfo("blobs/planted")
        planted.size = 6
        tar.addfile(planted, io.BytesIO(b"attack"))
    with pytest.raises(TaskEnvironmentError, match="'blobs/planted': lies below a symlink"):
        cache.acquire(parse_environment_ref(f"oci-archive:{through}"))
    assert list(canary_dir.iterdir()) == []
    assert list(outside.iterdir()) == []
    # the control: tarfile with no filter writes the planted file through the link
    control = tmp_path / "control"
    control.mkdir()
    with tarfile.open(through) as tar:
        tar.extractall(control, filter="fully_trusted")
    assert (canary_dir / "planted").read_bytes() == b"attack"


def test_an_archive_naming_a_file_twice_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    with tarfile.open(archive, "w") as tar:
        for data in (b"first", b"second"):
            member = tarfile.TarInfo("index.json")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError, match=r"names .*index\.json twice"):
        cache.acquire(parse_environment_ref(f"oci-archive:{archive}"))
