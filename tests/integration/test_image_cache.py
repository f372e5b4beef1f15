"""The image cache over real images: podman's store, OCI layouts and archives, docker archives,
layered whiteouts, two processes asking at once, eviction and images in use."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image_layouts import Entry, write_docker_archive, write_layout
from tests.podman_images import PODMAN, imported_image, podman_problem
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_sources import EngineExport, ImageLayers
from trajcore.domain.task_environments import (
    EnvironmentRef,
    ImageCacheFull,
    TaskEnvironmentError,
    parse_environment_ref,
)


@pytest.fixture
def podman_image(tmp_path: Path) -> Iterator[str]:
    """A small image imported into podman's store by the test, removed afterwards."""
    files = {"etc/os-release": b"ID=trajcore-test\n", "bin/tool": b"#!/bin/sh\n"}
    with imported_image(tmp_path, "cache", files, mode=0o755) as name:
        yield name


def test_an_image_of_podmans_store_is_unpacked_once_then_found_by_its_id(
    tmp_path: Path, podman_image: str
) -> None:
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref(f"containers-storage:{podman_image}")
    with cache.acquire(ref) as first:
        assert not first.image.hit
        assert (first.image.rootfs / "etc" / "os-release").read_text() == "ID=trajcore-test\n"
        assert os.stat(first.image.rootfs / "bin" / "tool").st_mode & 0o777 == 0o755
    with cache.acquire(ref) as second:
        assert second.image.hit
        assert second.image.image_id == first.image.image_id
    stats = cache.statistics()
    assert (stats.images, stats.hits, stats.misses) == (1, 1, 1)
    # The same image saved as an OCI archive and a docker archive is the same content: a hit.
    for fmt, transport in (("oci-archive", "oci-archive"), ("docker-archive", "docker-archive")):
        archive = tmp_path / f"{fmt}.tar"
        subprocess.run(
            [*PODMAN, "save", "--format", fmt, "-o", str(archive), podman_image],
            check=True,
            capture_output=True,
            timeout=120,
        )
        with cache.acquire(parse_environment_ref(f"{transport}:{archive}")) as again:
            assert again.image.image_id == first.image.image_id, fmt
            assert again.image.hit, fmt


def test_an_image_the_store_does_not_hold_is_named_with_the_engines_words(tmp_path: Path) -> None:
    why = podman_problem()
    if why is not None:
        pytest.skip(why)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    ref = parse_environment_ref("containers-storage:localhost/trajcore-no-such-image:none")
    with pytest.raises(TaskEnvironmentError) as caught:
        cache.acquire(ref)
    assert caught.value.field == str(ref)
    assert "podman answered" in caught.value.reason
    assert "no-such-image" in caught.value.reason
    assert cache.statistics().refused == 1


def test_whiteouts_and_opaque_directories_apply_to_lower_layers_only(tmp_path: Path) -> None:
    layers = [
        [
            Entry(name="etc/keep", data=b"1"),
            Entry(name="etc/gone", data=b"2"),
            Entry(name="var/cache/old", data=b"3"),
            Entry(name="var/cache/sub/older", data=b"4"),
            Entry(name="tree/deep/file", data=b"5"),
        ],
        [
            # The layer's own files come before its whiteouts in the tar: whiteouts still
            # remove only what lower layers made.
            Entry(name="var/cache/new", data=b"6"),
            Entry(name="var/cache/.wh..wh..opq"),
            Entry(name="etc/.wh.gone"),
            Entry(name=".wh.tree"),
            Entry(name="etc/.wh.never-there"),
        ],
        [
            Entry(name="etc/keep", data=b"replaced"),
            Entry(name="link", kind=tarfile.LNKTYPE, link="etc/keep"),
        ],
    ]
    layout = tmp_path / "layout"
    write_layout(layout, layers)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with cache.acquire(parse_environment_ref(f"oci:{layout}")) as use:
        root = use.image.rootfs
        found = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        assert found == ["etc", "etc/keep", "link", "var", "var/cache", "var/cache/new"]
        assert (root / "etc" / "keep").read_text() == "replaced"
        assert os.stat(root / "link").st_ino == os.stat(root / "etc" / "keep").st_ino
        assert use.image.entries == 8  # created entries; whiteouts are not counted


def test_a_docker_archive_and_a_tagged_layout(tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    image_id = write_docker_archive(
        archive, [[Entry(name="a", data=b"x")], [Entry(name="b", data=b"y")]]
    )
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with cache.acquire(parse_environment_ref(f"docker-archive:{archive}")) as use:
        assert use.image.image_id == image_id
        assert sorted(p.name for p in use.image.rootfs.iterdir()) == ["a", "b"]
    layout = tmp_path / "layout"
    write_layout(layout, [[Entry(name="c")]], tag="v1")
    with pytest.raises(TaskEnvironmentError, match="'v2' is not in the layout"):
        cache.acquire(parse_environment_ref(f"oci:{layout}:v2"))
    with cache.acquire(parse_environment_ref(f"oci:{layout}:v1")) as tagged:
        assert (tagged.image.rootfs / "c").exists()


def test_a_malformed_index_names_the_json_path(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [[Entry(name="c")]])
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["digest"] = 7
    (layout / "index.json").write_text(json.dumps(index))
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError) as caught:
        cache.acquire(parse_environment_ref(f"oci:{layout}"))
    assert "index.json $.manifests[0].digest" in caught.value.field


_CHILD = """
import json, sys
from pathlib import Path
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.adapters.slot_server.image_sources import EngineExport, ImageLayers
from trajcore.domain.task_environments import parse_environment_ref
cache = ImageCache(Path(sys.argv[1]), max_bytes=1 << 30)
with cache.acquire(parse_environment_ref("oci:" + sys.argv[2])) as use:
    print(json.dumps({"hit": use.image.hit, "rootfs": str(use.image.rootfs)}))
"""


def test_two_processes_asking_at_once_unpack_the_image_once(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [[Entry(name=f"f{n}", data=b"x" * 1000) for n in range(3000)]])
    argv = [sys.executable, "-c", _CHILD, str(tmp_path / "cache"), str(layout)]
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        results.append(json.loads(out))
    assert sorted(r["hit"] for r in results) == [False, True]
    assert results[0]["rootfs"] == results[1]["rootfs"]
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1


class _MeetingCache(ImageCache):
    """A cache whose unpacking waits, after its own check found no image, until the other
    server's check has found none too: the two servers then both ask to unpack it."""

    def __init__(self, root: Path, meeting: threading.Barrier) -> None:
        super().__init__(root, max_bytes=1 << 30)
        self._meeting = meeting

    def _make(self, ref: EnvironmentRef, found: ImageLayers | EngineExport, lock_fd: int) -> bool:
        self._meeting.wait()
        return super()._make(ref, found, lock_fd)


def test_two_servers_that_both_asked_to_unpack_report_one_miss_and_one_hit(
    tmp_path: Path,
) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [[Entry(name=f"f{n}", data=b"x" * 100) for n in range(50)]])
    ref = parse_environment_ref(f"oci:{layout}")
    meeting = threading.Barrier(2, timeout=30)
    caches = [_MeetingCache(tmp_path / "cache", meeting) for _ in range(2)]
    hits: list[bool] = []
    failures: list[BaseException] = []

    def ask(cache: ImageCache) -> None:
        try:
            with cache.acquire(ref) as use:
                hits.append(use.image.hit)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failures.append(error)

    threads = [threading.Thread(target=ask, args=(cache,)) for cache in caches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert sorted(hits) == [False, True]
    assert sorted((c.statistics().hits, c.statistics().misses) for c in caches) == [(0, 1), (1, 0)]
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1


def test_the_least_recently_used_image_leaves_and_one_in_use_never_does(tmp_path: Path) -> None:
    def layout(name: str) -> str:
        path = tmp_path / name
        write_layout(path, [[Entry(name="data", size=400_000)]], salt=name)
        return f"oci:{path}"

    cache = ImageCache(tmp_path / "cache", max_bytes=1_000_000)
    a, b, c, d = (parse_environment_ref(layout(n)) for n in "abcd")
    held = cache.acquire(a)  # in use throughout
    with cache.acquire(b):
        pass
    with cache.acquire(c) as use_c:  # 3 x 400 kB > 1 MB: b (not in use) leaves, a stays
        assert not use_c.image.hit
    names = {p.name for p in (tmp_path / "cache" / "images").iterdir()}
    assert held.image.image_id in names
    assert len(names) == 2
    assert cache.statistics().evicted == 1
    with cache.acquire(c) as use_c:  # c is in use too now: nothing can leave for d
        with pytest.raises(ImageCacheFull) as caught:
            cache.acquire(d)
        assert str(d) in str(caught.value)
        assert "in images that leases are using" in str(caught.value)
        assert {p.name for p in (tmp_path / "cache" / "images").iterdir()} == names
        assert list((tmp_path / "cache" / "staging").iterdir()) == []
    held.close()
    with cache.acquire(d) as use_d:  # a was least recently used and is free now
        assert not use_d.image.hit
    assert held.image.image_id not in {p.name for p in (tmp_path / "cache" / "images").iterdir()}


def test_a_cache_opened_with_a_lower_limit_sheds_what_nobody_uses(tmp_path: Path) -> None:
    """Images that came under a larger limit leave at the next open, least recently used
    first, until the cache fits its new limit; one a lease is using stays."""
    refs = []
    for name in "abc":
        write_layout(tmp_path / name, [[Entry(name="data", size=400_000)]], salt=name)
        refs.append(parse_environment_ref(f"oci:{tmp_path / name}"))
    roomy = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    held = roomy.acquire(refs[0])  # in use throughout, and the least recently used
    for ref in refs[1:]:
        with roomy.acquire(ref):
            pass
    ids = {p.name for p in (tmp_path / "cache" / "images").iterdir()}
    assert len(ids) == 3
    lower = ImageCache(tmp_path / "cache", max_bytes=1_000_000)
    left = {p.name for p in (tmp_path / "cache" / "images").iterdir()}
    assert held.image.image_id in left  # in use: it stays, past the limit with another
    assert len(left) == 2
    assert lower.statistics().evicted == 1
    assert lower.statistics().bytes <= 1_000_000 + 400_000
    held.close()
    ImageCache(tmp_path / "cache", max_bytes=500_000)  # free now: one image fits
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1


def test_an_image_made_before_its_env_was_recorded_is_made_again(tmp_path: Path) -> None:
    """An entry whose ``image.json`` has no ``Env`` (made by an older slot server) would run its
    leases without the image's environment: the next open removes it (unless a lease holds
    it), and the next use unpacks it again, with it."""
    write_layout(tmp_path / "a", [[Entry(name="data", size=1000)]], env=["TASK_VAR=1"])
    ref = parse_environment_ref(f"oci:{tmp_path / 'a'}")
    with ImageCache(tmp_path / "cache", max_bytes=1 << 30).acquire(ref) as use:
        image_id = use.image.image_id
    meta = tmp_path / "cache" / "images" / image_id / "image.json"
    old = {k: v for k, v in json.loads(meta.read_text()).items() if k != "env"}
    meta.write_text(json.dumps(old))
    again = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    assert not meta.exists()
    with again.acquire(ref) as use:
        assert not use.image.hit
        assert use.image.env == ("TASK_VAR=1",)


def test_an_image_larger_than_the_cache_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big"
    write_layout(path, [[Entry(name="data", size=2_000_000)]])
    cache = ImageCache(tmp_path / "cache", max_bytes=1_000_000)
    with pytest.raises(ImageCacheFull, match="more than the cache's 1000000"):
        cache.acquire(parse_environment_ref(f"oci:{path}"))
    assert list((tmp_path / "cache" / "images").iterdir()) == []


def test_a_directory_is_used_in_place(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    (tree / "etc").mkdir(parents=True)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, environment_dirs=(tmp_path,))
    with cache.acquire(parse_environment_ref(f"directory:{tree}")) as use:
        assert use.image.rootfs == tree.resolve()
        assert use.image.bytes == 0
    with pytest.raises(TaskEnvironmentError, match="is not a directory"):
        cache.acquire(parse_environment_ref(f"directory:{tmp_path / 'missing'}"))


def test_a_directory_outside_the_listed_folders_is_refused(tmp_path: Path) -> None:
    """A row is data: it names a tree only in a folder the operator listed, after its
    symlinks are resolved; with no folder listed, none at all."""
    listed, outside = tmp_path / "listed", tmp_path / "outside"
    (listed / "task").mkdir(parents=True)
    outside.mkdir()
    (listed / "via").symlink_to(tmp_path)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, environment_dirs=(listed,))
    with cache.acquire(parse_environment_ref(f"directory:{listed}")) as use:
        assert use.image.rootfs == listed.resolve()
    missing = tmp_path / "missing"  # refused alike: an answer never tells what exists there
    named_paths = (
        outside,
        missing,
        listed / "via" / "outside",
        Path("/"),
        listed / ".." / "outside",
    )
    for named in named_paths:
        ref = f"directory:{named}"
        with pytest.raises(TaskEnvironmentError) as refused:
            cache.acquire(parse_environment_ref(ref))
        assert refused.value.field == ref
        assert "is not in a folder listed for directory: environments" in refused.value.reason
    closed = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError, match="directory: environments are off"):
        closed.acquire(parse_environment_ref(f"directory:{listed}"))


def test_a_directory_whose_path_another_user_may_change_is_refused(tmp_path: Path) -> None:
    """A lease mounts its tree by path after the check: a folder on the path that a user other
    than root and the server's may change (group- or world-writable, not sticky) could have
    the tree swapped for a link to any host folder once the lease is granted. A sticky folder
    (``/tmp``) is kept when the entry below it is the server's."""
    listed = tmp_path / "listed"
    for folder in ("kept", "open", "sticky"):
        (listed / folder / "task").mkdir(parents=True)
    (listed / "open").chmod(0o777)
    (listed / "sticky").chmod(0o1777)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, environment_dirs=(listed,))
    for kept in ("kept", "sticky"):
        with cache.acquire(parse_environment_ref(f"directory:{listed / kept / 'task'}")) as use:
            assert use.image.rootfs == listed / kept / "task"
    ref = f"directory:{listed / 'open' / 'task'}"
    with pytest.raises(TaskEnvironmentError) as refused:
        cache.acquire(parse_environment_ref(ref))
    assert refused.value.field == ref
    said = f"{listed / 'open'} (owner uid {os.geteuid()}, mode 777)"
    assert refused.value.reason.startswith(said), refused.value.reason
    assert "may be changed by users other than root and the slot server's" in refused.value.reason


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_directory_below_another_users_folder_is_refused(tmp_path: Path) -> None:
    listed = tmp_path / "listed"
    (listed / "theirs" / "task").mkdir(parents=True)
    (listed / "sticky" / "task").mkdir(parents=True)
    (listed / "sticky").chmod(0o1777)
    os.chown(listed / "theirs", 65534, 65534)
    os.chown(listed / "sticky" / "task", 65534, 65534)  # its owner may rename it in /tmp-like
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, environment_dirs=(listed,))
    for named, folder in (("theirs", "theirs"), ("sticky", "sticky")):
        with pytest.raises(TaskEnvironmentError, match="may be changed by users") as refused:
            cache.acquire(parse_environment_ref(f"directory:{listed / named / 'task'}"))
        assert refused.value.reason.startswith(f"{listed / folder} (owner uid ")


def test_the_refusal_of_every_directory_names_the_container_pools_flag(tmp_path: Path) -> None:
    closed = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError) as refused:
        closed.acquire(parse_environment_ref(f"directory:{tmp_path}"))
    assert "--env.environment_dirs" in refused.value.reason
    assert "--env.container_environment_dirs" in refused.value.reason


def test_a_cache_object_dropped_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """Its owner lock lasts as long as the object: a process that opens many caches (tests, a
    tool) does not hold a descriptor for each for its whole life."""
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
