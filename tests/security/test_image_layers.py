"""Hostile image layers against the image cache: nothing lands outside the cache, nothing is
admitted half-made, and each refusal names the image and the entry.

Every attack is a small OCI layout written by the test (``tests/image_layouts``) whose layers
aim at a canary the test made in its own temporary directory, outside the cache. The check is
made from the host: the canary's content, its presence, or what exists where the attack aimed.
The control unpacks the same layers with ``tarfile``'s ``fully_trusted`` filter, layer after
layer into one directory, as a naive unpacker would, and shows the check sees the attack land.
After each refusal the cache is checked to be as it was: no image admitted, nothing staged.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.image_layouts import Entry, layer_bytes, write_layout
from trajcore.adapters.slot_server.image_cache import ImageCache
from trajcore.domain.task_environments import (
    ImageLimits,
    LayerRefused,
    TaskEnvironmentError,
    parse_environment_ref,
)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="image layers are POSIX trees")


def _naive_unpack(layers: Sequence[Sequence[Entry]], into: Path) -> None:
    """The control: each layer through tarfile with no filter, whiteouts as plain removals."""
    into.mkdir(parents=True, exist_ok=True)
    for entries in layers:
        with tarfile.open(fileobj=io.BytesIO(layer_bytes(entries))) as tar:
            for member in tar:
                base = member.name.rpartition("/")[2]
                if base.startswith(".wh.") and base != ".wh..wh..opq":
                    victim = into / member.name.rpartition("/")[0] / base[4:]
                    if victim.exists():
                        victim.unlink()
                    continue
                tar.extract(member, into, filter="fully_trusted")


def _attack(
    tmp_path: Path, layers: Sequence[Sequence[Entry]], limits: ImageLimits | None = None
) -> tuple[TaskEnvironmentError, ImageCache]:
    layout = tmp_path / "layout"
    write_layout(layout, layers)
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30, limits=limits)
    with pytest.raises(TaskEnvironmentError) as caught:
        cache.acquire(parse_environment_ref(f"oci:{layout}")).close()
    _assert_unchanged(cache)
    return caught.value, cache


def _assert_unchanged(cache: ImageCache) -> None:
    assert list((cache.root / "images").iterdir()) == []
    assert list((cache.root / "staging").iterdir()) == []
    assert cache.statistics().images == 0
    assert cache.statistics().refused == 1


def _canary(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    canary = outside / "canary"
    canary.write_text("original")
    return canary


def test_an_absolute_name_writes_nothing_outside(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [[Entry(name=str(canary), data=b"pwned")]]
    _naive_unpack(layers, tmp_path / "control")
    assert canary.read_text() == "pwned"  # the control: the naive unpacker wrote the host file
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert isinstance(error, LayerRefused)
    assert "absolute" in error.reason
    assert str(canary) in error.field
    assert "oci:" in error.field
    assert canary.read_text() == "original"


def test_a_dot_dot_name_writes_nothing_outside(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    name = "../outside/canary"
    _naive_unpack([[Entry(name=name, data=b"pwned")]], tmp_path / "control")
    assert canary.read_text() == "pwned"
    canary.write_text("original")

    # The cache's tree is deeper than the control's; climb as far as it needs.
    deep = "../" * 6 + str(canary.relative_to("/"))
    error, _ = _attack(tmp_path, [[Entry(name=deep, data=b"pwned")]])
    assert "'..'" in error.reason
    assert canary.read_text() == "original"


def test_a_symlink_planted_by_one_layer_carries_no_write_of_the_next(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [
        [Entry(name="escape", kind=tarfile.SYMTYPE, link=str(canary.parent))],
        [Entry(name="escape/canary", data=b"pwned")],
    ]
    _naive_unpack(layers, tmp_path / "control")
    assert canary.read_text() == "pwned"
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert "not a directory" in error.reason
    assert "escape" in error.field
    assert canary.read_text() == "original"


def test_a_symlink_then_a_write_in_one_layer_stays_inside(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [
        [
            Entry(name="etc", kind=tarfile.DIRTYPE, mode=0o755),
            Entry(name="etc/escape", kind=tarfile.SYMTYPE, link=str(canary.parent)),
            Entry(name="etc/escape/canary", data=b"pwned"),
        ]
    ]
    _naive_unpack(layers, tmp_path / "control")
    assert canary.read_text() == "pwned"
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert "etc/escape" in error.reason
    assert canary.read_text() == "original"


def test_a_hard_link_to_a_host_file_is_refused(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [
        [
            Entry(name="innocent", kind=tarfile.LNKTYPE, link=str(canary)),
            Entry(name="innocent", data=b"pwned"),
        ]
    ]
    _naive_unpack(layers, tmp_path / "control")
    assert canary.read_text() == "pwned"  # writing the link's name rewrote the host file
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert "absolute" in error.reason
    assert "hard link target" in error.field
    assert canary.read_text() == "original"


def test_a_hard_link_through_a_planted_symlink_is_refused(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [
        [
            Entry(name="out", kind=tarfile.SYMTYPE, link=str(canary.parent)),
            Entry(name="innocent", kind=tarfile.LNKTYPE, link="out/canary"),
            Entry(name="innocent", data=b"pwned"),
        ]
    ]
    _naive_unpack(layers, tmp_path / "control")
    assert canary.read_text() == "pwned"
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert "out" in error.reason
    assert "innocent" in error.field
    assert canary.read_text() == "original"


def test_a_whiteout_through_a_symlink_removes_nothing_outside(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [
        [Entry(name="lower", kind=tarfile.SYMTYPE, link=str(canary.parent))],
        [Entry(name="lower/.wh.canary")],
    ]
    _naive_unpack(layers, tmp_path / "control")
    assert not canary.exists()  # the naive whiteout removed the host file
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert "lower" in error.reason
    assert canary.read_text() == "original"


def test_an_opaque_directory_through_a_symlink_empties_nothing_outside(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    layers = [
        [Entry(name="lower", kind=tarfile.SYMTYPE, link=str(canary.parent))],
        [Entry(name="lower/.wh..wh..opq")],
    ]
    # The control: an opaque marker applied naively empties the directory the name reaches.
    control = tmp_path / "control"
    _naive_unpack(layers[:1], control)
    for child in (control / "lower").iterdir():
        child.unlink()
    assert not canary.exists()
    canary.write_text("original")

    error, _ = _attack(tmp_path, layers)
    assert "lower" in error.reason
    assert canary.read_text() == "original"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make device nodes (the control)")
def test_a_device_node_outside_dev_is_refused(tmp_path: Path) -> None:
    layers = [[Entry(name="etc/mem", kind=tarfile.CHRTYPE, mode=0o666)]]
    control = tmp_path / "control"
    _naive_unpack(layers, control)
    assert stat.S_ISCHR(os.lstat(control / "etc" / "mem").st_mode)  # the naive unpacker made it
    (control / "etc" / "mem").unlink()

    error, _ = _attack(tmp_path, layers)
    assert "character device" in error.reason
    assert "etc/mem" in error.field


def test_a_layer_that_expands_past_the_byte_limit_is_refused_before_it_is_written(
    tmp_path: Path,
) -> None:
    size = 64 << 20
    layers = [[Entry(name="zeros", size=size)]]
    weight = len(gzip.compress(layer_bytes(layers[0])))
    assert weight < size // 100  # the bomb: 64 MiB of file from well under 1 MiB of layer

    error, _ = _attack(tmp_path, layers, ImageLimits(max_bytes=16 << 20))
    assert "more than 16777216 bytes" in error.reason
    assert "zeros" in error.field


def test_a_layer_of_too_many_entries_is_refused(tmp_path: Path) -> None:
    layers = [[Entry(name=f"f{number}") for number in range(1500)]]
    error, _ = _attack(tmp_path, layers, ImageLimits(max_entries=1000))
    assert "more than 1000 entries" in error.reason


def test_a_layer_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    write_layout(layout, [[Entry(name="a", data=b"one")]])
    blobs = sorted((layout / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    layer = next(b for b in blobs if b.read_bytes()[:2] == b"\x1f\x8b")
    layer.write_bytes(gzip.compress(layer_bytes([Entry(name="a", data=b"two")])))
    cache = ImageCache(tmp_path / "cache", max_bytes=1 << 30)
    with pytest.raises(TaskEnvironmentError) as caught:
        cache.acquire(parse_environment_ref(f"oci:{layout}"))
    assert "but its descriptor says" in caught.value.reason
    _assert_unchanged(cache)


def test_a_refused_image_leaves_a_good_one_usable(tmp_path: Path) -> None:
    """A refusal fails only its own image: the cache serves the next one as if nothing
    happened."""
    canary = _canary(tmp_path)
    error, cache = _attack(tmp_path, [[Entry(name=str(canary), data=b"pwned")]])
    good = tmp_path / "good"
    write_layout(good, [[Entry(name="hello", data=b"world")]])
    with cache.acquire(parse_environment_ref(f"oci:{good}")) as use:
        assert (use.image.rootfs / "hello").read_text() == "world"
    assert cache.statistics().images == 1
    assert isinstance(error, LayerRefused)
